#!/usr/bin/env bash
# CLI options: every subcommand's --mode help lists only modes its parser accepts (help and check
# come from one table, tandem/mode.h), and every `tandem train` flag given a bad value is refused
# before anything runs: exit 2, exactly one line on stderr naming the flag, no run folder made.
set -u
tandem=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }

# The mode names `tandem $1 --help` lists under its flag $2: the lines after the flag's own
# line, up to the next flag, that start with a name and two spaces (mode_help's layout).
modes_in_help() {
  "$tandem" "$1" --help | awk -v flag="$2" '
    $1 == flag { inside = 1; next }
    inside && $1 ~ /^-/ { exit }
    inside && /^ +[a-z][a-z0-9_+-]*  +[^ ]/ { print $1 }'
}

# A tiny IDX folder (256 random 28x28 images, label 1) written with the shell alone.
idx=$tmp/idx && mkdir -p "$idx"
{ printf '\x00\x00\x08\x03\x00\x00\x01\x00\x00\x00\x00\x1c\x00\x00\x00\x1c'
  head -c $((256 * 784)) /dev/urandom; } >"$idx/train-images-idx3-ubyte"
{ printf '\x00\x00\x08\x01\x00\x00\x01\x00'; head -c 256 /dev/zero | tr '\0' '\1'; } \
  >"$idx/train-labels-idx1-ubyte"

# Per subcommand: its mode flag, and arguments with one other bad value that is checked after
# the mode is parsed, with the line that refusal prints. A mode the parser accepted then fails
# on that value; one it refused fails on the mode.
declare -A mode_flag=([bench]=--mode [sweep]=--modes [data-bench]=--mode [train]=--mode)
declare -A other_bad=(
  [bench]="--device cpu --steps -5"
  [sweep]="--device cpu --batch-sizes 1 --rounds 0"
  [data-bench]="--device cpu --data $tmp/nonexistent"
  [train]="--data $idx --out $tmp/run --device cpu --epochs 0")
declare -A other_error=(
  [bench]="step count -5 is not valid"
  [sweep]="rounds 0 is not valid"
  [data-bench]="does not exist"
  [train]="--epochs 0 is not valid: expected an integer >= 1")

subcommands=$("$tandem" --help | awk '/^Subcommands:/ { s = 1; next } s && NF { print $1 }')
for sub in $subcommands; do
  "$tandem" "$sub" --help | grep -q -- ' --mode' || continue
  flag=${mode_flag[$sub]:-}
  if [ -z "$flag" ]; then
    fail "tandem $sub has --mode but this test does not know it: add it to mode_flag and other_bad"
    continue
  fi
  modes=$(modes_in_help "$sub" "$flag")
  if [ -z "$modes" ]; then
    fail "tandem $sub --help lists no modes under $flag"; "$tandem" "$sub" --help; continue
  fi
  # shellcheck disable=SC2086  # other_bad holds several words
  for m in $modes warp; do
    "$tandem" "$sub" $flag "$m" ${other_bad[$sub]} >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$m" = warp ]; then  # the control: a name no table has is refused by the parser
      if [ $rc -eq 2 ] && grep -qF "mode 'warp' is not valid: expected" "$tmp/err"; then pass
      else fail "tandem $sub $flag warp -> exit $rc:"; cat "$tmp/err"; fi
    elif [ $rc -eq 2 ] && grep -qF -- "${other_error[$sub]}" "$tmp/err" &&
         ! grep -q "mode '" "$tmp/err"; then
      pass
    else
      fail "tandem $sub $flag $m (listed by its --help) -> exit $rc, want 2 with '${other_error[$sub]}':"
      cat "$tmp/err"
    fi
  done
  echo "$sub $flag: $(echo $modes | tr '\n' ' ')"
done
if "$tandem" --help | grep -q "^  train"; then
  want="serial pipelined graphed pipelined+graphed by-device"
  got=$(modes_in_help train --mode | paste -sd' ')
  if [ "$got" = "$want" ]; then pass; else fail "train --mode lists '$got', want '$want'"; fi
  # auto is the trials' name (bench, the Python Trainer): train refuses it, saying what to use.
  "$tandem" train --mode auto ${other_bad[train]} >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -eq 2 ] && grep -qF "mode 'auto' (timed trials of the modes" "$tmp/err" &&
     grep -qF "by-device (the default)" "$tmp/err"; then pass
  else fail "tandem train --mode auto -> exit $rc:"; cat "$tmp/err"; fi
fi

if ! "$tandem" --help | grep -q "^  train"; then
  echo "cli options: $passed passed, $failed failed (no train layer: train flags skipped)"
  [ "$failed" -eq 0 ]
  exit
fi

# `tandem train` with one bad value: exit 2, one line naming the flag, nothing made in --out.
echo keep >"$tmp/a-file"
mkdir -p "$tmp/a-folder"
printf 'not safetensors' >"$tmp/corrupt.safetensors"
# One float32 tensor holding NaN: the 8-byte little-endian header length, the JSON header, data.
header='{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
{ printf "\\x$(printf %02x ${#header})\\x00\\x00\\x00\\x00\\x00\\x00\\x00"; printf '%s' "$header"
  printf '\x00\x00\xc0\x7f'; } >"$tmp/nan.safetensors"
# flag|value|what the line must also say (besides the flag)
while IFS='|' read -r flag value also; do
  [ -z "$flag" ] && continue
  rm -rf "$tmp/run"
  base=(--data "$idx")  # and --out, --device unless the row gives them
  [ "$flag" = --out ] || base+=(--out "$tmp/run")
  [ "$flag" = --device ] || base+=(--device cpu)
  "$tandem" train "${base[@]}" "$flag" "$value" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  lines=$(wc -l <"$tmp/err")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$flag" "$tmp/err" &&
     grep -qF -- "$also" "$tmp/err" && [ ! -e "$tmp/run" ]; then
    pass
  else
    fail "train $flag $value -> exit $rc (want 2), stderr $lines lines (want 1 naming $flag and '$also'), run folder $([ -e "$tmp/run" ] && echo made || echo absent):"
    cat "$tmp/err"
  fi
done <<EOF
--epochs|0|expected an integer >= 1
--epochs|-3|expected an integer >= 1
--epochs|abc|abc
--epochs|2.5|2.5
--batch-size|0|expected an integer >= 1
--batch-size|-5|expected an integer >= 1
--batch-size|abc|abc
--lr|-1|expected a finite number > 0
--lr|0|expected a finite number > 0
--lr|nan|expected a finite number > 0
--lr|inf|expected a finite number > 0
--lr|abc|abc
--momentum|1|[0, 1)
--momentum|-0.5|[0, 1)
--momentum|nan|[0, 1)
--weight-decay|-1|expected a finite number >= 0
--weight-decay|nan|expected a finite number >= 0
--warmup-epochs|-1|less than --epochs
--warmup-epochs|10|less than --epochs (10)
--warmup-epochs|nan|less than --epochs
--step-epochs|0|expected an integer >= 1
--gamma|0|(0, 1]
--gamma|1.5|(0, 1]
--gamma|nan|(0, 1]
--workers|0|expected an integer from 1 to
--workers|100000|expected an integer from 1 to
--worker-nice|-1|expected an integer from 0 to 19
--worker-nice|20|expected an integer from 0 to 19
--image-size|0|expected an integer >= 32
--image-size|8|expected an integer >= 32
--subset|0|expected an integer >= 1
--val-subset|-1|expected an integer >= 1
--eval-cache-mb|-1|expected an integer >= 0 (MiB; 0: no cache)
--val-split|0|(0, 1)
--val-split|1|(0, 1)
--val-split|nan|(0, 1)
--classes|1|expected an integer >= 2
--checkpoint-every|-1|expected an integer >= 0
--keep|0|expected an integer >= 1
--nproc|0|expected an integer >= 1
--seed|abc|abc
--seed|-1|expected an integer >= 0
--ignore-index|abc|abc
--mode|graphed_k|expected serial, pipelined, graphed, pipelined+graphed or by-device
--mode|pipelined_graphed|expected serial
--model|nope|fcn_resnet50
--optimizer|sgdw|sgdw
--cuda-wait|nap|nap
--device|tpu|device 'tpu' is not valid: expected auto, cpu
--out|$tmp/a-file|is a file, expected a folder
--out|$tmp/a-file/run|$tmp/a-file is a file, expected a folder
--json|$tmp/missing/dir/x.json|the folder $tmp/missing/dir does not exist
--json|$tmp/a-folder|is a folder, expected a file name
--weights|$tmp/missing.safetensors|cannot be read
--weights|$tmp/corrupt.safetensors|cannot be read
--weights|$tmp/nan.safetensors|NaN or infinite values
EOF

# A readable file that does not fit the model exits 2 as well, as an unreadable one does above.
{ printf "\\x$(printf %02x ${#header})\\x00\\x00\\x00\\x00\\x00\\x00\\x00"; printf '%s' "$header"
  printf '\x00\x00\x80\x3f'; } >"$tmp/other.safetensors"
"$tandem" train --data "$idx" --out "$tmp/run" --device cpu --weights "$tmp/other.safetensors" \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c . "$tmp/err")" -eq 1 ] && grep -q "do not fit the model" "$tmp/err" &&
   [ ! -e "$tmp/run" ]; then
  pass
else
  fail "train --weights of another model -> exit $rc (want 2, one line):"; cat "$tmp/err"
fi

# Leaving --batch-size out still means the model's default (small_cnn: 128): a tiny run works.
if "$tandem" train --data "$idx" --out "$tmp/ok" --device cpu --epochs 1 --workers 1 \
     --json "$tmp/ok.json" >"$tmp/out" 2>"$tmp/err" &&
   grep -q "batch 128" "$tmp/out" && grep -q '"batch_size": 128' "$tmp/ok.json"; then
  pass
else
  fail "train without --batch-size"; cat "$tmp/out" "$tmp/err"
fi

# A --json inside a new --out (scripts/run.sh writes RUN_DIR/summary.json): the run makes the
# folder, so the summary's folder need not exist beforehand. The summary names the loader's
# threads, their nice value and how the run's threads wait for a GPU (nothing to set on the CPU),
# and among its setup seconds the convolutions' kept plans (none on the CPU: null).
if "$tandem" train --data "$idx" --out "$tmp/new-run" --device cpu --epochs 1 --workers 1 \
     --worker-nice 4 --cuda-wait block --json "$tmp/new-run/summary.json" >"$tmp/out" 2>"$tmp/err" &&
   grep -q '"batch_size": 128' "$tmp/new-run/summary.json" &&
   grep -q '"workers": 1' "$tmp/new-run/summary.json" &&
   grep -q '"worker_nice": 4' "$tmp/new-run/summary.json" &&
   grep -q '"cuda_wait": "block"' "$tmp/new-run/summary.json" &&
   grep -q '"conv_plans": null' "$tmp/new-run/summary.json"; then
  pass
else
  fail "train --json inside a new --out"; cat "$tmp/out" "$tmp/err"
fi
echo "cli options: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

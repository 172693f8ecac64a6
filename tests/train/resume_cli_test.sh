#!/usr/bin/env bash
# `tandem train` interrupted and resumed as people do it: stopped with SIGINT or SIGTERM, or
# killed with SIGKILL (no handler runs, nothing is flushed), then the same command with --resume
# or as torchrun restarts a worker (TORCHELASTIC_RESTART_COUNT set, no --resume). The run's
# metrics.jsonl then equals an uninterrupted run's but for the time fields and the resume marker,
# and its weights are byte-equal. Also: --resume in a folder without a checkpoint starts over,
# and a non-empty folder without --resume is refused saying how to go on.
set -u
tandem=$1
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }

# 512 random 28x28 images in 4 classes: every run below reads this one folder.
idx=$tmp/idx
bash "$(dirname "$0")/../random_idx.sh" "$idx" 512

# 16 steps an epoch, 3 epochs, a checkpoint after every step; pipelined, which resumes bitwise.
train=(train --data "$idx" --device cpu --mode pipelined --epochs 3 --batch-size 32 --workers 1
       --checkpoint-every 1 --seed 5)
spe=16

# metrics.jsonl without the fields that may differ (the keys are sorted, so the sed is exact).
rows() {
  sed -E 's/"(epoch_images_per_s|eval_seconds|eval_images_per_s|images_per_s|resumed_at_step|train_seconds)":[^,}]*,?//g; s/,}/}/' "$1/metrics.jsonl"
}

# The newest checkpoint's step in run folder $1, or -1.
newest() {
  local n
  n=$(ls "$1/checkpoints" 2>/dev/null | grep -E '^step-[0-9]{9}$' | tail -1)
  if [ -n "$n" ]; then echo $((10#${n#step-})); else echo -1; fi
}

if ! "$tandem" "${train[@]}" --out "$tmp/whole" >"$tmp/whole.out" 2>&1; then
  echo "FAIL: the uninterrupted run"; cat "$tmp/whole.out"; exit 1
fi

# What a worker torchrun restarted sees (one process: WORLD_SIZE=1 joins no job).
restarted=(env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1
           MASTER_PORT=29999 TORCHELASTIC_RESTART_COUNT=1)

# interrupt <signal> <run folder> [restart]: starts the run, sends the signal once a checkpoint
# inside epoch 2 exists, then resumes it — with --resume, or as torchrun restarts a worker (the
# same command, no --resume, TORCHELASTIC_RESTART_COUNT=1); compares its records and weights
# with the whole run's.
interrupt() {
  local sig=$1 out=$2 how=${3:-resume}
  "$tandem" "${train[@]}" --out "$out" >"$out.out" 2>"$out.err" &
  local pid=$!
  for _ in $(seq 2400); do
    [ "$(newest "$out")" -ge $((spe + 2)) ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  kill "-$sig" $pid 2>/dev/null
  wait $pid
  local rc=$?
  local want=$((128 + $(kill -l "$sig")))
  if [ $rc -ne $want ]; then
    fail "train stopped by SIG$sig: exit $rc, expected $want (did it end first?)"
    cat "$out.out" "$out.err"; return
  fi
  local at
  at=$(newest "$out")
  if [ "$how" = restart ]; then
    "${restarted[@]}" "$tandem" "${train[@]}" --out "$out" >"$out.resume" 2>&1
  else
    "$tandem" "${train[@]}" --out "$out" --resume >"$out.resume" 2>&1
  fi
  if [ $? -ne 0 ]; then
    fail "train resumed ($how) after SIG$sig"; cat "$out.resume"; return
  fi
  if [ "$how" = restart ] &&
     ! grep -q "^restarted by torchrun: continuing the run in $out, as --resume" "$out.resume"; then
    fail "SIG$sig, restarted: no line saying so"; cat "$out.resume"; return
  fi
  if ! grep -q "^resuming at step $at " "$out.resume"; then
    fail "SIG$sig: expected 'resuming at step $at'"; cat "$out.resume"; return
  fi
  if [ "$(rows "$tmp/whole")" != "$(rows "$out")" ]; then
    fail "SIG$sig at step $at: metrics.jsonl differs from the uninterrupted run's"
    diff <(rows "$tmp/whole") <(rows "$out"); return
  fi
  # Inside an epoch (the likely case): its row, and only its, says where it was resumed.
  local marked
  marked=$(grep -c '"resumed_at_step"' "$out/metrics.jsonl")
  if [ $((at % spe)) -ne 0 ]; then
    if [ "$marked" -ne 1 ] ||
       ! sed -n "$((at / spe + 1))p" "$out/metrics.jsonl" | grep -q "\"resumed_at_step\":$at,"; then
      fail "SIG$sig at step $at: expected row $((at / spe + 1)) alone marked resumed_at_step $at"
      cat "$out/metrics.jsonl"; return
    fi
  elif [ "$marked" -ne 0 ]; then
    fail "SIG$sig at epoch end $at: no row should be marked"; cat "$out/metrics.jsonl"; return
  fi
  if ! cmp -s "$tmp/whole/model.safetensors" "$out/model.safetensors"; then
    fail "SIG$sig at step $at: the weights differ from the uninterrupted run's"; return
  fi
  echo "SIG$sig at step $at (epoch $((at / spe + 1)), step $((at % spe)) of it): resumed exactly ($how)"
  pass
}

interrupt INT "$tmp/int"
interrupt KILL "$tmp/kill"
interrupt TERM "$tmp/term" restart  # what SLURM and Kubernetes send, then torchrun's restart

# A restarted worker whose folder holds another run (another seed) is refused, naming it.
other=("${train[@]:0:${#train[@]}-1}" 6)  # train's last word is its seed, 5
"${restarted[@]}" "$tandem" "${other[@]}" --out "$tmp/int" >"$tmp/other.out" 2>"$tmp/other.err"
rc=$?
if [ $rc -eq 2 ] && grep -q "was made by another configuration (seed: checkpoint 5, now 6)" "$tmp/other.err"; then
  pass
else
  fail "a restarted worker in another run's folder: exit $rc"; cat "$tmp/other.out" "$tmp/other.err"
fi

# A run that failed before its first checkpoint: refused without --resume (saying to add it),
# started over with it.
mkdir -p "$tmp/early/checkpoints" && : >"$tmp/early/metrics.jsonl"
short=(train --data "$idx" --device cpu --mode serial --epochs 1 --batch-size 128 --workers 1)
"$tandem" "${short[@]}" --out "$tmp/early" >"$tmp/early.out" 2>"$tmp/early.err"
rc=$?
if [ $rc -eq 2 ] && grep -q "already exists and is not empty: add --resume to continue it" "$tmp/early.err" &&
   grep -q "or choose another --out" "$tmp/early.err"; then
  pass
else
  fail "a non-empty folder without --resume: exit $rc"; cat "$tmp/early.err"
fi
if "$tandem" "${short[@]}" --out "$tmp/early" --resume >"$tmp/early.out" 2>"$tmp/early.err" &&
   grep -q "no checkpoint in $tmp/early/checkpoints: starting the run from step 0" "$tmp/early.err" &&
   [ "$(wc -l <"$tmp/early/metrics.jsonl")" -eq 1 ] && [ -f "$tmp/early/model.safetensors" ]; then
  pass
else
  fail "--resume without a checkpoint"; cat "$tmp/early.out" "$tmp/early.err"
fi

echo "resume_cli_test: $passed passed, $failed failed"
[ $failed -eq 0 ]

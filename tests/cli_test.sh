#!/usr/bin/env bash
# CLI contract: bad input gives exactly one line on stderr naming the value, and exit code 2;
# --help documents every flag; a tiny CPU run succeeds and writes JSON.
set -u
tandem=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

# expect_fail <expected exit code> <pattern in stderr> -- args...
expect_fail() {
  local code=$1 pattern=$2
  shift 3
  "$tandem" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -eq "$code" ] && grep -qF -- "$pattern" "$tmp/err" && [ "$lines" -eq 1 ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: tandem $* -> exit $rc (want $code), stderr ($lines lines, want 1 with '$pattern'):"
    cat "$tmp/err"
  fi
}

expect_fail 2 "workload 'nope' is not known: expected seg, cls, mlp" -- bench --scenario nope
expect_fail 2 "workload 'nope' is not known: expected seg, cls, mlp" -- bench --workload nope
if "$tandem" --help | grep -q data-bench; then  # built with the data layer
  expect_fail 2 "workload images reads an ImageFolder: give --data DIR" -- bench --workload images --device cpu
  expect_fail 2 "does not exist" -- bench --workload images --device cpu --data /nonexistent/folder
  expect_fail 2 "does not exist" -- data-bench --data /nonexistent/folder --device cpu
  expect_fail 2 "decode 'tpu' is not valid: expected cpu, gpu or auto" -- data-bench --data /tmp --decode tpu --device cpu
  expect_fail 2 "decode='tpu' is not valid for workload images: expected cpu, gpu or auto" -- bench --workload images --decode tpu --device cpu
  expect_fail 2 "parameter 'decode' is not known to workload seg" -- bench --decode gpu --device cpu
fi
if "$tandem" --help | grep -q "^  train"; then  # built with the train layer
  # A tiny IDX folder (256 random 28x28 images, label 1) written with the shell alone.
  idx=$tmp/idx && mkdir -p "$idx"
  { printf '\x00\x00\x08\x03\x00\x00\x01\x00\x00\x00\x00\x1c\x00\x00\x00\x1c'
    head -c $((256 * 784)) /dev/urandom; } >"$idx/train-images-idx3-ubyte"
  { printf '\x00\x00\x08\x01\x00\x00\x01\x00'; head -c 256 /dev/zero | tr '\0' '\1'; } \
    >"$idx/train-labels-idx1-ubyte"
  cp "$idx/train-images-idx3-ubyte" "$idx/t10k-images-idx3-ubyte"
  cp "$idx/train-labels-idx1-ubyte" "$idx/t10k-labels-idx1-ubyte"
  mkdir -p "$tmp/taken" && echo keep >"$tmp/taken/notes.txt"
  expect_fail 2 "--data is required" -- train --out "$tmp/run0"
  expect_fail 2 "--out is required" -- train --data "$idx"
  expect_fail 2 "is a file: expected a folder" -- train --data "$idx/train-images-idx3-ubyte" --out "$tmp/run0" --device cpu
  expect_fail 2 "does not exist" -- train --data /nonexistent/folder --out "$tmp/run0" --device cpu
  expect_fail 2 "already exists and is not empty: add --resume" -- train --data "$idx" --out "$tmp/taken" --device cpu
  # --resume where no checkpoint is yet (a run stopped before its first) starts from step 0.
  if "$tandem" train --data "$idx" --out "$tmp/empty" --resume --device cpu --epochs 1 \
       --workers 1 >"$tmp/out" 2>"$tmp/err" &&
     grep -q "^--resume: no checkpoint in .*: starting the run from step 0" "$tmp/err"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); echo "FAIL: train --resume without a checkpoint"; cat "$tmp/err"
  fi
  expect_fail 2 "model resnet18 takes 3-channel images" -- train --data "$idx" --model resnet18 --out "$tmp/run0" --device cpu
  expect_fail 2 "--precision" -- train --data "$idx" --out "$tmp/run0" --precision fp8
  mkdir -p "$tmp/seg/images" "$tmp/seg/masks"
  expect_fail 2 "give the class count, --classes N" -- train --data "$tmp/seg" --out "$tmp/run0" --device cpu
  expect_fail 2 "model 'small_cnn' classifies" -- train --data "$tmp/seg" --classes 2 --model small_cnn --out "$tmp/run0" --device cpu
  expect_fail 2 "the training set (256 samples) makes no batch of 1000" -- train --data "$idx" --out "$tmp/run0" --batch-size 1000 --device cpu
  expect_fail 2 "the training set (1 sample) makes no batch of 2" -- train --data "$idx" --subset 1 --out "$tmp/run0" --batch-size 2 --device cpu
  expect_fail 2 "--engine-share nan is not valid: expected a finite number from 0 to 1" -- train --data "$idx" --engine-share nan --out "$tmp/run0" --device cpu
  expect_fail 2 "(see tandem train --help)" -- train --data "$idx" --mode fast --out "$tmp/run0" --device cpu
  expect_fail 2 "(see tandem --help)" -- trian --data "$idx"
  # train's help names every exit code the command can end with, the signals' included.
  if "$tandem" train --help | grep -q "130 stopped by SIGINT" &&
     "$tandem" train --help | grep -q "143 by SIGTERM"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); echo "FAIL: train --help does not name exit codes 130 and 143"
  fi
  # Ctrl-C: the step finishes, a checkpoint is written, exit 130 with how to resume; --resume
  # then finishes the run.
  "$tandem" train --data "$idx" --out "$tmp/run1" --device cpu --epochs 40 --batch-size 16 \
    --workers 1 >"$tmp/out" 2>"$tmp/err" &
  pid=$!
  for _ in $(seq 100); do grep -q "^run folder" "$tmp/out" 2>/dev/null && break; sleep 0.1; done
  sleep 1.5
  kill -INT $pid
  wait $pid
  rc=$?
  if [ $rc -eq 130 ] && grep -q "stopped by SIGINT" "$tmp/err" && grep -q "\-\-resume" "$tmp/err" &&
     ls "$tmp/run1/checkpoints" | grep -q "^step-"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); echo "FAIL: train stopped by SIGINT (exit $rc)"; cat "$tmp/out" "$tmp/err"
  fi
  if "$tandem" train --data "$idx" --out "$tmp/run1" --device cpu --epochs 40 --batch-size 16 \
       --workers 1 --resume --json "$tmp/t.json" >"$tmp/out" 2>"$tmp/err" &&
     grep -q "^resuming at step" "$tmp/out" && grep -q '"epochs": 40' "$tmp/t.json" &&
     [ "$(wc -l <"$tmp/run1/metrics.jsonl")" -eq 40 ] && [ -f "$tmp/run1/model.safetensors" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); echo "FAIL: train --resume after SIGINT"; cat "$tmp/out" "$tmp/err"
  fi
fi
expect_fail 2 "mode 'fast' is not valid: expected serial, pipelined, graphed, pipelined+graphed, graphed_k or auto" -- bench --mode fast
expect_fail 2 "mode 'cpu_aug' is not valid: expected serial" -- bench --scenario cls --mode cpu_aug
expect_fail 2 "parameter augment='tpu' is not valid for workload cls: expected gpu or cpu" -- bench --scenario cls --param augment=tpu --device cpu
expect_fail 2 "parameter 'augment' is not known to workload seg: expected none" -- bench --param augment=cpu --device cpu
expect_fail 2 "parameter 'augment' is not valid: expected KEY=VALUE" -- bench --param augment --device cpu
expect_fail 2 "worker count 100000 is not valid: expected 1 to 1024 loader worker threads" -- bench --workers 100000 --device cpu
expect_fail 2 "exceeds half of this machine's memory" -- bench --device cpu --batch-size 100000000 --workers 1 --steps 1 --warmup 0
expect_fail 2 "batch size 0 is not valid" -- bench --batch-size 0
expect_fail 2 "cuDNN benchmark limit -1 is not valid: expected 0 (every algorithm) or a positive count" -- bench --device cpu --cudnn-benchmark-limit -1
# An allocation LibTorch cannot make (the loss log of 10^12 steps: 4 TB) is one line naming the
# flags, not the allocator's. Where the kernel overcommits always, the allocation would succeed.
if [ "$(cat /proc/sys/vm/overcommit_memory 2>/dev/null)" != 1 ]; then
  expect_fail 2 "--batch-size 1 with --steps 1000000000000 and --warmup 0 does not fit in cpu memory" -- bench --device cpu --batch-size 1 --steps 1000000000000 --warmup 0 --workers 1
fi
expect_fail 2 "step count -5 is not valid" -- bench --steps -5
expect_fail 2 "warm-up count -1" -- bench --warmup -1 --device cpu
expect_fail 2 "worker count -2" -- bench --workers -2
expect_fail 2 "--json path '/nonexistent-dir/x.json' cannot be written: the folder /nonexistent-dir does not exist" -- bench --json /nonexistent-dir/x.json
expect_fail 2 "--json path '/tmp' cannot be written: it is a folder" -- bench --json /tmp
expect_fail 2 "device 'tpu' is not valid" -- bench --device tpu
expect_fail 2 "--trace path '/nonexistent-dir/t.json' cannot be written" -- bench --trace /nonexistent-dir/t.json
expect_fail 2 "train priority 'max' is not valid: expected high or normal" -- bench --train-priority max
expect_fail 2 "input priority 'low' is not valid: expected high or normal" -- bench --input-priority low
expect_fail 2 "CUDA wait 'nap' is not valid: expected auto, spin, yield or block" -- bench --cuda-wait nap
expect_fail 2 "device timing interval 0 is not valid: expected a positive number of steps" -- bench --device-timing-every 0
expect_fail 2 "--batch-size" -- bench --batch-size many
expect_fail 2 "--frobnicate" -- bench --frobnicate
expect_fail 2 "subcommand" --
expect_fail 2 "--batch-sizes is required" -- sweep --device cpu
expect_fail 2 "batch size 0 is not valid" -- sweep --device cpu --batch-sizes 4,0
expect_fail 2 "rounds 0 is not valid" -- sweep --device cpu --batch-sizes 1 --rounds 0
expect_fail 2 "mode 'warp' is not valid: expected all, serial" -- sweep --device cpu --modes serial,warp --batch-sizes 1
expect_fail 2 "--svg path '/nonexistent-dir/s.svg' cannot be written" -- sweep --device cpu --batch-sizes 1 --svg /nonexistent-dir/s.svg
expect_fail 2 "sampling 'texture' is not valid: expected auto, gather or staged" -- augment-bench --device cpu --batch-sizes 1 --sampling auto,texture

if "$tandem" bench --help >"$tmp/help" 2>&1 &&
   for flag in --workload --scenario --param --mode --batch-size --steps --warmup --workers --seed --device --json --trace --kernels --kernel-trace --cudnn-benchmark --cudnn-benchmark-limit --train-priority --input-priority --cuda-wait graphed_k pipelined+graphed augment=gpu; do
     grep -qF -- "$flag" "$tmp/help" || exit 1
   done; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "FAIL: bench --help does not document every flag"; cat "$tmp/help"
fi

if "$tandem" bench --device cpu --batch-size 1 --steps 1 --warmup 0 --workers 1 \
     --json "$tmp/r.json" >"$tmp/out" 2>"$tmp/err" &&
   grep -q '"steps_per_s"' "$tmp/r.json" && grep -q '"first_loss"' "$tmp/r.json" &&
   grep -q 'steps/s' "$tmp/out"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "FAIL: a tiny CPU run"; cat "$tmp/out" "$tmp/err"
fi

# --kernels: profiled steps after the timed ones; on the CPU the list is empty and says why.
if "$tandem" bench --device cpu --batch-size 1 --steps 1 --warmup 0 --workers 1 --kernels 2 \
     --json "$tmp/k.json" >"$tmp/out" 2>"$tmp/err" &&
   python3 -c "import json,sys; k=json.load(open(sys.argv[1]))['kernels']; sys.exit(not (k['steps'] == 2 and k['kernels'] == []))" "$tmp/k.json" &&
   grep -q 'GPU kernels: none ran in the 2 profiled steps' "$tmp/out"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "FAIL: bench --kernels on the CPU"; cat "$tmp/out" "$tmp/err"
fi
expect_fail 2 "kernel profile step count -1 is not valid: expected 0 (none) or more steps" -- bench --device cpu --kernels -1
# --kernel-trace: the profiler's own Chrome trace of the profiled steps.
if "$tandem" bench --device cpu --batch-size 1 --steps 1 --warmup 0 --workers 1 --kernels 1 \
     --kernel-trace "$tmp/kt.json" >"$tmp/out" 2>"$tmp/err" &&
   python3 -c "import json,sys; sys.exit(not isinstance(json.load(open(sys.argv[1]))['traceEvents'], list))" "$tmp/kt.json" &&
   grep -qF "wrote $tmp/kt.json" "$tmp/out"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "FAIL: bench --kernel-trace on the CPU"; cat "$tmp/out" "$tmp/err"
fi
expect_fail 2 "a kernel trace ('$tmp/none.json') records the profiled steps: give their count too (--kernels N)" -- bench --device cpu --kernel-trace "$tmp/none.json"

if "$tandem" sweep --device cpu --batch-sizes 1 --steps 1 --warmup 0 --workers 1 \
     --csv "$tmp/s.csv" --svg "$tmp/s.svg" --json "$tmp/s.json" >"$tmp/out" 2>"$tmp/err" &&
   head -1 "$tmp/s.csv" | grep -q '^mode,batch_size,steps_per_s' &&
   [ "$(wc -l <"$tmp/s.csv")" -eq 6 ] && grep -q 'data-mode="pipelined"' "$tmp/s.svg" &&
   grep -q '^pipelined+graphed,' "$tmp/s.csv" &&
   grep -q '"speedup"' "$tmp/s.json" && grep -q 'samples/s' "$tmp/out"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "FAIL: a tiny CPU sweep"; cat "$tmp/out" "$tmp/err"
fi

# "all" (first, as benchmarks/gpu_check.py's sweep passes it) expands to the scenario's modes; a
# mode named twice runs once; the baseline runs first.
if "$tandem" sweep --scenario mlp --device cpu --batch-sizes 1 --steps 1 --warmup 0 \
     --modes all,graphed --csv "$tmp/m.csv" >"$tmp/out" 2>"$tmp/err" &&
   [ "$(cut -d, -f1 "$tmp/m.csv" | tail -n +2 | paste -sd' ')" = "serial pipelined graphed pipelined+graphed graphed_k" ]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "FAIL: sweep --modes all,graphed"; cat "$tmp/out" "$tmp/err" "$tmp/m.csv"
fi

if "$tandem" bench --device cpu --mode auto --batch-size 1 --steps 1 --warmup 0 --workers 1 \
     --json "$tmp/a.json" >"$tmp/out" 2>"$tmp/err" &&
   grep -q 'auto: picked' "$tmp/out" && grep -q '"picked"' "$tmp/a.json" &&
   grep -q '"trials"' "$tmp/a.json"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "FAIL: --mode auto on the CPU"; cat "$tmp/out" "$tmp/err"
fi

if "$tandem" bench --workload cls --param augment=cpu --device cpu --batch-size 1 --steps 1 \
     --warmup 0 --workers 1 --json "$tmp/c.json" >"$tmp/out" 2>"$tmp/err" &&
   grep -q '^cls *serial' "$tmp/out" && grep -q '^param *augment=cpu' "$tmp/out" &&
   grep -q '"augment": "cpu"' "$tmp/c.json"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "FAIL: cls with the augmentation on the loader's workers"; cat "$tmp/out" "$tmp/err"
fi
# Without --mode every workload runs its baseline, serial.
for workload in cls mlp; do
  if "$tandem" bench --workload $workload --device cpu --batch-size 1 --steps 1 --warmup 0 \
       --workers 1 >"$tmp/out" 2>"$tmp/err" && grep -q "^$workload *serial" "$tmp/out"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); echo "FAIL: $workload without --mode"; cat "$tmp/out" "$tmp/err"
  fi
done
# A write the disk refuses is an error (exit 1), never silent.
if [ -w /dev/full ]; then
  for flag in --json --trace; do
    expect_fail 1 "writing" -- bench --device cpu --batch-size 1 --steps 1 --warmup 0 --workers 1 $flag /dev/full
  done
  # sweep reports each finished point on stderr ("done: ..."); the error is the last line.
  "$tandem" sweep --device cpu --scenario mlp --modes serial --batch-sizes 1 --steps 1 \
    --warmup 0 --csv /dev/full >"$tmp/out" 2>"$tmp/err"
  if [ $? -eq 1 ] && tail -n 1 "$tmp/err" | grep -qF "tandem: error: writing '/dev/full' failed"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); echo "FAIL: sweep --csv /dev/full"; cat "$tmp/err"
  fi
fi
for scenario in seg cls; do
  if "$tandem" bench --scenario $scenario --mode pipelined+graphed --device cpu --batch-size 1 \
       --steps 1 --warmup 0 --workers 1 >"$tmp/out" 2>"$tmp/err" &&
     grep -q 'note .*mode pipelined+graphed ran eagerly on the CPU' "$tmp/out"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); echo "FAIL: $scenario pipelined+graphed on the CPU"; cat "$tmp/out" "$tmp/err"
  fi
done

echo "cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# Data parallel from the command line, on the CPU: `tandem bench --nproc 2` runs two ranks and
# writes one JSON (rank 0's) with the ranks' rates; a bad launch environment is one line and
# exit 2; a rank killed mid-run ends the job non-zero within 30 s, naming the rank; torchrun
# starts tandem as two "nodes" of one process each over loopback (when torchrun is given).
# Usage: dist_cli_test.sh TANDEM [TORCHRUN]
set -u
tandem=$1
torchrun=${2:-}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }
# A small, fast data-parallel run: the MLP on the CPU (42 MB of gradients per step).
run=(bench --workload mlp --device cpu --mode serial --batch-size 4 --workers 1
     --no-gpu-monitor)
port() { echo $((20000 + ($$ + $1) % 20000)); }

# expect_env_fail <pattern> <env...> -- <args...>: exit 2 and one line on stderr with pattern.
expect_env_fail() {
  local pattern=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$tandem" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "$pattern" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ]; then
    ok
  else
    fail "${envs[*]} tandem $* -> exit $rc (want 2, one line with '$pattern'):"
    cat "$tmp/err"
  fi
}

# 1. --nproc 2: both ranks run, rank 0 writes the JSON.
if "$tandem" "${run[@]}" --steps 3 --warmup 1 --nproc 2 --json "$tmp/dp.json" >"$tmp/dp.out" 2>&1 &&
   grep -q '"world_size": 2' "$tmp/dp.json" && grep -q '"steps_per_s_by_rank"' "$tmp/dp.json" &&
   grep -q "^data parallel: 2 ranks" "$tmp/dp.out" &&
   grep -q "gradients averaged over 2 ranks (store (CPU))" "$tmp/dp.out"; then
  ok
else
  fail "tandem bench --nproc 2:"; cat "$tmp/dp.out"
fi

# 1b. --bucket-cap-mb sets the buckets (the MLP's 42 MB: one bucket of 1 MB's cap, then 2 MB
#     ones); 0 is refused at parse time.
if "$tandem" "${run[@]}" --steps 2 --warmup 1 --nproc 2 --bucket-cap-mb 2 >"$tmp/bk.out" 2>&1 &&
   grep -q "buckets of <= 2 MB" "$tmp/bk.out"; then
  ok
else
  fail "tandem bench --nproc 2 --bucket-cap-mb 2:"; cat "$tmp/bk.out"
fi
"$tandem" "${run[@]}" --steps 1 --bucket-cap-mb 0 >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 2 ] && grep -q -- "--bucket-cap-mb" "$tmp/err"; then ok; else
  fail "--bucket-cap-mb 0 not refused with exit 2:"; cat "$tmp/err"; fi

# 1c. --mode auto --nproc 2: every rank times the modes alone, then all run rank 0's pick (the
#     JSON says which, the printout only once, from rank 0).
auto_run=(bench --workload mlp --device cpu --mode auto --batch-size 4 --workers 1
          --no-gpu-monitor --steps 2 --warmup 1)
if "$tandem" "${auto_run[@]}" --nproc 2 --json "$tmp/auto.json" >"$tmp/auto.out" 2>&1 &&
   grep -q '"picked"' "$tmp/auto.json" && grep -q '"world_size": 2' "$tmp/auto.json" &&
   grep -q "every rank alone, then rank 0's pick" "$tmp/auto.out" &&
   [ "$(grep -c '^auto: picked' "$tmp/auto.out")" -eq 1 ]; then
  ok
else
  fail "tandem bench --mode auto --nproc 2:"; cat "$tmp/auto.out"
fi

# 2. Bad environments.
expect_env_fail "MASTER_ADDR is not set" RANK=0 WORLD_SIZE=2 MASTER_PORT=$(port 1) -- "${run[@]}" --steps 1
expect_env_fail "RANK=2 is not valid for WORLD_SIZE=2" RANK=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=$(port 1) -- "${run[@]}" --steps 1
expect_env_fail "WORLD_SIZE='x' is not valid" RANK=0 WORLD_SIZE=x MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=$(port 1) -- "${run[@]}" --steps 1
expect_env_fail "--nproc 2 under a launcher" RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=$(port 1) -- "${run[@]}" --steps 1 --nproc 2
# A port in use: a first rank 0 holds it (waiting for its rank 1), a second one cannot host.
p=$(port 2)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$tandem" "${run[@]}" --steps 1 \
  >/dev/null 2>&1 &
holder=$!
sleep 2
expect_env_fail "is MASTER_PORT in use?" RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=$p -- "${run[@]}" --steps 1
kill $holder 2>/dev/null; wait $holder 2>/dev/null
# Ranks started with different world sizes: both stop at once.
p=$(port 3)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$tandem" "${run[@]}" --steps 1 \
  >"$tmp/w0.out" 2>"$tmp/w0.err" &
r0=$!
RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 60 "$tandem" "${run[@]}" --steps 1 \
  >"$tmp/w1.out" 2>"$tmp/w1.err"
rc1=$?
timeout 60 tail --pid=$r0 -f /dev/null; wait $r0; rc0=$?
if [ $rc0 -eq 2 ] && grep -qF "rank 1 was started with WORLD_SIZE=3 and rank 0 with WORLD_SIZE=2" "$tmp/w0.err" &&
   [ $rc1 -ne 0 ] && [ $rc1 -ne 124 ]; then
  ok
else
  fail "WORLD_SIZE mismatch: rank 0 exit $rc0, rank 1 exit $rc1"; cat "$tmp/w0.err" "$tmp/w1.err"
fi

# 2b. The job's timeouts: --join-timeout (or TANDEM_JOIN_TIMEOUT) bounds a lone rank's wait for
#     the others, named in its error; a timeout that is not > 0 is refused (flag and variable);
#     both flags' help names the default and the variable, for bench and train.
for how in flag env; do
  p=$(port 6)
  if [ $how = flag ]; then args=(--join-timeout 2); envs=(); else args=(); envs=(TANDEM_JOIN_TIMEOUT=2); fi
  start=$SECONDS
  env "${envs[@]}" RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 60 "$tandem"     "${run[@]}" --steps 1 "${args[@]}" >"$tmp/jt.out" 2>"$tmp/jt.err"
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $((SECONDS - start)) -lt 30 ] &&
     grep -qF "rank 0 waited 2 s at the store" "$tmp/jt.err" &&
     grep -qF "for rank(s) 1 of WORLD_SIZE=2 to join" "$tmp/jt.err"; then
    ok
  else
    fail "a join timeout of 2 s ($how): exit $rc after $((SECONDS - start)) s:"; cat "$tmp/jt.err"
  fi
done
"$tandem" "${run[@]}" --steps 1 --heartbeat-timeout 0 >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 2 ] && grep -qF -- "0 is not valid: expected a number of seconds > 0" "$tmp/err"; then
  ok; else fail "--heartbeat-timeout 0 not refused with exit 2:"; cat "$tmp/err"; fi
expect_env_fail "TANDEM_HEARTBEAT_TIMEOUT='soon' is not valid" TANDEM_HEARTBEAT_TIMEOUT=soon \
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(port 5) -- "${run[@]}" --steps 1
for cmd in bench train; do
  "$tandem" $cmd --help >"$tmp/help" 2>&1
  if grep -qF "[default: 120, or TANDEM_JOIN_TIMEOUT]" "$tmp/help" &&
     grep -qF "[default: 10, or TANDEM_HEARTBEAT_TIMEOUT]" "$tmp/help"; then
    ok; else fail "tandem $cmd --help does not name the timeouts' defaults:"; grep -i timeout "$tmp/help"; fi
done

# 3. A rank killed mid-run: the job ends non-zero within 30 s and names the rank.
"$tandem" "${run[@]}" --steps 100000 --warmup 1 --nproc 2 >"$tmp/kill.out" 2>"$tmp/kill.err" &
launcher=$!
for _ in $(seq 1 600); do  # until both ranks train (rank 0 prints its configuration first)
  [ "$(pgrep -P $launcher | wc -l)" -eq 2 ] && grep -q "^data parallel" "$tmp/kill.out" && break
  sleep 0.1
done
sleep 3
victim=$(pgrep -P $launcher | sort -n | tail -1)  # the later pid: rank 1
kill -KILL "$victim"
start=$(date +%s)
timeout 30 tail --pid=$launcher -f /dev/null
wait $launcher
rc=$?
took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $took -lt 30 ] && grep -q "rank 1 of 2 was killed by signal 9" "$tmp/kill.err" &&
   [ "$(pgrep -P $launcher | wc -l)" -eq 0 ]; then
  ok
else
  fail "killed rank: launcher exit $rc after ${took}s:"; cat "$tmp/kill.err"
fi

# 4. torchrun: two "nodes" of one process each over loopback (c10d rendezvous; the agent hosts
#    the store, TORCHELASTIC_USE_AGENT_STORE).
if [ -n "$torchrun" ] && [ -x "$torchrun" ]; then
  p=$(port 4)
  for node in 0 1; do
    OMP_NUM_THREADS=1 "$torchrun" --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
      --rdzv-endpoint 127.0.0.1:$p --rdzv-id tandem-test --no-python "$tandem" "${run[@]}" \
      --steps 3 --warmup 1 --json "$tmp/node$node.json" >"$tmp/node$node.out" 2>&1 &
  done
  rcs=0
  for j in $(jobs -p); do timeout 300 tail --pid=$j -f /dev/null; wait $j || rcs=1; done
  # One node's rank is 0 (rendezvous assigns ranks): exactly one JSON, of a world of 2.
  jsons=$(ls "$tmp"/node*.json 2>/dev/null | wc -l)
  if [ $rcs -eq 0 ] && [ "$jsons" -eq 1 ] && grep -q '"world_size": 2' "$tmp"/node*.json; then
    ok
  else
    fail "torchrun two nodes (exit $rcs, $jsons JSON files):"; cat "$tmp"/node*.out
  fi
else
  echo "skipped: torchrun two-node run (no torchrun given)"
fi

# 5. tandem train --nproc 2: rank 0 alone writes the run folder and prints; a Ctrl-C (SIGINT to
#    the launcher) stops both ranks at one step with a checkpoint, and --resume then ends with
#    the weights of an uninterrupted run, bit for bit.
fm=/usr/share/datasets/fashion-mnist
if "$tandem" --help | grep -q "^  train" && [ -f "$fm/train-images-idx3-ubyte.gz" ]; then
  train=(train --data "$fm" --subset 1024 --val-subset 256 --batch-size 32 --epochs 2
         --device cpu --workers 1 --nproc 2)
  "$tandem" "${train[@]}" --out "$tmp/whole" --json "$tmp/whole.json" >"$tmp/whole.out" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q '"world_size": 2' "$tmp/whole.json" &&
     [ "$(grep -c '^epoch 1/2' "$tmp/whole.out")" -eq 1 ] &&
     [ "$(wc -l <"$tmp/whole/metrics.jsonl")" -eq 2 ] && [ -f "$tmp/whole/model.safetensors" ]; then
    ok
  else
    fail "tandem train --nproc 2 (exit $rc):"; cat "$tmp/whole.out"
  fi
  "$tandem" "${train[@]}" --checkpoint-every 8 --out "$tmp/cut" >"$tmp/cut.out" 2>"$tmp/cut.err" &
  launcher=$!
  for _ in $(seq 1 1200); do  # until the first checkpoint (step 8) is there
    ls "$tmp/cut/checkpoints" 2>/dev/null | grep -q "^step-" && break
    sleep 0.1
  done
  kill -INT $launcher
  timeout 120 tail --pid=$launcher -f /dev/null
  wait $launcher
  rc_cut=$?
  "$tandem" "${train[@]}" --out "$tmp/cut" --resume >"$tmp/resume.out" 2>&1
  rc_resume=$?
  if [ $rc_cut -eq 130 ] && grep -q "Resume with" "$tmp/cut.err" && [ $rc_resume -eq 0 ] &&
     cmp -s "$tmp/whole/model.safetensors" "$tmp/cut/model.safetensors"; then
    ok
  else
    fail "train --nproc 2: SIGINT exit $rc_cut, resume exit $rc_resume, weights $(cmp "$tmp/whole/model.safetensors" "$tmp/cut/model.safetensors" 2>&1 && echo equal):"
    cat "$tmp/cut.err" "$tmp/resume.out" | tail -20
  fi
else
  echo "skipped: tandem train --nproc (no train layer or no Fashion-MNIST)"
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

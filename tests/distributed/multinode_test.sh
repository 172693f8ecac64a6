#!/usr/bin/env bash
# Many machines, on one: two torchrun agents with --nnodes 2 (c10d rendezvous on localhost, one
# CPU rank each, tandem's store collectives) run `tandem train` on a small generated IDX folder,
# as docs/clusters.md runs it on a cluster:
#   (a) the two-node run ends; rank 0 alone wrote the run folder (against one process on the
#       global batch: python/tests/test_distributed.py, with a model free of batch norm — the
#       CLI's models normalize each rank's batch on its own, as DDP without SyncBatchNorm);
#   (b) a worker killed mid-epoch under --max-restarts 1: torchrun restarts both workers, which
#       continue from the folder's newest checkpoint, and the run ends with (a)'s weights and
#       records, bit for bit;
#   (c) SIGTERM to every worker (what SLURM and Kubernetes send before killing): both stop at one
#       step with a checkpoint, exit 143; the command again with --resume (a requeued job: it
#       starts a run in an empty folder, continues the one there) ends with (a)'s weights.
# Usage: multinode_test.sh TANDEM TORCHRUN
set -u
tandem=$1
torchrun=$2
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; pkill -P $$ 2>/dev/null; [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }

# 2048 random 28x28 images in 4 classes: every run below reads this one folder.
idx=$tmp/idx
bash "$(dirname "$0")/../random_idx.sh" "$idx" 2048

# 32 steps an epoch (16 a rank, 2 ranks), 4 epochs, a checkpoint every 4 steps.
train=(train --data "$idx" --device cpu --mode pipelined --epochs 4 --batch-size 32 --workers 1
       --checkpoint-every 4 --seed 5 --heartbeat-timeout 3 --quiet)
port=$((21000 + $$ % 20000))

# two_nodes <run folder> <log prefix> [torchrun args...] [-- train args...]: starts the two
# agents in the background; their pids in $agents.
agents=()
two_nodes() {
  local out=$1 log=$2
  shift 2
  local launch=() extra=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do launch+=("$1"); shift; done
  [ $# -gt 0 ] && shift && extra=("$@")
  agents=()
  port=$((port + 1))
  for node in 0 1; do
    OMP_NUM_THREADS=1 "$torchrun" --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
      --rdzv-endpoint 127.0.0.1:$port --rdzv-id "tandem-$port" "${launch[@]}" --no-python \
      "$tandem" "${train[@]}" "${extra[@]}" --out "$out" >"$log.node$node" 2>&1 &
    agents+=($!)
  done
}
# wait_agents: waits for both (at most 300 s each); their exit statuses in $rcs.
wait_agents() {
  rcs=()
  for a in "${agents[@]}"; do
    timeout 300 tail --pid=$a -f /dev/null
    wait $a
    rcs+=($?)
  done
}
# The newest checkpoint's step in run folder $1, or -1.
newest() {
  local n
  n=$(ls "$1/checkpoints" 2>/dev/null | grep -E '^step-[0-9]{9}$' | tail -1)
  if [ -n "$n" ]; then echo $((10#${n#step-})); else echo -1; fi
}
# until_checkpoint <run folder> <step>: waits until a checkpoint at or after that step exists.
until_checkpoint() {
  for _ in $(seq 3000); do
    [ "$(newest "$1")" -ge "$2" ] && return 0
    sleep 0.02
  done
  return 1
}
# The workers (the agents' children).
workers() { for a in "${agents[@]}"; do pgrep -P "$a"; done; }
# metrics.jsonl without the fields that may differ (times, the resume marker).
rows() {
  sed -E 's/"(epoch_images_per_s|eval_seconds|eval_images_per_s|images_per_s|resumed_at_step|train_seconds)":[^,}]*,?//g; s/,}/}/' "$1/metrics.jsonl"
}
same_run() {  # same_run <folder> <what>: the weights and records of (a)'s run
  if cmp -s "$tmp/whole/model.safetensors" "$1/model.safetensors" &&
     [ "$(rows "$tmp/whole")" = "$(rows "$1")" ]; then
    ok
  else
    fail "$2: the weights or records differ from the uninterrupted run's"
    diff <(rows "$tmp/whole") <(rows "$1")
  fi
}

# (a) the uninterrupted two-node run.
two_nodes "$tmp/whole" "$tmp/whole"
wait_agents
if [ "${rcs[*]}" = "0 0" ] && [ -f "$tmp/whole/model.safetensors" ] &&
   [ "$(wc -l <"$tmp/whole/metrics.jsonl")" -eq 4 ] &&
   [ "$(cat "$tmp"/whole.node* | grep -c '^run folder ')" -eq 1 ]; then  # rank 0 alone prints
  ok
else
  fail "(a) two nodes: exits ${rcs[*]}"; for f in "$tmp"/whole.node*; do echo "== $f"; tail -20 "$f"; done
  echo "multinode_test: $passed passed, $failed failed"
  exit 1
fi

# (b) a worker killed mid-epoch, torchrun restarts both: the run goes on from its checkpoint.
two_nodes "$tmp/killed" "$tmp/killed" --max-restarts 1
if until_checkpoint "$tmp/killed" 40; then
  victim=$(pgrep -P "${agents[1]}" | head -1)
  kill -KILL "$victim"
fi
wait_agents
if [ "${rcs[*]}" = "0 0" ] && cat "$tmp"/killed.node* |
     grep -q "^restarted by torchrun: continuing the run in $tmp/killed, as --resume" &&
   cat "$tmp"/killed.node* | grep -q "^resuming at step "; then
  ok
  same_run "$tmp/killed" "(b) a killed worker restarted"
else
  fail "(b) a killed worker (pid ${victim:-none}) under --max-restarts 1: exits ${rcs[*]}"
  for f in "$tmp"/killed.node*; do echo "== $f"; tail -30 "$f"; done
fi

# (c) SIGTERM to every worker, then the same command again.
two_nodes "$tmp/term" "$tmp/term"
if until_checkpoint "$tmp/term" 40; then
  kill -TERM $(workers) 2>/dev/null
fi
wait_agents
at=$(newest "$tmp/term")
stopped=$(cat "$tmp"/term.node* | grep -c "stopped by SIGTERM\|exitcode: 143\|exit code 143\|143")
two_nodes "$tmp/term" "$tmp/term.again" -- --resume  # a requeued job: the same command
wait_agents
if [ "$stopped" -ge 1 ] && [ "${rcs[*]}" = "0 0" ] &&
   cat "$tmp"/term.again.node* | grep -q "^resuming at step $at "; then
  ok
  same_run "$tmp/term" "(c) SIGTERM, then the same command"
else
  fail "(c) SIGTERM at step $at, then again: exits ${rcs[*]}"; for f in "$tmp"/term.node* "$tmp"/term.again.node*; do echo "== $f"; tail -20 "$f"; done
fi

echo "multinode_test: $passed passed, $failed failed"
[ $failed -eq 0 ]

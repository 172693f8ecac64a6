#!/usr/bin/env bash
# Acceptance A/B of issue "open workload API": this tree's `tandem` against OLD_TREE's (a source
# tree of commit d529f74, the scenario API), built alike and run alternately, cell by cell, in one
# call (rates drift between calls: the same-call ratio is what counts). Per cell: each side's
# median steps/s and new/old, PASS at >= 0.97.
# Usage: scripts/redesign-ab.sh OUT OLD_TREE
# Writes OUT/redesign.json (after every round, so a killed call keeps what it measured),
# OUT/redesign-ab.log, OUT/redesign-build.log (the builds' output) and OUT/redesign-runs.tar.gz
# (every run's JSON and output).
# env: AB_PHASE      build | run | all (default): the builds and the runs can be separate calls
#      AB_REBUILD=1  build even where a tree's binary exists (default: that build is skipped)
#      AB_ROUNDS     rounds (3); in odd rounds each cell runs old then new, in even ones new first
#      AB_CELLS      "SCENARIO:BATCH:MODE ..." (default: seg 8,32,128 and cls 32,128, each
#                    pipelined and pipelined+graphed; mlp 640 graphed)
#      AB_STEPS (100), AB_WARMUP (10), AB_WORKERS (8), AB_TIMEOUT (120 s per run)
#      AB_BUDGET_S   (540) no run starts that might end later than this many seconds after the
#                    script started (a device call is killed at 600 s); the rest is reported
#      AB_MIN_RATIO (0.97), AB_OLD_COMMIT (d529f74, for the record), AB_JOBS (16)
#      AB_NEW_BUILD  (default ROOT/build-ab), AB_OLD_BUILD (default ROOT/build-ab-old: not inside
#                    OLD_TREE, since a device call that carries OLD_TREE replaces it, build too)
# Exit: 0 every run done and every cell PASS; 3 every run done, some cell below AB_MIN_RATIO;
#       1 a build or a run failed, or the budget stopped the runs; 2 bad usage.
set -uo pipefail
USAGE="usage: scripts/redesign-ab.sh OUT OLD_TREE"
[ $# -eq 2 ] || { echo "$USAGE" >&2; exit 2; }
T0=$SECONDS
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
OLD_ARG=$2
[ -f "$2/CMakeLists.txt" ] || { echo "redesign-ab: '$2' is not a source tree (no CMakeLists.txt)" >&2; exit 2; }
OLD_TREE=$(cd "$2" && pwd)
[ "$OLD_TREE" != "$ROOT" ] || { echo "redesign-ab: OLD_TREE is this tree" >&2; exit 2; }

PHASE=${AB_PHASE:-all}
case $PHASE in build | run | all) ;; *) echo "redesign-ab: AB_PHASE '$PHASE': expected build, run or all" >&2; exit 2 ;; esac
ROUNDS=${AB_ROUNDS:-3}
DEFAULT_CELLS="seg:8:pipelined seg:8:pipelined+graphed seg:32:pipelined seg:32:pipelined+graphed
  seg:128:pipelined seg:128:pipelined+graphed cls:32:pipelined cls:32:pipelined+graphed
  cls:128:pipelined cls:128:pipelined+graphed mlp:640:graphed"
read -r -d '' -a CELLS <<<"${AB_CELLS:-$DEFAULT_CELLS}"
STEPS=${AB_STEPS:-100}
WARMUP=${AB_WARMUP:-10}
WORKERS=${AB_WORKERS:-8}
RUN_TIMEOUT=${AB_TIMEOUT:-120}
BUDGET=${AB_BUDGET_S:-540}
MIN_RATIO=${AB_MIN_RATIO:-0.97}
OLD_COMMIT=${AB_OLD_COMMIT:-d529f74}
JOBS=${AB_JOBS:-16}
NEW_BUILD=${AB_NEW_BUILD:-$ROOT/build-ab}
OLD_BUILD=${AB_OLD_BUILD:-$ROOT/build-ab-old}
CMAKE=${TANDEM_CMAKE:-cmake}
LOG="$OUT/redesign-ab.log"
BUILD_LOG="$OUT/redesign-build.log"
export PYTHONUNBUFFERED=1

for n in "$ROUNDS" "$STEPS" "$WARMUP" "$WORKERS" "$RUN_TIMEOUT" "$BUDGET" "$JOBS"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "redesign-ab: '$n' is not a count (AB_ROUNDS, AB_STEPS, ...)" >&2; exit 2; }
done
[ ${#CELLS[@]} -gt 0 ] || { echo "redesign-ab: AB_CELLS is empty" >&2; exit 2; }
for cell in "${CELLS[@]}"; do
  [[ $cell =~ ^[a-z_]+:[0-9]+:[a-z_+]+$ ]] ||
    { echo "redesign-ab: cell '$cell': expected SCENARIO:BATCH:MODE, e.g. seg:8:pipelined" >&2; exit 2; }
done

log() { echo "$*" | tee -a "$LOG"; }
say() { log "== $(date -u +%H:%M:%S) $*"; }
elapsed() { echo $((SECONDS - T0)); }

# The files a build reads, hashed: a binary kept from an earlier call is stale when this changed.
source_sha1() {
  (cd "$1" && find . \( -path ./.git -o -path './build*' -o -path ./.ref -o -path ./.whl \) -prune \
    -o -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \
    -o -name CMakeLists.txt -o -name '*.cmake' -o -name '*.in' \) -print | LC_ALL=C sort |
    xargs -d '\n' sha1sum | sha1sum | cut -c1-12)
}

# The CLI binary of a build directory (OUTPUT_NAME tandem of target tandem_cli), or nothing.
find_bin() {
  if [ -x "$1/tandem" ] && [ -f "$1/tandem" ]; then echo "$1/tandem"; return; fi
  [ -d "$1" ] && find "$1" -maxdepth 3 -type f -name tandem -perm -u+x 2>/dev/null | head -1
}

# check_fresh NAME BUILD SOURCES_SHA1: warns when a kept binary was built from other sources.
check_fresh() {
  local built
  built=$(cat "$2/.ab-source-sha1" 2>/dev/null)
  if [ -z "$built" ]; then
    log "WARNING: $1: $2 has no record of the sources it was built from (not built by this script)"
  elif [ "$built" != "$3" ]; then
    log "WARNING: $1: the binary in $2 is STALE: built from sources $built, the tree is now $3; AB_REBUILD=1 rebuilds"
  fi
}

# build_tree NAME TREE BUILD: the cmake invocation of both trees; TANDEM_BUILD_EXAMPLES is passed
# only to a tree that knows it (d529f74 does not).
build_tree() {
  local name=$1 tree=$2 build=$3 bin sha start
  bin=$(find_bin "$build")
  sha=$(source_sha1 "$tree")
  if [ -n "$bin" ] && [ "${AB_REBUILD:-0}" != 1 ]; then
    log "$name: $bin exists: not rebuilt (AB_REBUILD=1 rebuilds)"
    check_fresh "$name" "$build" "$sha"
    return 0
  fi
  # A build directory configured from another source tree cannot be reused.
  if [ -f "$build/CMakeCache.txt" ]; then
    local home
    home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
    if [ "$(realpath -m "$home")" != "$(realpath "$tree")" ]; then
      log "$name: $build was configured from $home: removed"
      rm -rf "$build"
    fi
  fi
  local prefix opts=(-DTANDEM_BUILD_TESTS=OFF)
  grep -qs TANDEM_BUILD_EXAMPLES "$tree/CMakeLists.txt" "$tree"/cmake/*.cmake &&
    opts+=(-DTANDEM_BUILD_EXAMPLES=OFF)
  prefix=${TANDEM_TORCH_PREFIX:-$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')} ||
    { log "$name: python3 has no torch (set TANDEM_TORCH_PREFIX)"; return 1; }
  say "build $name: $tree -> $build (${opts[*]}, target tandem_cli, -j $JOBS)"
  start=$SECONDS
  if ! { echo "== $name: $tree"
         "$CMAKE" -S "$tree" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
           -DCMAKE_PREFIX_PATH="$prefix" "${opts[@]}" &&
         "$CMAKE" --build "$build" -j "$JOBS" --target tandem_cli; } >>"$BUILD_LOG" 2>&1; then
    tail -40 "$BUILD_LOG" | tee -a "$LOG"
    say "BUILD FAILED: $name (redesign-build.log)"
    return 1
  fi
  bin=$(find_bin "$build")
  [ -n "$bin" ] || { say "BUILD FAILED: $name: no tandem binary under $build"; return 1; }
  echo "$sha" >"$build/.ab-source-sha1"
  log "$name built in $((SECONDS - start)) s: $bin (sources $sha)"
}

say "redesign A/B: new = $ROOT, old = $OLD_TREE ($OLD_COMMIT); phase $PHASE"
if [ "$PHASE" != run ]; then
  phase_start=$SECONDS
  build_tree old "$OLD_TREE" "$OLD_BUILD" || exit 1
  build_tree new "$ROOT" "$NEW_BUILD" || exit 1
  say "phase build: $((SECONDS - phase_start)) s"
fi
[ "$PHASE" = build ] && exit 0

OLD_BIN=$(find_bin "$OLD_BUILD")
NEW_BIN=$(find_bin "$NEW_BUILD")
if [ -z "$OLD_BIN" ] || [ -z "$NEW_BIN" ]; then
  say "no binary in $OLD_BUILD or $NEW_BUILD: run AB_PHASE=build (or all) first"
  exit 1
fi
OLD_SHA=$(source_sha1 "$OLD_TREE")
NEW_SHA=$(source_sha1 "$ROOT")
if [ "$PHASE" = run ]; then
  check_fresh old "$OLD_BUILD" "$OLD_SHA"
  check_fresh new "$NEW_BUILD" "$NEW_SHA"
fi
# Which sources each binary was built from, and the trees' now (they differ: a stale binary).
export AB_BUILDS
AB_BUILDS=$(printf '{"old": {"binary": "%s", "built_from_sources": "%s", "sources_now": "%s"}, "new": {"binary": "%s", "built_from_sources": "%s", "sources_now": "%s"}}' \
  "$OLD_BIN" "$(cat "$OLD_BUILD/.ab-source-sha1" 2>/dev/null)" "$OLD_SHA" \
  "$NEW_BIN" "$(cat "$NEW_BUILD/.ab-source-sha1" 2>/dev/null)" "$NEW_SHA")

phase_start=$SECONDS
WORK=$(mktemp -d)
MANIFEST="$WORK/manifest.tsv"
: >"$MANIFEST"
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[ -n "$DEVICE" ] || DEVICE=$(python3 -c 'import torch;print(torch.cuda.get_device_name())' 2>/dev/null)
export AB_DEVICE=${DEVICE:-unknown}
export AB_DATE
AB_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# shellcheck disable=SC2089  # the quotes are part of the recorded text
AB_COMMAND="scripts/redesign-ab.sh OUT $OLD_ARG (AB_ROUNDS=$ROUNDS AB_CELLS='${CELLS[*]}'; each run: timeout $RUN_TIMEOUT tandem bench --scenario S --mode M --batch-size B --steps $STEPS --warmup $WARMUP --workers $WORKERS --no-gpu-monitor --json FILE; old = $OLD_COMMIT built from $OLD_ARG, new = this tree, both cmake -G Ninja Release TANDEM_BUILD_TESTS=OFF, target tandem_cli; odd rounds old first, even rounds new first)"
# shellcheck disable=SC2090
export AB_COMMAND AB_OLD_COMMIT=$OLD_COMMIT AB_ROUNDS=$ROUNDS AB_MIN_RATIO=$MIN_RATIO AB_TIMEOUT=$RUN_TIMEOUT
export AB_CELL_LIST="${CELLS[*]}" AB_STOPPED=""
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
  echo "old: $OLD_BIN"; echo "new: $NEW_BIN"; } >>"$LOG" 2>&1
say "runs: ${#CELLS[@]} cells x 2 builds x $ROUNDS rounds, $STEPS timed + $WARMUP warm-up steps, $WORKERS workers, budget ${BUDGET} s from the start"

# The medians, ratios and redesign.json from the manifest (one line per run); with "final", the
# table too, and the exit status (see the header).
summarize() {
  python3 - "$MANIFEST" "$OUT/redesign.json" "${1:-}" <<'PY'
import json, os, statistics, sys

manifest, out_path, final = sys.argv[1], sys.argv[2], sys.argv[3] == "final"
env = os.environ
min_ratio = float(env["AB_MIN_RATIO"])


def tail(path, lines=12, chars=1500):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        return f"(no output: {e})"
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


runs, failed = {}, 0
with open(manifest) as f:
    for line in f:
        rnd, side, scenario, mode, bs, rc, json_path, out_path_run = line.rstrip("\n").split("\t")
        value, error, rc, losses = None, None, int(rc), None
        if rc == 0:
            try:
                with open(json_path) as jf:
                    r = json.load(jf)
                got = (r.get("scenario"), r.get("mode"), r.get("batch_size"))
                if got != (scenario, mode, int(bs)):
                    error = f"asked for {(scenario, mode, int(bs))}, the JSON says {got}"
                elif not r.get("steps_per_s") or r["steps_per_s"] <= 0:
                    error = f"steps_per_s is {r.get('steps_per_s')!r}"
                else:
                    value = float(r["steps_per_s"])
                    losses = (r.get("first_loss"), r.get("last_loss"))
            except (OSError, ValueError, KeyError, TypeError) as e:
                error = f"exit 0 but no result in {os.path.basename(json_path)}: {e}"
        elif rc in (124, 137):
            error = f"timed out after {env['AB_TIMEOUT']} s (exit {rc})"
        else:
            error = f"exit {rc}"
        if error:
            failed += 1
            error += "\n" + tail(out_path_run)
        runs.setdefault((scenario, int(bs), mode, side), []).append(
            {"round": int(rnd), "steps_per_s": value, "error": error, "losses": losses})

rows, missing, below = [], 0, 0
for cell in env["AB_CELL_LIST"].split():
    scenario, bs, mode = cell.split(":")
    bs = int(bs)
    row = {"scenario": scenario, "mode": mode, "batch_size": bs}
    errors, losses = [], {}
    for side in ("old", "new"):
        mine = sorted(runs.get((scenario, bs, mode, side), []), key=lambda x: x["round"])
        values = [x["steps_per_s"] for x in mine]
        good = [v for v in values if v is not None]
        row[f"{side}_steps_per_s"] = statistics.median(good) if good else None
        row[f"{side}_runs"] = values
        errors += [{"side": side, "round": x["round"], "error": x["error"]} for x in mine if x["error"]]
        losses[side] = {x["losses"] for x in mine if x["losses"]}
    o, n = row["old_steps_per_s"], row["new_steps_per_s"]
    row["ratio"] = round(n / o, 4) if o and n else None
    row["pass"] = row["ratio"] is not None and row["ratio"] >= min_ratio
    if row["ratio"] is None:
        missing += 1
    elif not row["pass"]:
        below += 1
    # The refactor should not change what is computed: every run's first and last loss, old
    # and new, the same (for the record; not part of PASS).
    row["same_losses"] = (len(losses["old"] | losses["new"]) == 1
                          if losses["old"] and losses["new"] else None)
    rows.append({k: row[k] for k in ("scenario", "mode", "batch_size", "old_steps_per_s",
                                     "new_steps_per_s", "ratio", "old_runs", "new_runs", "pass",
                                     "same_losses")} | ({"errors": errors} if errors else {}))

done_rounds = {r for v in runs.values() for r in (x["round"] for x in v)}
out = {"device": env["AB_DEVICE"], "date": env["AB_DATE"], "command": env["AB_COMMAND"],
       "old_commit": env["AB_OLD_COMMIT"], "rounds": int(env["AB_ROUNDS"]),
       "rounds_run": len(done_rounds), "min_ratio": min_ratio,
       "stopped": env.get("AB_STOPPED") or None, "builds": json.loads(env["AB_BUILDS"]),
       "rows": rows}
with open(out_path, "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
if not final:
    sys.exit(0)


def fmt(v, w, p):
    return f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"


print(f"\nredesign A/B on {out['device']}: new / old ({out['old_commit']}) steps/s, medians of "
      f"{out['rounds_run']} of {out['rounds']} round(s); PASS at ratio >= {min_ratio}")
print(f"{'scenario':<8} {'mode':<18} {'batch':>5} {'old steps/s':>11} {'new steps/s':>11} "
      f"{'ratio':>6}  {'verdict':<7} {'runs old/new':>12}  same losses")
for r in rows:
    verdict = "PASS" if r["pass"] else ("FAIL" if r["ratio"] is not None else "MISSING")
    counts = (f"{sum(v is not None for v in r['old_runs'])}/{len(r['old_runs'])} "
              f"{sum(v is not None for v in r['new_runs'])}/{len(r['new_runs'])}")
    print(f"{r['scenario']:<8} {r['mode']:<18} {r['batch_size']:>5} {fmt(r['old_steps_per_s'], 11, 2)} "
          f"{fmt(r['new_steps_per_s'], 11, 2)} {fmt(r['ratio'], 6, 3)}  {verdict:<7} {counts:>12}  "
          f"{ {True: 'yes', False: 'NO', None: '-'}[r['same_losses']]}")
for r in rows:
    for e in r.get("errors", []):
        first = e["error"].splitlines()[0]
        print(f"failed: {r['scenario']} {r['mode']} bs {r['batch_size']} {e['side']} round {e['round']}: {first}")
if out["stopped"]:
    print(f"stopped early: {out['stopped']}")
print(f"{sum(r['pass'] for r in rows)} of {len(rows)} cells PASS; {failed} failed run(s); "
      f"{missing} cell(s) without a ratio")
sys.exit(1 if failed or missing or out["stopped"] else 3 if below else 0)
PY
}

# budget_allows ROUND CELL: whether both runs of a cell can end inside the budget (a cell runs
# both sides or neither, so its medians stay paired); else says why in AB_STOPPED.
MAX_RUN_S=0
budget_allows() {
  local need=$((MAX_RUN_S > 15 ? MAX_RUN_S + 5 : 20))
  [ $(($(elapsed) + 2 * need)) -le "$BUDGET" ] && return 0
  AB_STOPPED="budget: ${BUDGET} s from the start; stopped at $(elapsed) s before round $1, cell $2 (the longest run took ${MAX_RUN_S} s)"
  return 1
}

# run_one ROUND SIDE BIN CELL: one run, one manifest line.
run_one() {
  local round=$1 side=$2 bin=$3 cell=$4 scenario bs mode tag start rc took row
  IFS=: read -r scenario bs mode <<<"$cell"
  tag="$side-$scenario-${mode//+/_}-$bs-r$round"
  start=$SECONDS
  timeout -k 10 "$RUN_TIMEOUT" "$bin" bench --scenario "$scenario" --mode "$mode" --batch-size "$bs" \
    --steps "$STEPS" --warmup "$WARMUP" --workers "$WORKERS" --no-gpu-monitor \
    --json "$WORK/$tag.json" >"$WORK/$tag.out" 2>&1
  rc=$?
  took=$((SECONDS - start))
  [ "$took" -gt "$MAX_RUN_S" ] && MAX_RUN_S=$took
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$side" "$scenario" "$mode" "$bs" "$rc" \
    "$WORK/$tag.json" "$WORK/$tag.out" >>"$MANIFEST"
  row=$(grep -E "^$scenario +[a-z]" "$WORK/$tag.out" | tail -1)
  if [ $rc -eq 0 ]; then
    log "round $round $side ${took}s: $row"
  else
    log "round $round $side $scenario $mode bs $bs: FAILED (exit $rc, ${took}s): $(tail -3 "$WORK/$tag.out" | tr '\n' ' ' | cut -c1-300)"
  fi
}

stopped=0
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then order=(old new); else order=(new old); fi
  say "round $round of $ROUNDS (${order[0]} first), $(elapsed) s elapsed"
  for cell in "${CELLS[@]}"; do
    budget_allows "$round" "$cell" || { stopped=1; break 2; }
    for side in "${order[@]}"; do
      if [ "$side" = old ]; then bin=$OLD_BIN; else bin=$NEW_BIN; fi
      run_one "$round" "$side" "$bin" "$cell"
    done
  done
  summarize
done
[ $stopped -eq 1 ] && say "STOPPED: $AB_STOPPED"
summarize final 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
tar -C "$WORK" -czf "$OUT/redesign-runs.tar.gz" . 2>/dev/null
rm -rf "$WORK"
say "phase run: $((SECONDS - phase_start)) s; total $(elapsed) s; wrote $OUT/redesign.json (exit $status)"
exit "$status"

"""What compare.py's comparisons share: reading a run's or a committed result's JSON, the mode
names (with the aliases of the names before the workload API), a row's label and median rate, and
the acceptance checks' list."""
import json
import statistics


def load(path):
    with open(path) as f:
        text = f.read()
    return json.loads(text) if text.strip() else []


def fmt(v, w, p=1):
    return f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"


# The tandem CLI's mode names before the workload API (commit d529f74), read as aliases: the
# new mode and the parameters it implies.
OLD_MODES = {("cls", "cpu_aug"): ("serial", {"augment": "cpu"}),
             ("cls", "gpu_aug"): ("serial", {}),
             ("mlp", "eager"): ("serial", {})}
# A workload parameter at its default is dropped from a row's params (absent means default).
PARAM_DEFAULTS = {"cls": {"augment": "gpu", "task": "random"}}
# The reference loops' modes (benchmarks/reference_loops.py) and the tandem runs they are compared
# with, as labels (see label()); a Python mode not listed here is compared with tandem's of its
# name.
PYTHON_TO_TANDEM = {("cls", "cpu_aug"): "serial augment=cpu",
                    ("cls", "gpu_aug"): "serial",
                    ("mlp", "eager"): "serial"}
MODE_ORDER = ["serial", "cpu_aug", "gpu_aug", "pipelined", "graphed", "pipelined+graphed",
              "graphed_k", "auto"]


def canonical(scenario, mode, params=None):
    """(mode, params) of a tandem run under the current names, defaults dropped."""
    new_mode, implied = OLD_MODES.get((scenario, mode), (mode, {}))
    merged = {**implied, **(params or {})}
    defaults = PARAM_DEFAULTS.get(scenario, {})
    return new_mode, {k: v for k, v in sorted(merged.items()) if defaults.get(k) != v}


def label(row):
    """What a row is compared by: its mode, then any non-default params ("serial augment=cpu")."""
    return " ".join([row["mode"]] + [f"{k}={v}" for k, v in sorted(row.get("params", {}).items())])


def tandem_row(r, **fields):
    """A tandem row (from a run's JSON, a sweep's or a committed result's rows) under the current
    mode names; params only where not all default."""
    mode, params = canonical(r["scenario"], r["mode"], r.get("params"))
    row = {"impl": "tandem", "scenario": r["scenario"], "mode": mode}
    if params:
        row["params"] = params
    row.update(fields)
    if row.get("picked"):  # auto's pick, by its current name too
        picked, picked_params = canonical(r["scenario"], row["picked"])
        row["picked"] = label({"mode": picked, "params": picked_params})
    return row


def mode_rank(name):
    first = name.split(" ")[0]
    return (MODE_ORDER.index(first) if first in MODE_ORDER else len(MODE_ORDER), name)


def steps_per_s(rows, impl, scenario, mode, bs):
    """The median rate of the rows with these keys (one per round), or None; `mode` is a label
    (a mode and any non-default params, see label())."""
    rates = [r["steps_per_s"] for r in rows
             if (r["impl"], r["scenario"], label(r), r["batch_size"]) == (impl, scenario, mode, bs)
             and r.get("steps_per_s") is not None]
    return statistics.median(rates) if rates else None


def is_result(data):
    """A committed result (or a sweep's JSON): an object with rows, not one run or a list."""
    return isinstance(data, dict) and isinstance(data.get("rows"), list)


def load_all(paths):
    """The rows of several reference_loops.py --json outputs (rounds), concatenated; a committed
    result contributes its Python rows, as records of reference_loops.py's form."""
    rows = []
    for path in paths or []:
        data = load(path)
        if is_result(data):
            for r in data["rows"]:
                if r.get("impl") != "python":
                    continue
                rec = {"exp": r["scenario"], "mode": r["mode"], "bs": r["batch_size"],
                       "steps_s": r["steps_per_s"]}
                if "ms_per_step" in r:
                    rec["ms_per_step"] = r["ms_per_step"]
                rows.append(rec)
        else:
            rows += data
    return rows


def load_floors(path, scenario):
    """reference_loops.py floor's records, or a committed result's floors (already in the output's
    form, returned as such in the second list)."""
    data = load(path)
    if is_result(data):
        return [], [f for f in data.get("floors", []) if f.get("scenario") == scenario]
    return data, []


class Checks:
    def __init__(self):
        self.items = []

    def at_least(self, name, value, target):
        ok = value is not None and target is not None and value >= target
        self.items.append({"check": name, "value": value, "target": target, "pass": ok})

    def print(self):
        for c in self.items:
            v = f"{c['value']:.2f}" if c["value"] is not None else "-"
            t = f"{c['target']:.2f}" if c["target"] is not None else "-"
            print(f"{'PASS' if c['pass'] else 'MISS'}  {c['check']}: {v} vs {t}")


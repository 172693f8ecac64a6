"""Every front end that reads a data folder, over one corpus of bad and unusual inputs
(bad_data_corpus.py): what each makes of each input is the one table below, which
docs/bad-data.md shows too (test_the_docs_show_this_table keeps them equal).

Each run is a subprocess under a timeout, so a hang fails its cell instead of stopping the suite:
the CLI's (`tandem train`, `data-bench`, `shrink`, `bench`, `sweep`; TANDEM_CLI, default
<repo>/build/tandem) in a small thread pool, and the Python package's (tandem.data.Loader over
tandem.data.ImageFolder / ImageMaskPairs, tandem.Trainer.fit) one after another in a worker
process that is started again past a case that hangs or kills it. A new subcommand that reads
--data, or a new input in the corpus, fails test_every_front_end_and_input_is_in_the_table
until it has its row or column here. Cells tandem does not meet yet are in KNOWN_BAD (expected
failures, strict). Settings: TANDEM_CORPUS_TIMEOUT (seconds a run may take, 40),
TANDEM_CORPUS_JOBS (CLI runs at once), TANDEM_CORPUS_OBSERVED=FILE (write the outcomes seen in
the table's layout).

Outcomes, each without and with skip-bad (`--skip-bad`, `skip_bad=True`):
    ok       runs, and nothing it prints names the input
    warn     runs, and a warning or note names the input
    skipped  runs, and the list of what skip-bad left out names the input
    error    the run fails naming the input: the CLI exits 1 with one line `tandem: error: ...`
             (no traceback), Python raises RuntimeError
    refused  nothing runs: the CLI exits 2 naming the input, Python raises ValueError
    n/a      the front end has no reader for such a folder (image + mask pairs: train and the
             Python package only); not run
"""
import json
import os
import queue
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DOCS = os.path.join(REPO, "docs", "bad-data.md")

# Rows: the corpus's inputs. Columns: the front ends. A cell is "without/with skip-bad", or one
# outcome for both.
TABLE = """
input                  train          data-bench     shrink         bench          sweep          loader         fit
fifo                   error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped
socket                 error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped
dangling_symlink       error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped
symlink_loop_file      error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped
symlink_loop_folder    warn           warn           warn           warn           warn           warn           warn
folder_named_jpg       ok             ok             ok             ok             ok             ok             ok
empty_jpg              error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped
text_as_jpg            error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped
truncated_baseline     error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped
truncated_progressive  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped  error/skipped
huge_20000             ok             warn           ok             ok             ok             ok             ok
cmyk_jpeg              ok             ok             ok             ok             ok             ok             ok
gray_jpeg              ok             ok             ok             ok             ok             ok             ok
progressive_jpeg       ok             ok             ok             ok             ok             ok             ok
png16_gray             ok             ok             ok             ok             ok             ok             ok
png16_rgb              ok             ok             ok             ok             ok             ok             ok
palette_alpha_png      ok             ok             ok             ok             ok             ok             ok
png_named_jpg          ok             ok             ok             ok             ok             ok             ok
exif_rotated           ok             ok             ok             ok             ok             ok             ok
uppercase_ext          ok             ok             ok             ok             ok             ok             ok
webp_file              warn           warn           warn           warn           warn           warn           warn
empty_class            refused        refused        refused        refused        refused        refused        refused
single_image_batch_64  refused        ok             ok             refused        refused        refused        refused
mask_other_size        error/skipped  n/a            n/a            n/a            n/a            error/skipped  error/skipped
mask_rgb               error/skipped  n/a            n/a            n/a            n/a            error/skipped  error/skipped
mask_missing           refused        n/a            n/a            n/a            n/a            refused        refused
pairs_folder           ok             refused        refused        refused        refused        ok             ok
"""

CLI_FRONT_ENDS = ("train", "data-bench", "shrink", "bench", "sweep")
PY_FRONT_ENDS = ("loader", "fit")
OUTCOMES = ("ok", "warn", "skipped", "error", "refused", "n/a")


def _parse(table: str) -> Tuple[List[str], Dict[str, Dict[str, Tuple[str, str]]]]:
    lines = [line.split() for line in table.strip().splitlines()]
    columns = lines[0][1:]
    rows = {}
    for cells in lines[1:]:
        assert len(cells) == len(columns) + 1, f"row {cells[0]}: {len(cells) - 1} cells"
        row = {}
        for column, cell in zip(columns, cells[1:]):
            plain, _, skip = cell.partition("/") if cell != "n/a" else (cell, "", cell)
            row[column] = (plain, skip or plain)
        rows[cells[0]] = row
    return columns, rows


COLUMNS, EXPECTED = _parse(TABLE)

# Cells where tandem does not yet do what the table says (docs/bad-data.md marks them with a
# dagger): each runs as an expected failure that must fail (strict), so the day one is mended
# the test says to take it off this list and its mark off the docs. Key: (input, front end,
# skip_bad). None today.
def _known_bad() -> Dict[Tuple[str, str, bool], str]:
    return {}


KNOWN_BAD = _known_bad()

CELLS = [(i, fe, skip) for i, row in EXPECTED.items() for fe in COLUMNS
         for skip, outcome in zip((False, True), row[fe]) if outcome != "n/a"]

TIMEOUT = float(os.environ.get("TANDEM_CORPUS_TIMEOUT", "40"))  # seconds a run may take
IMAGE_SIZE = 32


def _cli() -> Optional[str]:
    path = os.environ.get("TANDEM_CLI") or os.path.join(REPO, "build", "tandem")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_DEBUG"}  # one-line errors
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # this tandem, this torch
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# ---------------------------------------------------------------------------------------------
# What a run did

@dataclass
class Run:
    outcome: str          # one of OUTCOMES but n/a, or "hang" / "crash"
    what: str             # the command, or the Python call
    output: str = ""      # stdout + stderr (the CLI), or stderr and the exception (Python)
    named: bool = False   # the message the outcome stands on names the input
    problems: List[str] = field(default_factory=list)  # a traceback, more than one error line


def _skip_context(lines: List[str], i: int) -> bool:
    """Whether line i (which names the input) lists it as left out by skip-bad: it or the
    unindented line heading its block says so; a warning or note never does, unless it is
    skip-bad's own."""
    line = lines[i]
    if line.lstrip().lower().startswith(("warning:", "note:")) and "skip-bad" not in line:
        return False
    head = i
    while head > 0 and lines[head].startswith(" "):
        head -= 1
    text = line + "\n" + lines[head]
    return bool(re.search(r"skip|bad[^\n]*left out", text, re.IGNORECASE))


def classify_cli(rc: Optional[int], output: str, token: str, what: str) -> Run:
    if rc is None:
        return Run("hang", what, output)
    lines = output.splitlines()
    errors = [line for line in lines if line.startswith("tandem: error:")]
    problems = []
    if re.search(r"Traceback|terminate called|Segmentation fault|Aborted|core dumped", output):
        problems.append("a traceback or abort in the output")
    if rc in (1, 2):
        if len(errors) != 1:
            problems.append(f"{len(errors)} 'tandem: error:' lines, expected one")
        return Run("error" if rc == 1 else "refused", what, output,
                   any(token in e for e in errors), problems)
    if rc != 0:
        return Run("crash", what, output, problems=problems + [f"exit status {rc}"])
    named = [i for i, line in enumerate(lines) if token in line]
    if any(_skip_context(lines, i) for i in named):
        return Run("skipped", what, output, True, problems)
    return Run("warn" if named else "ok", what, output, bool(named), problems)


# ---------------------------------------------------------------------------------------------
# The CLI

def cli_command(cli: str, front_end: str, case, skip_bad: bool, out: str) -> List[str]:
    data, b = case.root, str(case.batch_size)
    common = ["--device", "cpu", "--workers", "1"]
    if front_end == "train":
        cmd = ["train", "--data", data, "--out", out, "--epochs", "1", "--image-size",
               str(IMAGE_SIZE), "--batch-size", b, "--quiet"] + common
        cmd += ["--classes", "2"] if case.pairs else []
    elif front_end == "data-bench":  # --steps 0: the decode and loader rows, no model
        cmd = ["data-bench", "--data", data, "--images", "8", "--loader-images", "8", "--decode",
               "cpu", "--steps", "0", "--batch-size", b] + common
    elif front_end == "shrink":
        cmd = ["shrink", "--data", data, "--out", out, "--image-size", str(IMAGE_SIZE),
               "--quiet", "--workers", "1"]
    elif front_end in ("bench", "sweep"):  # workload images: ImageFolderDataset in the Runner
        cmd = [front_end, "--workload", "images", "--data", data, "--decode", "cpu", "--steps",
               "1", "--warmup", "0", "--param", "model=r18_full", "--param",
               f"size={IMAGE_SIZE}"] + common
        cmd += ["--batch-size", b] if front_end == "bench" else ["--batch-sizes", b, "--modes",
                                                                 "serial"]
    else:
        raise ValueError(front_end)
    return [cli] + cmd + (["--skip-bad"] if skip_bad else [])


def run_cli(cli: str, front_end: str, case, skip_bad: bool, out: str,
            timeout: float = TIMEOUT) -> Run:
    cmd = cli_command(cli, front_end, case, skip_bad, out)
    what = " ".join(cmd)
    try:
        r = subprocess.run(cmd, env=_env(), cwd=os.path.dirname(out), capture_output=True,
                           text=True, errors="replace", timeout=timeout)
        rc, output = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                         for x in (e.stdout, e.stderr))
        output += f"\n[no exit after {timeout:.0f} s]"
    return classify_cli(rc, output.replace(case.root, "<root>"), case.token, what)


# ---------------------------------------------------------------------------------------------
# The Python package, in a worker process (python test_bad_data_corpus.py --worker DIR)

_MARK = "@@corpus "


def _worker(err_dir: str):
    """Reads cases (JSON lines) from stdin; for each, says it starts, runs it with fd 2 in a file
    of its own, and prints what it raised and skipped."""
    import torch
    from torch import nn

    import tandem

    def model(dense: bool) -> nn.Module:
        torch.manual_seed(0)
        layers = [nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)]
        return nn.Sequential(*(layers if dense else layers + [nn.AdaptiveAvgPool2d(1),
                                                               nn.Flatten()]))

    for line in sys.stdin:
        case = json.loads(line)
        print(_MARK + json.dumps({"start": case["key"]}), flush=True)
        err = os.open(os.path.join(err_dir, case["key"] + ".err"),
                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        saved = os.dup(2)
        os.dup2(err, 2)
        result = {"done": case["key"], "exception": None, "message": "", "skipped": []}
        try:
            if case["pairs"]:
                ds = tandem.data.ImageMaskPairs(case["root"], classes=2, image_size=IMAGE_SIZE)
            else:
                ds = tandem.data.ImageFolder(case["root"], image_size=IMAGE_SIZE)
            if case["front_end"] == "loader":
                loader = tandem.data.Loader(ds, batch_size=case["batch_size"], workers=1,
                                            skip_bad=case["skip_bad"])
                for _ in loader:
                    pass
                result["skipped"] = [reason for _, reason in loader.skipped()]
            else:
                m = model(case["pairs"])
                trainer = tandem.Trainer(
                    m, nn.CrossEntropyLoss(ignore_index=255),
                    torch.optim.SGD(m.parameters(), lr=0.1), ds,
                    feed=[lambda x: x.float() / 255], batch_size=case["batch_size"], workers=1,
                    skip_bad=case["skip_bad"], device="cpu", mode="serial")
                report = trainer.fit(epochs=1, progress=False).report
                result["skipped"] = [s["reason"] for s in report.get("skipped", [])]
        except Exception as e:  # noqa: BLE001 -- what it raised is the outcome
            import traceback
            result["exception"] = type(e).__name__
            result["is"] = ("ValueError" if isinstance(e, ValueError) else
                            "RuntimeError" if isinstance(e, RuntimeError) else "other")
            result["message"] = str(e)
            result["traceback"] = traceback.format_exc()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            os.close(err)
        print(_MARK + json.dumps(result), flush=True)


def _py_what(case, front_end: str, skip_bad: bool) -> str:
    data = (f"tandem.data.ImageMaskPairs({case.root!r}, classes=2)" if case.pairs
            else f"tandem.data.ImageFolder({case.root!r})")
    args = f"batch_size={case.batch_size}, skip_bad={skip_bad}"
    if front_end == "loader":
        return f"list(tandem.data.Loader({data}, {args}))"
    return f"tandem.Trainer(..., {data}, {args}).fit(epochs=1)"


def classify_py(result: dict, stderr: str, token: str, what: str) -> Run:
    exc = result.get("exception")
    if exc:
        output = f"{stderr}{exc}: {result['message']}"
        kind = result.get("is")
        if kind not in ("ValueError", "RuntimeError"):
            return Run("crash", what, output + "\n" + result.get("traceback", ""))
        problems = [] if "\n" not in result["message"].strip() else ["a message of many lines"]
        return Run("refused" if kind == "ValueError" else "error", what, output,
                   token in result["message"], problems)
    if any(token in reason for reason in result["skipped"]):
        return Run("skipped", what, stderr + "skipped: " + "; ".join(result["skipped"]), True)
    named = token in stderr
    return Run("warn" if named else "ok", what, stderr, named)


def run_python(cases: dict, cells: List[Tuple[str, str, bool]], work: str) -> Dict[tuple, Run]:
    """Runs the Python cells in worker processes; a worker that hangs (TIMEOUT) or dies is
    replaced and the cells after it go on."""
    err_dir = os.path.join(work, "py-stderr")
    os.makedirs(err_dir, exist_ok=True)
    todo = {f"{i}--{fe}--{int(skip)}": (i, fe, skip) for i, fe, skip in cells}
    results: Dict[tuple, Run] = {}

    def stderr_of(key):
        path = os.path.join(err_dir, key + ".err")
        text = open(path, errors="replace").read() if os.path.exists(path) else ""
        return text

    while todo:
        worker_err = open(os.path.join(work, "py-worker.err"), "w+")  # outside the cases
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", err_dir],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=worker_err,
                                text=True, env=_env(), cwd=work)
        lines: "queue.Queue[Optional[str]]" = queue.Queue()

        def pump():
            for line in proc.stdout:
                if line.startswith(_MARK):
                    lines.put(line[len(_MARK):])
            lines.put(None)
        threading.Thread(target=pump, daemon=True).start()
        for key, (i, fe, skip) in todo.items():
            case = cases[i]
            proc.stdin.write(json.dumps({"key": key, "root": case.root, "pairs": case.pairs,
                                         "batch_size": case.batch_size, "front_end": fe,
                                         "skip_bad": skip}) + "\n")
        proc.stdin.close()
        current, started = None, False
        while True:
            try:
                line = lines.get(timeout=TIMEOUT + (0 if started else 60))  # + the imports
            except queue.Empty:
                line = "timeout"
            if line is None or line == "timeout":
                if line == "timeout":
                    proc.kill()
                proc.wait()
                if current is not None:  # the cell it was running: hung or killed it
                    i, fe, skip = todo.pop(current)
                    tail = stderr_of(current).replace(cases[i].root, "<root>")
                    outcome = "hang" if line == "timeout" else "crash"
                    note = (f"[no answer after {TIMEOUT:.0f} s]" if line == "timeout"
                            else f"[the worker died: exit status {proc.returncode}]")
                    results[(i, fe, skip)] = Run(outcome, _py_what(cases[i], fe, skip),
                                                 tail + note)
                elif not todo or line == "timeout" or proc.returncode != 0:
                    worker_err.seek(0)
                    said = worker_err.read()[-2000:]
                    for key, (i, fe, skip) in list(todo.items()):  # it never started one
                        results[(i, fe, skip)] = Run("crash", _py_what(cases[i], fe, skip),
                                                     f"{said}[the worker did not start: exit "
                                                     f"status {proc.returncode}]")
                        todo.pop(key)
                worker_err.close()
                break
            message = json.loads(line)
            started = True
            if "start" in message:
                current = message["start"]
                continue
            key = message["done"]
            i, fe, skip = todo.pop(key)
            current = None
            case = cases[i]
            stderr = stderr_of(key).replace(case.root, "<root>")
            message["message"] = message["message"].replace(case.root, "<root>")
            message["skipped"] = [s.replace(case.root, "<root>") for s in message["skipped"]]
            results[(i, fe, skip)] = classify_py(message, stderr, case.token,
                                                 _py_what(case, fe, skip))
    return results


# ---------------------------------------------------------------------------------------------
# Running the table

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import bad_data_corpus
    return bad_data_corpus.build_corpus(str(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="module")
def outcomes(request, corpus, tmp_path_factory) -> Dict[tuple, Run]:
    """Every selected cell's run, the CLI's in a pool beside the Python worker."""
    selected = {tuple(item.callspec.params[k] for k in ("input", "front_end", "skip_bad"))
                for item in request.session.items
                if item.module is sys.modules[__name__] and hasattr(item, "callspec")
                and "front_end" in item.callspec.params}
    work = str(tmp_path_factory.mktemp("runs"))
    cli = _cli()
    cli_cells = [c for c in CELLS if c in selected and c[1] in CLI_FRONT_ENDS and cli]
    py_cells = [c for c in CELLS if c in selected and c[1] in PY_FRONT_ENDS]
    # The slowest first (the 20000 x 20000 photo), so the pool ends together.
    cli_cells.sort(key=lambda c: c[0] != "huge_20000")
    results: Dict[tuple, Run] = {}
    failed: List[BaseException] = []

    def python_cells():
        try:
            results.update(run_python(corpus, py_cells, work))
        except BaseException as e:  # raised below, in the test's thread
            failed.append(e)
    py_thread = threading.Thread(target=python_cells)
    py_thread.start()

    def one(n_cell):
        n, (i, fe, skip) = n_cell
        out = os.path.join(work, "out", str(n))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        return (i, fe, skip), run_cli(cli, fe, corpus[i], skip, out)

    with ThreadPoolExecutor(int(os.environ.get("TANDEM_CORPUS_JOBS", "0")) or
                            max(2, min(4, os.cpu_count() or 2))) as pool:
        for key, run in pool.map(one, enumerate(cli_cells)):
            results[key] = run
    py_thread.join()
    if failed:
        raise failed[0]
    if os.environ.get("TANDEM_CORPUS_OBSERVED"):  # what ran, in TABLE's layout
        with open(os.environ["TANDEM_CORPUS_OBSERVED"], "w") as f:
            f.write(observed_table(results))
    return results


def observed_table(results: Dict[tuple, Run]) -> str:
    """The outcomes seen, in TABLE's layout ("?" for a cell not run)."""
    width = max(map(len, EXPECTED)) + 2
    lines = ["input".ljust(width) + "".join(c.ljust(15) for c in COLUMNS)]
    for i, row in EXPECTED.items():
        cells = []
        for fe in COLUMNS:
            seen = [results[(i, fe, s)].outcome if (i, fe, s) in results else
                    ("n/a" if row[fe][int(s)] == "n/a" else "?") for s in (False, True)]
            cells.append((seen[0] if seen[0] == seen[1] else "/".join(seen)).ljust(15))
        lines.append(i.ljust(width) + "".join(cells))
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _ids(cell):
    i, fe, skip = cell
    return f"{i}-{fe}-{'skip_bad' if skip else 'plain'}"


NO_CLI = ("no tandem CLI at $TANDEM_CLI or <repo>/build/tandem: build it (scripts/build.sh) or "
          "set TANDEM_CLI to its path")


@pytest.mark.parametrize("input,front_end,skip_bad", [
    pytest.param(*c, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BAD[c]))
    if c in KNOWN_BAD else c for c in CELLS], ids=[_ids(c) for c in CELLS])
def test_cell(outcomes, corpus, input, front_end, skip_bad):
    if front_end in CLI_FRONT_ENDS and _cli() is None:
        pytest.skip(NO_CLI)
    expected = EXPECTED[input][front_end][int(skip_bad)]
    run = outcomes[(input, front_end, skip_bad)]
    token = corpus[input].token
    said = f"{run.what}\n--- gave ---\n{run.output.strip()[-3000:]}"
    assert run.outcome == expected, f"expected {expected}, got {run.outcome}: {said}"
    if expected != "ok":
        assert run.named, f"{expected}, but no message names {token!r}: {said}"
    assert not run.problems, f"{', '.join(run.problems)}: {said}"


# ---------------------------------------------------------------------------------------------
# The table covers every front end and input, and the docs show it

def _subcommands_reading_data(cli: str) -> List[str]:
    text = subprocess.run([cli, "--help"], capture_output=True, text=True, env=_env(),
                          timeout=60).stdout
    names = re.findall(r"^  (\S+)\s", text.split("Subcommands:", 1)[1], re.MULTILINE)
    reading = []
    for name in names:
        sub = subprocess.run([cli, name, "--help"], capture_output=True, text=True, env=_env(),
                             timeout=60).stdout
        if re.search(r"^\s+--data\b", sub, re.MULTILINE):
            reading.append(name)
    return reading


def test_every_front_end_and_input_is_in_the_table():
    import bad_data_corpus
    assert tuple(COLUMNS) == CLI_FRONT_ENDS + PY_FRONT_ENDS
    missing = set(bad_data_corpus.INPUTS) - set(EXPECTED)
    assert not missing, f"corpus inputs without a row in TABLE: {sorted(missing)}"
    extra = set(EXPECTED) - set(bad_data_corpus.INPUTS)
    assert not extra, f"TABLE rows the corpus does not make: {sorted(extra)}"
    for row in EXPECTED.values():
        for cell in row.values():
            assert set(cell) <= set(OUTCOMES), cell
    cli = _cli()
    if cli is None:
        pytest.skip(NO_CLI)
    missing = set(_subcommands_reading_data(cli)) - set(CLI_FRONT_ENDS)
    assert not missing, (f"tandem subcommands that read --data but have no column here: "
                         f"{sorted(missing)}: add each to TABLE and cli_command")


def _docs_table() -> Tuple[List[str], Dict[str, Dict[str, Tuple[str, str, bool]]]]:
    """docs/bad-data.md's table: {input id: {column: (plain, skip_bad, marked)}}; a row's input
    id is the `code` in its first cell, a cell "error / skipped" or one outcome, a † marking a
    cell tandem does not yet meet."""
    lines = open(DOCS).read().splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("| input"))
    doc_columns = [c.strip().strip("`") for c in lines[start].strip().strip("|").split("|")][1:]
    rows = {}
    for line in lines[start + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        m = re.match(r"\|[^|]*`([a-z0-9_]+)`[^|]*\|(.*)\|\s*$", line)
        assert m, f"docs/bad-data.md: a row without its input's `id`: {line}"
        cells = [c.strip() for c in m.group(2).split("|")]
        row = {}
        for column, cell in zip(doc_columns, cells):
            marked = "†" in cell
            cell = cell.replace("†", "").strip()
            words = [cell] if cell == "n/a" else [w.strip() for w in cell.split("/")]
            row[column] = (words[0], words[-1], marked)
        rows[m.group(1)] = row
    return doc_columns, rows


DOC_COLUMN = {"train": "train", "data-bench": "data-bench", "shrink": "shrink", "bench": "bench",
              "sweep": "sweep", "loader": "Loader", "fit": "Trainer.fit"}


def test_the_docs_show_this_table():
    if not os.path.exists(DOCS):
        pytest.skip(f"{DOCS} is not here (tests run outside the checkout)")
    doc_columns, rows = _docs_table()
    assert doc_columns == [DOC_COLUMN[c] for c in COLUMNS]
    assert list(rows) == list(EXPECTED), "docs/bad-data.md's rows differ from TABLE's"
    for i, row in EXPECTED.items():
        for column, (plain, skip) in row.items():
            got = rows[i][DOC_COLUMN[column]]
            assert got[:2] == (plain, skip), f"{i} / {column}: docs {got[:2]}, TABLE's " \
                                             f"{(plain, skip)}"
            known = any((i, column, s) in KNOWN_BAD for s in (False, True))
            assert got[2] == known, (f"{i} / {column}: the docs' † (not yet met) should be "
                                     f"{'there' if known else 'gone'}")


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker(sys.argv[2])

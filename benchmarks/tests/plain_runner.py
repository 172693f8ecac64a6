"""Runs a test module's test_* functions without pytest (CI's system python3 has none): each in
turn, a fresh temporary folder for those taking ``tmp_path``, a line per test, the failures'
tracebacks; exit status 1 when any failed."""
import inspect
import shutil
import tempfile
import traceback
from pathlib import Path


def run_tests(namespace: dict, prefix: str) -> int:
    failed = 0
    for name, fn in list(namespace.items()):
        if not (name.startswith("test_") and callable(fn)):
            continue
        args = {}
        if "tmp_path" in inspect.signature(fn).parameters:
            args["tmp_path"] = Path(tempfile.mkdtemp(prefix=prefix))
        try:
            fn(**args)
            print(f"ok    {name}")
        except Exception:
            failed += 1
            print(f"FAIL  {name}")
            traceback.print_exc()
        finally:
            if "tmp_path" in args:
                shutil.rmtree(args["tmp_path"], ignore_errors=True)
    print(f"{failed} failed" if failed else "all passed")
    return 1 if failed else 0

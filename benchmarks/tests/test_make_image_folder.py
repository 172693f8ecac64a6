"""scripts/make_image_folder.py on a Python without its needs: one line naming what is missing
and the pip command for the Python that ran it, exit status 1, no traceback."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_image_folder.py"

# The script run as __main__ with `module` made unimportable (None in sys.modules).
WITHOUT = ("import runpy, sys; sys.modules[{module!r}] = None; sys.argv = ['make_image_folder.py', "
           "{out!r}]; runpy.run_path({script!r}, run_name='__main__')")


def test_a_missing_package_is_named_with_the_command_that_installs_it(tmp_path):
    for module in ("PIL", "numpy"):
        code = WITHOUT.format(module=module, out=str(tmp_path / "out"), script=str(SCRIPT))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1, (module, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("make_image_folder.py: "), r.stderr
        assert f"{sys.executable} -m pip install numpy pillow" in lines[0], lines[0]
        # The blocked module, or one this Python lacks before it (numpy, on a bare python3).
        assert f"import of {module} halted" in lines[0] or "No module named" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()  # nothing written


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from plain_runner import run_tests  # noqa: E402
    sys.exit(run_tests(globals(), "make-image-folder-test-"))

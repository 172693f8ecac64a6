"""Wheel metadata from the torch the package is built against (a scikit-build-core metadata
provider, pyproject.toml). tandem._C links that torch's C++ libraries, whose ABI changes between
minor versions, so a wheel is for one torch minor: its version carries it (0.1.0+torch2.11) and
it requires torch>=2.11,<2.12. Build without isolation so the torch you run is the one seen."""
import re


def _torch_minor():
    try:
        import torch
    except ImportError as e:
        raise RuntimeError("tandem's Python package is built against the installed torch: "
                           "install torch first, then pip install --no-build-isolation") from e
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    if not m:
        raise RuntimeError(f"cannot read torch's version {torch.__version__!r}")
    return int(m.group(1)), int(m.group(2))


def dynamic_metadata(field, settings=None):
    major, minor = _torch_minor()
    if field == "version":
        base = (settings or {}).get("base")
        if not base:
            raise RuntimeError("torch_pin: set base = \"X.Y.Z\" for the version")
        return f"{base}+torch{major}.{minor}"
    if field == "dependencies":
        return [f"torch>={major}.{minor},<{major}.{minor + 1}"]
    raise RuntimeError(f"torch_pin provides version and dependencies, not {field}")

"""What every test of the package shares: mode auto's kept decisions (tandem/_mode_cache.py) go
to a folder of the test's own, so no test reads a decision another test (or the user's own
runs) kept, and none writes into the user's cache."""
import pytest


@pytest.fixture(autouse=True)
def own_mode_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("TANDEM_MODE_CACHE", str(tmp_path_factory.mktemp("modes")))

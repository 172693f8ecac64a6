"""How the extension was built: one C++ runtime in the process, LibTorch's libstdc++.so.6."""
import os
import shutil
import subprocess

import pytest

import tandem

RUNTIME_SYMBOLS = {"_Znwm", "_ZdlPv", "_ZdlPvm", "__cxa_throw", "__cxa_allocate_exception"}


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_extension_carries_no_copy_of_the_cxx_runtime():
    # A copy of libstdc++.a linked into tandem._C (or libtandem) made the first C++ exception
    # crash beside torch's runtime (cmake/TandemCxxRuntime.cmake).
    extension = tandem._C.__file__
    libraries = [extension]
    with open(f"/proc/{os.getpid()}/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/libtandem" in path and path not in libraries:
                libraries.append(path)
    for library in libraries:
        nm = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True,
                            text=True, check=True)
        defined = {fields[-1] for fields in map(str.split, nm.stdout.splitlines()) if fields}
        assert not (defined & RUNTIME_SYMBOLS), f"{library} defines {sorted(defined & RUNTIME_SYMBOLS)}"
    assert len(libraries) >= 2, f"libtandem was not found among the loaded libraries: {libraries}"

# Sourced by the README's commands: runs the bootstrap (quick when already done) and exports
# TANDEM_TORCH_PREFIX (LibTorch's CMake prefix) and TANDEM_CMAKE (a CMake new enough for it).
_tandem_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TANDEM_TORCH_PREFIX=$(bash "$_tandem_root/scripts/bootstrap.sh" | tail -n 1) || return 1
_tandem_venv=${TANDEM_VENV:-$HOME/.cache/tandem/venv-torch2.11.0}
if [ -x "$_tandem_venv/bin/cmake" ]; then TANDEM_CMAKE="$_tandem_venv/bin/cmake"; else TANDEM_CMAKE=cmake; fi
# The Python whose torch the build uses: the venv's, or the system's (bootstrap's choice).
if [ -x "$_tandem_venv/bin/python" ] && [ "$TANDEM_CMAKE" != cmake ]; then
  TANDEM_PYTHON="$_tandem_venv/bin/python"
else
  TANDEM_PYTHON=python3
fi
export TANDEM_TORCH_PREFIX TANDEM_CMAKE TANDEM_PYTHON

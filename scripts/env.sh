# Sourced by the README's commands: runs the bootstrap (quick when already done) and exports what
# it chose: TANDEM_PYTHON (the Python whose torch the build links, the venv's or the system's),
# TANDEM_CMAKE (a CMake new enough for LibTorch) and TANDEM_TORCH_PREFIX (LibTorch's CMake prefix).
# A script that sourced it already (run.sh, then build.sh) passes its choice on: the bootstrap
# runs once per command, for this checkout and this HOME.
_tandem_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "${TANDEM_ENV_CHOSEN:-}" = "$_tandem_root:$HOME" ] && [ -x "${TANDEM_PYTHON:-}" ] &&
   [ -n "${TANDEM_CMAKE:-}" ] && [ -n "${TANDEM_TORCH_PREFIX:-}" ]; then
  unset _tandem_root
  return 0
fi
_tandem_choice=$(bash "$_tandem_root/scripts/bootstrap.sh") || return 1
TANDEM_PYTHON=$(sed -n 's/^python=//p' <<<"$_tandem_choice" | tail -n 1)
TANDEM_CMAKE=$(sed -n 's/^cmake=//p' <<<"$_tandem_choice" | tail -n 1)
TANDEM_TORCH_PREFIX=$(sed -n 's/^prefix=//p' <<<"$_tandem_choice" | tail -n 1)
if [ -z "$TANDEM_PYTHON" ] || [ -z "$TANDEM_TORCH_PREFIX" ]; then
  echo "[env] the bootstrap chose no Python with torch (it printed: $_tandem_choice)" >&2
  return 1
fi
TANDEM_ENV_CHOSEN="$_tandem_root:$HOME"
export TANDEM_TORCH_PREFIX TANDEM_CMAKE TANDEM_PYTHON TANDEM_ENV_CHOSEN
unset _tandem_root _tandem_choice

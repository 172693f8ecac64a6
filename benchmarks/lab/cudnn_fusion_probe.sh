#!/usr/bin/env bash
# Builds and runs the cuDNN fusion probe (benchmarks/lab/cudnn_fusion_probe/): which convolution +
# batch-norm fusions cuDNN supports for ResNet-50's shapes in bf16 channels-last, and what they cost next
# to the plain convolutions.
#
#   bash benchmarks/lab/cudnn_fusion_probe.sh build OUTDIR   compile on a machine with the CUDA toolkit and
#                                                            the project venv (no GPU needed) into
#                                                            .ref/probe/cudnn_fusion_probe; log and
#                                                            object files in OUTDIR
#   bash benchmarks/lab/cudnn_fusion_probe.sh run OUTDIR     run it on the GPU machine (python3 there has
#                                                            torch 2.11): OUTDIR/cudnn-fusion-probe.json
#                                                            and OUTDIR/cudnn-fusion-probe.txt
#
# The build takes the cuDNN frontend's headers from .ref/cudnn-frontend/include, fetching them there
# first if missing (the include/ folder of the nvidia-cudnn-frontend wheel, pip download, pinned). The binary links cuDNN 9 dynamically and the CUDA runtime statically; at
# run time it takes the cuDNN that torch's wheel bundles, found through python3, so the numbers are for
# the same cuDNN the training runs use. cuDNN's run-time compiled engines also need NVRTC, which torch's
# wheel bundles too.
#
# Environment: TANDEM_VENV (build: the venv with the cuDNN headers; default ~/.cache/tandem/venv-torch2.11.0),
# CXX (default g++), CUDA_HOME (default /usr/local/cuda), PROBE_ARGS (run: extra probe options, for
# example "--max-plans 4 --only ABH"), PROBE_TIMEOUT_S (run: default 240).
set -euo pipefail

usage() {
    echo "usage: bash benchmarks/lab/cudnn_fusion_probe.sh build|run OUTDIR" >&2
    exit 2
}

[[ $# -eq 2 ]] || usage
mode=$1
outdir=$2
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
src_dir=$repo/benchmarks/lab/cudnn_fusion_probe
bin=$repo/.ref/probe/cudnn_fusion_probe
fe_include=$repo/.ref/cudnn-frontend/include
frontend_version=1.32.0  # the headers the probe was written against
cuda_home=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)

build() {
    local venv=${TANDEM_VENV:-$HOME/.cache/tandem/venv-torch2.11.0}
    local cudnn_dir
    cudnn_dir=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cudnn 2>/dev/null | head -n 1 || true)
    if [[ -z $cudnn_dir || ! -f $cudnn_dir/include/cudnn.h ]]; then
        echo "cudnn_fusion_probe: no cuDNN headers under $venv (set TANDEM_VENV)" >&2
        exit 1
    fi
    if [[ ! -f $fe_include/cudnn_frontend.h ]]; then
        # The frontend is header-only: its PyPI wheel's include/ folder, fetched once (pinned).
        local wheels
        wheels=$(mktemp -d)
        "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: \
            "nvidia-cudnn-frontend==$frontend_version" -d "$wheels" >&2 || {
            echo "cudnn_fusion_probe: could not download nvidia-cudnn-frontend==$frontend_version" >&2
            exit 1
        }
        mkdir -p "$(dirname "$fe_include")"
        (cd "$(dirname "$fe_include")" && unzip -q -o "$wheels"/nvidia_cudnn_frontend-*.whl 'include/*')
        rm -rf "$wheels"
    fi
    local nvrtc_dir=$cuda_home/lib64
    if [[ ! -e $nvrtc_dir/libnvrtc.so.13 && ! -e $nvrtc_dir/libnvrtc.so ]]; then
        echo "cudnn_fusion_probe: no libnvrtc in $nvrtc_dir" >&2
        exit 1
    fi
    local nvrtc_lib=-lnvrtc
    [[ -e $nvrtc_dir/libnvrtc.so.13 ]] && nvrtc_lib=-l:libnvrtc.so.13
    mkdir -p "$(dirname "$bin")"
    local cxx=${CXX:-g++}
    local cflags=(-O2 -std=c++17 -Wall -Wno-unused-function
        -I"$cuda_home/include" -I"$cudnn_dir/include" -I"$fe_include")
    local objdir=$outdir/obj
    mkdir -p "$objdir"
    : >"$outdir/build.log"
    local start=$SECONDS
    # Every file includes the cuDNN frontend's headers, so each compile takes a while: two at a time.
    local -a srcs=("$src_dir"/*.cpp) objs=() pids=()
    local failed=0 i
    for ((i = 0; i < ${#srcs[@]}; ++i)); do
        local name
        name=$(basename "${srcs[i]}" .cpp)
        objs+=("$objdir/$name.o")
        local cmd=("$cxx" "${cflags[@]}" -c "${srcs[i]}" -o "$objdir/$name.o")
        echo "${cmd[*]}" | tee -a "$outdir/build.log"
        "${cmd[@]}" >"$objdir/$name.log" 2>&1 &
        pids+=($!)
        if ((${#pids[@]} == 2)); then
            wait "${pids[0]}" || failed=1
            pids=("${pids[@]:1}")
        fi
    done
    for pid in ${pids[@]+"${pids[@]}"}; do
        wait "$pid" || failed=1
    done
    for obj in "${objs[@]}"; do
        cat "${obj%.o}.log" >>"$outdir/build.log"
    done
    if ((failed == 0)); then
        local cmd=("$cxx" "${objs[@]}" -o "$bin"
            -L"$cuda_home/lib64" -L"$cudnn_dir/lib"
            -lcudart_static -l:libcudnn.so.9 "$nvrtc_lib" -ldl -lpthread -lrt)
        echo "${cmd[*]}" | tee -a "$outdir/build.log"
        "${cmd[@]}" >>"$outdir/build.log" 2>&1 || failed=1
    fi
    if ((failed)); then
        tail -n 40 "$outdir/build.log" >&2
        echo "cudnn_fusion_probe: build failed; full log in $outdir/build.log" >&2
        exit 1
    fi
    echo "built $bin ($(stat -c %s "$bin") bytes) in $((SECONDS - start)) s" | tee -a "$outdir/build.log"
}

# Library folders on the GPU machine: torch's cuDNN first, then its NVRTC and CUDA runtime, then torch's
# own lib folder and the system toolkit.
library_path() {
    python3 - <<'EOF'
import os
dirs = []
try:
    import nvidia.cudnn
    # A namespace package in the cu13 wheels (no __init__.py, so no __file__): use its path.
    roots = [os.path.dirname(nvidia.cudnn.__file__)] if getattr(nvidia.cudnn, "__file__", None) else []
    roots += list(getattr(nvidia.cudnn, "__path__", []))
    dirs += [os.path.join(r, "lib") for r in roots]
except Exception:
    pass
try:
    import nvidia
    for root in list(getattr(nvidia, "__path__", [])):
        for sub in ("cu13/lib", "cuda_nvrtc/lib", "cuda_runtime/lib"):
            d = os.path.join(root, sub)
            if os.path.isdir(d):
                dirs.append(d)
except Exception:
    pass
try:
    import torch
    dirs.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
except Exception:
    pass
seen = []
for d in dirs:
    if os.path.isdir(d) and d not in seen:
        seen.append(d)
print(":".join(seen))
EOF
}

run() {
    if [[ ! -x $bin ]]; then
        echo "cudnn_fusion_probe: $bin is missing; build it first and carry .ref/probe (the headers are not needed to run)" >&2
        exit 1
    fi
    local libs
    libs=$(library_path || true)
    if [[ -z $libs ]]; then
        echo "cudnn_fusion_probe: python3 found neither nvidia.cudnn nor torch; using the system libraries" >&2
    fi
    export LD_LIBRARY_PATH="${libs:+$libs:}$cuda_home/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    local json=$outdir/cudnn-fusion-probe.json
    local txt=$outdir/cudnn-fusion-probe.txt
    local limit=${PROBE_TIMEOUT_S:-240}
    # The probe stops starting new work at its budget, which leaves room for one slow build and the output.
    local budget=$((limit - 45))
    local -a extra=()
    read -r -a extra <<<"${PROBE_ARGS:-}"
    rm -f "$json"
    {
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
        echo "libcudnn.so.9 resolves to: $(ldd "$bin" | awk '/libcudnn.so.9/ {print $3}')"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
    } | tee "$txt"
    local rc=0
    set +e
    timeout "$limit" "$bin" "$json" --budget-s "$budget" ${extra[@]+"${extra[@]}"} 2>&1 | tee -a "$txt"
    rc=${PIPESTATUS[0]}
    set -e
    echo "probe exit status $rc" | tee -a "$txt"

    # A first run that learned nothing is rerun once, small, with the frontend's log on.
    local learned=0
    if [[ -s $json ]]; then
        learned=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(1 for r in d.get("rows", []) if r.get("supported")))' "$json" 2>/dev/null || echo 0)
    fi
    if [[ $learned == 0 ]]; then
        echo "first run failed entirely; rerunning the first shape with CUDNN_FRONTEND_LOG_INFO=1" | tee -a "$txt"
        [[ -s $json ]] && mv "$json" "$outdir/cudnn-fusion-probe.first.json"
        set +e
        CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE="$outdir/frontend.log" \
            timeout "$limit" "$bin" "$json" --budget-s "$budget" --shapes 1 --max-plans 2 2>&1 | tee -a "$txt"
        rc=${PIPESTATUS[0]}
        set -e
        echo "logged rerun exit status $rc; frontend log in $outdir/frontend.log" | tee -a "$txt"
        return 1
    fi
    return 0
}

case $mode in
    build) build ;;
    run) run ;;
    *) usage ;;
esac

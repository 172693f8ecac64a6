#!/usr/bin/env python3
"""What GatheredGrad's weight gradient costs at world sizes one GPU cannot run (4 and 8).

At world W a GatheredGrad layer (include/tandem/gathered_grad.h) forms its weight gradient from the
W ranks' gathered batch: one GEMM over W times the rows of world 1, on every rank. This times that
GEMM on one GPU with the rows of W = 1, 2, 4, 8 ranks, for the layers the reference workloads' nets
wrap, the way src/gathered_grad.cpp forms it (patch rows, then a 1x1 convolution through cuDNN:
deterministic, no autotuning, cuDNN's TF32 setting), and prints beside it the bytes the gather
moves and the bytes an all-reduce of the same gradient would move, per rank.

Usage: gathered_grad_cost.py [--worlds 1 2 4 8] [--iters 50] [--json FILE]
"""
import argparse
import json
import statistics

import torch

# (workload, batch per rank, layer, kind, in channels, out channels, kernel, input side): the
# reference workloads' GatheredGrad layers (models/src/reference_nets.cpp) on their 256 x 256 inputs.
LAYERS = [
    ("seg", 32, "encoder.conv8", "conv", 2048, 4096, 2, 2),
    ("seg", 32, "decoder.deconv1", "conv_transpose", 4096, 2048, 2, 1),
    ("seg", 32, "decoder.deconv2", "conv_transpose", 2048, 1024, 2, 2),
    ("cls", 128, "encoder.conv8", "conv", 2048, 4096, 2, 2),
]


def gemm_tn_conv(a, b):
    """a^T b as gathered_grad.cpp's gemm_tn_conv forms it: a 1x1 convolution."""
    n, p = a.shape
    q = b.shape[1]
    weight = a.t().contiguous().view(p, n, 1, 1)
    inp = b.contiguous().view(1, n, q, 1)
    return torch.convolution(inp, weight, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1).view(p, q)


def weight_grad(kind, k, x, gy):
    """gathered_grad.cpp's weight_grads for the conv kinds, bias included."""
    n, c = x.shape[:2]
    if kind == "conv":
        ho, wo = gy.shape[2:]
        patches = (x[:, :, :ho * k, :wo * k].reshape(n, c, ho, k, wo, k)
                   .permute(0, 2, 4, 1, 3, 5).reshape(n * ho * wo, c * k * k))
        gr = gy.permute(0, 2, 3, 1).reshape(n * ho * wo, gy.shape[1])
        return gemm_tn_conv(gr, patches), gr.sum(0)
    h, w = x.shape[2:]
    o = gy.shape[1]
    xr = x.permute(0, 2, 3, 1).reshape(n * h * w, c)
    gr = gy.reshape(n, o, h, k, w, k).permute(0, 2, 4, 1, 3, 5).reshape(n * h * w, o * k * k)
    return gemm_tn_conv(xr, gr), gr.view(n * h * w, o, k * k).sum((0, 2))


def time_ms(fn, iters):
    for _ in range(5):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = False  # as gemm_tn_conv: every rank the same algorithm
    torch.backends.cudnn.deterministic = True
    dev = torch.device("cuda")
    rows = []
    print(f"{'workload':8} {'bs':>4} {'layer':16} {'world':>5} {'rows':>6} {'GFLOP':>7} "
          f"{'gemm ms':>8} {'gather MB':>9} {'all-reduce MB':>13}")
    for workload, bs, layer, kind, cin, cout, k, side in LAYERS:
        out_side = side // k if kind == "conv" else side * k
        weight_floats = cin * cout * k * k
        sample_floats = cin * side * side + cout * out_side * out_side  # x and gy of one sample
        for world in a.worlds:
            n = bs * world
            x = torch.randn(n, cin, side, side, device=dev)
            gy = torch.randn(n, cout, out_side, out_side, device=dev)
            ms = time_ms(lambda: weight_grad(kind, k, x, gy), a.iters)
            gemm_rows = n * (out_side * out_side if kind == "conv" else side * side)
            row = {"workload": workload, "batch_size": bs, "layer": layer, "world": world,
                   "gemm_rows": gemm_rows, "gflop": 2 * gemm_rows * weight_floats / 1e9,
                   "weight_grad_ms": ms,
                   # what a rank receives: the other ranks' x and gy
                   "gather_mb_per_rank": (world - 1) * bs * sample_floats * 4 / 1e6,
                   # a ring all-reduce sends and receives 2 (W - 1) / W of the gradient
                   "allreduce_mb_per_rank": 2 * (world - 1) / world * weight_floats * 4 / 1e6,
                   "device": torch.cuda.get_device_name()}
            rows.append(row)
            print(f"{workload:8} {bs:>4} {layer:16} {world:>5} {gemm_rows:>6} {row['gflop']:>7.1f} "
                  f"{ms:>8.3f} {row['gather_mb_per_rank']:>9.1f} "
                  f"{row['allreduce_mb_per_rank']:>13.1f}")
            del x, gy
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

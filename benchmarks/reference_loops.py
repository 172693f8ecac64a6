#!/usr/bin/env python3
"""The Python reference loops: the reference workloads (docs/reference-workloads.md) written as
plain PyTorch training loops, the way such loops are usually written by hand (their cross-stream
hazards included), plus torch.compile(mode="reduce-overhead") variants. They are what tandem is
measured against: run them on the same machine in the same call as tandem's own benchmark
(benchmarks/gpu_check.py does), so that both numbers come from one card, and quote the ratio.

    reference_loops.py seg      [--bs 8,32,128] [--modes serial,pipelined]
    reference_loops.py cls      [--bs 16,32,64,128] [--modes cpu_aug,gpu_aug,pipelined,aug_only]
    reference_loops.py mlp      [--modes eager,graph[,graph_k]] [--k 4]
    reference_loops.py floor    [--bs 8,32,128]      per-stage GPU times: the floors
    reference_loops.py compiled [--bs 8,32] [--modes seg,cls]
  common: [--workers 8] [--json FILE] [--device cuda|cpu] [--warmup 10] [--steps N]

Every measurement is printed as one JSON object per line, after a first line starting with '#'
(torch's version, the device, the CPU count); --json FILE also writes them all as one list.
Records (the keys benchmarks/compare.py and benchmarks/python_bench.py read):
  seg, cls   {"exp", "bs", "mode", "steps_s"}
  mlp        {"exp": "mlp", "bs", "eager_ms", "graph_ms", "graph_gain"} (+ "graph_k_ms", "k")
  floor      {"exp": "seg_floor", "bs", enc_ms, dec_step_ms, serial_step_ms, enc_graph_ms,
              dec_step_graph_ms, serial_step_graph_ms, floor_ms} and {"exp": "cls_floor", "bs",
              step_eager_ms, step_graph_ms, tv_gpu_aug_ms, loader_ms, h2d_pinned_ms}
  compiled   seg's "serial_compiled" and cls's "gpu_aug_compiled" as seg / cls records, or
             {"exp", "bs", "mode": "compiled", "error"} where compiling failed

Timing: `warmup` steps (10), then the clock runs over `steps` steps (100; mlp 200) between two
device synchronizations; loading stays inside the clock. seg and cls need torchvision only for
cls (its transforms). --device cpu runs what needs no CUDA (seg serial, cls cpu_aug / gpu_aug /
aug_only, mlp eager) as a smoke test.

Modules other scripts import: seg_networks(), cls_network(), SegSamples, ClsSamples,
gpu_augmentation() (torchvision's GPU batch transform, the cls pipeline's).
"""
import argparse
import json
import os
import random
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

IMAGE_SIZE = 256  # seg and cls: the networks take 256 x 256 images (8 halvings to 1 x 1)
CLASSES = 10

SEG_MODES = ("serial", "pipelined")
CLS_MODES = ("cpu_aug", "gpu_aug", "pipelined", "aug_only")
MLP_MODES = ("eager", "graph", "graph_k")
COMPILED = ("seg", "cls")
NEEDS_CUDA = {"pipelined", "graph", "graph_k"}

DEFAULT_BS = {"seg": "8,32,128", "cls": "16,32,64,128", "mlp": "640", "floor": "8,32,128",
              "compiled": "8,32"}
DEFAULT_MODES = {"seg": "serial,pipelined", "cls": "cpu_aug,gpu_aug,pipelined,aug_only",
                 "mlp": "eager,graph", "compiled": "seg,cls", "floor": ""}


# ---------------------------------------------------------------- networks and data

def seg_networks():
    """seg's frozen encoder and trainable decoder (models/src/reference_nets.cpp, layer for layer):
    Conv2d(3, 16, 1), then eight Conv2d(k2, s2) doubling the channels to 4096 (ReLU after all
    but the last): (3, 256, 256) -> (4096, 1, 1); the decoder mirrors it with eight
    ConvTranspose2d(k2, s2) and ReLUs, then Conv2d(16, 10, 3, padding 1)."""
    encoder, channels = [nn.Conv2d(3, 16, 1), nn.ReLU(inplace=True)], 16
    for i in range(8):
        encoder.append(nn.Conv2d(channels, channels * 2, 2, stride=2))
        if i < 7:
            encoder.append(nn.ReLU(inplace=True))
        channels *= 2
    decoder = []
    for _ in range(8):
        decoder += [nn.ConvTranspose2d(channels, channels // 2, 2, stride=2), nn.ReLU(inplace=True)]
        channels //= 2
    decoder.append(nn.Conv2d(16, CLASSES, 3, padding=1))
    return nn.Sequential(*encoder), nn.Sequential(*decoder)


def cls_network():
    """cls's classifier: the seg encoder's nine convolutions (ReLU after each but the last),
    Flatten, Linear(4096, 10)."""
    layers, channels = [nn.Conv2d(3, 16, kernel_size=1), nn.ReLU(inplace=True)], 16
    for _ in range(7):
        layers += [nn.Conv2d(channels, channels * 2, kernel_size=2, stride=2),
                   nn.ReLU(inplace=True)]
        channels *= 2
    layers += [nn.Conv2d(channels, channels * 2, kernel_size=2, stride=2), nn.Flatten(),
               nn.Linear(4096, CLASSES)]
    return nn.Sequential(*layers)


class SegSamples(Dataset):
    """Random uint8 images (3, S, S) and int64 masks (S, S) of 10 classes, drawn in __getitem__
    from the process's RNG (a loader worker's own)."""

    def __init__(self, image_size=IMAGE_SIZE, length=1_000_000):
        self.image_size, self.length = image_size, length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        s = self.image_size
        image = torch.randint(0, 256, (3, s, s), dtype=torch.uint8)
        mask = torch.randint(0, CLASSES, (s, s))
        return image, mask


class ClsSamples(Dataset):
    """Random uint8 images (3, 256, 256) and a (1,) int64 label, augmented by `transform` (in
    the loader's workers) when one is given."""

    def __init__(self, transform=None, length=1_000_000):
        self.transform, self.length = transform, length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        image = torch.randint(0, 256, (3, IMAGE_SIZE, IMAGE_SIZE), dtype=torch.uint8)
        label = torch.randint(0, CLASSES, (1,))
        if self.transform:
            image = self.transform(image)
        return image, label


def cpu_augmentation():
    """cls's per-sample augmentation with torchvision's transforms, for a loader's workers:
    float, random crop 128, resize to 256, random rotation within 45 degrees, Gaussian blur
    (kernel 7), normalize (mean 0, std 1)."""
    import torchvision.transforms.v2 as T
    return T.Compose([
        T.ToDtype(torch.float32),
        T.RandomCrop(IMAGE_SIZE // 2),
        T.Resize(IMAGE_SIZE),
        T.RandomRotation(degrees=45.0),
        T.GaussianBlur(kernel_size=7),
        T.Normalize(mean=[0, 0, 0], std=[1, 1, 1]),
    ])


def gpu_augmentation():
    """The same augmentation on a whole (B, 3, 256, 256) batch on the device, as torchvision
    lets one write it: a batched random crop through roi_align, Resize, a rotation per sample
    (one F.rotate call each), GaussianBlur, Normalize."""
    import torchvision.ops as ops
    import torchvision.transforms.v2 as T
    import torchvision.transforms.v2.functional as F

    class BatchRandomCrop(T.Transform):
        def __init__(self, size):
            super().__init__()
            self.size = size

        def transform(self, images, params):
            b, _, h, w = images.shape
            dev = images.device
            top = torch.randint(0, h - self.size + 1, (b,), device=dev, dtype=torch.float32)
            left = torch.randint(0, w - self.size + 1, (b,), device=dev, dtype=torch.float32)
            index = torch.arange(b, device=dev, dtype=torch.float32)
            boxes = torch.stack([index, left, top, left + self.size, top + self.size], dim=1)
            return ops.roi_align(images, boxes, output_size=self.size)

    class BatchRandomRotation(T.Transform):
        def __init__(self, degrees):
            super().__init__()
            self.degrees = degrees

        def transform(self, images, params):
            return torch.stack([F.rotate(image, angle=random.uniform(-self.degrees, self.degrees))
                                for image in torch.unbind(images, 0)], 0)

    return T.Compose([
        T.ToDtype(torch.float32),
        BatchRandomCrop(IMAGE_SIZE // 2),
        T.Resize(IMAGE_SIZE),
        BatchRandomRotation(45.0),
        T.GaussianBlur(kernel_size=7),
        T.Normalize(mean=[0, 0, 0], std=[1, 1, 1]),
    ])


# ---------------------------------------------------------------- timing

class Clock:
    """The loops' timing: `warmup` steps, then `steps` steps between two synchronizations."""

    def __init__(self, device, warmup, steps, mark_cudagraph_steps=False):
        self.device, self.warmup, self.steps = device, warmup, steps
        self.mark = mark_cudagraph_steps  # torch.compile's CUDA graphs: one step per iteration

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def steps_per_s(self, loader, step):
        """Runs step(batch) over the loader's batches: the clock starts after batch `warmup`
        and stops after batch `warmup + steps`."""
        start = None
        for i, batch in enumerate(loader):
            if self.mark:
                torch.compiler.cudagraph_mark_step_begin()
            step(batch)
            if i == self.warmup:
                self.sync()
                start = time.perf_counter()
            if i == self.warmup + self.steps:
                break
        self.sync()
        return self.steps / (time.perf_counter() - start)


def device_ms(fn, iters=50, warmup=5):
    """Mean wall time of fn per call in ms, between synchronizations (GPU time for device work
    enqueued faster than it runs)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e3


def replay_ms(fn, iters=50):
    """GPU time of fn per call in ms: captured once into a CUDA graph (after 3 eager calls on a
    side stream), then replays timed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return device_ms(graph.replay, iters)


# ---------------------------------------------------------------- seg

def seg_steps_per_s(clock, bs, mode, workers, compiled=False):
    """seg: the frozen encoder under no_grad feeds the decoder's SGD step (cross-entropy).
    serial: everything in turn on the default stream. pipelined: the decoder trains on batch n
    on one stream while the encoder runs on batch n+1 on another (the usual hand-written
    version: the decoder's stream waits for the encoder's, and the features are
    record_stream'ed on the encoder's stream only)."""
    dev = clock.device
    torch.manual_seed(0)
    encoder, decoder = seg_networks()
    encoder.requires_grad_(False)
    encoder.eval().to(dev)
    decoder.train().to(dev)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(decoder.parameters())
    loader = DataLoader(SegSamples(), batch_size=bs, num_workers=workers)
    if compiled:
        encoder = torch.compile(encoder, mode="reduce-overhead")
        decoder = torch.compile(decoder, mode="reduce-overhead")
    if mode == "serial":
        def step(batch):
            images = batch[0].to(dev, non_blocking=True).float()
            masks = batch[1].to(dev, non_blocking=True)
            optimizer.zero_grad()
            with torch.no_grad():
                features = encoder(images)
            loss = loss_fn(decoder(features), masks)
            loss.backward()
            optimizer.step()
        return clock.steps_per_s(loader, step)

    encode_stream, train_stream = torch.cuda.Stream(), torch.cuda.Stream()
    ahead = {"features": None, "masks": None}  # batch n's, while batch n+1 loads

    def step(batch):
        images = batch[0].to(dev, non_blocking=True).float()
        masks_next = batch[1].to(dev, non_blocking=True)
        if ahead["features"] is not None:
            with torch.cuda.stream(train_stream):
                train_stream.wait_stream(encode_stream)
                optimizer.zero_grad()
                loss = loss_fn(decoder(ahead["features"]), ahead["masks"])
                loss.backward()
                optimizer.step()
        with torch.cuda.stream(encode_stream):
            with torch.no_grad():
                ahead["features"] = encoder(images)
            ahead["features"].record_stream(encode_stream)
        ahead["masks"] = masks_next
    return clock.steps_per_s(loader, step)


# ---------------------------------------------------------------- cls

def cls_steps_per_s(clock, bs, mode, workers, compiled=False):
    """cls: the classifier's SGD step (cross-entropy) behind the augmentation. cpu_aug: the
    loader's workers augment each sample (torchvision's transforms). gpu_aug: uint8 batches go to
    the device and torchvision's batch transform augments them there, then the step. aug_only:
    the batch transform alone. pipelined: the augmentation of batch n+1 on one stream beside
    the step on batch n on another (the usual hand-written version)."""
    dev = clock.device
    torch.manual_seed(0)
    model = cls_network().train().to(dev)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters())

    def train(x, y):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()

    if mode == "cpu_aug":
        loader = DataLoader(ClsSamples(cpu_augmentation()), batch_size=bs, num_workers=workers)
        return clock.steps_per_s(loader, lambda b: train(b[0].to(dev, non_blocking=True),
                                                         b[1].to(dev, non_blocking=True).squeeze()))
    augment = gpu_augmentation()
    loader = DataLoader(ClsSamples(), batch_size=bs, num_workers=workers)
    if compiled:
        model = torch.compile(model, mode="reduce-overhead")
    if mode == "gpu_aug":
        def step(batch):
            x = batch[0].to(dev, non_blocking=True)
            y = batch[1].to(dev, non_blocking=True).squeeze()
            train(augment(x), y)
        return clock.steps_per_s(loader, step)
    if mode == "aug_only":
        return clock.steps_per_s(loader, lambda b: augment(b[0].to(dev, non_blocking=True)))

    augment_stream, train_stream = torch.cuda.Stream(), torch.cuda.Stream()
    ahead = {"x": None, "labels": None}  # batch n's augmented images and its host labels

    def step(batch):
        if ahead["x"] is not None:
            with torch.cuda.stream(train_stream):
                y = ahead["labels"].to(dev, non_blocking=True).squeeze()
                train_stream.wait_stream(augment_stream)
                train(ahead["x"], y)
        with torch.cuda.stream(augment_stream):
            ahead["x"] = augment(batch[0].to(dev, non_blocking=True))
            ahead["x"].record_stream(augment_stream)
        ahead["labels"] = batch[1]
    return clock.steps_per_s(loader, step)


# ---------------------------------------------------------------- mlp

def mlp_parts(dev, batch):
    """mlp: Linear(4096, 2048), Dropout(0.2), Linear(2048, 1024), Dropout(0.1); MSE; SGD lr
    0.1; batches of (batch, 4096) inputs and (batch, 1024) targets on the device."""
    model = nn.Sequential(nn.Linear(4096, 2048), nn.Dropout(p=0.2), nn.Linear(2048, 1024),
                          nn.Dropout(p=0.1)).to(dev)
    return model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), (batch, 4096, 1024)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def mlp_eager_ms(dev, batch, steps, warmup):
    """The eager step over `steps` device-resident batches after `warmup` steps: ms per step."""
    model, loss_fn, optimizer, (n, d_in, d_out) = mlp_parts(dev, batch)
    xs = [torch.randn(n, d_in, device=dev) for _ in range(steps)]
    ys = [torch.randn(n, d_out, device=dev) for _ in range(steps)]

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
    for x, y in zip(xs[:warmup], ys[:warmup]):
        step(x, y)
    sync(dev)
    start = time.perf_counter()
    for x, y in zip(xs, ys):
        step(x, y)
    sync(dev)
    return (time.perf_counter() - start) / steps * 1e3


def mlp_graph_ms(dev, batch, steps, warmup, k=1):
    """The step captured into a CUDA graph (K steps per graph, each from its own static input
    slot), after 3 eager steps on a side stream; each step copies its batch into a slot and the
    step that fills the last slot replays: ms per step."""
    model, loss_fn, optimizer, (n, d_in, d_out) = mlp_parts(dev, batch)
    slots_x = [torch.randn(n, d_in, device=dev) for _ in range(k)]
    slots_y = [torch.randn(n, d_out, device=dev) for _ in range(k)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(slots_x[0]), slots_y[0]).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)  # the gradients are allocated inside the capture
    with torch.cuda.graph(graph):
        for j in range(k):
            if j:
                optimizer.zero_grad(set_to_none=False)
            loss_fn(model(slots_x[j]), slots_y[j]).backward()
            optimizer.step()
    xs = [torch.rand_like(slots_x[0]) for _ in range(steps)]
    ys = [torch.rand_like(slots_y[0]) for _ in range(steps)]

    def run(pairs):
        for i, (x, y) in enumerate(pairs):
            slots_x[i % k].copy_(x)
            slots_y[i % k].copy_(y)
            if i % k == k - 1:
                graph.replay()
    run(list(zip(xs[:warmup], ys[:warmup])))
    torch.cuda.synchronize()
    start = time.perf_counter()
    run(list(zip(xs, ys)))
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


# ---------------------------------------------------------------- floors

def seg_floor(bs):
    """seg's stages on device-resident data, eager (Python's launch cost included) and as graph
    replays (GPU time alone): the floor is the slower of the encoder and the decoder's step."""
    torch.manual_seed(0)
    encoder, decoder = seg_networks()
    encoder.requires_grad_(False)
    encoder.eval().cuda()
    decoder.train().cuda()
    loss_fn, optimizer = nn.CrossEntropyLoss(), torch.optim.SGD(decoder.parameters())
    x = torch.rand(bs, 3, IMAGE_SIZE, IMAGE_SIZE, device="cuda")
    y = torch.randint(0, CLASSES, (bs, IMAGE_SIZE, IMAGE_SIZE), device="cuda")
    with torch.no_grad():
        features = encoder(x)

    def encode():
        with torch.no_grad():
            encoder(x)

    def decoder_step():
        optimizer.zero_grad(set_to_none=False)
        loss_fn(decoder(features), y).backward()
        optimizer.step()

    def serial_step():
        optimizer.zero_grad(set_to_none=False)
        with torch.no_grad():
            f = encoder(x)
        loss_fn(decoder(f), y).backward()
        optimizer.step()
    decoder_step()  # the gradients exist before any capture
    eager = dict(enc_ms=device_ms(encode), dec_step_ms=device_ms(decoder_step),
                 serial_step_ms=device_ms(serial_step))
    graphed = dict(enc_graph_ms=replay_ms(encode), dec_step_graph_ms=replay_ms(decoder_step),
                   serial_step_graph_ms=replay_ms(serial_step))
    return dict(exp="seg_floor", bs=bs, **eager, **graphed,
                floor_ms=max(graphed["enc_graph_ms"], graphed["dec_step_graph_ms"]))


def cls_floor(bs, workers):
    """cls's parts: the train step on device-resident data (eager and as a graph replay: the
    floor), torchvision's batch transform, the loader's rate of uint8 batches and a pinned
    host-to-device copy of one."""
    torch.manual_seed(0)
    model = cls_network().train().cuda()
    loss_fn, optimizer = nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters())
    x = torch.rand(bs, 3, IMAGE_SIZE, IMAGE_SIZE, device="cuda")
    y = torch.randint(0, CLASSES, (bs,), device="cuda")

    def step(set_to_none=True):
        optimizer.zero_grad(set_to_none=set_to_none)
        loss_fn(model(x), y).backward()
        optimizer.step()
    step_eager = device_ms(step)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss_fn(model(x), y).backward()
        optimizer.step()
    step_graph = device_ms(graph.replay)
    augment = gpu_augmentation()
    images = torch.randint(0, 256, (bs, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=torch.uint8,
                           device="cuda")
    tv_aug = device_ms(lambda: augment(images), iters=20)
    batches = iter(DataLoader(ClsSamples(), batch_size=bs, num_workers=workers))
    for _ in range(5):
        next(batches)
    start = time.perf_counter()
    for _ in range(40):
        next(batches)
    loader = (time.perf_counter() - start) / 40 * 1e3
    host = torch.randint(0, 256, (bs, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=torch.uint8).pin_memory()
    h2d = device_ms(lambda: images.copy_(host, non_blocking=True))
    return dict(exp="cls_floor", bs=bs, step_eager_ms=step_eager, step_graph_ms=step_graph,
                tv_gpu_aug_ms=tv_aug, loader_ms=loader, h2d_pinned_ms=h2d)


# ---------------------------------------------------------------- command line

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["seg", "cls", "mlp", "floor", "compiled"])
    ap.add_argument("--bs", default=None, help="comma-separated batch sizes (mlp: its batch, 640)")
    ap.add_argument("--modes", default=None, help="comma-separated modes")
    ap.add_argument("--workers", type=int, default=8, help="DataLoader workers (default 8)")
    ap.add_argument("--json", default=None, help="also write all measurements to this file")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--warmup", type=int, default=10, help="steps before the clock starts (10)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (100; mlp 200)")
    ap.add_argument("--k", type=int, default=4, help="mlp graph_k: steps per graph (4)")
    a = ap.parse_args(argv)
    try:
        a.bs = [int(b) for b in (a.bs or DEFAULT_BS[a.what]).split(",")]
    except ValueError:
        ap.error(f"--bs: expected comma-separated integers, got {a.bs!r}")
    if any(b < 1 for b in a.bs):
        ap.error(f"--bs: batch sizes must be >= 1, got {a.bs}")
    asked = a.modes is not None
    a.modes = [m for m in (a.modes or DEFAULT_MODES[a.what]).split(",") if m]
    if a.device == "cpu" and not asked:  # the defaults that need no CUDA
        a.modes = [m for m in a.modes if m not in NEEDS_CUDA]
    valid = {"seg": SEG_MODES, "cls": CLS_MODES, "mlp": MLP_MODES, "compiled": COMPILED,
             "floor": ()}[a.what]
    for m in a.modes:
        if m not in valid:
            ap.error(f"mode {m!r} is not valid for {a.what}: expected "
                     f"{', '.join(valid) if valid else 'none'}")
    if a.steps is None:
        a.steps = 200 if a.what == "mlp" else 100
    if a.steps < 1 or a.warmup < 0 or a.k < 1 or a.workers < 0:
        ap.error("expected --steps >= 1, --warmup >= 0, --k >= 1 and --workers >= 0")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available (--device cpu runs what needs no CUDA)")
    if a.device == "cpu":
        cuda_only = [m for m in a.modes if m in NEEDS_CUDA]
        if a.what in ("floor", "compiled") or cuda_only:
            what = " ".join([a.what] + cuda_only)
            ap.error(f"--device cpu: {what} needs CUDA (streams or graphs)")
    a.device = torch.device(a.device)
    return a


def main(argv=None):
    a = parse_args(argv)
    results = []

    def record(**fields):
        results.append(fields)
        print(json.dumps(fields), flush=True)

    name = torch.cuda.get_device_name(a.device) if a.device.type == "cuda" else "cpu"
    print("# torch", torch.__version__, name, "cpus", os.cpu_count(), flush=True)
    clock = Clock(a.device, a.warmup, a.steps, mark_cudagraph_steps=a.what == "compiled")
    if a.what == "seg":
        for bs in a.bs:
            for mode in a.modes:
                record(exp="seg", bs=bs, mode=mode,
                       steps_s=seg_steps_per_s(clock, bs, mode, a.workers))
    elif a.what == "cls":
        for bs in a.bs:
            for mode in a.modes:
                record(exp="cls", bs=bs, mode=mode,
                       steps_s=cls_steps_per_s(clock, bs, mode, a.workers))
    elif a.what == "mlp":
        bs, out = a.bs[0], {}
        if "eager" in a.modes:
            out["eager_ms"] = mlp_eager_ms(a.device, bs, a.steps, a.warmup)
        if "graph" in a.modes:
            out["graph_ms"] = mlp_graph_ms(a.device, bs, a.steps, a.warmup)
        if "graph_k" in a.modes:
            out["graph_k_ms"], out["k"] = mlp_graph_ms(a.device, bs, a.steps, a.warmup, a.k), a.k
        if "eager_ms" in out and "graph_ms" in out:
            out["graph_gain"] = (out["eager_ms"] - out["graph_ms"]) / out["eager_ms"]
        record(exp="mlp", bs=bs, **out)
    elif a.what == "floor":
        for bs in a.bs:
            record(**seg_floor(bs))
            record(**cls_floor(bs, a.workers))
    else:  # compiled: torch.compile(mode="reduce-overhead") of seg's serial and cls's gpu_aug
        for bs in a.bs:
            for exp in a.modes:
                try:
                    if exp == "seg":
                        rate = seg_steps_per_s(clock, bs, "serial", a.workers, compiled=True)
                        record(exp="seg", bs=bs, mode="serial_compiled", steps_s=rate)
                    else:
                        rate = cls_steps_per_s(clock, bs, "gpu_aug", a.workers, compiled=True)
                        record(exp="cls", bs=bs, mode="gpu_aug_compiled", steps_s=rate)
                except Exception as e:  # a failure to compile is a result too
                    record(exp=exp, bs=bs, mode="compiled", error=f"{type(e).__name__}: {e}"[:300])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

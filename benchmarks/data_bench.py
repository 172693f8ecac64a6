#!/usr/bin/env python3
"""The Python reference numbers for "real images in": what torchvision's usual pipeline
(ImageFolder + PIL + DataLoader workers) delivers, to compare tandem's data path against.

Jobs (--jobs, comma-separated):
  decode           single-core JPEG decode rate over --decode-files files (every k-th): PIL
                   (Image.open(p).convert('RGB'), full decode) and torchvision.io.decode_jpeg
                   (read_file, RGB) with torch.set_num_threads(1), and tandem.data.decode_image
                   (scaled for 224, and full size) where tandem is importable; the decoders
                   take turns per 25 files, so their ratios survive a drifting host.
  r50_frozen_head  ResNet-50 backbone frozen (eval mode, no_grad), a trained Linear head.
  r18_full         ResNet-18 fully trained (train mode).
  r50_full         ResNet-50 fully trained (train mode).
Training jobs feed ImageFolder(RandomResizedCrop(224), RandomHorizontalFlip, ToTensor,
Normalize) through DataLoader(shuffle, pin_memory, drop_last, persistent_workers) with SGD
(lr 0.1, momentum 0.9) and cross-entropy, and time --steps steps after --warmup; the same step on
one device-resident random batch gives resident_images_per_s, the ceiling when data costs
nothing. The loader's rate over the resident rate is how much the input pipeline costs.

Without CUDA the training jobs are skipped with a message (exit 0), so `--jobs decode` can be
smoke-tested anywhere; `--device cpu` runs the training path on the CPU as a dry run.
The JSON (--out) holds only this script's rows; benchmarks/compare.py style callers merge.
"""
import argparse
import datetime
import gc
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from PIL import Image
from torchvision import datasets, transforms

JOBS = ("decode", "r50_frozen_head", "r18_full", "r50_full")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
COLS = [("job", 16), ("decode", 15), ("bs", 5), ("workers", 8), ("precision", 10),
        ("images/s", 10), ("resident/s", 11)]


def log(msg):
    print(msg, flush=True)


def table_row(values):
    return " ".join(f"{'-' if v is None else v:>{w}}" for v, (_, w) in zip(values, COLS))


def print_row(r):
    f = lambda v: None if v is None else f"{v:.1f}"
    log(table_row([r["job"], r["decode"], r["batch_size"], r["workers"], r["precision"],
                   f(r["images_per_s"]), f(r["resident_images_per_s"])]))


def pick_files(samples, n):
    """n paths spread over the classes (every k-th sample), the same pick as tandem's
    data_bench (tools/tandem/data_bench.cpp), so both decode the same files."""
    n = min(n, len(samples))
    return [samples[i * len(samples) // n][0] for i in range(n)]


def bench_decode(files, chunk=25):
    """Single-core decode rates. Every file is read once beforehand so the page cache is warm
    and each decoder is timed on reading a cached file and decoding it. The decoders take turns
    per `chunk` files (the first of each turn rotating), so a host whose speed drifts during
    the run (shared cores, frequency changes) slows them alike and their ratios hold. Where
    the tandem package is importable, tandem.data.decode_image (the loader workers' decode)
    takes its turns too, at the DCT scale for a 224 target and at full size."""
    for p in files:
        with open(p, "rb") as f:
            f.read()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rgb = torchvision.io.ImageReadMode.RGB  # grayscale files come out as 3 channels, as in PIL
    decoders = {  # name: (impl, decode, note)
        "pil": ("python", lambda p: Image.open(p).convert("RGB"),  # convert(): the full decode
                "PIL Image.open(p).convert('RGB')"),
        "torchvision.io": ("python", lambda p: torchvision.io.decode_jpeg(
            torchvision.io.read_file(p), mode=rgb), "torchvision.io.decode_jpeg(read_file(p))"),
    }
    try:
        import tandem  # noqa: F401  (PYTHONPATH: an installed tandem package)
        decoders["tandem_scaled"] = (
            "tandem", lambda p: tandem.data.decode_image(p, min_size=224, layout="HWC"),
            "tandem.data.decode_image(p, min_size=224): TurboJPEG at the smallest of 1/2, 1/4, "
            "1/8, 1 keeping both sides >= 224, fast IDCT and upsampling")
        decoders["tandem_full"] = (
            "tandem", lambda p: tandem.data.decode_image(p, layout="HWC"),
            "tandem.data.decode_image(p): TurboJPEG at full size, accurate IDCT and upsampling")
    except ImportError as e:
        log(f"decode: no tandem package to time beside them ({e})")
    names = list(decoders)
    seconds = dict.fromkeys(names, 0.0)
    try:
        for name in names:
            for p in files[:10]:  # warm up (lazy imports, allocator)
                decoders[name][1](p)
        for turn, start in enumerate(range(0, len(files), chunk)):
            part = files[start:start + chunk]
            for k in range(len(names)):
                name = names[(turn + k) % len(names)]
                decode = decoders[name][1]
                t0 = time.perf_counter()
                for p in part:
                    decode(p)
                seconds[name] += time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    rows = []
    for name in names:
        impl, _, note = decoders[name]
        rate = len(files) / seconds[name]
        rows.append({"impl": impl, "job": "decode", "decode": "cpu", "decoder": name,
                     "batch_size": None, "workers": 1, "precision": None, "images_per_s": rate,
                     "images_per_s_per_core": rate, "resident_images_per_s": None,
                     "note": f"{note}; in turns of {chunk} files with the other decoders"})
        print_row(rows[-1])
    return rows


def make_step(job, num_classes, device, precision, channels_last=False):
    """One training step, step(x, y) -> loss, for the job's model, as people write it;
    channels_last: the model's weights and each batch in NHWC (tensor-core convolutions without
    transposes, the fast recipe on a GPU)."""
    if job == "r50_frozen_head":
        backbone = torchvision.models.resnet50(weights=None)
        backbone.fc = nn.Identity()  # what is left: up to avgpool + flatten, 2048 features
        backbone.requires_grad_(False)
        backbone.to(device).eval()
        head = nn.Linear(2048, num_classes).to(device)
        params = list(head.parameters())

        def forward(x):
            with torch.no_grad():
                feats = backbone(x)
            return head(feats)
    else:
        ctor = torchvision.models.resnet50 if job == "r50_full" else torchvision.models.resnet18
        model = ctor(num_classes=num_classes).to(device).train()
        params, forward = list(model.parameters()), model
    if channels_last:
        (backbone if job == "r50_frozen_head" else model).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    bf16 = precision == "bf16"

    def step(x, y):
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def forever(loader):
    """The loader's batches across epochs, for runs longer than one epoch."""
    while True:
        yield from loader


def timed(step, batches, warmup, steps, device, bs):
    """images/s of `steps` steps after `warmup`, fenced by device synchronizations."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step(*next(batches))
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(*next(batches))
    sync()
    secs = time.perf_counter() - t0
    if not torch.isfinite(loss).item():
        log(f"warning: non-finite loss {loss.item()}")
    return steps * bs / secs


def bench_train(a, job, bs, dataset, device):
    """One (job, batch size): the real-image loader rate, then the device-resident rate."""
    if len(dataset) < bs:
        log(f"skip {job} bs {bs}: only {len(dataset)} images (drop_last leaves no batch)")
        return None
    step = make_step(job, len(dataset.classes), device, a.precision,
                     getattr(a, "channels_last", False))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=bs, shuffle=True, num_workers=a.workers,
        pin_memory=device.type == "cuda", drop_last=True, persistent_workers=a.workers > 0)

    def from_loader():
        for x, y in forever(loader):
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    batches = from_loader()
    rate = timed(step, batches, a.warmup, a.steps, device, bs)
    batches.close()
    del batches, loader  # shuts the persistent workers down before the next configuration
    gc.collect()
    x = torch.randn(bs, 3, 224, 224, device=device)
    y = torch.randint(0, len(dataset.classes), (bs,), device=device)
    resident = timed(step, iter(lambda: (x, y), None), a.warmup, a.steps, device, bs)
    return {"impl": "python", "job": job, "batch_size": bs, "workers": a.workers,
            "decode": None, "precision": a.precision,
            "layout": "channels_last" if getattr(a, "channels_last", False) else "nchw",
            "images_per_s": rate,
            "images_per_s_per_core": None, "resident_images_per_s": resident}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--data", required=True, help="ImageFolder root (DIR/class/x.jpg)")
    p.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated, of {', '.join(JOBS)}")
    p.add_argument("--batch-sizes", default="64,256", help="comma-separated (default 64,256)")
    p.add_argument("--workers", type=int, default=8, help="DataLoader workers (default 8)")
    p.add_argument("--steps", type=int, default=60, help="timed steps (default 60)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--channels-last", action="store_true",
                   help="weights and batches channels-last (NHWC), the fast recipe on a GPU")
    p.add_argument("--decode-files", type=int, default=500,
                   help="files the decode job decodes (default 500)")
    p.add_argument("--out", help="write this script's rows as JSON here")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cuda (default); cpu is a dry run of the training path")
    a = p.parse_args(argv)
    a.jobs = [j.strip() for j in a.jobs.split(",") if j.strip()]
    bad = [j for j in a.jobs if j not in JOBS]
    if bad or not a.jobs:
        p.error(f"unknown job(s) {bad}; choose from {', '.join(JOBS)}")
    try:
        a.batch_sizes = [int(b) for b in a.batch_sizes.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batch-sizes must be comma-separated integers, not {a.batch_sizes!r}")
    if not a.batch_sizes or min(a.batch_sizes) < 1:
        p.error("--batch-sizes must be positive")
    if a.workers < 0 or a.steps < 1 or a.warmup < 0 or a.decode_files < 1:
        p.error("need --workers >= 0, --steps >= 1, --warmup >= 0, --decode-files >= 1")
    if not os.path.isdir(a.data):
        p.error(f"--data {a.data}: not a directory")
    return a


def write(a, device_name, rows):
    if not a.out:
        return
    doc = {"device": device_name,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(sys.argv), "torch": torch.__version__,
           "torchvision": torchvision.__version__, "rows": rows}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, a.out)


def main(argv=None):
    a = parse_args(argv)
    train_jobs = [j for j in a.jobs if j != "decode"]
    cuda = torch.cuda.is_available()
    if a.device == "cuda" and cuda:
        torch.backends.cudnn.benchmark = True  # what a tuned training script sets
        device_name = torch.cuda.get_device_name()
    else:
        device_name = "cpu" if a.device == "cpu" else f"no CUDA ({os.uname().machine} CPU)"
    device = torch.device(a.device)
    try:
        dataset = datasets.ImageFolder(a.data, transforms.Compose([
            transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
            transforms.ToTensor(), transforms.Normalize(MEAN, STD)]))
    except (FileNotFoundError, RuntimeError) as e:
        sys.exit(f"error: --data {a.data}: {e}")
    cpus = os.cpu_count()
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    log(f"host: {cpus} CPUs ({affinity} usable), device: {device_name}, torch {torch.__version__}, "
        f"torchvision {torchvision.__version__}, cudnn.benchmark "
        f"{torch.backends.cudnn.benchmark}, tf32 conv {torch.backends.cudnn.allow_tf32} "
        f"matmul {torch.backends.cuda.matmul.allow_tf32}")
    log(f"data: {a.data}: {len(dataset)} images, {len(dataset.classes)} classes; jobs "
        f"{','.join(a.jobs)}; batch sizes {a.batch_sizes}; workers {a.workers}; "
        f"{a.warmup}+{a.steps} steps; {a.precision}")
    log(table_row([c for c, _ in COLS]))
    rows, failed = [], False
    if "decode" in a.jobs:
        rows += bench_decode(pick_files(dataset.samples, a.decode_files))
        write(a, device_name, rows)
    if train_jobs and a.device == "cuda" and not cuda:
        log(f"CUDA is not available: skipping {', '.join(train_jobs)} (--device cpu for a dry run)")
        train_jobs = []
    for job in train_jobs:
        for bs in a.batch_sizes:
            try:
                row = bench_train(a, job, bs, dataset, device)
            except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                log(f"error: {job} bs {bs}: {type(e).__name__}: {str(e).splitlines()[0]}")
                failed = True
                row = None
            finally:
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
            if row:
                rows.append(row)
                print_row(row)
                write(a, device_name, rows)
    write(a, device_name, rows)
    if a.out:
        log(f"wrote {len(rows)} rows to {a.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

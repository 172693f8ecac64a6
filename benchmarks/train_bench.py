#!/usr/bin/env python3
"""The Python reference numbers for `tandem train` (benchmarks/results/train.json): what
plain PyTorch, written the usual way, delivers on the same three jobs in fp32 and bf16.

Jobs (--jobs, comma-separated):
  fashion_mnist    tandem's small CNN (models/src/small_cnn.cpp, replicated layer for layer as
                   SmallCnn below) trained on Fashion-MNIST's IDX files for --epochs epochs with
                   Adam or AdamW and a per-step cosine (default, to 0 at the end, as `tandem
                   train`'s default) or constant learning rate; test accuracy after every epoch.
                   The whole training set sits in device memory as one normalized float tensor
                   ((x / 255 - 0.2860) / 0.3530); each epoch draws torch.randperm from a CPU
                   generator seeded with --seed and slices full batches out of it (the remainder
                   is dropped, as tandem's n / batch_size steps per epoch). --subset N takes N
                   samples spread evenly over the set (index i * 60000 / N, tandem's rule), so
                   every class is drawn from. No DataLoader: this is the fastest fair Python
                   loop, so images_per_s is the median over epochs of (images trained / seconds
                   of the training loop, evaluation excluded) and resident_images_per_s is null
                   (the data already is resident).
  r50_frozen_head  } benchmarks/data_bench.py's loops, reused as they are: ImageFolder
  r18_full         } (RandomResizedCrop 224, flip, normalize) through DataLoader(--workers,
  r50_full         }
                     pin_memory), SGD lr 0.1 momentum 0.9, --warmup + --steps timed steps per
                     batch size; resident_images_per_s is the same step on one device-resident
                     random batch. accuracy and epochs are null.
--precision fp32,bf16 runs every job in each: bf16 is torch.autocast(device, torch.bfloat16)
around forward and loss, with fp32 master weights and an fp32 optimizer, as people write it.

Rows: {impl: "python", job, precision, batch_size, images_per_s, resident_images_per_s,
accuracy, epochs} (null where a field does not apply); --out writes {device, date, command,
rows} plus the resolved configuration, versions and the per-epoch history of fashion_mnist.

Without CUDA the image jobs are skipped with a message (their numbers mean nothing on a CPU);
fashion_mnist runs anywhere, e.g. the CPU smoke test
  python benchmarks/train_bench.py --device cpu --jobs fashion_mnist --epochs 1 --subset 2000
fashion_mnist needs only torch; the image jobs need torchvision and PIL (imported when used).
"""
import argparse
import datetime
import gzip
import json
import math
import os
import statistics
import sys
import time
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

JOBS = ("fashion_mnist", "r50_frozen_head", "r18_full", "r50_full")
IMAGE_JOBS = ("r50_frozen_head", "r18_full", "r50_full")
PRECISIONS = ("fp32", "bf16")
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
COLS = [("job", 16), ("precision", 10), ("bs", 5), ("epochs", 7), ("images/s", 10),
        ("resident/s", 11), ("accuracy", 9)]


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- the small CNN, as in C++


class SmallCnn(nn.Module):
    """tandem::models::SmallCnn in torch.nn: the same modules, names, shapes, defaults
    (BatchNorm eps 1e-5 momentum 0.1, bias-free 3x3 convs, dropout 0.25 before fc2) and
    forward order; 468,010 parameters at 28 x 28 and 10 classes."""

    def __init__(self, in_channels=1, num_classes=10, image_size=28, dropout=0.25):
        super().__init__()
        if image_size < 4 or image_size % 4:
            raise ValueError(f"SmallCnn: image size {image_size} is not a positive multiple of 4")
        conv3x3 = lambda i, o: nn.Conv2d(i, o, 3, padding=1, bias=False)
        self.conv1, self.bn1 = conv3x3(in_channels, 32), nn.BatchNorm2d(32)
        self.conv2, self.bn2 = conv3x3(32, 32), nn.BatchNorm2d(32)
        self.conv3, self.bn3 = conv3x3(32, 64), nn.BatchNorm2d(64)
        self.conv4, self.bn4 = conv3x3(64, 64), nn.BatchNorm2d(64)
        side = image_size // 4
        self.fc1 = nn.Linear(64 * side * side, 128)
        self.dropout = nn.Dropout(dropout)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):  # (B, C, S, S) float -> (B, num_classes) logits
        y = F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))
        y = F.max_pool2d(y, 2)
        y = F.relu(self.bn4(self.conv4(F.relu(self.bn3(self.conv3(y))))))
        y = F.max_pool2d(y, 2)
        return self.fc2(self.dropout(F.relu(self.fc1(y.flatten(1)))))


# ---------------------------------------------------------------- IDX files


def read_maybe_gzip(path):
    """The file's bytes, inflated when they start with gzip's magic (as tandem's IDX reader)."""
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def read_idx(path, magic):
    """An IDX file as a uint8 tensor: (count, rows, cols) for images (magic 0x803), (count,)
    for labels (0x801). ValueError naming the file for a wrong magic or a size that does not
    match its header."""
    data = read_maybe_gzip(path)
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header or int.from_bytes(data[:4], "big") != magic:
        found = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
        raise ValueError(f"{path}: magic {found if found is None else hex(found)}, "
                         f"expected {magic:#010x}")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    count = 1
    for d in dims:
        count *= d
    if len(data) != header + count:
        raise ValueError(f"{path}: {len(data) - header} bytes of data, header {dims} "
                         f"announces {count}")
    return torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8).reshape(dims)


def find_idx(directory, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{directory}: no {stem}[.gz] (install the Debian package "
                            f"dataset-fashion-mnist or pass --fashion-dir)")


def load_fashion(directory):
    """{'train': (images, labels), 'test': (images, labels)}, uint8 / uint8 on the CPU."""
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(find_idx(directory, f"{prefix}-images-idx3-ubyte"), 0x803)
        labels = read_idx(find_idx(directory, f"{prefix}-labels-idx1-ubyte"), 0x801)
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"{directory}: {split}: {images.shape[0]} images but "
                             f"{labels.shape[0]} labels")
        out[split] = (images, labels)
    return out


# ---------------------------------------------------------------- fashion_mnist


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def to_device(images, labels, device):
    """uint8 (N, H, W) -> normalized float (N, 1, H, W) and long (N,) labels, on the device."""
    x = images.to(device).unsqueeze(1).float().div_(255).sub_(FASHION_MEAN).div_(FASHION_STD)
    return x, labels.to(device).long()


def make_optimizer(a, params):
    kind = torch.optim.AdamW if a.optimizer == "adamw" else torch.optim.Adam
    kwargs = {"lr": a.lr}
    if a.weight_decay is not None:  # None: torch's default (Adam 0, AdamW 1e-2)
        kwargs["weight_decay"] = a.weight_decay
    return kind(params, **kwargs)


def evaluate(model, x, y, batch_size, autocast):
    """Top-1 accuracy on (x, y), eval mode, no grad, in the training precision."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=x.device)
    with torch.no_grad(), autocast():
        for i in range(0, x.shape[0], batch_size):
            correct += (model(x[i:i + batch_size]).argmax(1) == y[i:i + batch_size]).sum()
    model.train()
    return correct.item() / x.shape[0]


def bench_fashion(a, data, precision, device):
    """Trains a fresh SmallCnn (seeded) for a.epochs epochs; returns (row, history)."""
    images, labels = data["train"]
    if 0 < a.subset < images.shape[0]:  # spread evenly, as tandem's --subset
        pick = torch.arange(a.subset, dtype=torch.long) * images.shape[0] // a.subset
        images, labels = images[pick], labels[pick]
    x, y = to_device(images, labels, device)
    x_test, y_test = to_device(*data["test"], device)
    n, bs = x.shape[0], a.fashion_batch_size
    torch.manual_seed(a.seed)  # the same initial weights and dropout masks for each precision
    classes = int(max(data["train"][1].max(), data["test"][1].max())) + 1
    model = SmallCnn(num_classes=classes).to(device).train()
    opt = make_optimizer(a, model.parameters())
    steps = n // bs  # full batches only
    if steps < 1:
        raise RuntimeError(f"fashion_mnist: {n} training images make no batch of {bs}")
    sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps * a.epochs)
             if a.schedule == "cosine" else None)
    bf16 = precision == "bf16"
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    gen = torch.Generator().manual_seed(a.seed)  # shuffle order, on the CPU as DataLoader's
    history, rates = [], []
    for epoch in range(1, a.epochs + 1):
        perm = torch.randperm(n, generator=gen).to(device)
        loss_sum = torch.zeros((), device=device)  # summed on the device: no per-step sync
        trained = 0
        sync(device)
        t0 = time.perf_counter()
        for s in range(0, steps * bs, bs):
            idx = perm[s:s + bs]
            with autocast():
                loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched:
                sched.step()
            loss_sum += loss.detach().float() * idx.shape[0]
            trained += idx.shape[0]
        sync(device)
        secs = time.perf_counter() - t0
        train_loss = loss_sum.item() / trained
        if not math.isfinite(train_loss):
            raise RuntimeError(f"fashion_mnist {precision}: non-finite training loss "
                               f"{train_loss} in epoch {epoch}")
        acc = evaluate(model, x_test, y_test, a.eval_batch_size, autocast)
        rates.append(trained / secs)
        history.append({"job": "fashion_mnist", "precision": precision, "epoch": epoch,
                        "train_loss": train_loss, "test_accuracy": acc,
                        "images_per_s": rates[-1], "seconds": secs, "images": trained})
        log(f"  fashion_mnist {precision} epoch {epoch}/{a.epochs}: loss {train_loss:.4f}  "
            f"test accuracy {acc:.4f}  {rates[-1]:.0f} img/s  ({secs:.2f} s, {trained} images)")
    row = {"impl": "python", "job": "fashion_mnist", "precision": precision, "batch_size": bs,
           "images_per_s": statistics.median(rates), "resident_images_per_s": None,
           "accuracy": history[-1]["test_accuracy"], "epochs": a.epochs}
    return row, history


# ---------------------------------------------------------------- image jobs (data_bench.py)


def image_dataset(data_bench, root):
    """The ImageFolder and transforms of data_bench.py's main()."""
    from torchvision import datasets, transforms
    return datasets.ImageFolder(root, transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize(data_bench.MEAN, data_bench.STD)]))


def bench_image(a, data_bench, job, bs, dataset, precision, device):
    """data_bench.bench_train for one (job, batch size, precision), as a train.json row."""
    cfg = types.SimpleNamespace(precision=precision, workers=a.workers, warmup=a.warmup,
                                steps=a.steps, channels_last=a.channels_last)
    r = data_bench.bench_train(cfg, job, bs, dataset, device)
    if r is None:
        return None
    return {"impl": "python", "job": job, "precision": precision, "batch_size": bs,
            "images_per_s": r["images_per_s"],
            "resident_images_per_s": r["resident_images_per_s"], "accuracy": None,
            "layout": r["layout"],
            "epochs": None}


# ---------------------------------------------------------------- front end


def table_row(values):
    return " ".join(f"{'-' if v is None else v:>{w}}" for v, (_, w) in zip(values, COLS))


def format_row(r):
    f = lambda v, fmt: None if v is None else format(v, fmt)
    return table_row([r["job"], r["precision"], r["batch_size"], r["epochs"],
                      f(r["images_per_s"], ".1f"), f(r["resident_images_per_s"], ".1f"),
                      f(r["accuracy"], ".4f")])


def split_list(p, flag, text, choices=None, cast=str):
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        items = [cast(t) for t in items]
    except ValueError:
        p.error(f"{flag} must be a comma-separated list of {cast.__name__}, not {text!r}")
    bad = [t for t in items if choices is not None and t not in choices]
    if not items or bad:
        p.error(f"{flag} {text!r}: expected a comma-separated list of {', '.join(choices)}"
                if choices else f"{flag} {text!r}: empty")
    return items


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated, of {', '.join(JOBS)}")
    p.add_argument("--precision", default="fp32,bf16",
                   help="comma-separated, of fp32, bf16 (default both)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cuda (default); cpu runs fashion_mnist (and, with --data, a dry run of "
                        "the image jobs) on the CPU")
    p.add_argument("--out", help="write the JSON here")
    g = p.add_argument_group("fashion_mnist")
    g.add_argument("--fashion-dir", default=FASHION_DIR,
                   help=f"the IDX files, raw or .gz (default {FASHION_DIR})")
    g.add_argument("--epochs", type=int, default=10, help="default 10")
    g.add_argument("--fashion-batch-size", type=int, default=128, help="default 128")
    g.add_argument("--optimizer", choices=("adamw", "adam"), default="adamw")
    g.add_argument("--lr", type=float, default=1e-3, help="default 1e-3")
    g.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                   help="learning rate per step: cosine to 0 over the run (default, as tandem "
                        "train's) or constant")
    g.add_argument("--weight-decay", type=float, default=None,
                   help="default: torch's (AdamW 1e-2, Adam 0)")
    g.add_argument("--subset", type=int, default=0,
                   help="train on N training images spread evenly over the set (0: all "
                        "60,000); the test set is always whole")
    g.add_argument("--eval-batch-size", type=int, default=1000, help="default 1000")
    g.add_argument("--seed", type=int, default=0, help="weights, dropout and shuffle (default 0)")
    g = p.add_argument_group("r50_frozen_head, r18_full (data_bench.py's loops)")
    g.add_argument("--data", help="ImageFolder root (DIR/class/x.jpg), e.g. scripts/make_image_folder.py's JPEG folder")
    g.add_argument("--batch-sizes", default="256", help="comma-separated (default 256)")
    g.add_argument("--workers", type=int, default=8, help="DataLoader workers (default 8)")
    g.add_argument("--steps", type=int, default=60, help="timed steps (default 60)")
    g.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    g.add_argument("--channels-last", action="store_true",
                   help="weights and batches channels-last (NHWC), the fast recipe on a GPU")
    a = p.parse_args(argv)
    a.jobs = split_list(p, "--jobs", a.jobs, JOBS)
    a.precision = split_list(p, "--precision", a.precision, PRECISIONS)
    a.batch_sizes = split_list(p, "--batch-sizes", a.batch_sizes, cast=int)
    if min(a.batch_sizes) < 1:
        p.error("--batch-sizes must be positive")
    if a.epochs < 1 or a.fashion_batch_size < 2 or a.eval_batch_size < 1 or a.subset < 0:
        p.error("need --epochs >= 1, --fashion-batch-size >= 2, --eval-batch-size >= 1, "
                "--subset >= 0")
    if a.lr <= 0 or (a.weight_decay is not None and a.weight_decay < 0):
        p.error(f"need --lr > 0 (got {a.lr}) and --weight-decay >= 0 (got {a.weight_decay})")
    if a.workers < 0 or a.steps < 1 or a.warmup < 0:
        p.error("need --workers >= 0, --steps >= 1, --warmup >= 0")
    if a.data is not None and not os.path.isdir(a.data):
        p.error(f"--data {a.data}: not a directory")
    return a


def write(a, device_name, rows, history):
    if not a.out:
        return
    config = {k: v for k, v in vars(a).items() if k != "out"}
    doc = {"device": device_name,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(sys.argv), "torch": torch.__version__, "config": config,
           "rows": rows, "fashion_mnist_epochs": history}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, a.out)


def main(argv=None):
    a = parse_args(argv)
    cuda = torch.cuda.is_available()
    if a.device == "cuda" and cuda:
        torch.backends.cudnn.benchmark = True  # what a tuned training script sets
        device_name = torch.cuda.get_device_name()
    else:
        device_name = "cpu" if a.device == "cpu" else f"no CUDA ({os.uname().machine} CPU)"
    device = torch.device(a.device)
    cpus = os.cpu_count()
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    log(f"host: {cpus} CPUs ({affinity} usable), device: {device_name}, torch {torch.__version__},"
        f" cudnn.benchmark {torch.backends.cudnn.benchmark}, tf32 conv "
        f"{torch.backends.cudnn.allow_tf32} matmul {torch.backends.cuda.matmul.allow_tf32}")
    log(f"jobs {','.join(a.jobs)}; precision {','.join(a.precision)}")
    if "fashion_mnist" in a.jobs:
        wd = "torch default" if a.weight_decay is None else a.weight_decay
        log(f"fashion_mnist: {a.fashion_dir}; {a.epochs} epochs, batch {a.fashion_batch_size}, "
            f"{a.optimizer} lr {a.lr} {a.schedule} weight decay {wd}, subset {a.subset or 'all'}, "
            f"seed {a.seed}")
    image_jobs = [j for j in a.jobs if j in IMAGE_JOBS]
    if image_jobs:
        log(f"image jobs: {a.data}; batch sizes {a.batch_sizes}; workers {a.workers}; "
            f"{a.warmup}+{a.steps} steps")
    if image_jobs and a.device == "cuda" and not cuda:
        log(f"CUDA is not available: skipping {', '.join(image_jobs)}")
        image_jobs = []
    elif image_jobs and a.device == "cpu" and a.data is None:
        log(f"--device cpu without --data: skipping {', '.join(image_jobs)}")
        image_jobs = []
    elif image_jobs and a.data is None:
        sys.exit(f"error: {', '.join(image_jobs)} need --data (an ImageFolder root)")
    fashion = "fashion_mnist" in a.jobs
    if fashion and a.device == "cuda" and not cuda:
        log("CUDA is not available: skipping fashion_mnist (--device cpu runs it on the CPU)")
        fashion = False

    rows, history, failed = [], [], False
    data = None
    if fashion:
        try:
            data = load_fashion(a.fashion_dir)
            log(f"fashion_mnist: {data['train'][0].shape[0]} train, {data['test'][0].shape[0]} "
                f"test images of {tuple(data['train'][0].shape[1:])}")
        except (OSError, ValueError) as e:
            log(f"error: fashion_mnist: {type(e).__name__}: {e}")
            failed = True
    for precision in a.precision if data else []:
        try:
            row, h = bench_fashion(a, data, precision, device)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
            log(f"error: fashion_mnist {precision}: {type(e).__name__}: "
                f"{str(e).splitlines()[0]}")
            failed = True
            continue
        finally:
            if cuda:
                torch.cuda.empty_cache()
        rows.append(row)
        history += h
        write(a, device_name, rows, history)
    if image_jobs:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import data_bench  # torchvision and PIL only from here on
        try:
            dataset = image_dataset(data_bench, a.data)
        except (FileNotFoundError, RuntimeError) as e:
            sys.exit(f"error: --data {a.data}: {e}")
        log(f"image data: {len(dataset)} images, {len(dataset.classes)} classes")
        for job in image_jobs:
            for precision in a.precision:
                for bs in a.batch_sizes:
                    try:
                        row = bench_image(a, data_bench, job, bs, dataset, precision, device)
                    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                        log(f"error: {job} {precision} bs {bs}: {type(e).__name__}: "
                            f"{str(e).splitlines()[0]}")
                        failed, row = True, None
                    finally:
                        if cuda:
                            torch.cuda.empty_cache()
                    if row:
                        rows.append(row)
                        log(format_row(row))
                        write(a, device_name, rows, history)
    log("")
    log(table_row([c for c, _ in COLS]))
    for r in rows:
        log(format_row(r))
    write(a, device_name, rows, history)
    if a.out:
        log(f"wrote {len(rows)} rows to {a.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

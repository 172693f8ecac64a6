#!/usr/bin/env python3
"""Makes a realistic JPEG ImageFolder (OUT_DIR/class_XX/NNNNN.jpg) for data-loading benchmarks.

Random tensors say nothing about a data pipeline: its cost is JPEG decoding, and that depends on
real photographic content, varied image sizes, 4:2:0 chroma and the odd grayscale file. There is
no network on the benchmark machine, so the photos come from what ships inside installed
packages: scikit-image's sample photos (skimage.data) and scikit-learn's load_sample_images().
Each output image is a random crop of one of them (random position and area), rescaled so both
sides lie in [min_side, max_side] (random aspect), maybe flipped, mildly colour-jittered, saved
with PIL as a baseline JPEG. Class k draws mostly from source photo k mod #sources, so a model
can learn something. The output is deterministic for a seed: every image's randomness comes
from its own (seed, index) generator, whatever the number of workers.

Usage: make_image_folder.py OUT_DIR [--count 6000] [--classes 10] [--min-side 320]
                            [--max-side 640] [--quality 90] [--seed 0] [--workers N]
                            [--gray-fraction 0.02] [--progressive-fraction 0] [--force]
"""
import argparse
import multiprocessing
import os
import re
import sys
import time
import warnings

NEEDS = ("numpy, Pillow, and scikit-image or scikit-learn for the photos (none of them is "
         "tandem's own dependency)")
try:
    import numpy as np
    from PIL import Image, ImageEnhance
except ImportError as missing:
    sys.exit(f"make_image_folder.py: {missing}: it needs {NEEDS}. Install them into the Python "
             f"that runs it: {sys.executable} -m pip install numpy pillow scikit-image "
             "scikit-learn")

# skimage.data's colour photos (and camera, a real grayscale photo) that ship inside the
# package; others need pooch and a network, so any that fail to load are skipped. data.cat is
# chelsea under another name, so it is not listed.
SKIMAGE_PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
                  "immunohistochemistry", "retina", "stereo_motorcycle", "camera"]
MIN_SOURCES = 4
SAME_SOURCE_P = 0.8          # a class's chance of drawing from its own source photo
AREA_FRACTION = (0.2, 1.0)   # the crop's share of the source photo's area
JITTER = 0.15                # brightness / contrast / saturation factors in 1 +- JITTER
FILE_RE = re.compile(r"^class_\d+$")


def load_sources():
    """The sample photos that load offline, as (name, RGB PIL image), in a fixed order."""
    sources = []
    try:
        import skimage.data
        for name in SKIMAGE_PHOTOS:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    img = getattr(skimage.data, name)()
                if isinstance(img, tuple):  # stereo_motorcycle: (left, right, disparity)
                    img = img[0]
                sources.append((name, to_rgb(img)))
            except Exception as e:  # not bundled and no network, or an old skimage
                print(f"note: skipping skimage.data.{name}: {type(e).__name__}: {e}",
                      file=sys.stderr)
    except ImportError as e:
        print(f"note: scikit-image not importable ({e}); its photos are skipped", file=sys.stderr)
    try:
        from sklearn.datasets import load_sample_images
        bunch = load_sample_images()
        for fname, img in zip(bunch.filenames, bunch.images):
            sources.append((os.path.basename(fname), to_rgb(img)))
    except Exception as e:
        print(f"note: skipping scikit-learn's sample images: {type(e).__name__}: {e}",
              file=sys.stderr)
    return sources


def to_rgb(arr):
    """An array from skimage/sklearn (uint8 or float, gray or RGB(A)) as an RGB PIL image."""
    arr = np.asarray(arr)
    if arr.dtype != np.uint8:
        arr = np.clip(arr * (255.0 if arr.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    if arr.ndim == 2:
        arr = np.stack([arr] * 3, axis=-1)
    return Image.fromarray(np.ascontiguousarray(arr[..., :3])).convert("RGB")


_SOURCES = None  # set in each worker by init_worker


def init_worker(sources):
    global _SOURCES
    _SOURCES = sources


def plan(index, classes, a):
    """The class and the random generator of image `index`; one generator per image keeps the
    output independent of the worker count and of scheduling order."""
    return index % classes, np.random.default_rng([a.seed, index])


def make_image(index, classes, a):
    """Renders image `index`, writes it, and returns (bytes, width, height)."""
    label, rng = plan(index, classes, a)
    n = len(_SOURCES)
    src = label % n if rng.random() < SAME_SOURCE_P else int(rng.integers(n))
    img = _SOURCES[src][1]
    sw, sh = img.size
    # Output size: each side uniform in [min_side, max_side], so aspect ratios vary (1:2..2:1).
    w = int(rng.integers(a.min_side, a.max_side + 1))
    h = int(rng.integers(a.min_side, a.max_side + 1))
    # Crop box of the output's aspect covering a random share of the source, shrunk to fit.
    area = rng.uniform(*AREA_FRACTION) * sw * sh
    cw, ch = np.sqrt(area * w / h), np.sqrt(area * h / w)
    shrink = min(1.0, sw / cw, sh / ch)
    cw, ch = cw * shrink, ch * shrink
    x0, y0 = rng.uniform(0, max(0.0, sw - cw)), rng.uniform(0, max(0.0, sh - ch))
    resample = Image.LANCZOS if cw >= w else Image.BICUBIC  # LANCZOS when shrinking
    out = img.resize((w, h), resample, box=(x0, y0, x0 + cw, y0 + ch))
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        out = enhance(out).enhance(float(rng.uniform(1 - JITTER, 1 + JITTER)))
    if rng.random() < a.gray_fraction:
        out = out.convert("L")
    progressive = bool(rng.random() < a.progressive_fraction)  # drawn last: earlier draws stay
    path = os.path.join(a.out_dir, f"class_{label:02d}", f"{index:05d}.jpg")
    out.save(path, "JPEG", quality=a.quality, subsampling=2, optimize=False,
             progressive=progressive)
    return os.path.getsize(path), w, h


def work(chunk):
    """A worker's share: a list of indices; returns one (bytes, w, h) per image."""
    indices, classes, a = chunk
    return [make_image(i, classes, a) for i in indices]


def prepare_out_dir(a):
    """Refuses a non-empty OUT_DIR unless --force; with --force, removes a previous run's
    class_XX/*.jpg so the folder holds exactly this run's images (nothing else is touched)."""
    if os.path.exists(a.out_dir) and not os.path.isdir(a.out_dir):
        sys.exit(f"error: {a.out_dir} exists and is not a directory")
    if os.path.isdir(a.out_dir) and os.listdir(a.out_dir):
        if not a.force:
            sys.exit(f"error: {a.out_dir} is not empty (use --force to write into it)")
        for d in os.listdir(a.out_dir):
            full = os.path.join(a.out_dir, d)
            if FILE_RE.match(d) and os.path.isdir(full):
                for f in os.listdir(full):
                    if f.endswith(".jpg"):
                        os.remove(os.path.join(full, f))
    for k in range(a.classes):
        os.makedirs(os.path.join(a.out_dir, f"class_{k:02d}"), exist_ok=True)


def add_photo_args(p):
    """The options both generators take (this one and make_seg_pairs.py): image sides, JPEG
    quality, seed and worker processes."""
    p.add_argument("--min-side", type=int, default=320, help="smallest side length (default 320)")
    p.add_argument("--max-side", type=int, default=640, help="largest side length (default 640)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality 1..100 (default 90)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes (default: CPU count)")


def check_photo_args(p, a):
    """Exits through p.error naming the first bad value of add_photo_args' options."""
    if not 16 <= a.min_side <= a.max_side:
        p.error("need 16 <= --min-side <= --max-side")
    if not 1 <= a.quality <= 100:
        p.error("--quality must be in 1..100")
    if a.workers < 1 or a.seed < 0:
        p.error("--workers must be >= 1 and --seed >= 0")


def run_chunks(work_fn, chunks, init_fn, sources, workers, on_part=None):
    """work_fn over every chunk, in `workers` processes (each given the photos once, through
    init_fn(sources)), or in this one; the results concatenated, in completion order.
    on_part(done, results) after each chunk."""
    results = []
    if workers == 1:
        init_fn(sources)
        parts = map(work_fn, chunks)
        pool = None
    else:
        pool = multiprocessing.Pool(workers, init_fn, (sources,))
        parts = pool.imap_unordered(work_fn, chunks)
    try:
        for done, part in enumerate(parts, 1):
            results += part
            if on_part:
                on_part(done, results)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return results


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Make a JPEG ImageFolder (OUT_DIR/class_XX/NNNNN.jpg) of random crops of "
                    "the sample photos bundled with scikit-image and scikit-learn (no network "
                    "needed). Deterministic for a seed.")
    p.add_argument("out_dir", metavar="OUT_DIR", help="output folder (created; must be empty)")
    p.add_argument("--count", type=int, default=6000, help="number of images (default 6000)")
    p.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    add_photo_args(p)
    p.add_argument("--gray-fraction", type=float, default=0.02,
                   help="share of images saved as grayscale JPEG (default 0.02)")
    p.add_argument("--progressive-fraction", type=float, default=0.0,
                   help="share of images saved as progressive JPEG, as many photos from the web "
                        "are (default 0: all baseline)")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty OUT_DIR (a previous run's class_XX/*.jpg are removed)")
    a = p.parse_args(argv)
    if a.count < 1 or a.classes < 1:
        p.error("--count and --classes must be >= 1")
    if a.classes > a.count:
        p.error(f"--classes ({a.classes}) > --count ({a.count}): some classes would be empty")
    check_photo_args(p, a)
    if not 0.0 <= a.gray_fraction <= 1.0:
        p.error("--gray-fraction must be in [0, 1]")
    if not 0.0 <= a.progressive_fraction <= 1.0:
        p.error("--progressive-fraction must be in [0, 1]")
    return a


def main(argv=None):
    a = parse_args(argv)
    t0 = time.perf_counter()
    prepare_out_dir(a)
    sources = load_sources()
    if len(sources) < MIN_SOURCES:
        sys.exit(f"error: only {len(sources)} sample photos load offline (need {MIN_SOURCES}); "
                 "install scikit-image and scikit-learn")
    print(f"sources ({len(sources)}): " +
          ", ".join(f"{n} {im.size[0]}x{im.size[1]}" for n, im in sources), flush=True)
    # Chunks of ~64 images keep the per-task overhead small and the load balanced.
    n_chunks = max(1, min(a.count // 64, a.workers * 8))
    chunks = [(list(range(c, a.count, n_chunks)), a.classes, a) for c in range(n_chunks)]
    results = run_chunks(work, chunks, init_worker, sources, a.workers)
    secs = time.perf_counter() - t0
    sizes = [r[0] for r in results]
    ws, hs = [r[1] for r in results], [r[2] for r in results]
    print(f"wrote {len(results)} files in {a.classes} classes to {a.out_dir}: "
          f"{sum(sizes) / 1e6:.1f} MB (mean {sum(sizes) / len(sizes) / 1e3:.0f} kB, "
          f"{min(sizes) / 1e3:.0f}..{max(sizes) / 1e3:.0f} kB), "
          f"width {min(ws)}..{max(ws)}, height {min(hs)}..{max(hs)}, "
          f"quality {a.quality}, {a.workers} workers, {secs:.1f} s")


if __name__ == "__main__":
    main()

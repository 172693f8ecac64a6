#!/usr/bin/env python3
"""Makes a realistic image + mask segmentation folder (OUT_DIR/images/NNNNN.jpg and
OUT_DIR/masks/NNNNN.png) for `tandem train --data OUT_DIR --classes C`.

The sibling of make_image_folder.py, with the same offline photo sources (scikit-image's
skimage.data and scikit-learn's load_sample_images(), loaded by its load_sources). Each image is
a random crop of a source photo, rescaled so both sides lie in [min_side, max_side] (random
aspect), maybe flipped, mildly colour-jittered: that is the background, class 0. On it 1..4
objects of classes 1..C-1 are pasted, later ones on top. Each class has its own shape family
(disc, rectangle, triangle, ring, star, then ellipse, cross, hexagon, crescent; past nine
classes the families repeat and only the colour tells them apart) with a random size, position
(an object may run off the frame), rotation and proportions; its fill is a texture cut from
another source photo, contrast-normalised and tinted by the class's hue (jittered per object),
so a class is learnable from shape and colour but is never one constant colour.

The image's object edges are anti-aliased (shapes drawn 4x supersampled; the coverage is the
alpha), the mask is exact: a pixel takes an object's class when the object covers at least
half of it, so it holds class ids only, never a blend. With --ignore-border (the default) the
pixels on either side of every change of class in the mask (4-neighbours) are set to the ignore
index 255, a band 2 px wide, like PASCAL VOC's void border; the frame's edge is no border.
Masks are 8-bit gray PNGs (mode "L"), the format ImageMaskPairs reads (ids 0..C-1 and 255).

The output is deterministic for a seed: every image's randomness comes from its own
(seed, index) generator, whatever the number of workers.

Usage: make_seg_pairs.py OUT_DIR [--count 2000] [--classes 6] [--min-side 320]
                         [--max-side 640] [--quality 90] [--seed 0] [--workers N]
                         [--ignore-border | --no-ignore-border] [--force]
"""
import argparse
import colorsys
import math
import os
import sys
import time

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance

# The classification sibling's photo loader, from this script's folder, not copied.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_image_folder import add_photo_args, check_photo_args, load_sources, run_chunks  # noqa: E402

IGNORE = 255                 # the mask id no loss counts (ImageMaskPairsOptions::ignore_index)
FAMILIES = ["disc", "rectangle", "triangle", "ring", "star",
            "ellipse", "cross", "hexagon", "crescent"]   # class k >= 1 draws FAMILIES[(k-1) % 9]
OBJECTS = (1, 4)             # objects pasted per image, inclusive
RADIUS = (0.08, 0.30)       # an object's outer radius, as a share of the image's shorter side
BG_AREA = (0.2, 1.0)         # the background crop's share of its source photo's area
TEX_AREA = (0.03, 0.4)       # a texture crop's share of its source photo's area
JITTER = 0.15                # background brightness / contrast / saturation in 1 +- JITTER
SUPERSAMPLE = 4              # shapes are drawn this many times larger, then box-filtered
TINT = 0.75                  # share of the tinted texture in an object's fill (rest: its colours)


def class_hue(k):
    """A per-class hue spread by the golden ratio: neighbouring ids get far apart colours."""
    return ((k - 1) * 0.618034) % 1.0


def random_crop(rng, img, w, h, area_range):
    """A random crop of `img` of aspect w:h covering a random share of its area, rescaled to
    w x h (LANCZOS when shrinking, BICUBIC when enlarging)."""
    sw, sh = img.size
    area = rng.uniform(*area_range) * sw * sh
    cw, ch = math.sqrt(area * w / h), math.sqrt(area * h / w)
    shrink = min(1.0, sw / cw, sh / ch)
    cw, ch = cw * shrink, ch * shrink
    x0, y0 = rng.uniform(0, max(0.0, sw - cw)), rng.uniform(0, max(0.0, sh - ch))
    resample = Image.LANCZOS if cw >= w else Image.BICUBIC
    return img.resize((w, h), resample, box=(x0, y0, x0 + cw, y0 + ch))


def ellipse_pts(a, b, n=128, phase=0.0):
    t = np.linspace(0.0, 2 * np.pi, n, endpoint=False) + phase
    return np.stack([a * np.cos(t), b * np.sin(t)], axis=1)


def shape_polygons(family, r, rng):
    """The shape of `family` around the origin, outer radius about r, unrotated, as a list of
    (fill, vertices): polygons drawn in order, fill 255 adds and 0 cuts out (a ring's hole)."""
    if family == "disc":
        return [(255, ellipse_pts(r, r))]
    if family == "rectangle":
        aspect = rng.uniform(0.35, 1.0)
        a, b = r, r * aspect
        return [(255, np.array([[-a, -b], [a, -b], [a, b], [-a, b]]))]
    if family == "triangle":
        t = np.pi / 2 + 2 * np.pi / 3 * np.arange(3) + rng.uniform(-0.2, 0.2, 3)
        rr = r * rng.uniform(0.85, 1.15, 3)
        return [(255, np.stack([rr * np.cos(t), rr * np.sin(t)], axis=1))]
    if family == "ring":
        b = r * rng.uniform(0.8, 1.0)
        inner = rng.uniform(0.45, 0.65)
        return [(255, ellipse_pts(r, b)), (0, ellipse_pts(r * inner, b * inner))]
    if family == "star":
        points = int(rng.integers(5, 8))
        inner = rng.uniform(0.4, 0.55)
        t = np.pi * np.arange(2 * points) / points
        rr = np.where(np.arange(2 * points) % 2 == 0, r, r * inner)
        return [(255, np.stack([rr * np.cos(t), rr * np.sin(t)], axis=1))]
    if family == "ellipse":
        return [(255, ellipse_pts(r, r * rng.uniform(0.35, 0.6)))]
    if family == "cross":
        s = r * rng.uniform(0.28, 0.42)  # half the arm's thickness
        return [(255, np.array([[-r, -s], [-s, -s], [-s, -r], [s, -r], [s, -s], [r, -s],
                                [r, s], [s, s], [s, r], [-s, r], [-s, s], [-r, s]]))]
    if family == "hexagon":
        t = np.pi / 3 * np.arange(6)
        return [(255, np.stack([r * np.cos(t), r * np.sin(t)], axis=1))]
    if family == "crescent":
        cut = r * rng.uniform(0.75, 0.9)
        shift = r * rng.uniform(0.35, 0.55)
        return [(255, ellipse_pts(r, r)), (0, ellipse_pts(cut, cut) + [shift, 0.0])]
    raise ValueError(family)


def coverage(polys, cx, cy, angle, w, h):
    """The shape rotated by `angle`, centred at (cx, cy), rasterised: (x0, y0, cover) with
    cover a float array in [0, 1], the share of each pixel of the image's box
    [x0, x0 + width) x [y0, y0 + height) it covers; None when it misses the image."""
    c, s = math.cos(angle), math.sin(angle)
    rot = np.array([[c, s], [-s, c]])
    placed = [(fill, pts @ rot + [cx, cy]) for fill, pts in polys]
    allpts = np.concatenate([p for _, p in placed])
    x0, y0 = max(0, math.floor(allpts[:, 0].min())), max(0, math.floor(allpts[:, 1].min()))
    x1, y1 = min(w, math.ceil(allpts[:, 0].max()) + 1), min(h, math.ceil(allpts[:, 1].max()) + 1)
    if x1 <= x0 or y1 <= y0:
        return None
    k = SUPERSAMPLE
    canvas = Image.new("L", ((x1 - x0) * k, (y1 - y0) * k), 0)
    draw = ImageDraw.Draw(canvas)
    for fill, pts in placed:
        local = (pts - [x0, y0]) * k
        draw.polygon([tuple(p) for p in local.tolist()], fill=fill)
    small = canvas.resize((x1 - x0, y1 - y0), Image.BOX)
    return x0, y0, np.asarray(small, dtype=np.float32) / 255.0


def texture_fill(rng, src_img, w, h, hue):
    """A w x h fill: a crop of `src_img`, its luminance normalised to a fixed mean and spread
    (so every source gives a comparable texture) and coloured by a jittered `hue`, mixed with
    a little of the crop's own colours. Float RGB in [0, 255]."""
    crop = random_crop(rng, src_img, w, h, TEX_AREA)
    if rng.random() < 0.5:
        crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
    if rng.random() < 0.5:
        crop = crop.transpose(Image.FLIP_TOP_BOTTOM)
    rgb = np.asarray(crop, dtype=np.float32)
    lum = rgb @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    lum = (lum - lum.mean()) / (lum.std() + 8.0)
    lum = np.clip(0.62 + 0.2 * lum, 0.05, 1.0)
    hue = (hue + rng.normal(0.0, 0.025)) % 1.0
    sat = rng.uniform(0.55, 0.9)
    val = rng.uniform(0.75, 1.0)
    tint = np.array(colorsys.hsv_to_rgb(hue, sat, val), dtype=np.float32) * 255.0
    tinted = lum[..., None] * tint * 1.3
    return np.clip(TINT * tinted + (1.0 - TINT) * rgb, 0.0, 255.0)


_SOURCES = None  # set in each worker by init_worker


def init_worker(sources):
    global _SOURCES
    _SOURCES = sources


def render(index, a):
    """Image `index` and its mask as (RGB uint8 array, uint8 id array); all randomness from
    the (seed, index) generator."""
    rng = np.random.default_rng([a.seed, index])
    n = len(_SOURCES)
    w = int(rng.integers(a.min_side, a.max_side + 1))
    h = int(rng.integers(a.min_side, a.max_side + 1))
    bg_src = int(rng.integers(n))
    bg = random_crop(rng, _SOURCES[bg_src][1], w, h, BG_AREA)
    if rng.random() < 0.5:
        bg = bg.transpose(Image.FLIP_LEFT_RIGHT)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        bg = enhance(bg).enhance(float(rng.uniform(1 - JITTER, 1 + JITTER)))
    img = np.asarray(bg, dtype=np.float32).copy()
    mask = np.zeros((h, w), dtype=np.uint8)
    short = min(w, h)
    for _ in range(int(rng.integers(OBJECTS[0], OBJECTS[1] + 1))):
        k = int(rng.integers(1, a.classes))
        family = FAMILIES[(k - 1) % len(FAMILIES)]
        r = rng.uniform(*RADIUS) * short
        polys = shape_polygons(family, r, rng)
        cx, cy = rng.uniform(0.05, 0.95) * w, rng.uniform(0.05, 0.95) * h
        got = coverage(polys, cx, cy, rng.uniform(0, 2 * np.pi), w, h)
        # Another photo than the background's for the texture, when there is another.
        tex_src = int(rng.integers(n - 1)) if n > 1 else 0
        if n > 1 and tex_src >= bg_src:
            tex_src += 1
        if got is None:
            continue
        x0, y0, cover = got
        bh, bw = cover.shape
        fill = texture_fill(rng, _SOURCES[tex_src][1], bw, bh, class_hue(k))
        # Object shading: a soft linear light gradient across the object, +-15%.
        gy, gx = np.mgrid[0:bh, 0:bw].astype(np.float32)
        t = rng.uniform(0, 2 * np.pi)
        ramp = (gx - bw / 2) * math.cos(t) + (gy - bh / 2) * math.sin(t)
        fill *= (1.0 + 0.15 * ramp / max(bw, bh, 1))[..., None]
        alpha = cover[..., None]
        region = img[y0:y0 + bh, x0:x0 + bw]
        region[...] = alpha * np.clip(fill, 0, 255) + (1.0 - alpha) * region
        mask[y0:y0 + bh, x0:x0 + bw][cover >= 0.5] = k
    if a.ignore_border:
        edge = np.zeros_like(mask, dtype=bool)
        dy = mask[1:, :] != mask[:-1, :]
        dx = mask[:, 1:] != mask[:, :-1]
        edge[1:, :] |= dy
        edge[:-1, :] |= dy
        edge[:, 1:] |= dx
        edge[:, :-1] |= dx
        mask[edge] = IGNORE
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), mask


def make_pair(index, a):
    """Renders pair `index`, writes it, and returns (image bytes, mask bytes, w, h, counts of
    the mask's values 0..255)."""
    img, mask = render(index, a)
    h, w = mask.shape
    ipath = os.path.join(a.out_dir, "images", f"{index:05d}.jpg")
    mpath = os.path.join(a.out_dir, "masks", f"{index:05d}.png")
    Image.fromarray(img, "RGB").save(ipath, "JPEG", quality=a.quality, subsampling=2,
                                     optimize=False, progressive=False)
    Image.fromarray(mask, "L").save(mpath, "PNG")
    counts = np.bincount(mask.ravel(), minlength=256)
    return os.path.getsize(ipath), os.path.getsize(mpath), w, h, counts


def work(chunk):
    """A worker's share: a list of indices; returns one make_pair result per image."""
    indices, a = chunk
    return [make_pair(i, a) for i in indices]


def check_out_dir(a):
    """Refuses an OUT_DIR that is a file, or not empty without --force (before anything is
    loaded or written)."""
    if os.path.exists(a.out_dir) and not os.path.isdir(a.out_dir):
        sys.exit(f"error: {a.out_dir} exists and is not a directory")
    if os.path.isdir(a.out_dir) and os.listdir(a.out_dir) and not a.force:
        sys.exit(f"error: {a.out_dir} is not empty (use --force to write into it)")


def prepare_out_dir(a):
    """With --force, removes what ImageMaskPairs would index from a previous run
    (images/*.jpg|jpeg|png, masks/*.png), so the folder pairs exactly this run's files; nothing
    else is touched. Then makes images/ and masks/."""
    if os.path.isdir(a.out_dir) and a.force:
        for sub, exts in (("images", (".jpg", ".jpeg", ".png")), ("masks", (".png",))):
            full = os.path.join(a.out_dir, sub)
            if os.path.isdir(full):
                for f in os.listdir(full):
                    path = os.path.join(full, f)
                    if f.lower().endswith(exts) and os.path.isfile(path):
                        os.remove(path)
    for sub in ("images", "masks"):
        os.makedirs(os.path.join(a.out_dir, sub), exist_ok=True)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Make a segmentation folder (OUT_DIR/images/NNNNN.jpg + OUT_DIR/masks/"
                    "NNNNN.png of class ids) of shapes pasted on crops of the sample photos "
                    "bundled with scikit-image and scikit-learn (no network needed). "
                    "Deterministic for a seed.")
    p.add_argument("out_dir", metavar="OUT_DIR", help="output folder (created; must be empty)")
    p.add_argument("--count", type=int, default=2000, help="number of pairs (default 2000)")
    p.add_argument("--classes", type=int, default=6,
                   help="classes including background 0; objects are 1..C-1 (default 6)")
    add_photo_args(p)
    p.add_argument("--ignore-border", action=argparse.BooleanOptionalAction, default=True,
                   help=f"set the pixels on both sides of each class boundary to {IGNORE} "
                        "(VOC's void border; default on)")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty OUT_DIR (a previous run's images/ and masks/ "
                        "files are removed)")
    a = p.parse_args(argv)
    if a.count < 1:
        p.error("--count must be >= 1")
    if not 2 <= a.classes <= IGNORE:
        p.error(f"--classes must be in 2..{IGNORE} (ids 0..C-1 in an 8-bit mask, "
                f"{IGNORE} is the ignore index)")
    check_photo_args(p, a)
    return a


def main(argv=None):
    a = parse_args(argv)
    t0 = time.perf_counter()
    check_out_dir(a)
    sources = load_sources()
    if not sources:
        sys.exit("error: no sample photo loads offline (none from skimage.data nor from "
                 "sklearn.datasets.load_sample_images); install scikit-image or scikit-learn")
    prepare_out_dir(a)
    if len(sources) < 4:
        print(f"note: only {len(sources)} source photo(s); backgrounds and textures will "
              "repeat (install scikit-image and scikit-learn for more)", file=sys.stderr)
    print(f"sources ({len(sources)}): " +
          ", ".join(f"{n} {im.size[0]}x{im.size[1]}" for n, im in sources), flush=True)
    n_chunks = max(1, min(a.count // 16, a.workers * 8))
    chunks = [(list(range(c, a.count, n_chunks)), a) for c in range(n_chunks)]
    step = max(1, n_chunks // 10)

    def progress(done, results):
        if done % step == 0 or done == n_chunks:
            print(f"  {len(results)}/{a.count} pairs, {time.perf_counter() - t0:.1f} s",
                  flush=True)

    results = run_chunks(work, chunks, init_worker, sources, a.workers, progress)
    secs = time.perf_counter() - t0
    isz, msz = [r[0] for r in results], [r[1] for r in results]
    ws, hs = [r[2] for r in results], [r[3] for r in results]
    counts = np.sum([r[4] for r in results], axis=0)
    total = counts.sum()
    print(f"wrote {len(results)} pairs ({a.classes} classes) to {a.out_dir}: images "
          f"{sum(isz) / 1e6:.1f} MB (mean {sum(isz) / len(isz) / 1e3:.0f} kB), masks "
          f"{sum(msz) / 1e6:.2f} MB, width {min(ws)}..{max(ws)}, height {min(hs)}..{max(hs)}, "
          f"quality {a.quality}, {a.workers} workers, {secs:.1f} s")
    names = ["background"] + [FAMILIES[(k - 1) % len(FAMILIES)] for k in range(1, a.classes)]
    share = [f"{k} {names[k]} {100.0 * counts[k] / total:.2f}%" for k in range(a.classes)]
    if a.ignore_border:
        share.append(f"{IGNORE} ignore {100.0 * counts[IGNORE] / total:.2f}%")
    print("pixel share: " + ", ".join(share))
    print(f"train: tandem train --data {a.out_dir} --classes {a.classes} --ignore-index {IGNORE}"
          " --val-split 0.1 --out RUN_DIR")


if __name__ == "__main__":
    main()

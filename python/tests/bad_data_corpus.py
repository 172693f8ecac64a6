"""A corpus of bad (and merely unusual) data folders, one per input, for the test that runs every
front end that reads a data folder over each of them (test_bad_data_corpus.py).

Pure Python (struct, zlib, socket): no PIL, numpy or tandem is needed to write it. Every image is
written here: PNGs chunk by chunk, JPEGs by a small encoder (8x8 DCT, one quantization table,
fixed-length Huffman codes; baseline or progressive, gray, YCbCr or Adobe CMYK, with or without an
EXIF orientation) that any JPEG decoder reads.

    cases = build_corpus(tmp_path)           # {input name: Case}
    cases["fifo"].root, cases["fifo"].token  # the data folder; the name a message must carry

An ImageFolder input is a folder of two classes, a/ (two good photos) and b/ (one good photo and
the input): four samples, so one batch of 4 reads every file (and no batch is left with one
sample, where a ResNet's batch norm fails at a small image size); a pairs input is images/ +
masks/ of four pairs, the last pair's mask the bad one. The table of what each front end makes
of each input is in test_bad_data_corpus.py and docs/bad-data.md.
"""
import dataclasses
import math
import os
import socket
import struct
import zlib
from typing import Callable, Dict, List, Sequence

# ---------------------------------------------------------------------------------------------
# Pixels

Plane = List[List[int]]  # rows of 0..255 samples


def smooth_rgb(width: int, height: int, seed: int = 0) -> List[Plane]:
    """Three smooth, non-constant planes (gradients and a seed-dependent offset)."""
    planes = []
    for c in range(3):
        base = 20 + (c * 23 + seed * 17) % 60
        planes.append([[base + (100 * x // width if c != 1 else 0) +
                        (70 * y // height if c != 2 else 0) for x in range(width)]
                       for y in range(height)])
    return planes


def _ycbcr(rgb: Sequence[Plane]) -> List[Plane]:
    r, g, b = rgb
    h, w = len(r), len(r[0])
    clamp = lambda v: max(0, min(255, int(round(v))))  # noqa: E731
    y = [[clamp(0.299 * r[i][j] + 0.587 * g[i][j] + 0.114 * b[i][j]) for j in range(w)]
         for i in range(h)]
    cb = [[clamp(-0.168736 * r[i][j] - 0.331264 * g[i][j] + 0.5 * b[i][j] + 128)
           for j in range(w)] for i in range(h)]
    cr = [[clamp(0.5 * r[i][j] - 0.418688 * g[i][j] - 0.081312 * b[i][j] + 128)
           for j in range(w)] for i in range(h)]
    return [y, cb, cr]


# ---------------------------------------------------------------------------------------------
# PNG

def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, rows: Sequence[bytes], color_type: int, bit_depth: int = 8,
        palette: bytes = b"", trns: bytes = b"") -> bytes:
    """A PNG of `rows` (each row's samples as PNG stores them, big-endian for 16 bits).
    color_type: 0 gray, 2 RGB, 3 palette, 4 gray + alpha, 6 RGBA."""
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height,
                                                             bit_depth, color_type, 0, 0, 0))
    if palette:
        out += _chunk(b"PLTE", palette)
    if trns:
        out += _chunk(b"tRNS", trns)
    out += _chunk(b"IDAT", zlib.compress(b"".join(b"\x00" + bytes(r) for r in rows)))
    return out + _chunk(b"IEND", b"")


def png_rgb(planes: Sequence[Plane]) -> bytes:
    h, w = len(planes[0]), len(planes[0][0])
    rows = [bytes(planes[c][y][x] for x in range(w) for c in range(3)) for y in range(h)]
    return png(w, h, rows, 2)


def png_gray(plane: Plane) -> bytes:
    return png(len(plane[0]), len(plane), [bytes(r) for r in plane], 0)


def png16_gray(width: int, height: int) -> bytes:
    """16-bit gray: sample (y, x) = 0x1000 * ((x + y) % 16) + 0x0ABC (high bytes 0x00..0xF0)."""
    rows = [b"".join(struct.pack(">H", 0x1000 * ((x + y) % 16) + 0x0ABC) for x in range(width))
            for y in range(height)]
    return png(width, height, rows, 0, 16)


def png16_rgb(width: int, height: int) -> bytes:
    """16-bit RGB: red 0x8001, green 0x40FF, blue 0xC080 everywhere (high bytes 128, 64, 192)."""
    row = struct.pack(">HHH", 0x8001, 0x40FF, 0xC080) * width
    return png(width, height, [row] * height, 2, 16)


def png_palette_alpha(width: int, height: int) -> bytes:
    """8-bit palette of four colours, the first transparent, the second half transparent."""
    palette = bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 200, 200, 200])
    rows = [bytes((x // 8 + y // 8) % 4 for x in range(width)) for y in range(height)]
    return png(width, height, rows, 3, palette=palette, trns=bytes([0, 128]))


# ---------------------------------------------------------------------------------------------
# JPEG

_ZIGZAG = sorted(((r, c) for r in range(8) for c in range(8)),
                 key=lambda p: (p[0] + p[1], p[0] if (p[0] + p[1]) % 2 else -p[0]))
_LUMA_Q = [16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
           14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
           18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
           49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99]
_DCT = [[(math.sqrt(1 / 8) if u == 0 else 0.5) * math.cos((2 * x + 1) * u * math.pi / 16)
         for x in range(8)] for u in range(8)]
# Fixed-length Huffman codes cover every symbol: 12 DC sizes in 4 bits, the 162 AC symbols
# (EOB, ZRL, run 0-15 x size 1-10) in 8 bits; none is all ones.
_DC_SYMBOLS = list(range(12))
_AC_SYMBOLS = [0x00, 0xF0] + [(run << 4) | size for run in range(16) for size in range(1, 11)]


def _marker(code: int, payload: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, code, len(payload) + 2) + payload


class _Bits:
    def __init__(self):
        self.out, self.acc, self.n = bytearray(), 0, 0

    def put(self, value: int, length: int):
        self.acc, self.n = (self.acc << length) | (value & ((1 << length) - 1)), self.n + length
        while self.n >= 8:
            self.n -= 8
            byte = (self.acc >> self.n) & 0xFF
            self.out.append(byte)
            if byte == 0xFF:
                self.out.append(0)  # byte stuffing
        self.acc &= (1 << self.n) - 1

    def flush(self) -> bytes:
        if self.n:
            self.put((1 << (8 - self.n)) - 1, 8 - self.n)  # pad with ones
        return bytes(self.out)


def _huffman_table(table_class: int, table_id: int, symbols: Sequence[int], length: int) -> bytes:
    counts = [0] * 16
    counts[length - 1] = len(symbols)
    return bytes([(table_class << 4) | table_id] + counts + list(symbols))


def _size(v: int) -> int:
    return abs(v).bit_length()


def _amplitude(v: int, size: int) -> int:
    return v if v >= 0 else v + (1 << size) - 1


def _blocks(plane: Plane, quant: Sequence[int]) -> List[List[int]]:
    """The plane's 8x8 blocks in raster order (edges replicated), each as 64 quantized DCT
    coefficients in zigzag order."""
    h, w = len(plane), len(plane[0])
    out = []
    for by in range(0, h, 8):
        for bx in range(0, w, 8):
            f = [[plane[min(by + y, h - 1)][min(bx + x, w - 1)] - 128 for x in range(8)]
                 for y in range(8)]
            rows = [[sum(_DCT[v][x] * f[y][x] for x in range(8)) for v in range(8)]
                    for y in range(8)]
            coef = [[sum(_DCT[u][y] * rows[y][v] for y in range(8)) for v in range(8)]
                    for u in range(8)]
            out.append([int(round(coef[r][c] / quant[k])) for k, (r, c) in enumerate(_ZIGZAG)])
    return out


def _code_dc(bits: _Bits, diff: int):
    s = _size(diff)
    bits.put(_DC_SYMBOLS.index(s), 4)
    if s:
        bits.put(_amplitude(diff, s), s)


def _code_ac(bits: _Bits, block: Sequence[int]):
    run = 0
    for k in range(1, 64):
        v = block[k]
        if v == 0:
            run += 1
            continue
        while run > 15:
            bits.put(_AC_SYMBOLS.index(0xF0), 8)
            run -= 16
        s = _size(v)
        bits.put(_AC_SYMBOLS.index((run << 4) | s), 8)
        bits.put(_amplitude(v, s), s)
        run = 0
    if run:
        bits.put(_AC_SYMBOLS.index(0x00), 8)  # EOB (in a progressive scan EOB0: a run of one)


def jpeg(planes: Sequence[Plane], *, colorspace: str = "ycbcr", progressive: bool = False,
         quality: int = 90, exif_orientation: int = 0) -> bytes:
    """A JPEG of `planes` (1 gray plane, 3 RGB planes, or 4 CMYK planes of ink 0..255), every
    component at full resolution. colorspace: "gray", "ycbcr" (RGB stored as YCbCr, JFIF) or
    "cmyk" (stored inverted, with Adobe's APP14 marker, as Photoshop writes it). Progressive:
    one DC scan of every component, then one AC scan per component (spectral selection)."""
    if colorspace == "ycbcr":
        stored = _ycbcr(planes)
    elif colorspace == "cmyk":
        stored = [[[255 - v for v in row] for row in p] for p in planes]
    else:
        stored = list(planes)
    h, w = len(stored[0]), len(stored[0][0])
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    quant = [max(1, min(255, (q * scale + 50) // 100)) for q in _LUMA_Q]
    quant_zz = [quant[r * 8 + c] for r, c in _ZIGZAG]
    blocks = [_blocks(p, quant_zz) for p in stored]
    ids = list(range(1, len(stored) + 1))

    out = b"\xFF\xD8"
    if exif_orientation:
        tiff = b"II*\x00" + struct.pack("<IH", 8, 1)
        tiff += struct.pack("<HHIHH", 0x0112, 3, 1, exif_orientation, 0) + struct.pack("<I", 0)
        out += _marker(0xE1, b"Exif\x00\x00" + tiff)
    elif colorspace != "cmyk":
        out += _marker(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    if colorspace == "cmyk":
        out += _marker(0xEE, b"Adobe" + struct.pack(">HHHB", 100, 0, 0, 0))
    out += _marker(0xDB, bytes([0]) + bytes(quant_zz))
    frame = struct.pack(">BHHB", 8, h, w, len(stored))
    for i in ids:
        frame += bytes([i, 0x11, 0])
    out += _marker(0xC2 if progressive else 0xC0, frame)
    out += _marker(0xC4, _huffman_table(0, 0, _DC_SYMBOLS, 4) +
                   _huffman_table(1, 0, _AC_SYMBOLS, 8))

    def scan(components, ss, se, code_block):
        header = bytes([len(components)])
        for i in components:
            header += bytes([i, 0x00])
        bits = _Bits()
        code_block(bits)
        return _marker(0xDA, header + bytes([ss, se, 0])) + bits.flush()

    n = len(blocks[0])
    if not progressive:
        def all_blocks(bits):
            prev = [0] * len(stored)
            for k in range(n):
                for c in range(len(stored)):
                    b = blocks[c][k]
                    _code_dc(bits, b[0] - prev[c])
                    prev[c] = b[0]
                    _code_ac(bits, b)
        out += scan(ids, 0, 63, all_blocks)
    else:
        def dc_only(bits):
            prev = [0] * len(stored)
            for k in range(n):
                for c in range(len(stored)):
                    _code_dc(bits, blocks[c][k][0] - prev[c])
                    prev[c] = blocks[c][k][0]
        out += scan(ids, 0, 0, dc_only)
        for c in range(len(stored)):
            out += scan([ids[c]], 1, 63, lambda bits, c=c: [_code_ac(bits, b) for b in blocks[c]])
    return out + b"\xFF\xD9"


def flat_gray_jpeg(width: int, height: int) -> bytes:
    """A mid-gray baseline JPEG of any size up to 65535 a side, written without encoding a block:
    one-symbol Huffman tables make every block (DC difference 0, then EOB) two zero bits, so a
    20000 x 20000 photo is 1.5 MB of zeros."""
    out = b"\xFF\xD8" + _marker(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    out += _marker(0xDB, bytes([0]) + bytes([1] * 64))
    out += _marker(0xC0, struct.pack(">BHHB", 8, height, width, 1) + bytes([1, 0x11, 0]))
    out += _marker(0xC4, _huffman_table(0, 0, [0], 1) + _huffman_table(1, 0, [0x00], 1))
    out += _marker(0xDA, bytes([1, 1, 0x00, 0, 63, 0]))
    bits = math.ceil(width / 8) * math.ceil(height / 8) * 2
    return out + b"\x00" * (bits // 8) + (b"\x3F" if bits % 8 else b"") + b"\xFF\xD9"


# ---------------------------------------------------------------------------------------------
# The corpus

W, H = 48, 40  # the good photos' size (not square: a rotation would show)


@dataclasses.dataclass
class Case:
    """One input's data folder. token: what a message about it must name (a file's or folder's
    name). pairs: an images/ + masks/ folder (else an ImageFolder). batch_size: the batch the
    front ends use (every file read in one epoch)."""
    name: str
    root: str
    token: str
    pairs: bool = False
    batch_size: int = 4


_CACHE: Dict[str, bytes] = {}


def _cached(key: str, make: Callable[[], bytes]) -> bytes:
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def good_jpeg(seed: int) -> bytes:
    return _cached(f"good{seed}", lambda: jpeg(smooth_rgb(W, H, seed)))


def _write(path: str, data: bytes):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _image_folder(root: str):
    """a/a0.jpg, a/a1.jpg, b/b0.jpg: the good photos of every ImageFolder input."""
    _write(os.path.join(root, "a", "a0.jpg"), good_jpeg(0))
    _write(os.path.join(root, "a", "a1.jpg"), good_jpeg(1))
    _write(os.path.join(root, "b", "b0.jpg"), good_jpeg(2))


def _fifo(path):
    os.mkfifo(path)


def _socket(path):
    """A bound AF_UNIX socket's file (a name of at most 107 bytes: bound relative to its
    folder, which build_corpus enters for the moment, before any thread of the test runs)."""
    here = os.getcwd()
    os.chdir(os.path.dirname(path))
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(os.path.basename(path))
        s.close()  # the file stays
    finally:
        os.chdir(here)


def _cut(data: bytes, fraction: float) -> bytes:
    return data[: int(len(data) * fraction)]


def _mask(width: int, height: int) -> bytes:
    return png_gray([[(x // 8 + y // 8) % 2 for x in range(width)] for y in range(height)])


# name -> (file under b/ holding the input, the bytes or a maker of it). The file's name is the
# token a message must carry.
_FILE_INPUTS = {
    "fifo": ("fifo.jpg", _fifo),
    "socket": ("socket.jpg", _socket),
    "dangling_symlink": ("dangling.jpg", lambda p: os.symlink("nowhere.jpg", p)),
    "symlink_loop_file": ("loop.jpg", lambda p: os.symlink("loop.jpg", p)),
    "folder_named_jpg": ("x.jpg", lambda p: os.mkdir(p)),
    "empty_jpg": ("empty.jpg", lambda p: _write(p, b"")),
    "text_as_jpg": ("text.jpg", lambda p: _write(p, b"this is not an image\n" * 4)),
    "truncated_baseline": ("cut_baseline.jpg", lambda p: _write(p, _cut(good_jpeg(3), 0.6))),
    "truncated_progressive": ("cut_progressive.jpg", lambda p: _write(p, _cut(
        _cached("prog", lambda: jpeg(smooth_rgb(W, H, 4), progressive=True)), 0.8))),
    "huge_20000": ("huge_20000.jpg", lambda p: _write(p, _cached(
        "huge", lambda: flat_gray_jpeg(20000, 20000)))),
    "cmyk_jpeg": ("cmyk.jpg", lambda p: _write(p, _cached("cmyk", lambda: jpeg(
        [[[255 - v for v in row] for row in plane] for plane in smooth_rgb(W, H, 5)] +
        [[[0] * W for _ in range(H)]], colorspace="cmyk")))),
    "gray_jpeg": ("gray.jpg", lambda p: _write(p, jpeg(smooth_rgb(W, H, 6)[:1],
                                                       colorspace="gray"))),
    "progressive_jpeg": ("progressive.jpg", lambda p: _write(p, _cached(
        "prog", lambda: jpeg(smooth_rgb(W, H, 4), progressive=True)))),
    "png16_gray": ("deep16_gray.png", lambda p: _write(p, png16_gray(W, H))),
    "png16_rgb": ("deep16_rgb.png", lambda p: _write(p, png16_rgb(W, H))),
    "palette_alpha_png": ("palette_alpha.png", lambda p: _write(p, png_palette_alpha(W, H))),
    "png_named_jpg": ("png_inside.jpg", lambda p: _write(p, png_rgb(smooth_rgb(W, H, 7)))),
    "exif_rotated": ("exif_rotated.jpg", lambda p: _write(p, jpeg(smooth_rgb(W, H, 8),
                                                                  exif_orientation=6))),
    "webp_file": ("photo.webp", lambda p: _write(p, b"RIFF\x16\x00\x00\x00WEBPVP8 " + bytes(14))),
}


def _upper_case(root):
    _write(os.path.join(root, "a", "a0.jpg"), good_jpeg(0))
    _write(os.path.join(root, "a", "UPPER.PNG"), png_rgb(smooth_rgb(W, H, 9)))
    _write(os.path.join(root, "b", "b0.jpg"), good_jpeg(2))
    _write(os.path.join(root, "b", "UPPER.JPG"), good_jpeg(3))


def _symlink_loop_folder(root):
    _image_folder(root)
    _write(os.path.join(root, "b", "b1.jpg"), good_jpeg(3))
    os.symlink("..", os.path.join(root, "b", "loop"))  # b/loop -> the root: a cycle


def _empty_class(root):
    _image_folder(root)
    _write(os.path.join(root, "b", "b1.jpg"), good_jpeg(3))
    os.makedirs(os.path.join(root, "empty_class"))


def _single_image(root):
    _write(os.path.join(root, "only", "one.jpg"), good_jpeg(0))


def _pairs(root, bad_mask):
    for i, stem in enumerate(["p0", "p1", "p2", "bad_mask"]):
        _write(os.path.join(root, "images", stem + ".jpg"), good_jpeg(i))
        mask = bad_mask if stem == "bad_mask" else _mask(W, H)
        if mask is not None:
            _write(os.path.join(root, "masks", stem + ".png"), mask)


# name -> (maker of the folder, token, pairs, batch size)
_FOLDER_INPUTS = {
    "uppercase_ext": (_upper_case, "UPPER", False, 4),
    "symlink_loop_folder": (_symlink_loop_folder, os.path.join("b", "loop"), False, 4),
    "empty_class": (_empty_class, "empty_class", False, 4),
    "single_image_batch_64": (_single_image, "batch of 64", False, 64),  # no file to name
    "mask_other_size": (lambda r: _pairs(r, _mask(W // 2, H // 2)), "bad_mask.png", True, 4),
    "mask_rgb": (lambda r: _pairs(r, png_rgb(smooth_rgb(W, H, 1))), "bad_mask.png", True, 4),
    "mask_missing": (lambda r: _pairs(r, None), "bad_mask", True, 4),
    # Good pairs, where an ImageFolder is read: two classes, "images" and "masks", unless refused.
    "pairs_folder": (lambda r: _pairs(r, _mask(W, H)), "images/ and masks/", True, 4),
}

# Inputs that are no sample of the ImageFolder (a folder, a kind tandem does not read): their
# folder gets a fourth good photo.
_NOT_A_SAMPLE = ("folder_named_jpg", "webp_file")

INPUTS = tuple(_FILE_INPUTS) + tuple(_FOLDER_INPUTS)


def build(root: str, name: str) -> Case:
    """Writes input `name`'s data folder at root/name."""
    folder = os.path.join(os.fspath(root), name)
    if name in _FILE_INPUTS:
        file, make = _FILE_INPUTS[name]
        _image_folder(folder)
        make(os.path.join(folder, "b", file))
        if name in _NOT_A_SAMPLE:  # four samples all the same
            _write(os.path.join(folder, "b", "b1.jpg"), good_jpeg(3))
        return Case(name, folder, file)
    make, token, pairs, batch_size = _FOLDER_INPUTS[name]
    make(folder)
    return Case(name, folder, token, pairs, batch_size)


def build_corpus(root: str, names: Sequence[str] = INPUTS) -> Dict[str, Case]:
    """Every input's data folder under root: {name: Case}."""
    return {name: build(root, name) for name in names}

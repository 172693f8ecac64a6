"""tandem.data: tandem's datasets and its C++ loader as a Python iterable of batches.

    ds = tandem.data.ImageFolder("photos/", image_size=224)  # or Idx, ImageMaskPairs, Random,
                                                             # TorchDataset(your_dataset)
    loader = tandem.data.Loader(ds, batch_size=256, workers=8, shuffle=True, device="cuda")
    for batch in loader:                                           # a new order each pass
        x, y = batch["image"], batch["label"]                       # (B, 3, 224, 224) uint8, (B,)

Worker threads in C++ decode and fill pinned host slots ahead of the loop (no Python, no GIL,
no processes); with a CUDA `device` each batch is copied on the current stream and its slot is
refilled only after the copy. The order is PyTorch's: with `shuffle`, torch.randperm seeded
`seed + epoch` (DistributedSampler's), so a tandem loop and a PyTorch loop see the same batches.
"""
import ctypes
import math
import os
from typing import Iterator, Optional

import torch

from . import _C
from ._checks import rank_shard, whole

class Dataset(_C.Dataset):
    """A dataset tandem's C++ loader reads (its workers fill pinned host slots): len() and
    ``fields``, each (name, shape, dtype) or variable-size. Make one with the classes below."""


class ImageFolder(Dataset):
    """One subfolder of JPEG/PNG files per class (torchvision's ImageFolder order and labels);
    each image decoded (DCT-scaled where it can) then Resize + CenterCrop to image_size.
    Fields: image (C, S, S) uint8, label () int64."""

    def __init__(self, root: str, image_size: int = 224, channels: int = 3):
        super().__init__(_C.image_folder(root, image_size, channels))
        self.source = os.fspath(root)  # what a run folder's resume checks (by content)


class ImageMaskPairs(Dataset):
    """root/images/* and root/masks/*.png paired by file stem; masks of class ids.
    Fields: image (3, S, S) uint8, mask (S, S) int64."""

    def __init__(self, root: str, classes: int, image_size: int = 512, ignore_index: int = 255):
        super().__init__(_C.image_mask_pairs(root, classes, image_size, ignore_index))
        self.source = os.fspath(root)


class Idx(Dataset):
    """MNIST's IDX files (gzip or raw). Fields: image (1, rows, cols) uint8, label () int64."""

    def __init__(self, images: str, labels: str):
        super().__init__(_C.idx(images, labels))
        self.source = os.fspath(images)


def decode_image(data, channels: int = 3, min_size: int = 0, layout: str = "CHW") -> torch.Tensor:
    """Decodes one JPEG or PNG as tandem's loader workers do, on this thread with the GIL
    released, into a uint8 CPU tensor: (C, H, W), or (H, W, C) with layout="HWC" (the JPEG
    decoder's own order, no transposition).

    data: the file's bytes (bytes, bytearray, memoryview, a 1-D uint8 CPU tensor) or its
    path. channels: 3 (RGB) or 1 (gray); gray, CMYK, palette, 16-bit and alpha images are
    converted. min_size > 0: a JPEG
    decodes at the smallest DCT scale of 1/2, 1/4, 1/8 whose sides both stay >= min_size, with
    the fast IDCT and upsampling (for an image about to be resized); otherwise at full size,
    libjpeg's accurate decode. A file that is not an image, or is truncated or corrupt, raises
    RuntimeError naming it."""
    if layout not in ("CHW", "HWC"):
        raise ValueError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
    if isinstance(data, (str, os.PathLike)):
        name = os.fspath(data)
        with open(name, "rb") as f:
            data = f.read()
    elif isinstance(data, torch.Tensor):  # e.g. torchvision.io.read_file's
        if data.dtype != torch.uint8 or data.dim() != 1 or data.device.type != "cpu":
            raise ValueError("decode_image: a tensor of the file's bytes must be 1-D uint8 on "
                             f"the CPU, got {data.dtype} of shape {tuple(data.shape)} on "
                             f"{data.device}")
        data = data.contiguous()
        name, data = "<tensor>", ctypes.string_at(data.data_ptr(), data.numel())  # no numpy
    else:
        name = "<bytes>"
        if not isinstance(data, bytes):
            data = bytes(data)
    return _C.decode_image(data, channels, min_size, layout == "HWC", name)


def encode_image(image: torch.Tensor, format: str = "jpeg", quality: int = 90) -> bytes:
    """A (C, H, W) uint8 CPU tensor, C = 1 or 3, as the bytes of a baseline JPEG (4:2:0 chroma,
    `quality` 1..100) or of a PNG (lossless): TurboJPEG's and libpng's encoders."""
    if format not in ("jpeg", "png"):
        raise ValueError(f"format must be 'jpeg' or 'png', got {format!r}")
    return _C.encode_image(image, format, quality)


class TorchDataset(Dataset):
    """Your own map-style dataset (``len(dataset)`` and ``dataset[i]``, e.g. a
    torch.utils.data.Dataset) for the C++ loader and tandem.Trainer. A sample is a tensor (or
    anything torch.as_tensor takes), a tuple of them (fields "input", "target" for a pair) or a
    dict (its keys); ``fields`` renames them. Every sample needs sample 0's shapes and dtypes,
    on the CPU. The loader's threads call ``__getitem__`` under the GIL, one at a time: fine for
    cheap items; for decoding files, tandem.data.ImageFolder & co. decode in C++ in parallel."""

    def __init__(self, dataset, fields=None):
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError(f"{type(dataset).__name__} is not a map-style dataset: expected "
                            "__len__ and __getitem__ (an IterableDataset cannot be indexed)")
        super().__init__(_C.python_dataset(dataset, list(fields or [])))
        self.source = f"{type(dataset).__qualname__} of {len(dataset)} samples"


_DTYPES = (torch.uint8, torch.int32, torch.int64, torch.float32)  # RandomDataset's


class Random(Dataset):
    """Synthetic samples: each field's values uniform at random, sample i a pure function of
    (seed, i). A field is ``name=(shape, dtype)`` or ``(shape, dtype, high)`` or
    ``(shape, dtype, low, high)``: values in [low, high); uint8 defaults to [0, 256), float32 to
    [0, 1), and integer fields need a high. dtype: torch.uint8, int32, int64 or float32.

        tandem.data.Random(100_000, image=((3, 256, 256), torch.uint8),
                           label=((), torch.int64, 10))"""

    def __init__(self, size: int, seed: int = 0, **fields):
        if size < 1:
            raise ValueError(f"size {size} is not valid: expected >= 1 samples")
        if not fields:
            raise ValueError("tandem.data.Random needs at least one field, e.g. "
                             "image=((3, 224, 224), torch.uint8)")
        specs = []
        for name, spec in fields.items():
            if not isinstance(spec, (tuple, list)) or not 2 <= len(spec) <= 4:
                raise ValueError(f"field {name}={spec!r} is not valid: expected (shape, dtype), "
                                 "(shape, dtype, high) or (shape, dtype, low, high)")
            shape, dtype, *bounds = spec
            if dtype not in _DTYPES:
                raise ValueError(f"field {name} has dtype {dtype}: expected torch.uint8, "
                                 "torch.int32, torch.int64 or torch.float32")
            if len(bounds) == 2:
                low, high = bounds
            elif len(bounds) == 1:
                low, high = 0, bounds[0]
            elif dtype == torch.uint8:
                low, high = 0, 256
            elif dtype == torch.float32:
                low, high = 0.0, 1.0
            else:
                raise ValueError(f"field {name} is {dtype}: give its range, "
                                 f"e.g. {name}=({tuple(shape)}, {dtype}, 10) for values 0..9")
            specs.append((name, [int(d) for d in shape], dtype, float(low), float(high)))
        super().__init__(_C.random_dataset(specs, int(size), int(seed)))
        self.source = f"tandem.data.Random of {size} samples, seed {seed}, fields {fields!r}"


class Loader:
    """Batches of `dataset` from C++ worker threads, as dicts of tensors (every field, plus
    "indices": the dataset indices of the batch's samples). With ``rank`` / ``world_size``
    (e.g. ``tandem.distributed.rank()`` / ``world_size()`` in your own DDP loop): this rank's
    shard, as torch.utils.data.DistributedSampler(num_replicas=world_size, rank=rank,
    shuffle=shuffle, seed=seed) gives it — every world_size-th index of the epoch's order, the
    order padded from its start so every rank gets as many. ``worker_nice`` (0 to 19) runs the
    worker threads at that nice value, below your training loop's thread, which then gets a core
    first when the workers decode on every core (0: the process's priority)."""

    def __init__(self, dataset: Dataset, batch_size: int, *, workers: int = 4,
                 shuffle: bool = False, seed: int = 0, drop_last: bool = True,
                 device: Optional[str] = None, skip_bad: bool = False, depth: int = 0,
                 rank: int = 0, world_size: int = 1, worker_nice: int = 0):
        batch_size, workers = whole("batch_size", batch_size, 1), whole("workers", workers, 1)
        depth, seed = whole("depth", depth, 0), whole("seed", seed, 0)
        if not 0 <= whole("worker_nice", worker_nice, 0) <= 19:
            raise ValueError(f"worker_nice {worker_nice} is not valid: expected 0 to 19 (0: the "
                             "process's priority)")
        rank, world_size = whole("rank", rank, 0), whole("world_size", world_size, 1)
        if not rank < world_size:
            raise ValueError(f"rank {rank} of world_size {world_size} is not valid: expected "
                             "world_size >= 1 and 0 <= rank < world_size")
        self.rank, self.world_size = rank, world_size
        self.dataset, self.batch_size, self.workers = dataset, batch_size, workers
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.device, self.skip_bad, self.depth = device, skip_bad, depth
        self.worker_nice = int(worker_nice)
        self.epoch = 0
        self._last = None
        rank_shard(len(dataset), self.world_size, batch_size, drop_last)  # no empty passes

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass shuffles for (each pass advances it by one)."""
        self.epoch = epoch

    def __len__(self) -> int:
        n = math.ceil(len(self.dataset) / self.world_size)  # this rank's shard
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[dict]:
        self._last = _C.epoch(self.dataset, self.batch_size, self.workers, self.depth,
                              self.shuffle, self.seed, self.epoch, self.drop_last, self.skip_bad,
                              self.device, self.rank, self.world_size, self.worker_nice)
        self.epoch += 1
        return iter(self._last)

    def skipped(self):
        """(index, reason) of each sample the last pass left out (skip_bad)."""
        return self._last.skipped() if self._last is not None else []

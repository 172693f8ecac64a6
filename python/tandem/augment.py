"""tandem.augment: crop, resize, rotate, blur, normalize and flip a uint8 batch in one kernel."""
import dataclasses
from typing import Optional, Tuple

import torch

from . import _C

_DEFAULTS = _C.augment_spec_defaults()  # tandem::AugmentSpec's, so the two never drift


@dataclasses.dataclass(frozen=True)
class AugmentSpec:
    """What tandem.augment does to each sample (tandem::AugmentSpec in C++).

    crop: (h, w) of a random crop inside the source; out: (h, w) it is resized to (rotation keeps
    the size); max_rotation_deg: angle uniform in [-max, max]; blur_kernel: odd, 1 for no blur,
    with sigma uniform in [sigma_min, sigma_max]; mean / std: per channel, in pixel units 0..255
    (ImageNet's 0.485 is 123.7 here), out = (pixel - mean) / std; hflip_probability: mirror the
    output with this probability. Parameters are drawn per sample on the batch's device.
    """
    crop: Tuple[int, int] = tuple(_DEFAULTS["crop"])
    out: Tuple[int, int] = tuple(_DEFAULTS["out"])
    max_rotation_deg: float = _DEFAULTS["max_rotation_deg"]
    blur_kernel: int = _DEFAULTS["blur_kernel"]
    sigma_min: float = _DEFAULTS["sigma_min"]
    sigma_max: float = _DEFAULTS["sigma_max"]
    mean: Tuple[float, ...] = tuple(_DEFAULTS["mean"])
    std: Tuple[float, ...] = tuple(_DEFAULTS["std"])
    hflip_probability: float = _DEFAULTS["hflip_probability"]


def augment(batch: torch.Tensor, spec: Optional[AugmentSpec] = None,
            generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Augments `batch` (B, C, H, W) uint8 into a new (B, C, out_h, out_w) float32 tensor.

    On CUDA: one fused kernel on the current stream, the per-sample parameters drawn by one
    kernel from `generator` (a CUDA generator, or the device's default) — capturable into a CUDA
    graph. On the CPU: tandem's C++ reference, which computes the same function.
    """
    s = spec if spec is not None else AugmentSpec()
    return torch.ops.tandem.augment(
        batch, list(s.crop), list(s.out), float(s.max_rotation_deg), int(s.blur_kernel),
        float(s.sigma_min), float(s.sigma_max), [float(m) for m in s.mean],
        [float(d) for d in s.std], float(s.hflip_probability), generator)

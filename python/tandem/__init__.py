"""tandem: overlap the parts of a GPU training step on CUDA streams, capture it into CUDA graphs.

This package is tandem's C++ library seen from Python: ``tandem.Trainer``, which runs your
own modules on tandem's lanes and CUDA graphs (every mode computes the plain loop's losses);
the fused GPU augmentation as a torch operator, ``tandem.augment``, which torch.compile traces
through; ``tandem.data``: tandem's datasets and C++ loader as an iterable of batches for any
PyTorch loop; ``tandem.optim``: optimizers that CUDA graphs can capture;
``tandem.distributed``: the same Trainer as one rank of a torchrun job (many GPUs).

    import torch, tandem
    spec = tandem.AugmentSpec(crop=(192, 192), out=(224, 224), max_rotation_deg=15,
                              blur_kernel=3, mean=(123.7, 116.3, 103.5), std=(58.4, 57.1, 57.4),
                              hflip_probability=0.5)
    x = tandem.augment(batch_uint8_on_gpu, spec)      # (B, 3, 224, 224) float32
"""
import torch  # first: the extension links the torch this Python runs

from . import _C  # registers torch.ops.tandem.*
from . import data, distributed, optim
from .augment import AugmentSpec, augment
from .trainer import FitResult, Trainer

__all__ = ["AugmentSpec", "FitResult", "Trainer", "augment", "data", "distributed", "optim"]
__version__ = "0.1.0"

"""tandem.optim: tandem's optimizers, capturable into CUDA graphs.

Their learning rate, step count and moments live on the device, so a training step captured
into a CUDA graph applies at every replay what an eager step would, and ``set_lr`` between
replays takes effect (torch.optim's SGD bakes its float lr into a captured graph). Same update
rules and defaults as torch.optim.SGD / Adam / AdamW; one parameter group each.

    opt = tandem.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    tandem.Trainer(model, loss_fn, opt, data, mode="graphed").fit(epochs=10)
"""
import copy
from typing import Iterable, Tuple

import torch

from . import _C


def _check_lr(lr) -> None:
    if not lr >= 0:
        raise ValueError(f"learning rate {lr} is not valid: expected >= 0")


def _param_list(params, who: str):
    params = list(params)
    if not params:
        raise ValueError(f"{who} got no parameters: expected model.parameters() of a model "
                         "with trainable parameters")
    for p in params:
        if isinstance(p, dict):
            raise ValueError(f"{who} takes one group of parameters, not param-group dicts: "
                             "pass model.parameters(), or use a torch.optim optimizer with "
                             "capturable=True for several groups")
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{who} got a {type(p).__name__} among its parameters: "
                            "expected torch.Tensor")
    return params


class _TandemOptimizer:
    _impl: _C.Optimizer

    def __init__(self, params, options: dict):
        _check_lr(options["lr"])
        self._params = _param_list(params, type(self).__name__)
        self._options = options
        self._impl = self._make(self._params, **options)

    def step(self) -> None:
        """One update, on the current CUDA stream; no host synchronization."""
        self._impl.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Sets every gradient to None (tandem's optimizers always do: no zeroing kernels)."""
        self._impl.zero_grad()

    def set_lr(self, lr: float) -> None:
        """Enqueues a new learning rate on the current stream: later steps and graph replays on
        that stream use it. Call it between replays, not inside a captured step."""
        _check_lr(lr)
        self._impl.set_lr(float(lr))

    @property
    def lr(self) -> torch.Tensor:
        """The learning rate: a 0-dim float32 tensor on the parameters' device."""
        return self._impl.lr

    @property
    def param_groups(self):
        """torch.optim's view of the one group (read-only)."""
        return [dict(params=self._params, **self._options)]

    def __deepcopy__(self, memo):
        # A fresh optimizer over the copies of the parameters (memo maps them when the model is
        # copied in the same deepcopy call, as tandem.Trainer's trials do).
        return type(self)(copy.deepcopy(self._params, memo), **self._options)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self._options.items())
        return f"tandem.optim.{type(self).__name__}({args})"


class SGD(_TandemOptimizer):
    """torch.optim.SGD's update (momentum, dampening, Nesterov, weight decay), one fused kernel."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      nesterov=nesterov, weight_decay=weight_decay))

    @staticmethod
    def _make(params, lr, momentum, dampening, nesterov, weight_decay):
        return _C.Sgd(params, lr, momentum, dampening, nesterov, weight_decay)


class Adam(_TandemOptimizer):
    """torch.optim.Adam's update; all state on the device."""
    _decoupled = False

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))

    @classmethod
    def _make(cls, params, lr, betas, eps, weight_decay):
        return _C.Adam(params, lr, betas[0], betas[1], eps, weight_decay, cls._decoupled)


class AdamW(Adam):
    """torch.optim.AdamW's update (decoupled weight decay, default 1e-2)."""
    _decoupled = True

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, lr, betas, eps, weight_decay)

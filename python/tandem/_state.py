"""The Trainer's state as tandem's C++ reads and writes it (python_workload.cpp,
train_bindings.cpp: `state_py`): the optimizer's learning rate, the modules' and optimizer's
state as named tensors for a run folder's checkpoints; and what the captured CUDA graphs read —
every tensor's place and every flag and hyper-parameter — which decides whether a later fit may
replay the graphs an earlier one captured."""
import json
from typing import List

import torch

from .optim import _TandemOptimizer


def _load_optimizer_state_dict(optimizer, state):
    """optimizer.load_state_dict(state), a tensor learning rate keeping its identity (a CUDA
    graph may hold it)."""
    old_lrs = [g["lr"] for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for g, old in zip(optimizer.param_groups, old_lrs):
        if isinstance(old, torch.Tensor):
            with torch.no_grad():
                old.copy_(g["lr"] if isinstance(g["lr"], torch.Tensor) else torch.tensor(g["lr"]))
            g["lr"] = old


def _tensors_of(objects) -> List[torch.Tensor]:
    """Every parameter and buffer of the modules in `objects` (for the trials' safety check)."""
    out = []
    for o in objects:
        if isinstance(o, torch.nn.Module):
            out += list(o.parameters()) + list(o.buffers())
    return out


def _tensor_place(t) -> tuple:
    """Where a graph reads `t` from, and what it was captured for."""
    return (t.data_ptr(), tuple(t.shape), t.dtype, t.requires_grad)


def _value_place(v):
    return _tensor_place(v) if isinstance(v, torch.Tensor) else v


def _captured_state(objects, optimizer) -> list:
    """What a captured CUDA graph of these modules and this optimizer was recorded against: each
    module's train/eval flags, each parameter's and buffer's tensor, each optimizer param
    group's hyper-parameters (a float lr is baked into the graph) and each state tensor. Equal
    before and after a change made in place (an optimizer step, load_state_dict into a module);
    different after a tensor is replaced (``module.weight = Parameter(...)``,
    ``optimizer.load_state_dict``), a flag flipped or a float hyper-parameter set."""
    out = []
    for o in objects:
        if isinstance(o, torch.nn.Module):
            out.append([m.training for m in o.modules()])
            out.append([(n, _tensor_place(t)) for n, t in o.named_parameters()])
            out.append([(n, _tensor_place(t)) for n, t in o.named_buffers()])
    if not isinstance(optimizer, _TandemOptimizer):  # tandem's: state in C++, a device lr
        for g in optimizer.param_groups:
            out.append([(k, _value_place(v)) for k, v in g.items() if k != "params"])
            out.append([id(p) for p in g["params"]])
        for p, state in optimizer.state.items():
            out.append((id(p), [(k, _value_place(v)) for k, v in state.items()]))
    return out


def _set_lr(optimizer, lr: float):
    """Sets every param group's learning rate: a tensor lr (capturable, read by a CUDA graph)
    in place, on the current stream, before the step that reads it."""
    for g in optimizer.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(lr)
        else:
            g["lr"] = lr


def _lr_of(optimizer) -> float:
    """The first param group's learning rate as a float (a tensor lr read), for the records."""
    lr = optimizer.param_groups[0]["lr"] if optimizer.param_groups else float("nan")
    return float(lr.item() if isinstance(lr, torch.Tensor) else lr)


def _flatten(value, path, tensors):
    """`value` as JSON, each tensor in it replaced by {"tensor": its path} and put in
    `tensors`."""
    if isinstance(value, torch.Tensor):
        tensors.append((path, value.detach()))
        return {"tensor": path}
    if isinstance(value, dict):
        return {"dict": [[k, _flatten(v, f"{path}.{k}", tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_flatten(v, f"{path}.{i}", tensors)
                                       for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"the optimizer's state {path} is a {type(value).__name__}: a checkpoint "
                    "holds tensors, numbers, strings, lists and dicts only")


def _unflatten(node, tensors):
    (kind, value), = node.items()
    if kind == "tensor":
        return tensors[value]
    if kind == "dict":
        return {k: _unflatten(v, tensors) for k, v in value}
    if kind in ("list", "tuple"):
        items = [_unflatten(v, tensors) for v in value]
        return items if kind == "list" else tuple(items)
    return value


_STRUCTURE = "structure.json"


def _optimizer_state(optimizer):
    """A torch.optim optimizer's state_dict as a checkpoint's named tensors: each tensor under
    its path ("state.0.momentum_buffer"), and the rest (param groups, numbers) as JSON in one
    uint8 tensor, "structure.json" — no pickle in a checkpoint."""
    tensors = []
    structure = _flatten(optimizer.state_dict(), "", tensors)
    text = json.dumps(structure).encode()
    tensors.append((_STRUCTURE, torch.frombuffer(bytearray(text), dtype=torch.uint8)))
    return tensors


def _load_optimizer_state(optimizer, named):
    """The inverse of _optimizer_state, through the optimizer's own load_state_dict. A tensor
    learning rate keeps its identity (the value is copied in): a CUDA graph or a schedule may
    hold it."""
    tensors = dict(named)
    if _STRUCTURE not in tensors:
        raise ValueError("the checkpoint's optimizer state has no structure.json: it was saved "
                         "from a tandem optimizer, not from a torch.optim one")
    structure = json.loads(bytes(tensors.pop(_STRUCTURE).cpu().numpy()).decode())
    _load_optimizer_state_dict(optimizer, _unflatten(structure, tensors))


def _model_state(model):
    """The model's state_dict as named tensors (the checkpoint's and model.safetensors')."""
    out = []
    for name, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"the model's state_dict entry {name!r} is a "
                            f"{type(value).__name__}: a checkpoint holds tensors only")
        out.append((name, value.detach()))
    return out


def _load_model_state(model, named):
    model.load_state_dict(dict(named))  # strict: names every missing and unexpected key

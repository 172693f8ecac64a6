#!/usr/bin/env python3
"""Checks that a safetensors file (e.g. tandem's exported ResNet weights) loads into the
torchvision model by name and computes the same function: the export test, Python side.

  python scripts/check_export.py --weights W.safetensors --arch resnet50 [--num-classes N]
      [--expect-logits L.safetensors|L.npy|L.pt [--atol A] [--rtol R]] [--dump-logits F]

1. safetensors.torch.load_file(W) into torchvision.models.<arch>(num_classes=N) with
   load_state_dict(strict=True). Before that, the file's keys and shapes are compared with the
   model's, so a file that does not fit fails listing every missing, unexpected and mis-shaped
   tensor in one line; non-finite values fail too.
2. One forward in eval mode under torch.no_grad(), on the CPU in fp32 (--device cuda to run it
   there; TF32 stays off), of the fixed input
       torch.manual_seed(0); x = torch.rand(2, 3, 224, 224)   # float32, on the CPU, in [0, 1)
   LibTorch's CPU generator is the same Mersenne Twister, so the C++ side gets the identical
   tensor from `torch::manual_seed(0); auto x = torch::rand({2, 3, 224, 224});` (check: the
   input sum printed below). It prints the logits' sum and each row's argmax.
3. --expect-logits: the other side's logits for the same input, (2, N) — a safetensors file
   (its tensor "logits", or its only tensor), a .npy (numpy.save), or a .pt (torch.save in
   Python, torch::pickle_save in C++) — compared with torch.allclose(atol, rtol); the argmaxes
   must agree too. --dump-logits writes this side's logits the same way (by extension).

Exit 0 on success; 1 with a one-line reason ("error: ...") otherwise.
"""
import argparse
import os
import sys

import torch

ARCHS = ("resnet18", "resnet34", "resnet50")


class Failure(Exception):
    """A reason to exit 1, in one line."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit 1 in one line too, not argparse's 2
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)


def parse_args(argv):
    p = Parser(description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--weights", required=True, help="a .safetensors state dict")
    p.add_argument("--arch", required=True, choices=ARCHS)
    p.add_argument("--num-classes", type=int, default=1000, help="the fc's outputs (default 1000)")
    p.add_argument("--expect-logits", help="logits to compare with (.safetensors, .npy, .pt)")
    p.add_argument("--atol", type=float, default=1e-4, help="default 1e-4")
    p.add_argument("--rtol", type=float, default=1e-4, help="default 1e-4")
    p.add_argument("--dump-logits", help="write this side's logits (.safetensors, .npy, .pt)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="default cpu")
    a = p.parse_args(argv)
    if a.num_classes < 1:
        p.error(f"--num-classes {a.num_classes}: expected >= 1")
    if a.atol < 0 or a.rtol < 0:
        p.error(f"--atol {a.atol} / --rtol {a.rtol}: expected >= 0")
    return a


def fixed_input():
    """(2, 3, 224, 224) float32 on the CPU: torch.manual_seed(0); torch.rand(2, 3, 224, 224)."""
    torch.manual_seed(0)
    return torch.rand(2, 3, 224, 224)


def load_weights(path):
    from safetensors.torch import load_file
    if not os.path.isfile(path):
        raise Failure(f"--weights {path}: no such file")
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise Failure(f"--weights {path}: not a readable safetensors file: "
                      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def check_fit(state, model, what):
    """Raises Failure listing every missing, unexpected and mis-shaped tensor."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shaped = [f"{k} file {tuple(state[k].shape)} vs model {tuple(v.shape)}"
              for k, v in expected.items() if k in state and state[k].shape != v.shape]
    if missing or unexpected or shaped:
        parts = [f"{len(missing)} missing {missing}" if missing else "",
                 f"{len(unexpected)} unexpected {unexpected}" if unexpected else "",
                 f"{len(shaped)} mis-shaped [{'; '.join(shaped)}]" if shaped else ""]
        raise Failure(f"{what} does not fit: " + ", ".join(p for p in parts if p))
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise Failure(f"{what}: non-finite values in {bad}")


def read_logits(path):
    ext = os.path.splitext(path)[1].lower()
    if not os.path.isfile(path):
        raise Failure(f"--expect-logits {path}: no such file")
    try:
        if ext == ".safetensors":
            from safetensors.torch import load_file
            tensors = load_file(path)
            if "logits" in tensors:
                return tensors["logits"]
            if len(tensors) != 1:
                raise Failure(f"--expect-logits {path}: no tensor 'logits' among "
                              f"{sorted(tensors)}")
            return next(iter(tensors.values()))
        if ext == ".npy":
            import numpy as np
            return torch.from_numpy(np.load(path, allow_pickle=False))
        if ext == ".pt":
            t = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(t, dict) and "logits" in t:
                t = t["logits"]
            if not isinstance(t, torch.Tensor):
                raise Failure(f"--expect-logits {path}: holds a {type(t).__name__}, not a tensor")
            return t
    except Failure:
        raise
    except Exception as e:
        raise Failure(f"--expect-logits {path}: unreadable: {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}")
    raise Failure(f"--expect-logits {path}: unknown extension {ext!r} "
                  "(expected .safetensors, .npy or .pt)")


def write_logits(path, logits):
    ext = os.path.splitext(path)[1].lower()
    if ext == ".safetensors":
        from safetensors.torch import save_file
        save_file({"logits": logits.contiguous()}, path)
    elif ext == ".npy":
        import numpy as np
        np.save(path, logits.numpy())
    elif ext == ".pt":
        torch.save(logits, path)
    else:
        raise Failure(f"--dump-logits {path}: unknown extension {ext!r} "
                      "(expected .safetensors, .npy or .pt)")


def run(a):
    import torchvision
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for the comparison
    torch.backends.cudnn.allow_tf32 = False
    if a.device == "cuda" and not torch.cuda.is_available():
        raise Failure("--device cuda: CUDA is not available")
    what = f"{a.weights} for torchvision {a.arch}(num_classes={a.num_classes})"
    state = load_weights(a.weights)
    model = getattr(torchvision.models, a.arch)(weights=None, num_classes=a.num_classes)
    check_fit(state, model, what)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:  # check_fit should have caught it; keep torch's word if not
        raise Failure(f"{what}: load_state_dict: " + " ".join(str(e).split()))
    dtypes = sorted({str(v.dtype).replace("torch.", "") for v in state.values()})
    print(f"loaded {what}: {len(state)} tensors ({', '.join(dtypes)}), strict")

    x = fixed_input()
    print(f"input: torch.manual_seed(0); torch.rand(2, 3, 224, 224): sum {x.sum().item():.6f}")
    model.to(a.device).eval()
    with torch.no_grad():
        logits = model(x.to(a.device)).float().cpu()
    if not torch.isfinite(logits).all():
        raise Failure(f"{what}: non-finite logits")
    argmax = logits.argmax(1).tolist()
    print(f"logits {tuple(logits.shape)} on {a.device}: sum {logits.sum().item():.6f}, "
          f"argmax {argmax}")
    if a.dump_logits:
        write_logits(a.dump_logits, logits)
        print(f"wrote logits to {a.dump_logits}")

    if a.expect_logits:
        ref = read_logits(a.expect_logits).float().cpu()
        if ref.shape != logits.shape:
            raise Failure(f"--expect-logits {a.expect_logits}: shape {tuple(ref.shape)}, "
                          f"expected {tuple(logits.shape)}")
        diff = (ref - logits).abs()
        worst = int(diff.argmax())
        print(f"expected logits {a.expect_logits}: sum {ref.sum().item():.6f}, max |diff| "
              f"{diff.max().item():.3g} at {divmod(worst, logits.shape[1])}")
        if not torch.allclose(logits, ref, atol=a.atol, rtol=a.rtol):
            r, c = divmod(worst, logits.shape[1])
            raise Failure(f"logits differ from {a.expect_logits}: max |diff| "
                          f"{diff.max().item():.3g} at [{r}, {c}] ({logits[r, c].item():.6f} vs "
                          f"{ref[r, c].item():.6f}), over atol {a.atol} rtol {a.rtol}")
        if ref.argmax(1).tolist() != argmax:
            raise Failure(f"argmax {argmax} differs from {a.expect_logits}'s "
                          f"{ref.argmax(1).tolist()}")
        print(f"match: within atol {a.atol} rtol {a.rtol}, same argmax")
    print("ok")


def main(argv=None):
    a = parse_args(argv)
    try:
        run(a)
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"error: {e} (needs torchvision and safetensors)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The cls reference workload's loop with tandem.Trainer: random crop, resize, rotation, blur and
normalization on the GPU (tandem's fused augmentation) feeding a 9-conv classifier, 10 classes
at 256x256, SGD. The user code is make_trainer(); tandem runs it in the fastest mode.
    python3 cls_trainer.py [--bs 32] [--steps 200] [--device cpu]"""
import argparse

import torch
import torch.nn as nn

import tandem


def make_trainer(batch_size: int, mode: str = "auto", device: str = "cuda") -> tandem.Trainer:
    torch.manual_seed(0)
    layers, c = [nn.Conv2d(3, 16, kernel_size=1), nn.ReLU(inplace=True)], 16
    for _ in range(7):
        layers += [nn.Conv2d(c, c * 2, kernel_size=2, stride=2), nn.ReLU(inplace=True)]
        c *= 2
    layers += [nn.Conv2d(c, c * 2, kernel_size=2, stride=2), nn.Flatten(), nn.Linear(4096, 10)]
    model = nn.Sequential(*layers).train().to(device)
    # The reference workload's transforms: RandomCrop(128), Resize(256), RandomRotation(45), GaussianBlur(7),
    # Normalize(0, 1) on 0..255 pixels.
    augment = tandem.AugmentSpec(crop=(128, 128), out=(256, 256), max_rotation_deg=45.0,
                                 blur_kernel=7, mean=(0, 0, 0), std=(1, 1, 1))
    data = tandem.data.Random(1_000_000, image=((3, 256, 256), torch.uint8),
                              label=((), torch.int64, 10))
    return tandem.Trainer(model=model, loss_fn=nn.CrossEntropyLoss(),
                          optimizer=torch.optim.SGD(model.parameters()), data=data,
                          augment=augment, batch_size=batch_size, mode=mode)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--mode", default="auto", choices=tandem.trainer.MODES)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    print(make_trainer(args.bs, args.mode, args.device).fit(steps=args.steps))

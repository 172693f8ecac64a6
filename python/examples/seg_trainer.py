"""The seg reference workload's loop with tandem.Trainer: a frozen encoder feeding a trainable
decoder, 10 classes at 256x256, SGD. The user code is make_trainer(); tandem runs it in the
fastest mode (timed trials on copies) with the plain loop's losses.
    python3 seg_trainer.py [--bs 32] [--steps 200]"""
import argparse

import torch
import torch.nn as nn

import tandem


def encoder_and_decoder():
    """The seg workload's networks (models/src/reference_nets.cpp, layer for layer): nine convs
    from (3, 256, 256) down to (4096, 1, 1), and eight transposed convs back to 10 classes."""
    enc, c = [nn.Conv2d(3, 16, 1), nn.ReLU(inplace=True)], 16
    for i in range(8):
        enc += [nn.Conv2d(c, c * 2, 2, stride=2)] + ([nn.ReLU(inplace=True)] if i < 7 else [])
        c *= 2
    dec = []
    for _ in range(8):
        dec += [nn.ConvTranspose2d(c, c // 2, 2, stride=2), nn.ReLU(inplace=True)]
        c //= 2
    return nn.Sequential(*enc), nn.Sequential(*dec, nn.Conv2d(16, 10, 3, padding=1))


def make_trainer(batch_size: int, mode: str = "auto") -> tandem.Trainer:
    torch.manual_seed(0)
    encoder, decoder = encoder_and_decoder()
    encoder.requires_grad_(False).eval().cuda()
    decoder.train().cuda()
    data = tandem.data.Random(1_000_000, image=((3, 256, 256), torch.uint8),
                              mask=((256, 256), torch.int64, 10))
    return tandem.Trainer(model=decoder, loss_fn=torch.nn.CrossEntropyLoss(),
                          optimizer=torch.optim.SGD(decoder.parameters()),
                          data=data, feed=[("encode", lambda x: encoder(x.float()))],
                          batch_size=batch_size, mode=mode)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--mode", default="auto", choices=tandem.trainer.MODES)
    args = ap.parse_args()
    print(make_trainer(args.bs, args.mode).fit(steps=args.steps))

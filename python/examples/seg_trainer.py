"""The seeds' segmentation loop with tandem.Trainer: a frozen encoder feeding a trainable decoder
(the article's networks, seg_models.py), 10 classes at 256x256, SGD. The user code is
make_trainer(); tandem runs it in the fastest mode (timed trials on copies) with the plain
loop's losses.   python3 seg_trainer.py --reference DIR [--bs 32] [--steps 200]"""
import argparse
import sys

import torch

import tandem


def make_trainer(batch_size: int, mode: str = "auto") -> tandem.Trainer:
    from seg_models import Decoder, Encoder  # the seed's networks, as the article wrote them
    torch.manual_seed(0)
    encoder, decoder = Encoder(), Decoder()
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
    ap.add_argument("--reference", default="../shared/reference",
                    help="folder holding seg_models.py (the seeds' networks)")
    ap.add_argument("--bs", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--mode", default="auto", choices=tandem.trainer.MODES)
    args = ap.parse_args()
    sys.path.insert(0, args.reference)
    print(make_trainer(args.bs, args.mode).fit(steps=args.steps))

"""Your own model on your own data with tandem.Trainer: a plain torch Dataset (here, noisy
points on two interleaved spirals, made on the fly) and a small MLP. The Trainer reads the
dataset through tandem's C++ loader (your __getitem__ runs under the GIL), trains in the mode
you ask for, and continues where the last fit stopped; the accuracy is checked at the end.
The same script trains data parallel under torchrun: each process one rank, on its own GPU
(tandem.distributed.local_device()) and its own shard of the dataset.
    python3 own_data.py [--device cpu|cuda] [--mode pipelined] [--epochs 4]
    torchrun --nproc-per-node 2 own_data.py ...     (the same global batch of 128: 64 a rank)"""
import argparse
import math

import torch
import torch.nn as nn

import tandem


class Spirals(torch.utils.data.Dataset):
    """Sample i: a 2-D point on one of two spirals, and which one (a pure function of i)."""

    def __init__(self, n: int = 4096):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        label = i % 2
        t = 3 * math.pi * torch.rand((), generator=g)
        r = t / (3 * math.pi)
        angle = t + label * math.pi
        point = torch.stack([r * torch.cos(angle), r * torch.sin(angle)])
        return point + 0.02 * torch.randn(2, generator=g), label


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--mode", default="pipelined")
    ap.add_argument("--epochs", type=int, default=4)
    args = ap.parse_args()
    # Under torchrun: cuda:LOCAL_RANK for this rank (cuda:0 for one process); rank 0 prints.
    device = tandem.distributed.local_device() if args.device == "cuda" else args.device
    lead = tandem.distributed.rank() == 0
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 2)).to(device)
    trainer = tandem.Trainer(model, nn.CrossEntropyLoss(),
                             tandem.optim.Adam(model.parameters(), lr=1e-2),
                             data=Spirals(), mode=args.mode, workers=2,
                             # per rank: the global batch stays 128, so N ranks train as one
                             batch_size=128 // tandem.distributed.world_size(),
                             lr_schedule=lambda step: 1e-2 * 0.5 ** (
                                 step // (2 * trainer.steps_per_epoch)))  # halved every 2 epochs
    for epoch in range(args.epochs):  # each fit goes on from the last
        result = trainer.fit(epochs=1, progress=False)
        if lead:
            ranks = result.report.get("data_parallel", {}).get("world_size", 1)
            print(f"epoch {epoch + 1}: loss {sum(result.losses[-8:]) / 8:.4f}, "
                  f"{result.steps_per_s:.0f} steps/s in {result.mode}"
                  + (f" on each of {ranks} ranks" if ranks > 1 else ""))
    test = Spirals(1024)
    x = torch.stack([test[i][0] for i in range(len(test))]).to(device)
    y = torch.tensor([test[i][1] for i in range(len(test))], device=device)
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    if lead:
        print(f"accuracy on the first 1024 training points: {accuracy:.1%}")
    if accuracy < 0.9:
        raise SystemExit(f"accuracy {accuracy:.1%} is below 90%: the model did not learn")


if __name__ == "__main__":
    main()

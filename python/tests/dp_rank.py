"""One rank of test_distributed.py's jobs (or, without torchrun, the one process they are
compared with): trains a small MLP on a fixed table for an epoch with tandem.Trainer and saves
its weights, losses and data-parallel report to OUT/rank{RANK}.pt. With `folder`: two epochs
into the run folder OUT/run, with an evaluation (rank 0's alone).

Usage: [torchrun --nproc-per-node N] dp_rank.py OUT MODE BATCH_SIZE [cpu|cuda] [folder]
"""
import sys

import torch

import tandem


def main():
    out, mode, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    device = "cpu" if sys.argv[4:5] in ([], ["cpu"]) else tandem.distributed.local_device()
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model.to(device)
    if tandem.distributed.rank() != 0:  # rank 0's weights must reach every rank
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    g = torch.Generator().manual_seed(7)
    table = torch.utils.data.TensorDataset(torch.randn(96, 6, generator=g),
                                           torch.randn(96, 3, generator=g))
    folder = sys.argv[5:6] == ["folder"]
    held_out = (torch.randn(16, 6, generator=g).to(device),
                torch.randn(16, 3, generator=g).to(device))

    def evaluate(m):
        return {"val_loss": torch.nn.functional.mse_loss(m(held_out[0]), held_out[1])}
    trainer = tandem.Trainer(model=model, loss_fn=torch.nn.MSELoss(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                             data=table, batch_size=batch_size, mode=mode, workers=1, seed=11,
                             device=device, out=f"{out}/run" if folder else None,
                             evaluate=evaluate if folder else None)
    result = trainer.fit(epochs=2 if folder else 1, progress=False)
    torch.save({"params": [p.detach().cpu().clone() for p in model.parameters()],
                "losses": result.losses, "steps": result.steps, "mode": result.mode,
                "steps_per_epoch": trainer.steps_per_epoch,
                "data_parallel": result.report.get("data_parallel")},
               f"{out}/rank{tandem.distributed.rank()}.pt")


if __name__ == "__main__":
    main()

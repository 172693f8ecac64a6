"""One worker of test_distributed.py's two-node restart test: trains a small MLP into the run
folder OUT/run for four epochs with tandem.Trainer (no resume=True: a worker torchrun restarted
continues the run on its own), a checkpoint every 4 steps; each rank saves its weights to
OUT/rank{RANK}.pt. With `die`, the rank that first
reaches step 20 kills itself (SIGKILL: no handler runs), once: torchrun (--max-restarts 1) then
restarts every worker.

With `term`, every rank sends itself SIGTERM at step 20 (what SLURM and Kubernetes send before
they kill), once: the ranks stop at one step with a checkpoint and exit 143; `resume` then runs
fit(epochs=4, resume=True), as a requeued job would.

Usage: torchrun --nnodes 2 ... restart_rank.py OUT [die|term|resume]
       restart_rank.py OUT one     (one process on the global batch, 2 x 4, for comparison)
"""
import os
import signal
import sys

import torch

import tandem


def main():
    out, how = sys.argv[1], (sys.argv[2:3] or [""])[0]
    die, one, term = how == "die", how == "one", how == "term"
    tandem.distributed.set_timeouts(heartbeat=3)  # the survivor stops soon after the death
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    g = torch.Generator().manual_seed(7)
    table = torch.utils.data.TensorDataset(torch.randn(96, 6, generator=g),
                                           torch.randn(96, 3, generator=g))
    marker = os.path.join(out, "died")

    def lr(step):
        if die and step == 20 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if term and step == 20:
            os.kill(os.getpid(), signal.SIGTERM)
        return 0.05
    trainer = tandem.Trainer(model=model, loss_fn=torch.nn.MSELoss(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                             data=table, batch_size=8 if one else 4, mode="pipelined",
                             workers=1, seed=11, device="cpu", out=os.path.join(out, "run"),
                             checkpoint_every=4, lr_schedule=lr)
    trainer.fit(epochs=4, progress=False, resume=how == "resume")
    torch.save([p.detach().clone() for p in model.parameters()],
               os.path.join(out, f"rank{tandem.distributed.rank()}.pt"))  # every rank's


if __name__ == "__main__":
    main()

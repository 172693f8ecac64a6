"""tandem.Trainer with a run folder (out=): fit(epochs=N) runs the training loop `tandem train`
runs — its losses are the plain loop's, evaluate's metrics land in metrics.jsonl, checkpoints and
the final weights are written — and a run stopped by Ctrl-C (inside an epoch or at its end) or
SIGTERM resumes (resume=True, or a torchrun restart) to the very losses and weights of a run
never stopped. Bad requests are refused by name.
CPU tests run in CI; the CUDA ones skip without a GPU."""
import json
import os
import signal
import time

import pytest
import torch
import torch.nn as nn

import tandem
from test_trainer import AUGMENT, DEVICES, close, dataset, job, plain_losses

SPE = 5  # steps per epoch: 40 samples, batch 8


def run_folder_trainer(device, out, mode=None, optimizer="sgd", evaluate=None, **kw):
    encoder, head, opt = job(device, optimizer)
    mode = mode or ("pipelined+graphed" if device == "cuda" else "pipelined")
    t = tandem.Trainer(head, nn.CrossEntropyLoss(), opt, dataset(), feed=[encoder],
                       augment=AUGMENT, mode=mode, batch_size=8, workers=2, out=out,
                       evaluate=evaluate, **kw)
    return t, encoder, head


def held_out_accuracy(encoder, device):
    """An evaluation over a fixed held-out batch: accuracy and how many samples it scored."""
    g = torch.Generator().manual_seed(7)
    x = encoder(torch.randn(16, 3, 8, 8, generator=g).to(device))  # augment's output size
    y = torch.randint(0, 4, (16,), generator=g).to(device)

    def evaluate(model):
        assert not model.training and not torch.is_grad_enabled()
        return {"accuracy": (model(x).argmax(1) == y).float().mean()}, len(y)
    return evaluate


def rows(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("device", DEVICES)
def test_a_run_folder_trains_the_plain_loops_losses_and_keeps_its_records(device, tmp_path):
    out = str(tmp_path / "run")
    encoder, _, _ = job(device)
    t, _, head = run_folder_trainer(device, out, evaluate=held_out_accuracy(encoder, device))
    result = t.fit(epochs=2, progress=False)
    expected, plain_head = plain_losses(device, 2 * SPE)
    close(result.losses, expected, device)
    for a, b in zip(head.parameters(), plain_head.parameters()):
        close(a.detach().cpu(), b.detach().cpu(), device)
    assert head.training  # evaluate ran in eval mode; the flag is back
    assert t.steps_done == 2 * SPE and result.steps == 2 * SPE
    records = rows(out)
    assert [r["epoch"] for r in records] == [1, 2]
    assert [r["step"] for r in records] == [SPE, 2 * SPE]
    for r, first in zip(records, (0, SPE)):
        assert 0 <= r["accuracy"] <= 1 and r["eval_images_per_s"] > 0
        assert r["train_loss"] == pytest.approx(sum(result.losses[first:first + SPE]) / SPE)
    assert result.epochs == records
    assert result.weights == os.path.join(out, "model.safetensors") and \
        os.path.getsize(result.weights) > 0
    assert os.path.isdir(result.checkpoint) and \
        sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step-000000005",
                                                                "step-000000010"]
    assert "train_loss" in str(result) and "accuracy" in str(result)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["batch_size"] == 8 and config["epochs"] == 2
    assert config["optimizer"] == "torch.optim.sgd.SGD"


def schedule(step):
    return 0.05 * 0.8 ** (step // 3)


def stopping_at(step_to_stop):
    """The schedule, which also sends SIGINT once, at `step_to_stop`: the run stops at the step
    after it (the Ctrl-C is seen between steps), keeping a checkpoint there."""
    sent = []

    def lr(step):
        if step == step_to_stop and not sent:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the fit's waiting thread sees it within 0.1 s: before the next step
        return schedule(step)
    return lr


def terminating_at(step_to_stop):
    """The schedule, which also sends SIGTERM once, at `step_to_stop` — when the fit has put a
    handler on it (else the test fails here instead of being killed)."""
    sent = []

    def lr(step):
        if step == step_to_stop and not sent:
            sent.append(step)
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "no SIGTERM handler"
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
        return schedule(step)
    return lr


def test_sigterm_then_a_torchrun_restart_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch,
                                                                           capfd):
    whole = str(tmp_path / "whole")
    t, _, whole_head = run_folder_trainer("cpu", whole, lr_schedule=schedule)
    whole_result = t.fit(epochs=3, progress=False)

    out = str(tmp_path / "stopped")
    t, _, _ = run_folder_trainer("cpu", out, lr_schedule=terminating_at(7))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(SystemExit) as stopped:
        t.fit(epochs=3, progress=False)
    assert stopped.value.code == 128 + signal.SIGTERM  # 143, as a process SIGTERM ended
    assert any("resume=True" in n for n in getattr(stopped.value, "__notes__", []))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back
    assert sorted(os.listdir(os.path.join(out, "checkpoints")))[-1] == "step-000000008"

    # The worker torchrun restarts: its environment says so, and no resume=True is given.
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT="29999",
                     TORCHELASTIC_RESTART_COUNT="1").items():
        monkeypatch.setenv(k, v)
    assert tandem.distributed.restarted()
    capfd.readouterr()
    t, _, head = run_folder_trainer("cpu", out, lr_schedule=schedule)
    result = t.fit(epochs=3, progress=False)
    assert "restarted by torchrun: continuing the run in" in capfd.readouterr().err
    assert result.report["resumed_from"] == 8
    close(result.losses, whole_result.losses[8:], "cpu")
    for a, b in zip(head.parameters(), whole_head.parameters()):
        close(a.detach(), b.detach(), "cpu")
    # Another run's folder is refused, restart or not.
    t, _, _ = run_folder_trainer("cpu", out, lr_schedule=schedule, seed=1)
    with pytest.raises(ValueError, match="another configuration"):
        t.fit(epochs=3, progress=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer", ["sgd", "adam_tensor_lr", "tandem"])
@pytest.mark.parametrize("stop_at", [7, SPE - 1])  # inside epoch 2; at epoch 1's end
def test_a_run_stopped_by_ctrl_c_resumes_to_the_uninterrupted_runs_losses_and_weights(
        device, optimizer, stop_at, tmp_path):
    # A float lr cannot be scheduled inside a CUDA graph: torch.optim.SGD runs eagerly there.
    mode = "pipelined" if device == "cuda" and optimizer == "sgd" else None
    whole = str(tmp_path / "whole")
    t, _, whole_head = run_folder_trainer(device, whole, mode, optimizer, lr_schedule=schedule)
    whole_result = t.fit(epochs=3, progress=False)

    out = str(tmp_path / "stopped")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        t, _, _ = run_folder_trainer(device, out, mode, optimizer,
                                     lr_schedule=stopping_at(stop_at))
        with pytest.raises(KeyboardInterrupt) as stopped:
            t.fit(epochs=3, progress=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert any("resume=True" in n for n in getattr(stopped.value, "__notes__", []))
    checkpoints = sorted(os.listdir(os.path.join(out, "checkpoints")))
    assert checkpoints[-1] == f"step-{stop_at + 1:09d}"

    # A new process would build everything again: so does this, with fresh modules.
    t, _, head = run_folder_trainer(device, out, mode, optimizer, lr_schedule=schedule)
    result = t.fit(epochs=3, resume=True, progress=False)
    assert result.report["resumed_from"] == stop_at + 1
    assert len(result.losses) == 3 * SPE - (stop_at + 1)
    close(result.losses, whole_result.losses[stop_at + 1:], device)
    resumed_rows, whole_rows = rows(out), rows(whole)
    assert [r["epoch"] for r in resumed_rows] == [1, 2, 3]
    for a, b in zip(resumed_rows, whole_rows):
        if device == "cpu":
            assert a["train_loss"] == b["train_loss"]  # bitwise: the epoch's sums carried
        else:
            close(a["train_loss"], b["train_loss"], device)
        assert a["lr"] == b["lr"]
    for a, b in zip(head.parameters(), whole_head.parameters()):
        close(a.detach().cpu(), b.detach().cpu(), device)


@pytest.mark.parametrize("optimizer", ["sgd", "adam_tensor_lr", "tandem"])
def test_the_records_hold_the_optimizers_own_learning_rate_without_a_schedule(optimizer,
                                                                             tmp_path):
    # Without lr_schedule the records read the optimizer's lr (0.05 for SGD, 1e-3 for Adam).
    out = str(tmp_path / "run")
    t, _, _ = run_folder_trainer("cpu", out, optimizer=optimizer)
    expected = 1e-3 if optimizer == "adam_tensor_lr" else 0.05
    result = t.fit(epochs=1, progress=False)
    assert rows(out)[0]["lr"] == pytest.approx(expected, rel=1e-6)
    assert result.epochs[0]["lr"] == pytest.approx(expected, rel=1e-6)
    with open(os.path.join(out, "metrics.csv")) as f:
        header, first = f.readline().strip().split(","), f.readline().strip().split(",")
    assert float(first[header.index("lr")]) == pytest.approx(expected, rel=1e-6)


def test_a_resumed_fit_says_where_it_resumes(tmp_path, capfd):
    # Stopped by Ctrl-C after step 7 (inside epoch 2): the resumed fit says so, as the CLI does.
    out = str(tmp_path / "run")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        t, _, _ = run_folder_trainer("cpu", out, lr_schedule=stopping_at(6))
        with pytest.raises(KeyboardInterrupt):
            t.fit(epochs=2, progress=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    capfd.readouterr()
    t, _, _ = run_folder_trainer("cpu", out, lr_schedule=schedule)
    t.fit(epochs=2, resume=True)  # progress on: the line the CLI prints too
    assert f"resuming at step 7 (epoch 2, step {7 - SPE} of it)" in capfd.readouterr().err
    t, _, _ = run_folder_trainer("cpu", out, lr_schedule=schedule)
    t.fit(epochs=2, resume=True, progress=False)  # quiet: nothing
    assert "resuming" not in capfd.readouterr().err


def test_an_existing_run_folder_is_not_overwritten_and_a_changed_run_is_not_resumed(tmp_path):
    out = str(tmp_path / "run")
    t, _, _ = run_folder_trainer("cpu", out)
    t.fit(epochs=1, progress=False)
    t, _, _ = run_folder_trainer("cpu", out)
    with pytest.raises(ValueError, match="already exists and is not empty"):
        t.fit(epochs=2, progress=False)
    encoder, head, opt = job("cpu")
    t = tandem.Trainer(head, nn.CrossEntropyLoss(), opt, dataset(), feed=[encoder],
                       augment=AUGMENT, mode="pipelined", batch_size=4, workers=2, out=out)
    with pytest.raises(ValueError, match="batch_size"):
        t.fit(epochs=1, resume=True, progress=False)
    t, _, _ = run_folder_trainer("cpu", out)  # the same run: complete, nothing left to do
    assert t.fit(epochs=1, resume=True, progress=False).losses == []


def test_run_folder_requests_that_cannot_work_are_refused_by_name(tmp_path):
    out = str(tmp_path / "run")
    encoder, head, opt = job("cpu")
    batches = [(torch.randn(8, 8, 8, 8), torch.randint(0, 4, (8,)))]
    with pytest.raises(ValueError, match="list of batches"):
        tandem.Trainer(head, nn.CrossEntropyLoss(), opt, batches, out=out)
    with pytest.raises(ValueError, match="drop_last=True"):
        tandem.Trainer(head, nn.CrossEntropyLoss(), opt, dataset(), batch_size=8,
                       drop_last=False, out=out)
    with pytest.raises(ValueError, match="give out="):
        tandem.Trainer(head, nn.CrossEntropyLoss(), opt, batches, evaluate=lambda m: {})
    with pytest.raises(TypeError, match="torch.nn.Module"):
        tandem.Trainer(lambda x: head(x), nn.CrossEntropyLoss(), opt, dataset(), out=out,
                       batch_size=8)
    t, _, _ = run_folder_trainer("cpu", out)
    with pytest.raises(ValueError, match="fit\\(epochs=N\\)"):
        t.fit(steps=3)
    t, _, _ = run_folder_trainer("cpu", out, mode="graphed_k")
    with pytest.raises(ValueError, match="graphed_k"):
        t.fit(epochs=1)
    t = tandem.Trainer(head, nn.CrossEntropyLoss(), opt, dataset(), batch_size=8)
    with pytest.raises(ValueError, match="out="):
        t.fit(epochs=1, resume=True)
    t, _, _ = run_folder_trainer("cpu", out, evaluate=lambda m: 0.5)
    with pytest.raises(TypeError, match="dict of metrics"):
        t.fit(epochs=1, progress=False)


@pytest.mark.parametrize("mode", ["serial", "pipelined"])
def test_every_evaluation_runs_on_the_thread_that_trains(tmp_path, mode):
    # The training's thread has tuned the model's convolutions (cuDNN keeps its plans per
    # thread): every evaluation, the last epoch's after the steps have ended included, runs there.
    import threading

    trained, evaluated = set(), []

    class Loss(nn.CrossEntropyLoss):
        def forward(self, out, target):
            trained.add(threading.get_native_id())
            return super().forward(out, target)

    encoder, head, opt = job("cpu")
    t = tandem.Trainer(head, Loss(), opt, dataset(), feed=[encoder], augment=AUGMENT, mode=mode,
                       batch_size=8, workers=2, out=str(tmp_path / "run"),
                       evaluate=lambda m: evaluated.append(threading.get_native_id()) or {"a": 0.5})
    t.fit(epochs=3, progress=False)
    assert len(trained) == 1 and len(evaluated) == 3, (trained, evaluated)
    assert set(evaluated) == trained

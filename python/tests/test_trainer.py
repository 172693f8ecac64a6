"""tandem.Trainer: every mode computes the plain Python loop's losses (same seed, same data),
frozen feed stages get no gradient, a Python exception inside a stage comes back with its
traceback and leaves nothing running, Ctrl-C stops a run, bad arguments are refused by name.
CPU tests run in CI; the CUDA ones skip without a GPU (benchmarks/gpu_check.py python runs them)."""
import json
import os
import signal
import subprocess
import threading
import time

import pytest
import torch
import torch.nn as nn

import tandem

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
EAGER = ["serial", "pipelined"]
ALL_MODES = ["serial", "pipelined", "graphed", "pipelined+graphed", "graphed_k"]
AUGMENT = tandem.AugmentSpec(crop=(12, 12), out=(8, 8), max_rotation_deg=20, blur_kernel=3,
                             mean=(128.0, 128.0, 128.0), std=(64.0, 64.0, 64.0),
                             hflip_probability=0.5)


def dataset(size=40, classes=4):
    return tandem.data.Random(size, seed=3, image=((3, 16, 16), torch.uint8),
                              label=((), torch.int64, classes))


def job(device, optimizer="sgd"):
    """A frozen conv encoder (feed) and a trainable head, seeded: the same weights every call."""
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).to(device)
    encoder.requires_grad_(False).eval()
    head = nn.Sequential(nn.Conv2d(8, 8, 3, stride=2), nn.ReLU(), nn.Flatten(),
                         nn.LazyLinear(4)).to(device)
    head(torch.zeros(1, 8, 8, 8, device=device))  # materialize the lazy layer
    if optimizer == "sgd":
        opt = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9)
    elif optimizer == "adam":
        opt = torch.optim.Adam(head.parameters(), lr=1e-3, capturable=device == "cuda")
    elif optimizer == "adam_tensor_lr":  # an lr a graph reads from memory: schedulable
        opt = torch.optim.Adam(head.parameters(), lr=torch.tensor(1e-3, device=device),
                               capturable=device == "cuda")
    else:
        opt = tandem.optim.SGD(head.parameters(), lr=0.05, momentum=0.9)
    return encoder, head, opt


def set_lr(opt, lr):
    if isinstance(opt, tandem.optim.SGD):
        opt.set_lr(lr)
        return
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(lr)
        else:
            g["lr"] = lr


def plain_losses(device, steps, batch_size=8, spec=AUGMENT, optimizer="sgd", schedule=None):
    """The loop a PyTorch user writes, on tandem's loader (PyTorch's shuffled order)."""
    encoder, head, opt = job(device, optimizer)
    loss_fn = nn.CrossEntropyLoss()
    loader = tandem.data.Loader(dataset(), batch_size, shuffle=True, seed=0, device=device)
    g = torch.Generator(device).manual_seed(0)
    losses = []
    while len(losses) < steps:
        for batch in loader:
            x, y = batch["image"], batch["label"]
            with torch.no_grad():
                if spec is not None:
                    x = tandem.augment(x, spec, g)
                x = encoder(x)
            if schedule is not None:
                set_lr(opt, schedule(len(losses)))
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(head(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
    return losses, head


def trainer(device, mode, spec=AUGMENT, optimizer="sgd", **kw):
    encoder, head, opt = job(device, optimizer)
    t = tandem.Trainer(head, nn.CrossEntropyLoss(), opt, dataset(), feed=[encoder],
                       augment=spec, mode=mode, batch_size=8, workers=2, **kw)
    return t, encoder, head


def close(a, b, device):
    tol = 1e-6 if device == "cpu" else 1e-4  # CUDA: cuDNN's algorithms may differ by call
    torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ALL_MODES)
def test_every_mode_computes_the_plain_loops_losses(device, mode):
    steps = 12  # 5 batches per epoch: three epochs, each in its own shuffled order
    expected, plain_head = plain_losses(device, steps)
    t, _, head = trainer(device, mode)
    result = t.fit(steps=steps, progress=False)
    assert result.mode == mode and len(result.losses) == steps
    close(result.losses, expected, device)
    for a, b in zip(head.parameters(), plain_head.parameters()):
        close(a.detach().cpu(), b.detach().cpu(), device)


@pytest.mark.parametrize("device", DEVICES)
def test_tandems_optimizer_matches_torchs(device):
    expected, _ = plain_losses(device, 8, optimizer="sgd")
    t, _, _ = trainer(device, "graphed" if device == "cuda" else "serial", optimizer="tandem")
    close(t.fit(steps=8, progress=False).losses, expected, device)


def halving(step):
    return 0.05 * 0.5 ** (step // 3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer", ["sgd", "tandem", "adam_tensor_lr"])
def test_an_lr_schedule_gives_the_plain_loops_losses(device, optimizer):
    if device == "cuda" and optimizer == "sgd":
        pytest.skip("a float lr cannot be scheduled under CUDA graphs (refused: next test)")
    expected, _ = plain_losses(device, 10, optimizer=optimizer, schedule=halving)
    mode = "pipelined+graphed" if device == "cuda" else "pipelined"
    t, _, _ = trainer(device, mode, optimizer=optimizer, lr_schedule=halving)
    close(t.fit(steps=10, progress=False).losses, expected, device)
    unscheduled, _ = plain_losses(device, 10, optimizer=optimizer)
    assert unscheduled[-1] != expected[-1]  # the schedule changed the run


@pytest.mark.parametrize("device", DEVICES)
def test_fits_continue_where_the_last_one_stopped(device):
    # 7 + 5 steps: the second fit starts mid-epoch, its augmentation draws and its learning
    # rates going on from the first's.
    optimizer = "tandem" if device == "cuda" else "sgd"
    expected, _ = plain_losses(device, 12, optimizer=optimizer, schedule=halving)
    mode = "pipelined+graphed" if device == "cuda" else "pipelined"
    t, _, _ = trainer(device, mode, optimizer=optimizer, lr_schedule=halving)
    first = t.fit(steps=7, progress=False).losses
    second = t.fit(steps=5, progress=False).losses
    assert t.steps_done == 12
    close(first + second, expected, device)


def test_a_non_finite_loss_stops_a_fit_naming_its_step():
    # fit runs the training loop `tandem train` runs, with or without a run folder: the first
    # NaN loss stops it, named, rather than training on from spoiled weights.
    encoder, head, opt = job("cpu")
    calls = []

    def loss_fn(out, y):
        calls.append(1)
        loss = nn.functional.cross_entropy(out, y)
        return loss * float("nan") if len(calls) == 4 else loss

    t = tandem.Trainer(head, loss_fn, opt, dataset(), feed=[encoder], augment=AUGMENT,
                       mode="serial", batch_size=8, workers=2)
    with pytest.raises(RuntimeError, match=r"the loss of step 3 \(epoch 1\) is NaN: training "
                                           r"stopped \(try a lower learning rate\)"):
        t.fit(steps=6, progress=False)
    assert t.steps_done == 0  # the fit did not complete


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_float_lr_schedule_under_graphs_is_refused():
    t, _, _ = trainer("cuda", "graphed", optimizer="sgd", lr_schedule=halving)
    with pytest.raises(ValueError, match="float lr"):
        t.fit(steps=2, progress=False)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_capturable_torch_adam_is_captured_and_exact():
    expected, _ = plain_losses("cuda", 10, optimizer="adam")
    t, _, _ = trainer("cuda", "pipelined+graphed", optimizer="adam")
    result = t.fit(steps=10, progress=False)
    close(result.losses, expected, "cuda")
    assert any("graph" in n for n in result.report["notes"])


@pytest.mark.parametrize("device", DEVICES)
def test_no_gradient_reaches_a_frozen_feed(device):
    torch.manual_seed(0)
    encoder = nn.Conv2d(3, 8, 3, padding=1).to(device)  # requires_grad left on, on purpose
    before = [p.detach().clone() for p in encoder.parameters()]
    head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 16 * 16, 4)).to(device)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    t = tandem.Trainer(head, nn.CrossEntropyLoss(), opt, dataset(), feed=[
        lambda x: x.float() / 255, encoder], batch_size=8, mode="pipelined", workers=1)
    t.fit(steps=6, progress=False)
    assert all(p.grad is None for p in encoder.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, encoder.parameters()))
    assert all(p.grad is not None for p in head.parameters())


@pytest.mark.parametrize("device", DEVICES)
def test_resident_batches_train_in_order(device):
    torch.manual_seed(1)
    xs = [torch.randn(4, 6, device=device) for _ in range(3)]
    ys = [torch.randint(0, 3, (4,), device=device) for _ in range(3)]

    def fresh():
        torch.manual_seed(0)
        m = nn.Linear(6, 3).to(device)
        return m, torch.optim.SGD(m.parameters(), lr=0.5)
    m, opt = fresh()
    expected = []
    for i in range(7):  # step i reads batch i % 3
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(xs[i % 3]), ys[i % 3])
        loss.backward()
        opt.step()
        expected.append(loss.item())
    m, opt = fresh()
    t = tandem.Trainer(m, nn.CrossEntropyLoss(), opt, list(zip(xs, ys)), mode="pipelined")
    assert (t.input, t.target, t.batch_size, t.steps_per_epoch) == ("input", "target", 4, 3)
    close(t.fit(steps=7, progress=False).losses, expected, device)


def test_epochs_count_the_datasets_batches():
    t, _, _ = trainer("cpu", "serial")
    assert t.steps_per_epoch == 5
    assert len(t.fit(epochs=2, progress=False).losses) == 10


def test_a_loss_without_target_the_report_and_a_trace(tmp_path):
    torch.manual_seed(0)
    m = nn.Linear(5, 5)
    data = [{"x": torch.randn(3, 5)} for _ in range(2)]
    t = tandem.Trainer(m, lambda out: out.pow(2).mean(), torch.optim.SGD(m.parameters(), lr=0.1),
                       data, mode="pipelined")
    assert t.target is None
    r = t.fit(steps=4, progress=False, trace=tmp_path / "trace.json")
    assert r.losses[-1] < r.losses[0]  # it descends: the squares shrink
    assert {s["name"] for s in r.report["stages"]} == {"train"}
    assert "steps/s" in str(r) and r.steps_per_s > 0
    events = json.load(open(tmp_path / "trace.json"))["traceEvents"]
    assert any(e.get("name") == "train" for e in events)  # the stage's intervals


def test_the_printed_result_says_where_the_calls_setup_went():
    from tandem._fit_result import FitResult

    def result(setup):
        return FitResult(losses=[1.0], mode="graphed", steps=1, seconds=1.0, steps_per_s=1.0,
                         samples_per_s=8.0, report={}, table="TABLE", setup=setup)

    first = str(result(dict(trials_s=1.5, trial_steps=12, graphs=2, capture_s=0.25,
                            conv_plans=dict(tuned=131, tuning_s=16.3, runtime_compiled=36))))
    assert first.startswith("TABLE\nsetup: ")
    assert "mode auto's trials 1.50 s (12 steps of the fit's)" in first
    assert "2 graphs captured in 0.25 s" in first
    assert "131 cuDNN convolution plans timed in 16.30 s (36 compiled at run time)" in first
    later = str(result(dict(trials_s=0.0, graphs=0, graphs_kept=1, conv_plans=dict(
        tuned=0, from_file=131, rebuilding_s=0.94, from_compiled=36, prebuilt=131))))
    assert "trials" not in later and "1 kept graph replayed" in later
    assert "131 kept plans rebuilt in 0.94 s (36 with their compiled code), 131 of them ahead " \
        "on threads" in later
    assert str(result(None)) == str(result(dict(trials_s=0.0, conv_plans={}))) == "TABLE"


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter([])


class Boom(Exception):
    pass


def exploding_loss_at(step):
    calls = {"n": 0}

    def loss_fn(out, target):
        calls["n"] += 1
        if calls["n"] == step:
            raise Boom(f"boom at call {step}")
        return nn.functional.cross_entropy(out, target)
    return loss_fn


@pytest.mark.parametrize("mode", EAGER)
def test_an_exception_in_the_loss_surfaces_with_its_traceback(mode):
    encoder, head, opt = job("cpu")
    t = tandem.Trainer(head, exploding_loss_at(3), opt, dataset(), feed=[encoder],
                       augment=AUGMENT, mode=mode, batch_size=8, workers=2)
    with pytest.raises(Boom, match="boom at call 3") as info:
        t.fit(steps=20, progress=False)
    assert any(entry.name == "loss_fn" for entry in info.traceback)  # the user's own frame
    notes = getattr(info.value, "__notes__", [])
    if notes:  # Python >= 3.11: the runner's context
        assert "stage 'train'" in notes[0] and "step 2" in notes[0]
    # Nothing was left running: the same trainer runs again, to the end.
    t.loss_fn = nn.CrossEntropyLoss()
    assert len(t.fit(steps=6, progress=False).losses) == 6


def test_an_exception_in_a_feed_names_the_stage():
    def bad_feed(x):
        return x.float().view(-1, 7)  # 3*16*16 is not a multiple of 7

    encoder, head, opt = job("cpu")
    t = tandem.Trainer(head, nn.CrossEntropyLoss(), opt, dataset(), feed=[bad_feed],
                       mode="pipelined", batch_size=8)
    with pytest.raises(RuntimeError, match="shape") as info:
        t.fit(steps=3, progress=False)
    assert any(entry.name == "bad_feed" for entry in info.traceback)


def test_results_of_the_wrong_kind_are_refused_by_name():
    encoder, head, opt = job("cpu")
    t = tandem.Trainer(head, nn.CrossEntropyLoss(), opt, dataset(),
                       feed=[lambda x: (x, x)], mode="serial", batch_size=8)
    with pytest.raises(TypeError, match="feed 'feed' returned tuple: expected one torch.Tensor"):
        t.fit(steps=2, progress=False)
    t = tandem.Trainer(head, nn.CrossEntropyLoss(reduction="none"), opt, dataset(),
                       augment=AUGMENT, feed=[encoder], mode="serial", batch_size=8)
    with pytest.raises(ValueError, match=r"loss_fn returned a tensor of shape \[8\]"):
        t.fit(steps=2, progress=False)


def test_a_bad_augment_spec_is_refused_by_name():
    encoder, head, opt = job("cpu")
    bad = tandem.AugmentSpec(crop=(12, 12), out=(8, 8), blur_kernel=4)
    t = tandem.Trainer(head, nn.CrossEntropyLoss(), opt, dataset(), augment=bad,
                       feed=[encoder], mode="serial", batch_size=8)
    with pytest.raises(RuntimeError, match="blur kernel size 4 is not valid"):
        t.fit(steps=1, progress=False)


def test_bad_arguments_are_refused_by_name():
    encoder, head, opt = job("cpu")
    loss = nn.CrossEntropyLoss()
    with pytest.raises(ValueError, match="mode 'fast' is not valid"):
        tandem.Trainer(head, loss, opt, dataset(), batch_size=8, mode="fast")
    with pytest.raises(ValueError, match="batch_size None is not valid"):
        tandem.Trainer(head, loss, opt, dataset())
    with pytest.raises(ValueError, match="target 'mask' is not a field"):
        tandem.Trainer(head, loss, opt, dataset(), batch_size=8, target="mask")
    with pytest.raises(TypeError, match="IterableDataset"):
        tandem.Trainer(head, loss, opt, Stream(), batch_size=2)
    with pytest.raises(ValueError, match="give steps or epochs"):
        tandem.Trainer(head, loss, opt, dataset(), batch_size=8).fit()
    with pytest.raises(ValueError, match="used twice"):
        tandem.Trainer(head, loss, opt, dataset(), batch_size=8,
                       feed=[("enc", encoder), ("enc", encoder)])
    adam = torch.optim.Adam(head.parameters())  # capturable=False: host-side step count
    with pytest.raises(ValueError, match="capturable=True"):
        tandem.Trainer(head, loss, adam, dataset(), batch_size=8, mode="graphed").fit(steps=1)
    if CUDA:
        with pytest.raises(ValueError, match="expected cuda"):
            tandem.Trainer(head.cuda(), loss, torch.optim.SGD(head.parameters()),
                           [(torch.zeros(2, 3), torch.zeros(2))])


def test_arguments_of_the_wrong_type_are_refused_by_name():
    # A string, a fraction or a bool is no count: named, never compared or truncated.
    encoder, head, opt = job("cpu")
    loss = nn.CrossEntropyLoss()
    with pytest.raises(TypeError, match="batch_size '8' is a str: expected a whole number"):
        tandem.Trainer(head, loss, opt, dataset(), batch_size="8")
    with pytest.raises(TypeError, match="batch_size 8.5 is a float: expected a whole number"):
        tandem.Trainer(head, loss, opt, dataset(), batch_size=8.5)
    with pytest.raises(ValueError, match="batch_size 0 is not valid: expected >= 1"):
        tandem.Trainer(head, loss, opt, dataset(), batch_size=0)
    with pytest.raises(TypeError, match="workers True is a bool"):
        tandem.Trainer(head, loss, opt, dataset(), batch_size=8, workers=True)
    with pytest.raises(TypeError, match="seed '1' is a str"):
        tandem.Trainer(head, loss, opt, dataset(), batch_size=8, seed="1")
    with pytest.raises(ValueError, match="keep_checkpoints 0 is not valid: expected >= 1"):
        tandem.Trainer(head, loss, opt, dataset(), batch_size=8, keep_checkpoints=0)
    t = tandem.Trainer(head, loss, opt, dataset(), batch_size=8, mode="serial")
    with pytest.raises(TypeError, match="steps '10' is a str: expected a whole number"):
        t.fit(steps="10", progress=False)
    with pytest.raises(TypeError, match="steps 1.5 is a float"):
        t.fit(steps=1.5, progress=False)
    with pytest.raises(TypeError, match="epochs 0.5 is a float"):
        t.fit(epochs=0.5, progress=False)
    with pytest.raises(TypeError, match="warmup '2' is a str"):
        t.benchmark(steps=2, warmup="2")
    assert t.steps_done == 0  # nothing ran
    with pytest.raises(TypeError, match="a map-style torch Dataset"):
        tandem.Trainer(head, loss, opt, [])
    # A list of samples, as a torchvision dataset gives them, is named as such.
    with pytest.raises(TypeError, match="field 'target' is a int: expected a torch.Tensor; "
                                        "a list is read as batches already made"):
        tandem.Trainer(head, loss, opt, [(torch.zeros(3, 8, 8), 1)], batch_size=8)


def test_a_fit_says_what_it_paid_besides_its_steps():
    t, _, _ = trainer("cpu", "auto")
    first = t.fit(steps=3, progress=False)
    assert set(first.setup) == {"trials_s", "prepare_s", "capture_s", "graphs", "graphs_kept",
                                "conv_plans"}
    assert first.setup["prepare_s"] > 0 and first.setup["trials_s"] >= 0
    assert first.setup["graphs"] == 0 and first.setup["capture_s"] == 0  # the CPU: no graphs
    later = t.fit(steps=3, progress=False)
    assert later.setup["trials_s"] < 0.05  # decided: nothing tried again


def test_later_fits_keep_the_training_loop_until_what_it_was_built_from_changes():
    t, _, _ = trainer("cpu", "pipelined")
    t.fit(steps=3, progress=False)
    kept = t._sessions["pipelined"][0]
    t.fit(steps=2, progress=False)
    assert t._sessions["pipelined"][0] is kept
    t.workers = 1  # a setting the loop was built for
    t.fit(steps=2, progress=False)
    assert t._sessions["pipelined"][0] is not kept
    kept = t._sessions["pipelined"][0]
    t.reset()
    assert not t._sessions
    t.fit(steps=2, progress=False)
    assert t._sessions["pipelined"][0] is not kept and t.steps_done == 9


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_later_graphed_fit_replays_the_first_fits_graphs():
    t, _, _ = trainer("cuda", "pipelined+graphed")
    first = t.fit(steps=8, progress=False)
    graphs = first.setup["graphs"]  # augment, the encoder, the train step: one each
    assert graphs == 3 and first.setup["capture_s"] > 0
    assert first.setup["graphs_kept"] == 0
    later = t.fit(steps=4, progress=False)
    assert later.setup["graphs"] == 0 and later.setup["capture_s"] == 0
    assert later.setup["graphs_kept"] == graphs
    t.model.train(False)  # a flag the graph was captured with: captured anew
    again = t.fit(steps=4, progress=False)
    assert again.setup["graphs"] == graphs and again.setup["graphs_kept"] == 0


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_float_lr_changed_between_graphed_fits_is_the_next_fits():
    # SGD's float lr is baked into a captured graph: a changed one makes the next fit capture
    # anew, and it trains as the plain loop does with the new rate from step 6 on.
    expected, _ = plain_losses("cuda", 12, schedule=lambda step: 0.05 if step < 6 else 0.01)
    t, _, _ = trainer("cuda", "graphed")
    first = t.fit(steps=6, progress=False).losses
    set_lr(t.optimizer, 0.01)
    second = t.fit(steps=6, progress=False)
    assert second.setup["graphs"] == 1 and second.setup["graphs_kept"] == 0
    close(first + second.losses, expected, "cuda")


# The modes auto times for trainer()'s job, which has a feed (stages to overlap): serial and
# pipelined are left to their graphed counterparts, which run; graphed (beside
# pipelined+graphed) and graphed_k are timed beside any graphed step under short_trials.
TIMED = ["graphed", "pipelined+graphed", "graphed_k"]


def short_trials(monkeypatch, short_step_s=1e9):
    """The trials that train, with windows of the least steps: on the CPU (where auto is
    serial) their machinery runs as on CUDA."""
    monkeypatch.setattr(tandem._trials, "_TRIAL_WINDOW_S", 1e-4)
    monkeypatch.setattr(tandem._trials, "_TRIAL_CLEARLY_SLOWER", 1.0)  # both windows, always
    monkeypatch.setattr(tandem._trials, "_SHORT_STEP_S", short_step_s)


def not_timed(trials):
    return {r["mode"]: r["error"] for r in trials if r["error"].startswith("not timed: ")}


def test_auto_decides_on_the_fits_own_steps_which_train(monkeypatch):
    short_trials(monkeypatch)
    expected, plain_head = plain_losses("cpu", 130)
    t, _, head = trainer("cpu", "auto")
    t._trials_train_on_cpu = True
    first = t.fit(steps=30, progress=False)  # too short for every trial: the next goes on
    assert t.trials is None and first.setup["trial_steps"] == 30
    second = t.fit(steps=100, progress=False)
    # Each timed mode: 5 warm-up steps and two timed windows of 8. The first fit:
    # pipelined+graphed's 21, graphed's 5, then 4 of a window of 8, run untimed (cut short); the
    # windows go on.
    per_mode = tandem._trials._TRIAL_WARM_STEPS + 2 * tandem._trials._TRIAL_MIN_STEPS
    assert second.setup["trial_steps"] == len(TIMED) * per_mode + 4 - 30
    assert t.trials["on_the_fits_steps"] and t.trials["mode"] in TIMED
    assert second.mode == t.trials["mode"]
    assert [r["mode"] for r in t.trials["trials"]] == ALL_MODES  # simplest first
    untimed = not_timed(t.trials["trials"])
    assert set(untimed) == {"serial", "pipelined"}, untimed
    assert "graphed replays" in untimed["serial"]
    assert "pipelined+graphed replays" in untimed["pipelined"]
    for trial in t.trials["trials"]:
        if trial["mode"] in TIMED:
            assert len(trial["runs"]) == 2 and trial["steps_per_s"] > 0, trial
    parts = second.report["parts"]
    assert sum(p["steps"] for p in parts) == 100 and parts[-1]["mode"] == t.trials["mode"]
    assert not parts[-1]["trial"] and parts[0]["trial"]
    close(first.losses + second.losses, expected, "cpu")  # the plain loop's, trials and all
    for a, b in zip(head.parameters(), plain_head.parameters()):
        close(a.detach(), b.detach(), "cpu")
    third = t.fit(steps=5, progress=False)  # decided: one run, no trial
    assert third.setup["trials_s"] < 0.05 and "parts" not in third.report


def trying_trainer(**kw):
    t, _, _ = trainer("cpu", "auto", **kw)
    t._trials_train_on_cpu = True
    return t


def test_a_later_process_of_the_same_job_takes_the_kept_decision(monkeypatch, tmp_path):
    short_trials(monkeypatch)
    monkeypatch.setenv("TANDEM_MODE_CACHE", str(tmp_path))
    first = trying_trainer()
    first.fit(steps=120, progress=False)
    assert first.trials["mode"] in ALL_MODES and "cached" not in first.trials
    kept = list(tmp_path.iterdir())
    assert len(kept) == 1 and kept[0].suffix == ".json"
    later = trying_trainer()  # the same job, anew: as a second process would build it
    result = later.fit(steps=5, progress=False)
    assert later.trials["cached"] == str(kept[0]) and result.mode == first.trials["mode"]
    assert "kept from an earlier process" in later.trials["reason"]
    assert "parts" not in result.report and result.setup["trials_s"] < 0.05
    other = trying_trainer()
    other.batch_size = 4  # another job: its own key, its own trials
    assert other._decision_key() != later._decision_key()


def test_a_kept_decision_that_cannot_be_trusted_is_ignored_with_a_warning(monkeypatch, tmp_path):
    short_trials(monkeypatch)
    monkeypatch.setenv("TANDEM_MODE_CACHE", str(tmp_path))
    trying_trainer().fit(steps=120, progress=False)
    (kept,) = tmp_path.iterdir()
    for damage, why in [("{not json", "Expecting property name"),
                        (json.dumps(dict(key="another", decision={})), "another job"),
                        (kept.read_text().replace('"mode": "', '"mode": "warp'),
                         "not one this job")]:
        kept.write_text(damage)
        t = trying_trainer()
        with pytest.warns(UserWarning, match=f"ignoring the kept mode decision {kept}.*{why}"):
            t.fit(steps=120, progress=False)
        assert t.trials["mode"] in ALL_MODES and "cached" not in t.trials  # tried again
        assert json.loads(kept.read_text())["decision"]["mode"] in ALL_MODES  # written again


def test_the_kept_decisions_can_be_turned_off(monkeypatch, tmp_path):
    short_trials(monkeypatch)
    monkeypatch.setenv("TANDEM_MODE_CACHE", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    trying_trainer().fit(steps=120, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_mode_clearly_slower_in_its_first_window_gets_no_second(monkeypatch):
    short_trials(monkeypatch)
    # Every first window counts as far below the fastest: one window a mode.
    monkeypatch.setattr(tandem._trials, "_TRIAL_CLEARLY_SLOWER", -1.0)
    t = trying_trainer()
    result = t.fit(steps=80, progress=False)
    per_mode = tandem._trials._TRIAL_WARM_STEPS + tandem._trials._TRIAL_MIN_STEPS
    assert result.setup["trial_steps"] == len(TIMED) * per_mode
    assert all(len(trial["runs"]) == 1 for trial in t.trials["trials"] if trial["mode"] in TIMED)
    assert t.trials["mode"] in TIMED


def test_a_step_of_one_stage_times_graphed_alone_in_one_window(monkeypatch):
    # Batches already on the device, no feed: nothing for a pipeline to overlap; serial is
    # replayed by graphed; graphed_k, beside a step this long, saves only the host's work. One
    # mode left: its warm-up and one window, then the fit goes on in it.
    short_trials(monkeypatch, short_step_s=1e-12)
    torch.manual_seed(0)
    batches = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(5)]

    def fit(mode):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
        t = tandem.Trainer(model, nn.CrossEntropyLoss(),
                           torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                           data=batches, mode=mode)
        t._trials_train_on_cpu = True
        return t, t.fit(steps=40, progress=False)

    t, result = fit("auto")
    per_mode = tandem._trials._TRIAL_WARM_STEPS + tandem._trials._TRIAL_MIN_STEPS
    assert result.setup["trial_steps"] == per_mode and t.trials["mode"] == "graphed"
    untimed = not_timed(t.trials["trials"])
    assert set(untimed) == {"serial", "pipelined", "pipelined+graphed", "graphed_k"}, untimed
    assert "one stage" in untimed["pipelined"] and "one stage" in untimed["pipelined+graphed"]
    assert "step takes" in untimed["graphed_k"]
    _, serial = fit("serial")
    close(result.losses, serial.losses, "cpu")


def test_a_step_with_a_feed_and_no_short_step_times_pipelined_graphed_alone(monkeypatch):
    # A feed to overlap and steps longer than a short one: pipelined+graphed, timed first, leaves
    # graphed (the same graphs, its stages one after the other), serial, pipelined and graphed_k
    # untimed. One mode: its warm-up and one window, then the fit goes on in it, with the plain
    # loop's losses.
    short_trials(monkeypatch, short_step_s=1e-12)
    expected, _ = plain_losses("cpu", 40)
    t, _, _ = trainer("cpu", "auto")
    t._trials_train_on_cpu = True
    result = t.fit(steps=40, progress=False)
    per_mode = tandem._trials._TRIAL_WARM_STEPS + tandem._trials._TRIAL_MIN_STEPS
    assert result.setup["trial_steps"] == per_mode
    assert t.trials["mode"] == "pipelined+graphed"
    untimed = not_timed(t.trials["trials"])
    assert set(untimed) == {"serial", "pipelined", "graphed", "graphed_k"}, untimed
    assert "pipelined+graphed's step takes" in untimed["graphed"]
    assert "pipelined+graphed replays" in untimed["serial"]
    close(result.losses, expected, "cpu")


class LossFailingOnTheTrainStagesThread:
    """Cross-entropy, raising from its third call on on a thread named "train" (the train
    stage's in the pipelined modes; the serial ones run on one thread named "serial")."""

    def __init__(self):
        self.calls, self.inner = 0, nn.CrossEntropyLoss()

    def __call__(self, out, target):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            if f.read().strip() == "train":
                self.calls += 1
                if self.calls > 2:
                    raise RuntimeError("this loss cannot run on the train stage's thread")
        return self.inner(out, target)


def test_a_mode_failing_its_trial_is_rolled_back_and_left_out(monkeypatch):
    short_trials(monkeypatch)
    expected, _ = plain_losses("cpu", 120)
    encoder, head, opt = job("cpu")
    t = tandem.Trainer(head, LossFailingOnTheTrainStagesThread(), opt, dataset(),
                       feed=[encoder], augment=AUGMENT, batch_size=8, workers=2)
    t._trials_train_on_cpu = True
    result = t.fit(steps=120, progress=False)
    # pipelined+graphed fails, so pipelined is timed (and fails the same way).
    errors = {r["mode"]: r["error"] for r in t.trials["trials"]
              if r["error"] and r["mode"] not in not_timed(t.trials["trials"])}
    assert set(errors) == {"pipelined", "pipelined+graphed"}, errors
    assert all("cannot run on the train stage's thread" in e for e in errors.values())
    assert t.trials["mode"] in ("serial", "graphed", "graphed_k")
    close(result.losses, expected, "cpu")  # the failed steps undone: the plain loop's losses


def test_auto_on_the_cpu_is_serial():
    t, _, _ = trainer("cpu", "auto")
    r = t.fit(steps=3, progress=False)
    assert r.mode == "serial" and "CPU" in t.trials["reason"]


def test_a_trainer_and_the_cli_resolve_a_job_to_the_same_request(tmp_path):
    # One resolve() for every front end: the Trainer's typed request, resolved by the run layer,
    # holds what `tandem bench` resolves to for the same job on the same device, default by
    # default, and prints the same lines.
    t, _, _ = trainer("cpu", "serial")
    config = t._config("serial", 3, 1, copies=True)
    assert isinstance(config, tandem._C.RunConfig)
    assert config.request.cudnn_benchmark is None  # left to the run layer
    r = config.resolved_request()
    cli = os.environ.get("TANDEM_CLI") or os.path.join(
        os.path.dirname(__file__), "..", "..", "build", "tandem")
    if not os.path.exists(cli):
        pytest.skip("no tandem CLI (TANDEM_CLI or build/tandem)")
    out = tmp_path / "bench.json"
    printed = subprocess.run(
        [cli, "bench", "--workload", "mlp", "--device", "cpu", "--mode", "serial", "--steps", "3",
         "--warmup", "1", "--batch-size", str(t.batch_size), "--json", str(out)],
        check=True, capture_output=True, text=True).stdout
    j = json.loads(out.read_text())
    for key in ("device", "mode", "batch_size", "steps", "warmup", "workers", "seed",
                "cudnn_benchmark", "cuda_wait", "train_priority", "input_priority",
                "device_timing_every", "skip_bad"):
        assert getattr(r, key) == j[key], key
    # The request's lines past the workload's name, as the CLI printed them.
    ours = r.describe().split("\n", 1)[1]
    assert ours in printed
    with pytest.raises(ValueError, match="worker count"):
        config.request.workers = 0
        config.resolved_request()


def test_a_run_config_gives_back_the_data_it_holds():
    # The typed config reads back what it was given: the same batches' tensors, or the dataset;
    # None before any.
    config = tandem._C.RunConfig()
    assert config.data is None
    batches = [{"x": torch.randn(4, 3), "y": torch.arange(4)} for _ in range(2)]
    config.data = batches
    back = config.data
    assert len(back) == 2 and set(back[1]) == {"x", "y"}
    assert back[1]["x"].data_ptr() == batches[1]["x"].data_ptr()  # the same tensor, not a copy
    config.data = []
    assert config.data is None


def test_auto_trials_leave_out_the_modes_the_trainer_rules_out():
    # The run layer's trials, which choose_mode runs on CUDA, here on the CPU: a mode the
    # optimizer or schedule cannot take is not tried, its row says why, the pick is another.
    t, _, _ = trainer("cpu", "auto")
    why = "graphed is not for this optimizer"
    out = tandem._C.trials(t._config("serial", 2, 1, copies=True, gpu_monitor=False,
                                     ruled_out={"graphed": why}))
    rows = {r["mode"]: r for r in out["trials"]}
    assert set(rows) == set(ALL_MODES)  # every mode: auto is the choice among them
    assert rows["graphed"]["error"] == why and rows["graphed"]["steps_per_s"] is None
    assert out["mode"] != "graphed" and rows[out["mode"]]["steps_per_s"] > 0


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_auto_times_copies_and_leaves_the_users_modules_alone():
    t, encoder, head = trainer("cuda", "auto")
    before = [p.detach().clone() for p in head.parameters()]
    mode = t.choose_mode(steps=20)
    assert mode in ALL_MODES and len(t.trials["trials"]) == len(ALL_MODES)
    assert all(torch.equal(a, b) for a, b in zip(before, head.parameters()))
    expected, _ = plain_losses("cuda", 12)
    close(t.fit(steps=12, progress=False).losses, expected, "cuda")


def test_ctrl_c_stops_a_run_and_raises_keyboard_interrupt():
    m = nn.Linear(64, 64)
    data = [(torch.randn(32, 64), torch.randn(32, 64))]
    t = tandem.Trainer(m, nn.MSELoss(), torch.optim.SGD(m.parameters(), lr=1e-3), data,
                       mode="pipelined")
    # Python's own Ctrl-C handler, whatever this process inherited: a shell's background job
    # starts with SIGINT ignored, and Python then installs no handler, so the signal would
    # never arrive.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            t.fit(steps=10_000_000, progress=False)
        assert time.monotonic() - start < 30
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(t.fit(steps=2, progress=False).losses) == 2  # and the trainer still works


class Squares(torch.utils.data.Dataset):
    """A user's own dataset: sample i is (a 6-vector, a class), from i alone."""

    def __init__(self, n=24, broken=None, odd_shape=None):
        self.n, self.broken, self.odd_shape = n, broken, odd_shape

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.broken:
            raise OSError(f"cannot read sample {i}")
        g = torch.Generator().manual_seed(i)
        x = torch.randn(7 if i == self.odd_shape else 6, generator=g)
        return x, i % 3


def test_a_torch_dataset_trains_as_a_dataloader_feeds_it():
    ds = Squares()

    def fresh():
        torch.manual_seed(0)
        m = nn.Linear(6, 3)
        return m, torch.optim.SGD(m.parameters(), lr=0.5)
    m, opt = fresh()
    expected = []
    for x, y in torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False, drop_last=True):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        expected.append(loss.item())
    m, opt = fresh()
    t = tandem.Trainer(m, nn.CrossEntropyLoss(), opt, ds, batch_size=4, shuffle=False,
                       mode="pipelined", workers=3)
    assert (t.input, t.target, t.steps_per_epoch) == ("input", "target", 6)
    close(t.fit(epochs=1, progress=False).losses, expected, "cpu")


def test_the_loader_reads_a_torch_dataset_in_order():
    ds = tandem.data.TorchDataset(Squares(), fields=("x", "y"))
    assert len(ds) == 24 and ds.fields == ["x", "y"]
    batches = list(tandem.data.Loader(ds, batch_size=8, workers=2))
    assert len(batches) == 3
    torch.testing.assert_close(batches[1]["x"],
                               torch.stack([Squares()[i][0] for i in range(8, 16)]))
    assert batches[2]["y"].tolist() == [i % 3 for i in range(16, 24)]


def test_a_torch_datasets_bad_sample_is_named_or_skipped():
    def run(ds, **kw):
        torch.manual_seed(0)
        m = nn.Linear(6, 3)
        t = tandem.Trainer(m, nn.CrossEntropyLoss(), torch.optim.SGD(m.parameters(), lr=0.1),
                           ds, batch_size=4, shuffle=False, mode="serial", **kw)
        return t.fit(epochs=1, progress=False)
    with pytest.raises(RuntimeError,
                       match=r"__getitem__\(9\) raised OSError: cannot read sample 9"):
        run(Squares(broken=9))
    with pytest.raises(RuntimeError, match="sample 5 field 'input' is Float \\[7\\]"):
        run(Squares(odd_shape=5))
    r = run(Squares(broken=9), skip_bad=True)
    assert [s["index"] for s in r.report["skipped"]] == [9]


def test_every_mode_of_the_librarys_table_is_offered_and_accepted():
    names = [name for name, _, _ in tandem._C.modes()]
    assert tandem.trainer.MODES == ("auto", *names)
    assert "pipelined+graphed" in names
    head = nn.Linear(4, 2)
    data = [(torch.randn(3, 4), torch.randint(0, 2, (3,)))]
    for mode in tandem.trainer.MODES:
        t = tandem.Trainer(head, nn.CrossEntropyLoss(), torch.optim.SGD(head.parameters(), lr=0.1),
                           data=data, mode=mode)
        assert t.mode == mode
    with pytest.raises(ValueError, match="pipelined_graphed"):
        tandem.Trainer(head, nn.CrossEntropyLoss(), torch.optim.SGD(head.parameters(), lr=0.1),
                       data=data, mode="pipelined_graphed")


def test_the_loader_workers_default_is_the_clis(tmp_path):
    # One rule for every front end: the Trainer's default is the run layer's, which `tandem
    # bench` resolves to for the same device.
    t, _, _ = trainer("cpu", "serial")
    assert t.workers == tandem._C.default_loader_workers("cpu") == 2
    cli = os.environ.get("TANDEM_CLI") or os.path.join(
        os.path.dirname(__file__), "..", "..", "build", "tandem")
    if not os.path.exists(cli):
        pytest.skip("no tandem CLI (TANDEM_CLI or build/tandem)")
    out = tmp_path / "bench.json"
    subprocess.run([cli, "bench", "--workload", "mlp", "--device", "cpu", "--steps", "1",
                    "--warmup", "0", "--json", str(out)], check=True, capture_output=True)
    assert json.loads(out.read_text())["workers"] == t.workers

"""tandem.Trainer(compile=...): every mode computes the compiled plain loop's losses, successive
fits go on from each other without compiling again, mode auto and benchmark() work on compiled
copies, errors inside compiled code come back as without compile. On the CPU (CI) the cheap
backend "aot_eager" (dynamo + AOTAutograd, no code generation) serves the mode tests and one
test runs inductor itself; on CUDA (the GPU machine) inductor in every mode.

Tolerance: compiled code may reorder float arithmetic, so losses are compared within 1e-5
relative on the CPU and 2e-3 on CUDA (TF32 matmuls and convolutions, fused kernels)."""
import pytest
import torch
import torch.nn as nn

import tandem

CUDA = torch.cuda.is_available()
EAGER = ["serial", "pipelined"]
ALL_MODES = ["serial", "pipelined", "graphed", "pipelined+graphed", "graphed_k"]


def counters():
    from torch._dynamo.utils import counters as c
    return c


def frames_compiled():
    """Frames dynamo has compiled so far in this process (each recompilation counts)."""
    return sum(counters()["frames"].get(k, 0) for k in ("ok",))


def job(device):
    """A frozen feed and a trainable head, seeded: the same weights every call."""
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(12, 16), nn.ReLU()).to(device).requires_grad_(False).eval()
    head = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(device)
    opt = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9)
    return encoder, head, opt


def batches(device, n=4, bs=8):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(bs, 12, generator=g).to(device),
             torch.randint(0, 4, (bs,), generator=g).to(device)) for _ in range(n)]


def plain_compiled_losses(device, steps, options):
    """The loop a PyTorch user writes with torch.compile: the same regions, the same data."""
    torch._dynamo.reset()
    encoder, head, opt = job(device)
    loss_fn = nn.CrossEntropyLoss()
    feed = torch.compile(lambda x: encoder(x), **options)
    forward_loss = torch.compile(lambda x, y: loss_fn(head(x), y), **options)
    data, losses = batches(device), []
    for i in range(steps):
        x, y = data[i % len(data)]
        with torch.no_grad():
            x = feed(x)
        loss = forward_loss(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def trainer(device, mode, options):
    encoder, head, opt = job(device)
    return tandem.Trainer(head, nn.CrossEntropyLoss(), opt, data=batches(device),
                          feed=[("encoder", encoder)], mode=mode,
                          compile=True if options == {} else options)


def tolerance(device):
    return dict(rtol=1e-5, atol=1e-6) if device == "cpu" else dict(rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("mode", EAGER)
def test_every_eager_mode_computes_the_compiled_plain_loops_losses_on_the_cpu(mode):
    options = {"backend": "aot_eager"}
    want = plain_compiled_losses("cpu", 10, options)
    got = trainer("cpu", mode, options).fit(steps=10, progress=False).losses
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), **tolerance("cpu"))


def test_inductor_on_the_cpu_computes_the_plain_loops_losses():
    want = plain_compiled_losses("cpu", 6, {})
    got = trainer("cpu", "serial", {}).fit(steps=6, progress=False).losses
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), **tolerance("cpu"))


def test_successive_fits_continue_each_other_without_compiling_again():
    options = {"backend": "aot_eager"}
    want = plain_compiled_losses("cpu", 12, options)
    t = trainer("cpu", "pipelined", options)
    first = t.fit(steps=6, progress=False).losses
    compiled = frames_compiled()
    second = t.fit(steps=6, progress=False).losses
    assert frames_compiled() == compiled, "the second fit compiled again"
    assert not counters()["recompiles"], f"recompilations: {dict(counters()['recompiles'])}"
    torch.testing.assert_close(torch.tensor(first + second), torch.tensor(want),
                               **tolerance("cpu"))


def test_no_recompilation_per_step():
    options = {"backend": "aot_eager"}
    torch._dynamo.reset()
    counters().clear()
    trainer("cpu", "serial", options).fit(steps=8, progress=False)
    # Two regions (the feed, the model with its loss), each compiled once.
    assert frames_compiled() == 2, dict(counters()["frames"])
    assert not counters()["recompiles"], dict(counters()["recompiles"])


def test_benchmark_and_auto_work_on_compiled_copies_and_leave_the_modules_alone():
    options = {"backend": "aot_eager"}
    t = trainer("cpu", "auto", options)
    before = [p.detach().clone() for p in t.model.parameters()]
    r = t.benchmark(steps=3, warmup=1)
    assert r.steps_per_s > 0 and r.steps == 3
    assert all(torch.equal(a, b) for a, b in zip(before, t.model.parameters()))
    assert t.fit(steps=2, progress=False).mode == "serial"  # auto's pick on the CPU


def test_an_exception_inside_compiled_code_comes_back_with_its_type():
    class Bad(nn.Module):
        def forward(self, x):
            raise ValueError("the model's own error")
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    t = tandem.Trainer(Bad(), nn.CrossEntropyLoss(), opt, data=batches("cpu"), mode="serial",
                       compile={"backend": "aot_eager"})
    with pytest.raises(Exception, match="the model's own error"):
        t.fit(steps=1, progress=False)


def test_a_bad_compile_argument_is_refused_by_name():
    encoder, head, opt = job("cpu")
    with pytest.raises(TypeError, match="compile is a str"):
        tandem.Trainer(head, nn.CrossEntropyLoss(), opt, data=batches("cpu"), compile="yes")


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("mode", ALL_MODES)
def test_every_mode_computes_the_compiled_plain_loops_losses_on_cuda(mode):
    want = plain_compiled_losses("cuda", 12, {})
    got = trainer("cuda", mode, {}).fit(steps=12, progress=False).losses
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), **tolerance("cuda"))


def test_a_module_the_user_compiled_runs_in_runs_on_other_threads():
    """torch.compile(model) passed as it is: each run traces on a lane thread of its own (the
    Trainer primes dynamo on the caller's thread first; without that torch 2.11 crashes the
    process on the second run's compilation)."""
    encoder, head, opt = job("cpu")
    t = tandem.Trainer(torch.compile(head, backend="aot_eager"), nn.CrossEntropyLoss(), opt,
                       data=batches("cpu"), feed=[("encoder", encoder)], mode="serial")
    assert t.benchmark(steps=2, warmup=1).steps == 2
    assert t.benchmark(steps=2, warmup=1).steps == 2
    assert len(t.fit(steps=3, progress=False).losses) == 3

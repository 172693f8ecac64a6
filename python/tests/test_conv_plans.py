"""The Trainer's convolutions on kept cuDNN plans (tandem/_conv_plans.py): a fit swaps exactly
the plain torch.nn.Conv2d modules for the stand-in and puts them back, the stand-in computes the
same as Conv2d, mode auto's kept decisions see Conv2d, a fit names its convolutions' job, and on
CUDA a fit times its shapes once, writes the plans file, and a later Trainer of the process
rebuilds them from it untimed, built ahead on threads."""
import os

import pytest
import torch
import torch.nn as nn

import tandem
from tandem import _C, _conv_plans, _mode_cache

CUDA = torch.cuda.is_available()


class OwnConv(nn.Conv2d):  # a subclass keeps its own forward: never swapped
    def forward(self, x):
        return super().forward(x) * 2


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), OwnConv(8, 8, 1),
                         nn.Conv2d(8, 8, 3, padding="same", padding_mode="reflect"))


def test_in_use_swaps_the_plain_conv2d_modules_and_puts_them_back():
    m = model()
    x = torch.randn(2, 3, 10, 10)
    want = m(x)
    with _conv_plans.in_use([m, m], True) as summary:  # a module reached twice: swapped once
        kinds = [type(c) for c in m]
        got = m(x)
    assert kinds == [_conv_plans.TunedConv2d, nn.ReLU, OwnConv, _conv_plans.TunedConv2d]
    assert [type(c) for c in m] == [nn.Conv2d, nn.ReLU, OwnConv, nn.Conv2d]
    assert summary["convolutions"] == 2
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with _conv_plans.in_use([m], False):
        assert type(m[0]) is nn.Conv2d


def test_in_use_puts_them_back_after_an_exception():
    m = model()
    with pytest.raises(RuntimeError, match="boom"):
        with _conv_plans.in_use([m], True):
            raise RuntimeError("boom")
    assert type(m[0]) is nn.Conv2d and type(m[3]) is nn.Conv2d


def test_the_job_is_the_convolutions_structure():
    assert _conv_plans.job_of([m for m in model() if type(m) is nn.Conv2d]) == \
        _conv_plans.job_of([m for m in model() if type(m) is nn.Conv2d])
    other = model()
    other[0].stride = (2, 2)
    assert _conv_plans.job_of([other[0], other[3]]) != _conv_plans.job_of([model()[0], model()[3]])


def test_in_use_names_its_job_while_the_block_runs_and_builds_ahead_only_on_cuda(
        monkeypatch, tmp_path):
    named, built = [], []
    monkeypatch.setattr(_C, "set_conv_plans_job", named.append)
    monkeypatch.setattr(_C, "prebuild_conv_plans", lambda job, threads: built.append(job) or 0)
    monkeypatch.setenv("TANDEM_MODE_CACHE", str(tmp_path))
    m = model()
    with _conv_plans.in_use([m], True, torch.device("cpu")):
        during = list(named)
    assert during == [_conv_plans.job_of([m[0], m[3]])]
    assert named[-1] == ""  # none after the block
    assert built == []  # not a GPU: nothing to build
    monkeypatch.setenv("TANDEM_MODE_CACHE", "off")  # no file: no job to note
    with _conv_plans.in_use([m], True):
        assert named[-1] == ""


def test_the_prebuild_takes_the_threads_the_setting_names(monkeypatch):
    monkeypatch.delenv("TANDEM_CONV_PREBUILD_THREADS", raising=False)
    default = _conv_plans._threads()
    assert 1 <= default <= 8
    monkeypatch.setenv("TANDEM_CONV_PREBUILD_THREADS", "3")
    assert _conv_plans._threads() == 3
    for bad in ("0", "many", "-2"):
        monkeypatch.setenv("TANDEM_CONV_PREBUILD_THREADS", bad)
        with pytest.warns(UserWarning, match=f"TANDEM_CONV_PREBUILD_THREADS={bad!r}.*whole number"):
            assert _conv_plans._threads() == default


def test_the_kept_decisions_key_sees_conv2d_through_the_stand_in():
    m = model()
    before = _mode_cache._describe_callable(m)
    with _conv_plans.in_use([m], True):
        during = _mode_cache._describe_callable(m)
    assert during == before
    assert "torch.nn.modules.conv.Conv2d" in before["modules"]


def test_it_applies_on_cuda_with_cudnn_benchmark_and_no_compile_unless_turned_off(monkeypatch):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.delenv("TANDEM_TUNED_CONV", raising=False)
    assert _conv_plans.applies(cuda, False, None) == hasattr(_C, "tuned_conv2d")  # the default
    if not hasattr(_C, "tuned_conv2d"):
        return
    monkeypatch.setenv("TANDEM_TUNED_CONV", "1")
    assert _conv_plans.applies(cuda, False, None)
    assert not _conv_plans.applies(cpu, False, None)
    assert not _conv_plans.applies(cuda, True, None)
    assert not _conv_plans.applies(cuda, False, False)
    monkeypatch.setenv("TANDEM_TUNED_CONV", "0")
    assert not _conv_plans.applies(cuda, False, None)
    for off in ("off", "False", " no "):
        monkeypatch.setenv("TANDEM_TUNED_CONV", off)
        assert not _conv_plans.applies(cuda, False, None), off
    monkeypatch.setenv("TANDEM_TUNED_CONV", "nope")
    with pytest.warns(UserWarning, match="TANDEM_TUNED_CONV='nope' is not understood.*stays on"):
        assert _conv_plans.applies(cuda, False, None)


@pytest.mark.parametrize("value, grouped", [(None, True), ("1", True), ("true", True),
                                            ("ON", True), ("0", False), ("off", False)])
def test_grouped_convolutions_take_plans_as_the_setting_says(monkeypatch, tmp_path, value,
                                                             grouped):
    monkeypatch.setenv("TANDEM_MODE_CACHE", str(tmp_path))
    if value is None:
        monkeypatch.delenv("TANDEM_TUNED_CONV_GROUPS", raising=False)
    else:
        monkeypatch.setenv("TANDEM_TUNED_CONV_GROUPS", value)
    with _conv_plans.in_use([model()], True):
        assert _conv_plans.TunedConv2d.grouped is grouped


def test_a_groups_setting_not_understood_warns_and_stays_on(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_MODE_CACHE", str(tmp_path))
    monkeypatch.setenv("TANDEM_TUNED_CONV_GROUPS", "depthwise")
    with pytest.warns(UserWarning, match="TANDEM_TUNED_CONV_GROUPS='depthwise'.*stays on"):
        with _conv_plans.in_use([model()], True):
            assert _conv_plans.TunedConv2d.grouped is True


class Bf16Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.net(x)


class Bf16Encoder(nn.Module):
    """A frozen stage before the model (a feed): its convolution runs on its own thread in the
    pipelined modes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1, bias=False)

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return torch.relu(self.conv(x))


def bf16_trainer(mode="graphed", feed=False):
    torch.manual_seed(0)
    net = Bf16Net().cuda().to(memory_format=torch.channels_last)
    encoder = Bf16Encoder().cuda().to(memory_format=torch.channels_last)
    encoder.requires_grad_(False).eval()
    data = [dict(image=torch.randn(8, 3, 16, 16, device="cuda"),
                 label=torch.randint(0, 4, (8,), device="cuda")) for _ in range(3)]
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    return tandem.Trainer(net, nn.CrossEntropyLoss(), opt, data, mode=mode,
                          feed=[encoder] if feed else ())


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("mode", ["serial", "pipelined", "graphed", "pipelined+graphed"])
def test_every_mode_computes_the_serial_loops_losses_on_tuned_convolutions(tmp_path, monkeypatch,
                                                                           mode):
    monkeypatch.setenv("TANDEM_MODE_CACHE", str(tmp_path))
    monkeypatch.delenv("TANDEM_TUNED_CONV", raising=False)  # the default
    _C.clear_conv_plans()
    tuned = bf16_trainer(mode, feed=True).fit(steps=6, progress=False)
    plans = tuned.setup["conv_plans"]
    assert plans["convolutions"] == 3
    # Each pass of a shape planned once for the process, whichever thread met it first: three
    # forwards, two weight gradients and one input gradient at most. The 16-channel convolution's
    # forward and weight gradient at least are cuDNN's (the 3-channel ones may be refused).
    assert plans["tuned"] + plans["untimed"] + plans["refused"] <= 6
    assert plans["tuned"] + plans["untimed"] >= 2
    monkeypatch.setenv("TANDEM_TUNED_CONV", "0")  # the serial loop on LibTorch's convolutions
    serial = bf16_trainer("serial", feed=True).fit(steps=6, progress=False)
    assert serial.setup["conv_plans"] == {}
    torch.testing.assert_close(torch.tensor(tuned.losses), torch.tensor(serial.losses),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_a_fit_times_its_shapes_once_and_a_later_trainer_rebuilds_them(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODE_CACHE", str(tmp_path))
    monkeypatch.setenv("TANDEM_TUNED_CONV", "1")
    monkeypatch.setattr(_conv_plans, "_loaded", set())
    _C.clear_conv_plans()
    first = bf16_trainer().fit(steps=6, progress=False)
    plans = first.setup["conv_plans"]
    assert plans["tuned"] >= 4  # two convolutions' forward and weight gradient, at least
    assert plans["convolutions"] == 2
    assert os.path.isfile(tmp_path / _conv_plans.FILE_NAME)

    _C.clear_conv_plans()  # as a new process finds them
    monkeypatch.setattr(_conv_plans, "_loaded", set())
    monkeypatch.setenv("TANDEM_KERNEL_WARMUP", "1")
    second = bf16_trainer().fit(steps=6, progress=False)
    monkeypatch.delenv("TANDEM_KERNEL_WARMUP")
    assert second.setup["conv_plans"]["tuned"] == 0
    assert second.setup["conv_plans"]["from_file"] == plans["tuned"]
    assert second.setup["conv_plans"]["rebuilding_s"] > 0  # accounted, beside the parts of it
    # Built ahead on threads before the first step: the same convolutions' plans.
    assert second.setup["conv_plans"]["prebuilt"] == plans["tuned"]
    # Beside them, where asked for, the step's other kernels loaded (its ops all ran): the same
    # losses after.
    assert second.setup["conv_plans"]["warmup_ops"] > 0
    assert {"listing_s", "building_s", "tuning_s", "runtime_compiled",
            "from_compiled", "configured", "graph_s"} <= set(second.setup["conv_plans"])
    torch.testing.assert_close(torch.tensor(second.losses), torch.tensor(first.losses),
                               rtol=2e-2, atol=2e-2)

    _C.clear_conv_plans()
    monkeypatch.setattr(_conv_plans, "_loaded", set())
    monkeypatch.setenv("TANDEM_CONV_PREBUILD", "0")  # each where first used
    third = bf16_trainer().fit(steps=6, progress=False)
    assert third.setup["conv_plans"]["prebuilt"] == 0
    assert third.setup["conv_plans"]["warmup_ops"] == 0
    assert third.setup["conv_plans"]["from_file"] == plans["tuned"]
    monkeypatch.delenv("TANDEM_CONV_PREBUILD")

    monkeypatch.setenv("TANDEM_TUNED_CONV", "0")  # LibTorch's convolutions: the same losses
    plain = bf16_trainer().fit(steps=6, progress=False)
    assert plain.setup["conv_plans"] == {}
    torch.testing.assert_close(torch.tensor(plain.losses), torch.tensor(first.losses),
                               rtol=2e-2, atol=2e-2)


class DepthwiseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(),
                                 nn.Conv2d(16, 16, 1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.net(x)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_depthwise_convolutions_take_plans_unless_turned_off(tmp_path, monkeypatch):
    def fit():
        torch.manual_seed(0)
        net = DepthwiseNet().cuda().to(memory_format=torch.channels_last)
        data = [dict(image=torch.randn(8, 3, 16, 16, device="cuda"),
                     label=torch.randint(0, 4, (8,), device="cuda")) for _ in range(3)]
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        return tandem.Trainer(net, nn.CrossEntropyLoss(), opt, data,
                              mode="graphed").fit(steps=6, progress=False)

    monkeypatch.setenv("TANDEM_MODE_CACHE", str(tmp_path))
    monkeypatch.delenv("TANDEM_TUNED_CONV", raising=False)
    monkeypatch.setenv("TANDEM_TUNED_CONV_GROUPS", "0")
    _C.clear_conv_plans()
    plain = fit()  # the depthwise convolution LibTorch's
    monkeypatch.delenv("TANDEM_TUNED_CONV_GROUPS", raising=False)
    _C.clear_conv_plans()
    grouped = fit()  # the default: on kept plans too
    # Its forward, input and weight gradient planned besides the others' passes.
    assert grouped.setup["conv_plans"]["tuned"] >= plain.setup["conv_plans"]["tuned"] + 3
    torch.testing.assert_close(torch.tensor(grouped.losses), torch.tensor(plain.losses),
                               rtol=2e-2, atol=2e-2)

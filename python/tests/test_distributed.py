"""tandem.distributed: tandem.Trainer under torchrun trains as one rank of a data-parallel job.
Two ranks on the CPU (tandem's store collectives; CI) and on two GPUs (NCCL; skipped with fewer):
every rank ends with bitwise the same weights, which match one process trained on the global
batch, whatever rank 0's neighbours started from; the losses are the ranks' mean. Without a
launcher everything says "one process"; a bad launch environment or a rank on another rank's GPU
is refused by name."""
import json
import os
import subprocess
import sys

import pytest
import torch

import tandem

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # this tandem, this torch
    env["OMP_NUM_THREADS"] = "1"
    return env


def run(args, timeout=300):
    r = subprocess.run(args, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"


def train(out, mode, batch_size, device, nproc=None, folder=False):
    script = [os.path.join(HERE, "dp_rank.py"), str(out), mode, str(batch_size), device]
    script += ["folder"] if folder else []
    if nproc is None:
        run([sys.executable] + script)
    else:
        run([sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={nproc}"] + script)
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(nproc or 1)]


@pytest.mark.parametrize("device,mode", [
    ("cpu", "serial"), ("cpu", "pipelined"),
    pytest.param("cuda", "pipelined+graphed", marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"))])
def test_ranks_agree_and_match_one_process_on_the_global_batch(tmp_path, device, mode):
    (tmp_path / "job").mkdir()
    (tmp_path / "one").mkdir()
    ranks = train(tmp_path / "job", mode, 4, device, nproc=2)
    [one] = train(tmp_path / "one", mode, 8, device)
    assert ranks[0]["steps"] == one["steps"] == 12  # 96 samples: 48 a rank, 4 a step
    assert ranks[0]["steps_per_epoch"] == 12
    tol = 1e-6 if device == "cpu" else 1e-5
    for r in ranks[1:]:
        for a, b in zip(ranks[0]["params"], r["params"]):
            assert torch.equal(a, b)  # rank 1 started elsewhere: rank 0's weights reached it
        assert r["losses"] == ranks[0]["losses"]  # the mean over the ranks, on every rank
    for a, b in zip(ranks[0]["params"], one["params"]):
        assert (a - b).abs().max().item() <= tol
    for a, b in zip(ranks[0]["losses"], one["losses"]):
        assert abs(a - b) <= tol * max(1.0, abs(b))
    # and it trained: the weights moved
    torch.manual_seed(3)
    initial = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                  torch.nn.Linear(16, 3))
    assert max((a - b).abs().max().item()
               for a, b in zip(one["params"], initial.parameters())) > 1e-3
    dp = ranks[0]["data_parallel"]
    assert dp["world_size"] == 2 and len(dp["steps_per_s_by_rank"]) == 2
    assert dp["backend"].startswith("store (CPU)" if device == "cpu" else "NCCL")
    assert one["data_parallel"] is None


FAILING_RANK = """
import sys, time, torch, tandem
model = torch.nn.Linear(6, 3)
steps = [0]
def loss_fn(out, y):
    steps[0] += 1
    if tandem.distributed.rank() == 1 and steps[0] == 5:
        raise RuntimeError("rank 1 failed on purpose")
    return torch.nn.functional.mse_loss(out, y)
data = torch.utils.data.TensorDataset(torch.randn(4000, 6), torch.randn(4000, 3))
t = tandem.Trainer(model=model, loss_fn=loss_fn, data=data, batch_size=4, mode="serial",
                   optimizer=torch.optim.SGD(model.parameters(), lr=0.1), workers=1)
try:
    t.fit(epochs=1, progress=False)
except RuntimeError as e:  # the user carries on: this rank must not hold the others
    print("rank 1 caught:", e, flush=True)
    time.sleep(120)
"""


def test_a_run_folder_job_trains_as_one_process_and_rank_0_alone_writes_it(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "one").mkdir()
    ranks = train(tmp_path / "job", "pipelined", 4, "cpu", nproc=2, folder=True)
    [one] = train(tmp_path / "one", "pipelined", 8, "cpu", folder=True)
    assert ranks[0]["steps"] == one["steps"] == 24  # two epochs of 12 steps
    for a, b in zip(ranks[0]["params"], ranks[1]["params"]):
        assert torch.equal(a, b)
    for a, b in zip(ranks[0]["params"], one["params"]):
        assert (a - b).abs().max().item() <= 1e-6
    job_rows, one_rows = ([json.loads(line) for line in open(p / "run" / "metrics.jsonl")]
                          for p in (tmp_path / "job", tmp_path / "one"))
    assert [r["epoch"] for r in job_rows] == [1, 2]
    for a, b in zip(job_rows, one_rows):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-6)  # the ranks' mean
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-6)
    with open(tmp_path / "job" / "run" / "config.json") as f:
        assert json.load(f)["world_size"] == 2
    assert sorted(os.listdir(tmp_path / "job" / "run" / "checkpoints")) == [
        "step-000000012", "step-000000024"]



def test_a_rank_whose_run_failed_stops_the_others_instead_of_hanging(tmp_path):
    script = tmp_path / "failing_rank.py"
    script.write_text(FAILING_RANK)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=2", str(script)], env=clean_env(),
                       capture_output=True, text=True, timeout=100)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "rank 1 caught: rank 1 failed on purpose" in out, out
    assert "rank 1 of 2 stopped responding" in out, out  # rank 0 names it and stops


def test_without_a_launcher_it_is_one_process(monkeypatch):
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    d = tandem.distributed
    assert (d.launched(), d.rank(), d.world_size(), d.local_rank()) == (False, 0, 1, 0)
    assert d._join(torch.device("cpu")) is None


def test_a_bad_launch_environment_is_named(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(ValueError, match="RANK"):
        tandem.distributed.rank()


def test_a_rank_on_another_ranks_gpu_is_refused(monkeypatch):
    for k, v in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match="LOCAL_RANK=1.*cuda:0.*local_device"):
        tandem.distributed._check_device(torch.device("cuda", 0))
    tandem.distributed._check_device(torch.device("cuda", 1))
    tandem.distributed._check_device(torch.device("cpu"))


def test_the_jobs_timeouts_are_set_before_it_is_joined():
    with pytest.raises(ValueError, match="join timeout 0 is not valid: expected a number"):
        tandem.distributed.set_timeouts(join=0)
    with pytest.raises(ValueError, match="heartbeat timeout 'soon' is not valid"):
        tandem.distributed.set_timeouts(heartbeat="soon")
    with pytest.raises(ValueError, match="heartbeat timeout True is not valid"):
        tandem.distributed.set_timeouts(heartbeat=True)
    # A lone rank 0 of two waits for rank 1 as long as set_timeouts says, and names it.
    script = ("import torch, tandem\n"
              "tandem.distributed.set_timeouts(join=2, heartbeat=30)\n"
              "tandem.distributed._join(torch.device('cpu'))\n")
    env = dict(clean_env(), RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(20000 + os.getpid() % 20000))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "rank 0 waited 2 s at the store" in r.stderr, r.stderr
    assert "for rank(s) 1 of WORLD_SIZE=2 to join" in r.stderr, r.stderr


def read_safetensors(path) -> dict:
    """A float32 safetensors file's tensors (its layout: an 8-byte little-endian header length,
    the JSON header, the data), without the safetensors package."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name != "__metadata__":
            assert t["dtype"] == "F32", (name, t["dtype"])
            a, b = t["data_offsets"]
            out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(
                t["shape"])
    return out


def two_nodes(script_args, launch, timeout=240, restarts=0):
    """Two torchrun agents (--nnodes 2, c10d rendezvous on localhost, one CPU rank each) running
    `script_args` (`launch`: this test's n-th launch, for a port of its own); their (exit
    status, output) pairs."""
    port = str(22000 + os.getpid() % 20000 + launch)
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=t{port}",
         f"--max-restarts={restarts}"] + script_args,
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)]
    return [(a.wait(timeout=timeout), a.stdout.read()) for a in agents]


def test_two_nodes_under_torchrun_survive_a_killed_worker_and_sigterm_exactly(tmp_path):
    # Two nodes: the run, uninterrupted (one process's on the global batch); then one where a
    # worker dies at step 20 (SIGKILL) and torchrun restarts both: a Trainer(out=...)
    # .fit(epochs=4) without resume=True continues from the newest checkpoint and ends with the
    # same weights and records, bit for bit.
    script = os.path.join(HERE, "restart_rank.py")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir()
    killed.mkdir()
    for rc, out in two_nodes([script, str(whole)], launch=0):
        assert rc == 0, out
    ranks = [torch.load(whole / f"rank{r}.pt") for r in (0, 1)]
    for a, b in zip(*ranks):
        assert torch.equal(a, b)  # every rank ends with the same weights, bit for bit
    # The two nodes train as one process on the global batch does, within float rounding.
    (tmp_path / "one").mkdir()
    run([sys.executable, script, str(tmp_path / "one"), "one"])
    two, one = (read_safetensors(p / "run" / "model.safetensors")
                for p in (whole, tmp_path / "one"))
    assert two.keys() == one.keys()
    for k in two:
        assert (two[k] - one[k]).abs().max().item() <= 1e-6, k
    agents = two_nodes([script, str(killed), "die"], launch=1, restarts=1)
    output = "\n".join(out for _, out in agents)
    assert [rc for rc, _ in agents] == [0, 0], output
    assert (killed / "died").exists(), output
    assert "restarted by torchrun: continuing the run in" in output, output
    weights = [(p / "run" / "model.safetensors").read_bytes() for p in (whole, killed)]
    assert weights[0] == weights[1]

    # SIGTERM to every worker: one step, a checkpoint, exit 143; the job run again with
    # resume=True (a requeue) ends with the same weights and records, bit for bit.
    termed = tmp_path / "termed"
    termed.mkdir()
    agents = two_nodes([script, str(termed), "term"], launch=2)
    output = "\n".join(out for _, out in agents)
    assert all(rc != 0 for rc, _ in agents), output
    assert "exitcode  : 143" in output or "exitcode: 143" in output, output
    for rc, out in two_nodes([script, str(termed), "resume"], launch=3):
        assert rc == 0, out
    assert (termed / "run" / "model.safetensors").read_bytes() == weights[0]

    def rows(p):
        return [{k: v for k, v in json.loads(line).items()
                 if not k.endswith(("seconds", "_per_s")) and k != "resumed_at_step"}
                for line in open(p / "run" / "metrics.jsonl")]
    assert rows(killed) == rows(whole) == rows(termed) and len(rows(whole)) == 4

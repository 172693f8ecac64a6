"""The README's Python blocks run as pasted (on the CPU in CI, on the GPU where there is one): each
is cut out of README.md and executed with what it calls yours — a backbone, a head, an
``accuracy`` function and a ``train/`` folder of photos in the working folder."""
import os
import re

import pytest
import torch
import torch.nn as nn

import tandem

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def python_blocks():
    """The ```python blocks of the README's "## Python" section, in order."""
    with open(README) as f:
        text = f.read()
    section = text[text.index("\n## Python\n"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)\n```", section, flags=re.S)


@pytest.fixture
def yours(tmp_path, monkeypatch):
    """The user's pieces the blocks name, and a train/ ImageFolder of 64 small photos (one
    batch of 64) in a fresh working folder."""
    for k in range(64):
        folder = tmp_path / "train" / f"class_{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        y = torch.linspace(0, 1, 40).view(40, 1)
        x = torch.linspace(0, 1, 48).view(1, 48)
        rgb = torch.stack([x.expand(40, 48), y.expand(40, 48), torch.full((40, 48), k / 64)])
        image = (rgb * 255).round().to(torch.uint8)
        (folder / f"{k}.jpg").write_bytes(tandem.data.encode_image(image, "jpeg", quality=90))
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Conv2d(3, 8, 5, stride=8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten())
    head = nn.Linear(8, 2)
    probe = torch.rand(4, 3, 224, 224)

    def accuracy(model):
        x = probe.to(next(model.parameters()).device)
        return float((model(backbone(x)).argmax(1) == 0).float().mean())
    return dict(backbone=backbone, head=head, accuracy=accuracy)


def test_the_readme_has_its_two_python_blocks():
    blocks = python_blocks()
    assert len(blocks) == 2, blocks
    assert "tandem.Trainer(" in blocks[0] and "resume=True" in blocks[1]


def test_the_first_block_trains_as_pasted(yours, capsys):
    namespace = dict(yours)
    exec(compile(python_blocks()[0], "README.md (Python)", "exec"), namespace)
    result = namespace["result"]
    assert result.steps == 10 and all(torch.isfinite(torch.tensor(result.losses)))
    assert "steps/s" in capsys.readouterr().out  # print(result): the run's table


def test_the_run_folder_block_trains_then_resumes_as_pasted(yours):
    namespace = dict(yours)
    exec(compile(python_blocks()[0].split("trainer = tandem.Trainer(")[0], "README.md", "exec"),
         namespace)  # its imports and the modules on their device
    exec(compile(python_blocks()[1], "README.md (Python, run folder)", "exec"), namespace)
    with open(os.path.join("runs", "r18", "metrics.jsonl")) as f:
        rows = f.read().splitlines()
    assert len(rows) == 10  # ten epochs; the resume found the run complete
    assert os.path.isfile(os.path.join("runs", "r18", "model.safetensors"))

"""tandem.data: the C++ loader over IDX files (written here), in PyTorch's shuffled order."""
import gzip
import struct

import pytest
import torch

import tandem


@pytest.fixture
def idx_files(tmp_path):
    """60 28x28 images whose pixels all equal their index, labels = index % 10, gzip'd."""
    n = 60
    images = bytearray(struct.pack(">IIII", 0x00000803, n, 28, 28))
    for i in range(n):
        images += bytes([i]) * (28 * 28)
    labels = bytearray(struct.pack(">II", 0x00000801, n)) + bytes(i % 10 for i in range(n))
    (tmp_path / "img.gz").write_bytes(gzip.compress(bytes(images)))
    (tmp_path / "lab").write_bytes(bytes(labels))
    return str(tmp_path / "img.gz"), str(tmp_path / "lab")


def test_idx_dataset_fields(idx_files):
    ds = tandem.data.Idx(*idx_files)
    assert len(ds) == 60 and ds.fields == ["image", "label"]


def test_loader_visits_pytorchs_shuffled_order_in_batches(idx_files):
    ds = tandem.data.Idx(*idx_files)
    loader = tandem.data.Loader(ds, batch_size=16, workers=3, shuffle=True, seed=7)
    assert len(loader) == 3  # 60 // 16, the short batch dropped
    for epoch in range(2):  # each pass draws its own order: torch.randperm(seed + epoch)
        order = torch.randperm(60, generator=torch.Generator().manual_seed(7 + epoch))
        batches = list(loader)
        assert len(batches) == 3
        got = torch.cat([b["indices"] for b in batches])
        assert torch.equal(got, order[:48])
        for b in batches:
            assert b["image"].shape == (16, 1, 28, 28) and b["image"].dtype == torch.uint8
            assert torch.equal(b["image"][:, 0, 0, 0].long(), b["indices"])
            assert torch.equal(b["label"], b["indices"] % 10)


def test_batches_are_copies_the_workers_do_not_overwrite(idx_files):
    ds = tandem.data.Idx(*idx_files)
    kept = list(tandem.data.Loader(ds, batch_size=4, workers=2, depth=2))  # ring smaller than 15
    for k, b in enumerate(kept):
        assert torch.equal(b["indices"], torch.arange(4 * k, 4 * k + 4))
        assert torch.equal(b["image"][:, 0, 0, 0].long(), b["indices"])


def test_bad_input_is_named(tmp_path, idx_files):
    with pytest.raises(Exception, match="nowhere"):
        tandem.data.Idx(str(tmp_path / "nowhere.gz"), idx_files[1])
    with pytest.raises(ValueError, match="batch_size 0"):
        tandem.data.Loader(tandem.data.Idx(*idx_files), batch_size=0)
    with pytest.raises(Exception, match="does not exist|no such|No such"):
        tandem.data.ImageFolder(str(tmp_path / "no-folder"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_batches_land_on_the_device(idx_files):
    loader = tandem.data.Loader(tandem.data.Idx(*idx_files), batch_size=8, device="cuda")
    for b in loader:
        assert b["image"].is_cuda
        assert torch.equal(b["image"][:, 0, 0, 0].long().cpu(), b["indices"])

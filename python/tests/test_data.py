"""tandem.data: the C++ loader over IDX files (written here), in PyTorch's shuffled order."""
import gzip
import os
import struct
import threading

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


def test_datasets_are_classes_of_their_own(idx_files):
    idx = tandem.data.Idx(*idx_files)
    rnd = tandem.data.Random(5, label=((), torch.int64, 3))
    own = tandem.data.TorchDataset([torch.zeros(2)] * 4)
    for ds, cls in ((idx, tandem.data.Idx), (rnd, tandem.data.Random),
                    (own, tandem.data.TorchDataset)):
        assert isinstance(ds, cls) and isinstance(ds, tandem.data.Dataset), type(ds)
    assert not isinstance(idx, tandem.data.Random)
    assert (len(rnd), rnd.fields, len(own)) == (5, ["label"], 4)
    batches = list(tandem.data.Loader(rnd, batch_size=5, workers=1))  # the loader reads it
    assert batches[0]["label"].shape == (5,)


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


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_ranks_loader_visits_its_distributed_sampler_shard(idx_files, shuffle):
    ds = tandem.data.Idx(*idx_files)  # 60 samples over 7 ranks: 9 each, the order padded
    for rank in range(7):
        loader = tandem.data.Loader(ds, batch_size=4, workers=2, shuffle=shuffle, seed=5,
                                    rank=rank, world_size=7, drop_last=False)
        sampler = torch.utils.data.DistributedSampler(range(60), num_replicas=7, rank=rank,
                                                      shuffle=shuffle, seed=5)
        assert len(loader) == 3  # ceil(9 / 4)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            got = torch.cat([b["indices"] for b in loader])
            assert got.tolist() == list(sampler)
    with pytest.raises(ValueError, match="rank 2 of world_size 2"):
        tandem.data.Loader(ds, batch_size=4, rank=2, world_size=2)


def test_batches_are_copies_the_workers_do_not_overwrite(idx_files):
    ds = tandem.data.Idx(*idx_files)
    kept = list(tandem.data.Loader(ds, batch_size=4, workers=2, depth=2))  # ring smaller than 15
    for k, b in enumerate(kept):
        assert torch.equal(b["indices"], torch.arange(4 * k, 4 * k + 4))
        assert torch.equal(b["image"][:, 0, 0, 0].long(), b["indices"])


class _NiceOfTheLoadingThread:
    """Sample i: the nice value of the thread that loads it (a C++ worker, under the GIL)."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.tensor([os.getpriority(os.PRIO_PROCESS, threading.get_native_id())])


def test_the_workers_run_at_their_nice_value_and_the_loop_keeps_its_own():
    ds = tandem.data.TorchDataset(_NiceOfTheLoadingThread())
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    for nice in (0, 7):
        seen = torch.cat([b["input"] for b in tandem.data.Loader(ds, batch_size=3, workers=2,
                                                                 worker_nice=nice)])
        assert seen.tolist() == [[max(mine, nice)]] * 12, (nice, seen.tolist())
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    with pytest.raises(ValueError, match="worker_nice 20 is not valid: expected 0 to 19"):
        tandem.data.Loader(ds, batch_size=3, worker_nice=20)


def test_bad_input_is_named(tmp_path, idx_files):
    with pytest.raises(Exception, match="nowhere"):
        tandem.data.Idx(str(tmp_path / "nowhere.gz"), idx_files[1])
    with pytest.raises(ValueError, match="batch_size 0"):
        tandem.data.Loader(tandem.data.Idx(*idx_files), batch_size=0)
    # Not a whole number: named, never compared or truncated (as the Trainer's arguments).
    with pytest.raises(TypeError, match="batch_size '4' is a str: expected a whole number"):
        tandem.data.Loader(tandem.data.Idx(*idx_files), batch_size="4")
    with pytest.raises(TypeError, match="workers 1.5 is a float"):
        tandem.data.Loader(tandem.data.Idx(*idx_files), batch_size=4, workers=1.5)
    # Fewer samples than one batch: every pass would be empty, so it is refused as the Trainer
    # refuses it; keeping the short batch is the way.
    few = tandem.data.Random(5, x=((2,), torch.uint8))
    with pytest.raises(ValueError, match="the dataset has 5 samples, fewer than one batch of 8"):
        tandem.data.Loader(few, batch_size=8)
    with pytest.raises(ValueError, match=r"5 samples \(3 for each of 2 ranks\)"):
        tandem.data.Loader(few, batch_size=4, rank=0, world_size=2)
    assert [len(b["indices"]) for b in tandem.data.Loader(few, batch_size=8, workers=1,
                                                           drop_last=False)] == [5]
    with pytest.raises(Exception, match="does not exist|no such|No such"):
        tandem.data.ImageFolder(str(tmp_path / "no-folder"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_batches_land_on_the_device(idx_files):
    loader = tandem.data.Loader(tandem.data.Idx(*idx_files), batch_size=8, device="cuda")
    for b in loader:
        assert b["image"].is_cuda
        assert torch.equal(b["image"][:, 0, 0, 0].long().cpu(), b["indices"])


def _photo_like(h, w):
    """A smooth RGB image (gradients and a soft disc), which JPEG keeps close."""
    y = torch.linspace(0, 1, h).view(h, 1)
    x = torch.linspace(0, 1, w).view(1, w)
    disc = ((y - 0.5) ** 2 + (x - 0.5) ** 2 < 0.1).float()
    rgb = torch.stack([x.expand(h, w), y.expand(h, w), 0.3 + 0.5 * disc])
    return (rgb * 255).round().to(torch.uint8)


def test_decode_image_reads_png_exactly_and_jpeg_closely_in_either_layout(tmp_path):
    image = _photo_like(30, 40)
    png = tandem.data.encode_image(image, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert torch.equal(tandem.data.decode_image(png), image)
    assert torch.equal(tandem.data.decode_image(png, layout="HWC"), image.permute(1, 2, 0))
    gray = tandem.data.decode_image(bytearray(png), channels=1)
    assert gray.shape == (1, 30, 40)

    jpeg = tandem.data.encode_image(image, "jpeg", quality=95)
    path = tmp_path / "a.jpg"
    path.write_bytes(jpeg)
    decoded = tandem.data.decode_image(str(path))
    assert decoded.shape == (3, 30, 40) and decoded.dtype == torch.uint8
    assert torch.equal(tandem.data.decode_image(torch.frombuffer(bytearray(jpeg), dtype=torch.uint8)),
                       decoded)
    assert (decoded.float() - image.float()).abs().mean() < 6  # a swapped channel: ~100


def test_decode_image_min_size_picks_the_smallest_dct_scale_that_covers_it():
    jpeg = tandem.data.encode_image(_photo_like(480, 640), "jpeg")
    assert tandem.data.decode_image(jpeg).shape == (3, 480, 640)
    assert tandem.data.decode_image(jpeg, min_size=224).shape == (3, 240, 320)  # 1/2
    assert tandem.data.decode_image(jpeg, min_size=100).shape == (3, 120, 160)  # 1/4
    assert tandem.data.decode_image(jpeg, min_size=241).shape == (3, 480, 640)  # 1/2 too small
    half = tandem.data.decode_image(jpeg, min_size=224).float()
    full = tandem.data.decode_image(jpeg).float()
    pooled = torch.nn.functional.avg_pool2d(full.unsqueeze(0), 2).squeeze(0)
    assert (half - pooled).abs().mean() < 2  # the DCT-domain 1/2 is close to a 2x2 mean


def test_decode_image_names_bad_input(tmp_path):
    jpeg = tandem.data.encode_image(_photo_like(64, 64), "jpeg")
    bad = tmp_path / "cut.jpg"
    bad.write_bytes(jpeg[: len(jpeg) // 2])
    with pytest.raises(RuntimeError, match="cut.jpg.*truncated"):
        tandem.data.decode_image(str(bad))
    with pytest.raises(RuntimeError, match="<bytes>.*not a JPEG or PNG"):
        tandem.data.decode_image(b"GIF89a....")
    with pytest.raises(ValueError, match="channels must be 1 .* or 3"):
        tandem.data.decode_image(jpeg, channels=2)
    with pytest.raises(ValueError, match="1-D uint8 on the CPU, got torch.float32"):
        tandem.data.decode_image(torch.zeros(10))
    with pytest.raises(ValueError, match="layout"):
        tandem.data.decode_image(jpeg, layout="NCHW")
    with pytest.raises(ValueError, match="format"):
        tandem.data.encode_image(_photo_like(8, 8), "gif")

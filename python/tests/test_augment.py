"""tandem.augment as a torch op: the function it computes, its randomness, its errors, and
torch.compile tracing through it (the op's Meta kernel). CPU tests run in CI; the CUDA ones
skip without a GPU."""
import pytest
import torch

import tandem

CUDA = torch.cuda.is_available()


def batch(b=2, c=3, h=16, w=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, c, h, w), dtype=torch.uint8, generator=g)


def identity_spec(h=16, w=20, **kw):
    """The whole image, its own size, no rotation, no blur: only the normalization is left."""
    base = dict(crop=(h, w), out=(h, w), max_rotation_deg=0.0, blur_kernel=1,
                mean=(10.0, 20.0, 30.0), std=(2.0, 4.0, 8.0), hflip_probability=0.0)
    base.update(kw)
    return tandem.AugmentSpec(**base)


def normalized(x, spec):
    mean = torch.tensor(spec.mean).view(1, -1, 1, 1)
    std = torch.tensor(spec.std).view(1, -1, 1, 1)
    return (x.float() - mean) / std


def test_defaults_are_the_cpp_librarys():
    spec = tandem.AugmentSpec()
    assert (spec.crop, spec.out, spec.blur_kernel) == ((128, 128), (256, 256), 7)


def test_an_identity_spec_only_normalizes():
    x, spec = batch(), identity_spec()
    y = tandem.augment(x, spec)
    assert y.dtype == torch.float32 and y.shape == (2, 3, 16, 20)
    torch.testing.assert_close(y, normalized(x, spec), rtol=0, atol=1e-5)


def test_flip_probability_one_mirrors_every_sample():
    x, spec = batch(), identity_spec(hflip_probability=1.0)
    torch.testing.assert_close(tandem.augment(x, spec), normalized(x, spec).flip(-1),
                               rtol=0, atol=1e-5)


def test_a_seeded_generator_repeats_and_advances():
    x = batch(b=4, h=64, w=64)
    spec = tandem.AugmentSpec(crop=(40, 40), out=(32, 32), max_rotation_deg=30, blur_kernel=5,
                              hflip_probability=0.5)
    a = tandem.augment(x, spec, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    b = tandem.augment(x, spec, g)
    c = tandem.augment(x, spec, g)  # the generator moved on: new crops and angles
    assert torch.equal(a, b)
    assert not torch.equal(b, c)
    assert a.shape == (4, 3, 32, 32) and torch.isfinite(a).all()


def test_bad_input_is_named():
    with pytest.raises(RuntimeError, match="uint8"):
        tandem.augment(batch().float(), identity_spec())
    with pytest.raises(RuntimeError, match="blur"):
        tandem.augment(batch(), identity_spec(blur_kernel=4))
    with pytest.raises(RuntimeError, match="crop"):
        tandem.augment(batch(), identity_spec(h=32))  # a crop larger than the image


def test_torch_compile_traces_through_the_op():
    x, spec = batch(), identity_spec(hflip_probability=1.0)

    def step(images):
        return tandem.augment(images, spec).mean(dim=(2, 3))

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), step(x), rtol=0, atol=0)


def test_fake_tensors_get_the_output_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(8, 3, 64, 48, dtype=torch.uint8)
        y = tandem.augment(x, tandem.AugmentSpec(crop=(32, 32), out=(24, 40)))
    assert y.shape == (8, 3, 24, 40) and y.dtype == torch.float32


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_cuda_kernel_computes_the_cpu_reference():
    x, spec = batch(b=3, h=32, w=48), identity_spec(h=32, w=48, hflip_probability=1.0)
    torch.testing.assert_close(tandem.augment(x.cuda(), spec).cpu(), tandem.augment(x, spec),
                               rtol=0, atol=1e-5)


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_cuda_draws_from_a_cuda_generator_and_repeats():
    x = batch(b=8, h=256, w=256).cuda()
    spec = tandem.AugmentSpec()
    a = tandem.augment(x, spec, torch.Generator("cuda").manual_seed(1))
    b = tandem.augment(x, spec, torch.Generator("cuda").manual_seed(1))
    assert torch.equal(a, b) and a.shape == (8, 3, 256, 256)

"""The forward does not wait on the host: no .item(), bool(tensor), .tolist(), float(), int() or index() of a
tensor during a layer's forward, with the value checks as asynchronous asserts (what runs on a GPU); and on CUDA
(skipped without a GPU) no synchronising CUDA call at all, under torch.cuda.set_sync_debug_mode('error')."""

import contextlib
import traceback

import pytest
import torch

from boltzmann_attention import BoltzmannAttention, value_checks

READS = ("item", "__bool__", "tolist", "__float__", "__int__", "__index__")


@contextlib.contextmanager
def host_reads():
    """The (kind, file:line) of every host read of a tensor's value inside the context."""
    found, original = [], {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name):
        def read(self, *args, **kwargs):
            caller = traceback.extract_stack()[-2]
            found.append((name, f"{caller.filename.rsplit('src/', 1)[-1]}:{caller.lineno}"))
            return original[name](self, *args, **kwargs)
        return read

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield found
    finally:
        for name, fn in original.items():
            setattr(torch.Tensor, name, fn)


def test_the_counter_sees_each_kind_of_read():
    x = torch.ones(2)
    with host_reads() as found:
        x.sum().item(), bool(x.all()), x.tolist(), float(x[0]), int(x[0]), [1, 2][x[0].long()]
    assert [kind for kind, _ in found] == list(READS)


LAYERS = {
    "softmax": dict(mode="softmax"),
    "softmax-rope": dict(mode="softmax", position="rope"),
    "h": dict(mode="h"),
    "h-slot": dict(mode="h", slot_bias=4),
    "fox": dict(mode="fox"),
    "stickbreaking": dict(mode="stickbreaking"),
    "mta": dict(mode="mta"),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_forward_reads_nothing_from_the_host(name):
    torch.manual_seed(0)
    layer = BoltzmannAttention(16, 2, max_len=12, **LAYERS[name])
    x = torch.randn(2, 12, 16)
    layer(x)  # first call: caches built
    with value_checks("async"), host_reads() as found:
        layer(x, need_weights=True)
    assert found == []


SOLVED = {
    "h+J exact": dict(coupling_init_std=0.1),
    "h+J configurations": dict(coupling_init_std=0.1, method="configurations"),
    "window": dict(coupling="window", coupling_window=4, coupling_init_std=0.1),
    "window split": dict(coupling="window", coupling_window=4, coupling_init_std=0.1,
                         method_options={"window_path": "split"}),
    "window configurations": dict(coupling="window", coupling_window=4, coupling_init_std=0.1,
                                  method_options={"window_path": "configurations"}),
    # the sequential chain reads its chains' lengths from the causal mask once (by its key); the chunked scan never
    "keys chain": dict(coupling="keys", coupling_range=3, coupling_init_std=0.1, method="chain"),
    "keys chain chunked": dict(coupling="keys", coupling_range=3, coupling_init_std=0.1, method="chain",
                               method_options={"chunk_length": 4}),
}


@pytest.mark.parametrize("name", sorted(SOLVED))
def test_a_solved_forward_reads_nothing_from_the_host(name):
    torch.manual_seed(0)
    layer = BoltzmannAttention(16, 2, max_len=12, **SOLVED[name])
    x = torch.randn(2, 12, 16)
    first = layer(x)[0]
    with value_checks("async"), host_reads() as found:
        out = layer(x)[0]
    assert found == []
    torch.testing.assert_close(out, first, atol=0, rtol=0)  # the remembered plan is the one the mask gives


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", sorted({**LAYERS, **SOLVED}))
def test_a_cuda_forward_never_synchronises(name):
    """On CUDA the default value checks are asynchronous; after a first call (caches, plans) a forward makes no
    synchronising call (a device-to-host copy, .item(), nonzero, a stream sync): set_sync_debug_mode('error')
    turns any into a RuntimeError."""
    torch.manual_seed(0)
    options = {**LAYERS, **SOLVED}[name]
    layer = BoltzmannAttention(16, 2, max_len=12, **options).cuda()
    x = torch.randn(2, 12, 16, device="cuda")
    first = layer(x)[0]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = layer(x)[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(out, first, atol=0, rtol=0)


def test_without_host_reads_a_row_beyond_float32_is_refused_not_rescued(monkeypatch):
    """Where checks read the host the float32 rows beyond the scale limit are solved again in float64 (equal to
    the float64 reference); under asynchronous asserts the same rows fail the step, naming the remedies."""
    from boltzmann_attention import ising
    from boltzmann_attention.ising import numerics, reference

    monkeypatch.setattr(numerics, "FLOAT32_SCALE_LIMIT", 1.0)  # every row of these fields is beyond it
    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, 5, 6, generator=g, dtype=torch.float64)
    J = torch.randn(6, 6, generator=g, dtype=torch.float64)
    J = (J + J.T).fill_diagonal_(0) / 2
    mask = torch.ones(5, 6, dtype=torch.bool).tril(1)
    for m in (None, mask):
        rescued = ising.marginals(h.float(), J.float(), mask=m)
        torch.testing.assert_close(rescued.double(), reference.marginals(h, J, mask=m), atol=1e-6, rtol=0)
        with value_checks("async"), pytest.raises(RuntimeError, match=r"value_checks\('host'\)"):
            ising.marginals(h.float(), J.float(), mask=m)
    with value_checks("async"):  # float64 rows within float64's resolution: solved as on the host
        torch.testing.assert_close(ising.marginals(h, J, mask=mask), reference.marginals(h, J, mask=mask))


def test_a_mask_key_given_to_masks_of_different_values_is_refused():
    from boltzmann_attention.ising import exact

    h, J = torch.randn(4, 5), torch.zeros(5, 5)
    J[0, 1] = J[1, 0] = 0.5
    causal = torch.ones(4, 5, dtype=torch.bool).tril(1)
    exact.marginals(h, J, None, causal, mask_key="test: one mask")
    with pytest.raises(ValueError, match="mask_key 'test: one mask' was given to masks of different values"):
        exact.marginals(h, J, None, causal.flip(-1), mask_key="test: one mask")


def test_the_denormal_probe_sees_the_threads_flush_setting():
    """no_denormals turns flushing on and back off, and leaves it on where it was already on."""
    import sys

    from boltzmann_attention.ising import numerics

    def flushed():
        return bool(torch.tensor(sys.float_info.min, dtype=torch.float64) * 0.5 == 0)

    assert not flushed()
    with numerics.no_denormals(torch.device("cpu")):
        assert flushed()
    assert not flushed()
    torch.set_flush_denormal(True)
    try:
        with numerics.no_denormals(torch.device("cpu")):
            assert flushed()
        assert flushed()
    finally:
        torch.set_flush_denormal(False)


def test_each_policy_refuses_nan_as_documented():
    layer = BoltzmannAttention(8, 2, max_len=6, mode="h")
    x = torch.randn(1, 6, 8)
    x[0, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="the field h = scale"):  # the default on CPU: named, on the host
        layer(x)
    with value_checks("host"), pytest.raises(ValueError, match="the field h = scale"):
        layer(x)
    with value_checks("async"), pytest.raises(RuntimeError, match="NaN or inf in the field h"):
        layer(x)
    with value_checks("off"):
        assert torch.isnan(layer(x)[0]).any()
    with pytest.raises(ValueError, match="unknown value-check policy 'never'"), value_checks("never"):
        pass

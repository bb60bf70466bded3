"""Half-precision operands are read in place: converted while packing, never
as a whole-array float32 copy, with the same results as converting first."""
import tracemalloc

import numpy as np
import pytest

import raggeddot
from raggeddot import runtime

from helpers import KERNELS   # the float families: widening arithmetic, exact packing

ml_dtypes = pytest.importorskip("ml_dtypes")
HALF = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]


def _traced_peak(call):
    """The peak of the memory Python's allocators trace during ``call()``,
    with no result buffers kept for reuse."""
    with runtime.configured(buffer_cache=0):
        tracemalloc.start()
        try:
            call()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_no_float32_copy_of_the_operands(rng, dtype):
    m, k, n, g = 2048, 1024, 256, 8
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs = rng.standard_normal((g, k, n)).astype(dtype)
    gs = np.full(g, m // g)
    calls = {   # name: (call, bytes of its result)
        "ragged_dot": (lambda: raggeddot.ragged_dot(lhs, rhs, gs), dtype.itemsize * m * n),
        "tgmm": (lambda: raggeddot.tgmm(lhs.T, lhs[:, :n], gs), 4 * g * k * n),  # megablox: float32 out
    }
    for name, (call, result) in calls.items():
        copy = 4 * (lhs.size + (rhs.size if name == "ragged_dot" else m * n))  # a float32 copy's bytes
        call()                                          # warm-up (packing buffers)
        peak = _traced_peak(call)
        assert peak < result + copy // 8, (name, peak, result, copy)


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("kernel", KERNELS)
def test_same_result_as_converting_first(rng, dtype, kernel):
    lhs = rng.standard_normal((300, 70)).astype(dtype)
    rhs = rng.standard_normal((4, 70, 50)).astype(dtype)
    gs = np.array([100, 0, 150, 40])
    with runtime.configured(kernel=kernel):
        got = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float32)
        want = raggeddot.ragged_dot(lhs.astype(np.float32), rhs.astype(np.float32), gs)
        assert np.array_equal(got, want)
        half = raggeddot.ragged_dot(lhs, rhs, gs)
        assert half.dtype == dtype and np.array_equal(half, want.astype(dtype))
        t = raggeddot.tgmm(lhs.T, rhs[0, :, :].T.repeat(6, axis=0)[:300], gs,
                           preferred_element_type=np.float32)
        t_want = raggeddot.tgmm(lhs.T.astype(np.float32),
                                rhs[0, :, :].T.repeat(6, axis=0)[:300].astype(np.float32), gs)
        assert np.array_equal(t, t_want)
        mixed = raggeddot.ragged_dot(lhs, rhs.astype(np.float64), gs)
        assert mixed.dtype == np.float64
        assert np.array_equal(mixed, raggeddot.ragged_dot(lhs.astype(np.float64), rhs.astype(np.float64), gs))


def _rdg_cases(rng, dtype, m=256, k=96, n=64, g=4):
    """(name, lhs, rhs, group_sizes, dimension numbers) for each of
    ragged_dot_general's modes, with half-precision operands, one of them a
    transposed view."""
    DN = raggeddot.RaggedDotDimensionNumbers
    gs = np.array([m // 2, 0, m // 4, m // 4])
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs_t = rng.standard_normal((g, n, k)).astype(dtype).transpose(0, 2, 1)   # [g, k, n], strided
    bl = rng.standard_normal((g, 24, k)).astype(dtype)
    br = rng.standard_normal((g, k, 40)).astype(dtype)
    return [
        ("ragged-noncontracting", lhs, rhs_t, gs,
         DN((([1], [1]), ([], [])), [0], [0])),
        ("ragged-contracting", lhs.T, rng.standard_normal((m, n)).astype(dtype), gs,
         DN((([1], [0]), ([], [])), [1], [])),
        ("ragged-batch", bl, br, np.array([1, 2, 0, 1]),
         DN((([2], [1]), ([0], [0])), [0], [])),
    ]


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("kernel", KERNELS)
def test_ragged_dot_general_reads_half_in_place(rng, dtype, kernel):
    """Every mode gives exactly what converting the operands to float32
    first gives (the products and sums are the same float32 operations),
    and rounds the result once to the half dtype."""
    with runtime.configured(kernel=kernel):
        for name, lhs, rhs, gs, dn in _rdg_cases(rng, dtype):
            want = raggeddot.ragged_dot_general(lhs.astype(np.float32), rhs.astype(np.float32), gs, dn)
            got = raggeddot.ragged_dot_general(lhs, rhs, gs, dn, preferred_element_type=np.float32)
            assert got.dtype == np.float32 and np.array_equal(got, want), name
            half = raggeddot.ragged_dot_general(lhs, rhs, gs, dn)
            assert half.dtype == dtype and np.array_equal(half, want.astype(dtype)), name


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_ragged_dot_general_allocates_no_float32_copy(rng, dtype):
    for name, lhs, rhs, gs, dn in _rdg_cases(rng, dtype, m=2048, k=512, n=256):
        call = lambda: raggeddot.ragged_dot_general(lhs, rhs, gs, dn, preferred_element_type=np.float32)
        result = call().nbytes
        copy = 4 * (lhs.size + rhs.size)     # what float32 copies of the operands would take
        peak = _traced_peak(call)
        assert peak < result + copy // 8, (name, peak, result, copy)


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("m,k,n,g", [(1, 1, 1, 1), (33, 65, 17, 5), (200, 257, 50, 16), (128, 2048, 64, 4)])
def test_matches_jax_in_half_precision(jax, rng, dtype, m, k, n, g):
    """jax.lax.ragged_dot and ragged_dot_general with half-precision inputs
    (unit-scale values, so each output is O(sqrt(k)) and the tolerance is a
    few roundings of the output dtype): same dtype, same values up to the
    output's own rounding."""
    from helpers import check_close, random_group_sizes
    jnp = jax.numpy
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs = rng.standard_normal((g, k, n)).astype(dtype)
    gs = random_group_sizes(rng, g, m)
    gs[rng.random(g) < 0.3] = 0
    want = np.asarray(jax.lax.ragged_dot(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(gs, jnp.int32)))
    got = raggeddot.ragged_dot(lhs, rhs, gs)
    assert got.dtype == want.dtype == dtype
    check_close(got, want, dtype, err_msg=f"ragged_dot gs={gs.tolist()}")
    for name, a, b, sizes, dn in _rdg_cases(rng, dtype, m=max(m, 4) * 4, k=k, n=n):
        jdn = jax.lax.RaggedDotDimensionNumbers(dn.dot_dimension_numbers, dn.lhs_ragged_dimensions,
                                                dn.rhs_group_dimensions)
        want = np.asarray(jax.lax.ragged_dot_general(jnp.asarray(a), jnp.asarray(b),
                                                     jnp.asarray(sizes, jnp.int32), jdn))
        got = raggeddot.ragged_dot_general(a, b, sizes, dn)
        assert got.dtype == want.dtype == dtype, name
        check_close(got, want, dtype, err_msg=name)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_every_half_value_is_widened_exactly(dtype, kernel):
    """All 65536 bit patterns (subnormals, infinities, NaNs included) go
    through the packing of A and of B and come out as NumPy's exact
    widening (zeros compared by value: the product's 0 + (-0) is +0)."""
    h = np.arange(65536, dtype=np.uint16).view(dtype)
    for wide, bits in ((np.float32, np.uint32), (np.float64, np.uint64)):  # both packed widths
        with np.errstate(invalid="ignore"):   # ml_dtypes flags the cast of NaN patterns
            want = h.astype(wide)
        with runtime.configured(kernel=kernel):
            as_lhs = raggeddot.ragged_dot(h.reshape(-1, 1), np.ones((1, 1, 1), dtype), np.array([65536]),
                                          preferred_element_type=wide)[:, 0]
            as_rhs = raggeddot.ragged_dot(np.ones((1, 1), dtype), h.reshape(1, 1, -1), np.array([1]),
                                          preferred_element_type=wide)[0]
        nan = np.isnan(want)
        nonzero = ~nan & (want != 0)
        for got in (as_lhs, as_rhs):
            assert got.dtype == wide
            assert np.array_equal(np.isnan(got), nan)
            assert np.array_equal(got[~nan], want[~nan])
            assert np.array_equal(got[nonzero].view(bits), want[nonzero].view(bits))


@pytest.mark.parametrize("portable", [False, True], ids=["native", "portable"])
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_results_narrowed_as_numpy_rounds(rng, dtype, portable):
    """Half-precision results are rounded once from float32, to nearest
    even, exactly as NumPy / ml_dtypes cast (random bit patterns, every
    pattern around the subnormal, underflow and overflow boundaries,
    infinities and NaNs), with F16C and in plain C."""
    from raggeddot import _core
    bits = np.concatenate([
        rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32),
        np.arange(0x33000000 - 5000, 0x33000000 + 5000, dtype=np.uint32),     # 2^-25: half of the smallest subnormal
        np.arange(0x38800000 - 70000, 0x38800000 + 70000, dtype=np.uint32),   # 2^-14: the smallest normal
        np.arange(0x477fe000, 0x47800100, dtype=np.uint32),                   # 65504..65536: overflow
        np.arange(0x7f7f0000, 0x7f800010, dtype=np.uint32),                   # bfloat16 overflow, inf, NaNs
        np.array([0, 0x80000000, 0xff800000, 0x7fc00000, 0xffc00001], dtype=np.uint32)])
    f = bits.view(np.float32)
    got = np.empty(f.shape, dtype=dtype)
    _core.narrow(f, got, portable)
    with np.errstate(over="ignore", invalid="ignore"):
        want = f.astype(dtype)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_gathers_read_half_rows_in_place(rng, dtype):
    """ragged_gather / ragged_gather_reduce on 16-bit rows: the results of
    converting first, rounded once, and no float32 copy of the rows."""
    T, k, d = 2048, 8, 256
    x = rng.standard_normal((T, d)).astype(dtype)
    y = rng.standard_normal((T * k, d)).astype(dtype)
    idx = rng.integers(0, T, T * k)
    slots = rng.permutation(T * k).reshape(T, k)
    slots[rng.random((T, k)) < 0.1] = -1
    w = rng.random((T, k)).astype(np.float32)
    s = rng.random(T * k).astype(np.float32)
    for got, want in [
        (raggeddot.ragged_gather(x, idx), x[idx]),
        (raggeddot.ragged_gather(x, idx, s), raggeddot.ragged_gather(x.astype(np.float32), idx, s).astype(dtype)),
        (raggeddot.ragged_gather_reduce(y, slots), raggeddot.ragged_gather_reduce(y.astype(np.float32), slots).astype(dtype)),
        (raggeddot.ragged_gather_reduce(y, slots, w),
         raggeddot.ragged_gather_reduce(y.astype(np.float32), slots, w).astype(dtype)),
    ]:
        assert got.dtype == dtype and np.array_equal(got.view(np.uint16), want.view(np.uint16))
    raggeddot.ragged_gather_reduce(y, slots, w)
    peak = _traced_peak(lambda: raggeddot.ragged_gather_reduce(y, slots, w))
    assert peak < 4 * y.size // 2, peak      # a float32 copy of y alone would take 4 * y.size


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_kernels_round_16bit_outputs_once(rng, dtype, kernel):
    """A float16 / bfloat16 output is written by the kernels tile by tile,
    each tile rounded once from float32: bit for bit the float32 result
    narrowed afterwards, in both driver modes, accumulating, into strided
    outputs and from prepacked weights (wide outputs span several tiles)."""
    from raggeddot import _core
    bits = lambda a: np.ascontiguousarray(a).view(np.uint16)   # noqa: E731
    with runtime.configured(kernel=kernel):
        m, k, n, g = 150, 300, 1100, 3
        lhs = rng.standard_normal((m, k)).astype(dtype)
        rhs = rng.standard_normal((g, k, n)).astype(dtype)
        bounds = np.array([0, 60, 60, 140], dtype=np.int64)
        old = rng.standard_normal((n, m)).astype(dtype).T          # a transposed view
        for accumulate in (False, True):
            want = old.astype(np.float32)
            _core.ragged_rows(lhs, rhs, bounds, want, accumulate)
            got = old.copy()
            _core.ragged_rows(lhs, rhs, bounds, got, accumulate)
            assert (bits(got) == bits(want.astype(dtype))).all()
            t_old = rng.standard_normal((g, k, 40)).astype(dtype)
            want = t_old.astype(np.float32)
            _core.ragged_contract(lhs.T, lhs[:, :40], bounds, want, accumulate)
            got = t_old.copy()
            _core.ragged_contract(lhs.T, lhs[:, :40], bounds, got, accumulate)
            assert (bits(got) == bits(want.astype(dtype))).all()
        packed = raggeddot.prepack(rhs)
        gs = np.diff(bounds)
        want = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float32)
        assert (bits(raggeddot.ragged_dot(lhs, packed, gs)) == bits(want.astype(dtype))).all()
        assert (bits(raggeddot.ragged_dot(lhs, rhs, gs)) == bits(want.astype(dtype))).all()

"""Half-precision operands are read in place: converted while packing, never
as a whole-array float32 copy, with the same results as converting first."""
import tracemalloc

import numpy as np
import pytest

import raggeddot
from raggeddot import runtime

ml_dtypes = pytest.importorskip("ml_dtypes")
HALF = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_no_float32_copy_of_the_operands(rng, dtype):
    m, k, n, g = 2048, 1024, 256, 8
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs = rng.standard_normal((g, k, n)).astype(dtype)
    gs = np.full(g, m // g)
    calls = {   # name: (call, bytes of its results: float32 accumulator + final dtype)
        "ragged_dot": (lambda: raggeddot.ragged_dot(lhs, rhs, gs), (4 + dtype.itemsize) * m * n),
        "tgmm": (lambda: raggeddot.tgmm(lhs.T, lhs[:, :n], gs), 4 * g * k * n),  # megablox: float32 out
    }
    for name, (call, result) in calls.items():
        copy = 4 * (lhs.size + (rhs.size if name == "ragged_dot" else m * n))  # a float32 copy's bytes
        call()                                          # warm-up (packing buffers)
        with runtime.configured(buffer_cache=0):
            tracemalloc.start()
            try:
                call()
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert peak < result + copy // 8, (name, peak, result, copy)


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("kernel", runtime.runnable_kernels())
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

"""Shared fixtures for the raggeddot test suite.

- ``rng``: a NumPy Generator seeded from the test's node id (crc32, so the
  seed is stable across runs and processes, unlike ``hash()``), so every
  parametrized case gets its own reproducible stream.
- ``assert_close``: ``assert_close(actual, expected, dtype)`` compares with a
  dtype-dependent tolerance on the scaled error
  ``max|a - e| / max(1, max|e|)`` and reports the worst element on failure.
  NaN and inf positions (and the sign of infs) must match exactly.
- ``random_group_sizes``: ``random_group_sizes(rng, g, total)`` splits
  ``total`` rows into ``g`` non-negative sizes (zeros included).
- ``restore_runtime``: restores the thread count and the micro-kernel
  ("auto") after a test, whatever the test did.
"""

import zlib

import numpy as np
import pytest

# Scaled-error tolerance per result dtype (see check_close).
RTOL = {
    np.dtype(np.float64): 1e-12,
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float16): 2e-3,
}
BFLOAT16_RTOL = 1e-2


def tolerance(dtype):
    """Tolerance on max|a-e| / max(1, max|e|) for results of ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype in RTOL:
        return RTOL[dtype]
    if dtype.name == "bfloat16":
        return BFLOAT16_RTOL
    raise ValueError(f"no tolerance defined for dtype {dtype}")


def looser_dtype(*dtypes):
    """The least precise of ``dtypes`` (the one with the largest tolerance)."""
    return max((np.dtype(d) for d in dtypes), key=tolerance)


def check_close(actual, expected, dtype=None, rtol=None, err_msg=""):
    """Assert ``max|a - e| / max(1, max|e|) <= rtol`` over finite entries.

    ``dtype`` selects the tolerance (default: ``expected.dtype``). Shapes
    must be equal; NaN positions, inf positions and inf signs must be equal.
    On failure the message gives the worst difference, where it is, and the
    two values there.
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    prefix = f"{err_msg}: " if err_msg else ""
    assert actual.shape == expected.shape, (
        f"{prefix}shape mismatch: actual {actual.shape} vs expected {expected.shape}")
    if dtype is None:
        dtype = expected.dtype
    if rtol is None:
        rtol = tolerance(dtype)
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)

    a_nan, e_nan = np.isnan(a), np.isnan(e)
    if not np.array_equal(a_nan, e_nan):
        bad = np.argwhere(a_nan != e_nan)
        idx = tuple(bad[0])
        raise AssertionError(
            f"{prefix}NaN positions differ at {len(bad)} entries; first at {idx}: "
            f"actual={a[idx]!r}, expected={e[idx]!r}")
    a_inf, e_inf = np.isinf(a), np.isinf(e)
    if not np.array_equal(a_inf, e_inf) or not np.array_equal(a[a_inf], e[e_inf]):
        bad = np.argwhere((a_inf != e_inf) | (a_inf & e_inf & (a != e)))
        idx = tuple(bad[0])
        raise AssertionError(
            f"{prefix}inf positions/signs differ at {len(bad)} entries; first at {idx}: "
            f"actual={a[idx]!r}, expected={e[idx]!r}")

    finite = np.isfinite(e)
    if not finite.any():
        return
    diff = np.zeros(a.shape)
    diff[finite] = np.abs(a[finite] - e[finite])
    scale = max(1.0, float(np.abs(e[finite]).max()))
    worst = float(diff.max())
    err = worst / scale
    if not err <= rtol:
        idx = np.unravel_index(int(np.argmax(diff)), diff.shape)
        raise AssertionError(
            f"{prefix}scaled error {err:.3e} > rtol {rtol:.1e} (dtype {np.dtype(dtype).name}); "
            f"worst |actual-expected| = {worst:.6e} at index {tuple(int(i) for i in idx)}: "
            f"actual={a[idx]!r}, expected={e[idx]!r}, scale max(1,max|e|)={scale:.6e}")


def random_group_sizes(rng, g, total, dtype=np.int32):
    """``g`` non-negative sizes summing to ``total``, empty groups likely.

    Cut points are drawn uniformly in [0, total] (with repetition), so
    some groups come out empty whenever g is not tiny compared to total.
    """
    if g == 0:
        assert total == 0
        return np.zeros(0, dtype=dtype)
    cuts = np.sort(rng.integers(0, total + 1, size=g - 1))
    sizes = np.diff(np.concatenate([[0], cuts, [total]]))
    assert sizes.sum() == total and (sizes >= 0).all()
    return sizes.astype(dtype)


def group_starts(group_sizes):
    """Row where each group starts (int64, exact)."""
    gs = np.asarray(group_sizes).astype(np.int64)
    return np.concatenate([[0], np.cumsum(gs)[:-1]]).astype(np.int64)


@pytest.fixture
def rng(request):
    seed = zlib.crc32(request.node.nodeid.encode("utf-8"))
    return np.random.default_rng(seed)


@pytest.fixture
def assert_close():
    return check_close


@pytest.fixture(name="random_group_sizes")
def _random_group_sizes_fixture():
    return random_group_sizes


@pytest.fixture
def restore_runtime():
    """Put the thread count, micro-kernel, streaming threshold and buffer
    cache limit back after the test."""
    import raggeddot
    from raggeddot import _core

    saved_threads = raggeddot.get_num_threads()
    info = raggeddot.build_info()
    try:
        yield
    finally:
        _core.set_kernel("auto")
        raggeddot.set_num_threads(saved_threads)
        _core.set_stream_threshold(info["stream_threshold"])
        raggeddot.set_buffer_cache(info["buffer_cache"]["limit"])


def pytest_configure(config):
    """In CI (RAGGEDDOT_REQUIRE_JAX=1) the conformance tests against jax must
    run: a missing jax is an error there, not a reason to skip them."""
    import os

    if os.environ.get("RAGGEDDOT_REQUIRE_JAX") == "1":
        try:
            import jax  # noqa: F401
            from jax.experimental.pallas.ops.tpu.megablox import gmm  # noqa: F401
        except Exception as e:  # ImportError, or a broken install
            raise pytest.UsageError(
                f"RAGGEDDOT_REQUIRE_JAX=1 but jax (with megablox) cannot be imported: {e!r}; "
                "install the test extra: pip install -e '.[test]'"
            )

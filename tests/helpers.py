"""What the test modules share: dtypes, tolerances, the comparison, group-size
patterns, memory layouts and the kernels this CPU runs.

Fixtures live in conftest.py; this module holds plain functions and tables, so
that a test module imports what it uses (``from helpers import check_close``).
Only raggeddot's public modules are used here.
"""

import os

import numpy as np
import pytest

from raggeddot import runtime

try:
    import ml_dtypes
except ImportError:  # jax brings it; without it the bfloat16 cases are left out
    ml_dtypes = None

# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------

BFLOAT16 = None if ml_dtypes is None else np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), np.dtype(np.float64)]          # computed as they are
HALF_DTYPES = [np.dtype(np.float16)] + ([BFLOAT16] if BFLOAT16 is not None else [])
DTYPES = HALF_DTYPES + FLOATS                                   # every float type accepted
INT_DTYPES = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                                    np.uint8, np.uint16, np.uint32, np.uint64)]


def dtype_id(dtype):
    """Test id of a dtype (``float32``), or ``None``."""
    return "None" if dtype is None else np.dtype(dtype).name


def randn(rng, shape, dtype=np.float64):
    """Standard normal values of ``dtype`` (drawn in float32 or float64, the
    other float types rounded from float64)."""
    dtype = np.dtype(dtype)
    if dtype in FLOATS:
        return rng.standard_normal(shape, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------
# Tolerances
# ---------------------------------------------------------------------------

# Scaled error max|a - e| / max(1, max|e|) allowed for a result of each dtype
# (see check_close). Products accumulate in at least float32 and are rounded
# once, so a half-precision result is off by at most one rounding of its own.
# The scaled error does not grow with the contraction length (measured in
# float32 against the float64 oracle: 6e-7 at k=256, 4e-7 at k=16384),
# so the table has no k term.
TOLERANCE = {
    np.dtype(np.float64): 1e-12,
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float16): 2e-3,
}
if BFLOAT16 is not None:
    TOLERANCE[BFLOAT16] = 1e-2

# Elementwise tolerances (np.testing.assert_allclose), for comparisons made
# element by element: the oracle against jax and megablox (whose float32
# products accumulate in float32), and results against plain NumPy products.
ALLCLOSE = {
    np.dtype(np.float32): dict(rtol=2e-5, atol=2e-5),
    np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12),
}

# Worst relative error of a derivative against central finite differences
# (raggeddot.testing.check_grads' defaults: float32 differences are noisy).
GRAD_TOLERANCE = {
    np.dtype(np.float64): 1e-6,
    np.dtype(np.float32): 2e-3,
    np.dtype(np.float16): 5e-2,
}
if BFLOAT16 is not None:
    GRAD_TOLERANCE[BFLOAT16] = 0.15


def tolerance(dtype):
    """Allowed scaled error (see check_close) of a result of ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype not in TOLERANCE:
        raise ValueError(f"no tolerance defined for dtype {dtype}")
    return TOLERANCE[dtype]


def looser_dtype(*dtypes):
    """The least precise of ``dtypes`` (the one with the largest tolerance)."""
    return max((np.dtype(d) for d in dtypes), key=tolerance)


def check_close(actual, expected, dtype=None, rtol=None, err_msg=""):
    """Assert ``max|a - e| / max(1, max|e|) <= rtol`` over the finite entries.

    ``rtol`` defaults to ``tolerance(dtype)``, ``dtype`` to ``expected.dtype``.
    Shapes must be equal; NaN positions, inf positions and inf signs must be
    equal. On failure the message gives the worst difference, where it is,
    and the two values there.
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


def assert_allclose(actual, expected, dtype=None, err_msg=""):
    """np.testing.assert_allclose with the ALLCLOSE tolerances of ``dtype``
    (default ``expected``'s); shapes must be equal."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    dtype = np.dtype(dtype or expected.dtype)
    assert actual.shape == expected.shape, f"{err_msg}: {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, err_msg=err_msg, **ALLCLOSE[dtype])


def snapshot(arrays):
    """Copies of ``arrays`` (None stays None), for assert_unchanged."""
    return [None if a is None else np.array(a, copy=True) for a in arrays]


def assert_unchanged(arrays, copies, names=None, what="input"):
    """Each array still equals its copy: same dtype, shape and values (NaN included)."""
    names = names or [f"{what} {i}" for i in range(len(arrays))]
    for a, c, name in zip(arrays, copies, names):
        if c is None:
            continue
        a = np.asarray(a)
        assert a.dtype == c.dtype and a.shape == c.shape, f"{name}: dtype or shape changed"
        assert np.array_equal(a, c, equal_nan=a.dtype.kind == "f" or a.dtype == BFLOAT16), (
            f"{name} was modified")


# ---------------------------------------------------------------------------
# Group sizes
# ---------------------------------------------------------------------------


def random_group_sizes(rng, g, total, dtype=np.int32, *, empty=0.0):
    """``g`` non-negative sizes summing to ``total``, empty groups likely.

    Cut points are drawn uniformly in [0, total] (with repetition), so some
    groups come out empty whenever g is not tiny compared to total. With
    ``empty`` > 0 each group is also made empty with that probability, its
    rows going to the others (all rows are lost when every group is).
    """
    if g == 0:
        assert total == 0
        return np.zeros(0, dtype=dtype)
    active = rng.random(g) >= empty if empty else np.ones(g, bool)
    sizes = np.zeros(g, np.int64)
    n_active = int(active.sum())
    if n_active:
        cuts = np.sort(rng.integers(0, total + 1, size=n_active - 1))
        sizes[active] = np.diff(np.concatenate([[0], cuts, [total]]))
    assert (sizes >= 0).all() and sizes.sum() in (0, total)
    return sizes.astype(dtype)


def skewed_group_sizes(rng, g, total, dtype=np.int32):
    """``g`` sizes summing to ``total``, each group expecting half the rows of
    the one before it (in a random order): one large group, a long tail of
    small and empty ones."""
    if g == 0:
        return np.zeros(0, dtype=dtype)
    weights = rng.permutation(0.5 ** np.arange(g))
    return rng.multinomial(total, weights / weights.sum()).astype(dtype)


def group_starts(group_sizes):
    """Row where each group starts (int64, exact)."""
    gs = np.asarray(group_sizes).astype(np.int64)
    return np.concatenate([[0], np.cumsum(gs)[:-1]]).astype(np.int64)


def empty_group_patterns(sizes):
    """For every subset of the groups, ``sizes`` with that subset emptied:
    ``(mask, group_sizes)``, bit i of ``mask`` set when group i is empty."""
    sizes = np.asarray(sizes)
    for mask in range(2 ** len(sizes)):
        gs = sizes.copy()
        gs[[i for i in range(len(sizes)) if mask >> i & 1]] = 0
        yield mask, gs


def group_size_patterns(rng, g, m, dtype=np.int32):
    """Named group sizes of ``g`` groups over ``m`` rows, each summing to at most m:
    random (sum m, and below m), random with forced empty groups, skewed,
    all empty, one group holding every row, and every group non-empty."""
    yield "random-full", random_group_sizes(rng, g, m, dtype)
    yield "random-below", random_group_sizes(rng, g, int(rng.integers(0, m + 1)), dtype)
    yield "random-empty", random_group_sizes(rng, g, m, dtype, empty=0.5)
    yield "skewed", skewed_group_sizes(rng, g, m, dtype)
    yield "all-empty", np.zeros(g, dtype)
    if g:
        one = np.zeros(g, dtype)
        one[int(rng.integers(0, g))] = m
        yield "one-full", one
    if m >= g:
        yield "all-nonempty", (random_group_sizes(rng, g, m - g, np.int64) + 1).astype(dtype)


def prefixed_group_sizes(rng, prefix_shape, g, size, *, full_first=False, dtype=np.int32):
    """``prefix_shape + (g,)`` sizes, each row summing to a random total in
    [0, size] (the first row to ``size`` when ``full_first``)."""
    rows = []
    for i in range(int(np.prod(prefix_shape, dtype=np.int64))):
        total = size if (i == 0 and full_first) else int(rng.integers(0, size + 1))
        rows.append(random_group_sizes(rng, g, total, dtype))
    return np.array(rows, dtype=dtype).reshape(tuple(prefix_shape) + (g,))


# ---------------------------------------------------------------------------
# Memory layouts
# ---------------------------------------------------------------------------

# Layouts that keep the values of the array they are given.
VALUE_LAYOUTS = ["contiguous", "fortran", "transposed", "strided", "negative", "offset",
                 "unaligned", "readonly"]
# And two that replace it by a stride-0 view of one of its slices.
LAYOUTS = VALUE_LAYOUTS + ["broadcast_outer", "broadcast_inner"]


def with_layout(x, layout):
    """``x`` in memory layout ``layout``:

    - contiguous: ``x`` itself; fortran: column-major copy;
    - transposed: the last two axes swapped in memory (a transposed view);
    - strided: every axis steps by 2 through a larger buffer;
    - negative: every axis steps by -2 (reversed, strided view);
    - offset: one element past the start of a buffer (not 32/64-byte aligned);
    - unaligned: one *byte* past the start of a buffer (not element-aligned);
    - readonly: a read-only copy;
    - broadcast_outer / broadcast_inner: ``x``'s first / last slice repeated
      along that axis with stride 0 (the values change: every slice equals the
      first).
    """
    x = np.asarray(x)
    if layout == "contiguous":
        return x
    if layout == "fortran":
        return np.asfortranarray(x)
    if layout == "transposed":
        if x.ndim < 2:
            return x
        return np.ascontiguousarray(np.swapaxes(x, -1, -2)).swapaxes(-1, -2)
    if layout in ("strided", "negative"):
        step = 2 if layout == "strided" else -2
        big = np.zeros(tuple(2 * s for s in x.shape), x.dtype)
        view = big[tuple(slice(None, None, step) for _ in x.shape)]
        view[...] = x
        return view
    if layout == "offset":
        buf = np.zeros(x.size + 1, x.dtype)
        view = buf[1:].reshape(x.shape)
        view[...] = x
        return view
    if layout == "unaligned":
        raw = np.zeros(x.nbytes + 1, np.uint8)
        view = raw[1:].view(x.dtype).reshape(x.shape)
        view[...] = x
        assert x.size == 0 or not view.flags.aligned or x.itemsize == 1
        return view
    if layout == "readonly":
        copy = x.copy()
        copy.flags.writeable = False
        return copy
    if layout in ("broadcast_outer", "broadcast_inner"):
        if x.ndim == 0 or x.size == 0:
            return x
        axis = 0 if layout == "broadcast_outer" else x.ndim - 1
        return np.broadcast_to(np.take(x, [0], axis=axis), x.shape)
    raise ValueError(f"unknown layout {layout!r}")


# ---------------------------------------------------------------------------
# Kernels and threads
# ---------------------------------------------------------------------------

_TABLE = [k for k in runtime.build_info()["kernels"] if k["runnable"]]
# every float kernel family this CPU runs (each serves every float compute type)
KERNELS = [k["name"] for k in _TABLE if "float32" in k["types"]]
# the dot-product families this CPU runs, natives and twins, by compute
# type: each serves only its own types (the float families the rest); the
# tile families (AMX) serve the two tile types, Arm's MMLA families one
# MMLA type (which reads the dot types' B panels)
DOT_KERNELS = {ct: [k["name"] for k in _TABLE if ct in k["types"] and "float32" not in k["types"]]
               for ct in ("bfloat16-dot", "int8-dot", "bfloat16-tile", "int8-tile", "bfloat16-mmla",
                          "int8-mmla", "int8-int4-dot", "int8-mxfp4-dot")}
THREAD_COUNTS = (1, 2, 3)              # results must be bitwise equal for each
# the float family that automatic selection runs float32 products on here
# (avx512, avx2, neon or ref)
with runtime.configured(kernel="auto"):
    FLOAT_FAMILY = runtime.build_info()["blocking"]["float32"]["kernel"]


def dot_layout(dtype):
    """The layout prepack gives weights of ``dtype`` ("bfloat16", or "int8"
    for int8 QArrays) for an lhs of that dtype with the kernel selection in
    force: the dot kernels' ("bfloat16-dot" k-pairs, "int8-dot" k-quads:
    vdpbf16ps, vpdpbusd, Arm's UDOT, and the AMX tiles that read them),
    Arm's MMLA kernels' ("bfloat16-mmla", "int8-mmla"), or None (no dot
    products of that dtype are served: the widening layout, or the QArray)."""
    compute = runtime.build_info()["products"][dtype]["compute"]
    if compute.endswith("-tile"):
        return dtype + "-dot"
    return compute if compute.startswith(dtype + "-") and compute != "int8-int32" else None


# the families the fused MoE passes are checked on: automatic choice, the
# portable one, the first tile family (AMX or its twin) and the first SIMD one
FUSED_FAMILIES = ["auto", "ref"] + DOT_KERNELS["bfloat16-tile"][:1] + [k for k in KERNELS if k != "ref"][:1]


def bits(x):
    """The bit patterns of a float array (to compare results bit for bit,
    NaNs and signed zeros included)."""
    x = np.ascontiguousarray(x)
    return x.view({8: np.uint64, 4: np.uint32, 2: np.uint16}[x.dtype.itemsize])


# ---------------------------------------------------------------------------
# Optional dependencies
# ---------------------------------------------------------------------------


def import_hf():
    """``(torch, transformers)`` for a test module that compares against
    transformers (the ``hf`` extra). Without them the module is skipped,
    unless RAGGEDDOT_REQUIRE_HF=1 (CI), where the run fails instead: there
    the conformance tests must run, not skip. Call at module level."""
    try:
        import torch
        import transformers
    except Exception as e:  # ImportError, or a broken install
        if os.environ.get("RAGGEDDOT_REQUIRE_HF") == "1":
            pytest.fail(f"RAGGEDDOT_REQUIRE_HF=1 but torch and transformers cannot be imported: {e!r}; "
                        "install the hf extra: pip install -e '.[hf]'", pytrace=False)
        pytest.skip(f"torch and transformers (the hf extra) are not installed: {e!r}",
                    allow_module_level=True)
    return torch, transformers

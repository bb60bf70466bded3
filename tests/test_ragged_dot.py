"""raggeddot.ragged_dot (the C kernels) against raggeddot.reference.

Every test compares the C result with the pure-NumPy oracle using
``check_close`` (scaled error, see helpers.py); rows past sum(group_sizes)
are additionally checked to be exactly 0 with ``==``.
"""

import itertools

import numpy as np
import pytest

import raggeddot
from raggeddot import reference, runtime

from helpers import (FLOATS, HALF_DTYPES, INT_DTYPES, KERNELS, THREAD_COUNTS, check_close,
                     dtype_id, group_starts, looser_dtype, random_group_sizes, randn)

pytestmark = pytest.mark.usefixtures("restore_runtime")


def check_against_reference(lhs, rhs, group_sizes, *, label="", **kwargs):
    """Run C and reference; compare; check tail rows are exactly zero; return C output."""
    out = raggeddot.ragged_dot(lhs, rhs, group_sizes, **kwargs)
    expected = reference.ragged_dot(np.ascontiguousarray(lhs), np.ascontiguousarray(rhs),
                                    np.ascontiguousarray(group_sizes), **kwargs)
    assert isinstance(out, np.ndarray)
    assert out.shape == (lhs.shape[0], rhs.shape[2]), label
    assert out.dtype == expected.dtype, f"{label}: dtype {out.dtype} != reference {expected.dtype}"
    tol_dtype = looser_dtype(out.dtype, np.result_type(lhs.dtype, rhs.dtype))
    check_close(out, expected, tol_dtype, err_msg=label)
    total = int(np.asarray(group_sizes).astype(np.int64).sum())
    tail = out[total:]
    assert np.all(tail == 0), (
        f"{label}: rows past sum(group_sizes)={total} must be exactly 0; "
        f"{int(np.count_nonzero(tail != 0))} nonzero entries")
    return out


# ---------------------------------------------------------------------------
# The shape grid
# ---------------------------------------------------------------------------

GRID = [0, 1, 7, 128, 300]


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("g", [1, 3, 64])
@pytest.mark.parametrize("n", GRID)
@pytest.mark.parametrize("k", GRID)
@pytest.mark.parametrize("m", GRID)
def test_grid(rng, m, k, n, g, dtype):
    lhs = randn(rng, (m, k), dtype)
    rhs = randn(rng, (g, k, n), dtype)
    # Two sampled group-size patterns per shape: covering all rows, and a sum below m.
    for total in sorted({m, int(rng.integers(0, m + 1)) if m else 0}, reverse=True):
        gs = random_group_sizes(rng, g, total)
        check_against_reference(lhs, rhs, gs,
                                label=f"m={m} k={k} n={n} g={g} gs={gs.tolist()}")


# ---------------------------------------------------------------------------
# Empty groups and sums below m
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("tail", [0, 5])
@pytest.mark.parametrize("g,mask", [(g, mask) for g in (3, 4) for mask in range(2 ** g)])
def test_every_empty_group_pattern(rng, g, mask, tail):
    # bit i of mask set -> group i is empty; other groups get 1..20 rows
    # (crossing the 6-row micro-tile boundaries at random places).
    sizes = np.array([0 if mask >> i & 1 else int(rng.integers(1, 21)) for i in range(g)],
                     dtype=np.int32)
    m = int(sizes.sum()) + tail
    k, n = 19, 23
    for dtype in FLOATS:
        lhs = randn(rng, (m, k), dtype)
        rhs = randn(rng, (g, k, n), dtype)
        out = check_against_reference(lhs, rhs, sizes,
                                      label=f"{np.dtype(dtype).name} gs={sizes.tolist()} m={m}")
        # Every row of a non-empty group equals its own matmul.
        starts = group_starts(sizes)
        for i in range(g):
            rows = slice(starts[i], starts[i] + sizes[i])
            check_close(out[rows], lhs[rows].astype(np.float64) @ rhs[i].astype(np.float64),
                         dtype, err_msg=f"group {i}")


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("m,sizes", [
    (10, [0]),
    (10, [0, 0, 0]),
    (10, [3]),
    (10, [0, 9]),
    (50, [7, 0, 13]),
    (300, [1, 2, 3, 4, 5, 6, 7, 8]),
    (257, [0, 128, 0, 0, 128, 0]),
    (1, [0, 0]),
])
def test_sum_below_m_tail_is_exact_zero(rng, m, sizes, dtype):
    sizes = np.array(sizes, dtype=np.int64)
    g, k, n = len(sizes), 33, 17
    lhs = randn(rng, (m, k), dtype)
    rhs = randn(rng, (g, k, n), dtype)
    out = check_against_reference(lhs, rhs, sizes)
    total = int(sizes.sum())
    assert np.array_equal(out[total:], np.zeros((m - total, n), dtype=out.dtype))


def test_tail_rows_zero_even_with_nan_and_inf_in_lhs_tail(rng):
    # Rows past sum(group_sizes) belong to no group: they are 0 whatever lhs holds there.
    m, k, n, g = 20, 9, 11, 3
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (g, k, n), np.float32)
    gs = np.array([4, 0, 6], dtype=np.int32)
    lhs[10:, 0] = np.nan
    lhs[12:, 3] = np.inf
    out = raggeddot.ragged_dot(lhs, rhs, gs)
    assert np.all(np.isfinite(out[:10]))
    assert np.all(out[10:] == 0), out[10:]


def test_all_rows_in_a_single_group_matches_dense_matmul(rng):
    m, k, n = 257, 129, 65
    for dtype in FLOATS:
        lhs = randn(rng, (m, k), dtype)
        rhs = randn(rng, (3, k, n), dtype)
        out = raggeddot.ragged_dot(lhs, rhs, np.array([0, m, 0], np.int32))
        check_close(out, lhs.astype(np.float64) @ rhs[1].astype(np.float64), dtype)


def test_cache_block_boundaries(rng):
    # Crosses MC (144/72 rows), KC (256) and NC (4080 columns) with partial blocks.
    m, k, n, g = 150, 257, 4097, 3
    for dtype in FLOATS:
        lhs = randn(rng, (m, k), dtype)
        rhs = randn(rng, (g, k, n), dtype)
        gs = np.array([73, 0, 70], np.int32)
        check_against_reference(lhs, rhs, gs, label=np.dtype(dtype).name)


def test_many_small_groups(rng):
    m, k, n, g = 1000, 64, 48, 200
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (g, k, n), np.float32)
    gs = random_group_sizes(rng, g, 990)
    check_against_reference(lhs, rhs, gs)


def test_repeated_calls_bitwise_identical(rng):
    m, k, n, g = 301, 77, 129, 5
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (g, k, n), np.float32)
    gs = random_group_sizes(rng, g, 290)
    first = raggeddot.ragged_dot(lhs, rhs, gs)
    for _ in range(3):
        assert np.array_equal(raggeddot.ragged_dot(lhs, rhs, gs), first)


# ---------------------------------------------------------------------------
# Memory layouts: strides, transposes, Fortran order, negative and zero strides
# ---------------------------------------------------------------------------

def _layouts(rng, m, k, n, g, dtype):
    """(name, lhs, rhs, group_sizes) with unusual memory layouts."""
    L = randn(rng, (2 * m + 1, 3 * k + 2), dtype)
    R = randn(rng, (2 * g, 2 * k + 1, 3 * n), dtype)
    gs_big = np.zeros(3 * g, dtype=np.int64)
    gs_big[::3] = random_group_sizes(rng, g, m - 3)
    lhs_c = randn(rng, (m, k), dtype)
    rhs_c = randn(rng, (g, k, n), dtype)
    gs_c = random_group_sizes(rng, g, m - 3)
    yield "stepped slices", L[1::2, ::3][:m, :k], R[::2, 1::2, ::3], gs_big[::3]
    yield "transposed views", np.ascontiguousarray(lhs_c.T).T, \
        np.ascontiguousarray(rhs_c.transpose(2, 1, 0)).transpose(2, 1, 0), gs_c
    yield "rhs k/n swapped view", lhs_c, np.ascontiguousarray(rhs_c.transpose(0, 2, 1)).transpose(0, 2, 1), gs_c
    yield "fortran order", np.asfortranarray(lhs_c), np.asfortranarray(rhs_c), gs_c
    yield "negative strides", L[::-2, ::-3][:m, :k], R[::-1, ::-2, ::-1][:g, :k, :n], gs_big[3 * g - 3::-3]
    yield "reversed copies", lhs_c[::-1, ::-1], rhs_c[::-1, ::-1, ::-1], gs_c[::-1]
    yield "zero strides (broadcast)", np.broadcast_to(randn(rng, (1, k), dtype), (m, k)), \
        np.broadcast_to(randn(rng, (1, k, n), dtype), (g, k, n)), gs_c
    yield "column-broadcast lhs", np.broadcast_to(randn(rng, (m, 1), dtype), (m, k)), rhs_c, gs_c
    ro_lhs, ro_rhs = lhs_c.copy(), rhs_c.copy()
    ro_lhs.flags.writeable = False
    ro_rhs.flags.writeable = False
    yield "read-only", ro_lhs, ro_rhs, gs_c
    # Unaligned data pointer: a float view starting 1 byte into a byte buffer is impossible,
    # but an offset of one element inside a larger array gives a pointer not 32/64-byte aligned.
    yield "offset by one element", L.reshape(-1)[1:1 + m * k].reshape(m, k), \
        R.reshape(-1)[1:1 + g * k * n].reshape(g, k, n), gs_c


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("m,k,n,g", [(40, 13, 21, 3), (131, 70, 35, 5), (7, 1, 1, 2)])
def test_memory_layouts(rng, m, k, n, g, dtype):
    for name, lhs, rhs, gs in _layouts(rng, m, k, n, g, dtype):
        assert lhs.shape == (m, k) and rhs.shape == (g, k, n) and gs.shape == (g,), name
        copies = (lhs.copy(), rhs.copy(), gs.copy())
        check_against_reference(lhs, rhs, gs, label=name)
        for before, after in zip(copies, (lhs, rhs, gs)):
            assert np.array_equal(before, after), f"{name}: input modified"


# ---------------------------------------------------------------------------
# group_sizes dtypes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("gs_dtype", INT_DTYPES, ids=dtype_id)
def test_group_sizes_every_integer_dtype(rng, gs_dtype):
    m, k, n, g = 120, 17, 19, 5
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (g, k, n), np.float32)
    sizes = random_group_sizes(rng, g, 110, dtype=np.int64)  # each <= 110, fits int8
    out = check_against_reference(lhs, rhs, sizes.astype(gs_dtype),
                                  label=np.dtype(gs_dtype).name)
    assert np.array_equal(out, raggeddot.ragged_dot(lhs, rhs, sizes.astype(np.int32)))


def test_group_sizes_platform_integer_aliases(rng):
    m, k, n, g = 30, 5, 6, 3
    lhs = randn(rng, (m, k), np.float64)
    rhs = randn(rng, (g, k, n), np.float64)
    sizes = np.array([10, 0, 15])
    expected = raggeddot.ragged_dot(lhs, rhs, sizes.astype(np.int32))
    for dt in (np.intc, np.intp, np.uintp, np.longlong, np.ulonglong, np.short, np.byte):
        assert np.array_equal(raggeddot.ragged_dot(lhs, rhs, sizes.astype(dt)), expected), dt


# ---------------------------------------------------------------------------
# Value dtypes: float32, float64, mixed, preferred_element_type, half types
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("lhs_dtype,rhs_dtype", [
    (np.float32, np.float32), (np.float64, np.float64),
    (np.float32, np.float64), (np.float64, np.float32),
], ids=dtype_id)
@pytest.mark.parametrize("pet", [None, np.float32, np.float64],
                         ids=lambda d: "pet=" + (np.dtype(d).name if d else "None"))
def test_dtypes_and_preferred_element_type(rng, lhs_dtype, rhs_dtype, pet):
    m, k, n, g = 77, 45, 38, 4
    lhs = randn(rng, (m, k), lhs_dtype)
    rhs = randn(rng, (g, k, n), rhs_dtype)
    gs = random_group_sizes(rng, g, 70)
    out = check_against_reference(lhs, rhs, gs, preferred_element_type=pet)
    want = np.dtype(pet) if pet is not None else np.result_type(lhs_dtype, rhs_dtype)
    assert out.dtype == want


@pytest.mark.parametrize("pet", [np.float32, "float32", np.dtype("float32"), "f4"],
                         ids=["type", "str", "dtype", "code"])
def test_preferred_element_type_spellings(rng, pet):
    lhs = randn(rng, (10, 4), np.float64)
    rhs = randn(rng, (2, 4, 3), np.float64)
    gs = np.array([4, 5], np.int32)
    out = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=pet)
    assert out.dtype == np.float32
    assert np.array_equal(out, raggeddot.ragged_dot(lhs, rhs, gs,
                                                    preferred_element_type=np.float32))


@pytest.mark.parametrize("half", HALF_DTYPES, ids=dtype_id)
def test_half_precision_if_accepted(rng, half):
    m, k, n, g = 50, 33, 20, 3
    lhs = randn(rng, (m, k), np.float32).astype(half)
    rhs = randn(rng, (g, k, n), np.float32).astype(half)
    gs = random_group_sizes(rng, g, 45)
    try:
        out = raggeddot.ragged_dot(lhs, rhs, gs)
    except TypeError as exc:
        pytest.skip(f"{np.dtype(half).name} not supported: {exc}")
    assert out.dtype == np.dtype(half)
    # Computed in float32 from the exactly-representable half inputs, rounded once.
    expected = reference.ragged_dot(lhs.astype(np.float32), rhs.astype(np.float32), gs)
    check_close(out, expected.astype(half), half)
    assert np.all(out[45:].astype(np.float32) == 0)
    # Mixed with float32 promotes to float32.
    out32 = raggeddot.ragged_dot(lhs, rhs.astype(np.float32), gs)
    assert out32.dtype == np.float32
    check_close(out32, expected, np.float32)


# ---------------------------------------------------------------------------
# group_offset (megablox meaning)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("offset,g_local", [(0, 3), (2, 3), (5, 3), (0, 8), (7, 1), (3, 5)])
def test_group_offset(rng, offset, g_local):
    g_total, k, n = 8, 21, 34
    sizes = random_group_sizes(rng, g_total, 90)
    sizes[offset] = max(sizes[offset], 4)  # at least one computed group is non-empty
    m = int(sizes.sum()) + 6
    for dtype in FLOATS:
        lhs = randn(rng, (m, k), dtype)
        rhs_full = randn(rng, (g_total, k, n), dtype)
        rhs = rhs_full[offset:offset + g_local]
        for off in (offset, np.int32(offset), np.int64(offset)):
            out = check_against_reference(lhs, rhs, sizes, group_offset=off,
                                          label=f"group_offset={off!r} g_local={g_local}")
        # Independent check: only rows of groups [offset, offset+g_local) are computed.
        starts = group_starts(sizes)
        full = raggeddot.ragged_dot(lhs, rhs_full, sizes)
        for i in range(g_total):
            rows = slice(starts[i], starts[i] + sizes[i])
            if offset <= i < offset + g_local:
                check_close(out[rows], full[rows], dtype, err_msg=f"group {i}")
            else:
                assert np.all(out[rows] == 0), f"group {i} outside the local shard must be 0"
        assert np.all(out[int(sizes.sum()):] == 0)


def test_group_offset_zero_equals_no_offset(rng):
    lhs = randn(rng, (40, 12), np.float32)
    rhs = randn(rng, (4, 12, 9), np.float32)
    gs = np.array([10, 0, 20, 7], np.int32)
    assert np.array_equal(raggeddot.ragged_dot(lhs, rhs, gs, group_offset=0),
                          raggeddot.ragged_dot(lhs, rhs, gs))


# ---------------------------------------------------------------------------
# precision
# ---------------------------------------------------------------------------

def test_precision_values_do_not_change_results(rng):
    lhs = randn(rng, (64, 40), np.float32)
    rhs = randn(rng, (3, 40, 24), np.float32)
    gs = np.array([20, 0, 40], np.int32)
    base = raggeddot.ragged_dot(lhs, rhs, gs)
    for p in (None, "default", "high", "highest"):
        assert np.array_equal(raggeddot.ragged_dot(lhs, rhs, gs, precision=p), base), p


def test_precision_accepts_jax_precision(jax, rng):
    lhs = randn(rng, (64, 40), np.float32)
    rhs = randn(rng, (3, 40, 24), np.float32)
    gs = np.array([20, 0, 40], np.int32)
    base = raggeddot.ragged_dot(lhs, rhs, gs)
    P = jax.lax.Precision
    for p in (P.DEFAULT, P.HIGH, P.HIGHEST):
        assert np.array_equal(raggeddot.ragged_dot(lhs, rhs, gs, precision=p), base), p


# ---------------------------------------------------------------------------
# NaN / inf propagation
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_nan_in_lhs_row_affects_only_that_row(rng, dtype):
    m, k, n, g = 60, 37, 29, 3
    gs = np.array([20, 15, 20], np.int32)  # 5 tail rows
    lhs = randn(rng, (m, k), dtype)
    rhs = randn(rng, (g, k, n), dtype)
    rhs[1, 5, :] = 0  # NaN * 0 must still be NaN
    clean = raggeddot.ragged_dot(lhs, rhs, gs)
    bad_rows = [0, 21, 25, 54]
    lhs[21, 5] = np.nan      # row in group 1 whose rhs row 5 is all zeros
    lhs[0, 0] = np.nan
    lhs[25, 36] = np.nan
    lhs[54, 10] = np.nan     # last row of the last group
    out = raggeddot.ragged_dot(lhs, rhs, gs)
    assert np.all(np.isnan(out[bad_rows])), "a NaN in lhs row r must make all of out[r] NaN"
    good = np.setdiff1d(np.arange(m), bad_rows)
    assert not np.isnan(out[good]).any()
    assert np.array_equal(out[good], clean[good]), "NaN leaked into other rows' values"
    assert np.all(out[55:] == 0)
    check_close(out, reference.ragged_dot(lhs, rhs, gs), dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_nan_in_rhs_group_affects_only_that_group(rng, dtype):
    m, k, n, g = 70, 19, 40, 4
    gs = np.array([13, 0, 30, 20], np.int32)  # 7 tail rows
    lhs = randn(rng, (m, k), dtype)
    rhs = randn(rng, (g, k, n), dtype)
    lhs[20, 3] = 0.0  # 0 * NaN is NaN
    clean = raggeddot.ragged_dot(lhs, rhs, gs)
    rhs[2, 3, 17] = np.nan   # group 2 = rows 13..42, column 17
    rhs[1, :, :] = np.nan    # empty group: must affect nothing
    out = raggeddot.ragged_dot(lhs, rhs, gs)
    expected_nan = np.zeros((m, n), bool)
    expected_nan[13:43, 17] = True
    assert np.array_equal(np.isnan(out), expected_nan), (
        f"NaN at {np.argwhere(np.isnan(out) != expected_nan)[:5].tolist()} ...")
    assert np.array_equal(out[~expected_nan], clean[~expected_nan])
    assert np.all(out[63:] == 0)


def test_inf_propagation_matches_reference(rng):
    m, k, n, g = 30, 8, 12, 2
    gs = np.array([12, 15], np.int32)
    lhs = randn(rng, (m, k), np.float64)
    rhs = randn(rng, (g, k, n), np.float64)
    lhs[3, 2] = np.inf
    lhs[20, 1] = -np.inf
    rhs[1, 1, 4] = 0.0      # inf * 0 -> NaN in out[20, 4]
    rhs[0, 5, 6] = np.inf
    out = raggeddot.ragged_dot(lhs, rhs, gs)
    assert np.isnan(out[20, 4])
    assert np.isinf(out[3]).sum() >= n - 1
    with np.errstate(invalid="ignore"):
        expected = reference.ragged_dot(lhs, rhs, gs)
    check_close(out, expected, np.float64)
    assert np.all(out[27:] == 0)


# ---------------------------------------------------------------------------
# Inputs are never modified
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{}, {"preferred_element_type": np.float32},
                                    {"group_offset": 1}], ids=["plain", "pet", "offset"])
def test_inputs_not_modified(rng, kwargs):
    m, k, n, g = 90, 33, 41, 4
    lhs = randn(rng, (m, k), np.float64)
    rhs = randn(rng, (g, k, n), np.float64)
    lhs[5, 5] = np.nan
    gs = np.array([20, 0, 30, 35], np.int64)
    if "group_offset" in kwargs:
        rhs = rhs[:3]
    before = (lhs.copy(), rhs.copy(), gs.copy())
    raggeddot.ragged_dot(lhs, rhs, gs, **kwargs)
    for b, a, name in zip(before, (lhs, rhs, gs), ("lhs", "rhs", "group_sizes")):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b, equal_nan=True), f"{name} modified"
        assert a.flags.c_contiguous, name


def test_output_does_not_alias_inputs(rng):
    lhs = randn(rng, (16, 16), np.float32)
    rhs = randn(rng, (1, 16, 16), np.float32)
    out = raggeddot.ragged_dot(lhs, rhs, np.array([16], np.int32))
    assert not np.shares_memory(out, lhs) and not np.shares_memory(out, rhs)
    assert out.flags.writeable


# ---------------------------------------------------------------------------
# Threads: results bitwise identical for any thread count
# ---------------------------------------------------------------------------

def test_set_get_num_threads():
    if not raggeddot.build_info()["openmp"]:
        pytest.skip("built without OpenMP: always 1 thread")
    saved = raggeddot.get_num_threads()
    assert isinstance(saved, int) and saved >= 1
    for t in THREAD_COUNTS:
        raggeddot.set_num_threads(t)
        assert raggeddot.get_num_threads() == t


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_thread_count_determinism(rng, dtype):
    m, k, n, g = 1000, 300, 500, 7
    lhs = randn(rng, (m, k), dtype)
    rhs = randn(rng, (g, k, n), dtype)
    gs = random_group_sizes(rng, g, 990)
    results = {}
    for t in THREAD_COUNTS:
        raggeddot.set_num_threads(t)
        results[t] = raggeddot.ragged_dot(lhs, rhs, gs)
    for t in THREAD_COUNTS[1:]:
        diff = results[t] != results[1]
        assert not diff.any(), (
            f"{t} threads differ from 1 thread at {int(diff.sum())} entries, "
            f"first {np.argwhere(diff)[0].tolist()}")
    check_close(results[1], reference.ragged_dot(lhs, rhs, gs), dtype)


def test_thread_count_determinism_many_groups(rng):
    m, k, n, g = 700, 96, 200, 64
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (g, k, n), np.float32)
    gs = random_group_sizes(rng, g, m)
    raggeddot.set_num_threads(1)
    one = raggeddot.ragged_dot(lhs, rhs, gs)
    for t in (2, 3):
        raggeddot.set_num_threads(t)
        assert np.array_equal(raggeddot.ragged_dot(lhs, rhs, gs), one), t


# ---------------------------------------------------------------------------
# Micro-kernels: every kernel this CPU can run ("ref", "avx2", "avx512") on edge shapes
# ---------------------------------------------------------------------------

def test_build_info():
    info = raggeddot.build_info()
    assert isinstance(info, dict)
    assert isinstance(info["openmp"], bool)
    assert isinstance(info["simd"], (list, tuple)) and "ref" in info["simd"]
    assert info["kernel"] in info["simd"]


def test_set_kernel_round_trip():
    for name in KERNELS:
        runtime.set_kernel(name)
        assert raggeddot.build_info()["kernel"] == name
        assert runtime.set_kernel("auto") == name
    runtime.set_kernel("auto")
    assert raggeddot.build_info()["kernel"] in raggeddot.build_info()["simd"]


def test_set_kernel_runs_exactly_what_the_cpu_supports(restore_runtime):
    """Every compiled kernel is either selectable (the CPU has its ISA) or
    refused with RuntimeError, never silently run on a CPU without it."""
    info = raggeddot.build_info()
    for name in info["simd"]:
        if name in KERNELS:
            runtime.set_kernel(name)
            assert raggeddot.build_info()["kernel"] == name
        else:
            with pytest.raises(RuntimeError):
                runtime.set_kernel(name)
            assert raggeddot.build_info()["kernel"] != name


def test_set_kernel_unknown_name_raises():
    with pytest.raises((ValueError, RuntimeError)):
        runtime.set_kernel("no-such-kernel")
    assert raggeddot.build_info()["kernel"] in raggeddot.build_info()["simd"]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("m", [1, 5, 7, 13])
def test_micro_kernel_edges(rng, kernel, dtype, m):
    runtime.set_kernel(kernel)
    assert raggeddot.build_info()["kernel"] == kernel
    for k, n in itertools.product([1, 255, 257, 513], [1, 15, 17, 33]):
        lhs = randn(rng, (m, k), dtype)
        rhs = randn(rng, (3, k, n), dtype)
        gs = random_group_sizes(rng, 3, m - int(rng.integers(0, 2)))
        check_against_reference(lhs, rhs, gs,
                                label=f"kernel={kernel} m={m} k={k} n={n} gs={gs.tolist()}")


@pytest.mark.parametrize("kernel", KERNELS)
def test_micro_kernel_larger_shape(rng, kernel):
    runtime.set_kernel(kernel)
    m, k, n, g = 301, 513, 129, 5
    for dtype in FLOATS:
        lhs = randn(rng, (m, k), dtype)
        rhs = randn(rng, (g, k, n), dtype)
        gs = random_group_sizes(rng, g, 299)
        check_against_reference(lhs, rhs, gs, label=f"kernel={kernel}")

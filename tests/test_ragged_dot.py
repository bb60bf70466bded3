"""What is specific to raggeddot.ragged_dot: its math stated directly, result
dtypes and preferred_element_type, group_offset, precision, NaN/inf
propagation, and conformance with jax.lax.ragged_dot itself.

Shapes, group-size patterns, layouts, dtypes, kernels and threads, shared by
every grouped matmul, are in test_ops_suite.py. Errors are in test_validation.py.
"""

import numpy as np
import pytest

import raggeddot
from raggeddot import reference

from helpers import (FLOATS, HALF_DTYPES, assert_unchanged, check_close, dtype_id,
                     empty_group_patterns, group_starts, looser_dtype, random_group_sizes, randn,
                     snapshot)


def check_against_reference(lhs, rhs, group_sizes, *, label="", **kwargs):
    """Run C and reference; compare; check tail rows are exactly zero; return C output."""
    out = raggeddot.ragged_dot(lhs, rhs, group_sizes, **kwargs)
    expected = reference.ragged_dot(lhs, rhs, group_sizes, **kwargs)
    assert out.shape == (lhs.shape[0], rhs.shape[2]), label
    assert out.dtype == expected.dtype, f"{label}: dtype {out.dtype} != reference {expected.dtype}"
    tol_dtype = looser_dtype(out.dtype, np.result_type(lhs.dtype, rhs.dtype))
    check_close(out, expected, tol_dtype, err_msg=label)
    total = int(np.asarray(group_sizes).astype(np.int64).sum())
    assert np.all(out[total:] == 0), f"{label}: rows past sum(group_sizes)={total} must be 0"
    return out


# ---------------------------------------------------------------------------
# The math, stated without the oracle
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_each_group_is_its_own_matmul(rng, dtype):
    """out[rows of group i] = lhs[rows] @ rhs[i] for every empty-group pattern
    of 4 groups; one group holding every row is a dense matmul."""
    k, n = 19, 23
    for mask, sizes in empty_group_patterns(rng.integers(1, 21, 4).astype(np.int32)):
        m = int(sizes.sum()) + 5
        lhs, rhs = randn(rng, (m, k), dtype), randn(rng, (4, k, n), dtype)
        out = raggeddot.ragged_dot(lhs, rhs, sizes)
        starts = group_starts(sizes)
        for i in range(4):
            rows = slice(starts[i], starts[i] + sizes[i])
            check_close(out[rows], lhs[rows].astype(np.float64) @ rhs[i].astype(np.float64),
                        dtype, err_msg=f"mask {mask}, group {i}")
        assert np.all(out[int(sizes.sum()):] == 0)
    m, k, n = 257, 129, 65
    lhs, rhs = randn(rng, (m, k), dtype), randn(rng, (3, k, n), dtype)
    out = raggeddot.ragged_dot(lhs, rhs, np.array([0, m, 0], np.int32))
    check_close(out, lhs.astype(np.float64) @ rhs[1].astype(np.float64), dtype)


# ---------------------------------------------------------------------------
# Value dtypes: float32, float64, mixed, preferred_element_type, half types
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("lhs_dtype,rhs_dtype", [
    (np.float32, np.float32), (np.float64, np.float64),
    (np.float32, np.float64), (np.float64, np.float32),
] + [(h, np.float32) for h in HALF_DTYPES] + [(np.float32, h) for h in HALF_DTYPES], ids=dtype_id)
@pytest.mark.parametrize("pet", [None, np.float32, np.float64], ids=lambda d: "pet=" + dtype_id(d))
def test_dtypes_and_preferred_element_type(rng, lhs_dtype, rhs_dtype, pet):
    """The result dtype is preferred_element_type, else the promoted input
    type (a half type with float32 promotes to float32)."""
    m, k, n, g = 77, 45, 38, 4
    lhs = randn(rng, (m, k), lhs_dtype)
    rhs = randn(rng, (g, k, n), rhs_dtype)
    gs = random_group_sizes(rng, g, 70)
    out = check_against_reference(lhs, rhs, gs, preferred_element_type=pet)
    want = np.dtype(pet) if pet is not None else np.result_type(lhs_dtype, rhs_dtype)
    assert out.dtype == want


@pytest.mark.parametrize("half", HALF_DTYPES, ids=dtype_id)
def test_half_precision_is_rounded_once(rng, half):
    """Half inputs are exact in float32: the result is the float32 product
    rounded once to the half type."""
    m, k, n, g = 50, 33, 20, 3
    lhs = randn(rng, (m, k), half)
    rhs = randn(rng, (g, k, n), half)
    gs = random_group_sizes(rng, g, 45)
    out = raggeddot.ragged_dot(lhs, rhs, gs)
    assert out.dtype == np.dtype(half)
    expected = reference.ragged_dot(lhs.astype(np.float32), rhs.astype(np.float32), gs)
    check_close(out, expected.astype(half), half)
    assert np.all(out[45:].astype(np.float32) == 0)


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


@pytest.mark.parametrize("kwargs", [{"preferred_element_type": np.float32}, {"group_offset": 1}],
                         ids=["pet", "offset"])
def test_inputs_not_modified_by_the_options(rng, kwargs):
    m, k, n, g = 90, 33, 41, 4
    lhs = randn(rng, (m, k), np.float64)
    rhs = randn(rng, (g, k, n), np.float64)
    lhs[5, 5] = np.nan
    gs = np.array([20, 0, 30, 35], np.int64)
    if "group_offset" in kwargs:
        rhs = rhs[:3]
    inputs = (lhs, rhs, gs)
    before = snapshot(inputs)
    raggeddot.ragged_dot(lhs, rhs, gs, **kwargs)
    assert_unchanged(inputs, before, ["lhs", "rhs", "group_sizes"])
    assert all(a.flags.c_contiguous for a in inputs)


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
    lhs[57, 3] = np.nan      # a tail row: in no group
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
# Against jax.lax.ragged_dot itself (CPU)
# ---------------------------------------------------------------------------
# float64 runs with jax's 64-bit types on, within the test only. NaN/inf
# inputs are not compared: jax's CPU lowering multiplies dense masks, so a NaN
# in the rhs of one group reaches every row, where raggeddot (as the spec
# says) confines it to the group's rows.

JAX_SHAPES = [  # m, k, n, g
    (1, 1, 1, 1), (7, 3, 5, 3), (16, 16, 16, 4), (33, 65, 17, 5), (128, 64, 96, 8),
    (300, 128, 7, 3), (100, 257, 33, 16), (64, 1, 130, 2), (5, 40, 1, 7), (200, 30, 50, 64),
]


def _jax_ragged_dot(jax, lhs, rhs, gs, **kwargs):
    jnp = jax.numpy
    return np.asarray(jax.lax.ragged_dot(jnp.asarray(lhs), jnp.asarray(rhs),
                                         jnp.asarray(gs, dtype=jnp.int32), **kwargs))


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("m,k,n,g", JAX_SHAPES)
def test_matches_jax(jax, x64, rng, m, k, n, g, dtype):
    lhs, rhs = randn(rng, (m, k), dtype), randn(rng, (g, k, n), dtype)
    holes = random_group_sizes(rng, g, m)
    holes[rng.random(g) < 0.4] = 0  # empty groups, sum usually below m
    draws = {"full": random_group_sizes(rng, g, m),
             "below": random_group_sizes(rng, g, int(rng.integers(0, m))),
             "holes": holes}
    with x64(dtype == np.float64):
        for name, gs in draws.items():
            want = _jax_ragged_dot(jax, lhs, rhs, gs)
            assert want.dtype == dtype  # x64 really is on for float64
            got = raggeddot.ragged_dot(lhs, rhs, gs)
            label = f"{name} m={m} k={k} n={n} gs={gs.tolist()}"
            assert got.dtype == want.dtype, label
            check_close(got, want, dtype, err_msg=label)
            total = int(gs.sum())
            assert np.all(got[total:] == 0) and np.all(want[total:] == 0), label


@pytest.mark.parametrize("lhs_dtype,rhs_dtype,pet", [
    (np.float32, np.float32, np.float32),
    (np.float32, np.float32, np.float64),
    (np.float64, np.float64, np.float32),
    (np.float64, np.float64, np.float64),
    (np.float32, np.float64, None),
    (np.float64, np.float32, None),
    (np.float32, np.float64, np.float32),
], ids=dtype_id)
def test_preferred_element_type_and_mixed_match_jax(jax, x64, rng, lhs_dtype, rhs_dtype, pet):
    m, k, n, g = 90, 70, 40, 6
    lhs = randn(rng, (m, k), lhs_dtype)
    rhs = randn(rng, (g, k, n), rhs_dtype)
    gs = random_group_sizes(rng, g, 80)
    gs[2] = 0
    kwargs = {} if pet is None else {"preferred_element_type": pet}
    with x64(True):
        want = _jax_ragged_dot(jax, lhs, rhs, gs, **kwargs)
        got = raggeddot.ragged_dot(lhs, rhs, gs, **kwargs)
    assert got.dtype == want.dtype
    check_close(got, want, looser_dtype(got.dtype, np.result_type(lhs_dtype, rhs_dtype)))
    assert np.all(got[80:] == 0)


def test_float32_preferred_element_type_without_x64(jax, rng):
    m, k, n, g = 50, 20, 30, 4
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (g, k, n), np.float32)
    gs = np.array([10, 0, 25, 10], np.int32)
    want = _jax_ragged_dot(jax, lhs, rhs, gs, preferred_element_type=jax.numpy.float32)
    got = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float32)
    assert got.dtype == want.dtype == np.float32
    check_close(got, want, np.float32)


@pytest.mark.parametrize("precision", ["DEFAULT", "HIGH", "HIGHEST"])
def test_precision_enum_matches_jax(jax, rng, precision):
    m, k, n, g = 40, 24, 16, 3
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (g, k, n), np.float32)
    gs = np.array([15, 0, 20], np.int32)
    got = raggeddot.ragged_dot(lhs, rhs, gs, precision=getattr(jax.lax.Precision, precision))
    # On the CPU, jax computes float32 dots in float32 at every precision.
    want = _jax_ragged_dot(jax, lhs, rhs, gs, precision=jax.lax.Precision.HIGHEST)
    check_close(got, want, np.float32)

"""Conformance of the NumPy oracle (raggeddot.reference) against jax and megablox.

The oracle is only useful if it *is* the semantics, so every function is checked
against its jax counterpart on CPU:

* ragged_dot          -> jax.lax.ragged_dot (float32, and float64 under x64)
* ragged_dot_general  -> jax.lax.ragged_dot_general, all three modes
* gmm / tgmm          -> megablox gmm / tgmm run with interpret=True
* make_group_metadata -> megablox make_group_metadata: in test_metadata.py,
                         with raggeddot's own beside the oracle's

Known, deliberate differences (asserted where they matter):

* Rows past sum(group_sizes): megablox gmm leaves them uninitialised (NaN in
  interpret mode) when rhs holds every group and existing_out is None; the
  oracle returns 0, like jax.lax.ragged_dot.
* Non-finite values: jax's CPU ragged_dot computes sum_g mask_g(lhs) @ rhs[g],
  so a NaN/inf anywhere in rhs (even in an empty group) reaches every output
  row; the oracle confines it to the rows of its own group.
"""

import itertools
import types

import numpy as np
import pytest

from raggeddot import RaggedDotDimensionNumbers
from raggeddot import reference as ref

from helpers import (assert_allclose, assert_unchanged, dtype_id, group_starts, random_group_sizes,
                     randn, snapshot)


def _sizes(rng, g, m, *, total=None, empty=0.3):
    """g sizes summing to ``total`` (default: random in [0, m]), each group
    also emptied with probability ``empty``."""
    total = int(rng.integers(0, m + 1)) if total is None else total
    return random_group_sizes(rng, g, total, empty=empty)


# ---------------------------------------------------------------------------
# ragged_dot vs jax.lax.ragged_dot
# ---------------------------------------------------------------------------

RAGGED_DOT_SHAPES = [  # (m, k, n, g)
    (16, 8, 8, 1),
    (37, 13, 11, 3),
    (64, 32, 24, 8),
    (5, 7, 3, 6),  # more groups than rows
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=dtype_id)
@pytest.mark.parametrize("m,k,n,g", RAGGED_DOT_SHAPES)
def test_ragged_dot_matches_jax(jax, x64, rng, m, k, n, g, dtype):
    lhs, rhs = randn(rng, (m, k), dtype), randn(rng, (g, k, n), dtype)
    size_draws = [_sizes(rng, g, m, total=m), _sizes(rng, g, m),
                  _sizes(rng, g, m), np.zeros(g, np.int32)]
    with x64(np.dtype(dtype) == np.float64):
        for gs in size_draws:
            expected = np.asarray(jax.lax.ragged_dot(lhs, rhs, gs))
            actual = ref.ragged_dot(lhs, rhs, gs)
            assert actual.dtype == expected.dtype == dtype
            assert_allclose(actual, expected)
            # Rows past sum(gs) are exactly zero in both.
            total = int(gs.sum())
            assert not np.any(actual[total:]) and not np.any(expected[total:])


def test_ragged_dot_every_empty_group_pattern(jax, rng):
    m, k, n, g = 12, 5, 4, 4
    lhs, rhs = randn(rng, (m, k), np.float32), randn(rng, (g, k, n), np.float32)
    for pattern in itertools.product([0, 1], repeat=g):
        # Nonzero groups get 1..3 rows, so sums range from 0 to m.
        gs = np.array([p * rng.integers(1, 4) for p in pattern], np.int32)
        assert_allclose(ref.ragged_dot(lhs, rhs, gs), jax.lax.ragged_dot(lhs, rhs, gs))


@pytest.mark.parametrize("gs_dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32])
def test_ragged_dot_group_sizes_dtypes(jax, x64, rng, gs_dtype):
    lhs, rhs = randn(rng, (20, 6), np.float32), randn(rng, (3, 6, 5), np.float32)
    gs = np.array([7, 0, 9], gs_dtype)
    with x64(True):  # keeps 64-bit group_sizes as they are
        expected = jax.lax.ragged_dot(lhs, rhs, gs)
    assert_allclose(ref.ragged_dot(lhs, rhs, gs), expected)


def test_ragged_dot_output_dtypes(jax, x64, rng):
    jnp = jax.numpy
    lhs, rhs = randn(rng, (10, 4), np.float32), randn(rng, (2, 4, 3), np.float32)
    gs = np.array([4, 5], np.int32)
    with x64(True):
        # preferred_element_type wins.
        expected = jax.lax.ragged_dot(lhs, rhs, gs, preferred_element_type=jnp.float64)
        actual = ref.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float64)
        assert actual.dtype == expected.dtype == np.float64
        assert_allclose(actual, expected, np.float32)
        # float32 x float64 promotes to float64.
        expected = jax.lax.ragged_dot(lhs, rhs.astype(np.float64), gs)
        actual = ref.ragged_dot(lhs, rhs.astype(np.float64), gs)
        assert actual.dtype == expected.dtype == np.float64
        assert_allclose(actual, expected, np.float32)
        # Integer inputs give exact integer results.
        lhs_i = rng.integers(-5, 5, (10, 4)).astype(np.int32)
        rhs_i = rng.integers(-5, 5, (2, 4, 3)).astype(np.int32)
        expected = jax.lax.ragged_dot(lhs_i, rhs_i, gs)
        actual = ref.ragged_dot(lhs_i, rhs_i, gs)
        assert actual.dtype == expected.dtype == np.int32
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("m,k,n,gs", [
    (0, 3, 4, [0, 0]),
    (5, 0, 4, [2, 1]),
    (5, 3, 0, [2, 1]),
    (5, 3, 4, []),
])
def test_ragged_dot_degenerate_sizes(jax, rng, m, k, n, gs):
    gs = np.array(gs, np.int32)
    lhs, rhs = randn(rng, (m, k), np.float32), randn(rng, (len(gs), k, n), np.float32)
    expected = np.asarray(jax.lax.ragged_dot(lhs, rhs, gs))
    actual = ref.ragged_dot(lhs, rhs, gs)
    assert actual.shape == expected.shape == (m, n)
    np.testing.assert_array_equal(actual, expected)  # all zeros


def test_ragged_dot_noncontiguous_inputs_not_modified(jax, rng):
    lhs = randn(rng, (30, 16), np.float32)[:, ::2]            # strided columns
    rhs = randn(rng, (3, 7, 8), np.float32).transpose(0, 2, 1)  # [g, k, n] view of a [g, n, k] array
    gs = np.array([10, 0, 12], np.int32)
    before = snapshot((lhs, rhs, gs))
    actual = ref.ragged_dot(lhs, rhs, gs)
    assert_allclose(actual, jax.lax.ragged_dot(np.ascontiguousarray(lhs), np.ascontiguousarray(rhs), gs))
    assert_unchanged((lhs, rhs, gs), before, ["lhs", "rhs", "group_sizes"])


def test_ragged_dot_group_offset(rng):
    """rhs holding groups [offset, offset + g_local): only their rows, others exactly 0."""
    m, k, n, g = 40, 6, 5, 5
    lhs, rhs = randn(rng, (m, k), np.float32), randn(rng, (g, k, n), np.float32)
    gs = np.array([6, 0, 11, 9, 8], np.int32)  # sum 34 < m
    full = ref.ragged_dot(lhs, rhs, gs)
    starts = group_starts(gs)
    for offset, g_local in [(0, 5), (0, 2), (1, 3), (3, 2), (4, 1), (2, 0)]:
        for group_offset in (offset, np.int32(offset), np.array(offset, np.int64)):
            actual = ref.ragged_dot(lhs, rhs[offset:offset + g_local], gs,
                                    group_offset=group_offset)
            expected = np.zeros_like(full)
            for i in range(offset, offset + g_local):
                rows = slice(starts[i], starts[i] + gs[i])
                expected[rows] = full[rows]
            np.testing.assert_array_equal(actual, expected)


def test_ragged_dot_nan_stays_in_its_group(rng):
    """The oracle confines a NaN in rhs[i] to group i's rows (jax's CPU reference spreads it)."""
    lhs, rhs = randn(rng, (8, 3), np.float32), randn(rng, (3, 3, 2), np.float32)
    gs = np.array([2, 0, 3], np.int32)
    rhs[1, 0, 0] = np.nan  # empty group: no effect at all
    rhs[2, 0, 1] = np.nan  # rows 2..4, column 1
    out = ref.ragged_dot(lhs, rhs, gs)
    nan = np.isnan(out)
    assert nan[2:5, 1].all() and nan.sum() == 3
    np.testing.assert_array_equal(out[5:], 0)


def test_ragged_dot_validation():
    lhs, rhs = np.ones((6, 2), np.float32), np.ones((2, 2, 3), np.float32)
    with pytest.raises(ValueError):
        ref.ragged_dot(lhs, rhs, np.array([3, -1]))
    with pytest.raises(ValueError):
        ref.ragged_dot(lhs, rhs, np.array([4, 3]))
    with pytest.raises(ValueError):  # len(group_sizes) != rhs.shape[0] without group_offset
        ref.ragged_dot(lhs, rhs, np.array([1, 1, 1]))
    with pytest.raises(ValueError):  # rhs's groups out of range
        ref.ragged_dot(lhs, rhs, np.array([1, 1, 1]), group_offset=2)
    with pytest.raises(TypeError):
        ref.ragged_dot(lhs, rhs, np.array([1.0, 2.0]))


# ---------------------------------------------------------------------------
# ragged_dot_general vs jax.lax.ragged_dot_general
# ---------------------------------------------------------------------------

# Each case: lhs shape, rhs shape, dimension numbers, and the prefix shape of a
# full group_sizes ([prefix..., g]), worked out by hand from the mode's rule.
RDG_CASES = {
    # Mode 1, ragged non-contracting.
    "m1_basic": dict(lhs=(13, 6), rhs=(4, 6, 5), dims=(((1,), (1,)), ((), ())),
                     ragged=0, group=(0,), prefix=()),
    "m1_batch": dict(lhs=(3, 11, 6), rhs=(4, 3, 6, 5), dims=(((2,), (2,)), ((0,), (1,))),
                     ragged=1, group=(0,), prefix=(3,)),
    # lhs [x, k, b, m]: batch b is not leading, free x is outer to the ragged m.
    "m1_inner_ragged": dict(lhs=(2, 6, 3, 9), rhs=(3, 6, 4, 5),
                            dims=(((1,), (1,)), ((2,), (0,))),
                            ragged=3, group=(2,), prefix=(3, 2)),
    # Two contracting dims (listed in a different order on each side), rhs group
    # dim last, two rhs free dims.
    "m1_multi": dict(lhs=(10, 3, 4), rhs=(4, 2, 3, 5, 3), dims=(((1, 2), (2, 0)), ((), ())),
                     ragged=0, group=(4,), prefix=()),
    # Two batch dims listed out of order (b1 = lhs dim 2 first): out [b1, b2, m, n].
    "m1_two_batch": dict(lhs=(2, 7, 3, 5), rhs=(3, 4, 5, 2, 6),
                         dims=(((3,), (2,)), ((2, 0), (0, 3))),
                         ragged=1, group=(1,), prefix=(3, 2)),
    # Mode 2, ragged contracting.
    "m2_basic": dict(lhs=(5, 14), rhs=(14, 6), dims=(((1,), (0,)), ((), ())),
                     ragged=1, group=(), prefix=()),
    "m2_batch": dict(lhs=(3, 5, 12), rhs=(3, 12, 4), dims=(((2,), (1,)), ((0,), (0,))),
                     ragged=2, group=(), prefix=(3,)),
    # lhs [b, k1, m, k2] . rhs [k2, b, n, k1], ragged k2, listed after k1.
    "m2_inner_ragged": dict(lhs=(2, 3, 4, 10), rhs=(10, 2, 5, 3),
                            dims=(((1, 3), (3, 0)), ((0,), (1,))),
                            ragged=3, group=(), prefix=(2, 3)),
    # Same arrays, ragged k2 listed first: the prefix is the batch dim only.
    "m2_outer_ragged": dict(lhs=(2, 3, 4, 10), rhs=(10, 2, 5, 3),
                            dims=(((3, 1), (0, 3)), ((0,), (1,))),
                            ragged=3, group=(), prefix=(2,)),
    # lhs [b2, k, b1, m] . rhs [b1, k, n, b2], batch listed out of order: out [g, b1, b2, m, n].
    "m2_two_batch": dict(lhs=(2, 9, 3, 4), rhs=(3, 9, 5, 2),
                         dims=(((1,), (1,)), ((2, 0), (0, 3))),
                         ragged=1, group=(), prefix=(3, 2)),
    # Mode 3, ragged batch.
    "m3_basic": dict(lhs=(6, 4, 5), rhs=(6, 5, 3), dims=(((2,), (1,)), ((0,), (0,))),
                     ragged=0, group=(), prefix=()),
    # Two batch dims listed in a different order on each side; ragged second.
    "m3_two_batch": dict(lhs=(2, 4, 7, 5), rhs=(7, 2, 5, 3), dims=(((3,), (2,)), ((0, 2), (1, 0))),
                         ragged=2, group=(), prefix=(2,)),
}


def _rdg_inputs(jax, case, rng, dtype, full_group_sizes, g=4):
    lhs = randn(rng, case["lhs"], dtype)
    rhs = randn(rng, case["rhs"], dtype)
    if case["group"]:
        g = case["rhs"][case["group"][0]]
    ragged_size = case["lhs"][case["ragged"]]
    prefix = case["prefix"] if full_group_sizes else ()
    rows = [_sizes(rng, g, ragged_size) for _ in range(int(np.prod(prefix)))]
    gs = np.stack(rows).reshape(prefix + (g,))
    dims = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=case["dims"],
        lhs_ragged_dimensions=[case["ragged"]],
        rhs_group_dimensions=list(case["group"]),
    )
    return lhs, rhs, gs, dims


# Each case once per dtype and once per form of group_sizes (each a compile).
@pytest.mark.parametrize("dtype,full_group_sizes", [(np.float32, True), (np.float64, False)],
                         ids=["float32-gs_prefixed", "float64-gs_1d"])
@pytest.mark.parametrize("name", list(RDG_CASES))
def test_ragged_dot_general_matches_jax(jax, x64, rng, name, full_group_sizes, dtype):
    case = RDG_CASES[name]
    with x64(np.dtype(dtype) == np.float64):
        for _ in range(2):
            lhs, rhs, gs, dims = _rdg_inputs(jax, case, rng, dtype, full_group_sizes)
            expected = np.asarray(jax.lax.ragged_dot_general(lhs, rhs, gs, dims))
            actual = ref.ragged_dot_general(lhs, rhs, gs, dims)
            assert actual.shape == expected.shape
            assert actual.dtype == expected.dtype == dtype
            assert_allclose(actual, expected)


def test_ragged_dot_general_accepts_any_dimension_numbers_object(jax, rng):
    lhs, rhs, gs, dims = _rdg_inputs(jax, RDG_CASES["m1_inner_ragged"], rng, np.float32, True)
    duck = types.SimpleNamespace(dot_dimension_numbers=([[1], [1]], [[2], [0]]),
                                 lhs_ragged_dimensions=[3], rhs_group_dimensions=[2])
    np.testing.assert_array_equal(ref.ragged_dot_general(lhs, rhs, gs, duck),
                                  ref.ragged_dot_general(lhs, rhs, gs, dims))


def test_ragged_dot_general_basic_equals_ragged_dot(rng):
    lhs, rhs = randn(rng, (21, 6), np.float32), randn(rng, (4, 6, 5), np.float32)
    gs = np.array([5, 0, 9, 3], np.int32)
    dims = RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0])
    np.testing.assert_array_equal(ref.ragged_dot_general(lhs, rhs, gs, dims),
                                  ref.ragged_dot(lhs, rhs, gs))


def test_ragged_dot_general_nonfinite_outside_groups(jax, rng):
    """Mode 2 masks both operands, so inf outside every group never reaches the output."""
    lhs, rhs = randn(rng, (3, 9), np.float32), randn(rng, (9, 2), np.float32)
    lhs[0, 8], rhs[8, 1] = np.inf, np.inf  # column/row 8 is past sum(gs) = 7
    gs = np.array([3, 0, 4], np.int32)
    dims = jax.lax.RaggedDotDimensionNumbers((([1], [0]), ([], [])), [1], [])
    out = ref.ragged_dot_general(lhs, rhs, gs, dims)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[1], 0)
    assert_allclose(out, jax.lax.ragged_dot_general(lhs, rhs, gs, dims))


def test_ragged_dot_general_validation():
    lhs, rhs = np.ones((6, 2), np.float32), np.ones((2, 2, 3), np.float32)
    dims = RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0])
    with pytest.raises(NotImplementedError):
        ref.ragged_dot_general(lhs, rhs, np.array([3, 3]), dims, group_offset=0)
    with pytest.raises(ValueError):
        ref.ragged_dot_general(lhs, rhs, np.array([3, 4]), dims)
    with pytest.raises(ValueError):
        ref.ragged_dot_general(lhs, rhs, np.array([-1, 3]), dims)
    with pytest.raises(ValueError):  # group_sizes of the wrong prefixed shape
        ref.ragged_dot_general(lhs, rhs, np.ones((6, 2), np.int32), dims)
    with pytest.raises(ValueError):  # mode 1 needs an rhs group dimension
        ref.ragged_dot_general(lhs, np.ones((2, 3)), np.array([3, 3]),
                               RaggedDotDimensionNumbers((([1], [0]), ([], [])), [0], []))


# ---------------------------------------------------------------------------
# gmm / tgmm vs megablox (interpret=True runs the Pallas kernels on CPU)
# ---------------------------------------------------------------------------

GMM_M, GMM_K, GMM_N, GMM_G = 64, 32, 48, 5


def _gmm_group_sizes(rng, m, g):
    return [_sizes(rng, g, m, total=m), _sizes(rng, g, m),
            _sizes(rng, g, m, empty=0.6), np.zeros(g, np.int32)]


# (group_offset, g_local, existing_out?, transpose_rhs?): each cell of the
# offset x existing_out grid once, transpose_rhs on half of them (each a compile).
GMM_VARIANTS = [
    (None, GMM_G, False, False), (None, GMM_G, True, True),
    (0, 2, False, True), (0, 2, True, False),
    (2, 3, False, False), (2, 3, True, True),
    (4, 1, False, True), (4, 1, True, False),
]


@pytest.mark.parametrize("offset,g_local,with_existing_out,transpose_rhs", GMM_VARIANTS)
def test_gmm_matches_megablox(jax, x64, megablox, rng, offset, g_local, with_existing_out, transpose_rhs):
    jnp = jax.numpy
    m, k, n, g = GMM_M, GMM_K, GMM_N, GMM_G
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (g_local, n, k) if transpose_rhs else (g_local, k, n), np.float32)
    existing = randn(rng, (m, n), np.float32) if with_existing_out else None
    sharded = g_local < g
    with x64(False):
        for gs in _gmm_group_sizes(rng, m, g):
            expected = np.asarray(megablox.gmm(
                lhs, rhs, gs, preferred_element_type=jnp.float32, tiling=(16, 16, 16),
                group_offset=None if offset is None else jnp.asarray(offset, jnp.int32),
                existing_out=None if existing is None else jnp.asarray(existing),
                transpose_rhs=transpose_rhs, interpret=True))
            actual = ref.gmm(lhs, rhs, gs, preferred_element_type=np.float32,
                             tiling=(16, 16, 16), group_offset=offset, existing_out=existing,
                             transpose_rhs=transpose_rhs)
            assert actual.dtype == np.float32
            if existing is None and not sharded:
                # megablox leaves rows past sum(gs) uninitialised; the oracle zeroes them.
                total = int(gs.sum())
                assert_allclose(actual[:total], expected[:total])
                np.testing.assert_array_equal(actual[total:], 0)
            else:
                assert_allclose(actual, expected)


def test_gmm_irregular_k_and_n(jax, x64, megablox, rng):
    jnp = jax.numpy
    """k and n that the tile sizes do not divide (megablox masks the k remainder)."""
    m, k, n, g = 32, 30, 40, 3
    lhs, rhs, existing = randn(rng, (m, k), np.float32), randn(rng, (g, k, n), np.float32), randn(rng, (m, n), np.float32)
    with x64(False):
        for gs in _gmm_group_sizes(rng, m, g):
            expected = megablox.gmm(lhs, rhs, gs, tiling=(8, 16, 16),
                                    existing_out=jnp.asarray(existing), interpret=True)
            assert_allclose(ref.gmm(lhs, rhs, gs, existing_out=existing), expected)


def test_gmm_existing_out_semantics(rng):
    """Computed rows overwrite existing_out; every other row keeps it."""
    lhs, rhs = randn(rng, (12, 3), np.float32), randn(rng, (2, 3, 4), np.float32)
    gs = np.array([2, 3, 4, 2], np.int32)  # sum 11 < 12
    existing = randn(rng, (12, 4), np.float32)
    out = ref.gmm(lhs, rhs, gs, group_offset=1, existing_out=existing)
    np.testing.assert_allclose(out[2:5], lhs[2:5] @ rhs[0], rtol=1e-6)
    np.testing.assert_allclose(out[5:9], lhs[5:9] @ rhs[1], rtol=1e-6)
    np.testing.assert_array_equal(out[:2], existing[:2])
    np.testing.assert_array_equal(out[9:], existing[9:])
    without = ref.gmm(lhs, rhs, gs, group_offset=1)
    np.testing.assert_array_equal(without[:2], 0)
    np.testing.assert_array_equal(without[9:], 0)
    # gmm with every group held equals ragged_dot.
    rhs4 = randn(rng, (4, 3, 4), np.float32)
    np.testing.assert_array_equal(ref.gmm(lhs, rhs4, gs), ref.ragged_dot(lhs, rhs4, gs))
    with pytest.raises(ValueError):  # existing_out's dtype must match
        ref.gmm(lhs, rhs, gs, preferred_element_type=np.float64, group_offset=1,
                existing_out=existing)


@pytest.mark.parametrize("offset,num_actual,with_existing_out", [
    (None, None, False), (None, None, True), (0, 2, True), (2, 3, False), (4, 1, True),
])
def test_tgmm_matches_megablox(jax, x64, megablox, rng, offset, num_actual, with_existing_out):
    jnp = jax.numpy
    m, k, n, g = GMM_M, GMM_K, GMM_N, GMM_G
    lhs, rhs = randn(rng, (k, m), np.float32), randn(rng, (m, n), np.float32)
    local = g if num_actual is None else num_actual
    existing = randn(rng, (local, k, n), np.float32) if with_existing_out else None
    draws = _gmm_group_sizes(rng, m, g) + [np.array([20, 44, 0, 0, 0], np.int32)]
    with x64(False):
        for gs in draws:
            expected = megablox.tgmm(
                lhs, rhs, gs, preferred_element_type=jnp.float32, tiling=(16, 16, 16),
                group_offset=None if offset is None else jnp.asarray(offset, jnp.int32),
                num_actual_groups=num_actual,
                existing_out=None if existing is None else jnp.asarray(existing),
                interpret=True)
            actual = ref.tgmm(lhs, rhs, gs, preferred_element_type=np.float32,
                              group_offset=offset, num_actual_groups=num_actual,
                              existing_out=existing)
            assert actual.dtype == np.float32
            assert_allclose(actual, expected)


def test_tgmm_semantics(rng):
    k, m, n = 3, 10, 4
    lhs, rhs = randn(rng, (k, m), np.float64), randn(rng, (m, n), np.float64)
    gs = np.array([4, 0, 5], np.int32)  # row 9 is in no group
    out = ref.tgmm(lhs, rhs, gs)
    assert out.shape == (3, k, n) and out.dtype == np.float64
    np.testing.assert_allclose(out[0], lhs[:, :4] @ rhs[:4], rtol=1e-12)
    np.testing.assert_array_equal(out[1], 0)
    np.testing.assert_allclose(out[2], lhs[:, 4:9] @ rhs[4:9], rtol=1e-12)
    existing = randn(rng, (2, k, n), np.float64)
    added = ref.tgmm(lhs, rhs, gs, group_offset=1, num_actual_groups=2, existing_out=existing)
    np.testing.assert_allclose(added, out[1:] + existing, rtol=1e-12)
    # tgmm is ragged_dot_general's ragged-contracting mode with lhs [k, m].
    dims = RaggedDotDimensionNumbers((([1], [0]), ([], [])), [1], [])
    np.testing.assert_allclose(out, ref.ragged_dot_general(lhs, rhs, gs, dims), rtol=1e-12)
    with pytest.raises(ValueError):
        ref.tgmm(lhs, rhs, np.array([6, 5], np.int32))
    with pytest.raises(ValueError):
        ref.tgmm(lhs, rhs, gs, group_offset=2, num_actual_groups=2)

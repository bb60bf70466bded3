"""What is specific to megablox's gmm and tgmm: group_offset and existing_out,
tgmm's sharding (num_actual_groups), output dtypes, tiling and the errors.

Shapes, group-size patterns, layouts, dtypes, kernels and threads, shared by
every grouped matmul, are in test_ops_suite.py.
"""
import numpy as np
import pytest

import raggeddot
from raggeddot import reference

from helpers import FLOATS, assert_allclose, check_close, dtype_id, random_group_sizes, randn


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("offset,g_local", [(0, 2), (1, 2), (3, 2), (0, 5), (4, 1)])
@pytest.mark.parametrize("with_existing", [False, True])
def test_gmm_group_offset_and_existing_out(rng, dtype, offset, g_local, with_existing):
    m, k, n, g = 90, 19, 23, 5
    lhs = randn(rng, (m, k), dtype)
    rhs = randn(rng, (g_local, k, n), dtype)
    gs = random_group_sizes(rng, g, 80)
    existing = randn(rng, (m, n), dtype) if with_existing else None
    keep = None if existing is None else existing.copy()
    got = raggeddot.gmm(lhs, rhs, gs, group_offset=offset, existing_out=existing)
    want = reference.gmm(lhs, rhs, gs, group_offset=offset, existing_out=existing)
    check_close(got, want, dtype)
    if existing is not None:
        assert np.array_equal(existing, keep), "existing_out was modified"
    start = int(np.sum(gs[:offset]))
    stop = int(np.sum(gs[:offset + g_local]))
    outside = np.r_[0:start, stop:m]
    expect_outside = 0 if existing is None else existing[outside]
    assert np.array_equal(got[outside], np.broadcast_to(expect_outside, got[outside].shape))


@pytest.mark.parametrize("offset,count", [(0, None), (1, 2), (2, 3), (4, 1), (5, 0)])
def test_tgmm_sharding_and_existing_out(rng, offset, count):
    k, m, n, g = 11, 60, 13, 5
    lhs = randn(rng, (k, m), np.float64)
    rhs = randn(rng, (m, n), np.float64)
    gs = random_group_sizes(rng, g, 55)
    nact = g - offset if count is None else count
    existing = randn(rng, (nact, k, n), np.float64)
    keep = existing.copy()
    got = raggeddot.tgmm(lhs, rhs, gs, group_offset=offset, num_actual_groups=count, existing_out=existing)
    want = reference.tgmm(lhs, rhs, gs, group_offset=offset, num_actual_groups=count, existing_out=existing)
    check_close(got, want)
    assert np.array_equal(existing, keep)


def test_tgmm_is_the_weight_gradient_of_ragged_dot(rng):
    m, k, n, g = 200, 31, 45, 6
    x = randn(rng, (m, k), np.float64)
    ct = randn(rng, (m, n), np.float64)
    gs = random_group_sizes(rng, g, 190)
    d_rhs = raggeddot.tgmm(x.T, ct, gs)
    start = 0
    for i, size in enumerate(gs):
        assert_allclose(d_rhs[i], x[start:start + size].T @ ct[start:start + size])
        start += size


def test_preferred_element_type(rng):
    lhs = randn(rng, (20, 8), np.float32)
    rhs = randn(rng, (2, 8, 4), np.float32)
    gs = np.array([12, 8])
    assert raggeddot.gmm(lhs, rhs, gs, preferred_element_type=np.float64).dtype == np.float64
    assert raggeddot.tgmm(lhs.T, randn(rng, (20, 4), np.float32), gs).dtype == np.float32


def test_tiling_is_checked(rng):
    lhs = randn(rng, (16, 8), np.float32)
    rhs = randn(rng, (2, 8, 4), np.float32)
    gs = np.array([8, 8])
    raggeddot.gmm(lhs, rhs, gs, tiling=(8, 8, 4))
    raggeddot.gmm(lhs, rhs, gs, tiling=lambda m, k, n: (8, 8, 4))
    with pytest.raises(ValueError, match="tiling"):
        raggeddot.gmm(lhs, rhs, gs, tiling=(8, 0, 4))
    with pytest.raises(ValueError, match="tiling"):
        raggeddot.gmm(lhs, rhs, gs, tiling=lambda m, k, n: None)
    with pytest.raises(TypeError, match="tiling"):
        raggeddot.tgmm(lhs.T, randn(rng, (16, 4), np.float32), gs, tiling="big")


def test_errors_name_the_argument(rng):
    lhs = randn(rng, (16, 8), np.float32)
    rhs = randn(rng, (2, 8, 4), np.float32)
    gs = np.array([8, 8])
    with pytest.raises(ValueError, match="rhs"):
        raggeddot.gmm(lhs, rhs, gs, transpose_rhs=True)
    with pytest.raises(ValueError, match="lhs"):
        raggeddot.gmm(lhs[None], rhs, gs)
    with pytest.raises(ValueError, match="group_offset"):
        raggeddot.gmm(lhs, rhs, np.array([4, 4, 4, 4]), group_offset=3)
    with pytest.raises(ValueError, match="existing_out"):
        raggeddot.gmm(lhs, rhs, gs, existing_out=np.zeros((16, 5), np.float32))
    with pytest.raises(ValueError, match=r"sum\(group_sizes\)=17 exceeds"):
        raggeddot.gmm(lhs, rhs, np.array([9, 8]))
    with pytest.raises(ValueError, match="num_actual_groups"):
        raggeddot.tgmm(lhs.T, randn(rng, (16, 4), np.float32), gs, num_actual_groups=3)
    with pytest.raises(ValueError, match="rhs"):
        raggeddot.tgmm(lhs.T, randn(rng, (15, 4), np.float32), gs)
    with pytest.raises(ValueError, match="existing_out"):
        raggeddot.tgmm(lhs.T, randn(rng, (16, 4), np.float32), gs, existing_out=np.zeros((2, 8, 5)))
    with pytest.raises(TypeError, match="lhs"):
        raggeddot.tgmm(lhs.T.astype(np.int32), randn(rng, (16, 4), np.float32), gs)


def test_gmm_fewer_local_groups_without_offset(rng):
    """megablox: group_offset None means 0, and rhs may hold fewer groups."""
    lhs = randn(rng, (5, 2), np.float64)
    rhs = randn(rng, (2, 2, 3), np.float64)
    gs = np.array([2, 1, 2])
    got = raggeddot.gmm(lhs, rhs, gs)
    check_close(got, reference.gmm(lhs, rhs, gs))
    assert (got[3:] == 0).all()


def test_megablox_output_dtypes(rng):
    lhs = randn(rng, (6, 3), np.float32)
    rhs = randn(rng, (2, 3, 4), np.float32)
    gs = np.array([2, 3])
    eo = randn(rng, (6, 4), np.float64)
    got = raggeddot.gmm(lhs, rhs, gs, existing_out=eo)
    assert got.dtype == np.float64                       # existing_out's dtype, not rounded
    check_close(got, reference.gmm(lhs, rhs, gs, existing_out=eo), np.float32)
    with pytest.raises(ValueError, match="existing_out"):
        raggeddot.gmm(lhs, rhs, gs, existing_out=eo, preferred_element_type=np.float32)
    assert raggeddot.tgmm(lhs.T, randn(rng, (6, 4), np.float32), gs).dtype == np.float32
    assert raggeddot.gmm(lhs.astype(np.float16), rhs.astype(np.float16), gs).dtype == np.float32


def test_tgmm_offset_needs_num_actual_groups(rng):
    lhs = randn(rng, (3, 6), np.float32)
    rhs = randn(rng, (6, 4), np.float32)
    with pytest.raises(ValueError, match="num_actual_groups"):
        raggeddot.tgmm(lhs, rhs, np.array([2, 2, 2]), group_offset=1)

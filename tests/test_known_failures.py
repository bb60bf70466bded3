"""The failures grouped-matmul and MoE libraries of this field have shipped,
as named regression tests, and sizes past 2**31 and 2**32 elements.

- empty experts must leave exact zeros in the output (a grouped GEMM that
  skipped them left garbage) and get exact zero weight gradients (wrong
  weight gradients for empty experts have been reported in more than one
  library);
- every expert empty must work (a crash has been reported for that);
- a NaN in one expert's weights must stay in that expert's rows;
- the combine must be deterministic for every thread count.
"""
import numpy as np
import pytest

import raggeddot
from raggeddot import reference, runtime

from helpers import KERNELS


def _moe_args(rng, T=24, d=8, f=12, E=6, dtype=np.float64):
    return (rng.standard_normal((T, d)).astype(dtype), rng.standard_normal((d, E)).astype(dtype),
            rng.standard_normal((E, d, f)).astype(dtype) / 3, rng.standard_normal((E, d, f)).astype(dtype) / 3,
            rng.standard_normal((E, f, d)).astype(dtype) / 3)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_empty_experts_leave_exact_zeros(rng, kernel, dtype):
    """Rows of no group and groups of no rows: exact zeros, even in a buffer
    that held garbage (a reused result block, or an out= full of NaN)."""
    m, k, n = 40, 33, 70
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs = rng.standard_normal((5, k, n)).astype(dtype)
    gs = np.array([0, 17, 0, 0, 11])                  # rows 28.. belong to no group
    with runtime.configured(kernel=kernel):
        out = np.full((m, n), np.nan, dtype=dtype)
        raggeddot.ragged_dot(lhs, rhs, gs, out=out)
        assert (out[28:] == 0).all() and not np.signbit(out[28:]).any()
        _, vjp_fn = raggeddot.vjp(raggeddot.ragged_dot, lhs, rhs, gs)
        d_lhs, d_rhs, _ = vjp_fn(np.ones((m, n), dtype))
        garbage = np.full((5, k, n), np.nan, dtype=dtype)
        d_rhs_out = raggeddot.tgmm(lhs.T, np.ones((m, n), dtype), gs, out=garbage)
    for e in (0, 2, 3):
        assert (d_rhs[e] == 0).all(), f"weight gradient of empty expert {e}"
        assert (d_rhs_out[e] == 0).all(), f"tgmm into a NaN buffer, empty expert {e}"
    assert (d_lhs[28:] == 0).all()
    np.testing.assert_allclose(out[:28], reference.ragged_dot(lhs, rhs, gs)[:28], rtol=1e-4, atol=1e-4)


def test_moe_empty_experts_get_exact_zero_gradients(rng):
    args = _moe_args(rng)
    router = args[1].copy()
    router[:, 4:] = -50.0 * np.abs(router[:, 4:]) - 50.0  # experts 4, 5 never chosen
    args = (args[0], router) + args[2:]
    x = np.abs(args[0])                                  # positive tokens: logits of 4, 5 very low
    out, vjp_fn = raggeddot.moe_block_vjp(x, *args[1:], top_k=2)
    _, aux = raggeddot.moe_block(x, *args[1:], top_k=2, return_aux=True)
    assert (aux["group_sizes"][4:] == 0).all()
    grads = vjp_fn(np.ones_like(out))
    for name in ("w0", "w1", "wo"):
        assert (grads[name][4:] == 0).all(), name
        assert np.abs(grads[name][:4]).sum() > 0, name


def test_every_expert_empty(rng):
    """No tokens at all: every grouped product is empty, nothing crashes."""
    x = np.zeros((0, 8))
    args = _moe_args(rng)[1:]
    out, vjp_fn = raggeddot.moe_block_vjp(x, *args, top_k=2)
    assert out.shape == (0, 8)
    grads = vjp_fn(out)
    for name in ("w0", "w1", "wo", "router_weights"):
        assert (grads[name] == 0).all()
    lhs = np.ones((7, 3))
    rhs = np.ones((4, 3, 5))
    for gs in (np.zeros(4, int), np.array([0, 0, 0, 0])):
        assert (raggeddot.ragged_dot(lhs, rhs, gs) == 0).all()
        assert (raggeddot.tgmm(lhs.T, np.ones((7, 5)), gs) == 0).all()
        assert (raggeddot.gmm(lhs, rhs, gs) == 0).all()


@pytest.mark.parametrize("kernel", KERNELS)
def test_nan_in_one_experts_weights_stays_in_its_rows(rng, kernel):
    m, k, n = 50, 20, 40
    lhs = rng.standard_normal((m, k))
    rhs = rng.standard_normal((4, k, n))
    rhs[2, 5, 7] = np.nan
    gs = np.array([10, 15, 12, 9])
    with runtime.configured(kernel=kernel):
        out = raggeddot.ragged_dot(lhs, rhs, gs)
    nan_rows = np.unique(np.argwhere(np.isnan(out))[:, 0])
    assert np.array_equal(nan_rows, np.arange(25, 37))
    assert np.isnan(out[25:37, 7]).all() and not np.isnan(np.delete(out[25:37], 7, axis=1)).any()


def test_moe_nan_in_one_expert_stays_with_its_tokens(rng):
    args = list(_moe_args(rng))
    args[4] = args[4].copy()
    args[4][3, 0, 0] = np.nan                     # expert 3's down projection
    out, aux = raggeddot.moe_block(*args, top_k=1, return_aux=True)
    chose3 = aux["topk_indices"][:, 0] == 3
    assert chose3.any() and (~chose3).any()
    assert np.isnan(out[chose3, 0]).all()
    assert not np.isnan(out[~chose3]).any()


def test_combine_is_deterministic_for_every_thread_count(rng):
    args = _moe_args(rng, T=300, d=64, f=48, E=16, dtype=np.float32)
    results = []
    for threads in (1, 2, 3, 4, 8):
        with runtime.configured(num_threads=threads):
            out, vjp_fn = raggeddot.moe_block_vjp(*args, top_k=4)
            grads = vjp_fn(np.ones_like(out))
        results.append((out, grads))
    out0, g0 = results[0]
    for out, grads in results[1:]:
        assert np.array_equal(out, out0)
        for name in g0:
            assert np.array_equal(grads[name], g0[name]), name


def test_tgmm_groups_past_row_2_to_the_32():
    """Groups whose rows lie past 2**32, read through zero-stride views (no
    memory): row offsets, group bounds and sizes must not wrap.  Only the
    last groups are computed (group_offset), so the work stays small; with
    ones in float64 every sum is an exact integer."""
    m = (1 << 32) + 1000
    lhs = np.broadcast_to(np.ones((2, 1)), (2, m))     # [k=2, m]
    rhs = np.broadcast_to(np.ones((1, 3)), (m, 3))     # [m, n=3]
    gs = np.array([(1 << 32) - 24, 0, 1000, 24])       # group 3 straddles nothing, ends at m
    out = raggeddot.tgmm(lhs, rhs, gs, group_offset=1, num_actual_groups=3)
    assert out.shape == (3, 2, 3)
    assert (out[0] == 0).all() and (out[1] == 1000.0).all() and (out[2] == 24.0).all()


def test_ragged_dot_whose_lhs_has_more_than_2_to_the_32_elements():
    """m * k > 2**32 (a zero-stride lhs): no element count may be formed in
    32 bits.  Only the first rows belong to a group (the rest are zeros), so
    the work stays small; ones against ones sum to exactly k."""
    m, k = (1 << 20) + 3, (1 << 12) + 1
    lhs = np.broadcast_to(np.ones((1, k), np.float32), (m, k))
    rhs = np.ones((2, k, 1), np.float32)
    out = raggeddot.ragged_dot(lhs, rhs, np.array([7, 5]))
    assert out.shape == (m, 1)
    assert (out[:12] == k).all() and (out[12:] == 0).all()


@pytest.mark.parametrize("m, n", [(1 << 40, 1 << 20), (1 << 30, 1 << 15)],
                         ids=["more-than-the-address-space", "more-than-the-machine"])
def test_a_result_too_large_to_allocate_raises_memory_error(m, n):
    lhs = np.broadcast_to(np.ones((1, 4)), (m, 4))
    rhs = np.ones((1, 4, n))
    with pytest.raises(MemoryError):
        raggeddot.ragged_dot(lhs, rhs, np.array([m]))
    with pytest.raises(MemoryError):
        raggeddot.gmm(lhs, rhs, np.array([m]))

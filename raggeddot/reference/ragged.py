"""The oracle of ``jax.lax.ragged_dot`` and ``jax.lax.ragged_dot_general``."""

import numpy as np

from ._common import (_accumulator_dtype, _check_group_sizes, _check_ndim, _first_group,
                      _group_bounds, _group_sizes_array, _result_dtype)

from . import quant as _quant

__all__ = ["ragged_dot", "ragged_dot_general"]


# ---------------------------------------------------------------------------
# ragged_dot
# ---------------------------------------------------------------------------


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None,
               group_offset=None):
    """Grouped matmul with the semantics of ``jax.lax.ragged_dot``.

    For each group ``i`` held by rhs, with rows ``R_i = [start_i, start_i + gs[i])``::

        out[R_i, :] = lhs[R_i, :] @ rhs[i - group_offset]

    Every other row of ``out`` (rows past ``sum(gs)``, and rows of groups not
    held by rhs) is exactly 0.

    Args:
      lhs: [m, k].
      rhs: [g_local, k, n]; holds groups ``[group_offset, group_offset + g_local)``.
      group_sizes: [g], any integer dtype; ``>= 0`` with ``sum <= m``.
      precision: ignored (accepted for compatibility).
      preferred_element_type: output dtype; default JAX's result type of
        lhs and rhs (``np.result_type`` for float32/float64).
      group_offset: None (then ``g_local`` must equal ``g``) or an integer
        scalar / 0-d array with megablox's meaning (jax itself raises for it).

    Returns:
      [m, n] array of the output dtype, accumulated in float64.
    """
    del precision
    lhs, rhs, lhs_like, rhs_like = _quant.operands(lhs, rhs)
    gs = _group_sizes_array(group_sizes)
    _check_ndim(lhs, 2, "lhs")
    _check_ndim(rhs, 3, "rhs")
    _check_ndim(gs, 1, "group_sizes")
    m, k = lhs.shape
    g_local, rhs_k, n = rhs.shape
    if rhs_k != k:
        raise ValueError(f"lhs is [m, k] = {lhs.shape} but rhs is [g, k, n] = {rhs.shape}.")
    if group_offset is None and g_local != gs.shape[0]:
        raise ValueError(
            f"rhs holds {g_local} groups but 'group_sizes' has {gs.shape[0]}."
        )
    first = _first_group(group_offset, gs.shape[0], g_local)
    _check_group_sizes(gs, m, "lhs.shape[0]")
    out_dtype = _result_dtype(lhs_like, rhs_like, preferred_element_type)
    acc_dtype = _accumulator_dtype(out_dtype)

    starts, ends = _group_bounds(gs)
    out = np.zeros((m, n), acc_dtype)
    for j in range(g_local):
        i = first + j
        rows = slice(starts[i], ends[i])
        out[rows] = lhs[rows].astype(acc_dtype) @ rhs[j].astype(acc_dtype)
    return out.astype(out_dtype)


# ---------------------------------------------------------------------------
# ragged_dot_general
# ---------------------------------------------------------------------------


def _remaining(rank, *used):
    """Dimensions in range(rank) not in any of the `used` lists, ascending."""
    taken = set()
    for dims in used:
        taken.update(dims)
    return [d for d in range(rank) if d not in taken]


def _unpack_dimension_numbers(dims):
    """Plain int lists from any object shaped like jax's RaggedDotDimensionNumbers."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dims.dot_dimension_numbers
    as_list = lambda xs: [int(x) for x in xs]
    return (as_list(lhs_contract), as_list(rhs_contract), as_list(lhs_batch),
            as_list(rhs_batch), as_list(dims.lhs_ragged_dimensions),
            as_list(dims.rhs_group_dimensions))


def _matmul_blocks(lhs, rhs, nb, nf, nc):
    """Batched matmul of lhs [B..., F..., C...] and rhs [B..., C..., N...] -> [B..., F..., N...].

    nb, nf and nc count the batch (B), lhs free (F) and contracting (C) axes.
    """
    b_shape = lhs.shape[:nb]
    f_shape = lhs.shape[nb:nb + nf]
    c_shape = lhs.shape[nb + nf:]
    n_shape = rhs.shape[nb + nc:]
    if rhs.shape[:nb] != b_shape or rhs.shape[nb:nb + nc] != c_shape:
        raise ValueError(
            f"batch/contracting sizes differ: lhs {lhs.shape}, rhs {rhs.shape}."
        )
    size = lambda shape: int(np.prod(shape, dtype=np.int64))
    lhs3 = lhs.reshape((size(b_shape), size(f_shape), size(c_shape)))
    rhs3 = rhs.reshape((size(b_shape), size(c_shape), size(n_shape)))
    return np.matmul(lhs3, rhs3).reshape(b_shape + f_shape + n_shape)


def _broadcast_group_sizes(gs, prefix_shape):
    """group_sizes as shape prefix_shape + (g,): a [g] vector is broadcast."""
    if gs.ndim == 0:
        raise ValueError("expected rank of group_sizes to be >= 1.")
    if gs.ndim == 1:
        return np.broadcast_to(gs, tuple(prefix_shape) + gs.shape)
    expected = tuple(prefix_shape) + (gs.shape[-1],)
    if gs.shape != expected:
        raise ValueError(f"expected group_sizes to have shape {expected}, got {gs.shape}.")
    return gs


def _group_mask(starts, ends, i, ragged_size, ndim):
    """Boolean mask of the positions owned by group i, for an array of rank ndim.

    starts/ends have shape P + (g,), P being the prefix axes, which lead the
    array and are followed by its ragged axis.  The mask is True where
    starts[..., i] <= position < ends[..., i] along the ragged axis; it has
    shape P + (ragged_size,) padded with trailing 1s to rank ndim.
    """
    position = np.arange(ragged_size)
    mask = (starts[..., i, None] <= position) & (position < ends[..., i, None])
    return mask.reshape(mask.shape + (1,) * (ndim - mask.ndim))


def ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers,
                       precision=None, preferred_element_type=None, group_offset=None):
    """Ragged dot with general dimension numbers, as ``jax.lax.ragged_dot_general``.

    ``ragged_dot_dimension_numbers`` is any object with attributes
    ``dot_dimension_numbers = ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))``,
    ``lhs_ragged_dimensions = [r]`` (exactly one) and ``rhs_group_dimensions``.
    Write B for the batch dims (in the listed order), F for lhs's other dims and
    N for rhs's other dims (both ascending, rhs's group dim excluded), K for the
    contracting dims (listed order).  The kind of lhs dim ``r`` picks the mode:

    1. r is in F (ragged non-contracting, the MoE forward; rhs has one group dim)::

           out[B, F, N] = sum_K lhs[B, F, K] * rhs[group(B, F), B, K, N]

       where group(...) is the group owning F's r-coordinate; positions owned by
       no group give exactly 0.  out: [B..., F..., N...].
    2. r is in K (ragged contracting, tgmm; rhs has no group dim)::

           out[i, B, F, N] = sum over K with the r-coordinate in group i of
                             lhs[B, F, K] * rhs[B, K, N]

       Empty groups give exact zeros.  out: [g, B..., F..., N...].
    3. r is in B (ragged batch; rhs has no group dim): a plain batched dot,
       group_sizes does not change the result.  out: [B..., F..., N...].

    group_sizes is [g] (broadcast) or ``lhs.shape[prefix] + (g,)``, the prefix
    being B plus the dims of F (mode 1, ascending) or K (mode 2, listed order)
    that precede r; in mode 3 the prefix is the batch dims listed before r.
    Each group-size row is validated (>= 0, sum <= size of dim r).

    group_offset is not supported here (NotImplementedError); use ragged_dot or gmm.
    """
    del precision
    if group_offset is not None:
        raise NotImplementedError(
            "group_offset is only implemented by ragged_dot and gmm."
        )
    lhs, rhs, lhs_like, rhs_like = _quant.operands(lhs, rhs)
    gs = _group_sizes_array(group_sizes)
    (lhs_contract, rhs_contract, lhs_batch, rhs_batch, lhs_ragged,
     rhs_group) = _unpack_dimension_numbers(ragged_dot_dimension_numbers)
    if len(lhs_ragged) != 1:
        raise ValueError("ragged_dot_general expects exactly one lhs ragged dimension.")
    if len(lhs_contract) != len(rhs_contract) or len(lhs_batch) != len(rhs_batch):
        raise ValueError("lhs and rhs must list as many contracting and batch dims.")
    r = lhs_ragged[0]
    lhs_free = _remaining(lhs.ndim, lhs_contract, lhs_batch)
    rhs_free = _remaining(rhs.ndim, rhs_contract, rhs_batch, rhs_group)
    out_dtype = _result_dtype(lhs_like, rhs_like, preferred_element_type)
    acc_dtype = _accumulator_dtype(out_dtype)
    nb, nc, nf = len(lhs_batch), len(lhs_contract), len(lhs_free)

    if r in lhs_free:
        # Mode 1.  lhs as [B, F, K]: the prefix dims and r are its leading axes.
        if len(rhs_group) != 1:
            raise ValueError("mode 1 (ragged non-contracting) needs exactly one rhs group dim.")
        lhs_t = lhs.transpose(lhs_batch + lhs_free + lhs_contract).astype(acc_dtype)
        rhs_t = rhs.transpose(rhs_group + rhs_batch + rhs_contract + rhs_free)
        rhs_t = rhs_t.astype(acc_dtype)
        ragged_axis = nb + lhs_free.index(r)
        gs_full = _broadcast_group_sizes(gs, lhs_t.shape[:ragged_axis])
        num_groups = gs_full.shape[-1]
        if rhs_t.shape[0] != num_groups:
            raise ValueError(
                f"rhs group dim has size {rhs_t.shape[0]}, expected {num_groups}."
            )
        _check_group_sizes(gs_full, lhs_t.shape[ragged_axis], "the lhs ragged dim size")
        starts, ends = _group_bounds(gs_full)
        out = np.zeros(lhs_t.shape[:nb + nf] + rhs_t.shape[1 + nb + nc:], acc_dtype)
        for i in range(num_groups):
            mask = _group_mask(starts, ends, i, lhs_t.shape[ragged_axis], out.ndim)
            product = _matmul_blocks(lhs_t, rhs_t[i], nb, nf, nc)
            out = np.where(mask, product, out)
        return out.astype(out_dtype)

    if r in lhs_contract:
        # Mode 2.  lhs as [B, K, F] and rhs as [B, K, N]: prefix and r lead both.
        if rhs_group:
            raise ValueError("mode 2 (ragged contracting) takes no rhs group dim.")
        lhs_t = lhs.transpose(lhs_batch + lhs_contract + lhs_free).astype(acc_dtype)
        rhs_t = rhs.transpose(rhs_batch + rhs_contract + rhs_free).astype(acc_dtype)
        ragged_axis = nb + lhs_contract.index(r)
        gs_full = _broadcast_group_sizes(gs, lhs_t.shape[:ragged_axis])
        num_groups = gs_full.shape[-1]
        _check_group_sizes(gs_full, lhs_t.shape[ragged_axis], "the lhs ragged dim size")
        starts, ends = _group_bounds(gs_full)
        # Move F after K's end for the matmul helper: [B, K, F] -> [B, F, K].
        k_axes = list(range(nb, nb + nc))
        f_axes = list(range(nb + nc, nb + nc + nf))
        to_bfk = list(range(nb)) + f_axes + k_axes
        outs = []
        for i in range(num_groups):
            # Both operands are masked (as jax does), so non-finite values
            # outside group i never reach out[i].
            ragged_size = lhs_t.shape[ragged_axis]
            lhs_i = np.where(_group_mask(starts, ends, i, ragged_size, lhs_t.ndim), lhs_t, 0)
            rhs_i = np.where(_group_mask(starts, ends, i, ragged_size, rhs_t.ndim), rhs_t, 0)
            lhs_i = lhs_i.transpose(to_bfk)
            outs.append(_matmul_blocks(lhs_i, rhs_i, nb, nf, nc))
        out_shape = ((num_groups,) + lhs_t.shape[:nb] + lhs_t.shape[nb + nc:]
                     + rhs_t.shape[nb + nc:])
        out = np.stack(outs) if outs else np.zeros(out_shape, acc_dtype)
        return out.reshape(out_shape).astype(out_dtype)

    if r in lhs_batch:
        # Mode 3: group_sizes is validated but does not change the result.
        if rhs_group:
            raise ValueError("mode 3 (ragged batch) takes no rhs group dim.")
        ragged_index = lhs_batch.index(r)
        prefix_shape = tuple(lhs.shape[d] for d in lhs_batch[:ragged_index])
        gs_full = _broadcast_group_sizes(gs, prefix_shape)
        _check_group_sizes(gs_full, lhs.shape[r], "the lhs ragged dim size")
        lhs_t = lhs.transpose(lhs_batch + lhs_free + lhs_contract).astype(acc_dtype)
        rhs_t = rhs.transpose(rhs_batch + rhs_contract + rhs_free).astype(acc_dtype)
        return _matmul_blocks(lhs_t, rhs_t, nb, nf, nc).astype(out_dtype)

    raise ValueError(f"lhs ragged dimension {r} is not a dimension of lhs (rank {lhs.ndim}).")

"""The gathers of an MoE layer as public functions: ragged_gather (dispatch:
fan tokens out to their sorted slots) and ragged_gather_reduce (combine: the
weighted sum of each token's slots). Checked arguments, computed by the
gateway's gather kernels; their derivative rules (raggeddot.vjp/jvp) follow
the functions.
"""
import numpy as np

from .. import _autodiff
from .. import _gateway as gw
from .. import _validate as v

__all__ = ["ragged_gather", "ragged_gather_reduce"]


def _gather_indices(indices, ndim, shape_doc, lo, hi, fn):
    """The index argument of the gathers: integers in [lo, hi), as int64."""
    idx = v.as_array(indices, "indices", fn, ndim=ndim, shape_doc=shape_doc)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{fn}: 'indices' must be integers, got {idx.dtype}")
    if idx.size and (idx.min() < lo or idx.max() >= hi):
        raise ValueError(f"{fn}: 'indices' must lie in [{lo}, {hi}), got values in "
                         f"[{idx.min()}, {idx.max()}]")
    return np.ascontiguousarray(idx, dtype=np.int64)


def _gather_weights(weights, idx, shape_doc, dtype, fn):
    """The optional weights of the gathers: floats shaped like the indices."""
    if weights is None:
        return None
    w = v.as_array(weights, "weights", fn, ndim=idx.ndim, shape_doc=shape_doc)
    v.float_dtype(w, "weights", fn)
    if w.shape != idx.shape:
        raise ValueError(f"{fn}: 'weights' must have shape {idx.shape}, got {w.shape}")
    return np.ascontiguousarray(w, dtype=dtype)


def ragged_gather(x, indices, weights=None):
    """Dispatch: ``out[i] = x[indices[i]]`` (times ``weights[i]`` when given).

    In an MoE layer ``indices[i]`` is the token of sorted slot i, so this fans
    ``x [T, d]`` out to ``[N, d]`` (N = T * top_k), each expert's rows together.

    Args:
      x: ``[T, d]`` float array.
      indices: ``[N]`` integers in ``[0, T)``.
      weights: optional ``[N]`` scale per output row.
    Returns:
      ``[N, d]`` in x's dtype, native byte order (float16/bfloat16 computed
      in float32).
    """
    fn = "ragged_gather"
    x = v.as_array(x, "x", fn, ndim=2, shape_doc=" [T, d]")
    xt = v.float_dtype(x, "x", fn)
    ct = gw.compute_dtype(xt)
    idx = _gather_indices(indices, 1, " [N]", 0, x.shape[0], fn)
    scale = _gather_weights(weights, idx, " [N]", ct, fn)
    with v.memory_for(fn, "the result [N, d]"):
        out = gw.gather_rows(x, idx, scale)
        return out if out.dtype == xt else out.astype(xt)


def ragged_gather_reduce(y, indices, weights=None, *, ordered=False):
    """Combine: ``out[t] = sum_j weights[t, j] * y[indices[t, j]]``, j = 0..k-1 in order.

    In an MoE layer ``indices[t, j]`` is the sorted slot of token t's j-th
    expert, so this brings ``y [N, d]`` back to ``[T, d]`` weighted by the
    router. An index of -1 (a dropped assignment) contributes nothing. The k
    terms are always added in the same order, so results do not depend on the
    thread count.

    Args:
      y: ``[N, d]`` float array.
      indices: ``[T, k]`` integers in ``[-1, N)``.
      weights: optional ``[T, k]`` (default 1).
      ordered: add each row's terms in the order of their indices instead
        of j's (a row's indices then distinct): for slots sorted by expert,
        the order of the experts, in which transformers' loop over experts
        adds them and ``moe_block`` combines.
    Returns:
      ``[T, d]`` in y's dtype, native byte order.
    """
    fn = "ragged_gather_reduce"
    y = v.as_array(y, "y", fn, ndim=2, shape_doc=" [N, d]")
    yt = v.float_dtype(y, "y", fn)
    ct = gw.compute_dtype(yt)
    idx = _gather_indices(indices, 2, " [T, k]", -1, y.shape[0], fn)
    w = _gather_weights(weights, idx, " [T, k]", ct, fn)
    ordered = v.flag(ordered, "ordered", fn)
    if ordered:
        kept = np.sort(np.where(idx >= 0, idx, -1 - np.arange(idx.shape[1])), axis=1)
        if idx.shape[1] > 1 and (kept[:, 1:] == kept[:, :-1]).any():
            raise ValueError(f"{fn}: with ordered=True a row's indices must be distinct")
    with v.memory_for(fn, "the result [T, d]"):
        out = gw.gather_reduce(y, idx, w, ordered)
        return out if out.dtype == yt else out.astype(yt)


# ---------------------------------------------------------------------------
# Derivative rules
# ---------------------------------------------------------------------------
# Both gathers are bilinear in (rows, weights); each is the other's transpose
# in the rows. With ct the cotangent of the output:
#
#   out = ragged_gather(x, idx, w)          out[i] = w[i] x[idx[i]]       [N, d]
#     d_x[t] = sum_{i: idx[i] = t} w[i] ct[i]                             [T, d]
#            = ragged_gather_reduce(ct, inv, w_inv)
#     d_w[i] = <ct[i], x[idx[i]]>                                         [N]
#
#   out = ragged_gather_reduce(y, idx, w)   out[t] = sum_j w[t,j] y[idx[t,j]]   [T, d]
#     d_y[s] = sum_{(t,j): idx[t,j] = s} w[t,j] ct[t]                     [N, d]
#            = ragged_gather_reduce(ct, inv, w_inv)   (a gather when each s occurs once)
#     d_w[t,j] = <ct[t], y[idx[t,j]]>, 0 where idx[t,j] = -1              [T, k]
#
# inv [rows, c] lists, for each row of the primal, the rows of ct that read
# it, in ascending order of their position in idx (so the sums have a fixed
# order), padded with -1; c is the most times one row is read. Indices are
# not differentiable. Tangents (jvp): the ops are linear in each argument,
#   t_out = op(t_rows, idx, w) + op(rows, idx, t_w).


def _transpose_map(idx_flat, num_rows, source_of_position, weights_flat):
    """The inverse of a gather map, as the indices and weights of a
    ragged_gather_reduce that computes its transpose.

    Args:
      idx_flat: ``[P]`` int64, the row each position reads, in ``[-1,
        num_rows)`` (-1 reads nothing).
      num_rows: rows of the gathered array.
      source_of_position: ``[P]`` int64, the cotangent row of each position.
      weights_flat: ``[P]`` weights of the positions, or None.
    Returns:
      ``(inv [num_rows, c] int64, w_inv [num_rows, c] or None)``: row r's
      entries are the cotangent rows of the positions that read r, in
      ascending position order, and their weights; padding is -1 (weight 0).
    """
    valid = np.flatnonzero(idx_flat >= 0)
    rows = idx_flat[valid]
    counts = np.bincount(rows, minlength=num_rows)
    c = int(counts.max()) if counts.size else 0
    order = valid[np.argsort(rows, kind="stable")]   # positions grouped by row, ascending
    sorted_rows = idx_flat[order]
    starts = np.cumsum(counts) - counts
    rank = np.arange(order.shape[0]) - starts[sorted_rows]
    inv = np.full((num_rows, c), -1, dtype=np.int64)
    inv[sorted_rows, rank] = source_of_position[order]
    w_inv = None
    if weights_flat is not None:
        w_inv = np.zeros((num_rows, c), dtype=weights_flat.dtype)
        w_inv[sorted_rows, rank] = weights_flat[order]
    return inv, w_inv


def _gather_args(a, rows_name):
    """The arguments of a gather call as arrays (they passed the op's checks):
    ``(rows, indices int64, weights or None, compute dtype)``."""
    rows = np.asarray(a[rows_name])
    idx = np.asarray(a["indices"]).astype(np.int64, copy=False)
    cdt = gw.compute_dtype(rows.dtype)
    w = a["weights"]
    w = None if w is None else np.asarray(w).astype(cdt, copy=False)
    return rows, idx, w, cdt


def _ragged_gather_vjp(a, wanted):
    out = ragged_gather(**a)
    x, idx, w, cdt = _gather_args(a, "x")

    def backward(ct):
        ct = np.ascontiguousarray(ct, dtype=cdt)
        grads = {}
        if "x" in wanted:  # [N, d] -> [T, d]
            inv, w_inv = _transpose_map(idx, x.shape[0], np.arange(idx.shape[0]), w)
            grads["x"] = gw.gather_reduce(ct, inv, w_inv)
        if "weights" in wanted:  # [N]
            xs = gw.gather_rows(gw.operand(x, cdt), idx)
            grads["weights"] = np.einsum("nd,nd->n", ct, xs)
        return grads

    return out, backward


def _ragged_gather_reduce_vjp(a, wanted):
    out = ragged_gather_reduce(**a)
    y, idx, w, cdt = _gather_args(a, "y")

    def backward(ct):
        ct = np.ascontiguousarray(ct, dtype=cdt)
        grads = {}
        if "y" in wanted:  # [T, d] -> [N, d]
            T, k = idx.shape
            source = np.repeat(np.arange(T, dtype=np.int64), k)
            inv, w_inv = _transpose_map(idx.ravel(), y.shape[0], source, None if w is None else w.ravel())
            grads["y"] = gw.gather_reduce(ct, inv, w_inv)
        if "weights" in wanted:  # [T, k], one column at a time: no [T*k, d] temporary
            yc = gw.operand(y, cdt)
            d_w = np.zeros(idx.shape, dtype=cdt)
            for j in range(idx.shape[1]):
                kept = idx[:, j] >= 0
                if kept.any():
                    d_w[kept, j] = np.einsum("td,td->t", ct[kept], gw.gather_rows(yc, idx[kept, j]))
            grads["weights"] = d_w
        return grads

    return out, backward


def _gather_jvp(op, rows_name):
    def rule(a, t):
        out = op(**a)
        terms = []
        if t.get(rows_name) is not None:
            terms.append(op(**{**a, rows_name: t[rows_name]}))
        if t.get("weights") is not None:
            terms.append(op(**{**a, "weights": t["weights"]}))
        return out, _autodiff.sum_terms(terms, out)
    return rule


_autodiff.defvjp(ragged_gather, _ragged_gather_vjp, ("x", "weights"))
_autodiff.defjvp(ragged_gather, _gather_jvp(ragged_gather, "x"), ("x", "weights"))
_autodiff.defvjp(ragged_gather_reduce, _ragged_gather_reduce_vjp, ("y", "weights"))
_autodiff.defjvp(ragged_gather_reduce, _gather_jvp(ragged_gather_reduce, "y"), ("y", "weights"))

"""The gathers of an MoE layer as public functions: ragged_gather (dispatch:
fan tokens out to their sorted slots) and ragged_gather_reduce (combine: the
weighted sum of each token's slots). Checked arguments, computed by the
gateway's gather kernels."""
import numpy as np

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
    out = gw.gather_rows(x, idx, scale)
    return out if out.dtype == xt else out.astype(xt)


def ragged_gather_reduce(y, indices, weights=None):
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
    Returns:
      ``[T, d]`` in y's dtype, native byte order.
    """
    fn = "ragged_gather_reduce"
    y = v.as_array(y, "y", fn, ndim=2, shape_doc=" [N, d]")
    yt = v.float_dtype(y, "y", fn)
    ct = gw.compute_dtype(yt)
    idx = _gather_indices(indices, 2, " [T, k]", -1, y.shape[0], fn)
    w = _gather_weights(weights, idx, " [T, k]", ct, fn)
    out = gw.gather_reduce(y, idx, w)
    return out if out.dtype == yt else out.astype(yt)

"""Step 4 of the MoE layer, combine: each token's expert outputs back to the
token, weighted by the router; and its backward.

Forward, for expert outputs ``y [N, d]`` in sorted-slot order::

    out[t] = sum_j topk_weights[t, j] * y[slot_of[t, j]]    [T, d]

each token's terms summed in slot order (the order of its experts), the
order in which the down product that combines in its epilogue
(:func:`~.experts.forward` with ``combine``) adds them, whatever the
number of threads: the two give the same bits.

a dropped assignment (slot -1) adding nothing. Backward, for ``d_out``::

    d_y[slot_of[t, j]]   = topk_weights[t, j] * d_out[t]               [N, d]
                           (in y's dtype: rounded once for 16-bit y)
    d_topk_weights[t, j] = <d_out[t], y[slot_of[t, j]]>  (0 if dropped) [T, k]

Forward mode (:func:`jvp`), the combine being bilinear in y and the weights::

    t_out[t] = sum_j (topk_weights[t, j] * t_y[slot_of[t, j]]
                      + t_topk_weights[t, j] * y[slot_of[t, j]])

``topk_weights = None`` sums the outputs unweighted (the router weights
were applied to the experts' inputs, see :mod:`.dispatch`); then
``d_y[slot_of[t, j]] = d_out[t]`` and there is no weight gradient.

An expert-parallel layer brings ``y`` back from the expert ranks, in the
slot order of the dispatch plan, before this step.
"""
from typing import NamedTuple, Optional

import numpy as np

from .. import _gateway as gw
from .dispatch import Plan, slot_dots, slot_weights
from .rows import ScaledRows

__all__ = ["CombineResiduals", "forward", "backward", "jvp"]


class CombineResiduals(NamedTuple):
    """What the combine backward reads."""
    y: np.ndarray             # [N, d]
    plan: Plan
    topk_weights: Optional[np.ndarray]  # [T, k], or None (unweighted)


def forward(y, plan, topk_weights):
    """``out [T, d]`` from ``y [N, d]``, the dispatch ``plan`` and the router's
    ``topk_weights [T, k]`` (compute dtype; None: weights 1). Returns
    ``(out, residuals)``."""
    out = gw.gather_reduce(y, plan.slot_of, topk_weights, ordered=True)
    return out, CombineResiduals(y, plan, topk_weights)


def backward(res, d_out, lazy=False):
    """Backward of :func:`forward` for ``d_out [T, d]`` (compute dtype,
    contiguous rows). Returns ``(d_y [N, d], d_topk_weights [T, k])``
    (``d_topk_weights`` None when the combine is unweighted). ``d_y`` has
    y's dtype: 16-bit expert outputs get a 16-bit cotangent, each row
    ``weight * d_out[t]`` computed in float32 and rounded once, as the
    other hidden cotangents are (the experts' backward products then run
    on the 16-bit kernels). ``lazy``, for y of the compute dtype: d_y a
    :class:`~.rows.ScaledRows`, the rows left ungathered for the
    experts' backward to read through the index."""
    w, y = res.topk_weights, res.y
    hidden = y.dtype if y.dtype.itemsize == 2 else None
    tokens = res.plan.token_of_slot
    scale = None if w is None else slot_weights(res.plan.slot_of, w, y.shape[0])   # each slot's router weight
    d_y = ScaledRows(d_out, tokens, scale) if lazy and hidden is None \
        else gw.gather_rows(d_out, tokens, scale, out_dtype=hidden)
    # (unweighted: the weights went into the experts' inputs)
    return d_y, None if w is None else slot_dots(d_out, y, res.plan.slot_of)


def jvp(res, t_y, t_topk_weights=None):
    """Forward-mode derivative of :func:`forward` along ``t_y [N, d]`` and
    ``t_topk_weights [T, k]`` (compute dtype; None for zero; the latter
    ignored for an unweighted combine). Returns ``t_out [T, d]`` in the
    compute dtype, or None when both are zero."""
    w = res.topk_weights
    t_out = None if t_y is None else gw.gather_reduce(t_y, res.plan.slot_of, w, ordered=True)
    if w is not None and t_topk_weights is not None:
        term = gw.gather_reduce(res.y, res.plan.slot_of, t_topk_weights, ordered=True)
        t_out = term if t_out is None else t_out + term
    return t_out

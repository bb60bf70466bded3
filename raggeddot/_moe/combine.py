"""Step 4 of the MoE layer, combine: each token's expert outputs back to the
token, weighted by the router; and its backward.

Forward, for expert outputs ``y [N, d]`` in sorted-slot order::

    out[t] = sum_j topk_weights[t, j] * y[slot_of[t, j]]    (j in order) [T, d]

a dropped assignment (slot -1) adding nothing. Backward, for ``d_out``::

    d_y[slot_of[t, j]]   = topk_weights[t, j] * d_out[t]               [N, d]
    d_topk_weights[t, j] = <d_out[t], y[slot_of[t, j]]>  (0 if dropped) [T, k]

An expert-parallel layer brings ``y`` back from the expert ranks, in the
slot order of the dispatch plan, before this step.
"""
from typing import NamedTuple

import numpy as np

from .. import _gateway as gw
from .dispatch import Plan

__all__ = ["CombineResiduals", "forward", "backward"]


class CombineResiduals(NamedTuple):
    """What the combine backward reads."""
    y: np.ndarray             # [N, d]
    plan: Plan
    topk_weights: np.ndarray  # [T, k]


def forward(y, plan, topk_weights):
    """``out [T, d]`` from ``y [N, d]``, the dispatch ``plan`` and the router's
    ``topk_weights [T, k]`` (compute dtype). Returns ``(out, residuals)``."""
    out = gw.gather_reduce(y, plan.slot_of, topk_weights)
    return out, CombineResiduals(y, plan, topk_weights)


def backward(res, d_out):
    """Backward of :func:`forward` for ``d_out [T, d]`` (compute dtype,
    contiguous rows). Returns ``(d_y [N, d], d_topk_weights [T, k])``."""
    slot_of, w, y = res.plan.slot_of, res.topk_weights, res.y
    ct = y.dtype
    kept = slot_of >= 0
    # each slot receives its token's cotangent times its router weight
    w_slot = np.zeros(y.shape[0], dtype=ct)
    w_slot[slot_of[kept]] = w[kept]
    d_y = gw.gather_rows(d_out, res.plan.token_of_slot, w_slot)
    d_w = np.zeros(slot_of.shape, dtype=ct)
    for j in range(slot_of.shape[1]):
        kj = kept[:, j]
        if kj.any():
            d_w[kj, j] = np.einsum("td,td->t", d_out[kj], y[slot_of[kj, j]])
    return d_y, d_w

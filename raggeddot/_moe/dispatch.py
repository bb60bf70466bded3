"""Step 2 of the MoE layer, dispatch: sort the token-expert assignments by
expert and gather the token rows into that order; and its backward.

Forward, for tokens ``x [T, d]`` and ``topk_idx [T, k]``::

    plan = the T*k assignments counted by expert (a stable counting sort:
           expert e's slots are consecutive, in token order)
    xs[i] = x[plan.token_of_slot[i]]                                   [N, d]

N = sum(plan.group_sizes) is T*k, less the assignments dropped by a
capacity. Backward: the transpose of the gather, ``d_x[t] = sum_j
d_xs[slot_of[t, j]]`` (j in order, dropped slots adding nothing).

With the router weights applied to the experts' inputs (Llama4) the gather
scales each row by its assignment's weight, ``xs[slot_of[t, j]] = w[t, j]
* x[t]``, and the backward gives also ``d_w[t, j] = <d_xs[slot_of[t, j]],
x[t]>`` and weights ``d_x[t] = sum_j w[t, j] d_xs[slot_of[t, j]]``.

Forward mode (:func:`jvp`): the gather is linear in ``x`` (and, with
input weights, in ``w``), so ``t_xs[i] = t_x[token_of_slot[i]]`` (plus,
with input weights, ``w_slot[i] t_x[t] + t_w_slot[i] x[t]``).

An expert-parallel layer sends ``xs`` (and ``plan.group_sizes``) to the
ranks that hold the experts between this step and the experts step.
"""
from typing import NamedTuple

import numpy as np

from .. import _gateway as gw

__all__ = ["Plan", "forward", "backward", "jvp", "slot_weights", "slot_dots"]


class Plan(NamedTuple):
    """Where each assignment goes: dispatch's residuals, and combine's input."""
    slot_of: np.ndarray        # [T, k] int64: sorted slot of assignment (t, j), -1 if dropped
    token_of_slot: np.ndarray  # [N] int64: token of each sorted slot
    group_sizes: np.ndarray    # [E] int64: slots per expert


def slot_weights(slot_of, weights, num_slots):
    """``[num_slots]``: the weight ``weights[t, j]`` of the assignment each
    sorted slot holds (``weights [T, k]``, ``slot_of [T, k]`` the slot of
    each assignment, -1 where dropped)."""
    kept = slot_of >= 0
    w_slot = np.zeros(num_slots, dtype=weights.dtype)
    w_slot[slot_of[kept]] = weights[kept]
    return w_slot


def slot_dots(a, rows, slot_of):
    """``[T, k]``: ``<a[t], rows[slot_of[t, j]]>`` (0 for a dropped slot),
    for ``a [T, d]`` and ``rows [N, d]``, in the compute dtype (each sum in
    double, rounded once; 16-bit rows widened exactly)."""
    return gw.slot_dots(a, rows, slot_of)


def forward(x, topk_idx, num_experts, capacity=-1, weights=None):
    """Sort the assignments ``topk_idx [T, k]`` (experts in ``[0,
    num_experts)``) by expert and gather the rows of ``x [T, d]`` (compute
    dtype) into that order. ``capacity >= 0`` keeps at most that many
    assignments per expert, first come first served in token order; -1
    keeps all; an ``[E]`` integer array gives each expert its own limit
    (an expert-parallel layer's share of a capacity counted over every
    rank's tokens). ``weights [T, k]`` (router weights applied to the
    inputs): each gathered row is scaled by its assignment's weight.
    Returns ``(xs [N, d], plan)``."""
    plan = sort(topk_idx, num_experts, capacity)
    scale = None if weights is None else slot_weights(plan.slot_of, weights, plan.token_of_slot.shape[0])
    return gw.gather_rows(x, plan.token_of_slot, scale), plan


def sort(topk_idx, num_experts, capacity=-1):
    """The :class:`Plan` of :func:`forward` alone (the gather left to the
    kernels that read the rows through ``plan.token_of_slot``)."""
    if isinstance(capacity, int) or np.ndim(capacity) == 0:
        slot_of, token_of_slot, group_sizes = gw.sort_by_expert(topk_idx, num_experts, int(capacity))
    else:
        slot_of, token_of_slot, group_sizes = _sort_capped(topk_idx, num_experts, capacity)
    return Plan(slot_of, token_of_slot, group_sizes)


def _sort_capped(topk_idx, num_experts, capacity):
    """The plan's arrays with at most ``capacity[e] >= 0`` slots for expert
    e: the dropless sort, then each expert's first ``capacity[e]`` slots (its
    slots are in token order, so that is first come first served)."""
    slot_of, token_of_slot, sizes = gw.sort_by_expert(topk_idx, num_experts, -1)
    kept_sizes = np.minimum(sizes, capacity)
    starts = np.cumsum(sizes) - sizes
    # position of each sorted slot inside its expert's group
    rank_in_group = np.arange(token_of_slot.shape[0]) - np.repeat(starts, sizes)
    keep = rank_in_group < np.repeat(kept_sizes, sizes)
    new_slot = np.where(keep, np.cumsum(keep) - 1, -1)
    return new_slot[slot_of], token_of_slot[keep], kept_sizes.astype(np.int64)


def backward(plan, d_xs, x=None, weights=None):
    """``d_x [T, d]`` of :func:`forward` for the cotangent ``d_xs [N, d]``:
    every slot's gradient goes back to its token, each token's slots summed
    in slot order (as the experts' backward adds them where it combines).
    With the forward's ``weights [T, k]`` (and its ``x``) returns ``(d_x,
    d_weights [T, k])``."""
    if weights is None:
        return gw.gather_reduce(d_xs, plan.slot_of, ordered=True)
    return gw.gather_reduce(d_xs, plan.slot_of, weights, ordered=True), slot_dots(x, d_xs, plan.slot_of)


def jvp(plan, t_x, x=None, weights=None, t_weights=None):
    """Forward-mode derivative of :func:`forward` along ``t_x [T, d]``
    (compute dtype, or None for zero) and, for input weights ``weights [T,
    k]``, along their tangent ``t_weights [T, k]`` (or None)::

        t_xs[i] = w_slot[i] * t_x[t] + t_w_slot[i] * x[t],   t = token_of_slot[i]

    (``w_slot = 1``, no second term, without input weights). Returns
    ``t_xs [N, d]`` in the compute dtype, or None when it is zero."""
    n = plan.token_of_slot.shape[0]
    w_slot = None if weights is None else slot_weights(plan.slot_of, weights, n)
    t_xs = None if t_x is None else gw.gather_rows(t_x, plan.token_of_slot, w_slot)
    if weights is not None and t_weights is not None:
        term = gw.gather_rows(x, plan.token_of_slot, slot_weights(plan.slot_of, t_weights, n))
        t_xs = term if t_xs is None else t_xs + term
    return t_xs

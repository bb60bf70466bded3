"""Step 1 of the MoE layer, routing: which experts each token goes to, and
with what weight; and its backward.

Forward, for tokens ``x [T, d]`` and E experts::

    logits  = x @ router.weights (+ router.bias)                     [T, E]
    scores  = softmax(logits) | sigmoid(logits)   (per token)         [T, E]
    topk_idx[t]     = the top_k experts of scores[t] + selection_bias,
                      among the topk_groups best of n_groups expert groups [T, k]
    topk_weights[t] = scores[t, topk_idx[t]]
                      (/ their sum + (1e-20 for sigmoid) if norm_topk_prob)
                      * scaling                                        [T, k]

Backward: the choice (topk_idx) is held fixed, as in every framework; the
gradient flows from ``d topk_weights`` through the chosen scores into the
logits, then into ``x``, ``router.weights`` and ``router.bias``. The
forward-mode rule (:func:`jvp`) holds the choice fixed the same way: the
top-k selection is piecewise constant, so a tangent moves the weights of
the chosen experts, never the indices.
"""
import dataclasses
from typing import NamedTuple, Optional

import numpy as np

from .. import _gateway as gw

__all__ = ["Router", "RouteResiduals", "forward", "backward", "jvp"]


@dataclasses.dataclass
class Router:
    """The router's parameters, checked and in the compute dtype.

    Attributes:
      weights: ``[d, E]``.
      bias: ``[E]`` added to the logits, or None.
      selection_bias: ``[E]`` added to the scores for the choice only (the
        weights stay the unbiased scores), or None.
      score_func: "softmax" or "sigmoid".
      top_k: experts per token.
      n_groups, topk_groups: group-limited routing (1, 1 for none): only the
        topk_groups groups with the highest sum of their two best biased
        scores are eligible.
      norm_topk_prob: divide the chosen weights by their sum.
      scaling: ``routed_scaling_factor``, multiplies the weights.
    """
    weights: np.ndarray
    bias: Optional[np.ndarray]
    selection_bias: Optional[np.ndarray]
    score_func: str
    top_k: int
    n_groups: int
    topk_groups: int
    norm_topk_prob: bool
    scaling: float


class RouteResiduals(NamedTuple):
    """What the routing backward reads (and moe_block's aux reports)."""
    x: np.ndarray             # [T, d]
    logits: np.ndarray        # [T, E]
    scores: np.ndarray        # [T, E]
    topk_idx: np.ndarray      # [T, k] int64
    topk_weights: np.ndarray  # [T, k]


def forward(router, x):
    """Route the tokens ``x [T, d]`` (compute dtype, contiguous rows).

    Returns ``(topk_idx [T, k] int64, topk_weights [T, k], residuals)``.
    """
    logits = gw.matmul(x, router.weights)
    if router.bias is not None:
        logits += router.bias
    scores, idx, w = gw.route(logits, router.score_func, router.selection_bias, router.n_groups,
                              router.topk_groups, router.top_k, router.norm_topk_prob, router.scaling)
    return idx, w, RouteResiduals(x, logits, scores, idx, w)


def backward(router, res, d_topk_weights, d_x=None, d_logits=None):
    """Backward of :func:`forward` for the cotangent ``d_topk_weights [T, k]``.

    ``d scores`` is nonzero at the chosen experts only::

        dw      = d_topk_weights * scaling
        d_chosen = (dw - sum_j dw_j * w_j) / sum_j chosen_j   if norm_topk_prob
                   (w = the normalised weights), else dw
        d_logits = scores * (d_scores - sum_e d_scores_e * scores_e)   (softmax)
                 | d_scores * scores * (1 - scores)                    (sigmoid)

    ``d_logits [T, E]``, when given, is a cotangent of the logits from
    elsewhere (the aux losses), added before the products.

    Returns ``(d_x [T, d], d_router_weights [d, E], d_router_bias [E] or
    None)``; ``d_x = d_logits @ weights^T`` is added into ``d_x`` when one
    is given (the kernel accumulates into it), else a new array.
    """
    scores, idx, w = res.scores, res.topk_idx, res.topk_weights
    scale = router.scaling
    dwn = d_topk_weights * scale                    # through routed_scaling_factor
    if router.norm_topk_prob:
        wn = w / scale if scale != 0 else np.zeros_like(w)
        chosen = np.take_along_axis(scores, idx, axis=1)
        denom = chosen.sum(axis=1, keepdims=True)
        if router.score_func == "sigmoid":
            denom = denom + 1e-20
        dchosen = (dwn - np.sum(dwn * wn, axis=1, keepdims=True)) / denom
    else:
        dchosen = dwn
    dscores = np.zeros_like(scores)
    np.put_along_axis(dscores, idx, dchosen, axis=1)
    if router.score_func == "softmax":
        dlogits = scores * (dscores - np.sum(dscores * scores, axis=1, keepdims=True))
    else:
        dlogits = dscores * scores * (1 - scores)
    if d_logits is not None:
        dlogits += d_logits
    d_weights = gw.matmul(res.x.T, dlogits)
    if d_x is None:
        d_x = gw.matmul(dlogits, router.weights.T)
    else:
        gw.matmul(dlogits, router.weights.T, out=d_x, accumulate=True)
    d_bias = dlogits.sum(axis=0) if router.bias is not None else None
    return d_x, d_weights, d_bias


def jvp(router, res, t_x=None, t_weights=None):
    """Forward-mode derivative of :func:`forward`'s ``topk_weights`` along
    the tangents ``t_x [T, d]`` and ``t_weights [d, E]`` (compute dtype;
    None for zero; the router's bias is a constant here), with the choice
    ``topk_idx`` held fixed::

        t_logits = t_x @ weights + x @ t_weights                      [T, E]
        t_scores = scores * (t_logits - sum_e scores_e t_logits_e)  (softmax)
                 | scores * (1 - scores) * t_logits                  (sigmoid)
        t_chosen = t_scores at topk_idx                               [T, k]
        t_w      = (scaling * t_chosen - w * sum_j t_chosen_j) / denom  if norm_topk_prob
                   (denom = sum_j chosen_j (+1e-20 for sigmoid)), else scaling * t_chosen

    Returns ``t_topk_weights [T, k]``, or None when both tangents are None.
    """
    t_logits = None
    if t_x is not None:
        t_logits = gw.matmul(t_x, router.weights)
    if t_weights is not None:
        if t_logits is None:
            t_logits = gw.matmul(res.x, t_weights)
        else:
            gw.matmul(res.x, t_weights, out=t_logits, accumulate=True)
    if t_logits is None:
        return None
    scores, idx, w = res.scores, res.topk_idx, res.topk_weights
    if router.score_func == "softmax":
        t_scores = scores * (t_logits - np.sum(scores * t_logits, axis=1, keepdims=True))
    else:
        t_scores = scores * (1 - scores) * t_logits
    t_chosen = np.take_along_axis(t_scores, idx, axis=1)
    if not router.norm_topk_prob:
        return router.scaling * t_chosen
    denom = np.take_along_axis(scores, idx, axis=1).sum(axis=1, keepdims=True)
    if router.score_func == "sigmoid":
        denom = denom + 1e-20
    return (router.scaling * t_chosen - w * t_chosen.sum(axis=1, keepdims=True)) / denom

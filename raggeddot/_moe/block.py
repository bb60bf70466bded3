"""moe_block and moe_block_vjp: the MoE layer composed of its steps.

Forward (each step in its own module, with its backward beside it)::

    route     x [T, d]            -> topk_idx, topk_weights [T, k]
    dispatch  x, topk_idx         -> xs [N, d] sorted by expert, plan
    experts   xs, group_sizes     -> y [N, d]
    combine   y, plan, weights    -> out [T, d]
    shared    x                   -> out += shared MLP(x)   (when given)

Backward, in reverse: combine -> (d_y, d_topk_weights); experts -> (d_xs,
expert weight gradients); dispatch -> d_x; route adds the router's share
to d_x and gives the router's gradients; shared adds its share to d_x.
The steps meet only through these arrays and the dispatch plan, so an
exchange between processes fits between dispatch and experts (xs and
group_sizes to the ranks that hold the experts) and between experts and
combine (y back), without touching the other steps.
"""
import inspect
from typing import NamedTuple, Optional

import numpy as np

from .. import _autodiff
from .. import _gateway as gw
from .. import _validate as v
from . import combine, dispatch, experts, route, shared
from .config import prepare

__all__ = ["moe_block", "moe_block_vjp"]


class Residuals(NamedTuple):
    """Every step's residuals, for the backward (and the aux outputs)."""
    route: route.RouteResiduals
    plan: dispatch.Plan
    experts: experts.ExpertsResiduals
    combine: combine.CombineResiduals
    shared: Optional[shared.SharedResiduals]


def forward(layer):
    """``(out [T, d], residuals)`` of a checked :class:`~.config.Layer`, in the
    compute dtype."""
    topk_idx, topk_weights, r_route = route.forward(layer.router, layer.x)
    xs, plan = dispatch.forward(layer.x, topk_idx, layer.num_experts, layer.capacity)
    # (expert parallelism: xs and plan.group_sizes go to the experts' ranks here)
    y, r_experts = experts.forward(layer.experts, xs, plan.group_sizes)
    # (... and y comes back here, in the plan's slot order)
    out, r_combine = combine.forward(y, plan, topk_weights)
    r_shared = None
    if layer.shared is not None:
        r_shared = shared.forward(layer.shared, layer.x, out)
    return out, Residuals(r_route, plan, r_experts, r_combine, r_shared)


def backward(layer, res, d_out):
    """Gradients of the layer for ``d_out [T, d]`` (compute dtype, contiguous
    rows), in the compute dtype: a dict with x ``[T, d]``, router_weights,
    router_bias, the :class:`~.experts.ExpertGrads` fields and
    shared_experts (a tuple, when the layer has them)."""
    d_y, d_topk_weights = combine.backward(res.combine, d_out)
    d_xs, expert_grads = experts.backward(layer.experts, res.experts, d_y)
    d_x = dispatch.backward(res.plan, d_xs)
    d_x, d_rw, d_rb = route.backward(layer.router, res.route, d_topk_weights, d_x)
    grads = {"x": d_x, "router_weights": d_rw, "router_bias": d_rb, **expert_grads._asdict()}
    if layer.shared is not None:
        grads["shared_experts"] = shared.backward(layer.shared, res.shared, d_out, d_x)
    return grads


def aux_sums(layer, res):
    """The sums moe_block's statistics come from, over this call's tokens:
    ``(counts [E] float64, assignments per expert before any capacity;
    prob_sum [E], the sum over tokens of the softmax probabilities; T)``."""
    E, logits = layer.num_experts, res.route.logits
    counts = np.bincount(res.route.topk_idx.ravel(), minlength=E).astype(np.float64)
    if layer.router.score_func == "softmax":
        probs = res.route.scores
    else:
        z = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(z)
        probs /= probs.sum(axis=1, keepdims=True)
    return counts, probs.sum(axis=0), layer.x.shape[0]


def aux_dict(layer, res, counts, prob_sum, T, group_sizes, dropped):
    """moe_block's aux dict (see its docstring) of this call's routing and
    the statistics of ``T`` tokens: ``counts`` and ``prob_sum`` as
    :func:`aux_sums` gives them, ``group_sizes [E]`` kept per expert and
    ``dropped`` assignments."""
    idx, w = res.route.topk_idx, res.route.topk_weights
    E, top_k = layer.num_experts, layer.router.top_k
    frac = counts / max(1, T * top_k)
    mean_prob = prob_sum / T if T else np.zeros(E)
    load_balance = float(E * np.sum(frac * mean_prob))
    bias_updates = np.sign(counts.mean() - counts)
    lead = layer.x_shape[:-1]
    return {
        "topk_indices": idx.reshape(lead + (top_k,)),
        "topk_weights": w.reshape(lead + (top_k,)).astype(layer.out_dtype, copy=False),
        "group_sizes": group_sizes,
        "load_balance_loss": load_balance,
        "bias_updates": bias_updates,
        "dropped": int(dropped),
    }


def _aux(layer, res):
    """moe_block's aux dict (see its docstring)."""
    return aux_dict(layer, res, *aux_sums(layer, res), res.plan.group_sizes, np.sum(res.plan.slot_of < 0))


def moe_block(x, router_weights, w0, w1, wo, *, top_k, score_func="softmax", router_bias=None,
              selection_bias=None, n_groups=None, topk_groups=None, norm_topk_prob=False,
              routed_scaling_factor=1.0, activation="silu", w0_bias=None, w1_bias=None, wo_bias=None,
              shared_experts=None, capacity_factor=None, weights_layout="edf", return_aux=False,
              swiglu_limit=7.0):
    """A Mixture-of-Experts layer (route, dispatch, gated expert FFNs, combine) in C.

    With T tokens, E experts, ``e(t, j)`` the j-th expert chosen for token t
    and ``w[t, j]`` its router weight::

        out[t] = sum_j w[t, j] * FFN_e(t,j)(x[t])  (+ shared MLP(x[t]))
        FFN_e(z) = (act(z @ w0[e] + b0[e]) * (z @ w1[e] + b1[e])) @ wo[e] + bo[e]

    Args:
      x: ``[..., d]`` tokens (leading dims are flattened into T tokens).
      router_weights: ``[d, E]``; the logits are ``x @ router_weights``.
      w0, w1: gate and up projections ``[E, d, f]`` (``[E, f, d]`` with
        ``weights_layout="efd"``, the PyTorch/HF layout, read without copies).
      wo: down projection ``[E, f, d]`` (``[E, d, f]`` with "efd").
      top_k: experts per token.
      score_func: "softmax" (Mixtral, Qwen3, gpt-oss) or "sigmoid" (DeepSeek-V3)
        of the logits, per token.
      router_bias: ``[E]`` added to the logits (gpt-oss).
      selection_bias: ``[E]`` added to the scores for choosing only (DeepSeek's
        aux-loss-free balancing); the weights stay the unbiased scores.
      n_groups, topk_groups: group-limited routing: experts form n_groups groups;
        only the topk_groups groups with the highest sum of their two best
        selection scores are eligible.
      norm_topk_prob: divide the chosen weights by their sum (+1e-20 for sigmoid).
      routed_scaling_factor: multiplies the weights.
      activation: "silu", "gelu", "gelu_tanh", "relu" (all ``act(x@w0) * (x@w1)``)
        or "swiglu_oai" (gpt-oss: ``g * sigmoid(1.702 g) * (u + 1)`` with
        ``g = min(x@w0, limit)``, ``u = clip(x@w1, -limit, limit)``, limit =
        ``swiglu_limit``).
      w0_bias, w1_bias: ``[E, f]``; wo_bias: ``[E, d]``; added after each matmul.
      shared_experts: ``(w0 [d, fs], w1 [d, fs], wo [fs, d])``, a dense gated
        MLP (same activation) added for every token.
      capacity_factor: None is dropless; else each expert keeps at most
        ``ceil(T * top_k / E * capacity_factor)`` assignments, first come first
        served in token order, and dropped assignments contribute zero.
      return_aux: also return a dict: topk_indices ``[..., k]``, topk_weights
        ``[..., k]``, group_sizes ``[E]``, load_balance_loss (Switch:
        ``E * sum_e f_e P_e``, f_e the fraction of assignments to e, P_e the mean
        softmax probability of e), bias_updates (``sign(mean load - load_e)``,
        DeepSeek's aux-loss-free update direction), dropped (count).

    Returns:
      ``out [..., d]`` (and ``aux`` when return_aux), in the promoted dtype of
      the inputs; arithmetic in float32 (float64 when any input is float64).
    """
    layer = prepare(x, router_weights, w0, w1, wo, top_k=top_k, score_func=score_func,
                    router_bias=router_bias, selection_bias=selection_bias, n_groups=n_groups,
                    topk_groups=topk_groups, norm_topk_prob=norm_topk_prob,
                    routed_scaling_factor=routed_scaling_factor, activation=activation, w0_bias=w0_bias,
                    w1_bias=w1_bias, wo_bias=wo_bias, shared_experts=shared_experts,
                    capacity_factor=capacity_factor, weights_layout=weights_layout,
                    swiglu_limit=swiglu_limit)
    out, res = forward(layer)
    out = deliver_out(layer, out)
    if return_aux:
        return out, _aux(layer, res)
    return out


def moe_block_vjp(x, router_weights, w0, w1, wo, **kwargs):
    """``(out, vjp_fn)`` for moe_block with the same arguments.

    ``vjp_fn(d_out)``, ``d_out`` of out's shape ``[..., d]``, returns a dict
    of gradients with the shapes, layout and dtypes of the inputs: ``x``,
    ``router_weights``, ``w0``, ``w1``, ``wo``, and when given
    ``router_bias``, ``w0_bias``, ``w1_bias``, ``wo_bias``,
    ``shared_experts`` (a tuple of three). The expert choice is held fixed
    (top-k and selection_bias are not differentiable, as in every
    framework); gradients flow through the router weights of the chosen
    experts into the logits. Built from the same kernels as the forward:
    ragged_dot against transposed weights, the ragged-contraction kernel
    (tgmm) for weight gradients, and the gathers with their roles swapped.
    ``vjp_fn`` may be called any number of times.
    """
    kw = bind_arguments("moe_block_vjp", x, router_weights, w0, w1, wo, kwargs)
    layer = prepare(**kw)
    out, res = forward(layer)

    def vjp_fn(d_out):
        return deliver_grads(layer, kw, backward(layer, res, cotangent(layer, d_out, "moe_block_vjp")))

    return deliver_out(layer, out), vjp_fn


def bind_arguments(fn, x, router_weights, w0, w1, wo, kwargs):
    """moe_block's arguments with its own defaults, as a dict for
    :func:`~.config.prepare` (``return_aux`` refused: it is not
    differentiable). TypeError or ValueError prefixed with ``fn``."""
    try:  # the arguments and defaults of moe_block itself
        bound = inspect.signature(moe_block).bind(x, router_weights, w0, w1, wo, **kwargs)
    except TypeError as e:
        raise TypeError(f"{fn}: {e}") from None
    bound.apply_defaults()
    kw = dict(bound.arguments)
    if kw.pop("return_aux"):
        raise ValueError(f"{fn}: 'return_aux' is not differentiable; call moe_block for aux")
    return kw


def deliver_out(layer, out):
    """The layer's output ``[T, d]`` (compute dtype) as moe_block returns it:
    x's shape, the promoted input dtype."""
    return out.reshape(layer.x_shape).astype(layer.out_dtype, copy=False)


def cotangent(layer, d_out, fn):
    """The cotangent ``d_out`` of out's shape ``[..., d]``, checked, as
    :func:`backward` reads it: ``[T, d]``, compute dtype, contiguous rows."""
    g = v.as_array(d_out, "d_out", fn)
    if g.shape != layer.x_shape:
        raise ValueError(f"{fn}: cotangent must have shape {layer.x_shape}, got {g.shape}")
    return gw.operand(g.reshape(layer.x.shape), layer.compute_dtype, gw.ROWS)


def deliver_grads(layer, kw, grads):
    """:func:`backward`'s gradients as moe_block_vjp returns them: the
    shapes, layout and dtypes of the inputs ``kw`` (the arguments of
    :func:`bind_arguments`), in moe_block's order, the absent ones left
    out."""
    result = {}
    if layer.shared is not None:
        result["shared_experts"] = tuple(
            gr.astype(v.native(np.asarray(p).dtype), copy=False)
            for gr, p in zip(grads["shared_experts"], kw["shared_experts"]))
    for name in ("x", "router_weights", "w0", "w1", "wo", "router_bias", "w0_bias", "w1_bias", "wo_bias"):
        if kw[name] is not None:
            dtype = v.native(np.asarray(kw[name]).dtype)
            g = grads[name].reshape(layer.x_shape) if name == "x" else grads[name]
            result[name] = g.astype(dtype, copy=False)
    return result


def _moe_block_vjp_rule(args, wanted):
    """raggeddot.vjp(moe_block, x, router_weights, w0, w1, wo) support."""
    del wanted  # one backward pass yields every gradient
    kwargs = dict(args)
    primals = [kwargs.pop(name) for name in ("x", "router_weights", "w0", "w1", "wo")]
    if kwargs.pop("return_aux"):
        raise ValueError("vjp of moe_block: 'return_aux' must be False (aux is not differentiable)")
    return moe_block_vjp(*primals, **kwargs)


_autodiff.defvjp(moe_block, _moe_block_vjp_rule, ("x", "router_weights", "w0", "w1", "wo"))

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
Forward mode (:func:`tangent`), in the same order: route -> t_topk_weights
(the choice held fixed: top-k is piecewise constant); dispatch -> t_xs;
experts -> t_y; combine -> t_out; shared adds its share.
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
from .aux import _aux, aux_logits_cotangent
from .config import prepare
from .experts import split_gate_up

__all__ = ["moe_block", "moe_block_vjp"]


class Residuals(NamedTuple):
    """Every step's residuals, for the backward (and the aux outputs)."""
    route: route.RouteResiduals
    plan: dispatch.Plan
    experts: experts.ExpertsResiduals
    combine: combine.CombineResiduals
    shared: Optional[shared.SharedResiduals]


def forward(layer, keep=True):
    """``(out [T, d], residuals)`` of a checked :class:`~.config.Layer`, in the
    compute dtype (the experts' rows and hidden activations in the 16-bit
    dtype of ``layer.x_hidden`` when it is given). The router weights scale the experts' outputs in the
    combine, or (``layer.weights_on == "input"``) their inputs in the
    dispatch, the combine then summing unweighted. ``keep``: keep what the
    backward and the jvp read (without, the experts' gate and up products
    are never stored whole)."""
    topk_idx, topk_weights, r_route = route.forward(layer.router, layer.x)
    on_input = layer.weights_on == "input"
    rows = layer.x if layer.x_hidden is None else layer.x_hidden   # the experts' dtype
    if not on_input and experts.fuses(layer.experts, rows):
        # the fused gate and up pass reads the tokens' rows through the
        # dispatch's index while it packs them, no [N, d] copy (and the
        # backward's weight gradients read them so again)
        plan = dispatch.sort(topk_idx, layer.num_experts, layer.capacity)
        xs = experts.Gathered(rows, plan.token_of_slot)
    else:
        xs, plan = dispatch.forward(rows, topk_idx, layer.num_experts, layer.capacity,
                                    weights=topk_weights if on_input else None)
        if xs.dtype != rows.dtype:   # 16-bit rows scaled by their weights in float32
            xs = gw.narrow(xs, rows.dtype)
    # (expert parallelism: xs and plan.group_sizes go to the experts' ranks here)
    if not keep and experts.combines(layer.experts, rows):
        # no backward: the down product adds each row, times its weight,
        # into its token's output as its tile completes, no [N, d] y
        w_slot = None if on_input else dispatch.slot_weights(plan.slot_of, topk_weights, xs.shape[0])
        out, r_experts = experts.forward(layer.experts, xs, plan.group_sizes, keep=False,
                                         combine=(plan.token_of_slot, w_slot, layer.x.shape[0]))
        r_combine = combine.CombineResiduals(None, plan, None if on_input else topk_weights)
    else:
        y, r_experts = experts.forward(layer.experts, xs, plan.group_sizes, keep=keep)
        # (... and y comes back here, in the plan's slot order)
        out, r_combine = combine.forward(y, plan, None if on_input else topk_weights)
    r_shared = None
    if layer.shared is not None:
        r_shared = shared.forward(layer.shared, layer.x, out)
    return out, Residuals(r_route, plan, r_experts, r_combine, r_shared)


def activations(layer, keep=True):
    """``(shape, dtype)`` of the arrays :func:`forward` with ``keep`` holds
    at once, following its branches: the router's logits and scores
    ``[T, E]``, the dispatch's index (two int64 ``[N]``), the dispatched
    rows ``[N, d]`` (none where the gate and up pass reads the tokens
    through the index), their int8 copy with activation quantization (none
    where the kernels quantize them while they pack them), ``a`` ``[N, f]``
    (with ``h0`` and ``h1`` where the gate and up products run apart, or
    ``keep`` keeps them; ``a``'s int8 copy as the rows'), the experts'
    outputs ``[N, d]`` (none where the combine runs in the down product's
    epilogue)
    and the result ``[T, d]`` (N = T * top_k); checked against the
    machine's memory before the first is allocated."""
    T, d = layer.x.shape
    N, E, f = T * layer.router.top_k, layer.num_experts, layer.experts.w0.shape[2]
    ct = layer.compute_dtype
    hd = ct if layer.x_hidden is None else layer.x_hidden.dtype
    rows = layer.x if layer.x_hidden is None else layer.x_hidden
    ex = layer.experts
    gathered = layer.weights_on != "input" and experts.fuses(ex, rows)
    combined = not keep and experts.combines(ex, rows)
    held = [((T, E), ct), ((T, E), ct), ((N,), np.int64), ((N,), np.int64)]
    held += [] if gathered else [((N, d), hd)]
    if ex.act_qtype is not None:    # int8 copies, where the kernels do not quantize while they pack
        held += [] if experts.in_kernel(ex, rows, ex.w0, ex.w1) else [((N, d), np.int8)]
        held += [] if experts.in_kernel(ex, rows, ex.wo) else [((N, f), np.int8)]
    held += [((N, f), hd)] * (3 if keep or not experts.gate_up_one_pass(ex, rows) else 1)
    held += [((T, d), ct)] if combined else [((N, d), hd), ((T, d), ct)]
    return held


def activations_bound(layer):
    """Bytes :func:`activations` never exceeds, whatever branches the
    forward takes: every array of every branch counted, at 8 bytes an
    element."""
    T, d = layer.x.shape
    N, E, f = T * layer.router.top_k, layer.num_experts, layer.experts.w0.shape[2]
    return 8 * (2 * T * E + 2 * N + 3 * N * d + 4 * N * f + T * d)


def fits(layer, keep=True):
    """MemoryError (v.check_fits) when :func:`activations` cannot fit in the
    machine's memory; a layer whose :func:`activations_bound` fits (a
    decode step) skips following the branches."""
    limit = v.physical_memory()
    if limit is not None and activations_bound(layer) <= limit:
        return
    v.check_fits(activations(layer, keep))


def backward(layer, res, d_out, d_logits=None):
    """Gradients of the layer for ``d_out [T, d]`` (compute dtype, contiguous
    rows), in the compute dtype: a dict with x ``[T, d]``, router_weights,
    router_bias, the :class:`~.experts.ExpertGrads` fields, shared_experts
    (a tuple, when the layer has them) and shared_expert_gate ``[d, 1]``
    (when gated). ``d_logits [T, E]``: a cotangent of the router logits
    from the aux outputs (:func:`aux_logits_cotangent`), or None."""
    # (the cotangent rows d_y left ungathered where the experts' backward reads them through the index)
    d_y, d_topk_weights = combine.backward(res.combine, d_out, lazy=True)
    if layer.weights_on == "input":
        d_xs, expert_grads = experts.backward(layer.experts, res.experts, d_y)
        d_x, d_topk_weights = dispatch.backward(res.plan, d_xs, layer.x, res.route.topk_weights)
    else:   # the dispatch's backward added as the d_xs products complete, where they can
        d_x, expert_grads = experts.backward(layer.experts, res.experts, d_y,
                                             combine=(res.plan.token_of_slot, res.plan.slot_of))
    d_x, d_rw, d_rb = route.backward(layer.router, res.route, d_topk_weights, d_x, d_logits)
    grads = {"x": d_x, "router_weights": d_rw, "router_bias": d_rb, **expert_grads._asdict()}
    if layer.shared is not None:
        sg = shared.backward(layer.shared, res.shared, d_out, d_x)
        grads["shared_experts"] = sg[:3]
        if layer.shared.gate is not None:
            grads["shared_expert_gate"] = sg[3]
    return grads


def moe_block(x, router_weights, w0, w1, wo, *, top_k, score_func="softmax", router_bias=None,
              selection_bias=None, n_groups=None, topk_groups=None, norm_topk_prob=False,
              routed_scaling_factor=1.0, activation="silu", w0_bias=None, w1_bias=None, wo_bias=None,
              shared_experts=None, capacity_factor=None, weights_layout="edf", return_aux=False,
              swiglu_limit=7.0, swiglu_alpha=1.702, shared_expert_gate=None, router_weights_on="output",
              gate_up="concat", load_balance="switch", activation_qtype=None):
    """A Mixture-of-Experts layer (route, dispatch, gated expert FFNs, combine) in C.

    With T tokens, E experts, ``e(t, j)`` the j-th expert chosen for token t
    and ``w[t, j]`` its router weight::

        out[t] = sum_j w[t, j] * FFN_e(t,j)(x[t])        (router_weights_on="output")
        out[t] = sum_j FFN_e(t,j)(w[t, j] * x[t])        (router_weights_on="input", Llama4)
                 (+ shared MLP(x[t]), times sigmoid(x[t] @ shared_expert_gate) when given)
        FFN_e(z) = (act(z @ w0[e] + b0[e]) * (z @ w1[e] + b1[e])) @ wo[e] + bo[e]

    Args:
      x: ``[..., d]`` tokens (leading dims are flattened into T tokens).
      router_weights: ``[d, E]``; the logits are ``x @ router_weights``.
      w0, w1: gate and up projections ``[E, d, f]`` (``[E, f, d]`` with
        ``weights_layout="efd"``, the layout of ``nn.Linear`` weights, read
        without copies). ``w1=None``: w0 holds both, fused, ``[E, d, 2f]``
        ("edf", gpt-oss and Llama4's ``gate_up_proj``) or ``[E, 2f, d]``
        ("efd", transformers' Mixtral/Qwen/OLMoE ``gate_up_proj``), split as
        ``gate_up`` says and read as two strided views, never copied.
      wo: down projection ``[E, f, d]`` (``[E, d, f]`` with "efd").
        w0, w1 and wo may be :class:`~raggeddot.QArray` (or ``AsQArray``):
        the layer uses their dequantized values, read by the grouped
        kernels' packing (never dequantized whole); their gradients are
        those of the dequantized values. Or all three may be
        :class:`~raggeddot.PackedRhs` (:func:`~raggeddot.prepack`, with
        weights_layout="edf" and w1 given): see "Prepacked weights" below.
      top_k: experts per token.
      score_func: "softmax" (Mixtral, Qwen3, gpt-oss) or "sigmoid" (DeepSeek-V3,
        Llama4) of the logits, per token.
      router_bias: ``[E]`` added to the logits (gpt-oss).
      selection_bias: ``[E]`` added to the scores for choosing only (DeepSeek's
        aux-loss-free balancing); the weights stay the unbiased scores.
      n_groups, topk_groups: group-limited routing: experts form n_groups groups;
        only the topk_groups groups with the highest sum of their two best
        selection scores are eligible.
      norm_topk_prob: True or False: divide the chosen weights by their sum
        (+1e-20 for sigmoid).
      routed_scaling_factor: a finite real that multiplies the weights.
      activation: "silu", "gelu", "gelu_tanh", "relu" (all ``act(x@w0) * (x@w1)``)
        or "swiglu_oai" (gpt-oss: ``g * sigmoid(alpha g) * (u + 1)`` with
        ``g = min(x@w0, limit)``, ``u = clip(x@w1, -limit, limit)``, limit =
        ``swiglu_limit``, alpha = ``swiglu_alpha``).
      w0_bias, w1_bias: ``[E, f]``; wo_bias: ``[E, d]``; added after each matmul.
        With fused weights (w1=None), ``w0_bias`` is ``[E, 2f]``, split as
        the weights are (gpt-oss's ``gate_up_proj_bias``), and ``w1_bias``
        must be None.
      shared_experts: ``(w0 [d, fs], w1 [d, fs], wo [fs, d])``, a dense gated
        MLP (same activation) added for every token.
      capacity_factor: None (or ``float("inf")``) is dropless; else a
        positive real, and each expert keeps at most
        ``ceil(T * top_k / E * capacity_factor)`` assignments, first come first
        served in token order, and dropped assignments contribute zero.
      weights_layout: "edf" or "efd" (see w0, w1, wo).
      return_aux: also return a dict (see below).
      swiglu_limit, swiglu_alpha: the clip (positive; inf: none) and the
        sigmoid's slope (finite) of "swiglu_oai" (gpt-oss's
        config.swiglu_limit and config.swiglu_alpha), for the routed and the
        shared experts.
      shared_expert_gate: ``[d]`` or ``[d, 1]`` (Qwen2-MoE's
        ``shared_expert_gate``, an ``nn.Linear(d, 1)`` whose weight is its
        transpose ``[1, d]``); requires shared_experts.
      router_weights_on: "output" (default: the weights scale the experts'
        outputs) or "input" (they scale each expert's input and the outputs
        are summed unweighted; Llama4).
      gate_up: how fused weights hold gate and up along their 2f axis:
        "concat" (gate the first f, up the last f: Llama4, transformers'
        Mixtral/Qwen) or "interleaved" (gate the even, up the odd indices:
        gpt-oss). Only with w1=None.
      load_balance: the convention of aux's load_balance_loss, with
        ``c_e`` the assignments to expert e (the top-k choice, before any
        capacity) and ``P_e`` the mean over tokens of ``softmax(logits)[e]``:
        "switch" ``E * sum_e c_e / (T * top_k) * P_e`` (per assignment);
        "hf" ``E * sum_e c_e / T * P_e`` (transformers'
        ``load_balancing_loss_func``: top_k times "switch"; it recounts the
        top-k of ``softmax(router_logits)``, which is the choice made here
        for softmax routing without selection_bias or group limits);
        "maxtext" the "hf" value of each sequence (``x [..., S, d]``, a
        2-D x being one sequence) averaged over the sequences (MaxText's
        ``load_balance_loss`` without its weight factor).

    The aux dict: topk_indices ``[..., k]``, topk_weights ``[..., k]``,
    group_sizes ``[E]``, load_balance_loss (see load_balance), router_z_loss
    (ST-MoE: ``mean_t logsumexp_e(logits[t, e])**2``, as transformers'
    ``router_z_loss_func``), router_logits ``[..., E]`` (``x @
    router_weights + router_bias``, before selection_bias and the scores;
    transformers' ``router_logits``), bias_updates (``sign(mean load -
    load_e)``, DeepSeek's aux-loss-free update direction), dropped (count),
    and the dispatch order the grouped products ran in: slot_of ``[..., k]``
    (int64: the row of assignment ``(t, j)`` among the ``N`` rows sorted by
    expert, -1 when a capacity dropped it) and token_of_slot ``[N]`` (the
    token of each sorted row); the rows of expert e are
    ``[sum(group_sizes[:e]), sum(group_sizes[:e + 1]))``, in token order.
    Empty x gives losses 0.

    Dynamic activation quantization: ``activation_qtype`` ("int8", "int4"
    or "float8_e4m3fn"; None: off) quantizes the experts' inputs (the
    dispatched rows) and the gated activations ``a`` per row (one absmax
    scale per token, :func:`~raggeddot.quantize` with
    ``channelwise_axes=(0,)``) inside the call, before their products with
    the expert weights: with int8 QArray weights w0, w1, wo the three
    products then run on the exact int8 x int8 kernels (w8a8), with int4
    and MXFP4 ones too (w4a8: an MXFP4 value v taken as the int8 2v, its
    scale halved, exactly; 4 bits a weight when prepacked for it); with
    float weights the quantized rows are dequantized while packed. Gradients are
    straight through (qwix's): d(rows) and d(a) are those of the float
    layer, the weight gradients use the quantized rows.

    Prepacked weights: the layer's result and gradients are those of the
    weights a PackedRhs holds (the array or QArray given to prepack), bit
    for bit, whatever rows they meet, and each product runs on the layout
    for its rows, as prepack's rule says: rows quantized to int8
    (``activation_qtype="int8"``) on the int8 dot-product layout of int8
    QArray weights (the 4-bit one of int4 and MXFP4 weights), float32 rows (a float32 x or router with 16-bit
    weights) on the widening layout of bfloat16 weights, bfloat16 rows on
    the bfloat16 dot-product layout, float, int4 or float8 rows on the
    float layout of quantized weights. ``prepack(w, lhs_dtype=...)`` picks
    the layout made up front (``lhs_dtype=np.int8`` for int8 activations,
    ``np.float32`` for float32 rows with bfloat16 weights); a layout for
    other rows is made once, on the first call that needs it, and kept on
    the PackedRhs: as much memory again as its ``nbytes``
    (``PackedRhs.layouts`` lists them). A layer computing in float64 (a
    float64 x or router) with float32, 16-bit or quantized prepacked
    weights raises ValueError naming moe_block and the weight: give float32
    inputs, or the plain weights.

    Precision: arithmetic in float32 (float64 when any input is float64).
    When x and every weight share one 16-bit dtype (bfloat16 or float16),
    the hidden activations are kept in it, as MaxText and SGLang keep them:
    the dispatched rows, ``h0``, ``h1``, ``a`` and the experts' outputs are
    16-bit, each product accumulated in float32 and rounded once (to
    nearest even), the activation computed in float32 and rounded once;
    routing, the combine (a float32 sum of the 16-bit expert outputs) and
    the shared experts stay float32, and the output is rounded once. Their
    memory is then half the float32 layer's. The backward keeps its hidden
    cotangents (``d_y``, ``d_a``, ``d_h0``, ``d_h1``) 16-bit the same way and returns
    16-bit gradients, each accumulated in float32. Give float32 x to keep
    float32 hidden activations with 16-bit weights.

    Returns:
      ``out [..., d]`` (and ``aux`` when return_aux), in the promoted dtype of
      the inputs.
    """
    layer = prepare(x, router_weights, w0, w1, wo, top_k=top_k, score_func=score_func,
                    router_bias=router_bias, selection_bias=selection_bias, n_groups=n_groups,
                    topk_groups=topk_groups, norm_topk_prob=norm_topk_prob,
                    routed_scaling_factor=routed_scaling_factor, activation=activation, w0_bias=w0_bias,
                    w1_bias=w1_bias, wo_bias=wo_bias, shared_experts=shared_experts,
                    capacity_factor=capacity_factor, weights_layout=weights_layout,
                    swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha,
                    shared_expert_gate=shared_expert_gate, router_weights_on=router_weights_on,
                    gate_up=gate_up, load_balance=load_balance, activation_qtype=activation_qtype)
    with v.memory_for("moe_block", "the layer's activations (routing, dispatched rows, hidden "
                      "activations [N, f], expert outputs [N, d]) or its result [..., d]"):
        fits(layer, keep=False)
        out, res = forward(layer, keep=False)     # no backward: h0, h1 need not be kept
        out = deliver_out(layer, out)
    if return_aux:
        return out, _aux(layer, res)
    return out


def moe_block_vjp(x, router_weights, w0, w1, wo, **kwargs):
    """``(out, vjp_fn)`` for moe_block with the same arguments; with
    ``return_aux=True``, ``((out, aux), vjp_fn)``.

    ``vjp_fn(d_out)``, ``d_out`` of out's shape ``[..., d]``, returns a dict
    of gradients with the shapes, layout and dtypes of the inputs: ``x``,
    ``router_weights``, ``w0``, ``w1`` (absent for fused weights, w1=None:
    ``w0`` is then the fused gradient), ``wo``, and when given
    ``router_bias``, ``w0_bias``, ``w1_bias``, ``wo_bias``,
    ``shared_experts`` (a tuple of three), ``shared_expert_gate`` (in the
    shape given). The expert choice is held fixed (top-k and selection_bias
    are not differentiable, as in every framework); gradients flow through
    the router weights of the chosen experts into the logits. Built from the
    same kernels as the forward: ragged_dot against transposed weights, the
    ragged-contraction kernel (tgmm) for weight gradients, and the gathers
    with their roles swapped. ``vjp_fn`` may be called any number of times.

    With ``return_aux=True`` it is ``vjp_fn(d_out, d_aux=None)``: ``d_aux``
    a dict with any of "load_balance_loss", "router_z_loss" (scalars) and
    "router_logits" (``[..., E]``), the cotangents of those aux outputs;
    their gradients are added into x, router_weights and router_bias
    (nothing else depends on them). The counts of the load-balancing loss
    are held fixed: it is differentiated through the mean probabilities.
    ``d_out=None`` means a zero cotangent of out.
    """
    fn = "moe_block_vjp"
    kwargs = dict(kwargs)
    return_aux = bool(kwargs.pop("return_aux", False))
    kw = bind_arguments(fn, x, router_weights, w0, w1, wo, kwargs)
    layer = prepare(**kw, fn=fn)
    with v.memory_for(fn, "the layer's activations (routing, dispatched rows, hidden activations "
                      "[N, f], expert outputs [N, d]) or its result [..., d]"):
        fits(layer)
        out, res = forward(layer)

    def gradients(d_out, d_aux):
        d_logits = aux_logits_cotangent(layer, res, d_aux, fn)
        if d_out is None:
            g = np.zeros(layer.x.shape, dtype=layer.compute_dtype)
        else:
            g = cotangent(layer, d_out, fn)
        with v.memory_for(fn, "the gradients (of every weight, x [..., d] and the hidden "
                          "activations [N, f])"):
            return deliver_grads(layer, kw, backward(layer, res, g, d_logits))

    if not return_aux:
        return deliver_out(layer, out), lambda d_out: gradients(d_out, None)

    def vjp_fn(d_out, d_aux=None):
        return gradients(d_out, d_aux)

    return (deliver_out(layer, out), _aux(layer, res)), vjp_fn


def bind_arguments(fn, x, router_weights, w0, w1, wo, kwargs):
    """moe_block's arguments with its own defaults, as a dict for
    :func:`~.config.prepare` (``return_aux`` refused: a caller that
    supports it takes it out of ``kwargs`` first). TypeError or ValueError
    prefixed with ``fn``."""
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
    return gw.deliver(out.reshape(layer.x_shape), None, np.dtype(layer.out_dtype))


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
            gw.deliver(gr, None, np.dtype(_autodiff.primal_dtype(p)))
            for gr, p in zip(grads["shared_experts"], kw["shared_experts"]))
    for name in ("x", "router_weights", "w0", "w1", "wo", "router_bias", "w0_bias", "w1_bias", "wo_bias",
                 "shared_expert_gate"):
        if kw.get(name) is not None:
            # a quantized weight's gradient is its dequantized value's; a
            # prepacked one's, that of the weights it holds
            dtype = _autodiff.primal_dtype(kw[name])
            g = grads[name]
            if name == "x":
                g = g.reshape(layer.x_shape)
            elif name == "shared_expert_gate":
                g = g.reshape(layer.gate_shape)
            # (float32 into 16 bits by the C narrowing: ml_dtypes' cast of a
            # weight's gradient took a quarter of a bfloat16 training step)
            result[name] = gw.deliver(g, None, np.dtype(dtype))
    return result


def _moe_block_vjp_rule(args, wanted):
    """raggeddot.vjp(moe_block, x, router_weights, w0, w1, wo) support."""
    del wanted  # one backward pass yields every gradient
    kwargs = dict(args)
    primals = [kwargs.pop(name) for name in ("x", "router_weights", "w0", "w1", "wo")]
    if kwargs.pop("return_aux"):
        raise ValueError("vjp of moe_block: 'return_aux' must be False; for gradients of the aux "
                         "outputs call raggeddot.moe_block_vjp(..., return_aux=True)")
    return moe_block_vjp(*primals, **kwargs)


_autodiff.defvjp(moe_block, _moe_block_vjp_rule, ("x", "router_weights", "w0", "w1", "wo"),
                 keyword_argnames=("router_bias", "w0_bias", "w1_bias", "wo_bias", "shared_experts",
                                   "shared_expert_gate"),
                 full_vjp="raggeddot.moe_block_vjp")


def tangent(layer, res, t_x=None, t_router=None, t_w0=None, t_w1=None, t_wo=None):
    """Forward-mode derivative of :func:`forward`'s ``out [T, d]`` along
    tangents of the tokens ``t_x [T, d]``, the router ``t_router [d, E]``
    and the expert weights (the views :class:`~.experts.Experts` holds,
    ``[E, d, f]`` / ``[E, f, d]``), all in the compute dtype, None for
    zero; every other argument is a constant. The expert choice is held
    fixed, as in the backward. Returns ``t_out [T, d]`` (compute dtype), or
    None when every tangent is None."""
    t_w = route.jvp(layer.router, res.route, t_x, t_router)
    on_input = layer.weights_on == "input"
    t_xs = dispatch.jvp(res.plan, t_x, layer.x, res.route.topk_weights if on_input else None,
                        t_w if on_input else None)
    t_y = experts.jvp(layer.experts, res.experts, t_xs, t_w0, t_w1, t_wo)
    t_out = combine.jvp(res.combine, t_y, None if on_input else t_w)
    if layer.shared is not None and t_x is not None:
        term = shared.jvp(layer.shared, res.shared, t_x)
        t_out = term if t_out is None else t_out + term
    return t_out


def _tangent_views(layer, tangents):
    """The tangents of moe_block's primals (``{name: array or None}``, in
    the stored shapes and layout) as :func:`tangent` takes them: compute
    dtype, x as ``[T, d]``, fused gate/up split and "efd" weights
    transposed exactly as :func:`~.config.prepare` reads the weights."""
    ct = layer.compute_dtype

    def get(name):
        t = tangents.get(name)
        return None if t is None else np.asarray(t).astype(ct, copy=False)

    t_x, t_router = get("x"), get("router_weights")
    if t_x is not None:
        t_x = t_x.reshape(layer.x.shape)
    t_w0, t_w1, t_wo = get("w0"), get("w1"), get("wo")
    ex = layer.experts
    if ex.gate_up is not None and t_w0 is not None:
        t_w0, t_w1 = split_gate_up(t_w0, 1 if ex.transposed else 2, ex.gate_up)
    if ex.transposed:
        t_w0, t_w1, t_wo = (None if t is None else t.transpose(0, 2, 1) for t in (t_w0, t_w1, t_wo))
    return t_x, t_router, t_w0, t_w1, t_wo


def _moe_block_jvp_rule(args, tangents):
    """raggeddot.jvp(moe_block, (x, router_weights, w0, w1, wo), tangents)
    support: arguments bound by keyword (biases, shared experts) are
    constants of the derivative."""
    kw = dict(args)
    if kw.pop("return_aux"):
        raise ValueError("jvp of moe_block: 'return_aux' must be False; jvp differentiates the "
                         "output only")
    layer = prepare(**kw, fn="jvp of moe_block")
    out, res = forward(layer)
    t_out = tangent(layer, res, *_tangent_views(layer, tangents))
    return deliver_out(layer, out), None if t_out is None else t_out.reshape(layer.x_shape)


_autodiff.defjvp(moe_block, _moe_block_jvp_rule, ("x", "router_weights", "w0", "w1", "wo"),
                 packed_argnames=("w0", "w1", "wo"))

"""The "raggeddot" experts implementation of transformers' MoE layers.

transformers decorates each MoE experts module with
``use_experts_implementation``, which sets flags on the module and looks its
forward up by name in ``transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS``.
:func:`experts_forward` is that forward, on raggeddot's operators; it reads
the module's weights and flags and calls the module's own code where the
module defines something raggeddot does not (a gate other than the known
ones, an activation of ungated experts, a post-expert norm).

For ``T`` tokens, each routed to ``k`` experts (``top_k_index [T, k]``, with
weights ``top_k_weights [T, k]``), ``E`` experts, hidden size ``d`` and
expert width ``f``::

    sort the T*k assignments by expert (stable): slot s holds assignment
        order[s]; group_sizes[e] = number of assignments to expert e
    xs  = ragged_gather(x, order // k)                          [T*k, d]
    h   = gmm(xs, W_up[e]) (+ b_up[e])      rows of expert e    [T*k, 2f] (f ungated)
    a   = gated_activation(h)  or  module._apply_gate(h)        [T*k, f]
          (ungated: module.act_fn(h))
    y   = gmm(a, W_down[e]) (+ b_down[e]), then module.post_expert_norm(y)
    out[t] = sum_j top_k_weights[t, j] * y[slot of (t, j)]      [T, d]
          (each token's terms added in slot order: its experts' order, as
          transformers' loop over experts adds them)

Without autograd, gated experts with no biases run two fused passes: the
gate and up products in one pass reading the tokens' rows in place with the
activation in its epilogue (no xs, no h), and the down product with the
combine in its epilogue (no y, where the layer is wide enough: see
``raggeddot._moe.experts.COMBINE_MIN_COLS``); the same bits.

Weights are ``gate_up_proj [E, 2f, d]`` (``up_proj [E, f, d]`` without a
gate) and ``down_proj [E, d, f]``, or their transposes ``[E, d, 2f]`` /
``[E, f, d]`` when the module is ``is_transposed``; they are read in place
(``transpose_rhs`` instead of a copy). Expert ids ``>= E`` (the sentinels of
expert parallelism) are sorted past every group: their rows are never
computed and they add nothing to the output. The gradients of the input,
of every weight and bias and of the routing weights flow through the
operators' autograd rules (tgmm for the weights, gmm with the other
``transpose_rhs`` for the rows).

Inference (no gradient asked for, outside a torch.compile trace) reads the
weights from a prepacked copy (``raggeddot.prepack``: laid out once in the
micro-kernel's panel order, so a decode step streams each weight once instead
of packing it again, transposed, on every call). The copy is made on first
use (once, when several threads meet the weights at the same time) and
kept on the parameter, keyed by its storage, shape, strides and version
counter and the kernels selected, so an in-place update (an optimizer
step, ``load_state_dict``) or ``runtime.set_kernel`` makes a new one. It costs one more copy of the expert weights in memory:
``set_weight_cache(False)`` turns it off (and drops nothing already made;
``clear_weight_cache(model)`` does).

Expert weights may be kept in MXFP4 (``_mxfp4``: ``hold_mxfp4``,
``quantize_experts_mxfp4``, ``load_mxfp4_experts`` and
``load_mxfp4_checkpoint`` from a gpt-oss checkpoint's ``*_blocks`` /
``*_scales``): prepacked at 4.25 bits a weight and multiplied by the 4-bit
micro-kernels, for inference, with the float rows or (``set_activation_qtype``)
rows quantized to int8 by the kernels (w4a8); that path calls the gather,
gate and combine operators' bodies directly (no autograd to record).

Known gates run in C (:func:`gated_activation`): the default
``act_fn(gate) * up`` for SiLU, GELU (erf), tanh GELU and ReLU, with gate
and up concatenated or interleaved as the module's ``is_concatenated`` says, and gpt-oss's clamped swiglu on interleaved gate/up (its
``alpha`` and ``limit``). Any other ``_apply_gate`` runs as the module
defines it, between two raggeddot products.
"""
import sys
import threading

import numpy as np
import torch

import raggeddot as _rd

from . import _convert as cv
from ._matmul import gmm
from ._moe_ops import (gated_activation, gated_rows_act, gather_reduce_rows, gather_rows, ragged_gather,
                       ragged_gather_reduce)
from ._mxfp4 import ACT_ATTR, CACHE_ATTRS, MXFP4_ATTR

__all__ = ["EXPERTS_IMPLEMENTATION", "experts_forward", "register_transformers", "set_weight_cache",
           "clear_weight_cache"]

#: The name the implementation is registered under.
EXPERTS_IMPLEMENTATION = "raggeddot"

_GPT_OSS = ("transformers.models.gpt_oss.modeling_gpt_oss", "GptOssExperts")
_CACHE_ATTR = CACHE_ATTRS[0]         # (and CACHE_ATTRS[1] for the gate and up halves)
_cache = {"enabled": True}
_CACHE_LOCK = threading.Lock()       # held while a prepacked copy is made
# the fused gate and up pass of inference (experts_forward); off: the
# composition of gmm and gated_activation, the same bits
_FUSED = {"enabled": True}


def set_weight_cache(enabled):
    """Whether inference keeps prepacked copies of the expert weights (see
    the module docstring); returns the previous setting."""
    previous, _cache["enabled"] = _cache["enabled"], bool(enabled)
    return previous


def clear_weight_cache(model):
    """Drop the prepacked weight copies held by ``model``'s parameters."""
    for p in model.parameters():
        for attr in CACHE_ATTRS:
            if hasattr(p, attr):
                delattr(p, attr)


def _prepacked(weight, transpose):
    """``raggeddot.prepack`` of the ``[E, k, n]`` weights (``[E, n, k]``
    with ``transpose``), made once per version of the parameter."""
    return _prepacked_views(weight, [weight], transpose, _CACHE_ATTR)[0]


def _prepacked_views(param, views, transpose, attr=CACHE_ATTRS[1]):
    """:func:`_prepacked` of ``views`` of the parameter ``param`` (the gate
    and up halves of gate_up_proj), kept on the parameter under ``attr`` (a
    view is made afresh every call), made once per version of it."""
    key = tuple((v.data_ptr(), v._version, v.dtype, tuple(v.shape), v.stride(), transpose) for v in views) \
        + (_rd.runtime.get_kernel(),)      # (laid out for the kernels selected: remade when they change)
    held = getattr(param, attr, None)
    if held is not None and held[0] == key:
        return held[1]
    with _CACHE_LOCK:      # threads meeting the weights first together: one makes the copy, the others wait
        held = getattr(param, attr, None)
        if held is not None and held[0] == key:
            return held[1]
        packed = [_rd.prepack(cv.array(v), transpose_rhs=transpose) for v in views]
        setattr(param, attr, (key, packed))
        return packed


def _use_prepacked(rows, weight):
    return (_cache["enabled"] and not torch.compiler.is_compiling() and weight.device.type == "cpu"
            and not (torch.is_grad_enabled() and (rows.requires_grad or weight.requires_grad)))


def _activation_name(act):
    """The C name of an activation module (None when it is not one)."""
    name = type(act).__name__
    if name in ("SiLUActivation", "SiLU"):
        return "silu"
    if name == "GELUActivation":       # erf GELU (also with use_gelu_python)
        return "gelu"
    if name in ("GELUTanh", "NewGELUActivation"):
        return "gelu_tanh"
    if name == "GELU" and isinstance(act, torch.nn.GELU):
        return "gelu" if act.approximate == "none" else "gelu_tanh"
    if name == "ReLU" and isinstance(act, torch.nn.ReLU):
        return "relu"
    return None


def _default_gate():
    from transformers.integrations.moe import _default_apply_gate
    return _default_apply_gate


def _gpt_oss_gate():
    mod = sys.modules.get(_GPT_OSS[0])
    cls = getattr(mod, _GPT_OSS[1], None) if mod is not None else None
    return None if cls is None else cls._apply_gate


def fused_gate(module):
    """``(activation, layout, limit, alpha)`` when the module's gate is one
    the C kernels compute, else None (then ``module._apply_gate`` runs)."""
    apply_gate = type(module)._apply_gate
    if apply_gate is _default_gate():       # act_fn(gate) * up, gate/up as the module's flag lays them out
        act = _activation_name(getattr(module, "act_fn", None))
        layout = "concat" if getattr(module, "is_concatenated", True) else "interleaved"
        return None if act is None else (act, layout, 0.0, 1.0)
    if apply_gate is _gpt_oss_gate():
        return ("swiglu_oai", "interleaved", float(module.limit), float(module.alpha))
    return None


def _sort_by_expert(top_k_index, num_experts):
    """``(token_of_slot [N], slot_of [T, k], expert_of_slot [N], group_sizes
    [E])`` (int64 tensors, N = T*k): a stable sort of the assignments by
    expert id. Sentinel ids (>= E) sort last, outside every group; their
    slot_of is -1. (In NumPy where torch.compile does not trace it: a
    decode step's dozen small torch operators cost ~0.1 ms.)"""
    if torch.compiler.is_compiling() or top_k_index.device.type != "cpu":
        return _sort_by_expert_traced(top_k_index, num_experts)
    T, k = top_k_index.shape
    ids = cv.array(top_k_index.detach()).astype(np.int64, copy=False)
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    slot_of = np.empty_like(order)
    slot_of[order] = np.arange(flat.shape[0])
    slot_of = np.where(ids >= num_experts, -1, slot_of.reshape(T, k))
    clipped = np.clip(flat, 0, num_experts)
    group_sizes = np.bincount(clipped, minlength=num_experts + 1)[:num_experts]
    expert_of_slot = np.minimum(clipped[order], num_experts - 1)
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in (order // k, slot_of, expert_of_slot,
                                                                      group_sizes))


def _sort_by_expert_traced(top_k_index, num_experts):
    """:func:`_sort_by_expert` in torch operators (what torch.compile traces)."""
    T, k = top_k_index.shape
    flat = top_k_index.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)
    slots = torch.arange(flat.shape[0], device=flat.device)
    slot_of = torch.empty_like(order).scatter_(0, order, slots).view(T, k)
    slot_of = slot_of.masked_fill(top_k_index >= num_experts, -1)
    clipped = flat.clamp(0, num_experts)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, clipped, torch.ones_like(clipped))
    expert_of_slot = clipped[order].clamp(max=num_experts - 1)
    return order // k, slot_of, expert_of_slot, counts[:num_experts]


def _grouped_linear(module, rows, weight, bias, group_sizes, expert_of_slot, dtype):
    """``rows[rows of e] @ W[e]^T (+ bias[e])``: W stored ``[E, out, in]``,
    or ``[E, in, out]`` when the module is transposed."""
    transpose = not module.is_transposed
    if isinstance(weight, _rd.PackedRhs):      # MXFP4 weights held by hold_mxfp4
        if torch.is_grad_enabled() and rows.requires_grad:
            raise RuntimeError("experts held in MXFP4 (hold_mxfp4) are for inference: run under "
                               "torch.no_grad(), or keep the weights as parameters to train")
        out = cv.empty((rows.shape[0], weight.shape[2]), dtype)
        lhs = cv.array(rows.detach())
        if getattr(module, ACT_ATTR, None) == "int8":     # (set_activation_qtype: w4a8)
            lhs = _rd.AsQArray(lhs, "int8", channelwise_axes=(0,))
        _rd.gmm(lhs, weight, cv.array(group_sizes), preferred_element_type=cv.np_dtype(dtype), out=cv.array(out))
    elif _use_prepacked(rows, weight):
        out = cv.empty((rows.shape[0], weight.shape[1 if transpose else 2]), dtype)
        _rd.gmm(cv.array(rows), _prepacked(weight, transpose), cv.array(group_sizes),
                preferred_element_type=cv.np_dtype(dtype), out=cv.array(out))
    else:
        out = gmm(rows, weight, group_sizes, dtype, None, None, transpose)
    if bias is not None:
        out = out + bias.index_select(0, expert_of_slot).to(dtype)
    return out


def _fused_gate_up(self, hidden_states, token_of_slot, group_sizes, spec, dtype):
    """``a [N, f]`` of the gated experts without autograd, from one fused
    pass (raggeddot's ``gated_rows``): the gate and up products of each
    packed block of the tokens' rows, read through ``token_of_slot`` (no
    xs copy), with the activation applied to each tile as it completes (no
    ``h [N, 2f]``). The values of the gmm over ``gate_up_proj`` then
    :func:`gated_activation`, bit for bit (the gate and up views, prepacked
    apart when the weight cache is on, sum as the fused weight's columns
    do). None where that pass does not apply (see the caller)."""
    from .._moe.experts import split_gate_up
    from .. import _gateway as gw
    w = self.gate_up_proj
    if not isinstance(w, torch.Tensor) or w.device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16,
                                                                                 torch.float16, torch.float64):
        return None
    activation, layout, limit, alpha = spec
    axis = 2 if self.is_transposed else 1              # the 2f axis: [E, d, 2f] or [E, 2f, d]
    transpose = not self.is_transposed
    views = split_gate_up(w, axis, layout)
    f = views[0].shape[axis]
    rows = hidden_states.detach().to(dtype)
    if _use_prepacked(rows, w):
        w0, w1 = _prepacked_views(w, views, transpose)    # (beside the whole weight's)
    else:
        w0, w1 = (cv.array(v).transpose(0, 2, 1) if transpose else cv.array(v) for v in views)
    x = cv.array(rows)
    if x.dtype != w0.dtype or not x.flags.c_contiguous:
        return None
    gs = cv.array(group_sizes)
    bounds = gw.group_bounds(gs, 0, gs.shape[0])
    a = torch.zeros((token_of_slot.shape[0], f), dtype=dtype)
    if int(bounds[-1]) and f:
        gw.gated_rows(x, w0, w1, bounds, cv.array(a), None, None, None, None, activation, limit, alpha,
                      rows=cv.array(token_of_slot))
    return a


def _fused_down_combine(self, a, group_sizes, token_of_slot, slot_of, top_k_weights):
    """``[T, d]`` in a's dtype without autograd, from the down product with
    the combine in its epilogue (raggeddot's ``combine_rows``): each slot's
    row of y times its routing weight added into its token's row as the
    product's tile completes, no ``y [N, d]``. The values of the gmm over
    ``down_proj`` then ``ragged_gather_reduce(..., ordered=True)``, bit for
    bit. None where that pass does not apply (see the caller) or does not
    pay (fewer than ``COMBINE_MIN_COLS`` output columns a thread)."""
    from .._moe.dispatch import slot_weights
    from .._moe.experts import COMBINE_MIN_COLS
    from .. import _gateway as gw
    w = self.down_proj
    if not isinstance(w, torch.Tensor) or w.device.type != "cpu" or getattr(self, "has_post_expert_norm", False):
        return None
    transpose = not self.is_transposed
    d = w.shape[1 if transpose else 2]
    if d < COMBINE_MIN_COLS * _rd.get_num_threads():
        return None
    x = cv.array(a)
    if _use_prepacked(a, w):
        wo = _prepacked(w, transpose)
    else:
        wo = cv.array(w).transpose(0, 2, 1) if transpose else cv.array(w)
        if wo.dtype != x.dtype:
            return None
    ct = gw.compute_dtype(x.dtype)
    slots = cv.array(slot_of)
    w_slot = slot_weights(slots, cv.array(top_k_weights.detach()).astype(ct), token_of_slot.shape[0])
    out = np.zeros((slots.shape[0], d), dtype=ct)
    gs = cv.array(group_sizes)
    bounds = gw.group_bounds(gs, 0, gs.shape[0])
    gw.combine_rows(x, wo, bounds, out, cv.array(token_of_slot), w_slot, None, x.dtype)
    return cv.tensor(out if out.dtype == x.dtype else out.astype(x.dtype))


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The experts of an MoE layer on raggeddot's operators (the module
    docstring has the math).

    Args:
      self: the transformers experts module (flags ``has_gate``,
        ``is_transposed``, ``has_bias``, ``has_post_expert_norm``; weights
        ``gate_up_proj`` or ``up_proj``, ``down_proj``, biases ``*_bias``).
      hidden_states: ``[T, d]``.
      top_k_index: ``[T, k]`` expert ids (ids >= num_experts are skipped).
      top_k_weights: ``[T, k]`` routing weights.

    Returns:
      ``[T, d]`` in hidden_states' dtype.
    """
    dtype = hidden_states.dtype
    num_experts = self.num_experts
    token_of_slot, slot_of, expert_of_slot, group_sizes = _sort_by_expert(top_k_index, num_experts)
    has_bias = getattr(self, "has_bias", False)
    held = getattr(self, MXFP4_ATTR, {})
    spec = fused_gate(self) if self.has_gate else None
    a = None
    # without autograd, a gate the kernels compute, plain gate_up weights and
    # no biases (added in the hidden dtype by the composition below): one
    # fused pass gives a
    if spec is not None and not has_bias and not held and _FUSED["enabled"] \
            and not torch.compiler.is_compiling() \
            and not (torch.is_grad_enabled() and (hidden_states.requires_grad or self.gate_up_proj.requires_grad)):
        a = _fused_gate_up(self, hidden_states, token_of_slot, group_sizes, spec, dtype)
    if a is not None:
        out = _fused_down_combine(self, a, group_sizes, token_of_slot, slot_of, top_k_weights)
        if out is not None:
            return out.to(dtype)
        b_down = None
        y = _grouped_linear(self, a, held.get("down_proj", self.down_proj), b_down, group_sizes, expert_of_slot,
                            dtype)
        if getattr(self, "has_post_expert_norm", False):
            y = self.post_expert_norm(y)
        return ragged_gather_reduce(y, slot_of, top_k_weights, True).to(dtype)
    # held MXFP4 weights are for inference: their rows need no autograd, and the
    # operators' bodies are called without torch's dispatcher (~30 us a call at decode)
    direct = bool(held) and not torch.compiler.is_compiling() \
        and not (torch.is_grad_enabled() and (hidden_states.requires_grad or top_k_weights.requires_grad))
    gather, gate, combine = (gather_rows, gated_rows_act, gather_reduce_rows) if direct \
        else (ragged_gather, gated_activation, ragged_gather_reduce)
    xs = gather(hidden_states, token_of_slot)
    if self.has_gate:
        w_up, b_up = self.gate_up_proj, getattr(self, "gate_up_proj_bias", None) if has_bias else None
        w_up = held.get("gate_up_proj", w_up)
    else:
        w_up, b_up = self.up_proj, getattr(self, "up_proj_bias", None) if has_bias else None
        w_up = held.get("up_proj", w_up)
    h = _grouped_linear(self, xs, w_up, b_up, group_sizes, expert_of_slot, dtype)
    if self.has_gate:
        a = gate(h, *spec) if spec is not None else self._apply_gate(h)
    else:
        a = self.act_fn(h)
    b_down = getattr(self, "down_proj_bias", None) if has_bias else None
    y = _grouped_linear(self, a.to(dtype), held.get("down_proj", self.down_proj), b_down, group_sizes,
                        expert_of_slot, dtype)
    if getattr(self, "has_post_expert_norm", False):
        y = self.post_expert_norm(y)
    # a token's experts in expert order
    out = combine(y, slot_of, top_k_weights, True)
    return out.to(dtype)


def register_transformers(missing_ok=False):
    """Register :func:`experts_forward` as the experts implementation
    "raggeddot" of transformers (``ALL_EXPERTS_FUNCTIONS``), so that
    ``from_pretrained(..., experts_implementation="raggeddot")`` (or
    ``from_config``) selects it. Returns True once registered; without
    transformers, ImportError (False with ``missing_ok``)."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        if missing_ok:
            return False
        raise
    ALL_EXPERTS_FUNCTIONS.register(EXPERTS_IMPLEMENTATION, experts_forward)
    return True

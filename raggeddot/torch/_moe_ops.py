"""The MoE pieces as torch operators: ``torch.ops.raggeddot.ragged_gather``
(dispatch), ``ragged_gather_reduce`` (combine) and ``gated_activation`` (the
fused gate of an expert FFN), each with a fake implementation and an
autograd rule computed by raggeddot's own backward (one operator each:
``*_backward``), whose results have static shapes.

- ``out = ragged_gather(x, idx, w)``, ``out[i] = w[i] x[idx[i]]``:
  ``d_x[t] = sum_{i: idx[i] = t} w[i] ct[i]`` (a gather-reduce over the
  inverse map), ``d_w[i] = <ct[i], x[idx[i]]>``;
- ``out = ragged_gather_reduce(y, idx, w)``, ``out[t] = sum_j w[t, j]
  y[idx[t, j]]``: ``d_y[s] = sum_{idx[t, j] = s} w[t, j] ct[t]``,
  ``d_w[t, j] = <ct[t], y[idx[t, j]]>`` (0 where ``idx[t, j] = -1``);
- ``a = gated_activation(h)``: the C kernels' element-wise derivative.
"""
import functools
from typing import List, Optional

import numpy as np
import torch

import raggeddot as _rd
from raggeddot import _gateway as _gw

from . import _convert as cv

__all__ = ["ragged_gather", "ragged_gather_reduce", "gated_activation", "ACTIVATIONS", "LAYOUTS"]

_NS = "raggeddot::"


def _needs(ctx, i):
    """Whether input i wants a gradient (a trace may list only the inputs passed)."""
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]
#: The gated activations computed in C: ``act(gate) * up`` for all but
#: "swiglu_oai" (gpt-oss's clamped gate with slope alpha).
ACTIVATIONS = tuple(_gw.ACTIVATIONS)
#: How gate and up share the last axis of the fused projection: its first
#: and second halves ("concat") or its even and odd columns ("interleaved").
LAYOUTS = ("concat", "interleaved")


def _empty_grad(like):
    return like.new_empty((0,))


def _gather_meta(rows, indices, weights, fn, rows_name, idx_ndim):
    cv.check_tensor(rows, rows_name, fn, ndim=2)
    cv.check_tensor(indices, "indices", fn, kinds="int", ndim=idx_ndim)
    cv.check_tensor(weights, "weights", fn, optional=True)
    if weights is not None and tuple(weights.shape) != tuple(indices.shape):
        raise ValueError(f"raggeddot.torch.{fn}: 'weights' must have the shape of 'indices' "
                         f"{tuple(indices.shape)}, got {tuple(weights.shape)}")


def _vjp(op, rows, indices, weights, need_weights, ct):
    """``(d_rows, d_weights)`` by ``raggeddot.vjp``; weights not asked for are
    bound as a constant (so their gradient is not computed)."""
    r, i, w = cv.array(rows), cv.array(indices), cv.array(weights)
    if weights is not None and need_weights:
        _, f = _rd.vjp(op, r, i, w)
        d_rows, _, d_w = f(cv.array(ct))
        return [cv.tensor(d_rows), cv.tensor(d_w)]
    _, f = _rd.vjp(functools.partial(op, weights=w), r, i)
    return [cv.tensor(f(cv.array(ct))[0]), _empty_grad(rows)]


# --------------------------------------------------------------- ragged_gather

@torch.library.custom_op(_NS + "ragged_gather", mutates_args=())
def ragged_gather(x: torch.Tensor, indices: torch.Tensor, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dispatch (``raggeddot.ragged_gather``): ``out[i] = x[indices[i]]``
    (times ``weights[i]``). x ``[T, d]``, indices ``[N]`` in ``[0, T)``,
    weights ``[N]`` or None; returns ``[N, d]`` in x's dtype."""
    _gather_meta(x, indices, weights, "ragged_gather", "x", 1)
    return gather_rows(x, indices, weights)


def gather_rows(x, indices, weights=None):
    """The body of :func:`ragged_gather`, without torch's dispatcher or
    autograd (for inference callers that checked their operands)."""
    return cv.tensor(_rd.ragged_gather(cv.array(x), cv.array(indices), cv.array(weights)))


@ragged_gather.register_fake
def _(x, indices, weights=None):
    _gather_meta(x, indices, weights, "ragged_gather", "x", 1)
    return x.new_empty((indices.shape[0], x.shape[1]))


@torch.library.custom_op(_NS + "ragged_gather_backward", mutates_args=())
def ragged_gather_backward(ct: torch.Tensor, x: torch.Tensor, indices: torch.Tensor,
                           weights: Optional[torch.Tensor], need_weights: bool) -> List[torch.Tensor]:
    """``[d_x [T, d], d_weights [N]]`` of ragged_gather for ``ct [N, d]``
    (d_weights is empty unless weights are given and ``need_weights``)."""
    cv.check_tensor(ct, "ct", "ragged_gather_backward", ndim=2)
    return _vjp(_rd.ragged_gather, x, indices, weights, need_weights, ct)


@ragged_gather_backward.register_fake
def _(ct, x, indices, weights, need_weights):
    d_w = torch.empty_like(weights) if weights is not None and need_weights else _empty_grad(x)
    return [torch.empty_like(x, memory_format=torch.contiguous_format), d_w]


def _gather_setup(ctx, inputs, output):
    rows, indices, weights = inputs[:3]       # (then the combine's order: the gradients do not depend on it)
    ctx.save_for_backward(rows, indices, weights)
    ctx.extra = len(inputs) - 3


def _backward_with(op_backward):
    def backward(ctx, ct):
        rows, indices, weights = ctx.saved_tensors
        need_w = weights is not None and _needs(ctx, 2)
        d_rows, d_w = op_backward(ct, rows, indices, weights, need_w)
        return ((d_rows if _needs(ctx, 0) else None), None, (d_w if need_w else None)) + (None,) * ctx.extra
    return backward


ragged_gather.register_autograd(_backward_with(ragged_gather_backward), setup_context=_gather_setup)


# -------------------------------------------------------- ragged_gather_reduce

@torch.library.custom_op(_NS + "ragged_gather_reduce", mutates_args=())
def ragged_gather_reduce(y: torch.Tensor, indices: torch.Tensor,
                         weights: Optional[torch.Tensor] = None, ordered: bool = False) -> torch.Tensor:
    """Combine (``raggeddot.ragged_gather_reduce``): ``out[t] = sum_j
    weights[t, j] * y[indices[t, j]]``, j = 0..k-1 in order (``ordered``:
    in the order of the indices); an index of -1 adds nothing. y ``[N,
    d]``, indices ``[T, k]`` in ``[-1, N)``, weights ``[T, k]`` or None
    (ones); returns ``[T, d]`` in y's dtype."""
    _gather_meta(y, indices, weights, "ragged_gather_reduce", "y", 2)
    return gather_reduce_rows(y, indices, weights, ordered)


def gather_reduce_rows(y, indices, weights=None, ordered=False):
    """The body of :func:`ragged_gather_reduce`, without torch's dispatcher
    or autograd (for inference callers that checked their operands)."""
    return cv.tensor(_rd.ragged_gather_reduce(cv.array(y), cv.array(indices), cv.array(weights),
                                              ordered=bool(ordered)))


@ragged_gather_reduce.register_fake
def _(y, indices, weights=None, ordered=False):
    _gather_meta(y, indices, weights, "ragged_gather_reduce", "y", 2)
    return y.new_empty((indices.shape[0], y.shape[1]))


@torch.library.custom_op(_NS + "ragged_gather_reduce_backward", mutates_args=())
def ragged_gather_reduce_backward(ct: torch.Tensor, y: torch.Tensor, indices: torch.Tensor,
                                  weights: Optional[torch.Tensor], need_weights: bool) -> List[torch.Tensor]:
    """``[d_y [N, d], d_weights [T, k]]`` of ragged_gather_reduce for
    ``ct [T, d]`` (d_weights is empty unless weights are given and
    ``need_weights``)."""
    cv.check_tensor(ct, "ct", "ragged_gather_reduce_backward", ndim=2)
    return _vjp(_rd.ragged_gather_reduce, y, indices, weights, need_weights, ct)


@ragged_gather_reduce_backward.register_fake
def _(ct, y, indices, weights, need_weights):
    d_w = torch.empty_like(weights) if weights is not None and need_weights else _empty_grad(y)
    return [torch.empty_like(y, memory_format=torch.contiguous_format), d_w]


ragged_gather_reduce.register_autograd(_backward_with(ragged_gather_reduce_backward),
                                       setup_context=_gather_setup)


# ------------------------------------------------------------ gated_activation

def _act_meta(h, activation, layout, fn):
    cv.check_tensor(h, "h", fn, ndim=2)
    if activation not in ACTIVATIONS:
        raise ValueError(f"raggeddot.torch.{fn}: 'activation' must be one of {ACTIVATIONS}, got {activation!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"raggeddot.torch.{fn}: 'layout' must be one of {LAYOUTS}, got {layout!r}")
    if h.shape[1] % 2:
        raise ValueError(f"raggeddot.torch.{fn}: 'h' [N, 2f] must have an even number of columns, "
                         f"got shape {tuple(h.shape)}")


def _split(h, layout):
    """gate and up of the fused ``[N, 2f]`` array, contiguous (the kernels
    read flat memory)."""
    if layout == "concat":
        f = h.shape[1] // 2
        gate, up = h[:, :f], h[:, f:]
    else:
        gate, up = h[:, 0::2], h[:, 1::2]
    return np.ascontiguousarray(gate), np.ascontiguousarray(up)


@torch.library.custom_op(_NS + "gated_activation", mutates_args=())
def gated_activation(h: torch.Tensor, activation: str = "silu", layout: str = "concat", limit: float = 7.0,
                     alpha: float = 1.702) -> torch.Tensor:
    """The gate of an expert FFN on the fused projection ``h [N, 2f]``,
    computed in C: ``act(gate) * up`` (activation "silu", "gelu" (erf),
    "gelu_tanh", "relu"), or gpt-oss's "swiglu_oai" ``g * sigmoid(alpha g) *
    (u + 1)`` with ``g = min(gate, limit)``, ``u = clip(up, -limit, limit)``.
    ``layout`` says where gate and up sit in h: "concat" (``h = [gate | up]``)
    or "interleaved" (gate in the even columns, up in the odd ones).
    Returns ``[N, f]`` in h's dtype (16-bit values computed in float32)."""
    _act_meta(h, activation, layout, "gated_activation")
    return gated_rows_act(h, activation, layout, limit, alpha)


def gated_rows_act(h, activation="silu", layout="concat", limit=7.0, alpha=1.702):
    """The body of :func:`gated_activation`, without torch's dispatcher or
    autograd (for inference callers that checked their operands)."""
    gate, up = _split(cv.array(h), layout)
    return cv.tensor(_gw.gated_act(gate, up, activation, limit, alpha))


@gated_activation.register_fake
def _(h, activation="silu", layout="concat", limit=7.0, alpha=1.702):
    _act_meta(h, activation, layout, "gated_activation")
    return h.new_empty((h.shape[0], h.shape[1] // 2))


@torch.library.custom_op(_NS + "gated_activation_backward", mutates_args=())
def gated_activation_backward(ct: torch.Tensor, h: torch.Tensor, activation: str, layout: str, limit: float,
                              alpha: float) -> torch.Tensor:
    """``d_h [N, 2f]`` of :func:`gated_activation` for ``ct [N, f]``, with
    d_gate and d_up in the places of gate and up."""
    fn = "gated_activation_backward"
    _act_meta(h, activation, layout, fn)
    cv.check_tensor(ct, "ct", fn, ndim=2)
    gate, up = _split(cv.array(h), layout)
    d = np.ascontiguousarray(cv.array(ct), dtype=gate.dtype)
    d_gate, d_up = _gw.gated_act_grad(gate, up, d, activation, limit, alpha)
    d_h = cv.empty(h.shape, h.dtype)
    out = cv.array(d_h)
    f = gate.shape[1]
    if layout == "concat":
        out[:, :f], out[:, f:] = d_gate, d_up
    else:
        out[:, 0::2], out[:, 1::2] = d_gate, d_up
    return d_h


@gated_activation_backward.register_fake
def _(ct, h, activation, layout, limit, alpha):
    return torch.empty_like(h, memory_format=torch.contiguous_format)


def _act_setup(ctx, inputs, output):
    h, activation, layout, limit, alpha = inputs
    ctx.save_for_backward(h)
    ctx.args = (activation, layout, limit, alpha)


def _act_backward(ctx, ct):
    (h,) = ctx.saved_tensors
    return gated_activation_backward(ct, h, *ctx.args), None, None, None, None


gated_activation.register_autograd(_act_backward, setup_context=_act_setup)

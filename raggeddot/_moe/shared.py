"""The shared experts of an MoE layer: a dense gated MLP every token goes
through, added to the routed output (optionally gated per token, as
Qwen2-MoE does); and its backward.

Forward, for tokens ``x [T, d]``::

    h0 = x @ w0;  h1 = x @ w1;  a = act(h0) * h1                        [T, fs]
    m  = a @ wo                                                         [T, d]
    out += m                      (no gate)
    out += sigmoid(x @ gate) * m  (gate [d]: one scalar per token)

Backward, for ``d_out``::

    s = sigmoid(x @ gate);  d_m = s * d_out   (d_out without a gate)
    d_gate = x^T @ (<d_out[t], m[t]> * s * (1 - s))
    d_wo = a^T @ d_m;  d_a = d_m @ wo^T;  d_h0, d_h1 = act's gradient
    d_w0 = x^T @ d_h0;   d_w1 = x^T @ d_h1
    d_x += d_h0 @ w0^T + d_h1 @ w1^T (+ (<d_out[t], m[t]> s (1 - s)) gate^T)

Forward mode along ``t_x`` (the weights are constants of moe_block's
derivatives: keyword arguments), with ``da/dh`` act's elementwise partials::

    t_h0 = t_x @ w0;  t_h1 = t_x @ w1;  t_m = (da/dh0 t_h0 + da/dh1 t_h1) @ wo
    t_out = t_m   (no gate)  |  s t_m + s (1 - s) (t_x @ gate) m

The branch is parallel to the routed path; moe_block adds its input
gradient after the router's.
"""
import dataclasses
from typing import NamedTuple, Optional

import numpy as np

from .. import _gateway as gw

__all__ = ["SharedExperts", "SharedResiduals", "forward", "backward", "jvp"]


@dataclasses.dataclass
class SharedExperts:
    """The shared MLP's weights in the compute dtype: w0, w1 ``[d, fs]``, wo
    ``[fs, d]``; ``activation``, ``limit`` and ``alpha`` as the routed
    experts'; ``gate`` ``[d, 1]`` or None (ungated)."""
    w0: np.ndarray
    w1: np.ndarray
    wo: np.ndarray
    activation: str
    limit: float
    alpha: float = 1.702
    gate: Optional[np.ndarray] = None


class SharedResiduals(NamedTuple):
    """What the shared experts' backward reads (m and s only with a gate)."""
    x: np.ndarray   # [T, d]
    h0: np.ndarray  # [T, fs]
    h1: np.ndarray  # [T, fs]
    a: np.ndarray   # [T, fs]
    m: Optional[np.ndarray] = None  # [T, d], the MLP's output before the gate
    s: Optional[np.ndarray] = None  # [T, 1], sigmoid(x @ gate)


def _sigmoid(z):
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e)).astype(z.dtype, copy=False)


def forward(shared, x, out):
    """``out [T, d] += (sigmoid(x @ gate) *) act(x @ w0) * (x @ w1) @ wo``
    in place (ungated, the kernel accumulates into ``out``). Returns the
    residuals."""
    h0, h1 = gw.matmul(x, shared.w0), gw.matmul(x, shared.w1)
    a = gw.gated_act(h0, h1, shared.activation, shared.limit, shared.alpha)
    if shared.gate is None:
        gw.matmul(a, shared.wo, out=out, accumulate=True)
        return SharedResiduals(x, h0, h1, a)
    m = gw.matmul(a, shared.wo)
    s = _sigmoid(gw.matmul(x, shared.gate))
    out += s * m
    return SharedResiduals(x, h0, h1, a, m, s)


def backward(shared, res, d_out, d_x):
    """Backward of :func:`forward` for ``d_out [T, d]``: adds the input
    gradient into ``d_x [T, d]`` and returns ``(d_w0, d_w1, d_wo)``, and
    ``d_gate [d, 1]`` after them when the branch is gated."""
    d_m = d_out if shared.gate is None else res.s * d_out
    d_wo = gw.matmul(res.a.T, d_m)
    d_a = gw.matmul(d_m, shared.wo.T)
    d_h0, d_h1 = gw.gated_act_grad(res.h0, res.h1, d_a, shared.activation, shared.limit, shared.alpha)
    d_w0, d_w1 = gw.matmul(res.x.T, d_h0), gw.matmul(res.x.T, d_h1)
    gw.matmul(d_h0, shared.w0.T, out=d_x, accumulate=True)
    gw.matmul(d_h1, shared.w1.T, out=d_x, accumulate=True)
    if shared.gate is None:
        return d_w0, d_w1, d_wo
    d_z = np.einsum("td,td->t", d_out, res.m)[:, None] * res.s * (1 - res.s)   # [T, 1]
    d_gate = gw.matmul(res.x.T, d_z)
    gw.matmul(d_z, shared.gate.T, out=d_x, accumulate=True)
    return d_w0, d_w1, d_wo, d_gate


def jvp(shared, res, t_x):
    """Forward-mode derivative of the branch :func:`forward` adds, along
    ``t_x [T, d]`` (compute dtype; the weights held constant). Returns
    ``t_out [T, d]`` (the branch's share of the layer's tangent)."""
    t_h0, t_h1 = gw.matmul(t_x, shared.w0), gw.matmul(t_x, shared.w1)
    da_dh0, da_dh1 = gw.gated_act_grad(res.h0, res.h1, np.ones_like(res.h0), shared.activation,
                                       shared.limit, shared.alpha)
    t_m = gw.matmul(da_dh0 * t_h0 + da_dh1 * t_h1, shared.wo)
    if shared.gate is None:
        return t_m
    t_z = gw.matmul(t_x, shared.gate)                      # [T, 1]
    return res.s * t_m + (res.s * (1 - res.s) * t_z) * res.m

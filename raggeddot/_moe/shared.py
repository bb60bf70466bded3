"""The shared experts of an MoE layer: a dense gated MLP every token goes
through, added to the routed output; and its backward.

Forward, for tokens ``x [T, d]``::

    h0 = x @ w0;  h1 = x @ w1;  a = act(h0) * h1                        [T, fs]
    out += a @ wo                                                       [T, d]

Backward, for ``d_out``::

    d_wo = a^T @ d_out;  d_a = d_out @ wo^T;  d_h0, d_h1 = act's gradient
    d_w0 = x^T @ d_h0;   d_w1 = x^T @ d_h1
    d_x += d_h0 @ w0^T + d_h1 @ w1^T

The branch is parallel to the routed path; moe_block adds its input
gradient after the router's.
"""
import dataclasses
from typing import NamedTuple

import numpy as np

from .. import _gateway as gw

__all__ = ["SharedExperts", "SharedResiduals", "forward", "backward"]


@dataclasses.dataclass
class SharedExperts:
    """The shared MLP's weights in the compute dtype: w0, w1 ``[d, fs]``, wo
    ``[fs, d]``; ``activation`` and ``limit`` as the routed experts'."""
    w0: np.ndarray
    w1: np.ndarray
    wo: np.ndarray
    activation: str
    limit: float


class SharedResiduals(NamedTuple):
    """What the shared experts' backward reads."""
    x: np.ndarray   # [T, d]
    h0: np.ndarray  # [T, fs]
    h1: np.ndarray  # [T, fs]
    a: np.ndarray   # [T, fs]


def forward(shared, x, out):
    """``out [T, d] += act(x @ w0) * (x @ w1) @ wo`` in place (the kernel
    accumulates into ``out``). Returns the residuals."""
    h0, h1 = gw.matmul(x, shared.w0), gw.matmul(x, shared.w1)
    a = gw.gated_act(h0, h1, shared.activation, shared.limit)
    gw.matmul(a, shared.wo, out=out, accumulate=True)
    return SharedResiduals(x, h0, h1, a)


def backward(shared, res, d_out, d_x):
    """Backward of :func:`forward` for ``d_out [T, d]``: adds the input
    gradient into ``d_x [T, d]`` and returns ``(d_w0, d_w1, d_wo)``."""
    d_wo = gw.matmul(res.a.T, d_out)
    d_a = gw.matmul(d_out, shared.wo.T)
    d_h0, d_h1 = gw.gated_act_grad(res.h0, res.h1, d_a, shared.activation, shared.limit)
    d_w0, d_w1 = gw.matmul(res.x.T, d_h0), gw.matmul(res.x.T, d_h1)
    gw.matmul(d_h0, shared.w0.T, out=d_x, accumulate=True)
    gw.matmul(d_h1, shared.w1.T, out=d_x, accumulate=True)
    return d_w0, d_w1, d_wo

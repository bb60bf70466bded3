#!/usr/bin/env python
"""Benchmark raggeddot.moe_block (forward, and forward+backward with moe_block_vjp).

    python benchmarks/bench_moe.py [--quick] [--threads N] [--dtype float32|float64]
                                   [--scenario NAME_OR_GLOB ...] [--variants NAME ...]
                                   [--out DIR] [--list]

A whole MoE layer (route, dispatch, gate/up/down expert matmuls, combine, shared experts) on
Mixtral-, Qwen3-MoE-, DeepSeek-V3- and gpt-oss-like shapes scaled to a 2-core machine
(T = 4096 tokens, d = 1024; --quick: T = 1024).

Variants
  raggeddot  raggeddot.moe_block / raggeddot.moe_block_vjp (+ vjp_fn(ct)).
  numpy      the same algorithm in plain NumPy: argsort routing, a stable argsort of the
             assignments by expert, a gather, one np.matmul per expert for each of the three
             projections, the activation, a weighted combine; its backward is the same loop
             of per-expert matmuls (d_in = d_out @ w.T, d_w = in.T @ d_out). It is the oracle of
             the timing runs; it is itself checked against raggeddot.reference/_moe_reference
             on the scenario's weights and the first tokens before anything is timed.
  torch      the expert loop of HF transformers (MixtralSparseMoeBlock: one_hot expert mask,
             torch.where per hit expert, F.linear on nn.Linear-layout [f, d] weights,
             index_add_), DeepSeek-V3's group-limited sigmoid router; backward by autograd.
             When torch imports.
  jax        jax.jit of the same layer on jax.lax.ragged_dot (CPU), backward by jax.vjp.
             XLA:CPU lowers ragged_dot to a dense dot over a masked [N, E*d] copy (E times the
             FLOPs); scenarios whose estimated time or masked copy is too large are "skip".

Every variant is checked against the NumPy version before it is timed (forward output, and in
forward+backward the gradients of x, router_weights, w0, w1, wo and of every bias / shared
expert the variant returns: max |a - b| / max |b| <= 1e-4 float32, 1e-10 float64); a variant
that fails is reported FAILED and not timed. Times are medians after a warm-up (the checking
call), of an adaptive number of runs (>= 3).

Memory: peak extra memory of one call (tracemalloc; NumPy arrays, including the ones the C
extension returns, are traced; the C kernels' small packing buffers are not, nor are the result
blocks raggeddot keeps idle for reuse between calls, up to raggeddot.set_buffer_cache's limit),
for raggeddot and numpy only (torch and XLA allocate outside tracemalloc).

Dispatch + combine: raggeddot.ragged_gather (x -> [N, d]) and ragged_gather_reduce
([N, d] -> [T, d], router-weighted) timed separately on the scenario's routing.

Targets (per scenario): forward >= 3x numpy; forward+backward >= 3x numpy; peak extra memory
<= 1.5x numpy's (forward and forward+backward); dispatch + combine < 10% of the forward.
Outputs: a table on stdout, <out>/bench_moe.json, then REACHED / MISSED per target.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "benchmarks", "results")

# ----------------------------------------------------------------------------------------------
# Scenarios. d_model is scaled to 1024 and the expert width f so that one raggeddot forward
# takes ~0.5 s at T = 4096 on the 2-core reference machine; the routing (E, top_k, score function,
# groups) is the model's, E halved or quartered where noted.

SCENARIOS: dict[str, dict] = {
    "mixtral": dict(
        model="Mixtral 8x7B: d 4096, f 14336, E 8, top-2, softmax + renormalise, SiLU",
        d=1024, f=512, E=8, top_k=2, kw=dict(norm_topk_prob=True)),
    "qwen3-moe": dict(
        model="Qwen3-30B-A3B: d 2048, f 768, E 128, top-8, softmax + renormalise, SiLU",
        d=1024, f=128, E=64, top_k=8, kw=dict(norm_topk_prob=True)),
    "deepseek-v3": dict(
        model="DeepSeek-V3: d 7168, f 2048, E 256 in 8 groups keep 4, top-8, sigmoid + bias, x2.5, 1 shared",
        d=1024, f=128, E=64, top_k=8, shared=256, selection_bias=True,
        kw=dict(score_func="sigmoid", n_groups=8, topk_groups=4, norm_topk_prob=True,
                routed_scaling_factor=2.5)),
    "gpt-oss": dict(
        model="gpt-oss-20b: d 2880, f 2880, E 32, top-4, router bias, softmax over top-k, clipped SwiGLU, biases",
        d=1024, f=256, E=32, top_k=4, router_bias=True, biases=True,
        kw=dict(norm_topk_prob=True, activation="swiglu_oai", swiglu_limit=7.0)),
    "small-e8": dict(
        model="a small Mixtral-like layer on which the masked XLA lowering still runs",
        d=512, f=256, E=8, top_k=2, kw=dict(norm_topk_prob=True), tokens={"full": 1024, "quick": 512}),
}
TOKENS = {"full": 4096, "quick": 1024}
VARIANTS = ("raggeddot", "numpy", "torch", "jax")
TARGET_SPEEDUP = 3.0
TARGET_MEMORY = 1.5
TARGET_GATHER_FRACTION = 0.10
JAX_MAX_MASK_BYTES = 2 << 30
#: tokens of the scenario checked against the float64 reference (it loops over tokens)
REFERENCE_TOKENS = 48
#: a variant whose checking call takes longer than SLOW_S is timed over one run (median of 1),
#: one longer than SINGLE_RUN_S is not re-run at all: the checking call is its sample
SLOW_S = {"full": 3.0, "quick": 1.0}
SINGLE_RUN_S = {"full": 8.0, "quick": 2.5}


def mode_of(timing_kw: dict) -> str:
    return timing_kw.get("mode", "full")


# ----------------------------------------------------------------------------------------------
# Problems


@dataclass
class Problem:
    name: str
    T: int
    d: int
    f: int
    E: int
    top_k: int
    dtype: np.dtype
    kw: dict                 # moe_block keyword arguments except top_k (arrays included)
    x: np.ndarray
    rw: np.ndarray
    w0: np.ndarray
    w1: np.ndarray
    wo: np.ndarray
    ct: np.ndarray           # cotangent of the output
    np_fwd: Any = None       # the NumPy forward result (oracle)
    np_grads: dict | None = None
    np_res: Any = None       # routing of the NumPy forward (tok, slot, w, y) for the gathers
    torch: dict = field(default_factory=dict)

    @property
    def N(self) -> int:
        return self.T * self.top_k

    @property
    def flops_fwd(self) -> float:
        fl = 3 * 2.0 * self.N * self.d * self.f + 2.0 * self.T * self.d * self.E
        se = self.kw.get("shared_experts")
        if se is not None:
            fl += 3 * 2.0 * self.T * self.d * se[0].shape[1]
        return fl


def make_problem(name: str, mode: str, dtype: np.dtype, seed: int) -> Problem:
    s = SCENARIOS[name]
    T = s.get("tokens", TOKENS)[mode]
    d, f, E, k = s["d"], s["f"], s["E"], s["top_k"]
    rng = np.random.default_rng(seed)

    def randn(*shape, scale=1.0):
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= scale
        return a.astype(dtype, copy=False)

    x = randn(T, d)
    rw = randn(d, E, scale=1.0 / math.sqrt(d))
    w0 = randn(E, d, f, scale=1.0 / math.sqrt(d))
    w1 = randn(E, d, f, scale=1.0 / math.sqrt(d))
    wo = randn(E, f, d, scale=1.0 / math.sqrt(f))
    kw = dict(s["kw"])
    if s.get("router_bias"):
        kw["router_bias"] = randn(E, scale=0.2)
    if s.get("selection_bias"):
        kw["selection_bias"] = randn(E, scale=0.05)
    if s.get("biases"):
        kw["w0_bias"], kw["w1_bias"], kw["wo_bias"] = randn(E, f, scale=0.1), randn(E, f, scale=0.1), randn(E, d, scale=0.1)
    if s.get("shared"):
        fs = s["shared"]
        kw["shared_experts"] = (randn(d, fs, scale=1 / math.sqrt(d)), randn(d, fs, scale=1 / math.sqrt(d)),
                                randn(fs, d, scale=1 / math.sqrt(fs)))
    ct = randn(T, d)
    return Problem(name, T, d, f, E, k, np.dtype(dtype), kw, x, rw, w0, w1, wo, ct)


GRAD_NAMES = ("x", "router_weights", "w0", "w1", "wo", "router_bias", "w0_bias", "w1_bias", "wo_bias")


def flat_grads(g: dict) -> dict:
    """{name: array}; shared_experts expanded to shared_experts[i]."""
    out = {k: v for k, v in g.items() if k != "shared_experts" and v is not None}
    if g.get("shared_experts") is not None:
        for i, a in enumerate(g["shared_experts"]):
            out[f"shared_experts[{i}]"] = a
    return out


# ----------------------------------------------------------------------------------------------
# The NumPy version (baseline and oracle)


def np_gated(g, u, act, limit):
    """act(g) * u (silu) or gpt-oss's clipped swiglu, with few temporaries."""
    with np.errstate(over="ignore"):
        if act == "silu":
            a = np.negative(g)
            np.exp(a, out=a)
            a += 1
            np.divide(g, a, out=a)
            a *= u
            return a
        if act == "swiglu_oai":
            gc_ = np.minimum(g, limit)
            a = gc_ * -1.702
            np.exp(a, out=a)
            a += 1
            np.divide(gc_, a, out=a)
            uc = np.clip(u, -limit, limit)
            uc += 1
            a *= uc
            return a
    raise ValueError(f"bench numpy version: activation {act!r} not implemented")


def np_gated_grad(g, u, da, act, limit):
    with np.errstate(over="ignore"):
        if act == "silu":
            s = np.negative(g)
            np.exp(s, out=s)
            s += 1
            np.reciprocal(s, out=s)            # sigmoid(g)
            act_ = g * s
            du = da * act_
            # d silu = s * (1 + g * (1 - s))
            t = 1 - s
            t *= g
            t += 1
            t *= s
            t *= u
            t *= da
            return t, du
        if act == "swiglu_oai":
            gc_ = np.minimum(g, limit)
            uc = np.clip(u, -limit, limit)
            s = 1 / (1 + np.exp(-1.702 * gc_))
            glu = gc_ * s
            dglu = np.where(g > limit, 0, s * (1 + 1.702 * gc_ * (1 - s)))
            dg = da * dglu * (uc + 1)
            du = np.where((u > limit) | (u < -limit), 0, da * glu)
            return dg.astype(g.dtype, copy=False), du.astype(g.dtype, copy=False)
    raise ValueError(f"bench numpy version: activation {act!r} not implemented")


def np_forward(p: Problem, save: bool = False, x=None):
    """The layer in plain NumPy; (out, residuals if save)."""
    kw = p.kw
    x = p.x if x is None else x
    T, E, k = x.shape[0], p.E, p.top_k
    act, limit = kw.get("activation", "silu"), kw.get("swiglu_limit", 7.0)
    sigmoid = kw.get("score_func", "softmax") == "sigmoid"
    # routing
    logits = x @ p.rw
    if kw.get("router_bias") is not None:
        logits += kw["router_bias"]
    if sigmoid:
        with np.errstate(over="ignore"):
            scores = 1 / (1 + np.exp(-logits))
    else:
        scores = np.exp(logits - logits.max(axis=1, keepdims=True))
        scores /= scores.sum(axis=1, keepdims=True)
    sel = scores if kw.get("selection_bias") is None else scores + kw["selection_bias"]
    if kw.get("n_groups"):
        G, keep = kw["n_groups"], kw["topk_groups"]
        grouped = sel.reshape(T, G, E // G)
        gscore = np.sort(grouped, axis=2)[:, :, -2:].sum(axis=2)
        drop = np.argsort(-gscore, axis=1, kind="stable")[:, keep:]
        sel = sel.copy()
        sel.reshape(T, G, E // G)[np.arange(T)[:, None], drop] = -np.inf
    idx = np.argsort(-sel, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(scores, idx, axis=1)
    if kw.get("norm_topk_prob"):
        w /= w.sum(axis=1, keepdims=True) + (1e-20 if sigmoid else 0.0)
    w *= kw.get("routed_scaling_factor", 1.0)
    # dispatch: assignments sorted by expert, stable in token order
    flat = idx.ravel()
    order = np.argsort(flat, kind="stable")
    tok = order // k
    N = flat.size
    slot = np.empty(N, dtype=np.int64)
    slot[order] = np.arange(N)
    slot = slot.reshape(T, k)
    bounds = np.zeros(E + 1, dtype=np.int64)
    np.cumsum(np.bincount(flat, minlength=E), out=bounds[1:])
    xs = x[tok]
    # experts
    b0, b1, bo = kw.get("w0_bias"), kw.get("w1_bias"), kw.get("wo_bias")
    h0 = np.empty((N, p.f), dtype=x.dtype)
    h1 = np.empty((N, p.f), dtype=x.dtype)
    for e in range(E):
        s, t = bounds[e], bounds[e + 1]
        if t > s:
            np.matmul(xs[s:t], p.w0[e], out=h0[s:t])
            np.matmul(xs[s:t], p.w1[e], out=h1[s:t])
            if b0 is not None:
                h0[s:t] += b0[e]
                h1[s:t] += b1[e]
    a = np_gated(h0, h1, act, limit)
    y = np.empty((N, p.d), dtype=x.dtype)
    for e in range(E):
        s, t = bounds[e], bounds[e + 1]
        if t > s:
            np.matmul(a[s:t], p.wo[e], out=y[s:t])
            if bo is not None:
                y[s:t] += bo[e]
    # combine
    out = np.zeros((T, p.d), dtype=x.dtype)
    for j in range(k):
        out += w[:, j, None] * y[slot[:, j]]
    hs = None
    if kw.get("shared_experts") is not None:
        s0, s1, so = kw["shared_experts"]
        hs0, hs1 = x @ s0, x @ s1
        as_ = np_gated(hs0, hs1, act, limit)
        out += as_ @ so
        hs = (hs0, hs1, as_)
    if not save:
        return out, None
    return out, dict(scores=scores, idx=idx, w=w, order=order, tok=tok, slot=slot, bounds=bounds,
                     xs=xs, h0=h0, h1=h1, a=a, y=y, hs=hs, x=x)


def np_backward(p: Problem, r: dict, ct: np.ndarray) -> dict:
    """Gradients of sum(out * ct) with the expert choice held fixed, per-expert matmul loops."""
    kw = p.kw
    x, T, E, k = r["x"], r["x"].shape[0], p.E, p.top_k
    act, limit = kw.get("activation", "silu"), kw.get("swiglu_limit", 7.0)
    bounds, tok, slot, w = r["bounds"], r["tok"], r["slot"], r["w"]
    N = tok.size
    # combine^T
    dy = ct[tok]
    dy *= w.ravel()[r["order"]][:, None]
    dw = np.empty((T, k), dtype=x.dtype)
    for j in range(k):
        dw[:, j] = np.einsum("td,td->t", ct, r["y"][slot[:, j]])
    # down projection
    da = np.empty((N, p.f), dtype=x.dtype)
    dwo = np.zeros_like(p.wo)
    dbo = np.zeros((E, p.d), dtype=x.dtype) if kw.get("wo_bias") is not None else None
    for e in range(E):
        s, t = bounds[e], bounds[e + 1]
        if t > s:
            da[s:t] = dy[s:t] @ p.wo[e].T
            dwo[e] = r["a"][s:t].T @ dy[s:t]
            if dbo is not None:
                dy[s:t].sum(axis=0, out=dbo[e])
    dh0, dh1 = np_gated_grad(r["h0"], r["h1"], da, act, limit)
    del da
    # gate and up projections
    dxs = np.empty((N, p.d), dtype=x.dtype)
    dw0, dw1 = np.zeros_like(p.w0), np.zeros_like(p.w1)
    has_b = kw.get("w0_bias") is not None
    db0 = np.zeros((E, p.f), dtype=x.dtype) if has_b else None
    db1 = np.zeros((E, p.f), dtype=x.dtype) if has_b else None
    xs = r["xs"]
    for e in range(E):
        s, t = bounds[e], bounds[e + 1]
        if t > s:
            dxs[s:t] = dh0[s:t] @ p.w0[e].T
            dxs[s:t] += dh1[s:t] @ p.w1[e].T
            dw0[e] = xs[s:t].T @ dh0[s:t]
            dw1[e] = xs[s:t].T @ dh1[s:t]
            if has_b:
                dh0[s:t].sum(axis=0, out=db0[e])
                dh1[s:t].sum(axis=0, out=db1[e])
    # dispatch^T
    dx = np.zeros((T, p.d), dtype=x.dtype)
    for j in range(k):
        dx += dxs[slot[:, j]]
    # router
    scale = kw.get("routed_scaling_factor", 1.0)
    scores, idx = r["scores"], r["idx"]
    dwn = dw * scale
    if kw.get("norm_topk_prob"):
        chosen = np.take_along_axis(scores, idx, axis=1)
        denom = chosen.sum(axis=1, keepdims=True)
        if kw.get("score_func") == "sigmoid":
            denom += 1e-20
        dchosen = (dwn - np.sum(dwn * (chosen / denom), axis=1, keepdims=True)) / denom
    else:
        dchosen = dwn
    dscores = np.zeros_like(scores)
    np.put_along_axis(dscores, idx, dchosen, axis=1)
    if kw.get("score_func", "softmax") == "softmax":
        dlogits = scores * (dscores - np.sum(dscores * scores, axis=1, keepdims=True))
    else:
        dlogits = dscores * scores * (1 - scores)
    g = {"router_weights": x.T @ dlogits}
    dx += dlogits @ p.rw.T
    if kw.get("shared_experts") is not None:
        s0, s1, so = kw["shared_experts"]
        hs0, hs1, as_ = r["hs"]
        dso = as_.T @ ct
        dhs0, dhs1 = np_gated_grad(hs0, hs1, ct @ so.T, act, limit)
        g["shared_experts"] = (x.T @ dhs0, x.T @ dhs1, dso)
        dx += dhs0 @ s0.T
        dx += dhs1 @ s1.T
    g.update(x=dx, w0=dw0, w1=dw1, wo=dwo)
    if kw.get("router_bias") is not None:
        g["router_bias"] = dlogits.sum(axis=0)
    if has_b:
        g["w0_bias"], g["w1_bias"] = db0, db1
    if dbo is not None:
        g["wo_bias"] = dbo
    return g


def np_fwd_bwd(p: Problem):
    out, r = np_forward(p, save=True)
    return out, np_backward(p, r, p.ct)


# ----------------------------------------------------------------------------------------------
# The library and the optional baselines


def import_raggeddot():
    """raggeddot as installed; else from the repository root (an in-place build)."""
    try:
        import raggeddot

        if hasattr(raggeddot, "moe_block"):
            return raggeddot
    except ImportError:
        pass
    for key in [k for k in sys.modules if k == "raggeddot" or k.startswith("raggeddot.")]:
        del sys.modules[key]
    sys.path.insert(0, REPO_ROOT)
    try:
        import raggeddot
    except ImportError as e:
        sys.exit(f"cannot import raggeddot ({e}); build it first: pip install -e . --no-build-isolation")
    if not hasattr(raggeddot, "moe_block"):
        sys.exit("raggeddot has no moe_block: build it first: pip install -e . --no-build-isolation")
    return raggeddot


def reference_moe():
    """(moe_block of the NumPy oracle, its name) or (None, reason)."""
    for modname in ("raggeddot.reference", "raggeddot._moe_reference"):
        try:
            mod = __import__(modname, fromlist=["moe_block"])
        except ImportError:
            continue
        if hasattr(mod, "moe_block"):
            return mod.moe_block, f"{modname}.moe_block"
    return None, "no raggeddot reference moe_block"


class Skip(Exception):
    """The variant is not run for this scenario (reason in the message)."""


@dataclass
class Env:
    rd: Any
    torch: Any = None
    torch_note: str = ""
    jax: Any = None
    jnp: Any = None
    jax_note: str = ""
    jax_masked: bool | None = None
    jax_gflops: float | None = None    # measured effective rate of the masked lowering
    jax_time_limit: float = 4.0
    jax_fns: dict = field(default_factory=dict)


def setup_torch(env: Env) -> None:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - optional baseline
        env.torch_note = f"torch not importable: {type(e).__name__}"
        return
    env.torch = torch


def setup_jax(env: Env, x64: bool) -> None:
    try:
        import jax

        jax.config.update("jax_platforms", "cpu")
        if x64:
            jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
    except Exception as e:  # noqa: BLE001 - optional baseline
        env.jax_note = f"jax not importable: {type(e).__name__}"
        return
    env.jax, env.jnp = jax, jnp
    rd_jit = jax.jit(jax.lax.ragged_dot)
    try:  # does XLA:CPU materialise lhs as [m, g*k]? (m=8, g=3, k=4 -> f32[8,12])
        txt = rd_jit.lower(jnp.zeros((8, 4), jnp.float32), jnp.zeros((3, 4, 5), jnp.float32),
                           jnp.array([2, 3, 3], jnp.int32)).compile().as_text()
        env.jax_masked = "f32[8,12]" in txt
    except Exception:  # noqa: BLE001
        env.jax_masked = None
    # the effective rate of ragged_dot on this machine, counting the masked FLOPs (g x)
    m, kk, n, g = 1024, 256, 256, 8
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((m, kk), dtype=np.float32))
    b = jnp.asarray(rng.standard_normal((g, kk, n), dtype=np.float32))
    gs = jnp.full((g,), m // g, jnp.int32)
    rd_jit(a, b, gs).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(3):
        rd_jit(a, b, gs).block_until_ready()
    dt = (time.perf_counter() - t0) / 3
    mult = g if env.jax_masked else 1
    env.jax_gflops = 2.0 * m * kk * n * mult / dt / 1e9
    if env.jax_masked:
        env.jax_note = (f"XLA:CPU lowers ragged_dot to a masked dense dot ([N, E*d] @ [E*d, f]: E x the FLOPs), "
                        f"{env.jax_gflops:.1f} GFLOP/s on those")


# ---- raggeddot


def rd_kwargs(p: Problem) -> dict:
    return dict(p.kw, top_k=p.top_k)


def build_raggeddot(env: Env, p: Problem, backward: bool):
    rd, kw = env.rd, rd_kwargs(p)
    if not backward:
        return lambda: rd.moe_block(p.x, p.rw, p.w0, p.w1, p.wo, **kw)

    def fb():
        out, vjp_fn = rd.moe_block_vjp(p.x, p.rw, p.w0, p.w1, p.wo, **kw)
        return out, vjp_fn(p.ct)
    return fb


def build_numpy(env: Env, p: Problem, backward: bool):
    if not backward:
        return lambda: np_forward(p)[0]
    return lambda: np_fwd_bwd(p)


# ---- torch (HF transformers style)


def _torch_tensors(env: Env, p: Problem) -> dict:
    """Leaf tensors in nn.Linear layout ([out, in]), as HF stores the experts."""
    if p.torch:
        return p.torch
    torch = env.torch

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a))

    d = dict(x=t(p.x), rw=t(p.rw.T), w0=t(p.w0.transpose(0, 2, 1)), w1=t(p.w1.transpose(0, 2, 1)),
             wo=t(p.wo.transpose(0, 2, 1)), ct=t(p.ct))
    kw = p.kw
    for name in ("router_bias", "selection_bias", "w0_bias", "w1_bias", "wo_bias"):
        if kw.get(name) is not None:
            d[name] = t(kw[name])
    if kw.get("shared_experts") is not None:
        s0, s1, so = kw["shared_experts"]
        d["s0"], d["s1"], d["so"] = t(s0.T), t(s1.T), t(so.T)
    p.torch = d
    return d


def torch_layer(torch, p: Problem, a: dict):
    """HF's sparse MoE block: router, then a loop over the experts that received tokens."""
    F = torch.nn.functional
    kw = p.kw
    act, limit = kw.get("activation", "silu"), kw.get("swiglu_limit", 7.0)
    E, k = p.E, p.top_k
    x = a["x"]
    logits = F.linear(x, a["rw"], a.get("router_bias"))
    if kw.get("score_func", "softmax") == "sigmoid":
        scores = logits.sigmoid()
    else:
        scores = F.softmax(logits, dim=1, dtype=x.dtype)
    if kw.get("n_groups") or kw.get("selection_bias") is not None:
        # DeepseekV3TopkRouter.get_topk_indices (masking with -inf rather than 0)
        with torch.no_grad():
            choice = scores.detach() + (a["selection_bias"] if "selection_bias" in a else 0)
            if kw.get("n_groups"):
                G = kw["n_groups"]
                group_scores = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
                group_idx = torch.topk(group_scores, k=kw["topk_groups"], dim=-1, sorted=False)[1]
                group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
                score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
                choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
            selected = torch.topk(choice, k=k, dim=-1, sorted=False)[1]
    else:
        selected = torch.topk(scores.detach(), k, dim=-1)[1]
    routing_weights = scores.gather(1, selected)
    if kw.get("norm_topk_prob"):
        denom = routing_weights.sum(dim=-1, keepdim=True)
        if kw.get("score_func") == "sigmoid":
            denom = denom + 1e-20
        routing_weights = routing_weights / denom
    routing_weights = routing_weights * kw.get("routed_scaling_factor", 1.0)

    def expert_mlp(h, w0, w1, wo, b0=None, b1=None, bo=None):
        g, u = F.linear(h, w0, b0), F.linear(h, w1, b1)
        if act == "silu":
            z = F.silu(g) * u
        else:
            g = g.clamp(max=limit)
            u = u.clamp(min=-limit, max=limit)
            z = g * torch.sigmoid(g * 1.702) * (u + 1)
        return F.linear(z, wo, bo)

    final = torch.zeros_like(x)
    with torch.no_grad():
        expert_mask = F.one_hot(selected, num_classes=E).permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in expert_hit.tolist():
        e = e[0]
        idx, top_x = torch.where(expert_mask[e])
        current = x[top_x]
        y = expert_mlp(current, a["w0"][e], a["w1"][e], a["wo"][e],
                       a["w0_bias"][e] if "w0_bias" in a else None,
                       a["w1_bias"][e] if "w1_bias" in a else None,
                       a["wo_bias"][e] if "wo_bias" in a else None)
        y = y * routing_weights[top_x, idx, None]
        final.index_add_(0, top_x, y)
    if "s0" in a:
        final = final + expert_mlp(x, a["s0"], a["s1"], a["so"])
    return final


TORCH_GRAD_KEYS = [("x", "x", False), ("router_weights", "rw", True), ("w0", "w0", True), ("w1", "w1", True),
                   ("wo", "wo", True), ("router_bias", "router_bias", False), ("w0_bias", "w0_bias", False),
                   ("w1_bias", "w1_bias", False), ("wo_bias", "wo_bias", False),
                   ("shared_experts[0]", "s0", True), ("shared_experts[1]", "s1", True),
                   ("shared_experts[2]", "so", True)]


def build_torch(env: Env, p: Problem, backward: bool):
    if env.torch is None:
        raise Skip(env.torch_note or "no torch")
    torch = env.torch
    a = _torch_tensors(env, p)
    if not backward:
        def fwd():
            with torch.inference_mode():
                return torch_layer(torch, p, a).numpy()
        return fwd
    leaves = {key: a[key] for _, key, _ in TORCH_GRAD_KEYS if key in a}

    def fb():
        params = {}
        for key, t in leaves.items():
            params[key] = t.detach().requires_grad_(True)
        b = dict(a, **params)
        out = torch_layer(torch, p, b)
        out.backward(a["ct"])
        grads = {}
        for name, key, transposed in TORCH_GRAD_KEYS:
            if key in params:
                g = params[key].grad
                g = g.transpose(-1, -2) if transposed else g
                grads[name] = g.numpy()
        return out.detach().numpy(), grads
    return fb


# ---- jax


def _jax_layer(env: Env, p: Problem):
    """jax.jit-able layer(x, rw, w0, w1, wo, extras) on jax.lax.ragged_dot."""
    jax, jnp = env.jax, env.jnp
    kw = p.kw
    E, k = p.E, p.top_k
    act, limit = kw.get("activation", "silu"), kw.get("swiglu_limit", 7.0)
    sigmoid = kw.get("score_func", "softmax") == "sigmoid"

    def gated(g, u):
        if act == "silu":
            return jax.nn.silu(g) * u
        g = jnp.minimum(g, limit)
        u = jnp.clip(u, -limit, limit)
        return g * jax.nn.sigmoid(1.702 * g) * (u + 1)

    def layer(x, rw, w0, w1, wo, ex):
        T = x.shape[0]
        logits = x @ rw
        if "router_bias" in ex:
            logits = logits + ex["router_bias"]
        scores = jax.nn.sigmoid(logits) if sigmoid else jax.nn.softmax(logits, axis=-1)
        sel = jax.lax.stop_gradient(scores)
        if "selection_bias" in ex:
            sel = sel + ex["selection_bias"]
        if kw.get("n_groups"):
            G = kw["n_groups"]
            grouped = sel.reshape(T, G, E // G)
            gscore = jax.lax.top_k(grouped, 2)[0].sum(-1)
            _, keep = jax.lax.top_k(gscore, kw["topk_groups"])
            mask = jnp.zeros((T, G), bool).at[jnp.arange(T)[:, None], keep].set(True)
            sel = jnp.where(jnp.repeat(mask, E // G, axis=1), sel, -jnp.inf)
        _, idx = jax.lax.top_k(sel, k)                 # ties: lower index first
        w = jnp.take_along_axis(scores, idx, axis=1)
        if kw.get("norm_topk_prob"):
            w = w / (w.sum(-1, keepdims=True) + (1e-20 if sigmoid else 0.0))
        w = w * kw.get("routed_scaling_factor", 1.0)
        flat = idx.reshape(-1)
        order = jnp.argsort(flat, stable=True)
        tok = order // k
        gs = jnp.bincount(flat, length=E).astype(jnp.int32)
        expert = flat[order]
        xs = x[tok]
        h0 = jax.lax.ragged_dot(xs, w0, gs)
        h1 = jax.lax.ragged_dot(xs, w1, gs)
        if "w0_bias" in ex:
            h0 = h0 + ex["w0_bias"][expert]
            h1 = h1 + ex["w1_bias"][expert]
        y = jax.lax.ragged_dot(gated(h0, h1), wo, gs)
        if "wo_bias" in ex:
            y = y + ex["wo_bias"][expert]
        y = y * w.reshape(-1)[order][:, None]
        out = jnp.zeros_like(x).at[tok].add(y)
        if "shared_experts" in ex:
            s0, s1, so = ex["shared_experts"]
            out = out + gated(x @ s0, x @ s1) @ so
        return out

    return layer


def build_jax(env: Env, p: Problem, backward: bool):
    if env.jax is None:
        raise Skip(env.jax_note or "no jax")
    jax, jnp = env.jax, env.jnp
    mult = p.E if env.jax_masked else 1
    mask_bytes = p.N * p.E * max(p.d, p.f) * p.dtype.itemsize if env.jax_masked else 0
    if mask_bytes > JAX_MAX_MASK_BYTES:
        raise Skip(f"masked lowering would copy {mask_bytes / 2**30:.1f} GiB")
    est = 3 * 2.0 * p.N * p.d * p.f * mult / (env.jax_gflops * 1e9) if env.jax_gflops else 0.0
    est *= 3 if backward else 1
    if est > env.jax_time_limit:
        raise Skip(f"estimated {est:.0f} s per call (masked lowering, E={p.E} x the FLOPs) > {env.jax_time_limit:g} s")
    key = (p.name, backward)
    ex = {k_: jnp.asarray(v) for k_, v in p.kw.items()
          if k_ in ("router_bias", "selection_bias", "w0_bias", "w1_bias", "wo_bias")}
    if p.kw.get("shared_experts") is not None:
        ex["shared_experts"] = tuple(jnp.asarray(a) for a in p.kw["shared_experts"])
    args = [jnp.asarray(a) for a in (p.x, p.rw, p.w0, p.w1, p.wo)]
    layer = _jax_layer(env, p)
    if not backward:
        fn = env.jax_fns.setdefault(key, jax.jit(layer))
        return lambda: fn(*args, ex)
    ct = jnp.asarray(p.ct)

    def fb(x, rw, w0, w1, wo, ex, ct):
        out, vjp_fn = jax.vjp(lambda *a: layer(*a, ex), x, rw, w0, w1, wo)
        return out, dict(zip(("x", "router_weights", "w0", "w1", "wo"), vjp_fn(ct)))
    fn = env.jax_fns.setdefault(key, jax.jit(fb))
    return lambda: fn(*args, ex, ct)


def jax_sync(r):
    import jax

    return jax.block_until_ready(r)


BUILDERS: dict[str, Callable] = {"raggeddot": build_raggeddot, "numpy": build_numpy, "torch": build_torch, "jax": build_jax}


# ----------------------------------------------------------------------------------------------
# Measuring


def peak_extra_memory(fn: Callable[[], Any]) -> int:
    """Peak bytes traced by tracemalloc during one call (result included), above the start."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        r = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del r
    finally:
        tracemalloc.stop()
    return peak - base


def check_variant(res, p: Problem, backward: bool) -> tuple[bool, float, str]:
    """Compare a variant's result with the NumPy version's: (ok, worst error, where)."""
    if not backward:
        ok, err = C.check(np.asarray(res), p.np_fwd, p.dtype)
        return ok, err, "out"
    out, grads = res
    worst, where, ok = C.rel_err(np.asarray(out), p.np_fwd), "out", True
    ok = worst <= C.REL_TOL[p.dtype]
    want = flat_grads(p.np_grads)
    got = flat_grads({k_: np.asarray(v) if not isinstance(v, tuple) else tuple(np.asarray(a) for a in v)
                      for k_, v in grads.items()})
    for name, g in got.items():
        if name not in want:
            return False, math.inf, f"unexpected gradient {name}"
        good, err = C.check(g, want[name], p.dtype)
        if err > worst or not good:
            worst, where = max(worst, err), name
        ok = ok and good
    missing = [n for n in ("x", "router_weights", "w0", "w1", "wo") if n not in got]
    if missing:
        return False, math.inf, f"missing gradients {missing}"
    return ok, worst, where


def run_variant(env: Env, p: Problem, variant: str, backward: bool, timing_kw: dict, log) -> dict:
    rec: dict[str, Any] = {}
    try:
        fn = BUILDERS[variant](env, p, backward)
    except Skip as e:
        return {"status": "skip", "reason": str(e)}
    sync = jax_sync if variant == "jax" else None
    try:
        C.settle()
        t0 = time.perf_counter()
        res = fn()
        if sync:
            res = sync(res)
        first = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - a baseline that breaks is reported, not fatal
        log(f"  {p.name} {variant} {'fwd+bwd' if backward else 'fwd'}: {type(e).__name__}: {e}")
        return {"status": "error", "reason": f"{type(e).__name__}: {str(e)[:200]}"}
    ok, err, where = check_variant(res, p, backward)
    del res
    rec.update(rel_err=err, worst=where)
    if not ok:
        log(f"  {p.name} {variant} {'fwd+bwd' if backward else 'fwd'}: FAILED (rel err {err:.2e} in {where})")
        rec["status"] = "FAILED"
        return rec
    # the checking call was the warm-up (for jax it also compiled: its time over-estimates a run)
    kw = {k_: v for k_, v in timing_kw.items() if k_ != "mode"}
    kw.update(warmup=0, estimate_s=first)
    if first > SINGLE_RUN_S[mode_of(timing_kw)]:
        # very slow baselines: the checking call is the one sample (warm-up effects are noise here)
        t = C.Timing(times=[first], warmup_s=0.0)
        rec.update(status="ok", first_call_s=first, single_sample=True, **t.to_json())
        rec["gflops"] = C.gflops(p.flops_fwd * (3 if backward else 1), t.median_s)
        if variant in ("raggeddot", "numpy"):
            rec["peak_extra_bytes"] = peak_extra_memory(fn)
        return rec
    if first > SLOW_S[mode_of(timing_kw)] or variant == "jax":
        kw["min_runs"] = 1 if first > SLOW_S[mode_of(timing_kw)] else 2
    C.settle()
    t = C.time_fn(fn, sync=sync, **kw)
    rec.update(status="ok", first_call_s=first, **t.to_json())
    rec["gflops"] = C.gflops(p.flops_fwd * (3 if backward else 1), t.median_s)
    if variant in ("raggeddot", "numpy"):
        rec["peak_extra_bytes"] = peak_extra_memory(fn)
    return rec


def run_gathers(env: Env, p: Problem, timing_kw: dict) -> dict:
    """ragged_gather + ragged_gather_reduce on the scenario's routing."""
    rd, r = env.rd, p.np_res
    tok, slot, w, y = r["tok"], r["slot"], r["w"], r["y"]
    xs = rd.ragged_gather(p.x, tok)
    comb = rd.ragged_gather_reduce(y, slot, w)
    want_comb = np.zeros_like(p.x)
    for j in range(p.top_k):
        want_comb += w[:, j, None] * y[slot[:, j]]
    ok1, e1 = (np.array_equal(xs, p.x[tok]), 0.0)
    ok2, e2 = C.check(comb, want_comb, p.dtype)
    if not (ok1 and ok2):
        return {"status": "FAILED", "rel_err": max(e1, e2)}
    kw = {k_: v for k_, v in timing_kw.items() if k_ != "mode"}
    kw["warmup"] = 1
    C.settle()
    tg = C.time_fn(lambda: rd.ragged_gather(p.x, tok), **kw)
    C.settle()
    tr = C.time_fn(lambda: rd.ragged_gather_reduce(y, slot, w), **kw)
    return {"status": "ok", "gather": tg.to_json(), "gather_reduce": tr.to_json(),
            "total_s": tg.median_s + tr.median_s,
            "bytes": int((tok.size * p.d * 2 + p.T * p.d * (p.top_k + 1)) * p.dtype.itemsize)}


def check_numpy_against_reference(p: Problem, ref_fn) -> dict:
    """The NumPy version against the float64 reference on the first REFERENCE_TOKENS tokens."""
    if ref_fn is None:
        return {"status": "skip"}
    xs = p.x[:REFERENCE_TOKENS]
    mine = np_forward(p, x=xs)[0]
    want = ref_fn(xs, p.rw, p.w0, p.w1, p.wo, **rd_kwargs(p))
    ok, err = C.check(mine, want, p.dtype)
    return {"status": "ok" if ok else "FAILED", "rel_err": err, "tokens": int(xs.shape[0])}


def run_scenario(env: Env, p: Problem, variants: list[str], timing_kw: dict, ref_fn, log) -> dict:
    rec: dict[str, Any] = {"scenario": p.name, "dtype": p.dtype.name, "T": p.T, "d": p.d, "f": p.f, "E": p.E,
                           "top_k": p.top_k, "N": p.N, "model": SCENARIOS[p.name]["model"],
                           "options": {k_: (v if not isinstance(v, (np.ndarray, tuple)) else "array")
                                       for k_, v in p.kw.items()},
                           "flops_fwd": p.flops_fwd}
    rec["numpy_vs_reference"] = check_numpy_against_reference(p, ref_fn)
    if rec["numpy_vs_reference"]["status"] == "FAILED":
        log(f"  {p.name}: the NumPy version disagrees with the reference "
            f"(rel err {rec['numpy_vs_reference']['rel_err']:.2e}); its checks are not trustworthy")
    out, r = np_forward(p, save=True)
    p.np_fwd = out
    p.np_res = r
    p.np_grads = np_backward(p, r, p.ct)
    rec["variants"] = {}
    for backward in (False, True):
        phase = "fwd+bwd" if backward else "fwd"
        rec["variants"][phase] = {}
        for v in variants:
            rec["variants"][phase][v] = run_variant(env, p, v, backward, timing_kw, log)
    rec["gathers"] = run_gathers(env, p, timing_kw)
    return rec


# ----------------------------------------------------------------------------------------------
# Report


def med(rec: dict, phase: str, variant: str) -> float | None:
    v = rec["variants"][phase].get(variant, {})
    return v.get("median_s") if v.get("status") == "ok" else None


def cell_ms(rec, phase, variant) -> str:
    v = rec["variants"][phase].get(variant)
    if v is None:
        return "-"
    if v.get("status") != "ok":
        return {"skip": "skip", "error": "error", "FAILED": "FAILED"}.get(v.get("status"), "?")
    return C.fmt_num(v["median_s"] * 1e3, 0 if v["median_s"] > 0.1 else 1)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def results_table(results: list[dict], variants: list[str]) -> str:
    headers = ["scenario", "T", "d", "f", "E", "k"]
    for phase in ("fwd", "fwd+bwd"):
        headers += [f"{phase} {v} ms" for v in variants]
        headers += [f"{phase} np/rd"]
    headers += ["MiB rd/np fwd", "MiB rd/np f+b", "gathers % fwd"]
    rows = []
    for r in results:
        row = [r["scenario"], r["T"], r["d"], r["f"], r["E"], r["top_k"]]
        for phase in ("fwd", "fwd+bwd"):
            row += [cell_ms(r, phase, v) for v in variants]
            sp = ratio(med(r, phase, "numpy"), med(r, phase, "raggeddot"))
            row.append(f"{sp:.2f}x" if sp else "-")
        for phase in ("fwd", "fwd+bwd"):
            a = r["variants"][phase].get("raggeddot", {}).get("peak_extra_bytes")
            b = r["variants"][phase].get("numpy", {}).get("peak_extra_bytes")
            row.append(f"{a / 2**20:.0f}/{b / 2**20:.0f}" if a is not None and b is not None else "-")
        gfrac = gather_fraction(r)
        row.append(f"{100 * gfrac:.1f}" if gfrac is not None else "-")
        rows.append(row)
    return C.format_table(headers, rows)


def gather_fraction(r: dict) -> float | None:
    g = r.get("gathers", {})
    t = med(r, "fwd", "raggeddot")
    return g["total_s"] / t if g.get("status") == "ok" and t else None


def evaluate_targets(results: list[dict]) -> list[dict]:
    targets = []

    def add(name, value, ok, figure):
        targets.append({"target": name, "value": value,
                        "status": "n/a" if value is None else ("REACHED" if ok else "MISSED"), "figure": figure})

    for r in results:
        s = f"{r['scenario']} {r['dtype']}"
        for phase, label in (("fwd", "forward"), ("fwd+bwd", "forward+backward")):
            sp = ratio(med(r, phase, "numpy"), med(r, phase, "raggeddot"))
            add(f"{s}: {label} >= {TARGET_SPEEDUP:g}x numpy", sp, sp is not None and sp >= TARGET_SPEEDUP,
                f"{sp:.2f}x ({med(r, phase, 'numpy') * 1e3:.0f} ms vs {med(r, phase, 'raggeddot') * 1e3:.0f} ms)"
                if sp else "not measured")
        for phase, label in (("fwd", "forward"), ("fwd+bwd", "forward+backward")):
            a = r["variants"][phase].get("raggeddot", {}).get("peak_extra_bytes")
            b = r["variants"][phase].get("numpy", {}).get("peak_extra_bytes")
            m = a / b if a is not None and b else None
            add(f"{s}: {label} peak memory <= {TARGET_MEMORY:g}x numpy", m, m is not None and m <= TARGET_MEMORY,
                f"{m:.2f}x ({a / 2**20:.0f} MiB vs {b / 2**20:.0f} MiB)" if m is not None else "not measured")
        gf = gather_fraction(r)
        g = r.get("gathers", {})
        add(f"{s}: dispatch + combine < {100 * TARGET_GATHER_FRACTION:g}% of forward", gf,
            gf is not None and gf < TARGET_GATHER_FRACTION,
            f"{100 * gf:.1f}% ({g['gather']['median_s'] * 1e3:.1f} + {g['gather_reduce']['median_s'] * 1e3:.1f} ms "
            f"of {med(r, 'fwd', 'raggeddot') * 1e3:.0f} ms)" if gf is not None else "not measured")
    return targets


# ----------------------------------------------------------------------------------------------
# Main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="scenarios:\n" + "\n".join(f"  {k:12s} {v['model']}" for k, v in SCENARIOS.items()))
    p.add_argument("--quick", action="store_true", help=f"T = {TOKENS['quick']} tokens and shorter timing (about a minute)")
    p.add_argument("--threads", type=int, default=None, help="raggeddot threads (default: raggeddot's own default)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--scenario", nargs="+", metavar="NAME", help="scenario names or globs")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--out", default=DEFAULT_OUT, help="output directory (default benchmarks/results/)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-time", type=float, default=None, help="seconds of timed runs per variant (default 0.75, 0.15 with --quick)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    if args.list:
        for k, v in SCENARIOS.items():
            T = v.get("tokens", TOKENS)[mode]
            print(f"{k:12s} T={T:<5d} d={v['d']:<5d} f={v['f']:<4d} E={v['E']:<3d} k={v['top_k']}  {v['model']}")
        return 0
    names = C.select_scenarios(args.scenario, list(SCENARIOS), SCENARIOS)
    variants = [v for v in VARIANTS if v in args.variants]
    for must in ("raggeddot", "numpy"):
        if must not in variants:
            variants.insert(0 if must == "raggeddot" else 1, must)
    dtype = np.dtype(args.dtype)
    target = args.target_time if args.target_time is not None else (0.15 if args.quick else 0.75)
    timing_kw = {"target_s": target, "min_runs": 3, "max_runs": 30 if args.quick else 100, "warmup": 0,
                 "mode": mode}
    t_start = time.perf_counter()
    load_start = C.loadavg()
    busy = C.busy_warning()

    rd = import_raggeddot()
    if args.threads is not None:
        rd.set_num_threads(args.threads)
    ref_fn, ref_name = reference_moe()
    env = Env(rd=rd, jax_time_limit=1.5 if args.quick else 6.0)
    if "torch" in variants:
        setup_torch(env)
    if "jax" in variants:
        setup_jax(env, x64=dtype == np.float64)

    info = C.machine_info({
        "raggeddot": {"version": getattr(rd, "__version__", None), "file": getattr(rd, "__file__", None),
                      "threads": rd.get_num_threads(), "build_info": rd.build_info(), "reference": ref_name},
        "torch": ({"version": env.torch.__version__, "threads": env.torch.get_num_threads()}
                  if env.torch else {"note": env.torch_note}),
        "jax": ({"version": env.jax.__version__, "masked_lowering": env.jax_masked,
                 "masked_gflops": env.jax_gflops, "note": env.jax_note} if env.jax else {"note": env.jax_note}),
    })
    cpu, blas = info["cpu"], info["numpy_blas"]
    print(f"CPU: {cpu.get('model')} ({cpu.get('logical_cpus')} cpus, {' '.join(cpu.get('flags', []))})")
    print(f"NumPy {np.__version__}: {blas.get('name')} {blas.get('version')} threads={blas.get('num_threads')}")
    bi = rd.build_info()
    print(f"raggeddot {getattr(rd, '__version__', '')}: kernel={bi.get('kernel')} threads={rd.get_num_threads()}")
    print(f"torch: {info['torch'].get('version', '-')} threads={info['torch'].get('threads', '-')} {env.torch_note}")
    print(f"jax: {info['jax'].get('version', '-')} {env.jax_note}")
    print(f"NumPy version checked against: {ref_name}; mode {mode}; {len(names)} scenarios; {dtype.name}; seed {args.seed}")
    if busy:
        print(busy)
    sys.stdout.flush()

    results = []
    it, status, log = C.progress(names, "moe_block", enabled=not args.no_progress)
    for name in it:
        status(name)
        p = make_problem(name, mode, dtype, args.seed)
        try:
            results.append(run_scenario(env, p, variants, timing_kw, ref_fn, log))
        except MemoryError:
            log(f"  {name}: out of memory, skipped")
        finally:
            del p
            gc.collect()

    print(f"\n== moe_block {dtype.name}: median ms; np/rd = numpy time / raggeddot time; "
          f"MiB = peak extra memory (tracemalloc) raggeddot/numpy; gathers = (ragged_gather + "
          f"ragged_gather_reduce) / raggeddot forward")
    print(results_table(results, variants))
    notes = []
    for r in results:
        for phase in ("fwd", "fwd+bwd"):
            for v, vr in r["variants"][phase].items():
                if vr.get("status") in ("skip", "error", "FAILED"):
                    note = vr.get("reason") or f"rel err {vr.get('rel_err', math.nan):.2e} in {vr.get('worst')}"
                    notes.append(f"  {r['scenario']} {phase} {v}: {vr['status']}: {note}")
        nr = r["numpy_vs_reference"]
        if nr.get("status") == "FAILED":
            notes.append(f"  {r['scenario']}: numpy version vs reference FAILED (rel err {nr['rel_err']:.2e})")
    if notes:
        print("notes:")
        print("\n".join(dict.fromkeys(notes)))

    targets = evaluate_targets(results)
    print("\n== targets")
    w = max((len(t["target"]) for t in targets), default=0)
    for t in targets:
        print(f"  {t['status']:7s}  {t['target']:{w}s}  {t['figure']}")

    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "bench_moe.json")
    elapsed = time.perf_counter() - t_start
    C.write_json(json_path, {
        "benchmark": "moe_block",
        "machine": info,
        "config": {"mode": mode, "dtype": dtype.name, "scenarios": names, "variants": variants, "seed": args.seed,
                   "timing": timing_kw, "rel_tol": {k_.name: v for k_, v in C.REL_TOL.items()},
                   "jax_time_limit_s": env.jax_time_limit, "argv": sys.argv[1:] if argv is None else list(argv)},
        "scenario_defs": SCENARIOS,
        "results": results,
        "targets": targets,
        "elapsed_s": elapsed,
        "loadavg": {"start": load_start, "end": C.loadavg()},
    })
    print(f"\nwrote {json_path}")
    print(f"total {elapsed:.0f} s; load average at start {load_start}, at end {C.loadavg()}")
    failed = [r["scenario"] for r in results
              if any(r["variants"][ph].get("raggeddot", {}).get("status") == "FAILED" for ph in ("fwd", "fwd+bwd"))]
    if failed:
        print(f"raggeddot FAILED the accuracy check on: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    C.run_main(main)

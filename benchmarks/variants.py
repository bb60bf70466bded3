"""The variants each benchmark times, and the problem (inputs, FLOPs, oracle) they share.

A variant's build(env, case) returns a function that computes the case and returns its
outputs as a dict named like the oracle's (out, dense, d_lhs, d_rhs, and the MoE gradients),
or raises Skip. The runner checks every output a variant returns against the oracle, then
times the function.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import moe_baselines as MB
import raggeddot
from raggeddot import reference, specs

#: sections of each benchmark: the tables it prints
SECTIONS = {"ragged_dot": ("ragged_dot",), "backward": ("step", "tgmm"), "moe": ("fwd", "fwd+bwd")}

#: XLA's masked lowering copies an operand per group; above this the jax variant does not run
JAX_MAX_MASK_BYTES = 2 << 30
#: tokens of an MoE spec on which the NumPy version is checked against raggeddot.reference
REFERENCE_TOKENS = 48


class Skip(Exception):
    """The variant does not run on this case (the reason is the message)."""


@dataclass
class Variant:
    name: str
    section: str
    build: Callable
    refs: tuple          # oracle outputs it must return
    flops: str           # key of Case.flops its GFLOP/s uses
    threads: str | None = None   # 'rd' (raggeddot's) or 'blas' (OpenBLAS's): expected for the '*' mark
    numpy: bool = False  # timed again in a process with OPENBLAS_CORETYPE set
    jit: bool = False    # the first call compiles: always warmed up
    memory: bool = False  # peak extra memory measured (tracemalloc)
    sync: Callable | None = None


@dataclass
class Case:
    spec: specs.Spec     # resized
    dtype: np.dtype
    inputs: dict
    flops: dict
    refs: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def bounds(self):
        return specs.group_bounds(self.inputs["group_sizes"])


# ----------------------------------------------------------------------------------------------
# Optional frameworks


@dataclass
class Env:
    torch: Any = None
    torch_gmm: bool = False
    torch_note: str = ""
    jax: Any = None
    jax_masked: bool | None = None
    jax_gflops: float | None = None
    jax_note: str = ""
    jax_time_limit: float = 4.0

    def setup_torch(self) -> None:
        try:
            import torch
        except Exception as e:  # noqa: BLE001 - an optional baseline
            self.torch_note = f"torch not importable: {type(e).__name__}"
            return
        self.torch = torch
        try:  # on the CPU, with an empty group and sum < m?
            a, b = torch.randn(10, 8), torch.randn(3, 8, 4)
            o = torch._grouped_mm(a, b, offs=torch.tensor([3, 3, 7], dtype=torch.int32))
            self.torch_gmm = bool(torch.allclose(o[:3], a[:3] @ b[0], atol=1e-5)
                                  and torch.allclose(o[3:7], a[3:7] @ b[2], atol=1e-5))
            self.torch_note = "" if self.torch_gmm else "torch._grouped_mm gives wrong results on CPU"
        except Exception as e:  # noqa: BLE001
            self.torch_note = f"torch._grouped_mm fails on CPU: {type(e).__name__}: {str(e)[:120]}"

    def setup_jax(self, x64: bool) -> None:
        try:
            import jax

            jax.config.update("jax_platforms", "cpu")
            if x64:
                jax.config.update("jax_enable_x64", True)
            jnp = jax.numpy
        except Exception as e:  # noqa: BLE001 - an optional baseline
            self.jax_note = f"jax not importable: {type(e).__name__}"
            return
        self.jax = jax
        f = jax.jit(jax.lax.ragged_dot)
        try:  # does XLA:CPU materialise lhs as [m, g*k]? (m=8, g=3, k=4 -> f32[8,12])
            self.jax_masked = "f32[8,12]" in f.lower(
                jnp.zeros((8, 4), jnp.float32), jnp.zeros((3, 4, 5), jnp.float32),
                jnp.array([2, 3, 3], jnp.int32)).compile().as_text()
        except Exception:  # noqa: BLE001
            self.jax_masked = None
        # its rate on this machine, counting the FLOPs the masked lowering does (g x)
        m, k, n, g = 1024, 256, 256, 8
        rng = np.random.default_rng(0)
        a = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
        b = jnp.asarray(rng.standard_normal((g, k, n), dtype=np.float32))
        gs = jnp.full((g,), m // g, jnp.int32)
        f(a, b, gs).block_until_ready()
        t0 = time.perf_counter()
        for _ in range(3):
            f(a, b, gs).block_until_ready()
        self.jax_gflops = 2.0 * m * k * n * (g if self.jax_masked else 1) * 3 / (time.perf_counter() - t0) / 1e9
        if self.jax_masked:
            self.jax_note = (f"XLA:CPU lowers ragged_dot to a dense dot over a masked [m, g*k] copy (g x the "
                             f"FLOPs); {self.jax_gflops:.1f} GFLOP/s on those")

    def need_torch(self):
        if self.torch is None:
            raise Skip(self.torch_note or "no torch")
        return self.torch

    def need_jax(self, c: Case, backward: bool = False):
        """jax, or Skip when it is missing, cannot do the dtype, or the masked lowering would
        copy more than JAX_MAX_MASK_BYTES or take longer than jax_time_limit per call
        (estimated from the rate measured by setup_jax)."""
        if self.jax is None:
            raise Skip(self.jax_note or "no jax")
        if c.dtype == np.float64 and not self.jax.config.jax_enable_x64:
            raise Skip("float64 needs jax_enable_x64")
        mask_bytes, flops, groups = _jax_cost(c, backward)
        mult = groups if self.jax_masked else 1
        if self.jax_masked and mask_bytes > JAX_MAX_MASK_BYTES:
            raise Skip(f"the masked copy would take {mask_bytes / 2**30:.1f} GiB")
        est = flops * mult / (self.jax_gflops * 1e9) if self.jax_gflops else 0.0
        if est > self.jax_time_limit:
            raise Skip(f"masked lowering, {groups}x the FLOPs: est. {est:.1f} s per call > {self.jax_time_limit:g} s")
        return self.jax


def _jax_cost(c: Case, backward: bool) -> tuple[float, float, int]:
    """(bytes of XLA's masked copy, FLOPs of one call's products as dense dots, groups)."""
    s, item = c.spec.shape, c.dtype.itemsize
    if c.spec.op == "moe":
        N = s["T"] * s["top_k"]
        flops = 3 * 2.0 * N * s["d"] * s["f"] * (3 if backward else 1)
        return N * s["E"] * max(s["d"], s["f"]) * item, flops, s["E"]
    m, k, n, g = (s[x] for x in "mkng")
    if c.spec.op == "backward":
        return m * g * max(k, n) * item, 3 * 2.0 * m * k * n, g
    return m * g * k * item, 2.0 * m * k * n, g


def jax_sync(r):
    import jax

    return jax.block_until_ready(r)


# ----------------------------------------------------------------------------------------------
# The problem of a case: inputs, FLOPs and the oracle


def prepare(spec: specs.Spec, dtype, seed: int, needed: set, cache: dict | None = None) -> Case:
    """The case of ``spec`` (already resized): its inputs, FLOPs and the oracle outputs in
    ``needed``. ragged_dot and backward: raggeddot.reference (``dense`` = reference of
    lhs @ rhs[0]); moe: the NumPy version, itself checked against raggeddot.reference on
    the first REFERENCE_TOKENS tokens (Case.extra['numpy_vs_reference'])."""
    dtype = np.dtype(dtype)
    inputs = specs.make_inputs(spec, dtype, seed=seed, cache=cache)
    c = Case(spec, dtype, inputs, flops={})
    if spec.op == "moe":
        s = spec.shape
        fwd = 3 * 2.0 * s["T"] * s["top_k"] * s["d"] * s["f"] + 2.0 * s["T"] * s["d"] * s["E"]
        fwd += 3 * 2.0 * s["T"] * s["d"] * s.get("shared", 0)
        c.flops = {"fwd": fwd, "fwd+bwd": 3 * fwd}
        xs = inputs["x"][:REFERENCE_TOKENS]
        ok, err = specs.check(MB.np_forward(inputs, x=xs)[0],
                              reference.moe_block(xs, *(inputs[a] for a in specs.MOE_ARGS[1:]), **inputs["options"]),
                              dtype)
        c.extra["numpy_vs_reference"] = {"status": "ok" if ok else "FAILED", "rel_err": err, "tokens": len(xs)}
        out, res = MB.np_forward(inputs, save=True)
        c.refs = dict(MB.flat_grads(MB.np_backward(inputs, res, inputs["ct"])), out=out)
        c.extra["np_res"] = res
        return c
    k, n = spec.shape["k"], spec.shape["n"]
    c.flops = {"flops": 2.0 * float(inputs["group_sizes"].sum()) * k * n, "dense": 2.0 * spec.shape["m"] * k * n}
    c.flops["step"] = 3 * c.flops["flops"]
    if needed - {"dense"}:
        c.refs.update(specs.run_reference(spec, inputs))
    if "dense" in needed:
        lhs = inputs["lhs"]
        c.refs["dense"] = reference.ragged_dot(lhs, inputs["rhs"][:1], np.array([lhs.shape[0]]))
    return c


# ----------------------------------------------------------------------------------------------
# ragged_dot (and the parts the backward shares)


def _rd_forward(env, c):
    lhs, rhs, gs = c.inputs["lhs"], c.inputs["rhs"], c.inputs["group_sizes"]
    return lambda: {"out": raggeddot.ragged_dot(lhs, rhs, gs)}


def _np_dense(env, c):
    lhs, rhs0 = c.inputs["lhs"], c.inputs["rhs"][0]
    return lambda: {"dense": lhs @ rhs0}


def _np_loop(env, c):
    return specs.numpy_loop(c.spec, c.inputs)


def _torch_loop(env, c):
    torch = env.need_torch()
    lhs, rhs = torch.from_numpy(c.inputs["lhs"]), torch.from_numpy(c.inputs["rhs"])
    bounds, total, m, n = c.bounds, int(c.inputs["group_sizes"].sum()), lhs.shape[0], rhs.shape[2]

    def loop():
        out = torch.empty((m, n), dtype=lhs.dtype)
        for i, s, e in bounds:
            torch.matmul(lhs[s:e], rhs[i], out=out[s:e])
        out[total:] = 0
        return {"out": out}

    return loop


def _torch_gmm(env, c):
    torch = env.need_torch()
    if not env.torch_gmm:
        raise Skip(env.torch_note or "no torch._grouped_mm")
    if c.dtype != np.float32:
        raise Skip("torch._grouped_mm supports float32/bfloat16/float16 only")
    lhs, rhs = torch.from_numpy(c.inputs["lhs"]), torch.from_numpy(c.inputs["rhs"])
    offs = torch.from_numpy(np.cumsum(c.inputs["group_sizes"]).astype(np.int32))
    total = int(c.inputs["group_sizes"].sum())

    def gmm():
        out = torch._grouped_mm(lhs, rhs, offs=offs)
        out[total:] = 0  # torch leaves the rows past sum(group_sizes) uninitialised
        return {"out": out}

    return gmm


def _jax_ragged_dot(env, c):
    jax = env.need_jax(c)
    f = jax.jit(jax.lax.ragged_dot)
    lhs, rhs, gs = (jax.numpy.asarray(c.inputs[x]) for x in ("lhs", "rhs", "group_sizes"))
    return lambda: {"out": f(lhs, rhs, gs)}


# ----------------------------------------------------------------------------------------------
# backward: the step and tgmm


def _rd_step(env, c):
    return lambda: specs.run_raggeddot(c.spec, c.inputs)


def _torch_step(env, c):
    torch = env.need_torch()
    lhs = torch.from_numpy(c.inputs["lhs"]).requires_grad_(True)  # shares memory, never written
    rhs = torch.from_numpy(c.inputs["rhs"]).requires_grad_(True)
    ct = torch.from_numpy(c.inputs["ct"])
    gs, m = c.inputs["group_sizes"], lhs.shape[0]
    sizes = [int(s) for s in gs] + [m - int(gs.sum())]  # the tail rows belong to no group
    tail = torch.zeros((sizes[-1], ct.shape[1]), dtype=ct.dtype)
    groups = [i for i, _, _ in c.bounds]

    def step():
        rows, ws = torch.split(lhs, sizes), torch.unbind(rhs)
        out = torch.cat([torch.matmul(rows[i], ws[i]) for i in groups] + [tail])
        d_lhs, d_rhs = torch.autograd.grad(out, (lhs, rhs), ct)
        return {"out": out.detach(), "d_lhs": d_lhs, "d_rhs": d_rhs}

    return step


def _jax_step(env, c):
    jax = env.need_jax(c)
    jnp = jax.numpy

    def step(lhs, rhs, gs, ct):
        out, vjp_fn = jax.vjp(lambda a, b: jax.lax.ragged_dot(a, b, gs), lhs, rhs)
        d_lhs, d_rhs = vjp_fn(ct)
        return {"out": out, "d_lhs": d_lhs, "d_rhs": d_rhs}

    f = jax.jit(step)
    args = [jnp.asarray(c.inputs[x]) for x in ("lhs", "rhs", "group_sizes", "ct")]
    return lambda: f(*args)


def _tgmm(env, c):
    lhs_t, ct, gs = c.inputs["lhs"].T, c.inputs["ct"], c.inputs["group_sizes"]
    return lambda: {"d_rhs": raggeddot.tgmm(lhs_t, ct, gs)}


def _tgmm_fresh(env, c):
    lhs_t, ct, gs = c.inputs["lhs"].T, c.inputs["ct"], c.inputs["group_sizes"]

    def call():
        limit = raggeddot.set_buffer_cache(0)  # also releases the block of the previous call
        try:
            return {"d_rhs": raggeddot.tgmm(lhs_t, ct, gs)}
        finally:
            raggeddot.set_buffer_cache(limit)

    return call


def _np_tgmm(env, c):
    lhs, ct, bounds = c.inputs["lhs"], c.inputs["ct"], c.bounds
    (g, k, n), dt = c.inputs["rhs"].shape, c.dtype
    empty = np.flatnonzero(c.inputs["group_sizes"] == 0)

    def loop():
        d_rhs = np.empty((g, k, n), dtype=dt)
        for i, s, e in bounds:
            np.matmul(lhs[s:e].T, ct[s:e], out=d_rhs[i])
        d_rhs[empty] = 0
        return {"d_rhs": d_rhs}

    return loop


# ----------------------------------------------------------------------------------------------
# moe


def _moe(kind: str, backward: bool):
    def build(env, c):
        inputs = c.inputs
        if kind == "numpy":
            if c.extra["numpy_vs_reference"]["status"] != "ok":
                raise Skip(f"the NumPy version disagrees with raggeddot.reference ({REFERENCE_TOKENS} tokens)")
            return MB.numpy_fn(inputs, backward)
        if kind == "torch":
            return MB.torch_fn(env.need_torch(), inputs, backward)
        if kind in MB.HF_IMPLEMENTATIONS:
            torch = env.need_torch()
            if kind == "grouped_mm" and (not env.torch_gmm or c.dtype != np.float32):
                raise Skip(env.torch_note or "torch._grouped_mm takes float32/bfloat16/float16 only")
            try:
                import transformers  # noqa: F401
            except Exception as e:  # noqa: BLE001 - an optional baseline
                raise Skip(f"transformers not importable: {type(e).__name__}") from None
            try:
                return MB.hf_fn(torch, inputs, backward, kind)
            except MB.HFUnsupported as e:
                raise Skip(str(e)) from None
        if kind == "jax":
            return MB.jax_fn(env.need_jax(c, backward), inputs, backward)
        args, kw = [inputs[a] for a in specs.MOE_ARGS], inputs["options"]
        if not backward:
            return lambda: {"out": raggeddot.moe_block(*args, **kw)}

        def fwd_bwd():
            out, vjp_fn = raggeddot.moe_block_vjp(*args, **kw)
            return dict(MB.flat_grads(vjp_fn(inputs["ct"])), out=out)

        return fwd_bwd

    return build


def _moe_variants(phase: str, backward: bool) -> list[Variant]:
    refs = ("out",) + (MB.MAIN_GRADS if backward else ())
    return [Variant("raggeddot", phase, _moe("raggeddot", backward), refs, phase, memory=True),
            Variant("numpy", phase, _moe("numpy", backward), refs, phase, numpy=True, memory=True),
            Variant("torch", phase, _moe("torch", backward), refs, phase),
            Variant("hf-eager", phase, _moe("eager", backward), refs, phase),
            Variant("hf-gmm", phase, _moe("grouped_mm", backward), refs, phase),
            Variant("jax", phase, _moe("jax", backward), refs, phase, jit=True, sync=jax_sync)]


VARIANTS: dict[str, list[Variant]] = {
    "ragged_dot": [
        Variant("raggeddot", "ragged_dot", _rd_forward, ("out",), "flops", threads="rd"),
        Variant("np-dense", "ragged_dot", _np_dense, ("dense",), "dense", threads="blas", numpy=True),
        Variant("np-loop", "ragged_dot", _np_loop, ("out",), "flops", numpy=True),
        Variant("torch-loop", "ragged_dot", _torch_loop, ("out",), "flops"),
        Variant("torch-gmm", "ragged_dot", _torch_gmm, ("out",), "flops"),
        Variant("jax", "ragged_dot", _jax_ragged_dot, ("out",), "flops", jit=True, sync=jax_sync),
    ],
    "backward": [
        Variant("raggeddot", "step", _rd_step, ("out", "d_lhs", "d_rhs"), "step", threads="rd"),
        Variant("np-loop", "step", _np_loop, ("out", "d_lhs", "d_rhs"), "step", numpy=True),
        Variant("torch-loop", "step", _torch_step, ("out", "d_lhs", "d_rhs"), "step"),
        Variant("jax", "step", _jax_step, ("out", "d_lhs", "d_rhs"), "step", jit=True, sync=jax_sync),
        Variant("tgmm", "tgmm", _tgmm, ("d_rhs",), "flops", threads="rd"),
        Variant("tgmm-fresh", "tgmm", _tgmm_fresh, ("d_rhs",), "flops", threads="rd"),
        Variant("forward", "tgmm", _rd_forward, ("out",), "flops", threads="rd"),
        Variant("np-loop", "tgmm", _np_tgmm, ("d_rhs",), "flops", numpy=True),
        Variant("np-dense", "tgmm", _np_dense, ("dense",), "dense", threads="blas", numpy=True),
    ],
    "moe": _moe_variants("fwd", False) + _moe_variants("fwd+bwd", True),
}


def run_gathers(c: Case, timer) -> dict:
    """ragged_gather (x -> [N, d]) and ragged_gather_reduce ([N, d] -> [T, d], weighted) on
    the routing of the NumPy forward, checked, then timed with timer(fn) -> timing dict."""
    r, x, k = c.extra["np_res"], c.inputs["x"], c.spec.shape["top_k"]
    tok, slot, w, y = r["tok"], r["slot"], r["w"], r["y"]
    want = np.zeros_like(x)
    for j in range(k):
        want += w[:, j, None] * y[slot[:, j]]
    ok, err = specs.check(raggeddot.ragged_gather_reduce(y, slot, w), want, c.dtype)
    if not (ok and np.array_equal(raggeddot.ragged_gather(x, tok), x[tok])):
        return {"status": "FAILED", "rel_err": err}
    tg = timer(lambda: raggeddot.ragged_gather(x, tok))
    tr = timer(lambda: raggeddot.ragged_gather_reduce(y, slot, w))
    return {"status": "ok", "gather": tg, "gather_reduce": tr, "total_s": tg["median_s"] + tr["median_s"],
            "bytes": int((tok.size * x.shape[1] * 2 + x.shape[0] * x.shape[1] * (k + 1)) * c.dtype.itemsize)}

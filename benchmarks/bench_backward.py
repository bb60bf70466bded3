#!/usr/bin/env python
"""Benchmark the forward + backward step of raggeddot.ragged_dot, and tgmm's throughput.

    python benchmarks/bench_backward.py [--quick] [--threads N] [--dtype float32|float64 ...]
                                        [--scenario NAME_OR_GLOB ...] [--out DIR] [--list]
                                        [--kernel avx2|avx512|ref] [--seed S] [--target-time S]
                                        [--jax-time-limit S] [--no-progress]

ragged_dot(lhs [m,k], rhs [g,k,n], group_sizes [g]) -> out [m,n]. With a cotangent ct [m,n], the
backward is two more grouped matmuls: d_lhs[rows_i] = ct[rows_i] @ rhs[i].T (rows past
sum(group_sizes) get 0) and d_rhs[i] = lhs[rows_i].T @ ct[rows_i] (an empty group gets 0), the
second being tgmm(lhs.T, ct, group_sizes).

Scenarios are the MoE scenarios of bench_ragged_dot.py (Mixtral-, Qwen3-MoE- and DeepSeek-V3-like
(k, n), m in {4096, 16384}, g from 8 to 256, balanced / skewed / empty / partial group sizes);
--quick runs a subset in < 60 s. Every variant is first checked against a float64 NumPy per-group
loop (each output: max |out - ref| / max |ref| <= 1e-4 float32, 1e-10 float64; a variant that
fails is reported FAILED and not timed), then timed: the median of an adaptive number of runs
(>= 3, about 0.75 s per variant; 0.2 s with --quick) after a warm-up (with --quick the checking
call is the warm-up, except for jax whose first call compiles).

Section "step": forward + backward, FLOPs = 3 x 2*sum(group_sizes)*k*n
  raggeddot    out, vjp_fn = raggeddot.vjp(raggeddot.ragged_dot, lhs, rhs, gs);
               d_lhs, d_rhs, _ = vjp_fn(ct)
  np-loop      NumPy per group: a forward loop (np.matmul(lhs[s:e], rhs[i], out=out[s:e])), then a
               backward loop (ct[s:e] @ rhs[i].T, lhs[s:e].T @ ct[s:e]); tail rows and empty
               groups zeroed.
  torch-loop   torch CPU, the per-group loop with autograd: torch.split(lhs, group sizes + tail),
               torch.unbind(rhs), one torch.matmul per non-empty group, torch.cat, then
               torch.autograd.grad(out, (lhs, rhs), ct) (when torch imports).
  jax          jax.jit of jax.vjp(jax.lax.ragged_dot) (forward, then d_lhs and d_rhs) on CPU,
               block_until_ready. XLA:CPU lowers each of the three products to a dense dot over
               a masked copy ([m, g*k] / [m, g*n] / [g, m, k]): g times the FLOPs. The rule of
               bench_ragged_dot.py applies to a call of the step: a shape whose masked copy
               exceeds 2 GiB, or whose call is estimated (3 x g x the dense-NumPy time of the
               same m, k, n) to take longer than --jax-time-limit (4 s; 1 s with --quick), is
               reported "skip".

Section "tgmm": the weight gradient alone, FLOPs = 2*sum(group_sizes)*k*n
  tgmm         raggeddot.tgmm(lhs.T, ct, gs) -> [g, k, n] (lhs.T read through strides), as a
               loop calls it: the result of one call is dropped before the next, so its block
               comes back from raggeddot's cache of result buffers with its pages mapped
  tgmm-fresh   the same with that cache off (raggeddot.set_buffer_cache(0) around the call):
               every call gets new memory and pays the OS's zeroing of each page on first
               touch, as the NumPy loop does
  forward      raggeddot.ragged_dot(lhs, rhs, gs) on the same (m, k, n, g): same FLOPs
  np-loop      NumPy per group: np.matmul(lhs[s:e].T, ct[s:e], out=d_rhs[i]), empty groups zeroed
  np-dense     lhs @ rhs[0] on the same (m, k, n): the dense roofline, own FLOPs 2*m*k*n; its
               GFLOP/s also sets jax's time estimate.

NumPy (OpenBLAS), torch and XLA keep their default thread counts (recorded in the JSON);
--threads sets raggeddot's. The machine has 2 cores: a raggeddot (or large np-dense) figure
timed with < 75% of its threads' CPU time, or with > 5% of the CPU time stolen by the
hypervisor, is marked '*' (rule of bench_ragged_dot.py). Outputs: tables on stdout,
<out>/bench_backward.json, then a "targets" section: REACHED / MISSED with the measured figure
for tgmm >= 0.8x the forward's GFLOP/s and tgmm >= 2x the NumPy loop at 64+ groups (float32),
the same two ratios for tgmm-fresh, and the step's ratios to the NumPy loop, torch and jax
(reported, no bound).
"""

from __future__ import annotations

import gc
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import bench_ragged_dot as F  # noqa: E402  (scenario table, case builder, jax setup of the forward benchmark)

# ----------------------------------------------------------------------------------------------
# Scenarios: the MoE scenarios of the forward benchmark, name -> (m, k, n, g, group-size pattern)

SCENARIOS: dict[str, tuple[int, int, int, int, str]] = {
    name: spec for name, spec in F.SCENARIOS.items() if F.category(name, spec[3]) == "moe"
}

QUICK_SCENARIOS = [
    "mixtral-m4096-g8-balanced",  # few large groups
    "qwen3-m4096-g64-skewed",
    "deepseek-m4096-g256-balanced",  # many small groups
]

STEP_COLS = ["raggeddot", "np-loop", "torch-loop", "jax"]
TGMM_COLS = ["tgmm", "tgmm-fresh", "forward", "np-loop", "np-dense"]

#: jax's time limit per call of the jitted step (s), as bench_ragged_dot.py's per call
JAX_TIME_LIMIT = {"full": 4.0, "quick": 1.0}

TARGET_TGMM_VS_FORWARD = 0.8
TARGET_TGMM_VS_LOOP = 2.0
TARGET_TGMM_VS_LOOP_MIN_GROUPS = 64

OUTPUTS_STEP = ("out", "d_lhs", "d_rhs")


# ----------------------------------------------------------------------------------------------
# Environment: raggeddot, torch and jax


@dataclass
class Env:
    rd: Any
    fwd: F.Env  # jax module, whether XLA:CPU masks ragged_dot (set up by bench_ragged_dot)
    torch: Any = None
    torch_note: str = ""
    jax_step: Any = None  # jax.jit of the forward + vjp step


def setup_torch(env: Env) -> None:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - optional baseline
        env.torch_note = f"torch not importable: {type(e).__name__}"
        return
    env.torch = torch


def setup_jax(env: Env, want_x64: bool) -> None:
    F.setup_jax(env.fwd, want_x64)
    jax = env.fwd.jax
    if jax is None:
        return

    def step(lhs, rhs, gs, ct):
        out, vjp_fn = jax.vjp(lambda a, b: jax.lax.ragged_dot(a, b, gs), lhs, rhs)
        d_lhs, d_rhs = vjp_fn(ct)
        return out, d_lhs, d_rhs

    env.jax_step = jax.jit(step)


# ----------------------------------------------------------------------------------------------
# Data and the float64 oracle


def make_problem(name: str, dtype: np.dtype, seed: int) -> tuple[F.Case, np.ndarray]:
    """The forward benchmark's case (lhs, rhs, group sizes, bounds) and a cotangent ct [m, n]."""
    c = F.make_case(name, dtype, seed)
    ct = F.cached_array(("ct", c.m, c.n, dtype.str, seed),
                        lambda: np.random.default_rng([seed, 3, c.m, c.n]).standard_normal((c.m, c.n), dtype=dtype))
    return c, ct


def oracle(c: F.Case, ct: np.ndarray) -> dict[str, np.ndarray]:
    """float64 NumPy per-group loop: out, d_lhs, d_rhs of the step and the dense lhs @ rhs[0]
    (tail rows and empty groups stay zero)."""
    lhs, ct64 = c.lhs.astype(np.float64), ct.astype(np.float64)
    out = np.zeros((c.m, c.n))
    d_lhs = np.zeros((c.m, c.k))
    d_rhs = np.zeros((c.g, c.k, c.n))
    for i, s, e in c.bounds:
        w = c.rhs[i].astype(np.float64)  # one group at a time: no float64 copy of all of rhs
        out[s:e] = lhs[s:e] @ w
        d_lhs[s:e] = ct64[s:e] @ w.T
        d_rhs[i] = lhs[s:e].T @ ct64[s:e]
    return {"out": out, "d_lhs": d_lhs, "d_rhs": d_rhs, "dense": lhs @ c.rhs[0].astype(np.float64)}


# ----------------------------------------------------------------------------------------------
# Variants: each builder returns (fn, sync) or raises F.Skip; fn() returns a tuple of outputs in
# the order of the section's oracle arrays.


def build_rd_step(env: Env, c: F.Case, ct: np.ndarray):
    rd, lhs, rhs, gs = env.rd, c.lhs, c.rhs, c.gs

    def step():
        out, vjp_fn = rd.vjp(rd.ragged_dot, lhs, rhs, gs)
        d_lhs, d_rhs, _ = vjp_fn(ct)
        return out, d_lhs, d_rhs

    return step, None


def _np_backward_rhs(lhs, ct, bounds, empty, g, k, n, dt) -> np.ndarray:
    d_rhs = np.empty((g, k, n), dtype=dt)
    for i, s, e in bounds:
        np.matmul(lhs[s:e].T, ct[s:e], out=d_rhs[i])
    d_rhs[empty] = 0
    return d_rhs


def build_np_step(env: Env, c: F.Case, ct: np.ndarray):
    lhs, rhs, bounds, total, m, k, n, g, dt = c.lhs, c.rhs, c.bounds, c.total, c.m, c.k, c.n, c.g, c.dtype
    empty = np.flatnonzero(c.gs == 0)

    def step():
        out = np.empty((m, n), dtype=dt)
        for i, s, e in bounds:
            np.matmul(lhs[s:e], rhs[i], out=out[s:e])
        out[total:] = 0
        d_lhs = np.empty((m, k), dtype=dt)
        for i, s, e in bounds:
            np.matmul(ct[s:e], rhs[i].T, out=d_lhs[s:e])
        d_lhs[total:] = 0
        d_rhs = _np_backward_rhs(lhs, ct, bounds, empty, g, k, n, dt)
        return out, d_lhs, d_rhs

    return step, None


def build_torch_step(env: Env, c: F.Case, ct: np.ndarray):
    if env.torch is None:
        raise F.Skip(env.torch_note or "no torch")
    torch = env.torch
    lhs_t = torch.from_numpy(c.lhs).requires_grad_(True)  # shares memory, never written
    rhs_t = torch.from_numpy(c.rhs).requires_grad_(True)
    ct_t = torch.from_numpy(ct)
    sizes = [int(s) for s in c.gs] + [c.m - c.total]  # + the tail rows, no group
    tail = torch.zeros((c.m - c.total, c.n), dtype=ct_t.dtype)
    groups = [i for i, _, _ in c.bounds]

    def step():
        rows = torch.split(lhs_t, sizes)
        ws = torch.unbind(rhs_t)
        out = torch.cat([torch.matmul(rows[i], ws[i]) for i in groups] + [tail])
        d_lhs, d_rhs = torch.autograd.grad(out, (lhs_t, rhs_t), ct_t)
        return out.detach(), d_lhs, d_rhs

    return step, None


def jax_feasibility(env: Env, c: F.Case, dense_gflops: float | None, time_limit: float) -> None:
    """bench_ragged_dot.py's rule for one call of the jitted step: raise F.Skip when XLA:CPU's
    masked copy would exceed F.JAX_MAX_MASK_BYTES or the call's estimated time (3 products, each
    g x the dense-NumPy time of the same m, k, n) exceeds time_limit."""
    fe = env.fwd
    if fe.jax is None or env.jax_step is None:
        raise F.Skip(fe.jax_note or "no jax")
    if c.dtype == np.float64 and not fe.jax.config.jax_enable_x64:
        raise F.Skip("float64 needs jax_enable_x64")
    if fe.jax_masked:
        mask_bytes = c.m * c.g * max(c.k, c.n) * c.dtype.itemsize
        if mask_bytes > F.JAX_MAX_MASK_BYTES:
            raise F.Skip(f"masked copy [m, g*max(k, n)] would take {mask_bytes / 2**30:.1f} GiB")
        if dense_gflops:
            est = 3 * c.g * c.dense_flops / (dense_gflops * 1e9)
            if est > time_limit:
                raise F.Skip(f"masked dense dots do g={c.g}x the FLOPs: est. {est:.1f} s per call (3 products)")


def build_jax_step(env: Env, c: F.Case, ct: np.ndarray, dense_gflops: float | None, time_limit: float):
    jax_feasibility(env, c, dense_gflops, time_limit)
    jax, f = env.fwd.jax, env.jax_step
    jnp = jax.numpy
    lhs, rhs, gs, ctj = jnp.asarray(c.lhs), jnp.asarray(c.rhs), jnp.asarray(c.gs), jnp.asarray(ct)
    return (lambda: f(lhs, rhs, gs, ctj)), jax.block_until_ready


def build_tgmm(env: Env, c: F.Case, ct: np.ndarray):
    rd, lhs_t, gs = env.rd, c.lhs.T, c.gs
    return (lambda: rd.tgmm(lhs_t, ct, gs)), None


def build_tgmm_fresh(env: Env, c: F.Case, ct: np.ndarray):
    rd, lhs_t, gs = env.rd, c.lhs.T, c.gs

    def call():
        limit = rd.set_buffer_cache(0)  # also releases the block of the previous call
        try:
            return rd.tgmm(lhs_t, ct, gs)
        finally:
            rd.set_buffer_cache(limit)

    return call, None


def build_forward(env: Env, c: F.Case, ct: np.ndarray):
    rd, lhs, rhs, gs = env.rd, c.lhs, c.rhs, c.gs
    return (lambda: rd.ragged_dot(lhs, rhs, gs)), None


def build_np_tgmm(env: Env, c: F.Case, ct: np.ndarray):
    lhs, bounds, g, k, n, dt = c.lhs, c.bounds, c.g, c.k, c.n, c.dtype
    empty = np.flatnonzero(c.gs == 0)
    return (lambda: _np_backward_rhs(lhs, ct, bounds, empty, g, k, n, dt)), None


def build_np_dense(env: Env, c: F.Case, ct: np.ndarray):
    lhs, rhs0 = c.lhs, c.rhs[0]
    return (lambda: lhs @ rhs0), None


# ----------------------------------------------------------------------------------------------
# Running a variant and a scenario

#: elements per block of check(): 8 MiB float64 temporaries
CHECK_BLOCK = 1 << 20


def check(out: Any, ref: np.ndarray, dtype: np.dtype) -> tuple[bool, float]:
    """C.check's test and error (max |out - ref| / max |ref| <= C.REL_TOL[dtype], with
    C.rel_err's conventions), over blocks of the leading axis: C.check's full-size float64
    temporaries take ~4 s per check of a [256, 1792, 512] d_rhs."""
    out = np.asarray(out)
    if out.shape != ref.shape or out.ndim == 0 or out.size <= CHECK_BLOCK:
        return C.check(out, ref, dtype)
    rows = max(1, CHECK_BLOCK // (out.size // out.shape[0]))
    worst = scale = 0.0
    for s in range(0, out.shape[0], rows):
        r = ref[s:s + rows]
        d = float(np.abs(out[s:s + rows].astype(np.float64) - r).max())
        if not math.isfinite(d):
            return False, math.inf
        worst = max(worst, d)
        scale = max(scale, float(np.abs(r).max()))
    err = worst / scale if scale > 0 else worst
    return err <= C.REL_TOL[np.dtype(dtype)], err



def run_variant(fn, sync, refs: dict[str, np.ndarray], dtype: np.dtype, flops: float, timing_kw: dict,
                jit: bool = False) -> dict:
    """Check every output of fn() against its float64 ref, then time fn(). The variant's JSON
    record: rel_err (worst output) and rel_errs per output, then the timing, or FAILED + reason.

    With timing_kw["warmup"] == 0 (--quick) the checking call is the warm-up and its time sets
    the run count, except for a jit-compiled variant (its first call compiles)."""
    rec: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        res = fn()
        if sync is not None:
            sync(res)
        t_check = time.perf_counter() - t0
        outs = res if isinstance(res, tuple) else (res,)
        if len(outs) != len(refs):
            raise ValueError(f"{len(outs)} outputs, expected {len(refs)}")
        errs, bad = {}, []
        for (name, ref), o in zip(refs.items(), outs):
            o = np.asarray(o)
            ok, errs[name] = check(o, ref, dtype)
            if o.dtype != dtype:
                bad.append(f"{name} dtype {o.dtype}, expected {dtype}")
            elif not ok:
                bad.append(f"{name} rel err {errs[name]:.3g} > {C.REL_TOL[dtype]:g}")
        rec["rel_err"] = max(errs.values())
        rec["rel_errs"] = errs
        del res, outs, o
    except Exception as e:  # noqa: BLE001 - reported, not raised
        rec.update(status="FAILED", reason=f"{type(e).__name__}: {str(e)[:200]}")
        return rec
    if bad:
        rec.update(status="FAILED", reason="; ".join(bad))
        return rec
    kw = dict(timing_kw)
    if jit:
        kw["warmup"] = max(1, kw.get("warmup", 1))
    elif kw.get("warmup", 1) <= 0:
        kw["estimate_s"] = t_check
    C.settle()
    tm = C.time_fn(fn, sync=sync, **kw)
    rec.update(status="ok", gflops=C.gflops(flops, tm.median_s), flops=flops, **tm.to_json())
    return rec


def gf(rec: dict, section: str, v: str) -> float | None:
    r = rec[section].get(v, {})
    return r.get("gflops") if r.get("status") == "ok" else None


def med_s(rec: dict, section: str, v: str) -> float | None:
    r = rec[section].get(v, {})
    return r.get("median_s") if r.get("status") == "ok" else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def run_scenario(env: Env, c: F.Case, ct: np.ndarray, timing_kw: dict, jax_time_limit: float, log) -> dict:
    step_flops = 3.0 * c.flops
    rec: dict[str, Any] = {
        "scenario": c.name, "dtype": c.dtype.name, "m": c.m, "k": c.k, "n": c.n, "g": c.g, "pattern": c.pattern,
        "group_sizes": c.gs.tolist(), "rows": c.total, "empty_groups": int((c.gs == 0).sum()),
        "max_group": int(c.gs.max()), "flops": c.flops, "step_flops": step_flops, "dense_flops": c.dense_flops,
        "tgmm": {}, "step": {},
    }
    t0 = time.perf_counter()
    ref = oracle(c, ct)
    rec["oracle_s"] = time.perf_counter() - t0

    def run(section, v, build, refs, flops, jit=False):
        try:
            fn, sync = build()
        except F.Skip as s:
            rec[section][v] = {"status": "skip", "reason": str(s)}
            return
        vr = run_variant(fn, sync, refs, c.dtype, flops, timing_kw, jit=jit)
        if vr["status"] == "FAILED":
            log(f"  {c.name} [{c.dtype.name}] {section} {v}: FAILED ({vr.get('reason')})")
        rec[section][v] = vr

    # tgmm first: np-dense's GFLOP/s sets jax's time estimate
    d_rhs_ref, out_ref = {"d_rhs": ref["d_rhs"]}, {"out": ref["out"]}
    run("tgmm", "np-dense", lambda: build_np_dense(env, c, ct), {"dense": ref["dense"]}, c.dense_flops)
    run("tgmm", "tgmm", lambda: build_tgmm(env, c, ct), d_rhs_ref, c.flops)
    run("tgmm", "tgmm-fresh", lambda: build_tgmm_fresh(env, c, ct), d_rhs_ref, c.flops)
    run("tgmm", "forward", lambda: build_forward(env, c, ct), out_ref, c.flops)
    run("tgmm", "np-loop", lambda: build_np_tgmm(env, c, ct), d_rhs_ref, c.flops)

    step_refs = {k: ref[k] for k in OUTPUTS_STEP}
    dense = gf(rec, "tgmm", "np-dense")
    run("step", "raggeddot", lambda: build_rd_step(env, c, ct), step_refs, step_flops)
    run("step", "np-loop", lambda: build_np_step(env, c, ct), step_refs, step_flops)
    run("step", "torch-loop", lambda: build_torch_step(env, c, ct), step_refs, step_flops)
    run("step", "jax", lambda: build_jax_step(env, c, ct, dense, jax_time_limit), step_refs, step_flops, jit=True)
    del ref, step_refs, d_rhs_ref, out_ref
    gc.collect()

    rd_step = gf(rec, "step", "raggeddot")
    tg = gf(rec, "tgmm", "tgmm")
    rec["ratios"] = {
        "step rd/loop": ratio(rd_step, gf(rec, "step", "np-loop")),
        "step rd/torch": ratio(rd_step, gf(rec, "step", "torch-loop")),
        "step rd/jax": ratio(rd_step, gf(rec, "step", "jax")),
        "tgmm/fwd": ratio(tg, gf(rec, "tgmm", "forward")),
        "tgmm/loop": ratio(tg, gf(rec, "tgmm", "np-loop")),
        "tgmm/dense": ratio(tg, gf(rec, "tgmm", "np-dense")),
        "fresh/fwd": ratio(gf(rec, "tgmm", "tgmm-fresh"), gf(rec, "tgmm", "forward")),
        "fresh/loop": ratio(gf(rec, "tgmm", "tgmm-fresh"), gf(rec, "tgmm", "np-loop")),
    }
    # time of the step over the forward's (3 products: ~3 when the backward runs at forward speed)
    rec["step_over_forward_time"] = ratio(med_s(rec, "step", "raggeddot"), med_s(rec, "tgmm", "forward"))
    return rec


def mark_contention(rec: dict, rd_threads: int | None, blas_threads: int | None) -> None:
    """'*' rule of bench_ragged_dot.py: raggeddot's variants (and np-dense on a product of
    >= 1 GFLOP, which OpenBLAS runs on all its threads) are expected to use every thread."""
    ncpu = os.cpu_count() or 1
    expect = {("step", "raggeddot"): rd_threads or ncpu, ("tgmm", "tgmm"): rd_threads or ncpu,
              ("tgmm", "tgmm-fresh"): rd_threads or ncpu, ("tgmm", "forward"): rd_threads or ncpu}
    if rec["dense_flops"] >= 1e9:
        expect[("tgmm", "np-dense")] = blas_threads or ncpu
    for section in ("step", "tgmm"):
        for v, vr in rec[section].items():
            if vr.get("status") == "ok":
                vr["contended"] = F.is_contended(vr, expect.get((section, v)))


# ----------------------------------------------------------------------------------------------
# Reporting


def cell(rec: dict, section: str, v: str) -> str:
    r = rec[section].get(v)
    if r is None:
        return "-"
    if r["status"] == "ok":
        return C.fmt_num(r["gflops"]) + ("*" if r.get("contended") else "")
    return r["status"]


def fmt_ratio(x: float | None) -> str:
    return C.fmt_num(x, 2) if x is not None else "-"


def step_table(rows: list[dict]) -> str:
    headers = ["scenario", "m", "k", "n", "g", "pattern", *STEP_COLS, "rd ms", "rd/loop", "rd/torch", "rd/jax", "step/fwd t"]
    out = []
    for r in rows:
        ra, ms = r["ratios"], med_s(r, "step", "raggeddot")
        out.append([r["scenario"], r["m"], r["k"], r["n"], r["g"], r["pattern"], *(cell(r, "step", v) for v in STEP_COLS),
                    C.fmt_num(ms * 1e3 if ms else None, 1),
                    *(fmt_ratio(ra[x]) for x in ("step rd/loop", "step rd/torch", "step rd/jax")),
                    fmt_ratio(r.get("step_over_forward_time"))])
    return C.format_table(headers, out, ["<", ">", ">", ">", ">", "<"] + [">"] * (len(headers) - 6))


def tgmm_table(rows: list[dict]) -> str:
    headers = ["scenario", "g", "pattern", *TGMM_COLS, "tgmm ms", "tgmm/fwd", "tgmm/loop", "tgmm/dense",
               "fresh/fwd", "fresh/loop"]
    out = []
    for r in rows:
        ra, ms = r["ratios"], med_s(r, "tgmm", "tgmm")
        out.append([r["scenario"], r["g"], r["pattern"], *(cell(r, "tgmm", v) for v in TGMM_COLS),
                    C.fmt_num(ms * 1e3 if ms else None, 1),
                    *(fmt_ratio(ra[x]) for x in ("tgmm/fwd", "tgmm/loop", "tgmm/dense", "fresh/fwd", "fresh/loop"))])
    return C.format_table(headers, out, ["<", ">", "<"] + [">"] * (len(headers) - 3))


def notes_for(rows: list[dict]) -> list[str]:
    """One line per distinct skip/failure reason, with the scenarios it applies to."""
    reasons: dict[tuple, list] = {}
    for r in rows:
        for section in ("step", "tgmm"):
            for v, vr in r[section].items():
                if vr["status"] in ("skip", "FAILED"):
                    key = (section, v, vr["status"], re.sub(r"[0-9.]+ (s|GiB)", "N \\1", vr.get("reason", "")))
                    reasons.setdefault(key, []).append(r["scenario"])
    lines = []
    for (section, v, st, why), names in reasons.items():
        where = "all" if len(names) == len(rows) else ", ".join(names) if len(names) <= 4 else f"{len(names)} scenarios"
        lines.append(f"  {section} {v} {st}: {why}  [{where}]")
    cont = [r["scenario"] for r in rows if any(vr.get("contended") for s in ("step", "tgmm") for vr in r[s].values())]
    if cont:
        lines.append(f"  * got < {F.CONTENDED_SHARE:.0%} of its threads' CPU time (other processes), or > {F.STOLEN_SHARE:.0%} "
                     f"was stolen by the hypervisor, while timed: figure unreliable  "
                     f"[{', '.join(cont) if len(cont) <= 4 else f'{len(cont)} scenarios'}]")
    return lines


def evaluate_targets(results: list[dict], rd_threads: int | None) -> list[dict]:
    """tgmm's two targets (REACHED / MISSED / n/a, float32) and the step's ratios (REPORT)."""
    f32 = [r for r in results if r["dtype"] == "float32"]
    at = "" if rd_threads == 2 else f" (measured at {rd_threads} threads; target is for 2)"
    out = []

    def spread(vals):
        v, s = min(vals)
        return (f"worst {v:.2f}x ({s}); median {float(np.median([x for x, _ in vals])):.2f}x; "
                f"best {max(vals)[0]:.2f}x over {len(vals)} scenarios"), v

    def bound(rows, key, what, limit, scope):
        if not rows:
            out.append({"target": what, "status": "n/a", "figure": f"no {scope} scenario run"})
            return
        vals = [(r["ratios"][key], r["scenario"]) for r in rows]
        missing = [s for v, s in vals if v is None]
        if missing:
            out.append({"target": what, "status": "MISSED",
                        "figure": f"no ratio for {', '.join(missing[:3])} (tgmm or baseline did not run)"})
            return
        fig, v = spread(vals)
        out.append({"target": what, "status": "REACHED" if v >= limit else "MISSED", "figure": fig + at, "value": v})

    def report(key, what, why_none, rows=None):
        vals = [(r["ratios"][key], r["scenario"]) for r in (f32 if rows is None else rows)
                if r["ratios"][key] is not None]
        if not vals:
            out.append({"target": what, "status": "n/a", "figure": why_none if f32 else "no float32 scenario run"})
            return
        fig, v = spread(vals)
        out.append({"target": what, "status": "REPORT", "figure": fig + at, "value": v})

    bound(f32, "tgmm/fwd", f"float32 tgmm >= {TARGET_TGMM_VS_FORWARD}x forward ragged_dot GFLOP/s",
          TARGET_TGMM_VS_FORWARD, "float32")
    bound([r for r in f32 if r["g"] >= TARGET_TGMM_VS_LOOP_MIN_GROUPS], "tgmm/loop",
          f"float32 tgmm, {TARGET_TGMM_VS_LOOP_MIN_GROUPS}+ groups >= {TARGET_TGMM_VS_LOOP}x NumPy loop",
          TARGET_TGMM_VS_LOOP, f"float32 {TARGET_TGMM_VS_LOOP_MIN_GROUPS}+ group")
    report("fresh/fwd", "float32 tgmm-fresh (no buffer reuse) / forward", "tgmm-fresh or the forward did not run")
    big = [r for r in f32 if r["g"] >= TARGET_TGMM_VS_LOOP_MIN_GROUPS]
    report("fresh/loop", f"float32 tgmm-fresh, {TARGET_TGMM_VS_LOOP_MIN_GROUPS}+ groups / NumPy loop",
           "tgmm-fresh or the NumPy loop did not run", big)
    report("step rd/loop", "float32 step: raggeddot / NumPy loop", "raggeddot or the NumPy loop did not run")
    report("step rd/torch", "float32 step: raggeddot / torch loop", "torch did not run")
    report("step rd/jax", "float32 step: raggeddot / jax", "jax skipped or did not run on every scenario")
    return out


# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = F.base_parser(__doc__, SCENARIOS, QUICK_SCENARIOS)
    p.add_argument("--jax-time-limit", type=float, default=None,
                   help="skip jax when a step call is estimated above this (s; default 4, 1 with --quick)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for k, (m, kk, n, g, pat) in SCENARIOS.items():
            print(f"{k:34s} m={m:<6d} k={kk:<5d} n={n:<5d} g={g:<4d} {pat:9s}{'  (quick)' if k in QUICK_SCENARIOS else ''}")
        return 0
    names = C.select_scenarios(args.scenario, list(SCENARIOS), QUICK_SCENARIOS if args.quick else SCENARIOS)
    dtypes = [np.dtype(d) for d in args.dtype]
    mode = "quick" if args.quick else "full"
    target = args.target_time if args.target_time is not None else (0.2 if args.quick else 0.75)
    timing_kw = {"target_s": target, "min_runs": 3, "max_runs": 50 if args.quick else 200, "warmup": 0 if args.quick else 1}
    jax_time_limit = args.jax_time_limit if args.jax_time_limit is not None else JAX_TIME_LIMIT[mode]
    t_start = time.perf_counter()
    load_start = C.loadavg()
    busy = C.busy_warning()

    rd = F.import_raggeddot()
    if not (hasattr(rd, "vjp") and hasattr(rd, "tgmm")):
        sys.exit("raggeddot has no vjp/tgmm: rebuild it (pip install -e . --no-build-isolation)")
    rd_threads = F.configure_raggeddot(rd, args.threads, args.kernel)
    kernel = F.kernel_name(rd)

    env = Env(rd=rd, fwd=F.Env(rd=rd, reference=None, reference_name="float64 NumPy loop"))
    setup_torch(env)
    setup_jax(env, want_x64=np.dtype(np.float64) in dtypes)
    fe = env.fwd

    info = C.machine_info({
        "raggeddot": {
            "version": getattr(rd, "__version__", None),
            "file": getattr(rd, "__file__", None),
            "threads": rd_threads,
            "build_info": (rd.build_info() if hasattr(rd, "build_info") else None),
            "kernel": kernel,
            "reference": "float64 NumPy per-group loop (bench_backward.oracle)",
        },
        "torch": ({"version": env.torch.__version__, "threads": env.torch.get_num_threads()}
                  if env.torch else {"note": env.torch_note}),
        "jax": ({"version": fe.jax.__version__, "devices": [str(d) for d in fe.jax.devices()],
                 "x64": bool(fe.jax.config.jax_enable_x64), "masked_lowering": fe.jax_masked, "note": fe.jax_note}
                if fe.jax else {"note": fe.jax_note}),
    })
    cpu = info["cpu"]
    blas = info["numpy_blas"]
    print(f"CPU: {cpu.get('model')} ({cpu.get('logical_cpus')} cpus, {' '.join(cpu.get('flags', []))})")
    print(f"NumPy {np.__version__}: {blas.get('name')} {blas.get('version')} core={blas.get('corename')} threads={blas.get('num_threads')}")
    print(f"raggeddot {info['raggeddot']['version'] or ''}: kernel={kernel} threads={rd_threads}")
    print(f"torch: {info['torch'].get('version', '-')} threads={info['torch'].get('threads', '-')} {env.torch_note}")
    print(f"jax: {info['jax'].get('version', '-')} {fe.jax_note}")
    print(f"oracle: float64 NumPy loop; mode {mode}; {len(names)} scenarios x {len(dtypes)} dtypes; seed {args.seed}; "
          f"jax limit {jax_time_limit:g} s per call")
    if busy:
        print(busy)
    sys.stdout.flush()

    results: list[dict] = []
    jobs = [(d, n) for d in dtypes for n in names]
    it, status, log = C.progress(jobs, "backward", enabled=not args.no_progress, label=lambda j: f"{j[1]} {j[0].name}")
    for dtype, name in it:
        status(f"{name} {dtype.name}")
        c, ct = make_problem(name, dtype, args.seed)
        try:
            rec = run_scenario(env, c, ct, timing_kw, jax_time_limit, log)
        except MemoryError:
            log(f"  {name} [{dtype.name}]: out of memory, skipped")
            continue
        finally:
            del c, ct
        mark_contention(rec, rd_threads, blas.get("num_threads"))
        results.append(rec)
    F._data_cache.clear()
    gc.collect()

    # ---- report
    for d in dtypes:
        rows = [r for r in results if r["dtype"] == d.name]
        if not rows:
            continue
        print(f"\n== forward + backward step {d.name}: GFLOP/s (median), FLOPs = 3 x 2*sum(gs)*k*n; "
              f"raggeddot threads={rd_threads}, NumPy threads={blas.get('num_threads')}")
        print(step_table(rows))
        print("  step/fwd t: raggeddot step time / raggeddot forward time (3 products: 3.0 = backward at forward speed)")
        print(f"\n== tgmm {d.name}: GFLOP/s (median) of d_rhs = tgmm(lhs.T, ct, gs), FLOPs = 2*sum(gs)*k*n "
              f"(np-dense: lhs @ rhs[0], 2*m*k*n)")
        print(tgmm_table(rows))
        notes = notes_for(rows)
        if notes:
            print("notes:")
            print("\n".join(notes))

    targets = evaluate_targets(results, rd_threads)
    print("\n== targets")
    w = max(len(t["target"]) for t in targets)
    for t in targets:
        print(f"  {t['status']:7s}  {t['target']:{w}s}  {t['figure']}")

    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "bench_backward.json")
    elapsed = time.perf_counter() - t_start
    C.write_json(json_path, {
        "benchmark": "backward",
        "machine": info,
        "config": {"mode": mode, "dtypes": [d.name for d in dtypes], "scenarios": names, "seed": args.seed,
                   "timing": timing_kw, "rel_tol": {k.name: v for k, v in C.REL_TOL.items()},
                   "jax_time_limit_s": jax_time_limit, "jax_max_mask_bytes": F.JAX_MAX_MASK_BYTES,
                   "argv": sys.argv[1:] if argv is None else list(argv)},
        "scenario_defs": {k: dict(zip(("m", "k", "n", "g", "pattern"), v)) for k, v in SCENARIOS.items()},
        "results": results,
        "targets": targets,
        "elapsed_s": elapsed,
        "loadavg": {"start": load_start, "end": C.loadavg()},
    })
    print(f"\nwrote {json_path}")
    print(f"total {elapsed:.0f} s; load average at start {load_start}, at end {C.loadavg()}")
    failed = [(r["scenario"], r["dtype"], s) for r in results for s, v in (("step", "raggeddot"), ("tgmm", "tgmm"), ("tgmm", "forward"))
              if r[s].get(v, {}).get("status") == "FAILED"]
    if failed:
        print(f"raggeddot FAILED the accuracy check on: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    C.run_main(main)

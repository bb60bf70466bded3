#!/usr/bin/env python
"""Benchmark raggeddot.ragged_dot against dense NumPy, a NumPy per-group loop, torch and JAX.

    python benchmarks/bench_ragged_dot.py [--quick] [--threads N] [--dtype float32|float64 ...]
                                          [--scenario NAME_OR_GLOB ...] [--out DIR] [--list]
                                          [--kernel avx2|avx512|ref] [--seed S] [--target-time S]
                                          [--scaling-scenario NAME|none] [--no-plot] [--no-progress]

ragged_dot(lhs [m,k], rhs [g,k,n], group_sizes [g]) -> [m,n]: group i owns rows
[start_i, start_i + group_sizes[i]) and multiplies them by rhs[i]; rows past sum(group_sizes) are 0.

For every named scenario (m, k, n, g, group-size pattern) and dtype, each variant is first checked
against raggeddot.reference.ragged_dot (max |out - ref| / max |ref| <= 1e-4 float32, 1e-10
float64; a variant that fails is reported FAILED and not timed), then warmed up and timed: the
median of an adaptive number of runs (>= 3, about 0.75 s per variant; 0.2 s with --quick).

Variants
  raggeddot    raggeddot.ragged_dot
  np-dense     lhs @ rhs[0] on the same (m, k, n): the dense roofline. Its GFLOP/s uses its own
               FLOPs, 2*m*k*n; everything else uses 2*sum(group_sizes)*k*n.
  np-loop      NumPy per group: np.matmul(lhs[s:e], rhs[i], out=out[s:e]), tail rows zeroed.
  torch-loop   the same loop with torch.matmul on CPU (when torch imports).
  torch-gmm    torch._grouped_mm(lhs, rhs, offs=cumsum(group_sizes)) on CPU, tail rows zeroed
               (torch leaves them uninitialised); float32 only.
  jax          jax.jit(jax.lax.ragged_dot) on CPU, block_until_ready. XLA:CPU lowers ragged_dot
               to a dense dot over a masked [m, g*k] copy of lhs (g times the FLOPs); shapes whose
               masked copy or estimated time is too large are reported "skip".

Ratios compare raggeddot's GFLOP/s with each baseline's (rd/torch uses the faster torch
variant). % peak is raggeddot's GFLOP/s over raggeddot._core.fma_peak(threads, seconds, isa),
the FMA peak in float32 GFLOP/s (half of it for float64) measured at start-up per thread count,
for the ISA of raggeddot's micro-kernel in use (AVX-512 kernel: 512-bit peak, else AVX2); the
JSON also has % of the AVX2 peak.

NumPy (OpenBLAS), torch and XLA keep their default thread counts (recorded in the JSON);
--threads sets raggeddot's. The machine has 2 cores: another busy process halves what a
2-thread variant gets, so the load average is printed and recorded, and a raggeddot (or large
np-dense) figure timed with < 75% of its threads' CPU time, or with > 5% of the CPU time
stolen by the hypervisor, is marked '*'. A scaling section times raggeddot at 1..ncpu threads on one large
shape. Outputs: a table on stdout, <out>/bench_ragged_dot.json and <out>/bench_ragged_dot.png,
then a "targets" section (REACHED / MISSED with the measured figure).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "benchmarks", "results")

# ----------------------------------------------------------------------------------------------
# Scenarios: name -> (m, k, n, g, group-size pattern)
#
# MoE shapes: m = tokens * top_k rows of the permuted activations; (k, n) = the first expert
# matmul (d_model -> d_ff) of a real model, scaled to fit a 2-core, 24 GiB machine:
#   mixtral   Mixtral 8x7B       4096 -> 14336, 8 experts top-2     scaled 1/4: 1024 -> 3584
#   qwen3     Qwen3-30B-A3B      2048 -> 768, 128 experts top-8     real size
#   deepseek  DeepSeek-V3        7168 -> 2048, 256 experts top-8    scaled 1/4: 1792 -> 512
# Each model shape is also run at other group counts, so the plot shows GFLOP/s against g.

SCENARIOS: dict[str, tuple[int, int, int, int, str]] = {
    # compute-bound, one group: should match a dense GEMM
    "dense-2048": (2048, 2048, 2048, 1, "balanced"),
    "dense-4096x1024x4096": (4096, 1024, 4096, 1, "balanced"),
    # Mixtral-like
    "mixtral-m4096-g8-balanced": (4096, 1024, 3584, 8, "balanced"),
    "mixtral-m16384-g8-balanced": (16384, 1024, 3584, 8, "balanced"),
    "mixtral-m16384-g8-skewed": (16384, 1024, 3584, 8, "skewed"),
    "mixtral-m16384-g64-balanced": (16384, 1024, 3584, 64, "balanced"),
    # Qwen3-MoE-like
    "qwen3-m4096-g64-skewed": (4096, 2048, 768, 64, "skewed"),
    "qwen3-m4096-g128-balanced": (4096, 2048, 768, 128, "balanced"),
    "qwen3-m16384-g8-balanced": (16384, 2048, 768, 8, "balanced"),
    "qwen3-m16384-g64-balanced": (16384, 2048, 768, 64, "balanced"),
    "qwen3-m16384-g128-balanced": (16384, 2048, 768, 128, "balanced"),
    "qwen3-m16384-g128-skewed": (16384, 2048, 768, 128, "skewed"),
    "qwen3-m16384-g128-empty": (16384, 2048, 768, 128, "empty"),
    "qwen3-m16384-g256-balanced": (16384, 2048, 768, 256, "balanced"),
    # DeepSeek-V3-like
    "deepseek-m4096-g256-balanced": (4096, 1792, 512, 256, "balanced"),
    "deepseek-m16384-g64-balanced": (16384, 1792, 512, 64, "balanced"),
    "deepseek-m16384-g256-balanced": (16384, 1792, 512, 256, "balanced"),
    "deepseek-m16384-g256-skewed": (16384, 1792, 512, 256, "skewed"),
    "deepseek-m16384-g256-partial": (16384, 1792, 512, 256, "partial"),
    # memory-bound: many tiny groups
    "tiny-m4096-g256-k64-n64": (4096, 64, 64, 256, "balanced"),
    "tiny-m4096-g256-k64-n64-skewed": (4096, 64, 64, 256, "skewed"),
}

QUICK_SCENARIOS = [
    "dense-2048",
    "qwen3-m4096-g64-skewed",
    "deepseek-m4096-g256-balanced",
    "tiny-m4096-g256-k64-n64",
]
SCALING_SCENARIO = {"full": "qwen3-m16384-g128-balanced", "quick": "qwen3-m4096-g128-balanced"}

PATTERNS = ("balanced", "skewed", "empty", "partial")
VARIANTS = ("raggeddot", "np-dense", "np-loop", "torch-loop", "torch-gmm", "jax")

#: XLA's masked lowering copies lhs to [m, g*k]; above this it is not run.
JAX_MAX_MASK_BYTES = 2 << 30


def category(name: str, g: int) -> str:
    if g == 1:
        return "compute"
    if name.startswith("tiny"):
        return "memory"
    return "moe"


def make_group_sizes(pattern: str, m: int, g: int, rng: np.random.Generator) -> np.ndarray:
    """int32 group sizes, deterministic given rng.

    balanced  m // g each, the remainder spread over the first groups (sum = m)
    skewed    Zipf-like: p_i ~ 1 / rank_i over a random ranking, multinomial(m, p) (sum = m)
    empty     a quarter of the groups (at least one) empty, the rest multinomial-uniform (sum = m)
    partial   multinomial-uniform over all groups with sum = 3m/4: the last m/4 rows are zero
    """
    if pattern == "balanced":
        gs = np.full(g, m // g, dtype=np.int64)
        gs[: m - int(gs.sum())] += 1
    elif pattern == "skewed":
        p = 1.0 / np.arange(1, g + 1, dtype=np.float64)
        p = rng.permutation(p / p.sum())
        gs = rng.multinomial(m, p)
    elif pattern == "empty":
        n_empty = max(1, g // 4) if g > 1 else 0
        empty = rng.choice(g, size=n_empty, replace=False)
        p = np.ones(g)
        p[empty] = 0.0
        gs = rng.multinomial(m, p / p.sum())
    elif pattern == "partial":
        gs = rng.multinomial(3 * m // 4, np.full(g, 1.0 / g))
    else:
        raise ValueError(f"unknown group-size pattern {pattern!r}; expected one of {PATTERNS}")
    gs = np.asarray(gs, dtype=np.int32)
    assert gs.shape == (g,) and gs.min() >= 0 and gs.sum() <= m
    return gs


# ----------------------------------------------------------------------------------------------
# The library under test and the optional baselines


def import_raggeddot():
    """raggeddot as installed; else from the repository root (an in-place build)."""
    def usable(mod):
        return hasattr(mod, "ragged_dot")

    try:
        import raggeddot

        if usable(raggeddot):
            return raggeddot
    except ImportError:
        pass
    for key in [k for k in sys.modules if k == "raggeddot" or k.startswith("raggeddot.")]:
        del sys.modules[key]
    sys.path.insert(0, REPO_ROOT)
    try:
        import raggeddot

        if usable(raggeddot):
            return raggeddot
    except ImportError as e:
        sys.exit(f"cannot import raggeddot ({e}); build it first: pip install -e . --no-build-isolation")
    sys.exit("raggeddot has no ragged_dot: build it first: pip install -e . --no-build-isolation")


def reference_fn(rd) -> tuple[Callable, str]:
    try:
        from raggeddot import reference

        return reference.ragged_dot, "raggeddot.reference.ragged_dot"
    except ImportError:
        pass

    def loop64(lhs, rhs, gs):  # fallback oracle: float64 per-group loop
        out = np.zeros((lhs.shape[0], rhs.shape[2]), dtype=np.float64)
        s = 0
        for i, size in enumerate(np.asarray(gs)):
            out[s : s + size] = lhs[s : s + size].astype(np.float64) @ rhs[i].astype(np.float64)
            s += size
        return out.astype(np.result_type(lhs, rhs))

    return loop64, "float64 NumPy loop (raggeddot.reference missing)"


@dataclass
class Env:
    rd: Any
    reference: Callable
    reference_name: str
    torch: Any = None
    torch_gmm: bool = False
    torch_note: str = ""
    jax: Any = None
    jax_jit: Any = None
    jax_masked: bool | None = None
    jax_note: str = ""


def setup_torch(env: Env) -> None:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - optional baseline
        env.torch_note = f"torch not importable: {type(e).__name__}"
        return
    env.torch = torch
    if not hasattr(torch, "_grouped_mm"):
        env.torch_note = f"torch {torch.__version__} has no _grouped_mm"
        return
    try:  # tiny probe: works on CPU, with an empty group and sum < m?
        a = torch.randn(10, 8)
        b = torch.randn(3, 8, 4)
        offs = torch.tensor([3, 3, 7], dtype=torch.int32)
        o = torch._grouped_mm(a, b, offs=offs)
        ok = torch.allclose(o[:3], a[:3] @ b[0], atol=1e-5) and torch.allclose(o[3:7], a[3:7] @ b[2], atol=1e-5)
        env.torch_gmm = bool(ok)
        if not ok:
            env.torch_note = "torch._grouped_mm gives wrong results on CPU"
    except Exception as e:  # noqa: BLE001
        env.torch_note = f"torch._grouped_mm fails on CPU: {type(e).__name__}: {str(e)[:120]}"


def setup_jax(env: Env, want_x64: bool) -> None:
    try:
        import jax

        if want_x64:
            jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_platforms", "cpu")
        import jax.numpy as jnp
    except Exception as e:  # noqa: BLE001 - optional baseline
        env.jax_note = f"jax not importable: {type(e).__name__}"
        return
    env.jax = jax
    env.jax_jit = jax.jit(jax.lax.ragged_dot)
    try:  # does XLA:CPU materialise lhs as [m, g*k]? (m=8, g=3, k=4 -> f32[8,12])
        txt = env.jax_jit.lower(
            jnp.zeros((8, 4), jnp.float32), jnp.zeros((3, 4, 5), jnp.float32), jnp.array([2, 3, 3], jnp.int32)
        ).compile().as_text()
        env.jax_masked = "f32[8,12]" in txt
    except Exception:  # noqa: BLE001
        env.jax_masked = None
    if env.jax_masked:
        env.jax_note = "XLA:CPU lowers ragged_dot to a masked dense dot ([m, g*k] @ [g*k, n]: g x the FLOPs)"


# ----------------------------------------------------------------------------------------------
# Variants: each builder returns (fn, sync) or raises Skip


class Skip(Exception):
    """The variant is not run for this scenario (reason in the message)."""


@dataclass
class Case:
    name: str
    m: int
    k: int
    n: int
    g: int
    pattern: str
    dtype: np.dtype
    lhs: np.ndarray
    rhs: np.ndarray
    gs: np.ndarray
    flops: float
    dense_flops: float
    bounds: list = field(default_factory=list)  # (group, start, end) of non-empty groups
    total: int = 0
    t: dict = field(default_factory=dict)  # torch tensors (shared memory)


def build_raggeddot(env: Env, c: Case):
    rd = env.rd
    return (lambda: rd.ragged_dot(c.lhs, c.rhs, c.gs)), None


def build_np_dense(env: Env, c: Case):
    lhs, rhs0 = c.lhs, c.rhs[0]
    return (lambda: lhs @ rhs0), None


def build_np_loop(env: Env, c: Case):
    lhs, rhs, bounds, total, m, n, dt = c.lhs, c.rhs, c.bounds, c.total, c.m, c.n, c.dtype

    def loop():
        out = np.empty((m, n), dtype=dt)
        for i, s, e in bounds:
            np.matmul(lhs[s:e], rhs[i], out=out[s:e])
        out[total:] = 0
        return out

    return loop, None


def _torch_tensors(env: Env, c: Case) -> dict:
    if not c.t:
        torch = env.torch
        c.t["lhs"] = torch.from_numpy(c.lhs)
        c.t["rhs"] = torch.from_numpy(c.rhs)
        c.t["offs"] = torch.from_numpy(np.cumsum(c.gs).astype(np.int32))
        c.t["dtype"] = c.t["lhs"].dtype
    return c.t


def build_torch_loop(env: Env, c: Case):
    if env.torch is None:
        raise Skip(env.torch_note or "no torch")
    torch, t = env.torch, _torch_tensors(env, c)
    lhs, rhs, bounds, total, m, n = t["lhs"], t["rhs"], c.bounds, c.total, c.m, c.n

    def loop():
        out = torch.empty((m, n), dtype=t["dtype"])
        for i, s, e in bounds:
            torch.matmul(lhs[s:e], rhs[i], out=out[s:e])
        out[total:] = 0
        return out

    return loop, None


def build_torch_gmm(env: Env, c: Case):
    if env.torch is None or not env.torch_gmm:
        raise Skip(env.torch_note or "no torch._grouped_mm")
    if c.dtype != np.float32:
        raise Skip("torch._grouped_mm supports float32/bfloat16/float16 only")
    torch, t = env.torch, _torch_tensors(env, c)
    lhs, rhs, offs, total = t["lhs"], t["rhs"], t["offs"], c.total

    def gmm():
        out = torch._grouped_mm(lhs, rhs, offs=offs)
        out[total:] = 0  # rows past sum(group_sizes) are left uninitialised by torch
        return out

    return gmm, None


def build_jax(env: Env, c: Case, dense_gflops: float | None, time_limit: float):
    if env.jax is None:
        raise Skip(env.jax_note or "no jax")
    if c.dtype == np.float64 and not env.jax.config.jax_enable_x64:
        raise Skip("float64 needs jax_enable_x64")
    if env.jax_masked:
        mask_bytes = c.m * c.g * c.k * c.dtype.itemsize
        if mask_bytes > JAX_MAX_MASK_BYTES:
            raise Skip(f"masked lhs copy [m, g*k] would take {mask_bytes / 2**30:.1f} GiB")
        if dense_gflops:
            est = c.g * c.dense_flops / (dense_gflops * 1e9)
            if est > time_limit:
                raise Skip(f"masked dense dot does g={c.g}x the FLOPs: est. {est:.1f} s per call")
    jnp = env.jax.numpy
    lhs, rhs, gs = jnp.asarray(c.lhs), jnp.asarray(c.rhs), jnp.asarray(c.gs)
    f = env.jax_jit
    return (lambda: f(lhs, rhs, gs)), (lambda r: r.block_until_ready())


# ----------------------------------------------------------------------------------------------
# Running one scenario


def run_variant(fn, sync, ref, c: Case, flops: float, timing_kw: dict, jit: bool = False) -> dict:
    """Check fn() against ref, then time it. Returns the variant's JSON record.

    With timing_kw["warmup"] == 0 (--quick) the check call is the warm-up and its time sets
    the run count, except for a jit-compiled variant (its first call compiles).
    """
    rec: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        out = fn()
        if sync is not None:
            sync(out)
        t_check = time.perf_counter() - t0
        out_np = np.asarray(out)
        ok, err = C.check(out_np, ref, c.dtype)
        rec["rel_err"] = err
        if out_np.dtype != c.dtype:
            ok = False
            rec["reason"] = f"output dtype {out_np.dtype}, expected {c.dtype}"
        del out, out_np
    except Exception as e:  # noqa: BLE001 - reported, not raised
        rec.update(status="FAILED", reason=f"{type(e).__name__}: {str(e)[:200]}")
        return rec
    if not ok:
        rec["status"] = "FAILED"
        rec.setdefault("reason", f"rel err {rec['rel_err']:.3g} > {C.REL_TOL[c.dtype]:g}")
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


_data_cache: dict = {}


def cached_array(key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
    """Keeps the last array per role, so scenarios of one model shape share their operands."""
    role = key[0]
    hit = _data_cache.get(role)
    if hit is not None and hit[0] == key:
        return hit[1]
    _data_cache.pop(role, None)
    gc.collect()
    arr = make()
    _data_cache[role] = (key, arr)
    return arr


def make_case(name: str, dtype: np.dtype, seed: int) -> Case:
    m, k, n, g, pattern = SCENARIOS[name]
    rng = np.random.default_rng([seed, m, g, PATTERNS.index(pattern)])
    gs = make_group_sizes(pattern, m, g, rng)
    lhs = cached_array(("lhs", m, k, dtype.str, seed), lambda: np.random.default_rng([seed, 1, m, k]).standard_normal((m, k), dtype=dtype))
    rhs = cached_array(("rhs", g, k, n, dtype.str, seed), lambda: np.random.default_rng([seed, 2, g, k, n]).standard_normal((g, k, n), dtype=dtype))
    starts = np.concatenate([[0], np.cumsum(gs)[:-1]])
    bounds = [(i, int(s), int(s + z)) for i, (s, z) in enumerate(zip(starts, gs)) if z > 0]
    total = int(gs.sum())
    return Case(name, m, k, n, g, pattern, dtype, lhs, rhs, gs, flops=2.0 * total * k * n,
                dense_flops=2.0 * m * k * n, bounds=bounds, total=total)


def run_scenario(env: Env, c: Case, timing_kw: dict, jax_time_limit: float, log) -> dict:
    rec: dict[str, Any] = {
        "scenario": c.name, "category": category(c.name, c.g), "dtype": c.dtype.name,
        "m": c.m, "k": c.k, "n": c.n, "g": c.g, "pattern": c.pattern,
        "group_sizes": c.gs.tolist(), "rows": c.total, "empty_groups": int((c.gs == 0).sum()),
        "max_group": int(c.gs.max()), "flops": c.flops, "dense_flops": c.dense_flops, "variants": {},
    }
    t0 = time.perf_counter()
    ref = env.reference(c.lhs, c.rhs, c.gs)
    ref = np.asarray(ref)
    rec["reference_s"] = time.perf_counter() - t0
    ref_dense = None
    order = ["np-dense", "raggeddot", "np-loop", "torch-loop", "torch-gmm", "jax"]
    builders = {
        "raggeddot": build_raggeddot, "np-dense": build_np_dense, "np-loop": build_np_loop,
        "torch-loop": build_torch_loop, "torch-gmm": build_torch_gmm,
    }
    for v in order:
        try:
            if v == "jax":
                dense = rec["variants"].get("np-dense", {}).get("gflops")
                fn, sync = build_jax(env, c, dense, jax_time_limit)
            else:
                fn, sync = builders[v](env, c)
        except Skip as s:
            rec["variants"][v] = {"status": "skip", "reason": str(s)}
            continue
        if v == "np-dense":
            # the oracle for the dense product: the whole of lhs against rhs[0]
            ref_dense = np.asarray(env.reference(c.lhs, c.rhs[:1], np.array([c.m], dtype=np.int32)))
            vr = run_variant(fn, sync, ref_dense, c, c.dense_flops, timing_kw)
            del ref_dense
        else:
            vr = run_variant(fn, sync, ref, c, c.flops, timing_kw, jit=(v == "jax"))
        if vr["status"] == "FAILED":
            log(f"  {c.name} [{c.dtype.name}] {v}: FAILED ({vr.get('reason')})")
        rec["variants"][v] = vr
        del fn, sync
    c.t.clear()
    gc.collect()
    add_ratios(rec)
    return rec


def gf(rec: dict, v: str) -> float | None:
    r = rec["variants"].get(v, {})
    return r.get("gflops") if r.get("status") == "ok" else None


def add_ratios(rec: dict) -> None:
    rd = gf(rec, "raggeddot")
    torch_best = max([x for x in (gf(rec, "torch-loop"), gf(rec, "torch-gmm")) if x], default=None)
    def ratio(b):
        return rd / b if rd and b else None
    rec["ratios"] = {
        "rd/dense": ratio(gf(rec, "np-dense")),
        "rd/loop": ratio(gf(rec, "np-loop")),
        "rd/torch": ratio(torch_best),
        "rd/jax": ratio(gf(rec, "jax")),
    }


#: float32 FLOP per cycle per core of the FMA units (two pipes): a probe implying a clock
#: above the CPU's (max_clock_ghz), or AVX-512 more than ~2x AVX2, was not measuring
#: independent FMAs.
FLOP_PER_CYCLE = {"avx2": 32, "avx512": 64}


def max_clock_ghz() -> float:
    """Highest plausible core clock: cpufreq's max where the kernel has it, else 1.6x the
    clock /proc/cpuinfo reports (a VM's nominal clock, plus turbo headroom), else 6 GHz."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            return int(f.read()) / 1e6 * 1.05
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return max(1.6 * float(line.split(":")[1]) / 1e3, 1.0)
    except (OSError, ValueError):
        pass
    return 6.0


def peak_warnings(all_peaks: dict) -> list[str]:
    """Plausibility checks of the FMA probe (e.g. a compiler that folded identical FMA chains
    into one makes the probe report ~chains x the latency-bound rate)."""
    out = []
    top = max_clock_ghz()
    for isa, pk in all_peaks.items():
        p1 = pk.get("1")
        if p1:
            ghz = p1 / FLOP_PER_CYCLE[isa]
            if ghz > top:
                out.append(f"{isa} peak {p1:.0f} GFLOP/s on 1 thread implies {ghz:.1f} GHz at "
                           f"{FLOP_PER_CYCLE[isa]} FLOP/cycle (> {top:.1f} GHz): implausible, probe suspect")
    a2, a5 = all_peaks.get("avx2", {}).get("1"), all_peaks.get("avx512", {}).get("1")
    if a2 and a5 and a5 / a2 > 2.3:
        out.append(f"avx512/avx2 peak ratio {a5 / a2:.1f} > 2 (512-bit FMAs are at most 2x 256-bit): probe suspect")
    return out


def measured_above_peak(results: list[dict], peaks: dict, rd_threads: int | None, label: str) -> list[str]:
    """Variants measured faster than the peak used for % peak (another sign of a bad probe)."""
    out = []
    for r in results:
        p = peak_for(peaks, rd_threads, np.dtype(r["dtype"]))
        if not p:
            continue
        for v in ("raggeddot", "np-dense"):
            g = gf(r, v)
            if g and g > 1.05 * p and (v == "raggeddot" or label == "avx512"):
                out.append(f"{v} measured {g:.0f} GFLOP/s on {r['scenario']} [{r['dtype']}] > {label} peak {p:.0f}")
    return out[:3]


def kernel_name(rd) -> str | None:
    core = getattr(rd, "_core", None)
    if hasattr(core, "get_kernel"):
        try:
            return str(core.get_kernel())
        except Exception:  # noqa: BLE001
            pass
    if hasattr(rd, "build_info"):
        try:
            return rd.build_info().get("kernel")
        except Exception:  # noqa: BLE001
            pass
    return None


def peak_for(peaks: dict, threads: int | None, dtype: np.dtype) -> float | None:
    p = peaks.get(str(threads)) if threads else None
    if p is None:
        return None
    return p if dtype == np.float32 else p / 2.0


# ----------------------------------------------------------------------------------------------
# Scaling: raggeddot at 1..ncpu threads on one shape


def run_scaling(env: Env, name: str, dtype: np.dtype, seed: int, timing_kw: dict, peaks: dict) -> dict:
    rd = env.rd
    if not (hasattr(rd, "set_num_threads") and hasattr(rd, "get_num_threads")):
        return {"scenario": name, "status": "n/a", "reason": "raggeddot has no set_num_threads/get_num_threads"}
    c = make_case(name, dtype, seed)
    ref = np.asarray(env.reference(c.lhs, c.rhs, c.gs))
    before = rd.get_num_threads()
    ncpu = os.cpu_count() or 1
    res: dict[str, Any] = {"scenario": name, "dtype": dtype.name, "m": c.m, "k": c.k, "n": c.n, "g": c.g,
                           "pattern": c.pattern, "threads": {}}
    outs = {}
    try:
        for t in sorted({1, *range(2, ncpu + 1)}):
            rd.set_num_threads(t)
            fn, _ = build_raggeddot(env, c)
            vr = run_variant(fn, None, ref, c, c.flops, timing_kw)
            vr["actual_threads"] = rd.get_num_threads()
            vr["contended"] = is_contended(vr, t)
            p = peak_for(peaks, t, dtype)
            vr["pct_peak"] = 100.0 * vr["gflops"] / p if p and vr.get("gflops") else None
            res["threads"][str(t)] = vr
            if vr["status"] == "ok":
                outs[t] = rd.ragged_dot(c.lhs, c.rhs, c.gs)
    finally:
        rd.set_num_threads(before)
    g1 = res["threads"].get("1", {}).get("gflops")
    g2 = res["threads"].get("2", {}).get("gflops")
    res["speedup_2_vs_1"] = g2 / g1 if g1 and g2 else None
    if len(outs) > 1:
        first = next(iter(outs.values()))
        res["bitwise_identical_across_threads"] = all(np.array_equal(first, o) for o in outs.values())
    res["status"] = "ok"
    return res


# ----------------------------------------------------------------------------------------------
# Reporting

COLS = ["raggeddot", "np-dense", "np-loop", "torch-loop", "torch-gmm", "jax"]


#: raggeddot (and np-dense on large products) use every thread; timed with less than this
#: share of the expected CPU time (process CPU seconds / wall seconds / threads), their figure
#: is marked '*': other processes took the CPUs.
CONTENDED_SHARE = 0.75


STOLEN_SHARE = 0.05


def is_contended(vr: dict, threads: int | None) -> bool:
    """Less than CONTENDED_SHARE of `threads` CPUs' time, or more than STOLEN_SHARE of the
    machine's CPU time stolen by the hypervisor, while the variant was timed."""
    u, st = vr.get("cpu_util"), vr.get("steal_s")
    wall = sum(vr.get("times_s", [])) or math.nan
    low = threads is not None and u is not None and math.isfinite(u) and u < CONTENDED_SHARE * threads
    stolen = st is not None and math.isfinite(st) and st > STOLEN_SHARE * wall * (os.cpu_count() or 1)
    return bool(low or stolen)


def mark_contention(rec: dict, threads: dict) -> None:
    for v, vr in rec["variants"].items():
        if vr.get("status") == "ok":
            vr["contended"] = is_contended(vr, threads.get(v))


def cell(rec: dict, v: str) -> str:
    r = rec["variants"].get(v)
    if r is None:
        return "-"
    if r["status"] == "ok":
        return C.fmt_num(r["gflops"]) + ("*" if r.get("contended") else "")
    return {"FAILED": "FAILED", "skip": "skip"}.get(r["status"], r["status"])


def results_table(results: list[dict]) -> str:
    headers = ["scenario", "m", "k", "n", "g", "pattern", *COLS, "rd/dense", "rd/loop", "rd/torch", "rd/jax", "%peak"]
    rows = []
    for r in results:
        ra = r["ratios"]
        rows.append([r["scenario"], r["m"], r["k"], r["n"], r["g"], r["pattern"], *(cell(r, v) for v in COLS),
                     *(C.fmt_num(ra[x], 2) if ra[x] is not None else "-" for x in ("rd/dense", "rd/loop", "rd/torch", "rd/jax")),
                     C.fmt_num(r.get("pct_peak"), 0) if r.get("pct_peak") is not None else "n/a"])
    align = ["<", ">", ">", ">", ">", "<"] + [">"] * (len(headers) - 6)
    return C.format_table(headers, rows, align)


def notes_for(results: list[dict]) -> list[str]:
    """One line per distinct skip/failure reason, with the scenarios it applies to."""
    reasons: dict[tuple, list] = {}
    for r in results:
        for v, vr in r["variants"].items():
            if vr["status"] in ("skip", "FAILED"):
                key = (v, vr["status"], re.sub(r"[0-9.]+ (s|GiB)", "N \\1", vr.get("reason", "")))
                reasons.setdefault(key, []).append(r["scenario"])
    lines = []
    for (v, st, why), names in reasons.items():
        where = "all" if len(names) == len(results) else ", ".join(names) if len(names) <= 4 else f"{len(names)} scenarios"
        lines.append(f"  {v} {st}: {why}  [{where}]")
    return lines


def evaluate_targets(results: list[dict], scaling: dict | None, rd_threads: int | None) -> list[dict]:
    """The performance targets: REACHED / MISSED / n/a with the measured figure."""
    f32 = [r for r in results if r["dtype"] == "float32"]
    f64 = [r for r in results if r["dtype"] == "float64"]
    at = "" if rd_threads == 2 else f" (measured at {rd_threads} threads; target is for 2)"
    out = []

    def worst(rows, key, what, bound, scope):
        if not rows:
            out.append({"target": what, "status": "n/a", "figure": f"no {scope} scenario run"})
            return
        vals = [(r["ratios"][key], r["scenario"]) for r in rows]
        failed = [s for v, s in vals if v is None]
        if failed:
            out.append({"target": what, "status": "MISSED", "figure": f"no ratio for {', '.join(failed[:3])} (raggeddot or baseline did not run)"})
            return
        v, s = min(vals)
        out.append({"target": what, "status": "REACHED" if v >= bound else "MISSED",
                    "figure": f"worst {v:.2f}x ({s}); best {max(vals)[0]:.2f}x over {len(vals)} scenarios" + at, "value": v})

    worst([r for r in f32 if r["category"] == "compute"], "rd/dense",
          "float32 single group >= 1.1x dense NumPy", 1.1, "float32 single-group")
    moe = [r for r in f32 if r["category"] == "moe" and 64 <= r["g"] <= 256]
    worst(moe, "rd/loop", "float32 MoE, 64-256 groups >= 2x NumPy loop", 2.0, "float32 MoE 64-256 group")
    worst(moe, "rd/dense", "float32 MoE, 64-256 groups >= 0.9x dense NumPy", 0.9, "float32 MoE 64-256 group")
    pk = [(r.get("pct_peak"), r["scenario"], r) for r in f32 if r.get("pct_peak") is not None]
    if pk:
        v, s, r = max(pk, key=lambda t: t[0])
        also = f", {r['pct_peak_avx2']:.1f}% of the AVX2 peak" if r.get("peak_isa") != "avx2" and r.get("pct_peak_avx2") else ""
        out.append({"target": "float32 best shape >= 75% of peak", "status": "REACHED" if v >= 75 else "MISSED",
                    "figure": f"{v:.1f}% of the {r.get('peak_isa', '').upper()} peak{also} ({s})" + at, "value": v})
    else:
        out.append({"target": "float32 best shape >= 75% of peak", "status": "n/a",
                    "figure": "no float32 scenario run" if not f32 else "no peak measurement (raggeddot._core.fma_peak missing)"})
    worst([r for r in f64 if r["category"] == "compute"], "rd/dense",
          "float64 single group >= 1.0x dense NumPy float64", 1.0, "float64 single-group (run with --dtype float64)")
    s = (scaling or {}).get("speedup_2_vs_1")
    if s is not None:
        out.append({"target": "2 threads >= 1.8x 1 thread", "status": "REACHED" if s >= 1.8 else "MISSED",
                    "figure": f"{s:.2f}x ({scaling['scenario']}, {scaling['dtype']})", "value": s})
    else:
        out.append({"target": "2 threads >= 1.8x 1 thread", "status": "n/a",
                    "figure": (scaling or {}).get("reason", "scaling not run")})
    return out


def plot(results: list[dict], peaks: dict, rd_threads: int | None, path: str, peak_label: str = "") -> str | None:
    plt = C.pyplot()
    if plt is None:
        return "matplotlib not importable"
    moe = [r for r in results if r["category"] == "moe"]
    fams: dict[tuple, list] = {}
    for r in moe:
        fams.setdefault((r["dtype"], r["scenario"].split("-")[0], r["m"], r["k"], r["n"]), []).append(r)
    if not fams:
        return "no MoE scenario run"
    keys = sorted(fams, key=lambda t: (t[0], t[1], t[2]))
    ncol = min(3, len(keys))
    nrow = math.ceil(len(keys) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.2 * nrow), squeeze=False)
    colors = dict(zip(COLS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    markers = {"balanced": "o", "skewed": "^", "empty": "s", "partial": "x"}
    seen: set = set()
    for ax, key in zip(axes.flat, keys):
        rows = sorted(fams[key], key=lambda r: r["g"])
        dtype, model, m, k, n = key
        for v in ("jax", "torch-gmm", "torch-loop", "np-loop", "raggeddot"):  # raggeddot drawn on top
            pts = [(r["g"], gf(r, v), r["pattern"]) for r in rows if gf(r, v)]
            if not pts:
                continue
            seen.add(v)
            lw, z = (2.5, 3) if v == "raggeddot" else (1.5, 2)
            line = [(g, y) for g, y, p in pts if p == "balanced"]
            if len(line) > 1:
                ax.plot(*zip(*line), "-", color=colors[v], lw=lw, zorder=z)
            for g, y, p in pts:
                ax.plot([g], [y], markers.get(p, "o"), color=colors[v], ms=6, zorder=z,
                        mfc="none" if p != "balanced" else colors[v])
        dense = [gf(r, "np-dense") for r in rows if gf(r, "np-dense")]
        if dense:
            ax.axhline(float(np.median(dense)), color="k", ls="--", lw=1)
            seen.add("dense")
        p = peak_for(peaks, rd_threads, np.dtype(dtype))
        if p:
            ax.axhline(p, color="r", ls=":", lw=1)
            seen.add("peak")
        ax.set_xscale("log", base=2)
        gs = sorted({r["g"] for r in rows})
        ax.set_xticks(gs, [str(g) for g in gs])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("groups g")
        ax.set_ylabel("GFLOP/s")
        ax.set_title(f"{model}  m={m} k={k} n={n}  {dtype}", fontsize=10)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    L2D = plt.Line2D
    handles = [L2D([], [], color=colors[v], marker="o", lw=2.5 if v == "raggeddot" else 1.5, label=v) for v in COLS if v in seen]
    if "dense" in seen:
        handles.append(L2D([], [], color="k", ls="--", lw=1, label="dense NumPy lhs @ rhs[0] (same m,k,n)"))
    if "peak" in seen:
        handles.append(L2D([], [], color="r", ls=":", lw=1, label=f"{peak_label} FMA peak ({rd_threads} thr)"))
    handles += [L2D([], [], marker=mk, ls="", color="gray", mfc="none" if p != "balanced" else "gray", label=p)
                for p, mk in markers.items() if any(r["pattern"] == p for r in moe)]
    fig.legend(handles=handles, loc="lower center", ncol=min(6, len(handles)), fontsize=9, frameon=False)
    fig.suptitle(f"ragged_dot GFLOP/s vs group count (raggeddot threads={rd_threads}; lines: balanced groups)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# ----------------------------------------------------------------------------------------------


def base_parser(doc: str, scenarios: dict, quick: list[str]) -> argparse.ArgumentParser:
    """The options this benchmark shares with bench_backward.py (scenarios name -> (m, k, n, g,
    pattern); quick: the --quick subset)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="scenarios:\n" + "\n".join(f"  {k:34s} m={v[0]} k={v[1]} n={v[2]} g={v[3]} {v[4]}" for k, v in scenarios.items()))
    p.add_argument("--quick", action="store_true", help=f"small subset ({', '.join(quick)}), shorter timing; < 60 s")
    p.add_argument("--threads", type=int, default=None, help="raggeddot threads (default: raggeddot's own default)")
    p.add_argument("--dtype", nargs="+", choices=["float32", "float64"], default=["float32"], help="one or more (default float32)")
    p.add_argument("--kernel", default=None, help="raggeddot micro-kernel (raggeddot._core.set_kernel: e.g. avx2, avx512, ref, auto)")
    p.add_argument("--scenario", nargs="+", metavar="NAME", help="scenario names or globs (e.g. 'qwen3-*')")
    p.add_argument("--out", default=DEFAULT_OUT, help="output directory (default benchmarks/results/)")
    p.add_argument("--seed", type=int, default=0, help="seed of group sizes and data (default 0)")
    p.add_argument("--target-time", type=float, default=None, help="seconds of timed runs per variant (default 0.75, 0.2 with --quick)")
    return p


def configure_raggeddot(rd, threads: int | None, kernel: str | None) -> int | None:
    """Apply --threads and --kernel to raggeddot (with a warning where this build lacks the
    setter); returns the thread count in force."""
    if threads is not None:
        if hasattr(rd, "set_num_threads"):
            rd.set_num_threads(threads)
        else:
            print("warning: raggeddot has no set_num_threads; --threads ignored", file=sys.stderr)
    if kernel is not None:
        if hasattr(getattr(rd, "_core", None), "set_kernel"):
            rd._core.set_kernel(kernel)
        else:
            print("warning: raggeddot._core has no set_kernel; --kernel ignored", file=sys.stderr)
    return rd.get_num_threads() if hasattr(rd, "get_num_threads") else None


def parse_args(argv=None):
    p = base_parser(__doc__, SCENARIOS, QUICK_SCENARIOS)
    p.add_argument("--scaling-scenario", default=None, help="shape for the 1-vs-2-thread section ('none' to skip)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for k, (m, kk, n, g, pat) in SCENARIOS.items():
            print(f"{k:34s} m={m:<6d} k={kk:<5d} n={n:<5d} g={g:<4d} {pat:9s} {category(k, g)}{'  (quick)' if k in QUICK_SCENARIOS else ''}")
        return 0
    names = C.select_scenarios(args.scenario, list(SCENARIOS), QUICK_SCENARIOS if args.quick else SCENARIOS)
    dtypes = [np.dtype(d) for d in args.dtype]
    mode = "quick" if args.quick else "full"
    target = args.target_time if args.target_time is not None else (0.2 if args.quick else 0.75)
    timing_kw = {"target_s": target, "min_runs": 3, "max_runs": 50 if args.quick else 200, "warmup": 0 if args.quick else 1}
    jax_time_limit = 1.0 if args.quick else 4.0
    t_start = time.perf_counter()
    load_start = C.loadavg()
    busy = C.busy_warning()

    rd = import_raggeddot()
    ref_fn, ref_name = reference_fn(rd)
    env = Env(rd=rd, reference=ref_fn, reference_name=ref_name)
    rd_threads = configure_raggeddot(rd, args.threads, args.kernel)
    kernel = kernel_name(rd)

    # FMA peak per ISA and thread count, first, while this process is quiet. % peak uses the
    # ISA of raggeddot's kernel in use (AVX-512 kernel -> 512-bit peak; otherwise AVX2).
    ncpu = os.cpu_count() or 1
    all_peaks: dict[str, dict[str, float | None]] = {}
    for isa in ("avx2", "avx512"):
        all_peaks[isa] = {str(t): C.fma_peak(rd, t, 0.2 if args.quick else 0.5, isa=isa) for t in range(1, ncpu + 1)}
    if not any(all_peaks["avx2"].values()):  # older core: fma_peak(threads, seconds) only
        all_peaks = {"avx2": {str(t): C.fma_peak(rd, t, 0.2 if args.quick else 0.5) for t in range(1, ncpu + 1)}}
    peak_isa = "avx512" if kernel == "avx512" and any(all_peaks.get("avx512", {}).values()) else "avx2"
    peaks = all_peaks[peak_isa]
    probe_warnings = peak_warnings(all_peaks)
    setup_torch(env)
    setup_jax(env, want_x64=np.dtype(np.float64) in dtypes)

    info = C.machine_info({
        "raggeddot": {
            "version": getattr(rd, "__version__", None),
            "file": getattr(rd, "__file__", None),
            "threads": rd_threads,
            "build_info": (rd.build_info() if hasattr(rd, "build_info") else None),
            "kernel": kernel,
            "reference": ref_name,
        },
        "torch": ({"version": env.torch.__version__, "threads": env.torch.get_num_threads(),
                   "grouped_mm": env.torch_gmm, "note": env.torch_note} if env.torch else {"note": env.torch_note}),
        "jax": ({"version": env.jax.__version__, "devices": [str(d) for d in env.jax.devices()],
                 "x64": bool(env.jax.config.jax_enable_x64), "masked_lowering": env.jax_masked, "note": env.jax_note}
                if env.jax else {"note": env.jax_note}),
        "fma_peak_gflops_f32": all_peaks,
        "peak_used_for_pct": peak_isa,
    })

    cpu = info["cpu"]
    print(f"CPU: {cpu.get('model')} ({cpu.get('logical_cpus')} cpus, {' '.join(cpu.get('flags', []))})")
    blas = info["numpy_blas"]
    print(f"NumPy {np.__version__}: {blas.get('name')} {blas.get('version')} core={blas.get('corename')} threads={blas.get('num_threads')}")
    print(f"raggeddot {info['raggeddot']['version'] or ''}: kernel={kernel} threads={rd_threads} build_info={info['raggeddot']['build_info']}")
    print(f"torch: {info['torch'].get('version', '-')} threads={info['torch'].get('threads', '-')} _grouped_mm={env.torch_gmm} {env.torch_note}")
    print(f"jax: {info['jax'].get('version', '-')} {env.jax_note}")
    for isa, pk in all_peaks.items():
        print(f"FMA peak {isa} (float32 GFLOP/s; float64 is half): " + ", ".join(f"{t} thr {C.fmt_num(v) if v else 'n/a'}" for t, v in pk.items())
              + ("   <- % peak" if isa == peak_isa else ""))
    for w in probe_warnings:
        print(f"warning: {w}")
    print(f"oracle: {ref_name}; mode {mode}; {len(names)} scenarios x {len(dtypes)} dtypes; seed {args.seed}")
    if busy:
        print(busy)
    sys.stdout.flush()

    results: list[dict] = []
    jobs = [(d, n) for d in dtypes for n in names]
    it, status, log = C.progress(jobs, "ragged_dot", enabled=not args.no_progress, label=lambda j: f"{j[1]} {j[0].name}")
    for dtype, name in it:
        status(f"{name} {dtype.name}")
        c = make_case(name, dtype, args.seed)
        try:
            rec = run_scenario(env, c, timing_kw, jax_time_limit, log)
        except MemoryError:
            log(f"  {name} [{dtype.name}]: out of memory, skipped")
            continue
        finally:
            del c
        expect = {"raggeddot": rd_threads or ncpu}
        if rec["dense_flops"] >= 1e9:  # OpenBLAS may run small products on one thread
            expect["np-dense"] = blas.get("num_threads") or ncpu
        mark_contention(rec, expect)
        p = peak_for(peaks, rd_threads, dtype)
        p2 = peak_for(all_peaks["avx2"], rd_threads, dtype)
        g = gf(rec, "raggeddot")
        rec["pct_peak"] = 100.0 * g / p if p and g else None
        rec["pct_peak_avx2"] = 100.0 * g / p2 if p2 and g else None
        rec["peak_isa"] = peak_isa
        results.append(rec)
    _data_cache.clear()
    gc.collect()

    scaling = None
    sname = args.scaling_scenario or SCALING_SCENARIO[mode]
    if sname.lower() != "none":
        if sname not in SCENARIOS:
            sys.exit(f"unknown scaling scenario {sname!r}")
        print(f"\nscaling: {sname} ...", file=sys.stderr, flush=True)
        scaling = run_scaling(env, sname, dtypes[0], args.seed, timing_kw, peaks)
        _data_cache.clear()
        gc.collect()

    # ---- report
    for d in dtypes:
        rows = [r for r in results if r["dtype"] == d.name]
        if not rows:
            continue
        print(f"\n== ragged_dot {d.name}: GFLOP/s (median), raggeddot threads={rd_threads}, "
              f"NumPy threads={blas.get('num_threads')}, FLOPs = 2*sum(gs)*k*n (np-dense: 2*m*k*n)")
        print(results_table(rows))
        notes = notes_for(rows)
        cont = [r["scenario"] for r in rows if any(vr.get("contended") for vr in r["variants"].values())]
        if cont:
            notes.append(f"  * got < {CONTENDED_SHARE:.0%} of its threads' CPU time (other processes), or > {STOLEN_SHARE:.0%} "
                         f"was stolen by the hypervisor, while timed: figure unreliable  "
                         f"[{', '.join(cont) if len(cont) <= 4 else f'{len(cont)} scenarios'}]")
        if notes:
            print("notes:")
            print("\n".join(notes))

    if scaling is not None:
        print("\n== scaling (raggeddot threads)")
        if scaling.get("status") != "ok":
            print(f"  n/a: {scaling.get('reason')}")
        else:
            srows = []
            for t, vr in scaling["threads"].items():
                srows.append([t, vr.get("actual_threads", "-"), cell({"variants": {"x": vr}}, "x"),
                              C.fmt_num(vr.get("median_s", math.nan) * 1e3, 2) if vr.get("status") == "ok" else "-",
                              C.fmt_num(vr.get("pct_peak"), 0) if vr.get("pct_peak") is not None else "n/a"])
            print(f"  {scaling['scenario']} ({scaling['dtype']}, m={scaling['m']} k={scaling['k']} n={scaling['n']} g={scaling['g']})")
            print("  " + C.format_table(["threads", "actual", "GFLOP/s", "ms", "%peak"], srows, [">"] * 5).replace("\n", "\n  "))
            sp = scaling.get("speedup_2_vs_1")
            print(f"  2 vs 1 thread: {C.fmt_num(sp, 2) + 'x' if sp else 'n/a'}; "
                  f"bitwise identical across thread counts: {scaling.get('bitwise_identical_across_threads', 'n/a')}")

    probe_warnings += measured_above_peak(results, peaks, rd_threads, peak_isa)
    info["peak_warnings"] = probe_warnings
    targets = evaluate_targets(results, scaling, rd_threads)
    if probe_warnings:
        for t in targets:
            if "peak" in t["target"]:
                t["figure"] += "  [FMA peak probe suspect: see warnings]"
                t["peak_suspect"] = True
    if probe_warnings:
        print("\nFMA peak probe warnings (% peak is unreliable):")
        print("\n".join(f"  {w}" for w in probe_warnings))
    print("\n== targets")
    w = max(len(t["target"]) for t in targets)
    for t in targets:
        print(f"  {t['status']:7s}  {t['target']:{w}s}  {t['figure']}")

    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "bench_ragged_dot.json")
    png_path = os.path.join(args.out, "bench_ragged_dot.png")
    elapsed = time.perf_counter() - t_start
    C.write_json(json_path, {
        "benchmark": "ragged_dot",
        "machine": info,
        "config": {"mode": mode, "dtypes": [d.name for d in dtypes], "scenarios": names, "seed": args.seed,
                   "timing": timing_kw, "rel_tol": {k.name: v for k, v in C.REL_TOL.items()},
                   "jax_time_limit_s": jax_time_limit, "jax_max_mask_bytes": JAX_MAX_MASK_BYTES,
                   "argv": sys.argv[1:] if argv is None else list(argv)},
        "scenario_defs": {k: dict(zip(("m", "k", "n", "g", "pattern"), v)) for k, v in SCENARIOS.items()},
        "results": results,
        "scaling": scaling,
        "targets": targets,
        "elapsed_s": elapsed,
        "loadavg": {"start": load_start, "end": C.loadavg()},
    })
    print(f"\nwrote {json_path}")
    if not args.no_plot:
        err = plot(results, peaks, rd_threads, png_path, peak_label=peak_isa.upper())
        print(f"plot: {err}" if err else f"wrote {png_path}")
    print(f"total {elapsed:.0f} s; load average at start {load_start}, at end {C.loadavg()}")
    failed = [(r["scenario"], r["dtype"]) for r in results if r["variants"].get("raggeddot", {}).get("status") == "FAILED"]
    if failed:
        print(f"raggeddot FAILED the accuracy check on: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    C.run_main(main)

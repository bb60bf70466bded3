#!/usr/bin/env python
"""Benchmark raggeddot against NumPy and torch on the named specs of raggeddot.specs.

    python benchmarks/run.py ragged_dot   # ragged_dot(lhs [m,k], rhs [g,k,n], group_sizes [g])
    python benchmarks/run.py backward     # the forward + vjp step, and tgmm (the weight gradient)
    python benchmarks/run.py moe          # moe_block, forward and forward + backward
    python benchmarks/run.py quant        # ragged_dot on int8 / float8 operands (raggeddot.quantize)
    options: [--quick | --smoke] [--spec NAME/GLOB ...] [--tag TAG ...]
             [--dtype float32 float64 bfloat16 float16] [--quant MODE ...] [--threads N]
             [--kernel NAME] [--variants NAME ...] [--out DIR] [--list] ...

--quick runs the specs tagged 'quick' (or those --spec names; moe: at 1024 tokens) with
shorter timing; --smoke runs them at 1/16 of their sizes, each variant once, to show that the
whole run works (its figures mean nothing). --list shows the specs.

Every variant is first checked against the oracle (raggeddot.reference; for moe the NumPy
version, itself checked against raggeddot.reference on the first 48 tokens): every output it
returns within max |out - ref| / max |ref| <= 1e-4 float32, 1e-10 float64, 1e-2 bfloat16,
2e-3 float16 (the oracle's dtype: a float32 baseline of a 16-bit case is rounded to it first;
a quantized product's oracle is the reference product of the dequantized operands). A variant
that fails is reported FAILED and is not timed. Then raggeddot._timing.measure times it: the
median of an adaptive number of calls after warm-up (>= 3, ~0.75 s per variant; 0.2 s with
--quick), each variant in turn.

Columns (GFLOP/s, or ms for moe; '*': the variant got < 75% of its threads' CPU time, or
> 5% of the machine's CPU time was stolen, while timed: busy machine, figure unreliable)
  raggeddot        raggeddot (ragged_dot; vjp step; moe_block / moe_block_vjp)
  rd-prepacked     ragged_dot(lhs, raggeddot.prepack(rhs), gs), rhs packed once outside the timing
  np-dense         NumPy lhs @ rhs[0] on the same m, k, n: the dense roofline
  np-loop, numpy   NumPy, one np.matmul per group (moe: the whole layer, argsort + per-expert loop)
  NAME:skx         a NumPy variant timed in a separate process with OPENBLAS_CORETYPE=SkylakeX
                   (on CPUs with avx512f: OpenBLAS picks its half-speed AVX2 kernels on AMD
                   Zen5); the JSON has OpenBLAS's core name of every NumPy variant
  torch-dense      torch lhs @ rhs[0] in the case's dtype (the roofline of torch's matmul)
  torch-loop       the per-group loop in torch (backward: with autograd); torch-gmm: torch._grouped_mm
  hf-eager, hf-gmm moe: transformers' own sparse-MoE block of the family the spec's options
                   describe (Mixtral, Qwen3-MoE, DeepSeek-V3, gpt-oss), weights loaded from the
                   spec, eval mode; its experts run by the per-expert loop ("eager") or by
                   torch._grouped_mm ("grouped_mm", float32 only); forward under
                   torch.inference_mode, backward by autograd; float64 with float64 routing
  tgmm, tgmm-fresh tgmm(lhs.T, ct, gs), with raggeddot's result-buffer cache on / off (off: every
                   call pays the OS's zeroing of fresh pages, as NumPy does); forward: ragged_dot
16-bit cases (--dtype bfloat16 / float16; the inputs are the float32 draws rounded):
  raggeddot        on the 16-bit arrays, result in that dtype
  rd-f32           raggeddot float32 on the same values converted (outside the timing)
  rd-widen         raggeddot on the bfloat16 arrays with a float kernel family named, which
                   forces the widening path (float32 FMAs) where vdpbf16ps would run; moe too
  np-*             NumPy float32 on the converted values (NumPy has no fast 16-bit matmul)
  torch-*          torch in the 16-bit dtype (torch-gmm: where torch._grouped_mm runs it); moe
                   "torch": a per-expert loop, 16-bit experts, float32 router, forward only
  rd/f32           raggeddot 16-bit over raggeddot float32, GFLOP/s; %peak against the
                   native instruction's peak (vdpbf16ps) where measured, else the FMA peak
memory-bound specs (tag 'memory-bound' or <= 32 rows per group): GB/s = bytes of the weights
  of the groups with rows (rhs of every non-empty group, in the variant's storage, scales
  included) over the time; %bw = that over runtime.read_bandwidth() measured at start
quant (python benchmarks/run.py quant [--quant MODE ...], or ragged_dot --quant MODE): on the
  float32 specs, operands quantized by raggeddot.quantize outside the timing:
  int8             int8 x int8: lhs one scale per row, rhs one per group and output column
  int8-sub128      int8 x int8, scales per block of 128 along k on both operands
  int8w, fp8w      float32 lhs x int8 / float8_e4m3fn rhs, one scale per group and column
  int8w-prepacked, fp8w-prepacked  the same on raggeddot.prepack(rhs QArray) made outside the
                   timing: one byte a weight read in place, dequantized in the micro-kernel; its
                   GB/s counts the layout's bytes (values, panel padding, scales)
  rd-f32, rd-bf16  raggeddot float32, and bfloat16 on the inputs rounded
  torch-int8       torch._int_mm per group (int32), scales applied after ("int8")
  torch-int8w      torch._weight_int8pack_mm per group ("int8w")
  X/f32, X/bf16    mode X's GFLOP/s over rd-f32's / rd-bf16's; %fma: over the FMA peak; %vnni:
                   over the vpdpbusd peak (absent without AVX512_VNNI / AVX-VNNI)
  best, best_is    the fastest baseline computing the same thing: every NumPy flavour, torch
                   and (moe) transformers' blocks
  rd/X             raggeddot's GFLOP/s over X's (moe: X's time over raggeddot's); rd/best over
                   'best', rd/loop over the best NumPy loop, rd/dense over the best np-dense
  %peak            raggeddot's GFLOP/s over the FMA peak measured at start (runtime.peak_gflops)
                   of the kernel's ISA at raggeddot's thread count (float64: half)
FLOPs: 2*sum(group_sizes)*k*n per grouped product (the step makes three); np-dense counts its
own 2*m*k*n; moe counts 3 expert products of 2*T*top_k*d*f, the router and the shared expert
(forward + backward: 3x the forward). The ragged_dot run also times raggeddot at 1..ncpu
threads on one spec (results must be bitwise identical). Targets come from targets.toml.
Outputs: tables on stdout, <out>/bench_<benchmark>.json (machine info included).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import report  # noqa: E402
import variants as V  # noqa: E402

import raggeddot  # noqa: E402
from raggeddot import runtime, specs  # noqa: E402
from raggeddot._timing import call_time, measure, summary  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SCALING_SPEC = {"full": "qwen3-m16384-g128-balanced", "quick": "qwen3-m4096-g128-balanced"}
SMOKE_SCALE = 1 / 16
#: tags the runner selects specs by (tests check they exist)
TAGS_USED = ("quick",)
#: raggeddot's own variants: one that fails its check makes the run fail
OURS = ("raggeddot", "tgmm", "tgmm-fresh", "forward", "rd-f32", "rd-prepacked", "rd-widen", "rd-bf16",
        *V.QUANT_MODES, *(f"{mode}-prepacked" for mode in V.QUANT_PREPACKED))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("benchmark", choices=specs.OPS + ("quant",))
    p.add_argument("--quick", action="store_true", help="the specs tagged 'quick', shorter timing")
    p.add_argument("--smoke", action="store_true", help="--quick at 1/16 size, one run per variant (checks the run)")
    p.add_argument("--spec", nargs="+", metavar="NAME", default=(), help="spec names or globs (e.g. 'qwen3-*')")
    p.add_argument("--tag", nargs="+", default=(), help="only specs with all these tags (e.g. primary)")
    p.add_argument("--dtype", nargs="+", choices=list(specs.DTYPES), default=["float32"],
                   help="quant: ignored (float32 specs, quantized)")
    p.add_argument("--quant", nargs="+", choices=list(V.QUANT_MODES), default=None,
                   help="quantized modes (implies the quant benchmark; default there: all)")
    p.add_argument("--threads", type=int, default=None, help="raggeddot threads (default: its own)")
    p.add_argument("--kernel", default=None, help="raggeddot micro-kernel family (runtime.runnable_kernels())")
    p.add_argument("--variants", nargs="+", metavar="NAME", help="only these variants (raggeddot always runs)")
    p.add_argument("--scale", type=float, default=None, help="multiply every spec's sizes by this")
    p.add_argument("--coretype", default="SkylakeX",
                   help="OPENBLAS_CORETYPE of the second NumPy timing on avx512f CPUs ('none': skip it)")
    p.add_argument("--target-time", type=float, default=None, help="seconds of timed runs per variant")
    p.add_argument("--scaling-spec", default=None, help="spec of the thread-scaling section ('none' to skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=DEFAULT_OUT, help="output directory (default benchmarks/results/)")
    p.add_argument("--list", action="store_true", help="list the specs and exit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quant and args.benchmark != "quant":
        if args.benchmark != "ragged_dot":
            p.error(f"--quant goes with the ragged_dot or quant benchmark, not {args.benchmark}")
        args.benchmark = "quant"
    if args.benchmark == "quant":
        args.quant, args.dtype = list(args.quant or V.QUANT_MODES), ["float32"]
    args.quick = args.quick or args.smoke
    args.mode = "quick" if args.quick else "full"
    if args.scale is None:
        args.scale = SMOKE_SCALE if args.smoke else 1.0
    return args


def timing_options(args) -> dict:
    """Runs per variant: ~target_s of runs (>= min_runs, <= max_runs) after `warmup` calls
    besides the checking call; a variant whose checking call took > slow_s gets no warm-up and
    may get 1 run, > single_s: the checking call is its only sample."""
    if args.smoke:
        return dict(target_s=0.0, min_runs=1, max_runs=1, warmup=0, slow_s=1.0, single_s=2.5)
    quick = args.quick
    return dict(target_s=args.target_time if args.target_time is not None else (0.2 if quick else 0.75),
                min_runs=3, max_runs=50 if quick else 200, warmup=0 if quick else 1,
                slow_s=1.0 if quick else 3.0, single_s=2.5 if quick else 8.0)


# ----------------------------------------------------------------------------------------------
# One variant: check, then time


def timed(fn, first_s: float, opts: dict) -> dict:
    """The summary of _timing.measure(fn) (see timing_options), with the process's CPU use and
    the machine's stolen time over the timed calls; first_s: the time of the checking call."""
    if first_s > opts["single_s"]:
        return {"median_s": first_s, "min_s": first_s, "runs": 1, "times_s": [first_s], "single_sample": True}
    slow = first_s > opts["slow_s"]
    for _ in range(0 if slow else opts["warmup"]):
        first_s = call_time(fn)[1]
    st0, c0, w0 = C.steal_seconds(), time.process_time(), time.perf_counter()
    times = measure(fn, first_s=first_s, min_runs=1 if slow else opts["min_runs"], max_runs=opts["max_runs"],
                    target_s=opts["target_s"])
    util = (time.process_time() - c0) / max(time.perf_counter() - w0, 1e-9)
    st1, s = C.steal_seconds(), summary(times)
    return {"median_s": s["median"], "min_s": s["min"], "spread": s["spread"], "runs": s["runs"], "warmup_s": first_s,
            "cpu_util": util, "steal_s": st1 - st0 if None not in (st0, st1) else None, "times_s": times}


def is_contended(vr: dict, threads: int | None) -> bool:
    """< 75% of `threads` CPUs' time, or > 5% of the machine's CPU time stolen, while timed."""
    u, st, wall = vr.get("cpu_util"), vr.get("steal_s"), sum(vr.get("times_s", ())) or math.nan
    low = threads is not None and u is not None and u < report.CONTENDED_SHARE * threads
    stolen = st is not None and st > report.STOLEN_SHARE * wall * (os.cpu_count() or 1)
    return bool(low or stolen)


def peak_extra_memory(fn) -> int:
    """Peak bytes traced by tracemalloc during one call (result included), above the start."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        r = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del r
    finally:
        tracemalloc.stop()
    return peak - base


def run_variant(v: V.Variant, fn, c: V.Case, opts: dict, threads: int | None) -> dict:
    """The variant's record: its check against the oracle, then its timing; on a memory-bound
    case also the weight bytes it reads per second; `threads`: the CPUs it should keep busy."""
    rec, first = V.check(v, fn, c)
    if rec["status"] != "ok":
        return rec
    time.sleep(0.05)
    rec.update(first_call_s=first, **timed(fn, first, opts))
    rec.update(flops=c.flops[v.flops], gflops=c.flops[v.flops] / rec["median_s"] / 1e9)
    rec["contended"] = is_contended(rec, threads)
    if c.spec.op == "ragged_dot" and c.memory_bound and v.flops == "flops":
        rec["weight_bytes"] = c.weight_bytes(v)
        rec["weight_gbs"] = rec["weight_bytes"] / rec["median_s"] / 1e9
    if v.memory:
        rec["peak_extra_bytes"] = peak_extra_memory(fn)
    return rec


# ----------------------------------------------------------------------------------------------
# One spec


def resize(spec: specs.Spec, args) -> specs.Spec:
    return spec.resized(args.scale, **(spec.quick_shape if args.quick else {}))


def run_case(c: V.Case, chosen: list, opts: dict, ctx: dict, log, bench: str | None = None) -> dict:
    spec, op = c.spec, c.spec.op
    rec = {"spec": spec.name, "op": op, "dtype": c.dtype.name, "shape": spec.shape, "tags": sorted(spec.tags),
           "flops": c.flops, "variants": {s: {} for s in V.SECTIONS[bench or op]}, "memory_bound": c.memory_bound}
    if op == "moe":
        rec.update(note=spec.note, numpy_vs_reference=c.extra["numpy_vs_reference"],
                   options={k: v if isinstance(v, (bool, int, float, str)) else "array" for k, v in
                            c.inputs["options"].items()})
    else:
        gs = c.inputs["group_sizes"]
        rec.update(pattern=spec.pattern, group_sizes=gs.tolist(), rows=int(gs.sum()),
                   empty_groups=int((gs == 0).sum()), max_group=int(gs.max()))
    for v in chosen:
        try:
            fn = v.build(c)
        except V.Skip as s:
            rec["variants"][v.section][v.name] = {"status": "skip", "reason": str(s)}
            continue
        big = c.flops[v.flops] >= 1e9  # OpenBLAS may run small products on one thread
        vr = run_variant(v, fn, c, opts, {"rd": ctx["rd_threads"], "blas": ctx["blas_threads"] if big else None}
                         .get(v.threads))
        del fn
        gc.collect()
        if vr["status"] == "FAILED":
            log(f"  {spec.name} [{c.dtype.name}] {v.section} {v.name}: FAILED ({vr.get('reason')})")
        if v.numpy:
            vr["blas_core"] = C.blas_core()
        rec["variants"][v.section][v.name] = vr
    return rec


def coretype_run(args, spec: specs.Spec, dtype: str, coretype: str, log) -> dict:
    """The NumPy variants of ``spec`` timed in a fresh process with OPENBLAS_CORETYPE set (it
    is read when OpenBLAS loads): {section: {name:<flavour>: record}}."""
    cmd = [sys.executable, os.path.abspath(__file__), spec.op, "--worker", "--spec", spec.name, "--dtype", dtype,
           "--seed", str(args.seed), "--scale", repr(args.scale)]
    cmd += ["--smoke"] if args.smoke else ["--quick"] if args.quick else []
    cmd += ["--target-time", repr(args.target_time)] if args.target_time is not None else []
    cmd += ["--variants", *args.variants] if args.variants else []
    time.sleep(0.05)
    p = subprocess.run(cmd, env=dict(os.environ, OPENBLAS_CORETYPE=coretype), capture_output=True, text=True)
    flavour = "skx" if coretype == "SkylakeX" else coretype.lower()
    try:
        found = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        why = (p.stderr.strip().splitlines() or ["no output"])[-1][:200]
        log(f"  {spec.name} [{dtype}] OPENBLAS_CORETYPE={coretype}: failed ({why})")
        return {s: {f"{v.name}:{flavour}": {"status": "FAILED", "reason": f"worker: {why}"}
                    for v in V.VARIANTS[spec.op] if v.numpy and v.section == s} for s in V.SECTIONS[spec.op]}
    return {s: {f"{name}:{flavour}": vr for name, vr in sec.items()} for s, sec in found.items()}


def run_scaling(name: str, dtype: str, args, opts, peaks: dict, log) -> dict:
    """raggeddot.ragged_dot at 1..ncpu threads on one spec: speed-up and bitwise identity."""
    spec = resize(specs.get(name), args)
    c = V.prepare(spec, dtype, args.seed, {"out"})
    v = V.variant("ragged_dot", "raggeddot")
    res, outs = {"spec": name, "dtype": dtype, "describe": spec.describe(), "threads": {}}, []
    for t in range(1, (os.cpu_count() or 1) + 1):
        with runtime.configured(num_threads=t):
            vr = run_variant(v, v.build(c), c, opts, t)
            vr["actual_threads"] = runtime.get_num_threads()
            if vr["status"] == "ok":
                p = (peaks or {}).get(str(t))
                vr["pct_peak"] = 100 * vr["gflops"] / (p / (2 if dtype == "float64" else 1)) if p else None
                outs.append(raggeddot.ragged_dot(c.inputs["lhs"], c.inputs["rhs"], c.inputs["group_sizes"]))
            else:
                log(f"  scaling {name} at {t} threads: {vr['status']} ({vr.get('reason')})")
        res["threads"][str(t)] = vr
    g = [res["threads"].get(t, {}).get("gflops") for t in ("1", "2")]
    res["speedup_2_vs_1"] = g[1] / g[0] if None not in g else None
    if len(outs) > 1:
        res["bitwise_identical_across_threads"] = all(np.array_equal(outs[0], o) for o in outs[1:])
    return res


# ----------------------------------------------------------------------------------------------


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def select_variants(op: str, args) -> list:
    """The variants of ``op`` named by --variants (all when not given; raggeddot always;
    quant: rd-f32 always, and only the variants of the --quant modes)."""
    unknown = set(args.variants or ()) - {v.name for v in V.VARIANTS[op]}
    if unknown:
        sys.exit(f"unknown {op} variants {sorted(unknown)}; known: {sorted({v.name for v in V.VARIANTS[op]})}")
    keep = set(args.variants or ()) | {"raggeddot", "rd-f32"}
    modes = set(args.quant or ())
    return [v for v in V.VARIANTS[op] if (not args.variants or v.name in keep)
            and (op != "quant" or v.mode is None or v.mode in modes)]


def worker(args) -> int:
    """Run the NumPy variants of one spec; print {section: {name: record}} as JSON."""
    spec, dtype = specs.get(args.spec[0]), args.dtype[0]
    chosen = [v for v in select_variants(spec.op, args) if v.numpy]
    c = V.prepare(resize(spec, args), dtype, args.seed, set().union(*(v.refs for v in chosen)))
    ctx = {"rd_threads": None, "blas_threads": C.numpy_blas_info()["num_threads"]}
    rec = run_case(c, chosen, timing_options(args), ctx, log)
    print(json.dumps({s: sec for s, sec in rec["variants"].items() if sec}, default=float))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    op = args.benchmark
    spec_op = "ragged_dot" if op == "quant" else op
    try:
        quick = ["quick"] if args.quick and not args.spec else []
        chosen_specs = specs.select(spec_op, args.spec, list(args.tag) + quick)
    except ValueError as e:
        sys.exit(str(e))
    if args.list:
        for s in specs.select(spec_op):
            print(f"{s.name:34s} {s.describe():44s} {' '.join(sorted(s.tags))}")
        return 0
    with runtime.configured(kernel=args.kernel, num_threads=args.threads):
        if args.worker:
            return worker(args)
        return run(args, op, chosen_specs)


def environment(args, op: str, chosen: list) -> tuple[dict, dict]:
    """(context of the figures, machine info): the yardsticks (ragged_dot and quant: measured
    first, while this process is quiet), thread counts, torch's version where a variant uses it."""
    ys = {}
    if op in ("ragged_dot", "quant"):
        ys = C.yardsticks(0.02 if args.smoke else 0.2 if args.quick else 0.5, *((0.05, 64) if args.smoke else (0.5, 256)))
    warnings = []
    la = C.loadavg()
    if la and la[0] >= 1.0:
        warnings.append(f"load average {la[0]:.2f} before the run: other processes are busy, multi-threaded "
                        "figures will be low and noisy")
    torch = None
    if any(v.name.startswith(("torch", "hf-")) for v in chosen):
        try:
            import torch
        except Exception as e:  # noqa: BLE001 - an optional baseline
            warnings.append(f"torch not importable: {type(e).__name__}")
    blas = C.numpy_blas_info()
    cpu_flags = C.cpu_info()["flags"]
    info = C.machine_info(dict(ys, warnings=warnings, torch={"version": torch.__version__,
                                                             "threads": torch.get_num_threads()} if torch else None,
                               coretype=args.coretype if args.coretype.lower() != "none" and "avx512f" in cpu_flags
                               else None))
    ctx = dict(ys, rd_threads=runtime.get_num_threads(), blas_threads=blas["num_threads"],
               read_gbs=ys["read_bandwidth"]["gbs"] if ys else None)
    return ctx, info


def run(args, op: str, chosen_specs: list) -> int:
    t_start = time.perf_counter()
    opts, chosen = timing_options(args), select_variants(op, args)
    ctx, info = environment(args, op, chosen)
    report.print_header(info)
    print(f"{op}: {len(chosen_specs)} specs x {len(args.dtype)} dtypes; mode {'smoke' if args.smoke else args.mode}; "
          f"scale {args.scale:g}; seed {args.seed}", flush=True)
    records, cache = [], {}
    jobs = [(d, s) for d in args.dtype for s in chosen_specs if d in s.dtypes]
    needed = set().union(*(v.refs for v in chosen))
    for i, (dtype, spec) in enumerate(jobs):
        log(f"[{op} {i + 1}/{len(jobs)}] {spec.name} {dtype}")
        try:
            c = V.prepare(resize(spec, args), dtype, args.seed, needed, cache)
            rec = run_case(c, chosen, opts, ctx, log, op)
            if op == "moe":
                rec["gathers"] = V.run_gathers(c, lambda fn: timed(fn, call_time(fn)[1], opts))
            del c
            gc.collect()
            if info["coretype"] and any(v.numpy for v in chosen):
                for section, found in coretype_run(args, spec, dtype, info["coretype"], log).items():
                    rec["variants"][section].update(found)
        except MemoryError:
            log(f"  {spec.name} [{dtype}]: out of memory, skipped")
            continue
        report.derive(op, rec, ctx)
        records.append(rec)
    cache.clear()
    gc.collect()

    scaling = None
    sname = args.scaling_spec or SCALING_SPEC[args.mode]
    if op == "ragged_dot" and sname.lower() != "none":
        log(f"scaling: {sname} ...")
        sdtype = "float32" if "float32" in args.dtype else args.dtype[0]
        # the yardstick of the dtype's product: the FMA peak, or vdpbf16ps's for bfloat16 where measured
        native = ctx["native_peaks"].get(sdtype, {}).get("gflops")
        scaling = run_scaling(sname, sdtype, args, opts, native or ctx["peaks"][ctx["peak_isa"]], log)

    result = {"benchmark": op, "machine": info,
              "config": {"mode": args.mode, "smoke": args.smoke, "scale": args.scale, "dtypes": args.dtype,
                         "specs": [s.name for s in chosen_specs], "variants": [v.name for v in chosen],
                         "seed": args.seed, "timing": opts, "quant": args.quant,
                         "rel_tol": {k.name: v for k, v in specs.REL_TOL.items()},
                         "quant_modes": {k: V.QUANT_MODES[k] for k in args.quant or ()}, "argv": sys.argv[1:]},
              "specs": {s.name: {"op": s.op, "shape": s.shape, "pattern": s.pattern, "tags": sorted(s.tags),
                                 "note": s.note} for s in chosen_specs},
              "results": records, "scaling": scaling}
    result["targets"] = report.evaluate(op, records, scaling, ctx)
    report.print_run(result)
    result.update(elapsed_s=time.perf_counter() - t_start, loadavg_end=C.loadavg())
    path = os.path.join(args.out, f"bench_{op}.json")
    C.write_json(path, result)
    print(f"\nwrote {path}")
    print(f"total {result['elapsed_s']:.0f} s; load average at start {info['loadavg_start']}, at end "
          f"{result['loadavg_end']}")
    failed = [(r["spec"], r["dtype"], s, name) for r in records for s, sec in r["variants"].items()
              for name, vr in sec.items() if name in OURS and vr["status"] == "FAILED"]
    if failed:
        print(f"raggeddot FAILED the accuracy check on: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)

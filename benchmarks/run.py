#!/usr/bin/env python
"""Benchmark raggeddot against NumPy and torch on the named specs of raggeddot.specs.

    python benchmarks/run.py ragged_dot   # ragged_dot(lhs [m,k], rhs [g,k,n], group_sizes [g])
    python benchmarks/run.py backward     # the forward + vjp step, and tgmm (the weight gradient)
    python benchmarks/run.py moe          # moe_block, forward and forward + backward
    python benchmarks/run.py quant        # ragged_dot on int8 / float8 operands (raggeddot.quantize)
    python benchmarks/run.py lowp         # bfloat16 / int8 products against float32 and torch
    python benchmarks/run.py experts      # transformers' experts implementations in a model
    python benchmarks/run.py jax          # raggeddot.jax's custom calls against jax.lax
    python benchmarks/run.py decode       # the few-token products of serving (benchmarks/decode.py)
(the last four: benchmarks/suites.py, their variants timed in interleaved rounds)

--quick: the specs tagged 'quick' (or --spec; moe at 1024 tokens), shorter timing; --smoke: those
at 1/16 of their sizes, each variant once (checks the run; its figures mean nothing). Every
variant is checked first against the oracle (raggeddot.reference; moe: the NumPy layer, itself
checked against raggeddot.reference on 48 tokens; quant: the reference product of the
dequantized operands): max |out - ref| / max |ref| within 1e-4 float32, 1e-10 float64, 1e-2
bfloat16, 2e-3 float16, else it is FAILED and not timed. Then _timing.measure times it: the
median of >= 3 calls after warm-up (~0.75 s a variant, 0.2 s with --quick). '*': while timed, it
got < 75% of its threads' CPU time or > 5% of the CPU time was stolen (unreliable figure).

Variants (GFLOP/s; moe: ms). 16-bit cases hold the float32 draws rounded; "f32" variants run
float32 on those values and their results are rounded for the check:
  raggeddot        ragged_dot; the vjp step; moe_block / moe_block_vjp
  rd-prepacked     ragged_dot(lhs, raggeddot.prepack(rhs), gs), rhs packed outside the timing
  rd-f32, rd-widen raggeddot float32 on a 16-bit case's values; raggeddot with the widening path
                   (float32 FMAs) forced where the dot kernels would run
  rd-vdpbf16       raggeddot on the vdpbf16ps family named (where the CPU has it), whatever auto takes
  np-dense         NumPy lhs @ rhs[0] on the same m, k, n: the dense roofline (2*m*k*n FLOPs)
  np-loop, numpy   NumPy float32, a matmul per group (moe: the layer, argsort + expert loop)
  NAME:skx         the NumPy variant in a process with OPENBLAS_CORETYPE=SkylakeX (avx512f CPUs,
                   where OpenBLAS may pick its AVX2 kernels, as on AMD Zen5; --coretype)
  torch-*          torch lhs @ rhs[0], a matmul per group, torch._grouped_mm; moe "torch":
                   transformers' eager expert loop (the softmax specs), float32 router, the
                   experts in the case's dtype, backward by autograd
  tgmm, -fresh     tgmm(lhs.T, ct, gs), raggeddot's result-buffer cache on / off (off: a call
                   pays the OS's zeroing of new pages, as NumPy does); forward: ragged_dot
  quant modes      int8 (int8 x int8, a scale per row and per group column), int8-sub128 (scales
                   per 128 along k), int8w / fp8w (float32 x int8 / float8_e4m3fn weights),
                   -prepacked (weights prepacked outside the timing); rd-f32: raggeddot float32;
                   torch-int8: torch._int_mm per group
Figures: best, best_is: the fastest baseline; rd/X: raggeddot's GFLOP/s over X's (moe: X's time
over raggeddot's); %peak: of the peak measured at start at raggeddot's threads: the FMA of the
kernel's ISA (float64: half), for bfloat16 and int8 (%vnni) the instruction serving them
(TDPBF16PS / TDPBUSD (AMX), vdpbf16ps, vpdpbusd); GB/s (memory-bound specs: <= 32 rows a
group): the weight bytes of the groups with rows (in the variant's storage, scales included) a
second, %bw: of runtime.read_bandwidth() measured at start. moe FLOPs: 3 products of
2*T*top_k*d*f, the router, the shared expert (backward: 3x). ragged_dot also times raggeddot at
1..ncpu threads on one spec (results bitwise identical). Targets: targets.toml. Output: tables,
<out>/bench_<benchmark>.json.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc

import numpy as np

import common as C
import raggeddot
import report
import suites
import variants as V
from raggeddot import runtime, specs
from raggeddot._timing import call_time, measure, summary

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SCALING_SPEC = {"full": "qwen3-m16384-g128-balanced", "quick": "qwen3-m4096-g128-balanced"}
#: tags the runner selects specs by (tests check they exist)
TAGS_USED = ("quick",)
#: raggeddot's own variants: one that fails its check makes the run fail
OURS = ("raggeddot", "tgmm", "tgmm-fresh", "forward", "rd-f32", "rd-prepacked", "rd-widen", "rd-vdpbf16",
        *V.QUANT_MODES, *(f"{mode}-prepacked" for mode in V.QUANT_PREPACKED))


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("benchmark", choices=specs.OPS + ("quant", *suites.SUITES))
    p.add_argument("--quick", action="store_true", help="the specs tagged 'quick', shorter timing")
    p.add_argument("--smoke", action="store_true", help="--quick at 1/16 size, one run a variant")
    p.add_argument("--spec", nargs="+", metavar="NAME", default=(), help="spec names or globs ('qwen3-*')")
    p.add_argument("--tag", nargs="+", default=(), help="only specs with all these tags (e.g. primary)")
    p.add_argument("--dtype", nargs="+", choices=list(specs.DTYPES), default=["float32"],
                   help="quant: ignored (float32 specs, quantized)")
    p.add_argument("--quant", nargs="+", choices=list(V.QUANT_MODES), default=None,
                   help="quant: the quantized modes (default: all)")
    p.add_argument("--threads", type=int, default=None, help="raggeddot threads (default: its own)")
    p.add_argument("--kernel", default=None, help="raggeddot kernel family (runtime.runnable_kernels())")
    p.add_argument("--variants", nargs="+", metavar="NAME", help="only these variants (and raggeddot)")
    p.add_argument("--scale", type=float, default=None, help="multiply every spec's sizes by this")
    p.add_argument("--coretype", default="SkylakeX",
                   help="OPENBLAS_CORETYPE of the second NumPy timing on avx512f CPUs ('none': skip it)")
    p.add_argument("--target-time", type=float, default=None, help="seconds of timed runs per variant")
    p.add_argument("--scaling-spec", default=None, help="spec of the thread-scaling section ('none' to skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=None, help="suites: interleaved rounds")
    p.add_argument("--out", default=DEFAULT_OUT, help="output directory (default benchmarks/results/)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.benchmark == "quant":
        args.quant, args.dtype = list(args.quant or V.QUANT_MODES), ["float32"]
    args.quick = args.quick or args.smoke
    args.mode = "quick" if args.quick else "full"
    args.scale = args.scale or (1 / 16 if args.smoke else 1.0)
    return args


def timing_options(args) -> dict:
    """Runs a variant: ~target_s of them (>= min_runs, <= max_runs) after `warmup` calls; a checking
    call over slow_s: no warm-up, maybe 1 run; over single_s: the checking call is the sample."""
    if args.smoke:
        return dict(target_s=0.0, min_runs=1, max_runs=1, warmup=0, slow_s=1.0, single_s=2.5)
    q = args.quick
    return dict(target_s=args.target_time if args.target_time is not None else (0.2 if q else 0.75), min_runs=3,
                max_runs=50 if q else 200, warmup=0 if q else 1, slow_s=1.0 if q else 3.0, single_s=2.5 if q else 8.0)


def timed(fn, first_s: float, opts: dict, threads: int | None = None) -> dict:
    """The summary of _timing.measure(fn) (first_s: the checking call's time); 'contended': the
    process got < 75% of `threads` CPUs' time, or > 5% of the CPU time was stolen, while timed."""
    if first_s > opts["single_s"]:
        return {"median_s": first_s, "min_s": first_s, "runs": 1, "times_s": [first_s], "single_sample": True}
    slow = first_s > opts["slow_s"]
    for _ in range(0 if slow else opts["warmup"]):
        first_s = call_time(fn)[1]
    st0, c0, w0 = C.steal_seconds(), time.process_time(), time.perf_counter()
    times = measure(fn, first_s=first_s, min_runs=1 if slow else opts["min_runs"], max_runs=opts["max_runs"],
                    target_s=opts["target_s"])
    wall, st1, s = time.perf_counter() - w0, C.steal_seconds(), summary(times)
    util, stolen = (time.process_time() - c0) / max(wall, 1e-9), st1 - st0 if None not in (st0, st1) else None
    contended = (threads is not None and util < report.CONTENDED_SHARE * threads
                 or stolen is not None and stolen > report.STOLEN_SHARE * wall * (os.cpu_count() or 1))
    return {"median_s": s["median"], "min_s": s["min"], "spread": s["spread"], "runs": s["runs"],
            "times_s": times, "warmup_s": first_s, "cpu_util": util, "steal_s": stolen,
            "contended": bool(contended)}


def peak_extra_memory(fn) -> int:
    """Peak bytes traced by tracemalloc during one call (result included), above the start."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def run_variant(v: V.Variant, fn, c: V.Case, opts: dict, threads: int | None) -> dict:
    """The variant's record: its check against the oracle, then its timing; on a memory-bound
    case also the weight bytes it reads per second; `threads`: the CPUs it should keep busy."""
    rec, first = V.check(v, fn, c)
    if rec["status"] != "ok":
        return rec
    time.sleep(0.05)
    rec.update(first_call_s=first, **timed(fn, first, opts, threads))
    rec.update(flops=c.flops[v.flops], gflops=c.flops[v.flops] / rec["median_s"] / 1e9)
    if c.spec.op == "ragged_dot" and c.memory_bound and v.flops == "flops":
        rec["weight_bytes"] = c.weight_bytes(v)
        rec["weight_gbs"] = rec["weight_bytes"] / rec["median_s"] / 1e9
    if v.memory:
        rec["peak_extra_bytes"] = peak_extra_memory(fn)
    return rec


def resize(spec: specs.Spec, args) -> specs.Spec:
    return spec.resized(args.scale, **(spec.quick_shape if args.quick else {}))


def run_case(c: V.Case, chosen: list, opts: dict, ctx: dict, bench: str | None = None) -> dict:
    spec, op = c.spec, c.spec.op
    rec = {"spec": spec.name, "op": op, "dtype": c.dtype.name, "shape": spec.shape, "tags": sorted(spec.tags),
           "flops": c.flops, "variants": {s: {} for s in V.SECTIONS[bench or op]}}
    if op == "moe":
        rec.update(note=spec.note, numpy_vs_reference=c.extra["numpy_vs_reference"],
                   options={k: v if isinstance(v, (bool, int, float, str)) else "array" for k, v in
                            c.inputs["options"].items()})
    else:
        rec.update(pattern=spec.pattern, group_sizes=c.inputs["group_sizes"].tolist())
    for v in chosen:
        try:
            fn = v.build(c)
        except V.Skip as s:
            rec["variants"][v.section][v.name] = {"status": "skip", "reason": str(s)}
            continue
        big = c.flops[v.flops] >= 1e9  # OpenBLAS may run small products on one thread
        threads = {"rd": ctx["rd_threads"], "blas": ctx["blas_threads"] if big else None}.get(v.threads)
        vr = run_variant(v, fn, c, opts, threads)
        del fn
        gc.collect()
        if vr["status"] == "FAILED":
            log(f"  {spec.name} [{c.dtype.name}] {v.section} {v.name}: FAILED ({vr.get('reason')})")
        if v.numpy:
            vr["blas_core"] = C.numpy_blas_info()["corename"]
        rec["variants"][v.section][v.name] = vr
    return rec


def coretype_run(args, spec: specs.Spec, dtype: str, coretype: str) -> dict:
    """The NumPy variants of ``spec`` timed in a fresh process with OPENBLAS_CORETYPE set (it
    is read when OpenBLAS loads): {section: {name:<flavour>: record}}."""
    cmd = [sys.executable, os.path.abspath(__file__), spec.op, "--worker", "--spec", spec.name,
           "--dtype", dtype, "--seed", str(args.seed), "--scale", repr(args.scale)]
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


def run_scaling(name: str, dtype: str, args, opts, peaks: dict) -> dict:
    """raggeddot.ragged_dot at 1..ncpu threads on one spec: speed-up and bitwise identity."""
    spec = resize(specs.get(name), args)
    c = V.prepare(spec, dtype, args.seed, {"out"})
    v = V.variant("ragged_dot", "raggeddot")
    res, outs = {"spec": name, "dtype": dtype, "describe": spec.describe(), "threads": {}}, []
    for t in range(1, (os.cpu_count() or 1) + 1):
        with runtime.configured(num_threads=t):
            vr = res["threads"][str(t)] = dict(run_variant(v, v.build(c), c, opts, t),
                                               actual_threads=runtime.get_num_threads())
            if vr["status"] == "ok":
                p = (peaks or {}).get(str(t))
                vr["pct_peak"] = 100 * vr["gflops"] / (p / (2 if dtype == "float64" else 1)) if p else None
                outs.append(raggeddot.ragged_dot(c.inputs["lhs"], c.inputs["rhs"], c.inputs["group_sizes"]))
    g = [res["threads"].get(t, {}).get("gflops") for t in ("1", "2")]
    res["speedup_2_vs_1"] = g[1] / g[0] if None not in g else None
    if len(outs) > 1:
        res["bitwise_identical_across_threads"] = all(np.array_equal(outs[0], o) for o in outs[1:])
    return res


def select_variants(op: str, args) -> list:
    """The variants of ``op`` named by --variants (all when not given; raggeddot always;
    quant: rd-f32 always, and only the variants of the --quant modes)."""
    known = {v.name for v in V.VARIANTS[op]}
    if set(args.variants or ()) - known:
        sys.exit(f"unknown {op} variants {sorted(set(args.variants) - known)}; known: {sorted(known)}")
    keep = set(args.variants or ()) | {"raggeddot", "rd-f32"}
    return [v for v in V.VARIANTS[op] if (not args.variants or v.name in keep)
            and (op != "quant" or v.mode is None or v.mode in args.quant)]


def worker(args) -> int:
    """Run the NumPy variants of one spec; print {section: {name: record}} as JSON."""
    spec, dtype = specs.get(args.spec[0]), args.dtype[0]
    chosen = [v for v in select_variants(spec.op, args) if v.numpy]
    c = V.prepare(resize(spec, args), dtype, args.seed, set().union(*(v.refs for v in chosen)))
    ctx = {"rd_threads": None, "blas_threads": C.numpy_blas_info()["num_threads"]}
    rec = run_case(c, chosen, timing_options(args), ctx)
    print(json.dumps({s: sec for s, sec in rec["variants"].items() if sec}, default=float))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    op = args.benchmark
    try:
        quick = ["quick"] if args.quick and not args.spec else []
        chosen = [] if op in suites.SUITES else specs.select(
            "ragged_dot" if op == "quant" else op, args.spec, list(args.tag) + quick)
    except ValueError as e:
        sys.exit(str(e))
    with runtime.configured(kernel=args.kernel, num_threads=args.threads):
        return run_suite(args, op) if op in suites.SUITES else worker(args) if args.worker else run(args, op, chosen)


def environment(args, op: str, chosen: list) -> tuple[dict, dict]:
    """(context of the figures, machine info): the yardsticks (ragged_dot and quant: measured
    first, while this process is quiet), thread counts, torch's version where a variant uses it."""
    ys, warnings, torch, la = {}, [], None, C.loadavg()
    if op in ("ragged_dot", "quant", "lowp"):
        seconds = 0.02 if args.smoke else 0.2 if args.quick else 0.5
        ys = C.yardsticks(seconds, *((0.05, 64) if args.smoke else ()))
    if la[0] >= 1.0:
        warnings.append(f"load average {la[0]:.2f} before the run: other processes are busy, multi-threaded "
                        "figures will be low and noisy")
    if any(v.name.startswith("torch") for v in chosen):
        try:
            import torch
        except Exception as e:  # noqa: BLE001 - an optional baseline
            warnings.append(f"torch not importable: {type(e).__name__}")
    skx = op not in suites.SUITES and args.coretype.lower() != "none" and "avx512f" in C.cpu_info()["flags"]
    torch = torch and {"version": torch.__version__, "threads": torch.get_num_threads()}
    info = C.machine_info(dict(ys, warnings=warnings, coretype=args.coretype if skx else None, torch=torch))
    ctx = dict(ys, rd_threads=runtime.get_num_threads(), blas_threads=info["numpy_blas"]["num_threads"],
               read_gbs=ys["read_bandwidth"]["gbs"] if ys else None)
    return ctx, info


def run_suite(args, op: str) -> int:
    """A suite of benchmarks/suites.py: its tables on stdout, <out>/bench_<op>.json."""
    fn, args.repeat = suites.SUITES[op][0], args.repeat or suites.SUITES[op][1]
    ctx, info = environment(args, op, [])
    report.print_header(info)
    C.write_json(os.path.join(args.out, f"bench_{op}.json"),
                 {"benchmark": op, "machine": info, "results": fn(args, ctx), "argv": sys.argv[1:]})
    return 0


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
        c = V.prepare(resize(spec, args), dtype, args.seed, needed, cache)
        rec = run_case(c, chosen, opts, ctx, op)
        if op == "moe":
            rec["gathers"] = V.run_gathers(c, lambda fn: timed(fn, call_time(fn)[1], opts))
        del c
        gc.collect()
        if info["coretype"] and any(v.numpy for v in chosen):
            for section, found in coretype_run(args, spec, dtype, info["coretype"]).items():
                rec["variants"][section].update(found)
        report.derive(op, rec, ctx)
        records.append(rec)
    cache.clear()
    gc.collect()
    scaling, sname = None, args.scaling_spec or SCALING_SPEC[args.mode]
    if op == "ragged_dot" and sname.lower() != "none":
        log(f"scaling: {sname} ...")
        sdtype = "float32" if "float32" in args.dtype else args.dtype[0]
        # the yardstick of the dtype's product: the FMA peak, or vdpbf16ps's for bfloat16 where measured
        native = ctx["native_peaks"].get(sdtype, {}).get("gflops")
        scaling = run_scaling(sname, sdtype, args, opts, native or ctx["peaks"][ctx["peak_isa"]])

    result = {"benchmark": op, "machine": info, "results": records, "scaling": scaling,
              "config": {"mode": args.mode, "smoke": args.smoke, "scale": args.scale, "dtypes": args.dtype,
                         "specs": [s.name for s in chosen_specs], "variants": [v.name for v in chosen],
                         "seed": args.seed, "timing": opts, "quant": args.quant, "argv": sys.argv[1:]}}
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
    sys.exit(main())

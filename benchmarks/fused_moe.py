"""moe_block with its experts' fused passes (the gate and up products in one pass with the
activation in their epilogue, the dispatch read while packing, the combine in the down
product's epilogue, the backward's d_a product with the activation's gradient in its epilogue;
with int8 weights and activation_qtype="int8", the gate and up products' one pass over rows the
kernels quantize once) against the same layer run as separate passes and against torch's expert loop (transformers'
eager loop, benchmarks/moe_baselines.py; forward, and forward+backward by autograd) in the same
dtype, in interleaved rounds (medians), each with its share of the peak of the instruction that
serves the dtype's products here (AMX tiles, vdpbf16ps or BFMMLA for bfloat16 where served, else
the FMA; benchmarks/common.py's NATIVE, measured at raggeddot's threads), and
the peak extra memory (RSS) of the forward, each in a process of its own. The fused and
separate passes give the same bits (checked first).

    python benchmarks/fused_moe.py [--T 2048 --d 2048 --f 768 --E 32 --top-k 4] [--rounds 7]
"""
import argparse
import os
import subprocess
import sys

import numpy as np

import raggeddot
from raggeddot._moe import experts
from raggeddot._timing import interleaved, summary

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402


def layer(args, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.T, args.d), dtype=np.float32).astype(dtype, copy=False)
    # the router in the layer's dtype too (a float32 one would make the whole layer float32,
    # the experts' products then on the widening FMA path, not the 16-bit kernels)
    router = (rng.standard_normal((args.d, args.E), dtype=np.float32) * np.float32(0.1)).astype(dtype)
    shapes = ((args.E, args.d, args.f), (args.E, args.d, args.f), (args.E, args.f, args.d))
    ws = []
    for s in shapes:      # no temporary as large as a weight (the peak measure starts after them)
        w = rng.standard_normal(s, dtype=np.float32)
        w *= np.float32(s[1] ** -0.5)
        ws.append(w.astype(dtype, copy=False))
    return x, router, ws, rng.standard_normal((args.T, args.d), dtype=np.float32)


def separate(fn):
    """fn with the experts' separate passes (the fused ones off)."""
    def run():
        real = experts._fused
        experts._fused = lambda *a: False
        try:
            return fn()
        finally:
            experts._fused = real
    return run


def torch_loop(args, x, router, ws, ct, dtype):
    """torch's expert loop on the layer's values (float32 router and inputs, weights in
    ``dtype``): ``(forward, forward+backward)``, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    from moe_baselines import torch_fn
    torch.set_num_threads(raggeddot.get_num_threads())
    f32 = lambda a: np.asarray(a, dtype=np.float32)  # noqa: E731
    i32 = {"x": f32(x), "router_weights": f32(router), "ct": f32(ct),
           "options": {"top_k": args.top_k, "norm_topk_prob": True}}
    i32.update(zip(("w0", "w1", "wo"), (f32(w) for w in ws)))
    name = "float32" if np.dtype(dtype) == np.float32 else "bfloat16"
    return torch_fn(torch, i32, False, name), torch_fn(torch, i32, True, name)


def serving_peak(dtype: str) -> tuple[str, float]:
    """(instruction, GFLOP/s at raggeddot's threads) of the instruction that serves ``dtype``'s
    products here (common.NATIVE: AMX tiles, vdpbf16ps, BFMMLA for bfloat16 where the family
    serving them has it), else the float32 FMA's (the widening path)."""
    from raggeddot import runtime
    family = runtime.build_info()["products"].get(dtype, {}).get("kernel") if dtype != "float32" else None
    insn, probes = C.NATIVE.get(dtype, {}).get(family, ("", ()))
    for isa in probes:
        gflops = runtime.peak_gflops(isa)
        if gflops:
            return insn, gflops
    return "FMA", max(runtime.peak_gflops(isa) or 0.0 for isa in ("avx512", "avx2", "neon"))


def timings(args):
    import ml_dtypes
    for dtype in (np.float32, ml_dtypes.bfloat16):
        name = np.dtype(dtype).name
        insn, peak = serving_peak(name)
        x, router, ws, ct = layer(args, dtype)
        kw = dict(top_k=args.top_k, norm_topk_prob=True)

        def fwd():
            return raggeddot.moe_block(x, router, *ws, **kw)

        def step():
            out, vjp_fn = raggeddot.moe_block_vjp(x, router, *ws, **kw)
            return vjp_fn(ct.astype(out.dtype))

        a, b = np.asarray(fwd()), np.asarray(separate(fwd)())
        if not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
            raise SystemExit("the fused and separate passes disagree")
        fns = {"fwd fused": fwd, "fwd separate": separate(fwd), "fwd+bwd fused": step,
               "fwd+bwd separate": separate(step)}
        loop = torch_loop(args, x, router, ws, ct, dtype)
        if loop is not None:
            fns.update({"fwd torch": loop[0], "fwd+bwd torch": loop[1]})
        times = interleaved(fns, rounds=args.rounds, warmup=1, pause_s=0.1)
        med = {n: summary(ts)["median"] for n, ts in times.items()}
        flops = 3 * 2 * args.T * args.top_k * args.d * args.f      # the forward's (the step's: 3x)

        def pct(n):
            return 100 * flops * (3 if n.startswith("fwd+bwd") else 1) / med[n] / 1e9 / peak

        print(f"{name} ({insn} peak {peak:.0f} GFLOP/s at these threads):")
        for step_name in ("fwd", "fwd+bwd"):
            fused = med[f"{step_name} fused"]
            parts = [f"fused {1e3 * fused:.1f} ms ({pct(step_name + ' fused'):.0f}% of peak)",
                     f"separate {1e3 * med[step_name + ' separate']:.1f} ms "
                     f"({pct(step_name + ' separate'):.0f}%): {med[step_name + ' separate'] / fused:.3f}x"]
            if loop is not None:
                parts.append(f"torch {1e3 * med[step_name + ' torch']:.1f} ms ({pct(step_name + ' torch'):.0f}%): "
                             f"{med[step_name + ' torch'] / fused:.3f}x")
            print(f"  {'forward' if step_name == 'fwd' else 'forward+backward'}: " + ", ".join(parts))


def w8a8_timings(args):
    """The float32 layer with int8 weights (a scale per expert and column) and
    activation_qtype="int8": the gate and up products one pass (the rows quantized by the
    kernels once for both) against the separate products, forward only, % of the int8
    instruction's peak."""
    insn, peak = serving_peak("int8")
    x, router, ws, _ = layer(args, np.float32)
    qs = [raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)) for w in ws]
    kw = dict(top_k=args.top_k, norm_topk_prob=True, activation_qtype="int8")

    def fwd():
        return raggeddot.moe_block(x, router, *qs, **kw)

    if not np.array_equal(np.asarray(fwd()).view(np.uint8), np.asarray(separate(fwd)()).view(np.uint8)):
        raise SystemExit("w8a8: the fused and separate passes disagree")
    times = interleaved({"fused": fwd, "separate": separate(fwd)}, rounds=args.rounds, warmup=1, pause_s=0.1)
    med = {n: summary(ts)["median"] for n, ts in times.items()}
    flops = 3 * 2 * args.T * args.top_k * args.d * args.f
    pct = {n: 100 * flops / t / 1e9 / peak for n, t in med.items()}
    print(f"w8a8 int8 weights x int8 rows ({insn} peak {peak:.0f} GOP/s at these threads):")
    print(f"  forward: fused {1e3 * med['fused']:.1f} ms ({pct['fused']:.0f}% of peak), separate "
          f"{1e3 * med['separate']:.1f} ms ({pct['separate']:.0f}%): {med['separate'] / med['fused']:.3f}x")


def high_water_kib():
    """This process's peak RSS (VmHWM: its own memory's, where getrusage's maxrss also counts
    a parent's from before the exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def peak(args, fused):
    """The extra RSS of one float32 forward, in this process (which makes nothing else big)."""
    raggeddot.set_buffer_cache(0)
    x, router, ws, _ = layer(args, np.float32)
    fwd = lambda: raggeddot.moe_block(x, router, *ws, top_k=args.top_k, norm_topk_prob=True)  # noqa: E731
    base = high_water_kib()
    (fwd if fused else separate(fwd))()
    return (high_water_kib() - base) / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("T", 2048), ("d", 2048), ("f", 768), ("E", 32), ("top-k", 4), ("rounds", 7)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--peak", choices=("fused", "separate"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.peak:
        print(peak(args, args.peak == "fused"))
        return
    print(f"T={args.T} d={args.d} f={args.f} E={args.E} top-{args.top_k}, "
          f"{raggeddot.get_num_threads()} threads")
    timings(args)
    if raggeddot.runtime.build_info()["products"]["int8"]["compute"].startswith("int8-"):
        w8a8_timings(args)
    mib = {}
    for how in ("fused", "separate"):
        cmd = [sys.executable, __file__, "--peak", how] + [f"--{k}={getattr(args, k.replace('-', '_'))}"
                                                           for k in ("T", "d", "f", "E", "top-k")]
        mib[how] = float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    print(f"float32 forward peak extra memory: {mib['fused']:.0f} MiB fused, {mib['separate']:.0f} MiB "
          f"separate ({mib['fused'] / mib['separate']:.2f}x)")


if __name__ == "__main__":
    main()

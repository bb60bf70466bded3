"""moe_block with its experts' fused passes (README: "A Mixture-of-Experts layer") against the same
layer as separate passes (the same bits: checked first) and torch's expert loop (forward, and
forward+backward by autograd) in interleaved rounds, medians, with their share of the peak of the
instruction serving the dtype's products at raggeddot's threads; then the peak extra memory (RSS)
of the float32 forward and forward+backward, each in a process of its own.

    python benchmarks/fused_moe.py [--T 2048 --d 2048 --f 768 --E 32 --top-k 4] [--rounds 7]
"""
import argparse
import subprocess
import sys

import numpy as np

import common as C
import raggeddot
from raggeddot import runtime
from raggeddot._moe import experts
from raggeddot._timing import interleaved, summary


def layer(args, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.T, args.d), dtype=np.float32).astype(dtype, copy=False)
    # the router in the layer's dtype too (a float32 one would make the whole layer float32,
    # the experts' products then on the widening FMA path, not the 16-bit kernels)
    router = (rng.standard_normal((args.d, args.E), dtype=np.float32) * np.float32(0.1)).astype(dtype)
    ws = []
    for s in ((args.E, args.d, args.f), (args.E, args.d, args.f), (args.E, args.f, args.d)):
        w = rng.standard_normal(s, dtype=np.float32)  # no temporary as large as a weight (for the peak)
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
    products here (common.serving), else the float32 FMA's (the widening path)."""
    insn, probes = C.serving(dtype)
    gflops = next((g for g in map(runtime.peak_gflops, probes) if g), None)
    return (insn, gflops) if gflops else ("FMA", max(runtime.peak_gflops(i) or 0.0 for i in ("avx512", "avx2", "neon")))


def compare(title: str, fns: dict, args, peak: float) -> None:
    """fns ("<step> fused", "<step> separate", "<step> torch"; step fwd or fwd+bwd) timed in
    interleaved rounds, a line a step: medians, % of ``peak``, time over the fused one's."""
    times = interleaved(fns, rounds=args.rounds, warmup=1, pause_s=0.1)
    med = {n: summary(ts)["median"] for n, ts in times.items()}
    flops = 3 * 2 * args.T * args.top_k * args.d * args.f      # the forward's (the step's: 3x)
    print(title)
    for step in dict.fromkeys(n.split()[0] for n in med):
        parts, fused = [], med[f"{step} fused"]
        for how in ("fused", "separate", "torch"):
            t = med.get(f"{step} {how}")
            if t is not None:
                pct = 100 * flops * (3 if step == "fwd+bwd" else 1) / t / 1e9 / peak
                parts.append(f"{how} {1e3 * t:.1f} ms ({pct:.0f}%" + (" of peak)" if how == "fused" else
                                                                      f"): {t / fused:.3f}x"))
        print(f"  {'forward' if step == 'fwd' else 'forward+backward'}: " + ", ".join(parts))


def timings(args):
    """float32 and bfloat16 layers: forward and forward+backward; then, where the int8 products
    run on int8 instructions, the float32 layer with int8 weights (a scale per expert and column)
    and activation_qtype="int8" (the rows quantized by the kernels once for the gate and up
    products), forward only."""
    import ml_dtypes
    cases = [(np.float32, "float32"), (ml_dtypes.bfloat16, "bfloat16")]
    if runtime.build_info()["products"]["int8"]["compute"].startswith("int8-"):
        cases.append((np.float32, "int8"))
    for dtype, name in cases:
        insn, peak = serving_peak(name)
        x, router, ws, ct = layer(args, dtype)
        kw = dict(top_k=args.top_k, norm_topk_prob=True)
        if name == "int8":
            ws, kw["activation_qtype"] = [raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)) for w in ws], "int8"

        def fwd():
            return raggeddot.moe_block(x, router, *ws, **kw)

        def step():
            out, vjp_fn = raggeddot.moe_block_vjp(x, router, *ws, **kw)
            return vjp_fn(ct.astype(out.dtype))

        if not np.array_equal(np.asarray(fwd()).view(np.uint8), np.asarray(separate(fwd)()).view(np.uint8)):
            raise SystemExit(f"{'w8a8: ' if name == 'int8' else ''}the fused and separate passes disagree")
        if name == "int8":
            compare(f"w8a8 int8 weights x int8 rows ({insn} peak {peak:.0f} GOP/s at these threads):",
                    {"fwd fused": fwd, "fwd separate": separate(fwd)}, args, peak)
            continue
        fns = {"fwd fused": fwd, "fwd separate": separate(fwd), "fwd+bwd fused": step,
               "fwd+bwd separate": separate(step)}
        loop = torch_loop(args, x, router, ws, ct, dtype)
        if loop is not None:
            fns.update({"fwd torch": loop[0], "fwd+bwd torch": loop[1]})
        compare(f"{name} ({insn} peak {peak:.0f} GFLOP/s at these threads):", fns, args, peak)


def peak(args, fused, backward):
    """The extra RSS of one float32 forward (or forward+backward), in this process (which makes
    nothing else big)."""
    raggeddot.set_buffer_cache(0)
    x, router, ws, ct = layer(args, np.float32)
    kw = dict(top_k=args.top_k, norm_topk_prob=True)
    fwd = lambda: raggeddot.moe_block(x, router, *ws, **kw)  # noqa: E731
    step = lambda: raggeddot.moe_block_vjp(x, router, *ws, **kw)[1](ct)  # noqa: E731
    base = C.vm("VmHWM")
    fn = step if backward else fwd
    (fn if fused else separate(fn))()
    return (C.vm("VmHWM") - base) / 2 ** 20


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("T", 2048), ("d", 2048), ("f", 768), ("E", 32), ("top-k", 4), ("rounds", 7)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--peak", choices=("fused", "separate", "fused-bwd", "separate-bwd"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.peak:
        return print(peak(args, args.peak.startswith("fused"), args.peak.endswith("-bwd")))
    print(f"T={args.T} d={args.d} f={args.f} E={args.E} top-{args.top_k}, {raggeddot.get_num_threads()} threads")
    timings(args)
    mib = {how: float(subprocess.run([sys.executable, __file__, "--peak", how] + [
        f"--{k}={getattr(args, k.replace('-', '_'))}" for k in ("T", "d", "f", "E", "top-k")],
        capture_output=True, text=True, check=True).stdout)
        for how in ("fused", "separate", "fused-bwd", "separate-bwd")}
    for step, end in (("forward", ""), ("forward+backward", "-bwd")):
        print(f"float32 {step} peak extra memory: {mib['fused' + end]:.0f} MiB fused, "
              f"{mib['separate' + end]:.0f} MiB separate ({mib['fused' + end] / mib['separate' + end]:.2f}x)")


if __name__ == "__main__":
    main()

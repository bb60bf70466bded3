"""moe_block with its experts' fused passes (the gate and up products in one pass with the
activation in their epilogue, the dispatch read while packing, the backward's d_a product with
the activation's gradient in its epilogue) against the same layer run as separate passes, in
interleaved rounds (medians), and the peak extra memory (RSS) of the forward, each in a process
of its own. The two give the same bits (checked first).

    python benchmarks/fused_moe.py [--T 2048 --d 2048 --f 768 --E 32 --top-k 4] [--rounds 7]
"""
import argparse
import subprocess
import sys

import numpy as np

import raggeddot
from raggeddot._moe import experts
from raggeddot._timing import interleaved, summary


def layer(args, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.T, args.d), dtype=np.float32).astype(dtype, copy=False)
    router = rng.standard_normal((args.d, args.E), dtype=np.float32) * np.float32(0.1)
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


def timings(args):
    import ml_dtypes
    for dtype in (np.float32, ml_dtypes.bfloat16):
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
        times = interleaved({"fwd fused": fwd, "fwd separate": separate(fwd), "fwd+bwd fused": step,
                             "fwd+bwd separate": separate(step)}, rounds=args.rounds, warmup=1, pause_s=0.1)
        med = {name: summary(ts)["median"] for name, ts in times.items()}
        flops = 3 * 2 * args.T * args.top_k * args.d * args.f
        print(f"{np.dtype(dtype).name}: forward {1e3 * med['fwd fused']:.1f} ms fused "
              f"({flops / med['fwd fused'] / 1e9:.0f} GFLOP/s), {1e3 * med['fwd separate']:.1f} ms separate: "
              f"{med['fwd separate'] / med['fwd fused']:.3f}x; forward+backward "
              f"{1e3 * med['fwd+bwd fused']:.0f} ms fused, {1e3 * med['fwd+bwd separate']:.0f} ms separate: "
              f"{med['fwd+bwd separate'] / med['fwd+bwd fused']:.3f}x")


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
    mib = {}
    for how in ("fused", "separate"):
        cmd = [sys.executable, __file__, "--peak", how] + [f"--{k}={getattr(args, k.replace('-', '_'))}"
                                                           for k in ("T", "d", "f", "E", "top-k")]
        mib[how] = float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    print(f"float32 forward peak extra memory: {mib['fused']:.0f} MiB fused, {mib['separate']:.0f} MiB "
          f"separate ({mib['fused'] / mib['separate']:.2f}x)")


if __name__ == "__main__":
    main()

"""Low-precision products against float32 and torch, on the shapes of the native-kernel targets.

    python benchmarks/lowp.py [--quick] [--repeat N]

Each row: median seconds over N timed calls after two warm-up calls, GFLOP/s (2*m*k*n per
product; moe: the three expert products and the router), the ratio to raggeddot float32 and
to the best torch baseline in the same dtype, and % of the measured peak of the instruction
the product runs on (runtime.peak_gflops: vdpbf16ps, vpdpbusd, or the FMA when the CPU has
neither). Every variant is checked against raggeddot float32 on the same values before it is
timed (bfloat16: 2e-2 relative, int8: the dequantized product, 1e-4). Rows:

  dense 4096x2048x2048: bfloat16 (dot-product kernels where the CPU has them), bfloat16 with
    the widening path forced, float32, torch bfloat16 and float32 matmul; int8 x int8 per
    channel and per block of 128 along k (vpdpbusd where the CPU has it), torch._int_mm
  qwen3 m4096 k2048 n768 g64 (skewed): bfloat16, widening, float32, torch bfloat16 per-group
    loop and torch._grouped_mm
  moe_block T=2048 d=2048 f=768 E=32 top 4 (Mixtral/Qwen3-MoE shaped) forward: float32,
    bfloat16, bfloat16 widening, w8a8 (int8 weights per channel, activation_qtype="int8"; plain
    QArrays, and prepacked for int8 activations), a torch bfloat16 expert loop (transformers'
    eager style)

Variants are timed in rounds (each round calls each once), so that a shared machine's drifting
load weighs on all alike.
"""
import argparse
import statistics
import time

import ml_dtypes
import numpy as np

import raggeddot
from raggeddot import runtime

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_FAMILY = next(k["name"] for k in raggeddot.build_info()["kernels"] if k["runnable"] and "float32" in k["types"])


def timed(variants, repeat):
    """[(name, kind, median seconds)] of ``variants`` [(name, kind, fn)], timed in rounds (each
    round calls every variant once, after two warm-up calls each), so that the load of a shared
    machine drifting over the run weighs on all of them alike; a pause before each call lets the
    previous one's worker threads (torch's spin) go idle."""
    for _, _, fn in variants:
        fn(), fn()
    times = [[] for _ in variants]
    for _ in range(repeat):
        for ts, (_, _, fn) in zip(times, variants):
            time.sleep(0.2)
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [(name, kind, statistics.median(ts)) for (name, kind, _), ts in zip(variants, times)]


def widened(fn):
    def call():
        with runtime.configured(kernel=FLOAT_FAMILY):
            return fn()
    return call


def check(name, got, want, tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.abs(got - want).max() / max(1e-30, np.abs(want).max())
    if not err <= tol:
        raise SystemExit(f"{name}: relative error {err:.2e} > {tol:.0e}")


def float_variants(x32, w32, sizes):
    """raggeddot float32 on ``x32 @ w32``, and bfloat16 on the values rounded (dot-product
    kernels, and the widening path forced), each bfloat16 one checked against float32 on the
    rounded values."""
    x16, w16 = x32.astype(BF16), w32.astype(BF16)
    ref = raggeddot.ragged_dot(x16.astype(np.float32), w16.astype(np.float32), sizes)
    variants = [("rd float32", "float32", lambda: raggeddot.ragged_dot(x32, w32, sizes)),
                ("rd bfloat16", "bfloat16", lambda: raggeddot.ragged_dot(x16, w16, sizes)),
                ("rd bfloat16 widening", "widen", widened(lambda: raggeddot.ragged_dot(x16, w16, sizes)))]
    for name, _, fn in variants[1:]:
        check(name, fn(), ref, 2e-2)
    return variants


def peaks(threads):
    out = {isa: runtime.peak_gflops(isa, threads, 0.5) for isa in ("avx512", "avx2", "avx512_bf16", "avx512_vnni",
                                                                    "avx_vnni")}
    fma = out["avx512"] or out["avx2"]
    return {"float32": fma, "bfloat16": out["avx512_bf16"] or fma, "int8": out["avx512_vnni"] or out["avx_vnni"] or fma,
            "widen": fma}


def table(title, rows, flops, peak_of):
    base = next(t for name, _, t in rows if name == "rd float32")
    torch_best = {}
    for name, kind, t in rows:
        if name.startswith("torch"):
            torch_best[kind] = min(t, torch_best.get(kind, t))
    print(f"\n{title}")
    print(f"  {'variant':28s} {'ms':>9s} {'GFLOP/s':>8s} {'x f32':>6s} {'x torch':>8s} {'%peak':>6s}")
    for name, kind, t in rows:
        gf = flops / t / 1e9
        tb = torch_best.get(kind)
        vs = f"{tb / t:8.2f}" if tb and not name.startswith("torch") else " " * 8
        pk = f"{100 * gf / peak_of[kind]:6.1f}" if not name.startswith("torch") and peak_of.get(kind) else ""
        print(f"  {name:28s} {1e3 * t:9.2f} {gf:8.1f} {base / t:6.2f} {vs} {pk}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="half-size shapes")
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()
    import torch
    threads = raggeddot.get_num_threads()
    torch.set_num_threads(threads)
    pk = peaks(threads)
    print(f"raggeddot {raggeddot.__version__}, {threads} threads; kernels: "
          f"{ {t: b['kernel'] for t, b in raggeddot.build_info()['blocking'].items()} }")
    print("peaks GFLOP/s (GOP/s for int8): " + ", ".join(f"{k} {v:.0f}" for k, v in pk.items()))
    rng = np.random.default_rng(0)
    s = 2 if a.quick else 1

    # dense
    m, k, n = 4096 // s, 2048 // s, 2048 // s
    x32 = rng.standard_normal((m, k), dtype=np.float32)
    w32 = rng.standard_normal((1, k, n), dtype=np.float32)
    gs = np.array([m])
    variants = float_variants(x32, w32, gs)
    q_per = [raggeddot.quantize(x32, "int8", channelwise_axes=(0,)), raggeddot.quantize(w32, "int8", channelwise_axes=(0, 2))]
    q_sub = [raggeddot.quantize(x32, "int8", channelwise_axes=(0,), tiled_axes={1: 128}),
             raggeddot.quantize(w32, "int8", channelwise_axes=(0, 2), tiled_axes={1: 128})]
    for name, (ql, qr) in (("rd int8 per-channel", q_per), ("rd int8 block-128", q_sub)):
        fn = lambda ql=ql, qr=qr: raggeddot.ragged_dot(ql, qr, gs, preferred_element_type=np.float32)  # noqa: E731
        check(name, fn(), raggeddot.ragged_dot(raggeddot.dequantize(ql), raggeddot.dequantize(qr), gs), 1e-4)
        variants.append((name, "int8", fn))
    tx, tw = torch.from_numpy(x32), torch.from_numpy(w32[0])
    for dt, kind in ((torch.bfloat16, "bfloat16"), (torch.float32, "float32")):
        tx_, tw_ = tx.to(dt), tw.to(dt)
        variants.append((f"torch {kind} matmul", kind, lambda tx_=tx_, tw_=tw_: tx_ @ tw_))
    ti, tj = torch.from_numpy(q_per[0].qvalue), torch.from_numpy(np.ascontiguousarray(q_per[1].qvalue[0]))
    variants.append(("torch int8 _int_mm", "int8", lambda: torch._int_mm(ti, tj)))
    rows = timed(variants, a.repeat)
    table(f"dense {m}x{k}x{n}", rows, 2.0 * m * k * n, pk)

    # grouped (Qwen3-MoE shaped, 64 groups, skewed)
    m, k, n, g = 4096 // s, 2048 // s, 768, 64
    sizes = rng.multinomial(m, rng.dirichlet(np.full(g, 0.5)))
    x32 = rng.standard_normal((m, k), dtype=np.float32)
    w32 = rng.standard_normal((g, k, n), dtype=np.float32)
    variants = float_variants(x32, w32, sizes)
    tx, tw = torch.from_numpy(x32).to(torch.bfloat16), torch.from_numpy(w32).to(torch.bfloat16)
    bounds = np.concatenate([[0], np.cumsum(sizes)])

    def loop():
        return [tx[bounds[i]:bounds[i + 1]] @ tw[i] for i in range(g) if sizes[i]]
    offs = torch.from_numpy(bounds[1:].astype(np.int32))
    variants += [("torch bfloat16 loop", "bfloat16", loop),
                 ("torch bfloat16 _grouped_mm", "bfloat16", lambda: torch._grouped_mm(tx, tw, offs=offs))]
    rows = timed(variants, a.repeat)
    table(f"qwen3 m{m} k{k} n{n} g{g} skewed", rows, 2.0 * m * k * n, pk)

    # moe_block forward
    T, d, f, E, top = 2048 // s, 2048 // s, 768, 32, 4
    x = rng.standard_normal((T, d), dtype=np.float32)
    router = (rng.standard_normal((d, E)) / np.sqrt(d)).astype(np.float32)
    w0, w1 = ((rng.standard_normal((E, d, f)) / np.sqrt(d)).astype(np.float32) for _ in range(2))
    wo = (rng.standard_normal((E, f, d)) / np.sqrt(f)).astype(np.float32)
    f32 = (x, router, w0, w1, wo)
    b16 = tuple(v.astype(BF16) for v in f32)
    q = (x, router) + tuple(raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)) for w in (w0, w1, wo))
    qp = (x, router) + tuple(raggeddot.prepack(w, lhs_dtype=np.int8) for w in q[2:])
    # oracles: float32 layers on the same values (bfloat16 ones widened, int8 weights dequantized)
    ref16 = raggeddot.moe_block(*(v.astype(np.float32) for v in b16), top_k=top, norm_topk_prob=True)
    ref8 = raggeddot.moe_block(x, router, *(raggeddot.dequantize(w) for w in q[2:]), top_k=top, norm_topk_prob=True)
    variants = []
    for name, kind, args, kw, ref in [("rd float32", "float32", f32, {}, None),
                                      ("rd bfloat16", "bfloat16", b16, {}, ref16),
                                      ("rd w8a8 int8", "int8", q, {"activation_qtype": "int8"}, ref8),
                                      ("rd w8a8 int8 prepacked", "int8", qp, {"activation_qtype": "int8"}, ref8)]:
        fn = lambda args=args, kw=kw: raggeddot.moe_block(*args, top_k=top, norm_topk_prob=True, **kw)  # noqa: E731
        if ref is not None:
            check(name, fn(), ref, 5e-2)
        variants.append((name, kind, fn))
        if kind == "bfloat16":
            variants.append(("rd bfloat16 widening", "widen", widened(fn)))
    tb = [torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16) for v in (x, w0, w1, wo)]
    tx32, tr = (torch.from_numpy(v.astype(np.float32)) for v in b16[:2])

    def torch_loop():   # routing in float32, experts in bfloat16, combine in float32
        probs = torch.softmax(tx32 @ tr, dim=-1)
        wts, idx = torch.topk(probs, top, dim=-1)
        wts = wts / wts.sum(-1, keepdim=True)
        out = torch.zeros(T, d)
        for e in range(E):
            tok, slot = torch.where(idx == e)
            if tok.numel():
                h = tb[0][tok]
                a_ = torch.nn.functional.silu(h @ tb[1][e]) * (h @ tb[2][e])
                out.index_add_(0, tok, (a_ @ tb[3][e]).float() * wts[tok, slot, None])
        return out
    check("torch bfloat16 loop", torch_loop().numpy(), ref16, 5e-2)
    variants.append(("torch bfloat16 expert loop", "bfloat16", torch_loop))
    rows = timed(variants, a.repeat)
    table(f"moe_block forward T={T} d={d} f={f} E={E} top {top}", rows, 6.0 * T * top * d * f + 2.0 * T * d * E, pk)


if __name__ == "__main__":
    main()

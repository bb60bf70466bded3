"""raggeddot.jax's FFI custom calls inside jax.jit, against jax's own CPU
lowering of ragged_dot and against raggeddot's NumPy call on the same arrays.

  python benchmarks/jax_ffi.py [--repeats 5] [--quick]

1. ragged_dot, float32, m=4096 k=2048 n=768 g=64 (and a smaller shape):
   jax.jit(raggeddot.jax.ragged_dot) vs jax.jit(jax.lax.ragged_dot) (on the
   CPU a [g, m, k] masked lhs and one dense dot over g*k), and vs
   raggeddot.ragged_dot on NumPy views of the same buffers (the FFI's cost).
2. A MoE layer written in JAX (routing, argsort, gathers, three ragged_dot
   calls, combine; 16 experts), forward + backward (jax.value_and_grad under
   jit) with raggeddot.jax.ragged_dot vs with jax.lax.ragged_dot.

Each variant is checked against the others before it is timed; times are
medians of --repeats runs after one warm-up. Output: one JSON line per case.
"""
import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import raggeddot
import raggeddot.jax as rj


def median_time(fn, repeats):
    jax.block_until_ready(fn())          # warm-up (and compilation)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def paired_medians(fns, repeats):
    """Medians of several functions timed in alternation (a load that drifts
    during the run then weighs on each alike)."""
    for fn in fns:
        jax.block_until_ready(fn())
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t = time.perf_counter()
            jax.block_until_ready(fn())
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def sizes_for(rng, m, g):
    """Random group sizes summing to m (some empty)."""
    cuts = np.sort(rng.integers(0, m + 1, size=g - 1))
    return np.diff(np.concatenate([[0], cuts, [m]])).astype(np.int32)


def bench_ragged_dot(m, k, n, g, repeats, skip_lax):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((g, k, n), dtype=np.float32) * 0.05)
    gs = jnp.asarray(sizes_for(rng, m, g))
    ours = jax.jit(rj.ragged_dot)
    lax = jax.jit(jax.lax.ragged_dot)
    xn, wn, gn = np.asarray(x), np.asarray(w), np.asarray(gs)   # views of the same buffers
    a, c = np.asarray(ours(x, w, gs)), raggeddot.ragged_dot(xn, wn, gn)
    np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)
    res = {"case": "ragged_dot", "m": m, "k": k, "n": n, "g": g, "dtype": "float32",
           "gflop": 2.0 * m * k * n / 1e9}
    res["raggeddot.jax_s"], res["numpy_s"] = paired_medians(
        [lambda: ours(x, w, gs), lambda: raggeddot.ragged_dot(xn, wn, gn)], repeats)
    res["ffi_over_numpy"] = res["raggeddot.jax_s"] / res["numpy_s"]
    if not skip_lax:
        np.testing.assert_allclose(a, np.asarray(lax(x, w, gs)), rtol=1e-3, atol=1e-3)
        res["jax.lax_s"] = median_time(lambda: lax(x, w, gs), max(1, min(repeats, 3)))
        res["speedup_vs_lax"] = res["jax.lax_s"] / res["raggeddot.jax_s"]
    return res


def moe_layer(params, x, ragged_dot, top_k=2):
    """Top-k routing, tokens sorted by expert, SwiGLU experts, weighted combine."""
    router, w0, w1, wo = params
    E = router.shape[1]
    weights, experts = jax.lax.top_k(jax.nn.softmax(x @ router, axis=-1), top_k)
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    token = order // top_k
    sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
    xs = x[token]
    h = jax.nn.silu(ragged_dot(xs, w0, sizes)) * ragged_dot(xs, w1, sizes)
    y = ragged_dot(h, wo, sizes) * weights.reshape(-1)[order][:, None]
    return jnp.zeros_like(x).at[token].add(y)


def bench_moe(tokens, d, f, E, repeats):
    rng = np.random.default_rng(1)
    a = lambda *s, sc=1.0: jnp.asarray(rng.standard_normal(s, dtype=np.float32) * sc)   # noqa: E731
    params = (a(d, E, sc=0.1), a(E, d, f, sc=d ** -0.5), a(E, d, f, sc=d ** -0.5), a(E, f, d, sc=f ** -0.5))
    x = a(tokens, d)

    def step(rd):
        return jax.jit(jax.value_and_grad(lambda p, x: jnp.mean(moe_layer(p, x, rd) ** 2), (0, 1)))

    ours, lax = step(rj.ragged_dot), step(jax.lax.ragged_dot)
    for p, q in zip(jax.tree.leaves(ours(params, x)), jax.tree.leaves(lax(params, x))):
        np.testing.assert_allclose(np.asarray(p), np.asarray(q), rtol=2e-3, atol=2e-5)
    res = {"case": "moe_fwd_bwd", "tokens": tokens, "d": d, "f": f, "experts": E, "top_k": 2, "dtype": "float32"}
    res["raggeddot.jax_s"], res["jax.lax_s"] = paired_medians(
        [lambda: ours(params, x), lambda: lax(params, x)], repeats)
    res["speedup_vs_lax"] = res["jax.lax_s"] / res["raggeddot.jax_s"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small shapes only")
    args = ap.parse_args()
    print(json.dumps({"cpu": platform.processor() or platform.machine(), "jax": jax.__version__,
                      "threads": raggeddot.get_num_threads(), "kernel": raggeddot.build_info()["kernel"]}))
    shapes = [(512, 256, 128, 8)] + ([] if args.quick else [(4096, 2048, 768, 64)])
    for m, k, n, g in shapes:
        print(json.dumps(bench_ragged_dot(m, k, n, g, args.repeats, skip_lax=False)), flush=True)
    moe = (256, 64, 128, 16) if args.quick else (2048, 512, 1024, 16)
    print(json.dumps(bench_moe(*moe, args.repeats)), flush=True)


if __name__ == "__main__":
    main()

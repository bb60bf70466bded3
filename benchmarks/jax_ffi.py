"""raggeddot.jax's FFI custom calls inside jax.jit, against jax's own CPU lowering of ragged_dot
and against raggeddot's NumPy call on the same arrays.

  python benchmarks/jax_ffi.py [--repeats 5] [--quick]

1. ragged_dot, float32, m=4096 k=2048 n=768 g=64 (and a smaller shape): jax.jit(raggeddot.jax.
   ragged_dot) vs jax.jit(jax.lax.ragged_dot) (on the CPU a [g, m, k] masked lhs and one dense
   dot over g*k), and vs raggeddot.ragged_dot on NumPy views of the same buffers (the FFI's cost).
2. A MoE layer written in JAX (routing, argsort, gathers, three ragged_dot calls, combine; 16
   experts), forward + backward (jax.value_and_grad under jit), raggeddot.jax vs jax.lax.

Each variant is checked against the others before it is timed. Times: medians of --repeats
rounds after a warm-up call (and compilation), the variants of a case in interleaved rounds
(raggeddot._timing.interleaved); jax.lax.ragged_dot alone, at most 3 calls (it is slow).
Output: a line of machine info, then one JSON line per case.
"""
import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

import raggeddot  # noqa: E402
import raggeddot.jax as rj  # noqa: E402
from raggeddot._timing import interleaved, summary  # noqa: E402


def medians(repeats: int, **fns) -> dict:
    """{name + '_s': median seconds} of the callables, timed in interleaved rounds."""
    times = interleaved(fns, rounds=repeats, sync=jax.block_until_ready)
    return {f"{name}_s": summary(ts)["median"] for name, ts in times.items()}


def bench_ragged_dot(m, k, n, g, repeats):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((g, k, n), dtype=np.float32) * 0.05)
    cuts = np.sort(rng.integers(0, m + 1, size=g - 1))  # random group sizes summing to m, some empty
    gs = jnp.asarray(np.diff(np.concatenate([[0], cuts, [m]])).astype(np.int32))
    ours, lax = jax.jit(rj.ragged_dot), jax.jit(jax.lax.ragged_dot)
    xn, wn, gn = np.asarray(x), np.asarray(w), np.asarray(gs)   # views of the same buffers
    a = np.asarray(ours(x, w, gs))
    np.testing.assert_allclose(a, raggeddot.ragged_dot(xn, wn, gn), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a, np.asarray(lax(x, w, gs)), rtol=1e-3, atol=1e-3)
    res = dict(case="ragged_dot", m=m, k=k, n=n, g=g, dtype="float32", gflop=2.0 * m * k * n / 1e9)
    res.update(medians(repeats, **{"raggeddot.jax": lambda: ours(x, w, gs),
                                   "numpy": lambda: raggeddot.ragged_dot(xn, wn, gn)}))
    res.update(medians(max(1, min(repeats, 3)), **{"jax.lax": lambda: lax(x, w, gs)}))
    return dict(res, ffi_over_numpy=res["raggeddot.jax_s"] / res["numpy_s"],
                speedup_vs_lax=res["jax.lax_s"] / res["raggeddot.jax_s"])


def moe_layer(params, x, ragged_dot, top_k=2):
    """Top-k routing, tokens sorted by expert, SwiGLU experts, weighted combine."""
    router, w0, w1, wo = params
    weights, experts = jax.lax.top_k(jax.nn.softmax(x @ router, axis=-1), top_k)
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    token, sizes = order // top_k, jnp.bincount(flat, length=router.shape[1]).astype(jnp.int32)
    xs = x[token]
    h = jax.nn.silu(ragged_dot(xs, w0, sizes)) * ragged_dot(xs, w1, sizes)
    y = ragged_dot(h, wo, sizes) * weights.reshape(-1)[order][:, None]
    return jnp.zeros_like(x).at[token].add(y)


def bench_moe(tokens, d, f, E, repeats):
    rng = np.random.default_rng(1)

    def a(*shape, scale=1.0):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale)

    params = (a(d, E, scale=0.1), a(E, d, f, scale=d ** -0.5), a(E, d, f, scale=d ** -0.5),
              a(E, f, d, scale=f ** -0.5))
    x = a(tokens, d)

    def step(rd):
        return jax.jit(jax.value_and_grad(lambda p, x: jnp.mean(moe_layer(p, x, rd) ** 2), (0, 1)))

    ours, lax = step(rj.ragged_dot), step(jax.lax.ragged_dot)
    for p, q in zip(jax.tree.leaves(ours(params, x)), jax.tree.leaves(lax(params, x))):
        np.testing.assert_allclose(np.asarray(p), np.asarray(q), rtol=2e-3, atol=2e-5)
    res = dict(case="moe_fwd_bwd", tokens=tokens, d=d, f=f, experts=E, top_k=2, dtype="float32")
    res.update(medians(repeats, **{"raggeddot.jax": lambda: ours(params, x),
                                   "jax.lax": lambda: lax(params, x)}))
    return dict(res, speedup_vs_lax=res["jax.lax_s"] / res["raggeddot.jax_s"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small shapes only")
    args = ap.parse_args()
    print(C.describe_machine(C.machine_info()) + f"; jax {jax.__version__}", flush=True)
    for shape in [(512, 256, 128, 8)] + ([] if args.quick else [(4096, 2048, 768, 64)]):
        print(json.dumps(bench_ragged_dot(*shape, args.repeats)), flush=True)
    moe = (256, 64, 128, 16) if args.quick else (2048, 512, 1024, 16)
    print(json.dumps(bench_moe(*moe, args.repeats)), flush=True)


if __name__ == "__main__":
    main()

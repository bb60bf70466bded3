"""The bits of products that must not depend on the architecture: the
portable family ("ref") and every twin (plain C, -ffp-contract=off) on
float32, float64, bfloat16 and int8 operands, hashed. .ci/arm64 runs this
here (x86-64) and under QEMU (aarch64) and requires the same hashes.

    python .ci/bits.py > bits.json

The data come from a xorshift generator in NumPy integers and are small
integers scaled by powers of two (exact in every dtype used), so that both
machines multiply the same values whatever their NumPy version.
"""
import hashlib
import json
import sys

import numpy as np

import raggeddot
from raggeddot import QArray, runtime
from raggeddot import _gateway as gw

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    sys.exit("bits: ml_dtypes is needed")


class Xorshift:
    """xorshift64*: the same stream on every machine and NumPy version."""

    def __init__(self, seed):
        self.state = np.uint64(seed * 2654435761 + 1)

    def ints(self, n, lo, hi):
        out = np.empty(n, np.int64)
        s = int(self.state)
        for i in range(n):
            s ^= (s >> 12)
            s ^= (s << 25) & 0xFFFFFFFFFFFFFFFF
            s ^= (s >> 27)
            out[i] = lo + ((s * 0x2545F4914F6CDD1D) & 0xFFFFFFFFFFFFFFFF) % (hi - lo)
        self.state = np.uint64(s)
        return out


def values(gen, shape, dtype, scale=2.0 ** -6):
    """Integers in [-64, 64) times `scale`, as `dtype` (exact)."""
    return (gen.ints(int(np.prod(shape)), -64, 64).reshape(shape) * scale).astype(dtype)


def digest(x):
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:24]


def cases():
    """(name, family, thunk) for every product checked."""
    gen = Xorshift(7)
    sizes = np.array([5, 0, 17, 9])
    m, k, n = int(sizes.sum()) + 3, 301, 45
    f32 = (values(gen, (m, k), np.float32), values(gen, (4, k, n), np.float32))
    f64 = (values(gen, (m, k), np.float64), values(gen, (4, k, n), np.float64))
    bf = (values(gen, (m, k), BF16, 2.0 ** -3), values(gen, (4, k, n), BF16, 2.0 ** -3))
    # random-looking bfloat16 mantissas (products and sums not exact)
    bfr = tuple((gen.ints(int(np.prod(s)), 0x3c00, 0x4100).astype(np.uint16)
                 | (gen.ints(int(np.prod(s)), 0, 2).astype(np.uint16) << 15)).reshape(s).view(BF16)
                for s in ((m, k), (4, k, n)))
    q = (QArray(gen.ints(m * k, -128, 128).reshape(m, k).astype(np.int8),
                (gen.ints(m, 1, 64) * 2.0 ** -10).reshape(m, 1).astype(np.float32),
                gen.ints(m, -128, 128).reshape(m, 1).astype(np.float32)),
         QArray(gen.ints(4 * k * n, -128, 128).reshape(4, k, n).astype(np.int8),
                (gen.ints(4 * n, 1, 64) * 2.0 ** -10).reshape(4, 1, n).astype(np.float32)))
    x = values(gen, (40, 64), np.float32)
    router = values(gen, (64, 6), np.float32)
    ws = [values(gen, s, np.float32, 2.0 ** -8) for s in ((6, 64, 48), (6, 64, 48), (6, 48, 64))]
    ct = values(gen, (m, n), np.float32)

    def rd(a, b):
        return lambda: raggeddot.ragged_dot(a, b, sizes, preferred_element_type=np.float32)

    yield "ragged_dot f32", "ref", rd(*f32)
    yield "ragged_dot f64", "ref", lambda: raggeddot.ragged_dot(*f64, sizes)
    yield "ragged_dot bf16 widened", "ref", rd(*bfr)
    yield "tgmm f32", "ref", lambda: raggeddot.tgmm(f32[0][:m].T.copy(), ct, sizes)
    yield "moe_block f32", "ref", lambda: raggeddot.moe_block(x, router, *ws, top_k=2)
    # the activations' exponential (its own, not the platform's libm) forward and backward
    yield "moe_block swiglu_oai f32", "ref", lambda: raggeddot.moe_block(x, router, *ws, top_k=2,
                                                                          activation="swiglu_oai")
    # and its erf and tanh (gelu, gelu_tanh), forward and the activations' gradients
    for act in ("gelu", "gelu_tanh"):
        yield f"moe_block {act} f32", "ref", lambda act=act: raggeddot.moe_block(x, router, *ws, top_k=2,
                                                                                  activation=act)
        yield f"gated_act_grad {act} f32", "ref", lambda act=act: np.concatenate(
            [a.ravel() for a in gw.gated_act_grad(ct * 4, ct[::-1] * 4, ct, act, 7.0)])

    def grads():
        out, vjp_fn = raggeddot.moe_block_vjp(x, router, *ws, top_k=2)
        return np.concatenate([g.ravel() for g in vjp_fn(values(gen_ct, out.shape, np.float32)).values()])
    gen_ct = Xorshift(11)
    yield "moe_block vjp f32", "ref", grads
    for fam in ("avx512-bf16-twin", "neon-bf16-twin", "amx-twin"):
        yield "ragged_dot bf16 exact", fam, rd(*bf)
        yield "ragged_dot bf16", fam, rd(*bfr)
    for fam in ("avx512-vnni-twin", "avx-vnni-twin", "neon-i8mm-twin", "neon-dot-twin", "amx-twin"):
        yield "ragged_dot int8", fam, rd(*q)


def main():
    out = {}
    for name, family, thunk in cases():
        with runtime.configured(kernel=family, num_threads=1):
            out[f"{name} / {family}"] = digest(thunk())
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()

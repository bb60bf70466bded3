"""MXFP4 expert weights against the same weights in bfloat16 and int8: ragged_dot on
prepacked weights, decode (few rows a group) and prefill shapes, float32 activations.

    python benchmarks/mxfp4.py [--rows 8 256] [--experts 64] [--k 2048] [--n 768] [--rounds 7]

Each variant is checked against the product of the dequantized weights first (MXFP4 bit for
bit with float32 weights; bfloat16 and int8 within their rounding of the same weights), then
the variants are timed in interleaved rounds (raggeddot._timing), medians after warm-up.
Reported: milliseconds, the ratio to bfloat16 in the same run, and the weights' packed bytes
per second against the read bandwidth measured in the same process (runtime.read_bandwidth):
a product that reads its weights once cannot beat their bytes over it.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys

import numpy as np

import raggeddot as rd
from raggeddot import _timing, quant, runtime

try:
    import ml_dtypes
except ImportError:            # pragma: no cover
    sys.exit("benchmarks/mxfp4.py needs ml_dtypes")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def weights(rng, g, k, n):
    """The three variants of the same weights [g, k, n], prepacked: MXFP4, bfloat16 (the
    dequantized MXFP4 values, exact), int8 (per channel, of those values)."""
    w = rng.standard_normal((g, k, n)).astype(np.float32) * np.float32(0.02)
    q4 = quant.quantize(w, "mxfp4", channelwise_axes=(0, 2), tiled_axes={1: 32})
    w32 = quant.dequantize(q4)
    q8 = quant.quantize(w32, "int8", channelwise_axes=(0, 2))
    return {"mxfp4": (rd.prepack(q4), w32, 0.0),
            "bfloat16": (rd.prepack(w32.astype(ml_dtypes.bfloat16), lhs_dtype=np.float32), w32, 0.0),
            "int8": (rd.prepack(q8), quant.dequantize(q8), 1e-5)}


def run(rows, g, k, n, rounds, seed=0):
    rng = np.random.default_rng(seed)
    ws = weights(rng, g, k, n)
    gs = np.full(g, rows, dtype=np.int64)
    x = rng.standard_normal((rows * g, k)).astype(np.float32)
    fns = {}
    for name, (packed, dense, tol) in ws.items():
        got = rd.ragged_dot(x, packed, gs)
        want = rd.ragged_dot(x, dense, gs)
        if tol == 0.0:
            assert np.array_equal(got, want), f"{name}: not the product of the dequantized weights"
        else:
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
        fns[name] = (lambda p=packed: rd.ragged_dot(x, p, gs))
    times = _timing.interleaved(fns, rounds=rounds, warmup=2)
    bw = runtime.read_bandwidth()
    out = {}
    base = _timing.summary(times["bfloat16"])["median"]
    for name, (packed, _, _) in ws.items():
        med = _timing.summary(times[name])["median"]
        gbs = packed.nbytes / med / 1e9
        out[name] = {"ms": med * 1e3, "vs_bf16": base / med, "packed_bytes": packed.nbytes,
                     "bits_per_weight": 8 * packed.nbytes / (g * k * n),
                     "GB/s": gbs, "of_read_bw": gbs / bw}
    return {"rows_per_group": rows, "g": g, "k": k, "n": n, "read_GB/s": bw, "variants": out}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[8, 256])
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=768)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    results = [run(r, args.experts, args.k, args.n, args.rounds) for r in args.rows]
    if args.json:
        print(json.dumps({"cpu": cpu_name(), "threads": runtime.get_num_threads(), "results": results}, indent=1))
        return 0
    print(f"{cpu_name()}, {runtime.get_num_threads()} threads, kernel {runtime.build_info()['kernel']}")
    for r in results:
        print(f"\nrows/group {r['rows_per_group']}, g={r['g']} k={r['k']} n={r['n']}, "
              f"read bandwidth {r['read_GB/s']:.1f} GB/s")
        print(f"  {'weights':9} {'ms':>9} {'x bf16':>7} {'bits/w':>7} {'GB/s':>7} {'% read bw':>9}")
        for name, v in r["variants"].items():
            print(f"  {name:9} {v['ms']:9.3f} {v['vs_bf16']:7.2f} {v['bits_per_weight']:7.2f} "
                  f"{v['GB/s']:7.1f} {100 * v['of_read_bw']:8.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Low-precision products against float32 and torch, on the shapes of the native-kernel targets.

    python benchmarks/lowp.py [--quick | --smoke] [--repeat N]

Rows (run.py's variants, checked against the oracle first as there; w8a8: against moe_block on
the dequantized weights, 5e-2): dense 4096x2048x2048: raggeddot float32, bfloat16, bfloat16 with
the widening path forced (rd-widen), int8 x int8 per channel and per block of 128 along k, torch
bfloat16 / float32 matmul and torch._int_mm; qwen3-m4096-g64-skewed: raggeddot float32,
bfloat16, widening, torch bfloat16 per-group loop and torch._grouped_mm; moe_block forward
T=2048 d=2048 f=768 E=32 top-4: float32, bfloat16, widening, w8a8 (int8 weights per channel,
activation_qtype="int8"; QArrays, and prepacked for int8 activations), the torch bfloat16
expert loop. A table's variants are timed in N interleaved rounds (raggeddot._timing: two
warm-up calls each, a pause before each call for torch's spinning threads); columns: median ms,
GFLOP/s (2*m*k*n a product; moe: 3 expert products and the router), x f32: over raggeddot
float32, x torch: over the best torch row of the same dtype, %peak: of the peak of the
instruction it runs (runtime.peak_gflops: vdpbf16ps, vpdpbusd, else the FMA).
--quick halves every size; --smoke runs at 1/16 of them, one round (its figures mean nothing).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import variants as V  # noqa: E402

import raggeddot  # noqa: E402
from raggeddot import specs  # noqa: E402
from raggeddot._timing import interleaved, summary  # noqa: E402

#: raggeddot float32, bfloat16, and bfloat16 with the widening path forced, rows of a table
RD = [("rd float32", "float32", "raggeddot"), ("rd bfloat16", "bfloat16", "raggeddot"),
      ("rd bfloat16 widening", "bfloat16", "rd-widen")]
#: per table: its spec and rows (label, dtype, benchmark of run.py or "w8a8", variant)
TABLES = [
    (specs.Spec("dense-4096x2048x2048", "ragged_dot", dict(m=4096, k=2048, n=2048, g=1)), [
        *((label, dt, "ragged_dot", name) for label, dt, name in RD),
        ("rd int8 per-channel", "float32", "quant", "int8"),
        ("rd int8 block-128", "float32", "quant", "int8-sub128"),
        ("torch bfloat16 matmul", "bfloat16", "ragged_dot", "torch-dense"),
        ("torch float32 matmul", "float32", "ragged_dot", "torch-dense"),
        ("torch int8 _int_mm", "float32", "quant", "torch-int8")]),
    (specs.get("qwen3-m4096-g64-skewed"), [
        *((label, dt, "ragged_dot", name) for label, dt, name in RD),
        ("torch bfloat16 loop", "bfloat16", "ragged_dot", "torch-loop"),
        ("torch bfloat16 _grouped_mm", "bfloat16", "ragged_dot", "torch-gmm")]),
    (specs.Spec("moe-T2048-d2048-f768-E32-top4", "moe", dict(T=2048, d=2048, f=768, E=32, top_k=4, shared=0),
                options=dict(norm_topk_prob=True)), [
        *((label, dt, "moe", name) for label, dt, name in RD), ("rd w8a8 int8", "float32", "w8a8", "plain"),
        ("rd w8a8 int8 prepacked", "float32", "w8a8", "prepacked"),
        ("torch bfloat16 expert loop", "bfloat16", "moe", "torch")]),
]


def w8a8(c: V.Case, prepacked: bool):
    """moe_block with int8 weights (one scale per expert and output column) and
    activation_qtype="int8", checked against moe_block on the dequantized weights."""
    x, router, kw = c.inputs["x"], c.inputs["router_weights"], c.inputs["options"]
    ws = [raggeddot.quantize(c.inputs[n], "int8", channelwise_axes=(0, 2)) for n in ("w0", "w1", "wo")]
    ref = raggeddot.moe_block(x, router, *map(raggeddot.dequantize, ws), **kw)
    ws = [raggeddot.prepack(w, lhs_dtype=np.int8) for w in ws] if prepacked else ws

    def fn():
        return raggeddot.moe_block(x, router, *ws, activation_qtype="int8", **kw)

    err = specs.rel_err(fn(), ref)
    if not err <= 5e-2:
        raise SystemExit(f"w8a8 {'prepacked' if prepacked else ''}: relative error {err:.2e} > 5e-2")
    return fn


def run_table(spec: specs.Spec, rows: list, rounds: int, peak_of: dict) -> None:
    cases, fns, rates, kinds = {}, {}, {}, {}
    for label, dtype, op, name in rows:
        v = V.variant(op, name) if op != "w8a8" else None
        if dtype not in cases:
            needed = {r for _, d, o, n in rows if d == dtype and o != "w8a8" for r in V.variant(o, n).refs}
            cases[dtype] = V.prepare(spec, dtype, 0, needed)
        c = cases[dtype]
        try:
            fns[label] = w8a8(c, name == "prepacked") if v is None else v.build(c)
        except V.Skip as e:
            print(f"  {label}: skipped ({e})")
            continue
        rec = V.check(v, fns[label], c)[0] if v else {"status": "ok"}
        if rec["status"] != "ok":
            raise SystemExit(f"{label}: {rec['reason']}")
        rates[label] = c.flops["fwd" if v is None else v.flops]
        kinds[label] = "int8" if op in ("quant", "w8a8") else "widen" if name == "rd-widen" else dtype
    quiet = dict(warmup=2, pause_s=0.2) if rounds > 1 else dict(warmup=0)  # torch's threads spin: pause
    times = {k: summary(ts)["median"] for k, ts in interleaved(fns, rounds=rounds, **quiet).items()}
    torch_best = {}
    for label, t in times.items():
        if label.startswith("torch"):
            torch_best[kinds[label]] = min(t, torch_best.get(kinds[label], t))
    table = []
    for label, t in times.items():
        gf, tb, ours = rates[label] / t / 1e9, torch_best.get(kinds[label]), not label.startswith("torch")
        table.append([label, C.fmt(1e3 * t, 2), C.fmt(gf), C.fmt(times["rd float32"] / t, 2),
                      C.fmt(tb / t, 2) if tb and ours else "",
                      C.fmt(100 * gf / peak_of[kinds[label]]) if ours else ""])
    print(f"\n{spec.name} ({spec.describe()})")
    print(C.format_table(["variant", "ms", "GFLOP/s", "x f32", "x torch", "%peak"], table))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="half-size shapes")
    p.add_argument("--smoke", action="store_true", help="1/16 sizes, one round: checks the script")
    p.add_argument("--repeat", type=int, default=7, help="rounds")
    a = p.parse_args()
    V.need_torch()[0].set_num_threads(raggeddot.get_num_threads())
    ys, threads = C.yardsticks(0.02 if a.smoke else 0.5, 0.05, 64), str(raggeddot.get_num_threads())
    pk = {d: (p["gflops"] or {}).get(threads) for d, p in ys["native_peaks"].items()}  # float16: the FMA's
    print("\n".join([C.describe_machine(C.machine_info()), *C.describe_yardsticks(ys)]))
    for spec, rows in TABLES:
        scale = 1 / 16 if a.smoke else 0.5 if a.quick else 1.0
        run_table(spec.resized(scale), rows, 1 if a.smoke else a.repeat,
                  {"float32": pk["float16"], "widen": pk["float16"], "bfloat16": pk["bfloat16"],
                   "int8": pk["int8"] or pk["float16"]})


if __name__ == "__main__":
    main()

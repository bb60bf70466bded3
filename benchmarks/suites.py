"""The suites of run.py: fixed variants timed together in interleaved rounds (common.medians), so
that a drifting load weighs on all alike, medians of --repeat rounds (--quick: smaller shapes,
--smoke: 1/16 sizes, one round); every variant is checked before it is timed.

lowp: a table a shape of LOWP (--quick: half the sizes); rows: run.py's variants (checked as
  there) and moe_block with int8 weights and activation_qtype="int8" (QArrays, and prepacked;
  checked against moe_block on the dequantized weights). Columns: ms, GFLOP/s, x f32 and x torch:
  raggeddot float32's and the best torch row's of its dtype time over the row's, %peak: of the
  measured peak of the instruction it runs (TDPBF16PS / TDPBUSD, vdpbf16ps, vpdpbusd, else FMA).
experts: transformers' experts implementations (--variants; default eager, grouped_mm, raggeddot)
  in a Qwen3-MoE-shaped model (SHAPE, random init), one model per --dtype, ms: prefill (1024
  tokens, KV cache on), decode (one token on a cache of 1024), train (forward + backward of the
  language-model loss at 512 tokens; float32).
jax: raggeddot.jax's custom calls in jax.jit against jax.jit(jax.lax.ragged_dot) (at most 3 rounds)
  and raggeddot's NumPy call on the same buffers (the FFI's cost): ragged_dot, and a JAX MoE layer
  forward + backward (value_and_grad under jit).
decode: benchmarks/decode.py.
"""
from __future__ import annotations

import importlib

import numpy as np

import common as C
import variants as V
import raggeddot
from raggeddot import specs
from decode import run_decode

#: raggeddot float32, bfloat16 as auto serves it (AMX tiles on a Xeon with them), on vdpbf16ps
#: named, and with the widening path forced: rows of a table
RD = [("rd float32", "float32", "raggeddot"), ("rd bfloat16", "bfloat16", "raggeddot"),
      ("rd bfloat16 vdpbf16ps", "bfloat16", "rd-vdpbf16"), ("rd bfloat16 widening", "bfloat16", "rd-widen")]
_MOE = dict(op="moe", shape=dict(T=8192, d=2048, f=768, E=64, top_k=8, shared=0), options=dict(norm_topk_prob=True))
INT8 = ("rd int8 per-channel", "float32", "quant", "int8")


def _rows(op: str, *more) -> list:
    return [*((label, dt, op, name) for label, dt, name in RD), *more]


#: lowp: per table, its spec and rows (label, dtype, benchmark of run.py or "w8a8", variant)
LOWP = [
    (specs.Spec("dense-4096x4096x4096", "ragged_dot", dict(m=4096, k=4096, n=4096, g=1)), _rows(
        "ragged_dot", INT8, ("rd int8 block-128", "float32", "quant", "int8-sub128"),
        ("torch bfloat16 matmul", "bfloat16", "ragged_dot", "torch-dense"),
        ("torch float32 matmul", "float32", "ragged_dot", "torch-dense"),
        ("torch int8 _int_mm", "float32", "quant", "torch-int8"))),
    *((spec, _rows("ragged_dot", ("rd bfloat16 prepacked", "bfloat16", "ragged_dot", "rd-prepacked"), INT8,
                   ("torch bfloat16 loop", "bfloat16", "ragged_dot", "torch-loop"),
                   ("torch bfloat16 _grouped_mm", "bfloat16", "ragged_dot", "torch-gmm")))
      for spec in (specs.Spec("qwen3-m16384-g64-skewed", "ragged_dot", dict(m=16384, k=2048, n=768, g=64), "skewed"),
                   specs.get("deepseek-m4096-g256-balanced"))),
    (specs.Spec("moe-T8192-d2048-f768-E64-top8", **_MOE), _rows(
        "moe", ("rd w8a8 int8", "float32", "w8a8", "plain"), ("rd w8a8 int8 prepacked", "float32", "w8a8", "prepacked"),
        ("torch bfloat16 expert loop", "bfloat16", "moe", "torch"))),
    (specs.Spec("moe-fwd+bwd-T8192-d2048-f768-E64-top8", **_MOE), _rows("moe-bwd")),
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

    C.require_close(f"w8a8 {'prepacked' if prepacked else ''}", fn(), ref)
    return fn


def _variant(op: str, name: str):
    """The run.py variant of a LOWP row (None: a w8a8 row)."""
    return None if op == "w8a8" else V.variant("moe", name, "fwd+bwd") if op == "moe-bwd" else V.variant(op, name)


def lowp_table(spec: specs.Spec, rows: list, rounds: int, peak_of: dict) -> dict:
    """One LOWP table: its rows checked, then timed in interleaved rounds, printed: {row: ms}."""
    cases, fns, rates, kinds = {}, {}, {}, {}
    for label, dtype, op, name in rows:
        v = _variant(op, name)
        if dtype not in cases:
            needed = {r for _, d, o, n in rows if d == dtype and o != "w8a8" for r in _variant(o, n).refs}
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
        kinds[label] = "int8" if op in ("quant", "w8a8") else {"rd-widen": "widen", "rd-vdpbf16": "vdpbf16"}.get(
            name, dtype)
    times, torch_best = C.medians(fns, rounds), {}
    for label, t in times.items():
        if label.startswith("torch"):
            torch_best[kinds[label]] = min(t, torch_best.get(kinds[label], t))
    table = []
    for label, t in times.items():
        gf, tb, ours = rates[label] / t / 1e9, torch_best.get(kinds[label]), not label.startswith("torch")
        table.append([label, C.fmt(1e3 * t, 2), C.fmt(gf), C.fmt(times["rd float32"] / t, 2),
                      C.fmt(tb / t, 2) if tb and ours else "",
                      C.fmt(100 * gf / peak_of[kinds[label]]) if ours and peak_of[kinds[label]] else ""])
    print(f"\n{spec.name} ({spec.describe()})")
    print(C.format_table(["variant", "ms", "GFLOP/s", "x f32", "x torch", "%peak"], table))
    return {label: 1e3 * t for label, t in times.items()}


def run_lowp(args, ctx) -> dict:
    pk = {d: (p["gflops"] or {}).get(str(ctx["rd_threads"])) for d, p in ctx["native_peaks"].items()}
    V.need_torch()[0].set_num_threads(ctx["rd_threads"])
    vdp = raggeddot.runtime.peak_gflops("avx512_bf16", ctx["rd_threads"], 0.5) or None
    peak_of = {"float32": pk["float16"], "widen": pk["float16"], "bfloat16": pk["bfloat16"],  # float16: FMA
               "int8": pk["int8"] or pk["float16"], "vdpbf16": vdp}
    scale = 0.5 if args.quick and not args.smoke else args.scale
    return {spec.name: lowp_table(spec.resized(scale), rows, 1 if args.smoke else args.repeat, peak_of)
            for spec, rows in LOWP}


#: experts: the model
SHAPE = dict(hidden_size=1024, num_hidden_layers=2, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512,
             intermediate_size=2048, num_attention_heads=16, num_key_value_heads=4, head_dim=64, vocab_size=4096,
             max_position_embeddings=4096, decoder_sparse_step=1, norm_topk_prob=True)


def run_experts(args, ctx) -> list:
    import torch
    import transformers

    importlib.import_module("raggeddot.torch")  # registers the "raggeddot" experts implementation

    impls = args.variants or ["eager", "grouped_mm", "raggeddot"]
    seq, train_seq, rounds = (128, 64, 1) if args.quick else (1024, 512, args.repeat)
    ids = torch.randint(0, SHAPE["vocab_size"], (1, seq), generator=torch.Generator().manual_seed(3))
    rows = []
    for dtype in args.dtype:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3MoeConfig(**SHAPE),
                                                              dtype=getattr(torch, dtype)).eval()
        res = {}

        def timed(name, fn, rounds=rounds):
            res[name] = C.medians({i: fn for i in impls}, rounds, before=model.set_experts_implementation)

        with torch.no_grad():
            timed("prefill", lambda: model(ids, use_cache=True, logits_to_keep=1))
            out = model(ids, use_cache=True, logits_to_keep=1)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)

            def decode():
                model(token, past_key_values=cache, use_cache=True)
                cache.crop(-1)   # back to the prefill's tokens
            timed("decode", decode, 4 * rounds)
        if dtype == "float32":
            model.train()

            def train():
                model.zero_grad(set_to_none=True)
                model(ids[:, :train_seq], labels=ids[:, :train_seq]).loss.backward()
            timed("train", train)
        rows += [{"dtype": dtype, "impl": i, **{k: 1e3 * v[i] for k, v in res.items()}} for i in impls]
    cols = ["prefill", "decode", "train"]
    print(C.format_table(["dtype", "impl", *(f"{c} ms" for c in cols)],
                         [[r["dtype"], r["impl"], *(C.fmt(r.get(c), 2) for c in cols)] for r in rows]))
    return rows


def jax_ragged_dot(jax, rj, m, k, n, g, rounds) -> dict:
    rng, jnp = np.random.default_rng(0), jax.numpy
    x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((g, k, n), dtype=np.float32) * 0.05)
    cuts = np.sort(rng.integers(0, m + 1, size=g - 1))  # random group sizes summing to m, some empty
    gs = jnp.asarray(np.diff(np.concatenate([[0], cuts, [m]])).astype(np.int32))
    ours, lax = jax.jit(rj.ragged_dot), jax.jit(jax.lax.ragged_dot)
    xn, wn, gn = np.asarray(x), np.asarray(w), np.asarray(gs)   # views of the same buffers
    a = np.asarray(ours(x, w, gs))
    np.testing.assert_allclose(a, raggeddot.ragged_dot(xn, wn, gn), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a, np.asarray(lax(x, w, gs)), rtol=1e-3, atol=1e-3)
    fns = {"raggeddot.jax": lambda: ours(x, w, gs), "numpy": lambda: raggeddot.ragged_dot(xn, wn, gn)}
    res = C.medians(fns, rounds, sync=jax.block_until_ready)
    res.update(C.medians({"jax.lax": lambda: lax(x, w, gs)}, min(rounds, 3), sync=jax.block_until_ready))
    return dict(case="ragged_dot", m=m, k=k, n=n, g=g, seconds=res, ffi_over_numpy=res["raggeddot.jax"] /
                res["numpy"], speedup_vs_lax=res["jax.lax"] / res["raggeddot.jax"])


def jax_moe(jax, rj, tokens, d, f, E, rounds, top_k=2) -> dict:
    rng, jnp = np.random.default_rng(1), jax.numpy

    def layer(params, x, ragged_dot):  # top-k routing, tokens sorted by expert, SwiGLU experts, combine
        router, w0, w1, wo = params
        weights, chosen = jax.lax.top_k(jax.nn.softmax(x @ router, axis=-1), top_k)
        flat = chosen.reshape(-1)
        order = jnp.argsort(flat, stable=True)
        token, sizes = order // top_k, jnp.bincount(flat, length=E).astype(jnp.int32)
        h = jax.nn.silu(ragged_dot(x[token], w0, sizes)) * ragged_dot(x[token], w1, sizes)
        y = ragged_dot(h, wo, sizes) * weights.reshape(-1)[order][:, None]
        return jnp.zeros_like(x).at[token].add(y)

    def a(*shape, scale=1.0):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale)

    params = (a(d, E, scale=0.1), a(E, d, f, scale=d ** -0.5), a(E, d, f, scale=d ** -0.5),
              a(E, f, d, scale=f ** -0.5))
    x = a(tokens, d)
    ours, lax = (jax.jit(jax.value_and_grad(lambda p, x, rd=rd: jnp.mean(layer(p, x, rd) ** 2), (0, 1)))
                 for rd in (rj.ragged_dot, jax.lax.ragged_dot))
    for p, q in zip(jax.tree.leaves(ours(params, x)), jax.tree.leaves(lax(params, x))):
        np.testing.assert_allclose(np.asarray(p), np.asarray(q), rtol=2e-3, atol=2e-5)
    res = C.medians({"raggeddot.jax": lambda: ours(params, x), "jax.lax": lambda: lax(params, x)}, rounds,
                  sync=jax.block_until_ready)
    return dict(case="moe_fwd_bwd", tokens=tokens, d=d, f=f, experts=E, top_k=top_k, seconds=res,
                speedup_vs_lax=res["jax.lax"] / res["raggeddot.jax"])


def run_jax(args, ctx) -> list:
    import jax
    import raggeddot.jax as rj

    jax.config.update("jax_platforms", "cpu")
    rounds = 1 if args.smoke else args.repeat
    out = [jax_ragged_dot(jax, rj, *((512, 256, 128, 8) if args.quick else (4096, 2048, 768, 64)), rounds),
           jax_moe(jax, rj, *((256, 64, 128, 16) if args.quick else (2048, 512, 1024, 16)), rounds)]
    for rec in out:
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items() if k != "seconds"},
              {k: round(1e3 * v, 3) for k, v in rec["seconds"].items()}, "ms")
    return out


#: run.py's name of each suite: (function, default --repeat)
SUITES = {"lowp": (run_lowp, 7), "experts": (run_experts, 3), "jax": (run_jax, 5), "decode": (run_decode, 7)}

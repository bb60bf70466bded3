"""decode (run.py decode): the products of serving, a few tokens a step, timed by the reading of
the active experts' weights (README: "Decode").

Each weight format prepacked (formats()), checked first against moe_block / ragged_dot on its
dequantized weights, timed in interleaved rounds with a read-bandwidth probe (256 MB, at
raggeddot's threads) in every round, medians; three tables:
  layer: moe_block forward (softmax top-k, SiLU experts, bfloat16 tokens) of the LAYERS at TOKENS,
    and transformers' eager expert loop in torch, bfloat16 weights, in the same rounds.
  hf: transformers' Qwen3-MoE block on the "raggeddot" experts (bfloat16, MXFP4 held with float
    rows and with int8 rows) against its eager loop, at TOKENS (hf_table).
  rows: ragged_dot on prepacked weights, 64 experts x [2048, 768], ROWS rows an expert, float32
    and bfloat16 rows.
Columns: ms; GB/s: the active experts' bytes in the format (values, scales) over the time; %bw:
of the read bandwidth of the same rounds; tok/s; x torch: torch's time over ours; x bf16:
bfloat16 weights' time over the format's. --quick: a quarter of the experts (top-k kept), at most
three rounds; --smoke: 1/16 of the widths, one round.
"""
from __future__ import annotations

import importlib.util
import itertools

import ml_dtypes
import numpy as np

import common as C
import moe_baselines as MB
import raggeddot
from raggeddot import quant, runtime

LAYERS = {"qwen3-30b-a3b": dict(E=128, top_k=8, d=2048, f=768), "gpt-oss-20b": dict(E=32, top_k=4, d=2880, f=2880)}
TOKENS = (1, 4, 16, 64)
STEPS = 16      # token batches a layer's calls take in turn
ROWS = (1, 2, 4, 8)
A8 = {"activation_qtype": "int8"}


def formats(w: np.ndarray) -> dict:
    """{format: (weights as the format holds them, prepacked, moe_block options)} of float32
    weights w (bfloat16: held as w, rounded where read)."""
    tile = dict(channelwise_axes=(0, 2), tiled_axes={1: 32})
    q = {"int8": quant.quantize(w, "int8", channelwise_axes=(0, 2)), "int4": quant.quantize(w, "int4", **tile),
         "mxfp4": quant.quantize(w, "mxfp4", **tile)}
    return {"bfloat16": (w, raggeddot.prepack(w.astype(ml_dtypes.bfloat16)), {}),
            **{k: (v, raggeddot.prepack(v), {}) for k, v in q.items()},
            **{name: (q[k], raggeddot.prepack(q[k], lhs_dtype=np.int8), A8)
               for name, k in (("w8a8", "int8"), ("w4a8 int4", "int4"), ("w4a8 mxfp4", "mxfp4"))}}


def values(w, e=None) -> np.ndarray:
    """float64 values of weights ``w`` as a format holds them (of expert e only, when given)."""
    if isinstance(w, quant.QArray):
        return quant.dequantize(w if e is None else w[e:e + 1])[0 if e is not None else slice(None)] \
            .astype(np.float64)
    return (w if e is None else w[e]).astype(ml_dtypes.bfloat16).astype(np.float64)


def nbytes(w) -> float:
    """Bytes an expert's weight holds in its format: values (4-bit ones, int4 and MXFP4, at half
    a byte, as prepack lays them out) and scales."""
    if isinstance(w, quant.QArray):
        per = w.qvalue.size * (0.5 if w.qtype in ("mxfp4", "int4") else w.qvalue.itemsize) + np.asarray(w.scale).nbytes
        return per / w.shape[0]
    return w.size * 2 / w.shape[0]     # held in bfloat16


def layer_ref(x, router, top_k, plain) -> np.ndarray:
    """The layer (softmax top-k, SiLU experts) in float64 NumPy on the format's values, expert
    by expert of the tokens' choices."""
    logits = x.astype(np.float64) @ router
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for e in np.argsort(-p[t], kind="stable")[:top_k]:
            w0, w1, wo = (values(w, e) for w in plain)
            g, u = x[t].astype(np.float64) @ w0, x[t].astype(np.float64) @ w1
            out[t] += p[t, e] * ((g / (1 + np.exp(-g)) * u) @ wo)
    return out


def timed(fns: dict, rounds: int, threads: int) -> tuple[dict, float]:
    """Medians of fns in interleaved rounds, and the median of the read bandwidth probes run as
    one more variant of the same rounds."""
    bw = []
    t = C.medians(dict(fns, __bw=lambda: bw.append(runtime.read_bandwidth(threads, 256, 0.1))), rounds, warmup=1)
    del t["__bw"]
    return t, float(np.median(bw))


def figures(t: dict, bw: float, held) -> list:
    """A row a format of medians ``t``: ms, GB/s of its held(format) bytes, %bw of the read
    bandwidth ``bw`` of the same rounds, x bf16."""
    gbs = {k: held(k) / s / 1e9 for k, s in t.items()}
    return [dict(format=k, ms=1e3 * s, gbs=gbs[k], pct_bw=100 * gbs[k] / bw, read_gbs=bw, x_bf16=t["bfloat16"] / s)
            for k, s in t.items()]


def layer_table(name, shape, args, torch, rng, threads) -> list:
    E = shape["E"] // (4 if args.quick and not args.smoke else 1)
    d, f = (max(64, int(shape[k] * args.scale) // 32 * 32) for k in ("d", "f"))
    top_k = shape["top_k"]
    w = [rng.standard_normal(s, dtype=np.float32) * np.float32(s[1] ** -0.5) for s in ((E, d, f),) * 2 + ((E, f, d),)]
    router = rng.standard_normal((d, E)).astype(np.float32) * np.float32(0.1)
    per = [formats(x) for x in w]
    fm = {k: [p[k] for p in per] for k in per[0]}
    del per
    rows = []
    for T in TOKENS if not args.smoke else TOKENS[:2]:
        # each call takes the next of STEPS token batches, routed anew (as decode steps are): the
        # experts' weights of the call before are not the ones read (with one batch the same
        # experts' bytes stayed partly in the last-level cache from one round to the next)
        xs = [rng.standard_normal((T, d)).astype(np.float32) for _ in range(STEPS)]
        xbs = [x.astype(ml_dtypes.bfloat16) for x in xs]
        active = np.mean([np.count_nonzero(raggeddot.moe_block(xb, router, *(v[1] for v in fm["bfloat16"]),
                                                                top_k=top_k, return_aux=True)[1]["group_sizes"])
                          for xb in xbs])
        fns = {}
        for k, ws in fm.items():
            fns[k] = (lambda ws=ws, nxt=itertools.cycle(xbs).__next__: raggeddot.moe_block(
                nxt(), router, *(v[1] for v in ws), top_k=top_k, **ws[0][2]))
            if T == TOKENS[0]:      # checked once, on one token
                C.require_close(f"decode {name} {k}", raggeddot.moe_block(
                    xbs[0], router, *(v[1] for v in ws), top_k=top_k, **ws[0][2]).astype(np.float64),
                    layer_ref(xbs[0].astype(np.float32), router, top_k, [v[0] for v in ws]))
        if torch is not None:
            i32 = {"x": xs, "router_weights": router, "ct": xs[0], "options": {"top_k": top_k},
                   "w0": w[0], "w1": w[1], "wo": w[2]}
            fns["torch bf16 loop"] = MB.torch_fn(torch, i32, False, "bfloat16")
        t, bw = timed(fns, args.repeat, threads)
        held = {k: sum(nbytes(v[0]) for v in ws) * active for k, ws in fm.items()}   # (torch: bfloat16)
        rows += [dict(r, layer=name, tokens=T, active=round(float(active), 1), tok_s=T / t[r["format"]],
                      x_torch=t.get("torch bf16 loop", np.nan) / t[r["format"]])
                 for r in figures(t, bw, lambda k: held["bfloat16" if k.startswith("torch") else k])]
    return rows


def rows_table(args, rng, threads) -> list:
    g, k, n = (64 // (4 if args.quick and not args.smoke else 1), max(64, int(2048 * args.scale)),
               max(64, int(768 * args.scale)))
    w = rng.standard_normal((g, k, n), dtype=np.float32) * np.float32(0.02)
    fm = formats(w)
    dense = {name: values(plain).astype(np.float32) for name, (plain, _, _) in fm.items()}
    out = []
    for lhs in ("float32", "bfloat16"):
        for r in ROWS if not args.smoke else ROWS[:2]:
            gs = np.full(g, r, dtype=np.int64)
            x = rng.standard_normal((g * r, k)).astype(np.float32)
            xl = x.astype(ml_dtypes.bfloat16 if lhs == "bfloat16" else np.float32)
            fns = {}
            for name, (plain, packed, kw) in fm.items():
                # int8 activations quantized per row by the kernels while they pack them
                fns[name] = (lambda p=packed, q=bool(kw): raggeddot.ragged_dot(
                    raggeddot.AsQArray(xl, "int8", channelwise_axes=(0,)) if q else xl, p, gs))
                C.require_close(f"decode rows {name}", np.asarray(fns[name](), np.float32),
                                raggeddot.ragged_dot(xl.astype(np.float32), dense[name], gs))
            out += [dict(row, lhs=lhs, rows=r) for row in figures(*timed(fns, args.repeat, threads),
                                                                   lambda name: nbytes(fm[name][0]) * g)]
    return out


def hf_table(args, torch, rng, threads) -> list:
    """transformers' Qwen3-MoE block (the qwen3 shape of LAYERS, bfloat16 tokens) on the "raggeddot"
    experts implementation: bfloat16 experts, and experts held in MXFP4 (quantize_experts_mxfp4)
    multiplying float rows and int8 rows (set_activation_qtype); transformers' eager loop on the
    bfloat16 experts, in the same rounds. The bfloat16 experts hold the MXFP4 values (exact in
    bfloat16), so that every variant is checked against the eager loop."""
    import copy
    import raggeddot.torch as rt
    from transformers.models.qwen3_moe import modeling_qwen3_moe as Q
    shape = LAYERS["qwen3-30b-a3b"]
    E = shape["E"] // (4 if args.quick and not args.smoke else 1)
    d, f = (max(64, int(shape[k] * args.scale) // 32 * 32) for k in ("d", "f"))
    cfg = Q.Qwen3MoeConfig(hidden_size=d, moe_intermediate_size=f, num_experts=E, num_experts_per_tok=shape["top_k"],
                           norm_topk_prob=True)
    cfg._experts_implementation = "raggeddot"
    torch.manual_seed(int(rng.integers(1 << 31)))
    blocks = {k: Q.Qwen3MoeSparseMoeBlock(copy.deepcopy(cfg)).to(torch.bfloat16).eval() for k in ("bf16", "f4", "f4a8")}
    with torch.no_grad():
        for p in blocks["bf16"].parameters():
            p.normal_(0, d ** -0.5)
        for k in ("f4", "f4a8"):
            blocks[k].load_state_dict(blocks["bf16"].state_dict())
            rt.quantize_experts_mxfp4(blocks[k])
        ex = blocks["bf16"].experts      # the MXFP4 values, exactly
        for name in ("gate_up_proj", "down_proj"):
            q = blocks["f4"].experts._raggeddot_mxfp4[name].unpack()       # [E, in, out]
            getattr(ex, name).copy_(torch.from_numpy(quant.dequantize(q).transpose(0, 2, 1).copy()))
    rt.set_activation_qtype(blocks["f4a8"], "int8")

    def call(blk, xs, impl="raggeddot"):     # (the token batches in turn, as layer_table's calls)
        nxt = itertools.cycle(xs).__next__

        def fn(x=None):
            blk.experts.config._experts_implementation = impl
            with torch.no_grad():
                return blk(nxt() if x is None else x)
        return fn
    held = {"bfloat16": 3 * d * f * 2, "torch bf16 loop": 3 * d * f * 2, "mxfp4": 3 * d * f * 17 / 32}
    held["w4a8 mxfp4"] = held["mxfp4"]
    rows = []
    for T in TOKENS if not args.smoke else TOKENS[:2]:
        xs = [torch.from_numpy(rng.standard_normal((1, T, d)).astype(np.float32)).to(torch.bfloat16)
              for _ in range(STEPS)]
        fns = {"bfloat16": call(blocks["bf16"], xs), "mxfp4": call(blocks["f4"], xs),
               "w4a8 mxfp4": call(blocks["f4a8"], xs), "torch bf16 loop": call(blocks["bf16"], xs, "eager")}
        want = fns["torch bf16 loop"](xs[0]).float().numpy()
        for k in ("bfloat16", "mxfp4", "w4a8 mxfp4"):
            C.require_close(f"decode hf {k}", fns[k](xs[0]).float().numpy(), want)
        with torch.no_grad():
            active = np.mean([len(torch.unique(blocks["bf16"].gate(x.view(-1, d))[2])) for x in xs])
        t, bw = timed(fns, args.repeat, threads)
        rows += [dict(r, tokens=T, active=round(float(active), 1), tok_s=T / t[r["format"]],
                      x_torch=t["torch bf16 loop"] / t[r["format"]])
                 for r in figures(t, bw, lambda k: held[k] * active)]
    return rows


def run_decode(args, ctx) -> dict:
    rng, threads = np.random.default_rng(args.seed), runtime.get_num_threads()
    try:
        import torch
        torch.set_num_threads(threads)
    except ImportError:
        torch = None
        print("torch not importable: no torch column")
    args.repeat = 1 if args.smoke else min(args.repeat, 3) if args.quick else args.repeat
    layers = [r for name, shape in LAYERS.items() for r in layer_table(name, shape, args, torch, rng, threads)]
    print(C.format_table(["layer", "tokens", "experts", "format", "ms", "GB/s", "%bw", "tok/s", "x torch", "x bf16"],
                         [[r["layer"], r["tokens"], r["active"], r["format"], C.fmt(r["ms"], 3), C.fmt(r["gbs"]),
                           C.fmt(r["pct_bw"]), C.fmt(r["tok_s"], 0), C.fmt(r["x_torch"], 2), C.fmt(r["x_bf16"], 2)]
                          for r in layers]))
    hf = []
    if torch is None or importlib.util.find_spec("transformers") is None:
        print("torch or transformers not importable: no table of transformers' MoE block")
    else:
        hf = hf_table(args, torch, rng, threads)
        print(C.format_table(["tokens", "experts", "transformers block", "ms", "GB/s", "%bw", "tok/s", "x torch"],
                             [[r["tokens"], r["active"], r["format"], C.fmt(r["ms"], 3), C.fmt(r["gbs"]),
                               C.fmt(r["pct_bw"]), C.fmt(r["tok_s"], 0), C.fmt(r["x_torch"], 2)] for r in hf]))
    rows = rows_table(args, rng, threads)
    print(C.format_table(["lhs", "rows", "format", "ms", "GB/s", "%bw", "read GB/s", "x bf16"],
                         [[r["lhs"], r["rows"], r["format"], C.fmt(r["ms"], 3), C.fmt(r["gbs"]), C.fmt(r["pct_bw"]),
                           C.fmt(r["read_gbs"]), C.fmt(r["x_bf16"], 2)] for r in rows]))
    return {"layer": layers, "hf": hf, "rows": rows, "threads": threads}

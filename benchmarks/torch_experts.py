"""transformers' experts implementations on a Qwen3-MoE-shaped model (random init).

Model: 2 layers, hidden 1024, 32 experts, top 4, expert width 512, 16 heads (4 KV
heads) of 64, vocabulary 4096. One model per dtype (float32, bfloat16) serves every
experts implementation (eager, grouped_mm, raggeddot; model.set_experts_implementation
switches between calls, outside the timing); each measure below times the
implementations in interleaved rounds (raggeddot._timing.interleaved: one call of each per
round, after a warm-up call each) and reports medians in ms:

- prefill: the forward of one sequence of 1024 tokens with the KV cache on, logits of
  the last position only (as generate() prefills); experts_share: the experts modules' share
  of it (forward hooks);
- decode: one token with a KV cache of 1024 (the cache is cropped back after each step);
- train: forward + backward of the language-model loss at sequence 512 (float32 only
  unless --train-bf16);
- experts_fwd, experts_fwd_bwd: the experts module of layer 0 alone on the prefill's shapes
  (1024 tokens, random top-4 routing), forward, and forward + backward as train.

    python benchmarks/torch_experts.py [--quick] [--json out.json]
"""
import argparse
import os
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

import raggeddot.torch  # noqa: E402,F401 - registers the "raggeddot" experts implementation
from raggeddot._timing import interleaved, summary  # noqa: E402

IMPLS = ("eager", "grouped_mm", "raggeddot")
SHAPE = dict(hidden_size=1024, num_hidden_layers=2, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512,
             intermediate_size=2048, num_attention_heads=16, num_key_value_heads=4, head_dim=64, vocab_size=4096,
             max_position_embeddings=4096, decoder_sparse_step=1, norm_topk_prob=True)


def medians(model, impls, fn, repeats) -> dict:
    """{impl: median seconds of fn()} with each experts implementation, in interleaved rounds."""
    times = interleaved({impl: fn for impl in impls}, rounds=repeats, pause_s=0.05,
                        before=model.set_experts_implementation)
    return {impl: summary(ts)["median"] for impl, ts in times.items()}


def experts_share(model, ids, impls):
    """{impl: the experts modules' seconds over the prefill's} of one prefill each."""
    spent, share = [], {}
    experts = [m for m in model.modules() if hasattr(m, "has_gate")]
    hooks = [h for m in experts for h in (m.register_forward_pre_hook(lambda *a: spent.append(-time.perf_counter())),
                                          m.register_forward_hook(lambda *a: spent.append(time.perf_counter())))]
    for impl in impls:
        model.set_experts_implementation(impl)
        spent.clear()
        t0 = time.perf_counter()
        model(ids, use_cache=True, logits_to_keep=1)
        share[impl] = sum(spent) / (time.perf_counter() - t0)
    for h in hooks:
        h.remove()
    return share, experts[0]


def measure_dtype(dtype, impls, a) -> dict:
    """{impl: {measure: ms}} of one dtype."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3MoeConfig(**SHAPE), dtype=dtype).eval()
    ids = torch.randint(0, SHAPE["vocab_size"], (1, a.seq), generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(a.seq, SHAPE["hidden_size"], generator=gen).to(dtype)
    w, idx = torch.topk(torch.softmax(torch.randn(a.seq, SHAPE["num_experts"], generator=gen), -1),
                        SHAPE["num_experts_per_tok"], dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    res = {}
    with torch.no_grad():
        share, mod = experts_share(model, ids, impls)
        res["prefill"] = medians(model, impls, lambda: model(ids, use_cache=True, logits_to_keep=1), a.repeats)
        out = model(ids, use_cache=True, logits_to_keep=1)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)

        def decode():
            model(token, past_key_values=cache, use_cache=True)
            cache.crop(-1)   # back to the prefill's tokens
        res["decode"] = medians(model, impls, decode, a.repeats * 4)
        res["experts_fwd"] = medians(model, impls, lambda: mod(x, idx, w), a.repeats)
    if dtype == torch.float32 or a.train_bf16:
        model.train()
        xg, train_ids = x.clone().requires_grad_(), ids[:, :a.train_seq]

        def train():
            model.zero_grad(set_to_none=True)
            model(train_ids, labels=train_ids).loss.backward()

        def experts_fwd_bwd():
            mod.zero_grad(set_to_none=True)
            mod(xg, idx, w).sum().backward()
        res["train"] = medians(model, impls, train, a.repeats)
        res["experts_fwd_bwd"] = medians(model, impls, experts_fwd_bwd, a.repeats)
    return {impl: dict({k: 1e3 * v[impl] for k, v in res.items()}, experts_share=share[impl]) for impl in impls}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--train-seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-bf16", action="store_true")
    ap.add_argument("--quick", action="store_true", help="sequence 128, train 64, 1 repeat (a smoke run)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.quick:
        a.seq, a.train_seq, a.repeats = 128, 64, 1
    info = C.machine_info({"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                           "transformers": transformers.__version__})
    print(f"{C.describe_machine(info)}\ntorch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"transformers {transformers.__version__}")
    impls, rows, cols = a.impls.split(","), [], ["prefill", "experts_share", "decode", "experts_fwd", "train",
                                                  "experts_fwd_bwd"]
    for dn in a.dtypes.split(","):
        for impl, r in measure_dtype(getattr(torch, dn), impls, a).items():
            rows.append(dict(r, dtype=dn, impl=impl))
    print("ms (experts_share: a fraction of the prefill)")
    print(C.format_table(["dtype", "impl", *cols], [[r["dtype"], r["impl"], *(C.fmt(r.get(c), 3 if c == "experts_share"
                                                                                   else 2) for c in cols)]
                                                    for r in rows]))
    if a.json:
        C.write_json(a.json, {"machine": info, "rows": rows, "args": vars(a)})


if __name__ == "__main__":
    main()

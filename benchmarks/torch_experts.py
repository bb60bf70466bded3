"""transformers' experts implementations in a Qwen3-MoE-shaped model (random init).

Model: 2 layers, hidden 1024, 32 experts, top 4, expert width 512, 16 heads (4 KV
heads) of 64, vocabulary 4096. One model per dtype (float32, bfloat16) serves every
experts implementation (eager, grouped_mm, raggeddot; model.set_experts_implementation
switches between calls, outside the timing); each measure times the implementations in
interleaved rounds (raggeddot._timing.interleaved: one call of each per round, after a
warm-up call each) and reports medians in ms:

- prefill: the forward of one sequence of 1024 tokens with the KV cache on, logits of
  the last position only (as generate() prefills);
- decode: one token with a KV cache of 1024 (the cache is cropped back after each step);
- train: forward + backward of the language-model loss at sequence 512 (float32 only
  unless --train-bf16).

    python benchmarks/torch_experts.py [--quick] [--json out.json]
"""
import argparse
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

import raggeddot.torch  # noqa: E402,F401 - registers the "raggeddot" experts implementation
from raggeddot._timing import interleaved, summary  # noqa: E402

IMPLS = ("eager", "grouped_mm", "raggeddot")
SHAPE = dict(hidden_size=1024, num_hidden_layers=2, num_experts=32, num_experts_per_tok=4,
             moe_intermediate_size=512, intermediate_size=2048, num_attention_heads=16, num_key_value_heads=4,
             head_dim=64, vocab_size=4096, max_position_embeddings=4096, decoder_sparse_step=1, norm_topk_prob=True)


def medians(model, impls, fn, repeats) -> dict:
    """{impl: median seconds of fn()} with each experts implementation, in interleaved rounds."""
    times = interleaved({impl: fn for impl in impls}, rounds=repeats, pause_s=0.05,
                        before=model.set_experts_implementation)
    return {impl: summary(ts)["median"] for impl, ts in times.items()}


def measure_dtype(dtype, impls, a) -> dict:
    """{impl: {measure: ms}} of one dtype."""
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(**SHAPE)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    ids = torch.randint(0, SHAPE["vocab_size"], (1, a.seq), generator=torch.Generator().manual_seed(3))
    res = {}
    with torch.no_grad():
        def prefill():
            return model(ids, use_cache=True, logits_to_keep=1)
        res["prefill"] = medians(model, impls, prefill, a.repeats)
        out = prefill()
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)

        def decode():
            model(token, past_key_values=cache, use_cache=True)
            cache.crop(-1)   # back to the prefill's tokens
        res["decode"] = medians(model, impls, decode, a.repeats * 4)
    if dtype == torch.float32 or a.train_bf16:
        model.train()
        train_ids = ids[:, :a.train_seq]

        def train():
            model.zero_grad(set_to_none=True)
            model(train_ids, labels=train_ids).loss.backward()
        res["train"] = medians(model, impls, train, a.repeats)
    return {impl: {k: 1e3 * v[impl] for k, v in res.items()} for impl in impls}


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
    impls, rows, cols = a.impls.split(","), [], ["prefill", "decode", "train"]
    for dn in a.dtypes.split(","):
        by_impl = measure_dtype(getattr(torch, dn), impls, a)
        rows += [dict(r, dtype=dn, impl=impl) for impl, r in by_impl.items()]
    print(C.format_table(["dtype", "impl", *(f"{c} ms" for c in cols)],
                         [[r["dtype"], r["impl"], *(C.fmt(r.get(c), 2) for c in cols)] for r in rows]))
    if a.json:
        C.write_json(a.json, {"machine": info, "rows": rows, "args": vars(a)})


if __name__ == "__main__":
    main()

"""transformers' experts implementations on a Qwen3-MoE-shaped model (random init).

Model: 2 layers, hidden 1024, 32 experts, top 4, expert width 512, 16 heads (4 KV
heads) of 64, vocabulary 4096. Timed, for experts_implementation eager / grouped_mm /
batched_mm / raggeddot, in float32 and bfloat16 (medians after warm-up):

- prefill: the forward of one sequence of 1024 tokens with the KV cache on, logits of
  the last position only (as generate() prefills), and the experts' share of it
  (forward hooks on the experts modules);
- decode: one token with a KV cache of 1024 (the cache is cropped back after each step);
- train: forward + backward of the language-model loss at sequence 512 (float32 only
  unless --train-bf16);
- experts: the experts module of layer 0 alone on the prefill's shapes (1024 tokens,
  random top-4 routing), forward, and forward + backward in float32;
- per-call overhead of raggeddot's torch operators at tiny shapes (microseconds),
  against the NumPy function they call.

batched_mm gathers each token's expert weights ([tokens*k, 2f, d]); it is skipped where
that copy would exceed --batched-limit GiB, and the report says so.

    python benchmarks/torch_experts.py [--quick] [--json out.json]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import raggeddot  # noqa: E402
import raggeddot.torch as rt  # noqa: E402

IMPLS = ("eager", "grouped_mm", "batched_mm", "raggeddot")
SHAPE = dict(hidden_size=1024, num_hidden_layers=2, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512,
             intermediate_size=2048, num_attention_heads=16, num_key_value_heads=4, head_dim=64, vocab_size=4096,
             max_position_embeddings=4096, decoder_sparse_step=1, norm_topk_prob=True)


def median_time(fn, repeats, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_name():
    """The model name, family/model numbers and whether the CPU has AVX512_BF16."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor()
    bf16 = "avx512_bf16" in info.get("flags", "").split()
    return (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')}"
            f"{', AVX512_BF16' if bf16 else ''})")


def build(impl, dtype, seed=0):
    cfg = transformers.Qwen3MoeConfig(**SHAPE)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation=impl, dtype=dtype)
    return model.eval()


def batched_fits(tokens, dtype, limit_gib):
    """batched_mm copies the gathered weights of every (token, expert) pair."""
    per_pair = 3 * SHAPE["hidden_size"] * SHAPE["moe_intermediate_size"] * torch.finfo(dtype).bits // 8
    return tokens * SHAPE["num_experts_per_tok"] * per_pair <= limit_gib * 2 ** 30


def experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "has_gate")]


def prefill_and_decode(model, ids, repeats, prefill_impl=None):
    """(prefill seconds, experts share of it, decode seconds); with
    ``prefill_impl`` the cache is filled by that implementation and only the
    decode steps are timed (prefill and share are then None)."""
    decode_impl = model.config._experts_implementation
    if prefill_impl is not None:
        model.set_experts_implementation(prefill_impl)
    spent = []

    def pre(mod, args):
        spent.append(-time.perf_counter())

    def post(mod, args, out):
        spent[-1] += time.perf_counter()
    hooks = [h for m in experts_modules(model) for h in (m.register_forward_pre_hook(pre),
                                                          m.register_forward_hook(post))]
    with torch.no_grad():
        prefill = share = None
        if prefill_impl is None:
            prefill = median_time(lambda: model(ids, use_cache=True, logits_to_keep=1), repeats)
            spent.clear()
        t0 = time.perf_counter()
        out = model(ids, use_cache=True, logits_to_keep=1)
        if prefill_impl is None:
            share = sum(spent) / (time.perf_counter() - t0)
        for h in hooks:
            h.remove()
        model.set_experts_implementation(decode_impl)
        cache = out.past_key_values
        token = out.logits[:, -1:].argmax(-1)

        def step():
            model(token, past_key_values=cache, use_cache=True)
            cache.crop(-1)   # back to the prefill's n tokens
        decode = median_time(step, repeats * 4, warmup=2)
    return prefill, share, decode


def train_step(model, ids, repeats):
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
    t = median_time(step, repeats)
    model.eval()
    return t


def experts_alone(model, tokens, dtype, repeats, backward):
    mod = experts_modules(model)[0]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, SHAPE["hidden_size"], generator=gen).to(dtype)
    logits = torch.randn(tokens, SHAPE["num_experts"], generator=gen)
    w, idx = torch.topk(torch.softmax(logits, -1), SHAPE["num_experts_per_tok"], dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    if not backward:
        with torch.no_grad():
            return median_time(lambda: mod(x, idx, w), repeats)
    xg = x.clone().requires_grad_()

    def fb():
        mod.zero_grad(set_to_none=True)
        mod(xg, idx, w).sum().backward()
    return median_time(fb, repeats)


def op_overheads(repeats=2000):
    """Microseconds per call of the torch operators and of the NumPy functions at tiny shapes."""
    g = torch.Generator().manual_seed(2)
    x, w, gs = torch.randn(4, 8, generator=g), torch.randn(4, 8, 8, generator=g), torch.tensor([1, 1, 1, 1])
    xn, wn, gn = x.numpy(), w.numpy(), gs.numpy()
    idx, sl = torch.arange(4), torch.arange(4).view(4, 1)
    cases = {"ragged_dot": (lambda: rt.ragged_dot(x, w, gs), lambda: raggeddot.ragged_dot(xn, wn, gn)),
             "gmm": (lambda: rt.gmm(x, w, gs), lambda: raggeddot.gmm(xn, wn, gn)),
             "tgmm": (lambda: rt.tgmm(x.t(), x, gs), lambda: raggeddot.tgmm(xn.T, xn, gn)),
             "ragged_gather": (lambda: rt.ragged_gather(x, idx), lambda: raggeddot.ragged_gather(xn, idx.numpy())),
             "ragged_gather_reduce": (lambda: rt.ragged_gather_reduce(x, sl),
                                      lambda: raggeddot.ragged_gather_reduce(xn, sl.numpy())),
             "gated_activation": (lambda: rt.gated_activation(x), None)}
    res = {}
    for name, (tfn, nfn) in cases.items():
        res[name] = {"torch_us": 1e6 * _per_call(tfn, repeats),
                     "numpy_us": None if nfn is None else 1e6 * _per_call(nfn, repeats)}
    return res


def _per_call(fn, n):
    for _ in range(50):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--train-seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-bf16", action="store_true")
    ap.add_argument("--batched-limit", type=float, default=3.0, help="GiB")
    ap.add_argument("--quick", action="store_true", help="sequence 128, train 64, 1 repeat (a smoke run)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.quick:
        a.seq, a.train_seq, a.repeats = 128, 64, 1
    print(f"# CPU: {cpu_name()}; torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
          f"{transformers.__version__}, raggeddot {raggeddot.get_num_threads()} threads; "
          f"load average {os.getloadavg()[0]:.1f}")
    rows = []
    for dn in a.dtypes.split(","):
        dtype = getattr(torch, dn)
        ids = torch.randint(0, SHAPE["vocab_size"], (1, a.seq), generator=torch.Generator().manual_seed(3))
        base = None
        for impl in a.impls.split(","):
            model = build(impl, dtype)
            if base is None:
                base = model.state_dict()
            model.load_state_dict(base)
            r = {"dtype": dn, "impl": impl}
            if impl == "batched_mm" and not batched_fits(a.seq, dtype, a.batched_limit):
                r["prefill"] = r["experts_fwd"] = f"skipped (weights copy per token > {a.batched_limit:g} GiB)"
                r["decode"] = prefill_and_decode(model, ids, a.repeats, prefill_impl="grouped_mm")[2]
                r["decode_note"] = "cache filled by grouped_mm"
            else:
                r["prefill"], r["experts_share"], r["decode"] = prefill_and_decode(model, ids, a.repeats)
                r["experts_fwd"] = experts_alone(model, a.seq, dtype, a.repeats, backward=False)
            if dn == "float32" or a.train_bf16:
                if impl == "batched_mm" and not batched_fits(a.train_seq, dtype, a.batched_limit):
                    r["train"] = r["experts_fwd_bwd"] = "skipped (weights copy per token)"
                else:
                    r["train"] = train_step(model, ids[:, :a.train_seq], max(1, a.repeats - (impl == "eager")))
                    r["experts_fwd_bwd"] = experts_alone(model, a.seq, dtype, a.repeats, backward=True)
            rows.append(r)
            print(json.dumps({k: (round(v * 1e3, 2) if isinstance(v, float) and k != "experts_share" else
                                  round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
            del model
    print("# times in ms; experts_share is a fraction of the prefill")
    ov = op_overheads()
    print("# per-call microseconds at tiny shapes (torch operator / NumPy function):")
    for name, v in ov.items():
        print(f"#   {name:22s} {v['torch_us']:7.1f} / " + ("-" if v["numpy_us"] is None else f"{v['numpy_us']:.1f}"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_name(), "rows": rows, "overheads_us": ov, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()

"""Peak memory of loading a gpt-oss checkpoint's experts in MXFP4 (README: "4-bit float weights:
float4_e2m1fn and MXFP4"): measured on a small gpt-oss (gpt-oss-20b's widths, fewer layers and
experts, a smaller vocabulary), each recipe ("meta": load_mxfp4_checkpoint into a meta-device
model; "bf16": from_config(dtype="bfloat16"), load_mxfp4_experts, load_state_dict) in a fresh
process, and scaled to gpt-oss-20b (counted on the meta device).

    python benchmarks/mxfp4_load.py [--layers 2] [--experts 4] [--vocab 8192]
"""
import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import common as C

GPT_OSS_20B = dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_local_experts=32,
                   num_attention_heads=64, num_key_value_heads=8, head_dim=64, vocab_size=201088,
                   num_experts_per_tok=4, sliding_window=128, tie_word_embeddings=False,
                   max_position_embeddings=131072)
EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


def model_of(config: dict, **kw):
    """A gpt-oss of ``config`` (its layers alternately sliding and full attention) with
    raggeddot's experts; ``kw``: from_config's (dtype)."""
    import transformers
    importlib.import_module("raggeddot.torch")  # registers the experts implementation
    n = config["num_hidden_layers"]
    cfg = transformers.GptOssConfig(**config, layer_types=(["sliding_attention", "full_attention"] * n)[:n])
    return transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation="raggeddot", **kw)


def load(args: dict) -> None:
    """The child process of a recipe: prints its memory figures as JSON."""
    import torch
    import raggeddot.torch as rt
    with torch.device("meta"):
        model_of({**args["config"], "hidden_size": 64, "intermediate_size": 64, "vocab_size": 64})
    base, start = C.vm("VmRSS"), time.perf_counter()
    if args["recipe"] == "meta":
        with torch.device("meta"):
            model = model_of(args["config"], dtype=torch.bfloat16)
        rt.load_mxfp4_checkpoint(model, args["files"])
    else:
        from safetensors import safe_open
        model, tensors = model_of(args["config"], dtype=torch.bfloat16), {}
        for f in args["files"]:
            with safe_open(f, "pt") as t:
                tensors.update({k: t.get_tensor(k) for k in t.keys()})
        rt.load_mxfp4_experts(model, tensors)
        model.load_state_dict({k: v for k, v in tensors.items() if not k.endswith(("_blocks", "_scales"))},
                              strict=False)
        del tensors
    seconds, peak = time.perf_counter() - start, C.vm("VmHWM")
    held = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    mxfp4 = sum(p.nbytes for m in model.modules() for p in getattr(m, "_raggeddot_mxfp4", {}).values())
    print(json.dumps({"base": base, "peak": peak, "held": held + mxfp4, "mxfp4": mxfp4, "seconds": seconds}))


def counts(config):
    """(expert weights, other parameters) of a gpt-oss of ``config``, counted on the meta device."""
    import torch
    with torch.device("meta"):
        model = model_of(config)
    experts = sum(p.numel() for name, p in model.named_parameters() if name.endswith(EXPERTS))
    return experts, sum(p.numel() for p in model.parameters()) - experts


def checkpoint(config, directory):
    """A gpt-oss checkpoint of a random model of ``config`` in three shards."""
    import torch
    from safetensors.torch import save_file
    import raggeddot
    torch.manual_seed(0)
    model, tensors = model_of(config, dtype=torch.bfloat16), {}
    for key, value in model.state_dict().items():
        if key.endswith(EXPERTS):
            q = raggeddot.quantize(value.float().numpy().transpose(0, 2, 1), "mxfp4", channelwise_axes=(0, 1),
                                   tiled_axes={2: 32})
            codes = np.ascontiguousarray(q.qvalue.codes)
            tensors[key + "_blocks"] = torch.from_numpy(codes.reshape(codes.shape[:2] + (-1, 16)))
            tensors[key + "_scales"] = torch.from_numpy(np.ascontiguousarray(q.scale.view(np.uint8)))
        else:
            tensors[key] = value.contiguous()
    del model
    keys = sorted(tensors)
    files = [os.path.join(directory, f"model-{i + 1:05d}-of-00003.safetensors") for i in range(3)]
    for i, path in enumerate(files):
        save_file({k: tensors[k] for k in keys[i::3]}, path)
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 2), ("experts", 4), ("vocab", 8192)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--load", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load:
        return load(json.loads(args.load))
    small = {**GPT_OSS_20B, "num_hidden_layers": args.layers, "num_local_experts": args.experts,
             "vocab_size": args.vocab, "num_experts_per_tok": min(4, args.experts)}
    (e20, o20), (es, os_), gib = counts(GPT_OSS_20B), counts(small), 2 ** 30
    env = {**os.environ, "RAGGEDDOT_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as d:
        files = checkpoint(small, d)
        runs = {recipe: json.loads(subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--load",
             json.dumps({"config": small, "files": files, "recipe": recipe})],
            capture_output=True, text=True, env=env, check=True).stdout.strip().splitlines()[-1])
            for recipe in ("meta", "bf16")}
    print(f"small gpt-oss: {args.layers} layers x {args.experts} experts, d = f = 2880, vocab {args.vocab}: "
          f"{es / 1e9:.3f} G expert weights ({2 * es / gib:.2f} GiB in bfloat16), {os_ / 1e9:.3f} G others")
    print(f"gpt-oss-20b (counted on the meta device): {e20 / 1e9:.2f} G expert weights "
          f"({2 * e20 / gib:.1f} GiB in bfloat16), {o20 / 1e9:.3f} G others ({2 * o20 / gib:.2f} GiB)")
    bits = 8 * runs["meta"]["mxfp4"] / es          # bytes a weight as held (panels and exponent copy)
    for recipe, r in runs.items():
        grown, held = r["peak"] - r["base"], r["held"]
        rest = grown - held
        if recipe == "meta":
            est = r["base"] + e20 * bits / 8 + 2 * o20 + rest * GPT_OSS_20B["num_local_experts"] / args.experts
        else:       # the bfloat16 experts made first, then the checkpoint's tensors: all grows with the weights
            est = r["base"] + grown * (e20 + o20) / (es + os_)
        print(f"{recipe:>5}: peak {r['peak'] / gib:.3f} GiB, grown {grown / gib:.3f} GiB = held "
              f"{held / gib:.3f} + in flight {rest / gib:.3f}; {r['seconds']:.1f} s; "
              f"gpt-oss-20b: about {est / gib:.1f} GiB")
    print(f"MXFP4 experts held at {bits:.2f} bits a weight")


if __name__ == "__main__":
    main()

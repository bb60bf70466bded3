"""Peak memory of loading a gpt-oss checkpoint's experts in MXFP4, measured on a small
gpt-oss (gpt-oss-20b's widths, fewer layers and experts, a smaller vocabulary) and scaled
to gpt-oss-20b by its parameter counts.

    python benchmarks/mxfp4_load.py [--layers 2] [--experts 4] [--vocab 8192]

A checkpoint in gpt-oss's names and layout (experts as ``*_blocks`` / ``*_scales``, the
rest bfloat16, three safetensors shards) is written to a temporary directory; each recipe
then runs in a fresh process, which reports VmHWM (its peak resident memory) over its
memory after the imports and a first model of the same class built on the meta device:

- "meta", the README's: ``with torch.device("meta"): from_config(...)``, then
  ``raggeddot.torch.load_mxfp4_checkpoint(model, files)``;
- "bf16", the recipe it replaces: ``from_config(..., dtype="bfloat16")`` (every expert
  parameter allocated and initialised), then ``load_mxfp4_experts`` and ``load_state_dict``.

The growth splits into H, the bytes the loaded model holds (its parameters and buffers,
the MXFP4 experts as their PackedRhs hold them), counted after loading, and X, the rest
(tensors in flight, allocator slack). For gpt-oss-20b, built on the meta device to count
its parameters (nothing allocated), H is counted with the same bytes per weight, and X is
scaled by the experts per layer (the largest tensor in flight is one expert weight's
blocks, which grows with the expert count, not with the layer count). The "bf16" recipe's
growth is scaled by the parameter count.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np

GPT_OSS_20B = dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_local_experts=32,
                   num_attention_heads=64, num_key_value_heads=8, head_dim=64, vocab_size=201088,
                   num_experts_per_tok=4, sliding_window=128, tie_word_embeddings=False,
                   max_position_embeddings=131072)

RUN = textwrap.dedent('''
    import json, sys, time, torch, transformers
    import raggeddot.torch as rt

    def vm(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    args = json.loads(sys.argv[1])
    layers = ["sliding_attention", "full_attention"] * (args["config"]["num_hidden_layers"] // 2 + 1)
    cfg = transformers.GptOssConfig(**args["config"], layer_types=layers[:args["config"]["num_hidden_layers"]])
    tiny = transformers.GptOssConfig(**{**args["config"], "hidden_size": 64, "intermediate_size": 64,
                                        "vocab_size": 64}, layer_types=cfg.layer_types)
    with torch.device("meta"):
        transformers.AutoModelForCausalLM.from_config(tiny, experts_implementation="raggeddot")
    base, start = vm("VmRSS"), time.perf_counter()
    if args["recipe"] == "meta":
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, experts_implementation="raggeddot", dtype=torch.bfloat16)
        rt.load_mxfp4_checkpoint(model, args["files"])
    else:
        from safetensors import safe_open
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, experts_implementation="raggeddot", dtype=torch.bfloat16)
        tensors = {}
        for f in args["files"]:
            with safe_open(f, "pt") as t:
                tensors.update({k: t.get_tensor(k) for k in t.keys()})
        rt.load_mxfp4_experts(model, tensors)
        model.load_state_dict({k: v for k, v in tensors.items() if not k.endswith(("_blocks", "_scales"))},
                              strict=False)
        del tensors
    seconds, peak = time.perf_counter() - start, vm("VmHWM")
    held = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    mxfp4 = sum(p.nbytes for m in model.modules() for p in getattr(m, "_raggeddot_mxfp4", {}).values())
    print(json.dumps({"base": base, "peak": peak, "held": held + mxfp4, "mxfp4": mxfp4, "seconds": seconds}))
''')


def counts(config):
    """(expert weights, other parameters and persistent buffers) of a gpt-oss of
    ``config``, counted on the meta device."""
    import torch
    import transformers
    import raggeddot.torch  # noqa: F401  (registers the experts implementation)
    layers = ["sliding_attention", "full_attention"] * (config["num_hidden_layers"] // 2 + 1)
    cfg = transformers.GptOssConfig(**config, layer_types=layers[:config["num_hidden_layers"]])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation="raggeddot")
    experts = other = 0
    for name, p in model.named_parameters():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            experts += p.numel()
        else:
            other += p.numel()
    return experts, other


def checkpoint(config, directory):
    """A gpt-oss checkpoint of a random model of ``config`` in three shards."""
    import torch
    import transformers
    from safetensors.torch import save_file
    import raggeddot
    import raggeddot.torch  # noqa: F401
    layers = ["sliding_attention", "full_attention"] * (config["num_hidden_layers"] // 2 + 1)
    cfg = transformers.GptOssConfig(**config, layer_types=layers[:config["num_hidden_layers"]])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation="raggeddot",
                                                          dtype=torch.bfloat16)
    tensors = {}
    for key, value in model.state_dict().items():
        if key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            q = raggeddot.quantize(value.float().numpy().transpose(0, 2, 1), "mxfp4", channelwise_axes=(0, 1),
                                   tiled_axes={2: 32})
            codes = np.ascontiguousarray(q.qvalue.codes)
            tensors[key + "_blocks"] = torch.from_numpy(codes.reshape(codes.shape[:2] + (-1, 16)))
            tensors[key + "_scales"] = torch.from_numpy(np.ascontiguousarray(q.scale.view(np.uint8)))
        else:
            tensors[key] = value.contiguous()
    del model
    keys, files = sorted(tensors), []
    for i in range(3):
        files.append(os.path.join(directory, f"model-{i + 1:05d}-of-00003.safetensors"))
        save_file({k: tensors[k] for k in keys[i::3]}, files[-1])
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    small = {**GPT_OSS_20B, "num_hidden_layers": args.layers, "num_local_experts": args.experts,
             "vocab_size": args.vocab, "num_experts_per_tok": min(4, args.experts)}
    e20, o20 = counts(GPT_OSS_20B)
    es, os_ = counts(small)
    gib = 2 ** 30
    with tempfile.TemporaryDirectory() as d:
        files = checkpoint(small, d)
        runs = {}
        env = {**os.environ, "RAGGEDDOT_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        for recipe in ("meta", "bf16"):
            out = subprocess.run([sys.executable, "-c", RUN, json.dumps({"config": small, "files": files,
                                                                        "recipe": recipe})],
                                 capture_output=True, text=True, env=env, check=True)
            runs[recipe] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"small gpt-oss: {args.layers} layers x {args.experts} experts, d = f = 2880, vocab {args.vocab}: "
          f"{es / 1e9:.3f} G expert weights ({2 * es / gib:.2f} GiB in bfloat16), {os_ / 1e9:.3f} G others")
    print(f"gpt-oss-20b (counted on the meta device): {e20 / 1e9:.2f} G expert weights "
          f"({2 * e20 / gib:.1f} GiB in bfloat16), {o20 / 1e9:.3f} G others ({2 * o20 / gib:.2f} GiB)")
    m = runs["meta"]
    bits = 8 * m["mxfp4"] / es                        # bytes a weight as held (panels and exponent copy)
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

"""transformers experts held in MXFP4 (raggeddot.torch: hold_mxfp4,
quantize_experts_mxfp4, load_mxfp4_experts, load_mxfp4_checkpoint), on small
gpt-oss models built from a config (nothing downloaded).

- Holding after inference with the weight cache on leaves no float copy:
  the prepacked float copies inference made (traced by tracemalloc, which
  sees NumPy's allocations) are freed, only the MXFP4 bytes stay, and the
  old parameters hold nothing either.
- hold_mxfp4 checks every weight (the parameter's shape, or the held
  weights' once emptied) before it changes anything; quantize_experts_mxfp4
  checks every module first.
- After holding, another experts implementation says plainly that it cannot
  run them; state_dict and save_pretrained give the MXFP4 weights as
  gpt-oss's checkpoints hold them (``*_blocks`` / ``*_scales``), which
  load_mxfp4_checkpoint and load_state_dict read back to the same logits,
  and float weights loaded make float parameters again.
- The weight cache (prepacked float copies for inference) is made once by
  threads that meet the weights first together.
- The README's recipe: a model built on the meta device and a safetensors
  checkpoint of MXFP4 experts (written here, in gpt-oss's names), loaded
  without ever holding the float experts: its peak memory, measured in a
  subprocess (VmHWM), stays well below the bfloat16 experts' bytes, which
  the old recipe (from_config, then load_mxfp4_experts) exceeds.
"""
import copy
import gc
import json
import os
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

from helpers import import_hf

torch, transformers = import_hf()
import raggeddot  # noqa: E402
import raggeddot.torch as rt  # noqa: E402

T = transformers
V = 96


def _config(**overrides):
    kw = dict(vocab_size=V, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64, num_local_experts=4,
              num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
              initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    kw.update(overrides)
    return T.GptOssConfig(**kw)


def _model(cfg=None, dtype=torch.float32, seed=0, meta=False):
    torch.manual_seed(seed)
    cfg = copy.deepcopy(cfg or _config())
    if meta:
        with torch.device("meta"):
            return T.AutoModelForCausalLM.from_config(cfg, experts_implementation="raggeddot", dtype=dtype)
    return T.AutoModelForCausalLM.from_config(cfg, experts_implementation="raggeddot", dtype=dtype).eval()


def _experts(model):
    return [(n, m) for n, m in model.named_modules() if hasattr(m, "has_gate")]


def _ids(seed=3):
    return torch.randint(3, V, (2, 8), generator=torch.Generator().manual_seed(seed))


def _checkpoint(model):
    """The experts of ``model`` as gpt-oss's checkpoints hold them (blocks
    and scales of raggeddot.quantize's MXFP4), the other tensors as they are."""
    tensors = {}
    experts = dict(_experts(model))
    for key, value in model.state_dict().items():
        owner, _, leaf = key.rpartition(".")
        if owner in experts and leaf in ("gate_up_proj", "down_proj"):
            w = value.float().numpy().transpose(0, 2, 1)                       # [E, out, in]
            q = raggeddot.quantize(w, "mxfp4", channelwise_axes=(0, 1), tiled_axes={2: 32})
            codes = np.ascontiguousarray(q.qvalue.codes)
            tensors[key + "_blocks"] = torch.from_numpy(codes.reshape(codes.shape[:2] + (-1, 16)))
            tensors[key + "_scales"] = torch.from_numpy(np.ascontiguousarray(q.scale.view(np.uint8)))
        else:
            tensors[key] = value.detach().clone()
    return tensors


CACHED = ("_raggeddot_prepacked", "_raggeddot_prepacked_halves")


@pytest.mark.parametrize("how", ["hold_mxfp4", "quantize_experts_mxfp4", "load_mxfp4_experts"])
def test_holding_after_inference_leaves_no_float_copy(how):
    """Inference with the weight cache on keeps prepacked float copies of the
    experts (as many bytes as the float weights); holding them in MXFP4
    then leaves the traced bytes at what the MXFP4 weights hold."""
    model = _model()
    tensors = _checkpoint(model)
    experts = _experts(model)
    float_bytes = sum(getattr(m, w).numel() * 4 for _, m in experts for w in ("gate_up_proj", "down_proj"))
    old = [getattr(m, w) for _, m in experts for w in ("gate_up_proj", "down_proj")]
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        with torch.no_grad():
            model(_ids())
        gc.collect()
        cached = tracemalloc.get_traced_memory()[0] - start
        if how == "hold_mxfp4":
            for name, m in experts:
                rt.hold_mxfp4(m, **{w: raggeddot.quant.from_mxfp4(tensors[f"{name}.{w}_blocks"].numpy(),
                                                                  tensors[f"{name}.{w}_scales"].numpy())
                                    for w in ("gate_up_proj", "down_proj")})
        elif how == "quantize_experts_mxfp4":
            rt.quantize_experts_mxfp4(model)
        else:
            rt.load_mxfp4_experts(model, tensors)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    mxfp4 = sum(p.nbytes for _, m in experts for p in m._raggeddot_mxfp4.values())
    assert cached >= 0.95 * float_bytes, (cached, float_bytes)      # the copies are there, and seen
    assert held <= mxfp4 + 64 * 1024, (held, mxfp4, float_bytes)     # only the MXFP4 weights stay
    assert mxfp4 < 0.2 * float_bytes
    for p in old:               # the parameters that were the weights hold nothing either
        assert p.numel() == 0 and not any(hasattr(p, a) for a in CACHED)
    for _, p in model.named_parameters():
        assert not any(hasattr(p, a) for a in CACHED)


def test_hold_checks_every_weight_before_changing_anything():
    model = _model()
    tensors = _checkpoint(model)
    name, m = _experts(model)[0]
    q = {w: raggeddot.quant.from_mxfp4(tensors[f"{name}.{w}_blocks"].numpy(), tensors[f"{name}.{w}_scales"].numpy())
         for w in ("gate_up_proj", "down_proj")}
    gate_up = m.gate_up_proj.detach().clone()
    with pytest.raises(ValueError, match=r"^hold_mxfp4: 'down_proj' has shape \(4, 128, 64\), .*the module's "
                                         r"weight is \[E, out, in\] = \(4, 64, 64\)"):
        rt.hold_mxfp4(m, gate_up_proj=q["gate_up_proj"], down_proj=q["gate_up_proj"])
    assert torch.equal(m.gate_up_proj, gate_up) and not getattr(m, "_raggeddot_mxfp4", {})
    with pytest.raises(TypeError, match="^hold_mxfp4: 'down_proj' must be an \\[E, out, in\\] MXFP4 QArray"):
        rt.hold_mxfp4(m, gate_up_proj=q["gate_up_proj"], down_proj=q["down_proj"][:, :, 8:40])   # off the blocks
    with pytest.raises(ValueError, match="^hold_mxfp4: the module has no expert weight parameter 'up_proj'"):
        rt.hold_mxfp4(m, gate_up_proj=q["gate_up_proj"], up_proj=q["down_proj"])
    assert torch.equal(m.gate_up_proj, gate_up) and not getattr(m, "_raggeddot_mxfp4", {})
    rt.hold_mxfp4(m, **q)
    # held (the parameter empty): a wrong shape is still refused, the weights kept
    with pytest.raises(ValueError, match=r"'gate_up_proj' has shape \(4, 64, 64\), .*the module's weight is "
                                         r"\[E, out, in\] = \(4, 128, 64\)"):
        rt.hold_mxfp4(m, gate_up_proj=q["down_proj"])
    with torch.no_grad():
        model(_ids())
    rt.hold_mxfp4(m, **q)       # the right ones again: fine


def test_quantize_experts_checks_every_module_first():
    """A NaN in the last module's weights: refused naming it, before any
    module is held."""
    model = _model()
    with torch.no_grad():
        _experts(model)[-1][1].down_proj[2, 5, 7] = float("nan")
    with pytest.raises(ValueError, match=r"^quantize_experts_mxfp4: 'model.layers.1.mlp.experts.down_proj' "
                                         r"holds 1 non-finite value \(the first, nan, at \(2, 5, 7\)\)"):
        rt.quantize_experts_mxfp4(model)
    assert all(not getattr(m, "_raggeddot_mxfp4", {}) and m.gate_up_proj.numel() for _, m in _experts(model))


def test_another_implementation_says_it_cannot_run_them():
    model = _model()
    rt.quantize_experts_mxfp4(model)
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
        for impl in ("eager", "batched_mm"):
            model.set_experts_implementation(impl)
            with pytest.raises(RuntimeError, match=rf"^GptOssExperts: the expert weights \['down_proj', "
                                                   rf"'gate_up_proj'\] are held in MXFP4 .* this model's is "
                                                   rf"'{impl}'; run model.set_experts_implementation"):
                model(ids)
        model.set_experts_implementation("raggeddot")
        assert torch.equal(model(ids).logits, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_rows_multiply_the_held_weights(monkeypatch, dtype):
    """set_activation_qtype(model, "int8"): every product with the held
    MXFP4 weights takes its rows quantized per row to int8 (w4a8), and is,
    bit for bit, the product of quantize()'s QArray of those rows and the
    MXFP4 QArray (gmm on the plain weights, checked call by call: the gate
    and up weights' and the down weights' of each layer); the logits stay
    within the rows' rounding of the float rows'; the weights are laid out
    again for int8 rows (none held twice), state_dict still gives the same
    blocks, and None gives the float rows' logits back, bit for bit."""
    model = _model(dtype=dtype)
    rt.quantize_experts_mxfp4(model)
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
    blocks = {k: v.clone() for k, v in model.state_dict().items() if k.endswith("_blocks")}
    assert rt.set_activation_qtype(model, "int8") == 2
    gmm, seen = raggeddot.gmm, []

    def spy(lhs, rhs, group_sizes, **kw):
        out = gmm(lhs, rhs, group_sizes, **kw)
        assert isinstance(lhs, raggeddot.AsQArray) and lhs.qtype == "int8" and lhs.channelwise_axes == (0,)
        rows = np.asarray(lhs.array, dtype=np.float32)
        oracle = gmm(raggeddot.quantize(rows, "int8", channelwise_axes=(0,)), rhs.unpack(), group_sizes)
        assert np.array_equal(np.asarray(out, dtype=np.float32), oracle.astype(out.dtype).astype(np.float32))
        seen.append(rhs.ctype)
        return out
    monkeypatch.setattr(rt._experts._rd, "gmm", spy)
    with torch.no_grad():
        got = model(ids).logits
    monkeypatch.undo()
    assert len(seen) == 4     # two products a layer, two layers
    for _, m in _experts(model):
        for packed in m._raggeddot_mxfp4.values():      # laid out as prepack lays them out for int8 rows
            assert packed.ctype == raggeddot.prepack(packed.unpack(), lhs_dtype=np.int8).ctype
            if packed.ctype == "int8-mxfp4-dot":        # (4 bits a weight for int8 rows: nothing else kept)
                assert list(packed.layouts) == [packed.ctype]
    err = (got.float() - want.float()).abs().max() / want.float().abs().max()
    assert 0 < err < 0.05, err
    assert all(torch.equal(model.state_dict()[k], v) for k, v in blocks.items())
    rt.set_activation_qtype(model, None)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    with pytest.raises(ValueError, match=r"^set_activation_qtype: 'qtype' must be \"int8\" or None, got 'int4'"):
        rt.set_activation_qtype(model, "int4")
    with pytest.raises(ValueError, match=r"^set_activation_qtype: Linear has no transformers experts module"):
        rt.set_activation_qtype(torch.nn.Linear(2, 2), "int8")


def test_state_dict_and_save_pretrained_give_the_mxfp4_weights(tmp_path):
    """state_dict gives each held weight as gpt-oss's blocks and scales (no
    empty tensor), save_pretrained writes them, and load_mxfp4_checkpoint
    (a model built on the meta device) or load_state_dict (a held model)
    reads them back to the same logits; the float weights loaded into a held
    model make float parameters again."""
    from safetensors import safe_open
    reference = _model(dtype=torch.bfloat16)
    floats = {k: v.clone() for k, v in reference.state_dict().items()}
    model = copy.deepcopy(reference)
    rt.quantize_experts_mxfp4(model)
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
    sd = model.state_dict()
    assert all(v.numel() for v in sd.values())
    assert sd["model.layers.0.mlp.experts.gate_up_proj_blocks"].shape == (4, 128, 2, 16)
    assert sd["model.layers.0.mlp.experts.gate_up_proj_scales"].dtype == torch.uint8
    assert "model.layers.0.mlp.experts.gate_up_proj" not in sd
    model.save_pretrained(tmp_path)
    files = sorted(str(p) for p in tmp_path.glob("*.safetensors"))
    with safe_open(files[0], "pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    assert shapes["model.layers.1.mlp.experts.down_proj_blocks"] == [4, 64, 2, 16]
    assert all(np.prod(s) for s in shapes.values()), "an empty tensor was saved"
    loaded = rt.load_mxfp4_checkpoint(_model(dtype=torch.bfloat16, meta=True), files)
    again = _model(dtype=torch.bfloat16, seed=5)
    rt.quantize_experts_mxfp4(again)
    again.load_state_dict(sd)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, want)
        assert torch.equal(again(ids).logits, want)
        again.load_state_dict(floats)           # float weights: float parameters again
        assert not again.model.layers[0].mlp.experts._raggeddot_mxfp4
        assert torch.equal(again(ids).logits, reference(ids).logits)


# ---------------------------------------------------------------------------
# the README's recipe for a real checkpoint, and its peak memory
# ---------------------------------------------------------------------------

RECIPE = textwrap.dedent('''
    import json, sys, torch, transformers
    import raggeddot.torch as rt

    def vm(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    args = json.loads(sys.argv[1])
    cfg = transformers.GptOssConfig(**args["config"])
    tiny = transformers.GptOssConfig(**{**args["config"], "hidden_size": 64, "intermediate_size": 64})
    with torch.device("meta"):     # the modeling code's imports and first-use costs, before the baseline
        transformers.AutoModelForCausalLM.from_config(tiny, experts_implementation="raggeddot")
    torch.manual_seed(0)
    base = vm("VmRSS")
    if args["recipe"] == "meta":          # the README's: the float experts are never made
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, experts_implementation="raggeddot", dtype=torch.bfloat16)
        rt.load_mxfp4_checkpoint(model, args["files"])
    else:                                 # the old one: from_config allocates and fills them first
        from safetensors import safe_open
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, experts_implementation="raggeddot", dtype=torch.bfloat16)
        tensors = {}
        for f in args["files"]:       # (a weight's blocks and scales may lie in different shards)
            with safe_open(f, "pt") as t:
                tensors.update({k: t.get_tensor(k) for k in t.keys()})
        rt.load_mxfp4_experts(model, tensors)
        model.load_state_dict({k: v for k, v in tensors.items() if not k.endswith(("_blocks", "_scales"))},
                              strict=False)
    peak = vm("VmHWM")
    with torch.no_grad():
        logits = model(torch.tensor([args["ids"]])).logits
    print(json.dumps({"base": base, "peak": peak, "logits": logits.float().flatten()[:64].tolist()}))
''')


def test_the_checkpoint_recipe_never_holds_the_float_experts(tmp_path):
    """A gpt-oss checkpoint of 8 experts x 2 layers (d = f = 768: 57 MB of
    bfloat16 experts, 15 MB in MXFP4) in three safetensors shards: the
    README's recipe peaks below 0.7x the bfloat16 experts' bytes over the
    process's memory before it ran (the MXFP4 experts are 0.28x, one
    layer's bfloat16 gate_up weights 0.33x); the old recipe above 1x; both
    give the logits of a model holding the same MXFP4 experts."""
    from safetensors.torch import save_file
    cfg = dict(vocab_size=256, hidden_size=768, intermediate_size=768, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=64,
               num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"], initializer_range=0.02,
               pad_token_id=0, bos_token_id=1, eos_token_id=2)
    reference = _model(T.GptOssConfig(**cfg), dtype=torch.bfloat16)
    tensors = _checkpoint(reference)
    expert_bf16 = sum(m.gate_up_proj.numel() + m.down_proj.numel() for _, m in _experts(reference)) * 2
    keys = sorted(tensors)
    files = []
    for i in range(3):                    # shards, as a real checkpoint comes
        files.append(str(tmp_path / f"model-{i + 1:05d}-of-00003.safetensors"))
        save_file({k: tensors[k].contiguous() for k in keys[i::3]}, files[-1])
    rt.load_mxfp4_experts(reference, tensors)
    ids = [5, 17, 33, 101, 7]
    with torch.no_grad():
        want = reference(torch.tensor([ids])).logits.float().flatten()[:64]
    del reference, tensors
    runs = {}
    for recipe in ("meta", "old"):
        arg = json.dumps({"config": cfg, "files": files, "ids": ids, "recipe": recipe})
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RAGGEDDOT_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, "-c", RECIPE, arg], capture_output=True, text=True, env=env,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[recipe] = json.loads(out.stdout.strip().splitlines()[-1])
        assert torch.equal(torch.tensor(runs[recipe]["logits"]), want), recipe
    grown = {r: (v["peak"] - v["base"]) / expert_bf16 for r, v in runs.items()}
    print("peak memory grown, in bfloat16 experts' bytes:", grown)
    assert grown["meta"] < 0.7 < 1.0 < grown["old"], grown


def test_the_weight_cache_is_made_once_by_concurrent_first_use(monkeypatch):
    """Four threads running a model's first inference together: each expert
    weight's prepacked copy is made once (counted at prepack, slowed so the
    threads overlap), and every thread gets the logits of one thread alone."""
    import threading
    import time
    from raggeddot.torch import _experts as implementation
    model = _model()
    ids = _ids()
    reference = copy.deepcopy(model)
    with torch.no_grad():
        want = reference(ids).logits
    made, real = [], raggeddot.prepack

    def slow_prepack(*args, **kw):
        made.append(args[0].shape)
        time.sleep(0.05)
        return real(*args, **kw)

    monkeypatch.setattr(implementation._rd, "prepack", slow_prepack)
    barrier, results, errors = threading.Barrier(4), [None] * 4, []

    def run(i):
        try:
            barrier.wait()
            with torch.no_grad():
                results[i] = model(ids).logits
        except Exception as e:      # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    copies = [p for _, m in _experts(model) for p in (m.gate_up_proj, m.down_proj)]
    halves = sum(hasattr(p, "_raggeddot_prepacked_halves") for p in copies)
    whole = sum(hasattr(p, "_raggeddot_prepacked") for p in copies)
    assert len(made) == 2 * halves + whole, (len(made), halves, whole)
    for r in results:
        assert torch.equal(r, want)


def test_the_weight_cache_follows_the_kernel_selection():
    """A model that ran inference, then runs under another kernel family
    (runtime.configured): its prepacked copies are made again for those
    kernels (they used to be read with the other family's panel width and
    refused), and the logits are that family's."""
    from raggeddot import runtime
    model = _model(_config())
    ids = _ids()
    with torch.no_grad():
        model(ids)
        for family in runtime.runnable_kernels():
            with runtime.configured(kernel=family):
                got = model(ids).logits
                rt.set_weight_cache(False)
                try:
                    want = model(ids).logits
                finally:
                    rt.set_weight_cache(True)
            assert torch.equal(got, want), family

"""The "raggeddot" experts implementation inside transformers' models
(transformers 5.23, torch 2.13; the hf extra).

For each family a tiny model is built twice from one random config with
``from_config`` (nothing is downloaded): with experts_implementation "eager"
(the per-expert loop of the modeling file) and "raggeddot", with the same
weights. In float32:

- logits agree within float32 rounding (relative to the largest logit);
- greedy ``generate()`` (with the KV cache: one token a step) gives the
  same tokens;
- after one training step's backward (the language-model loss, router
  auxiliary losses included where the family has them) the gradient of
  every parameter agrees (relative to that gradient's largest entry).

In bfloat16 the raggeddot model's logits are as close to the float32 ones
as eager's bfloat16 logits are (within a factor 2). The experts modules'
flags are exercised alone as well: sentinel expert ids (expert parallelism),
a post-expert norm, a gate the module defines itself, activations other
than SiLU. ``torch.compile(fullgraph=True)`` of a whole model (AOT autograd
on the fake implementations) and of an experts module (inductor) gives the
same results.
"""
import copy

import pytest

from helpers import import_hf

torch, transformers = import_hf()
import raggeddot.torch as rt  # noqa: E402
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS  # noqa: E402

T = transformers
V = 96
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=24, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
              initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
FAMILIES = {
    "mixtral": (T.MixtralConfig, dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True)),
    "qwen2_moe": (T.Qwen2MoeConfig, dict(num_experts=8, num_experts_per_tok=2, shared_expert_intermediate_size=24,
                                         decoder_sparse_step=1, output_router_logits=True)),
    "qwen3_moe": (T.Qwen3MoeConfig, dict(num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1)),
    "olmoe": (T.OlmoeConfig, dict(num_experts=8, num_experts_per_tok=2)),
    "deepseek_v3": (T.DeepseekV3Config, dict(n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                                             first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16,
                                             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                             n_shared_experts=1, num_key_value_heads=4)),
    # transposed, interleaved gate/up with biases and its own clamped gate
    "gpt_oss": (T.GptOssConfig, dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                                     layer_types=["sliding_attention", "full_attention"])),
    "phimoe": (T.PhimoeConfig, dict(num_local_experts=4, num_experts_per_tok=2)),
    "glm4_moe": (T.Glm4MoeConfig, dict(n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=0,
                                       n_group=1, topk_group=1, n_shared_experts=1)),
    # ungated experts (up_proj only) with a squared-ReLU activation
    "nemotron_h": (T.NemotronHConfig, dict(layers_block_type=["moe", "attention"], n_routed_experts=8,
                                           num_experts_per_tok=2, n_group=1, topk_group=1,
                                           moe_shared_expert_intermediate_size=24)),
    "ernie4_5_moe": (T.Ernie4_5_MoeConfig, dict(moe_num_experts=8, moe_k=2, moe_layer_start_index=0,
                                                moe_num_shared_experts=1)),
}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tiny models: torch's own threads would only compete with the other
    test workers (and raggeddot's threads) for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(family, **overrides):
    cls, kw = FAMILIES[family]
    return cls(**{**COMMON, **kw, **overrides})


def _pair(cfg, dtype=torch.float32, seed=0):
    """(eager model, raggeddot model) with the same random weights; each
    gets its own copy of the config (from_config writes the implementation
    into the config it is given)."""
    torch.manual_seed(seed)
    eager = T.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), experts_implementation="eager",
                                               dtype=dtype)
    rd = T.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), experts_implementation="raggeddot",
                                            dtype=dtype)
    rd.load_state_dict(eager.state_dict())
    eager.eval(), rd.eval()
    assert eager.config._experts_implementation == "eager"
    assert rd.config._experts_implementation == "raggeddot"
    return eager, rd


def _rel(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()


def _ran_raggeddot(monkeypatch, fn):
    """fn() counting the calls of the registered "raggeddot" experts forward:
    ``(fn(), calls)``."""
    calls = []

    def counting(*args):
        calls.append(1)
        return rt.experts_forward(*args)
    monkeypatch.setitem(ALL_EXPERTS_FUNCTIONS._global_mapping, "raggeddot", counting)
    out = fn()
    monkeypatch.setitem(ALL_EXPERTS_FUNCTIONS._global_mapping, "raggeddot", rt.experts_forward)
    return out, len(calls)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_float32(family, monkeypatch):
    eager, rd = _pair(_config(family))
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (2, 8), generator=gen)
    with torch.no_grad():
        want = eager(ids).logits
        got, calls = _ran_raggeddot(monkeypatch, lambda: rd(ids).logits)
    layers = sum(1 for m in rd.modules() if hasattr(m, "has_gate"))
    assert layers >= 1 and calls == layers
    assert _rel(got, want) <= 2e-6, _rel(got, want)
    # greedy decoding: prefill, then one token a step through the KV cache
    kw = dict(max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert torch.equal(rd.generate(ids[:1, :4], **kw), eager.generate(ids[:1, :4], **kw))
    # a training step's gradients of every parameter
    for m in (eager, rd):    # (training mode draws random numbers in some routers: the same ones)
        m.train()
        torch.manual_seed(8)
        m(ids, labels=ids).loss.backward()
    grads = dict(eager.named_parameters())
    checked = []
    for name, p in rd.named_parameters():
        ref = grads[name].grad
        if ref is None:    # (parameters outside the loss: both None)
            assert p.grad is None, name
            continue
        assert p.grad is not None, name
        assert _rel(p.grad, ref) <= 2e-5, (name, _rel(p.grad, ref))
        checked.append(name)
    assert sum(".experts." in n for n in checked) >= 2, checked


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "nemotron_h"])
def test_family_bfloat16(family):
    cfg = _config(family)
    eager, rd = _pair(cfg, dtype=torch.bfloat16)
    eager32 = copy.deepcopy(eager).float()
    ids = torch.randint(3, V, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = eager32(ids).logits
        err_eager = _rel(eager(ids).logits.float(), ref)
        err_rd = _rel(rd(ids).logits.float(), ref)
    assert err_rd <= max(2 * err_eager, 1e-2), (err_rd, err_eager)
    rd(ids, labels=ids).loss.backward()   # bfloat16 training runs
    assert all(torch.isfinite(p.grad).all() for p in rd.parameters() if p.grad is not None)


def test_compile_model_fullgraph():
    """The whole model traced in one graph (dynamo, then AOT autograd over
    the operators' fake implementations) gives eager's logits."""
    eager, rd = _pair(_config("qwen3_moe"))
    ids = torch.randint(3, V, (2, 8), generator=torch.Generator().manual_seed(3))
    compiled = torch.compile(rd, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert _rel(compiled(ids).logits, eager(ids).logits) <= 2e-6


# ------------------------------------------------------------ experts modules

def _experts(family, **overrides):
    """(eager experts module, a copy running raggeddot) of a family's first MoE layer."""
    torch.manual_seed(4)
    model = T.AutoModelForCausalLM.from_config(_config(family, **overrides), experts_implementation="eager")
    module = next(m for m in model.modules() if hasattr(m, "has_gate"))
    rd = copy.deepcopy(module)
    rd.config = copy.deepcopy(module.config)
    rd.config._experts_implementation = "raggeddot"
    return module, rd


def _routing(num_tokens, k, num_experts, d, seed=5):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, d, generator=gen)
    idx = torch.stack([torch.randperm(num_experts, generator=gen)[:k] for _ in range(num_tokens)])
    w = torch.rand(num_tokens, k, generator=gen)
    return x, idx, w


def _check_module(eager, rd, x, idx, w, idx_eager=None, w_eager=None, tol=2e-6, skipped=None):
    """Forward and every gradient (input, weights, routing weights) of the
    raggeddot module against the eager one; routing weights of ``skipped``
    assignments must get no gradient (eager computes one for their zeroed
    weights)."""
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ws = [(w if w_eager is None else w_eager).clone().requires_grad_(), w.clone().requires_grad_()]
    outs = [eager(xs[0], idx if idx_eager is None else idx_eager, ws[0]), rd(xs[1], idx, ws[1])]
    assert _rel(outs[1], outs[0]) <= tol
    ct = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(6))
    for o in outs:
        (o * ct).sum().backward()
    assert _rel(xs[1].grad, xs[0].grad) <= tol * 10
    if skipped is not None:
        assert not ws[1].grad[skipped].any()
        ws[0].grad[skipped] = 0
    assert _rel(ws[1].grad, ws[0].grad) <= tol * 10
    for (name, p), q in zip(rd.named_parameters(), eager.parameters()):
        assert _rel(p.grad, q.grad) <= tol * 10, name


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss", "nemotron_h"])
def test_sentinel_expert_ids_are_skipped(family):
    """Ids >= num_experts (expert parallelism's sentinels) add nothing: the
    same as eager with those assignments' weights zeroed."""
    eager, rd = _experts(family)
    E = eager.num_experts
    x, idx, w = _routing(9, 2, E, x_dim(eager))
    sentinel = torch.zeros_like(idx, dtype=torch.bool)
    sentinel[::3, 1] = True
    sentinel[4, 0] = True
    idx_rd = idx.masked_fill(sentinel, E)
    _check_module(eager, rd, x, idx_rd, w, idx_eager=idx, w_eager=w.masked_fill(sentinel, 0.0), skipped=sentinel)


def x_dim(module):
    w = module.down_proj
    return w.shape[2] if module.is_transposed else w.shape[1]


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh", "relu", "gelu_fast"])
def test_activations(act):
    """Known activations run in C (gelu, tanh gelu, relu); others
    (gelu_fast) through the module's own _apply_gate."""
    eager, rd = _experts("mixtral", hidden_act=act)
    fused = rt._experts.fused_gate(rd)
    assert (fused is None) == (act == "gelu_fast")
    x, idx, w = _routing(10, 2, eager.num_experts, x_dim(eager))
    _check_module(eager, rd, x, idx, w)


def test_interleaved_gate_up():
    """is_concatenated=False: gate and up interleaved along the fused axis;
    the same as the concatenated module with the rows regrouped."""
    eager, rd = _experts("mixtral")
    with torch.no_grad():
        w = rd.gate_up_proj.detach().clone()
        rd.gate_up_proj.copy_(torch.stack([w[:, :w.shape[1] // 2], w[:, w.shape[1] // 2:]], 2).flatten(1, 2))
    rd.is_concatenated = False
    assert rt._experts.fused_gate(rd)[1] == "interleaved"
    x, idx, w = _routing(10, 2, eager.num_experts, x_dim(eager))
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    outs = [eager(xs[0], idx, w), rd(xs[1], idx, w)]
    assert _rel(outs[1], outs[0]) <= 2e-6
    for o in outs:
        o.square().sum().backward()
    assert _rel(xs[1].grad, xs[0].grad) <= 2e-5
    g = rd.gate_up_proj.grad
    assert _rel(torch.cat([g[:, 0::2], g[:, 1::2]], 1), eager.gate_up_proj.grad) <= 2e-5


def test_module_defined_gate():
    """A gate the module defines itself runs as the module defines it
    (against transformers' "grouped_mm", which calls it too: the eager
    forward of a modeling file computes its gate inline)."""
    eager, rd = _experts("mixtral")
    eager.config._experts_implementation = "grouped_mm"

    def apply_gate(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.tanh(gate) * up * 0.5
    cls = type("CustomGateExperts", (type(eager),), {"_apply_gate": apply_gate})
    eager.__class__ = rd.__class__ = cls
    assert rt._experts.fused_gate(rd) is None
    x, idx, w = _routing(10, 2, eager.num_experts, x_dim(eager))
    _check_module(eager, rd, x, idx, w)


def test_post_expert_norm():
    """has_post_expert_norm (MuseSpark's experts): the module's norm runs on
    each expert's output before the routing weights."""
    from transformers.models.muse_spark.configuration_muse_spark import MuseSparkTextConfig
    from transformers.models.muse_spark.modeling_muse_spark import MuseSparkExperts
    cfg = MuseSparkTextConfig(hidden_size=32, moe_hidden_size=32, moe_intermediate_size=24, num_local_experts=4,
                              num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(7)
    eager = MuseSparkExperts(cfg)
    for p in eager.parameters():
        torch.nn.init.normal_(p, std=0.2)
    assert eager.has_post_expert_norm
    eager.config._experts_implementation = "eager"
    rd = copy.deepcopy(eager)
    rd.config = copy.deepcopy(cfg)
    rd.config._experts_implementation = "raggeddot"
    x, idx, w = _routing(10, 2, 4, 32)
    _check_module(eager, rd, x, idx, w, tol=1e-5)


def test_compile_experts_module_inductor():
    eager, rd = _experts("gpt_oss")
    x, idx, w = _routing(12, 2, eager.num_experts, x_dim(eager))
    compiled = torch.compile(rd, fullgraph=True)
    with torch.no_grad():
        assert _rel(compiled(x, idx, w), eager(x, idx, w)) <= 2e-6


def test_inference_weight_cache():
    """Inference reads prepacked weights, made again after an in-place update
    of a parameter; with the cache off, and with gradients on, the products
    read the parameters themselves: all agree."""
    eager, rd = _experts("gpt_oss")
    x, idx, w = _routing(6, 2, eager.num_experts, x_dim(eager))
    with torch.no_grad():
        first = rd(x, idx, w)
        packed = rd.down_proj._raggeddot_prepacked[1]
        assert rd(x, idx, w).equal(first) and rd.down_proj._raggeddot_prepacked[1] is packed
        for m in (eager, rd):
            m.down_proj.mul_(-2.0)
        updated = rd(x, idx, w)
        assert rd.down_proj._raggeddot_prepacked[1] is not packed
        assert _rel(updated, eager(x, idx, w)) <= 2e-6
        previous = rt.set_weight_cache(False)
        try:
            rt.clear_weight_cache(rd)
            assert not hasattr(rd.down_proj, "_raggeddot_prepacked")
            assert rd(x, idx, w).equal(updated) and not hasattr(rd.down_proj, "_raggeddot_prepacked")
        finally:
            rt.set_weight_cache(previous)
    assert rd(x, idx, w).equal(updated)     # gradients on: through the operators


def test_registration():
    assert ALL_EXPERTS_FUNCTIONS["raggeddot"] is rt.experts_forward
    del ALL_EXPERTS_FUNCTIONS._global_mapping["raggeddot"]
    try:
        with pytest.raises(ValueError, match="raggeddot"):
            T.AutoModelForCausalLM.from_config(_config("olmoe"), experts_implementation="raggeddot")
    finally:
        assert rt.register_transformers() is True
    assert ALL_EXPERTS_FUNCTIONS["raggeddot"] is rt.experts_forward


def test_set_experts_implementation_on_a_built_model(monkeypatch):
    """The README's second way in: a model built with "eager" switched to
    "raggeddot" (and back) by model.set_experts_implementation."""
    import pathlib
    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert 'from_config(config, experts_implementation="raggeddot")' in readme
    assert 'model.set_experts_implementation("raggeddot")' in readme
    eager, _ = _pair(_config("olmoe"))
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(copy.deepcopy(_config("olmoe")), experts_implementation="eager")
    model.load_state_dict(eager.state_dict())
    model.eval()
    ids = torch.randint(0, COMMON["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1))
    model.set_experts_implementation("raggeddot")
    with torch.no_grad():
        logits, calls = _ran_raggeddot(monkeypatch, lambda: model(ids).logits)
        assert calls > 0
        assert _rel(logits, eager(ids).logits) <= 2e-6
        model.set_experts_implementation("eager")
        _, calls = _ran_raggeddot(monkeypatch, lambda: model(ids).logits)
    assert calls == 0


def _mxfp4_checkpoint(model):
    """The experts' weights of ``model`` as a gpt-oss checkpoint holds them:
    ``*_blocks`` uint8 [E, out, in / 32, 16] and ``*_scales`` uint8
    [E, out, in / 32] (raggeddot.quantize's MXFP4 codes and exponents)."""
    import numpy as np
    import raggeddot as rdp
    tensors = {}
    for name, m in model.named_modules():
        if not hasattr(m, "has_gate"):
            continue
        for wname in ("gate_up_proj", "down_proj"):
            w = getattr(m, wname).detach().float().numpy().transpose(0, 2, 1)      # [E, out, in]
            q = rdp.quantize(w, "mxfp4", channelwise_axes=(0, 1), tiled_axes={2: 32})
            codes = np.ascontiguousarray(q.qvalue.codes)
            tensors[f"{name}.{wname}_blocks"] = torch.from_numpy(codes.reshape(codes.shape[:2] + (-1, 16)))
            tensors[f"{name}.{wname}_scales"] = torch.from_numpy(np.ascontiguousarray(q.scale.view(np.uint8)))
    return tensors


def test_gpt_oss_experts_kept_in_mxfp4():
    """A bfloat16 gpt-oss whose experts are loaded from MXFP4 blocks and
    scales and kept that way: its logits equal, bit for bit, those of the
    same model on the dequantized bfloat16 weights through the same
    implementation (the weights are exact in bfloat16 and the 4-bit kernels
    sum as the bfloat16-weight ones do), come within bfloat16 rounding of the
    eager loop's on those weights, greedy generate() is identical, and the
    experts hold <= 0.3x the bytes of their bfloat16 weights."""
    import raggeddot as rdp
    cfg = _config("gpt_oss", hidden_size=64, intermediate_size=64)
    eager, ref = _pair(cfg, dtype=torch.bfloat16)
    mx = copy.deepcopy(ref)
    tensors = _mxfp4_checkpoint(ref)
    bf16_bytes = {}
    for (name, m), (_, e), (_, r) in zip(mx.named_modules(), eager.named_modules(), ref.named_modules()):
        if hasattr(m, "has_gate"):       # the reference models get the dequantized values, in bfloat16
            bf16_bytes[name] = sum(getattr(m, w).numel() * 2 for w in ("gate_up_proj", "down_proj"))
            for wname in ("gate_up_proj", "down_proj"):
                q = rdp.quant.from_mxfp4(tensors[f"{name}.{wname}_blocks"].numpy(),
                                         tensors[f"{name}.{wname}_scales"].numpy())
                deq = torch.from_numpy(rdp.dequantize(q).transpose(0, 2, 1).copy()).to(torch.bfloat16)
                for model_m in (e, r):
                    getattr(model_m, wname).data.copy_(deq)
    loaded = rt.load_mxfp4_experts(mx, tensors)
    assert len(loaded) == 2 * len(bf16_bytes)
    held = {name: sum(p.nbytes for p in m._raggeddot_mxfp4.values())
            for name, m in mx.named_modules() if hasattr(m, "has_gate")}
    for name, nbytes in held.items():
        assert nbytes <= 0.3 * bf16_bytes[name], (name, nbytes, bf16_bytes[name])
        assert getattr(dict(mx.named_modules())[name], "gate_up_proj").numel() == 0
    ids = torch.randint(3, V, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want, loop = mx(ids).logits, ref(ids).logits, eager(ids).logits
    assert torch.equal(got, want)
    assert _rel(got, loop) <= 0.05, _rel(got, loop)
    kw = dict(max_new_tokens=5, do_sample=False, min_new_tokens=5)
    assert torch.equal(mx.generate(ids[:1, :4], **kw), ref.generate(ids[:1, :4], **kw))
    with pytest.raises(RuntimeError, match="for inference"):
        mx(ids, labels=ids).loss.backward()


def test_quantize_experts_mxfp4_in_place():
    """quantize_experts_mxfp4 gives the model of load_mxfp4_experts."""
    cfg = _config("gpt_oss", hidden_size=64, intermediate_size=64)
    _, a = _pair(cfg, dtype=torch.bfloat16)
    b = copy.deepcopy(a)
    tensors = _mxfp4_checkpoint(a)
    rt.quantize_experts_mxfp4(a)
    rt.load_mxfp4_experts(b, tensors)
    ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "olmoe", "deepseek_v3", "phimoe", "glm4_moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("cache", [True, False], ids=["prepacked", "plain"])
def test_inference_runs_the_fused_gate_up_pass_with_the_same_bits(monkeypatch, family, dtype, cache):
    """Without autograd, gated experts with no biases run one fused pass
    (the tokens' rows read in place, the activation in the products'
    epilogue) and the down product with the combine in its epilogue: the
    logits equal, bit for bit, those of the composition of gmm over
    gate_up_proj, gated_activation, gmm over down_proj and the ordered
    combine; with autograd the composition runs."""
    import raggeddot._gateway as gw
    from raggeddot._moe import experts
    from raggeddot.torch import _experts as ex
    _, rd = _pair(_config(family), dtype=dtype)
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(4))
    calls, combines = [], []
    real, real_combine = gw.gated_rows, gw.combine_rows
    monkeypatch.setattr(gw, "gated_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(gw, "combine_rows", lambda *a, **k: combines.append(1) or real_combine(*a, **k))
    monkeypatch.setattr(experts, "COMBINE_MIN_COLS", 1)     # the combine in the down product at any width
    previous = rt.set_weight_cache(cache)
    try:
        with torch.no_grad():
            fused = rd(ids).logits
            assert calls, "the fused pass ran"
            assert len(combines) == len(calls), "the down product combined"
            monkeypatch.setitem(ex._FUSED, "enabled", False)
            calls.clear()
            combines.clear()
            composed = rd(ids).logits
            assert not calls and not combines
        monkeypatch.setitem(ex._FUSED, "enabled", True)
        rd(ids).logits.sum().backward()          # autograd: the composition
        assert not calls and not combines
    finally:
        rt.set_weight_cache(previous)
    assert torch.equal(fused, composed)

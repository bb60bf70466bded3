"""Conformance with transformers' own MoE blocks (transformers 5.23, torch 2.13).

For each family the transformers sparse-MoE block is built from a small random
config (nothing is downloaded), given random weights, and its parameters are
mapped onto ``raggeddot.moe_block`` (the mapping functions below are the calls
the README's "Hugging Face MoE families" section shows). The output, the
gradient of x and the gradient of every parameter of the block (torch
autograd of ``sum(out * ct)``) are compared with ``raggeddot.moe_block_vjp``:

- float32 block against raggeddot in float32: relative error <= 1e-5;
- float64 block with float64 routing against raggeddot in float64: <= 1e-10;
- float64 block as transformers runs it (its router computes in float32)
  against raggeddot in float64: <= 1e-5.

Float64 routing: transformers casts the router's logits or scores to float32
(``.float()``, ``softmax(..., dtype=torch.float)``, ``.type(torch.float32)``)
even in a float64 model. ``float64_routing`` (below) is a torch function mode
that, while the block runs, turns each such cast of a float64 tensor (and each
``dtype=torch.float32`` argument) into float64; nothing else changes, and in a
float64 block nothing but the routing asks for float32.

The experts run transformers' "eager" implementation (the per-expert loop
written in each modeling file). Relative error is ``max|got - want| /
max|want|`` over the whole array. Each family has a case with more tokens than
experts and one that leaves most experts empty (3 tokens, 16 experts).

Tests that need moe_block options not in this tree yet (``swiglu_alpha``,
``shared_expert_gate``, ``router_weights_on``, fused gate/up through
``w1=None`` and ``gate_up``, ``load_balance``) are marked as expected to fail
with TypeError (moe_block refusing the keyword) until the options exist; then
the marks lift by themselves and they run as ordinary tests. Until then
Llama4 is checked through its routed path composed from ragged_gather,
ragged_dot and ragged_gather_reduce under raggeddot.vjp.
"""
import contextlib
import inspect

import numpy as np
import pytest

import raggeddot
from helpers import import_hf

torch, transformers = import_hf()
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP  # noqa: E402
from transformers.models.llama4.modeling_llama4 import Llama4TextMoe  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import (  # noqa: E402
    MixtralSparseMoeBlock, load_balancing_loss_func)
from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock  # noqa: E402
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402

TOL = {"float32": 1e-5, "float64": 1e-10, "float64-hf-routing": 1e-5}
MODES = list(TOL)
# (batch, sequence, experts): more tokens than experts, and 3 tokens for 16
# experts (top-2 reaches at most 6: the others are empty)
SHAPES = {"tokens": (2, 12, 8), "empty-experts": (1, 3, 16)}
D, F = 16, 12


def _has_option(name):
    return name in inspect.signature(raggeddot.moe_block).parameters


def _needs(*options):
    """Expected to fail with TypeError while moe_block lacks any of ``options``."""
    missing = [o for o in options if not _has_option(o)]
    return pytest.mark.xfail(bool(missing), raises=TypeError, strict=True,
                             reason=f"moe_block has no {', '.join(missing)} yet")


def float64_routing(torch):
    """A torch function mode (a context manager) in which transformers' float32 routing runs
    in float64: ``Tensor.float()`` of a float64 tensor returns it unchanged, and
    ``torch.float32`` given to any torch function (positionally or as ``dtype=``) means
    ``torch.float64`` (see the module docstring).

    ``torch`` is passed in so that the README's call reads as it does here."""
    from torch.overrides import TorchFunctionMode

    class Float64Routing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.float and args[0].dtype == torch.float64:
                return args[0]
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
            return func(*args, **kwargs)

    return Float64Routing()


def _np(t):
    return t.detach().numpy()


def _dtype(mode):
    return np.float32 if mode == "float32" else np.float64


def _routing(mode):
    return float64_routing(torch) if mode == "float64" else contextlib.nullcontext()


def _init(block, rng, dtype, scales):
    """Random parameters (and the DeepSeek selection bias), normal with std
    ``scales[name]`` (default 1/sqrt(fan-in), the last axis of a 2-D weight,
    the middle one of an expert tensor read as [E, out, in])."""
    block.to(torch.float32 if dtype == np.float32 else torch.float64).eval()
    named = dict(block.named_parameters())
    named.update(dict(block.named_buffers()))
    for name, p in named.items():
        std = scales.get(name)
        if std is None:
            std = 1 / np.sqrt(p.shape[-1])
        with torch.no_grad():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(dtype) * std))
    return block


def _hf_run(block, x, ct, mode):
    """transformers' output and gradients: {"x": ..., parameter name: ...}."""
    params = dict(block.named_parameters())
    for p in params.values():
        p.grad = None
    xt = torch.tensor(x, requires_grad=True)
    with _routing(mode):
        out = block(xt)
        if isinstance(out, tuple):        # gpt-oss and Llama4 return (out, router values)
            out = out[0]
        out = out.reshape(xt.shape)       # Llama4 returns [T, d]
        (out * torch.from_numpy(ct)).sum().backward()
    grads = {"x": _np(xt.grad)}
    for name, p in params.items():
        grads[name] = np.zeros(tuple(p.shape)) if p.grad is None else _np(p.grad)
    return _np(out), grads


def _close(got, want, tol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    scale = np.abs(want).max() if want.size else 0.0
    diff = np.abs(got - want).max() if want.size else 0.0
    err = diff / scale if scale > 0 else (0.0 if diff == 0 else np.inf)
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e} (max |want| {scale:.3e})"


def _compare(block, rd_forward_vjp, x, ct, mode, expect_empty):
    """Run both and compare the output and every gradient."""
    want_out, want_grads = _hf_run(block, x, ct, mode)
    out, vjp_fn, to_hf, group_sizes = rd_forward_vjp(x)
    tol = TOL[mode]
    _close(out, want_out, tol, "output")
    got = to_hf(vjp_fn(ct))
    assert set(got) == set(want_grads), (sorted(got), sorted(want_grads))
    for name in want_grads:
        _close(got[name], want_grads[name], tol, f"gradient of {name}")
    if expect_empty:
        assert (np.asarray(group_sizes) == 0).any(), group_sizes


def _common_x(rng, shape_case, dtype):
    B, S, E = SHAPES[shape_case]
    x = rng.standard_normal((B, S, D)).astype(dtype)
    ct = rng.standard_normal((B, S, D)).astype(dtype)
    return x, ct, E


def _group_sizes(args, kwargs, x):
    _, aux = raggeddot.moe_block(x, *args, **kwargs, return_aux=True)
    return aux["group_sizes"]


def _moe_block_case(args, kwargs, grads_to_hf):
    """The raggeddot side of a family mapped onto moe_block: the function
    _compare calls."""
    def run(x):
        out, vjp_fn = raggeddot.moe_block_vjp(x, *args, **kwargs)
        return out, vjp_fn, grads_to_hf, _group_sizes(args, kwargs, x)
    return run


# ---------------------------------------------------------------------------
# The families mapped onto moe_block (as the README shows them)
# ---------------------------------------------------------------------------


def mixtral_like_args(block, norm_topk_prob):
    """Mixtral, Qwen3-MoE, OLMoE: router gate.weight [E, d]; experts
    gate_up_proj [E, 2f, d] (gate rows, then up rows) and down_proj [E, d, f]."""
    gate_up = _np(block.experts.gate_up_proj)
    f = gate_up.shape[1] // 2
    args = (_np(block.gate.weight).T, gate_up[:, :f], gate_up[:, f:], _np(block.experts.down_proj))
    kwargs = dict(top_k=block.gate.top_k, norm_topk_prob=norm_topk_prob, weights_layout="efd")

    def grads_to_hf(g):
        return {"x": g["x"], "gate.weight": g["router_weights"].T,
                "experts.gate_up_proj": np.concatenate([g["w0"], g["w1"]], axis=1),
                "experts.down_proj": g["wo"]}

    return args, kwargs, grads_to_hf


def deepseek_v3_args(block):
    """DeepSeek-V3: sigmoid scores, e_score_correction_bias for the choice,
    group-limited top-k, normalised and scaled weights, shared experts."""
    gate, shared = block.gate, block.shared_experts
    gate_up = _np(block.experts.gate_up_proj)
    f = gate_up.shape[1] // 2
    args = (_np(gate.weight).T, gate_up[:, :f], gate_up[:, f:], _np(block.experts.down_proj))
    kwargs = dict(top_k=gate.top_k, score_func="sigmoid", selection_bias=_np(gate.e_score_correction_bias),
                  n_groups=gate.num_group, topk_groups=gate.topk_group, norm_topk_prob=gate.norm_topk_prob,
                  routed_scaling_factor=gate.routed_scaling_factor, weights_layout="efd",
                  shared_experts=(_np(shared.gate_proj.weight).T, _np(shared.up_proj.weight).T,
                                  _np(shared.down_proj.weight).T))

    def grads_to_hf(g):
        s0, s1, so = g["shared_experts"]
        return {"x": g["x"], "gate.weight": g["router_weights"].T,
                "experts.gate_up_proj": np.concatenate([g["w0"], g["w1"]], axis=1),
                "experts.down_proj": g["wo"],
                "shared_experts.gate_proj.weight": s0.T, "shared_experts.up_proj.weight": s1.T,
                "shared_experts.down_proj.weight": so.T}

    return args, kwargs, grads_to_hf


def gpt_oss_args(block):
    """gpt-oss: router with bias, softmax over the top-k logits (= softmax,
    top-k, renormalised), gate_up_proj [E, d, 2f] interleaved (gate = even
    columns, up = odd) with its bias [E, 2f], down_proj [E, f, d] with bias,
    the clipped swiglu."""
    router, experts = block.router, block.experts
    gate_up, gate_up_bias = _np(experts.gate_up_proj), _np(experts.gate_up_proj_bias)
    args = (_np(router.weight).T, gate_up[..., 0::2], gate_up[..., 1::2], _np(experts.down_proj))
    kwargs = dict(top_k=router.top_k, norm_topk_prob=True, router_bias=_np(router.bias),
                  activation="swiglu_oai", swiglu_limit=experts.limit, w0_bias=gate_up_bias[:, 0::2],
                  w1_bias=gate_up_bias[:, 1::2], wo_bias=_np(experts.down_proj_bias))

    def interleave(gate, up):
        out = np.empty(gate.shape[:-1] + (2 * gate.shape[-1],), gate.dtype)
        out[..., 0::2], out[..., 1::2] = gate, up
        return out

    def grads_to_hf(g):
        return {"x": g["x"], "router.weight": g["router_weights"].T, "router.bias": g["router_bias"],
                "experts.gate_up_proj": interleave(g["w0"], g["w1"]),
                "experts.gate_up_proj_bias": interleave(g["w0_bias"], g["w1_bias"]),
                "experts.down_proj": g["wo"], "experts.down_proj_bias": g["wo_bias"]}

    return args, kwargs, grads_to_hf


def _config(cls, E, **extra):
    cfg = cls(hidden_size=D, num_experts_per_tok=2, hidden_act="silu", **extra)
    cfg.num_experts = cfg.num_local_experts = E     # one attribute under two names in most configs
    cfg._experts_implementation = "eager"
    return cfg


def _build(family, E, dtype, rng, **config_extra):
    """The transformers block of ``family`` with E experts and random weights."""
    C = transformers
    if family == "mixtral":
        block = MixtralSparseMoeBlock(_config(C.MixtralConfig, E, intermediate_size=F, **config_extra))
    elif family == "qwen3_moe":
        block = Qwen3MoeSparseMoeBlock(_config(C.Qwen3MoeConfig, E, moe_intermediate_size=F,
                                               norm_topk_prob=True, **config_extra))
    elif family == "olmoe":
        block = OlmoeSparseMoeBlock(_config(C.OlmoeConfig, E, intermediate_size=F, **config_extra))
    elif family == "deepseek_v3":
        block = DeepseekV3MoE(_config(C.DeepseekV3Config, E, moe_intermediate_size=F, n_group=4,
                                      topk_group=2, n_shared_experts=2, norm_topk_prob=True,
                                      routed_scaling_factor=2.5, **config_extra))
    elif family == "gpt_oss":
        block = GptOssMLP(_config(C.GptOssConfig, E, intermediate_size=F, **config_extra))
    elif family == "qwen2_moe":
        block = Qwen2MoeSparseMoeBlock(_config(C.Qwen2MoeConfig, E, moe_intermediate_size=F,
                                               shared_expert_intermediate_size=10, **config_extra))
    elif family == "llama4":
        cfg = _config(C.Llama4TextConfig, E, intermediate_size=F, **config_extra)
        cfg.num_experts_per_tok = 1
        block = Llama4TextMoe(cfg)
    else:
        raise AssertionError(family)
    scales = {
        # gpt-oss: large enough gate/up values that the swiglu clamps (limit 7) are reached
        "experts.gate_up_proj": 3 / np.sqrt(D) if family == "gpt_oss" else 1 / np.sqrt(D),
        "experts.down_proj": 1 / np.sqrt(F),
        "experts.gate_up_proj_bias": 0.5, "experts.down_proj_bias": 0.5, "router.bias": 0.5,
        "gate.e_score_correction_bias": 0.1,
    }
    return _init(block, rng, dtype, scales)


def _family_case(family, block):
    if family == "mixtral":
        return mixtral_like_args(block, norm_topk_prob=True)
    if family in ("qwen3_moe", "olmoe"):
        return mixtral_like_args(block, norm_topk_prob=block.gate.norm_topk_prob)
    if family == "deepseek_v3":
        return deepseek_v3_args(block)
    if family == "gpt_oss":
        return gpt_oss_args(block)
    raise AssertionError(family)


@pytest.mark.parametrize("shape_case", list(SHAPES))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss"])
def test_family_matches_transformers(rng, family, mode, shape_case):
    x, ct, E = _common_x(rng, shape_case, _dtype(mode))
    block = _build(family, E, _dtype(mode), rng)
    args, kwargs, to_hf = _family_case(family, block)
    _compare(block, _moe_block_case(args, kwargs, to_hf), x, ct, mode, shape_case == "empty-experts")


def test_olmoe_unnormalised_weights(rng):
    """OLMoE's default norm_topk_prob=False: the top-k softmax probabilities as they are."""
    x, ct, E = _common_x(rng, "tokens", np.float64)
    block = _build("olmoe", E, np.float64, rng, norm_topk_prob=False)
    assert block.gate.norm_topk_prob is False
    args, kwargs, to_hf = _family_case("olmoe", block)
    _compare(block, _moe_block_case(args, kwargs, to_hf), x, ct, "float64", False)


# ---------------------------------------------------------------------------
# Llama4 (top-1 sigmoid router, the score scales the expert's input, shared expert)
# ---------------------------------------------------------------------------


def _silu(z):
    return z / (1 + np.exp(-z))


def llama4_composed(block):
    """Llama4's block from the gathers and ragged_dot under raggeddot.vjp:

        chosen  = top-k of logits = x @ router.weight^T;  s = sigmoid(chosen logits)
        xs      = ragged_gather(x, token_of_slot, weights=s_of_slot)
        h       = silu(ragged_dot(xs, gate_up[..., :f], gs)) * ragged_dot(xs, gate_up[..., f:], gs)
        out     = ragged_gather_reduce(ragged_dot(h, down_proj, gs), slot_of) + shared MLP(x)
    """
    Wr = _np(block.router.weight)                        # [E, d]
    gate_up, down = _np(block.experts.gate_up_proj), _np(block.experts.down_proj)
    f, k = down.shape[1], block.top_k
    sh = block.shared_expert
    Gs, Us, Ds = _np(sh.gate_proj.weight), _np(sh.up_proj.weight), _np(sh.down_proj.weight)

    def run(x3):
        x = x3.reshape(-1, x3.shape[-1])
        T, E = x.shape[0], Wr.shape[0]
        logits = x @ Wr.T
        chosen = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        s = 1 / (1 + np.exp(-np.take_along_axis(logits, chosen, axis=1)))
        flat = chosen.ravel()
        token_of_slot = np.argsort(flat, kind="stable")
        slot_of = np.empty_like(token_of_slot)
        slot_of[token_of_slot] = np.arange(flat.size)
        slot_of = slot_of.reshape(T, k)
        s_slot = s.ravel()[token_of_slot]
        token_of_slot //= k
        gs = np.bincount(flat, minlength=E)

        xs, vjp_gather = raggeddot.vjp(raggeddot.ragged_gather, x, token_of_slot, s_slot)
        g, vjp_g = raggeddot.vjp(raggeddot.ragged_dot, xs, gate_up[..., :f], gs)
        u, vjp_u = raggeddot.vjp(raggeddot.ragged_dot, xs, gate_up[..., f:], gs)
        sig = 1 / (1 + np.exp(-g))
        y, vjp_o = raggeddot.vjp(raggeddot.ragged_dot, g * sig * u, down, gs)
        routed, vjp_reduce = raggeddot.vjp(raggeddot.ragged_gather_reduce, y, slot_of)
        sg, su = x @ Gs.T, x @ Us.T
        sh_h = _silu(sg) * su
        out = routed + sh_h @ Ds.T

        def vjp_fn(ct3):
            ct = ct3.reshape(out.shape)
            d_y, _ = vjp_reduce(ct)
            d_h, d_down, _ = vjp_o(d_y)
            d_xs_g, d_w0, _ = vjp_g(d_h * u * sig * (1 + g * (1 - sig)))
            d_xs_u, d_w1, _ = vjp_u(d_h * g * sig)
            d_x, _, d_s_slot = vjp_gather(d_xs_g + d_xs_u)
            # through s = sigmoid(chosen logits) into the router and x
            d_s = np.empty_like(s)
            d_s.ravel()[np.argsort(slot_of.ravel())] = d_s_slot
            d_logit = d_s * s * (1 - s)                   # [T, k]
            d_Wr = np.zeros_like(Wr)
            for j in range(k):
                np.add.at(d_Wr, chosen[:, j], d_logit[:, j, None] * x)
                d_x = d_x + d_logit[:, j, None] * Wr[chosen[:, j]]
            # the shared MLP
            sig_s = 1 / (1 + np.exp(-sg))
            d_sh_h = ct @ Ds
            d_sg = d_sh_h * su * sig_s * (1 + sg * (1 - sig_s))
            d_su = d_sh_h * _silu(sg)
            d_x = d_x + d_sg @ Gs + d_su @ Us
            return {"x": d_x.reshape(x3.shape), "router.weight": d_Wr,
                    "experts.gate_up_proj": np.concatenate([d_w0, d_w1], axis=-1),
                    "experts.down_proj": d_down,
                    "shared_expert.gate_proj.weight": d_sg.T @ x, "shared_expert.up_proj.weight": d_su.T @ x,
                    "shared_expert.down_proj.weight": ct.T @ sh_h}

        return out.reshape(x3.shape), vjp_fn, (lambda grads: grads), gs

    return run


def llama4_args(block):
    """Llama4 on moe_block: fused gate_up_proj [E, d, 2f] (gate, up halves),
    top-1 sigmoid scores applied to the expert's input, a shared expert."""
    sh = block.shared_expert
    args = (_np(block.router.weight).T, _np(block.experts.gate_up_proj), None, _np(block.experts.down_proj))
    kwargs = dict(top_k=block.top_k, score_func="sigmoid", router_weights_on="input", gate_up="concat",
                  shared_experts=(_np(sh.gate_proj.weight).T, _np(sh.up_proj.weight).T, _np(sh.down_proj.weight).T))

    def grads_to_hf(g):
        s0, s1, so = g["shared_experts"]
        return {"x": g["x"], "router.weight": g["router_weights"].T, "experts.gate_up_proj": g["w0"],
                "experts.down_proj": g["wo"], "shared_expert.gate_proj.weight": s0.T,
                "shared_expert.up_proj.weight": s1.T, "shared_expert.down_proj.weight": so.T}

    return args, kwargs, grads_to_hf


@pytest.mark.parametrize("shape_case", list(SHAPES))
@pytest.mark.parametrize("mode", MODES)
def test_llama4_composed_matches_transformers(rng, mode, shape_case):
    x, ct, E = _common_x(rng, shape_case, _dtype(mode))
    block = _build("llama4", E, _dtype(mode), rng)
    _compare(block, llama4_composed(block), x, ct, mode, shape_case == "empty-experts")


@_needs("router_weights_on", "gate_up")
@pytest.mark.parametrize("shape_case", list(SHAPES))
@pytest.mark.parametrize("mode", MODES)
def test_llama4_moe_block_matches_transformers(rng, mode, shape_case):
    x, ct, E = _common_x(rng, shape_case, _dtype(mode))
    block = _build("llama4", E, _dtype(mode), rng)
    args, kwargs, to_hf = llama4_args(block)
    _compare(block, _moe_block_case(args, kwargs, to_hf), x, ct, mode, shape_case == "empty-experts")


# ---------------------------------------------------------------------------
# Options of moe_block that are on their way (see the module docstring)
# ---------------------------------------------------------------------------


def qwen2_moe_args(block):
    """Qwen2-MoE: Mixtral's experts plus a shared expert whose output is
    scaled per token by sigmoid(x @ shared_expert_gate.weight^T)."""
    args, kwargs, mixtral_to_hf = mixtral_like_args(block, norm_topk_prob=block.gate.norm_topk_prob)
    sh = block.shared_expert
    kwargs.update(shared_experts=(_np(sh.gate_proj.weight).T, _np(sh.up_proj.weight).T,
                                  _np(sh.down_proj.weight).T),
                  shared_expert_gate=_np(block.shared_expert_gate.weight).T)     # [d, 1]

    def grads_to_hf(g):
        s0, s1, so = g["shared_experts"]
        return {**mixtral_to_hf(g), "shared_expert.gate_proj.weight": s0.T, "shared_expert.up_proj.weight": s1.T,
                "shared_expert.down_proj.weight": so.T, "shared_expert_gate.weight": g["shared_expert_gate"].T}

    return args, kwargs, grads_to_hf


@_needs("shared_expert_gate")
@pytest.mark.parametrize("shape_case", list(SHAPES))
@pytest.mark.parametrize("mode", MODES)
def test_qwen2_moe_matches_transformers(rng, mode, shape_case):
    x, ct, E = _common_x(rng, shape_case, _dtype(mode))
    block = _build("qwen2_moe", E, _dtype(mode), rng)
    args, kwargs, to_hf = qwen2_moe_args(block)
    _compare(block, _moe_block_case(args, kwargs, to_hf), x, ct, mode, shape_case == "empty-experts")


@_needs("swiglu_alpha")
@pytest.mark.parametrize("mode", ["float32", "float64"])
def test_gpt_oss_swiglu_alpha(rng, mode):
    x, ct, E = _common_x(rng, "tokens", _dtype(mode))
    block = _build("gpt_oss", E, _dtype(mode), rng, swiglu_alpha=1.3, swiglu_limit=5.0)
    assert block.experts.alpha == 1.3 and block.experts.limit == 5.0
    args, kwargs, to_hf = gpt_oss_args(block)
    kwargs["swiglu_alpha"] = block.experts.alpha
    _compare(block, _moe_block_case(args, kwargs, to_hf), x, ct, mode, False)


def mixtral_fused_args(block):
    """Mixtral with gate_up_proj [E, 2f, d] passed as it is (fused, "efd")."""
    args = (_np(block.gate.weight).T, _np(block.experts.gate_up_proj), None, _np(block.experts.down_proj))
    kwargs = dict(top_k=block.gate.top_k, norm_topk_prob=True, weights_layout="efd", gate_up="concat")

    def grads_to_hf(g):
        assert "w1" not in g
        return {"x": g["x"], "gate.weight": g["router_weights"].T, "experts.gate_up_proj": g["w0"],
                "experts.down_proj": g["wo"]}

    return args, kwargs, grads_to_hf


def gpt_oss_fused_args(block):
    """gpt-oss with gate_up_proj [E, d, 2f] and its bias [E, 2f] as they are (interleaved)."""
    router, experts = block.router, block.experts
    args = (_np(router.weight).T, _np(experts.gate_up_proj), None, _np(experts.down_proj))
    kwargs = dict(top_k=router.top_k, norm_topk_prob=True, router_bias=_np(router.bias), activation="swiglu_oai",
                  swiglu_limit=experts.limit, swiglu_alpha=experts.alpha, gate_up="interleaved",
                  w0_bias=_np(experts.gate_up_proj_bias), wo_bias=_np(experts.down_proj_bias))

    def grads_to_hf(g):
        assert "w1" not in g and "w1_bias" not in g
        return {"x": g["x"], "router.weight": g["router_weights"].T, "router.bias": g["router_bias"],
                "experts.gate_up_proj": g["w0"], "experts.gate_up_proj_bias": g["w0_bias"],
                "experts.down_proj": g["wo"], "experts.down_proj_bias": g["wo_bias"]}

    return args, kwargs, grads_to_hf


@_needs("gate_up", "swiglu_alpha")
@pytest.mark.parametrize("shape_case", list(SHAPES))
@pytest.mark.parametrize("mode", ["float32", "float64"])
@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_fused_gate_up_matches_transformers(rng, family, mode, shape_case):
    x, ct, E = _common_x(rng, shape_case, _dtype(mode))
    block = _build(family, E, _dtype(mode), rng)
    args, kwargs, to_hf = (mixtral_fused_args if family == "mixtral" else gpt_oss_fused_args)(block)
    _compare(block, _moe_block_case(args, kwargs, to_hf), x, ct, mode, shape_case == "empty-experts")


def _hf_router_z_loss(logits):
    """ST-MoE's router z-loss as transformers computes it (switch_transformers'
    router_z_loss_func, for one group of tokens): mean over tokens of logsumexp(logits)^2."""
    from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func
    return router_z_loss_func(logits[None])


@_needs("load_balance")
@pytest.mark.parametrize("mode", ["float32", "float64"])
def test_load_balance_hf_matches_transformers(rng, mode):
    """aux["load_balance_loss"] with load_balance="hf" is transformers'
    load_balancing_loss_func of the router logits, and its gradient (through
    the softmax probabilities; the counts are constants) matches torch
    autograd of that function; likewise router_z_loss and router_logits."""
    x, _, E = _common_x(rng, "tokens", _dtype(mode))
    block = _build("mixtral", E, _dtype(mode), rng)
    args, kwargs, _ = mixtral_like_args(block, norm_topk_prob=True)
    c_lb, c_z = 0.7, 0.3
    w = block.gate.weight
    w.grad = None
    xt = torch.tensor(x, requires_grad=True)
    with _routing(mode):
        logits = torch.nn.functional.linear(xt.reshape(-1, D), w)
        lb = load_balancing_loss_func((logits,), E, block.gate.top_k)
        z = _hf_router_z_loss(logits)
        (c_lb * lb + c_z * z).backward()
    (out, aux), vjp_fn = raggeddot.moe_block_vjp(x, *args, **kwargs, load_balance="hf", return_aux=True)
    tol = TOL[mode]
    _close(aux["load_balance_loss"], _np(lb), tol, "load_balance_loss")
    _close(aux["router_z_loss"], _np(z), tol, "router_z_loss")
    _close(np.asarray(aux["router_logits"]).reshape(-1, E), _np(logits), tol, "router_logits")
    grads = vjp_fn(np.zeros_like(out), d_aux={"load_balance_loss": c_lb, "router_z_loss": c_z})
    _close(grads["router_weights"].T, _np(w.grad), tol, "gradient of gate.weight")
    _close(grads["x"], _np(xt.grad), tol, "gradient of x")


def test_float64_routing_keeps_float64_casts():
    """The mode the float64 cases run under: each way transformers asks a
    float64 tensor for float32 gives float64, and a float32 tensor is left
    alone."""
    z = torch.tensor([0.1, 2.0, -1.0], dtype=torch.float64)
    with float64_routing(torch):
        casts = [z.float(), z.to(torch.float32), z.type(torch.float32),
                 torch.softmax(z, dim=0, dtype=torch.float32), torch.zeros(2, dtype=torch.float32)]
        single = z.to(torch.float16).float()
    assert [c.dtype for c in casts] == [torch.float64] * len(casts)
    assert torch.equal(casts[0], z) and torch.equal(casts[1], z)
    assert single.dtype == torch.float32
    assert z.float().dtype == torch.float32          # outside the mode: as torch does

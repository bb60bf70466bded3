"""The MoE layer of raggeddot.moe_block written other ways, for the moe benchmark.

Each takes the inputs of an MoE spec (raggeddot.specs.make_inputs: x, router_weights, w0,
w1, wo, ct and ``options``, moe_block's keyword arguments with top_k) and returns
``{"out": ...}`` or, with the backward, the output and the gradients named as
moe_block_vjp names them (``shared_experts[i]`` for the shared expert's three).

- numpy: argsort routing, a stable argsort of the assignments by expert, a gather, one
  np.matmul per expert for each of the three projections, the activation, a weighted
  combine; its backward is the same per-expert loop (d_in = d_out @ w.T, d_w = in.T @ d_out).
  It is the oracle of the timed runs (itself checked against raggeddot.reference).
- torch, 16-bit: a per-expert loop in transformers' eager style with bfloat16 / float16
  experts and a float32 router (forward).
- hf: transformers' own sparse-MoE block (Mixtral, Qwen3-MoE, DeepSeek-V3 or gpt-oss, as the
  spec's options say) with the spec's weights, its experts run by transformers' per-expert
  loop or by torch._grouped_mm; backward by autograd.
"""
from __future__ import annotations

import numpy as np

MAIN_GRADS = ("x", "router_weights", "w0", "w1", "wo")


class Unsupported(Exception):
    """The baseline does not compute this spec's layer (the reason is the message)."""


def flat_grads(grads: dict) -> dict:
    """{name: array}, shared_experts expanded to shared_experts[i], None entries dropped."""
    out = {k: v for k, v in grads.items() if k != "shared_experts" and v is not None}
    for i, a in enumerate(grads.get("shared_experts") or ()):
        out[f"shared_experts[{i}]"] = a
    return out


# ----------------------------------------------------------------------------------------------
# NumPy


def np_gated(g, u, act, limit):
    """act(g) * u (silu) or gpt-oss's clipped swiglu, with few temporaries."""
    with np.errstate(over="ignore"):
        if act == "silu":
            a = np.negative(g)
            np.exp(a, out=a)
            a += 1
            np.divide(g, a, out=a)
            a *= u
            return a
        if act == "swiglu_oai":
            gc = np.minimum(g, limit)
            a = gc * -1.702
            np.exp(a, out=a)
            a += 1
            np.divide(gc, a, out=a)
            uc = np.clip(u, -limit, limit)
            uc += 1
            a *= uc
            return a
    raise ValueError(f"numpy MoE: activation {act!r} not implemented")


def np_gated_grad(g, u, da, act, limit):
    """(d g, d u) of np_gated given its cotangent da."""
    with np.errstate(over="ignore"):
        if act == "silu":
            s = np.negative(g)
            np.exp(s, out=s)
            s += 1
            np.reciprocal(s, out=s)  # sigmoid(g)
            du = da * (g * s)
            t = 1 - s  # d silu = s * (1 + g * (1 - s))
            t *= g
            t += 1
            t *= s
            t *= u
            t *= da
            return t, du
        if act == "swiglu_oai":
            gc, uc = np.minimum(g, limit), np.clip(u, -limit, limit)
            s = 1 / (1 + np.exp(-1.702 * gc))
            dglu = np.where(g > limit, 0, s * (1 + 1.702 * gc * (1 - s)))
            dg = da * dglu * (uc + 1)
            du = np.where((u > limit) | (u < -limit), 0, da * (gc * s))
            return dg.astype(g.dtype, copy=False), du.astype(g.dtype, copy=False)
    raise ValueError(f"numpy MoE: activation {act!r} not implemented")


def _np_route(x, rw, kw):
    """scores [T, E], chosen experts idx [T, k] and their weights w [T, k]."""
    T, E, k = x.shape[0], rw.shape[1], kw["top_k"]
    sigmoid = kw.get("score_func", "softmax") == "sigmoid"
    logits = x @ rw
    if kw.get("router_bias") is not None:
        logits += kw["router_bias"]
    if sigmoid:
        with np.errstate(over="ignore"):
            scores = 1 / (1 + np.exp(-logits))
    else:
        scores = np.exp(logits - logits.max(axis=1, keepdims=True))
        scores /= scores.sum(axis=1, keepdims=True)
    sel = scores if kw.get("selection_bias") is None else scores + kw["selection_bias"]
    if kw.get("n_groups"):
        G = kw["n_groups"]
        gscore = np.sort(sel.reshape(T, G, E // G), axis=2)[:, :, -2:].sum(axis=2)
        drop = np.argsort(-gscore, axis=1, kind="stable")[:, kw["topk_groups"]:]
        sel = sel.copy()
        sel.reshape(T, G, E // G)[np.arange(T)[:, None], drop] = -np.inf
    idx = np.argsort(-sel, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(scores, idx, axis=1)
    if kw.get("norm_topk_prob"):
        w /= w.sum(axis=1, keepdims=True) + (1e-20 if sigmoid else 0.0)
    w *= kw.get("routed_scaling_factor", 1.0)
    return scores, idx, w


def _experts(bounds):
    """(expert, first row, end row) of every expert with rows, from bounds [E + 1]."""
    for e in range(len(bounds) - 1):
        if bounds[e + 1] > bounds[e]:
            yield e, bounds[e], bounds[e + 1]


def np_forward(inputs: dict, x=None, save: bool = False):
    """The layer in plain NumPy: out [T, d], and the residuals of the backward if save."""
    kw = inputs["options"]
    x = inputs["x"] if x is None else x
    w0, w1, wo = inputs["w0"], inputs["w1"], inputs["wo"]
    (T, d), (E, _, f), k = x.shape, w0.shape, kw["top_k"]
    act, limit = kw.get("activation", "silu"), kw.get("swiglu_limit", 7.0)
    scores, idx, w = _np_route(x, inputs["router_weights"], kw)
    # dispatch: assignments sorted by expert, stable in token order
    flat = idx.ravel()
    order = np.argsort(flat, kind="stable")
    tok, N = order // k, flat.size
    slot = np.empty(N, dtype=np.int64)
    slot[order] = np.arange(N)
    slot = slot.reshape(T, k)
    bounds = np.zeros(E + 1, dtype=np.int64)
    np.cumsum(np.bincount(flat, minlength=E), out=bounds[1:])
    xs = x[tok]
    b0, b1, bo = kw.get("w0_bias"), kw.get("w1_bias"), kw.get("wo_bias")
    h0, h1, y = (np.empty((N, f), dtype=x.dtype), np.empty((N, f), dtype=x.dtype), np.empty((N, d), dtype=x.dtype))

    for e, s, t in _experts(bounds):
        np.matmul(xs[s:t], w0[e], out=h0[s:t])
        np.matmul(xs[s:t], w1[e], out=h1[s:t])
        if b0 is not None:
            h0[s:t] += b0[e]
            h1[s:t] += b1[e]
    a = np_gated(h0, h1, act, limit)
    for e, s, t in _experts(bounds):
        np.matmul(a[s:t], wo[e], out=y[s:t])
        if bo is not None:
            y[s:t] += bo[e]
    out = np.zeros((T, d), dtype=x.dtype)  # combine
    for j in range(k):
        out += w[:, j, None] * y[slot[:, j]]
    hs = None
    if kw.get("shared_experts") is not None:
        s0, s1, so = kw["shared_experts"]
        hs0, hs1 = x @ s0, x @ s1
        as_ = np_gated(hs0, hs1, act, limit)
        out += as_ @ so
        hs = (hs0, hs1, as_)
    if not save:
        return out, None
    return out, dict(scores=scores, idx=idx, w=w, order=order, tok=tok, slot=slot, bounds=bounds,
                     xs=xs, h0=h0, h1=h1, a=a, y=y, hs=hs, x=x)


def np_backward(inputs: dict, r: dict, ct: np.ndarray) -> dict:
    """Gradients of sum(out * ct) with the expert choice held fixed, per-expert loops."""
    kw = inputs["options"]
    rw, w0, w1, wo = inputs["router_weights"], inputs["w0"], inputs["w1"], inputs["wo"]
    x, bounds, tok, slot, w = r["x"], r["bounds"], r["tok"], r["slot"], r["w"]
    (T, d), (E, _, f), k, N = x.shape, w0.shape, kw["top_k"], tok.size
    act, limit = kw.get("activation", "silu"), kw.get("swiglu_limit", 7.0)
    dt = x.dtype
    # combine^T
    dy = ct[tok]
    dy *= w.ravel()[r["order"]][:, None]
    dw = np.empty((T, k), dtype=dt)
    for j in range(k):
        dw[:, j] = np.einsum("td,td->t", ct, r["y"][slot[:, j]])
    # down projection
    da, dwo = np.empty((N, f), dtype=dt), np.zeros_like(wo)
    dbo = np.zeros((E, d), dtype=dt) if kw.get("wo_bias") is not None else None
    for e, s, t in _experts(bounds):
        da[s:t] = dy[s:t] @ wo[e].T
        dwo[e] = r["a"][s:t].T @ dy[s:t]
        if dbo is not None:
            dy[s:t].sum(axis=0, out=dbo[e])
    dh0, dh1 = np_gated_grad(r["h0"], r["h1"], da, act, limit)
    del da
    # gate and up projections
    xs, dxs = r["xs"], np.empty((N, d), dtype=dt)
    dw0, dw1 = np.zeros_like(w0), np.zeros_like(w1)
    has_b = kw.get("w0_bias") is not None
    db0, db1 = (np.zeros((E, f), dtype=dt), np.zeros((E, f), dtype=dt)) if has_b else (None, None)
    for e, s, t in _experts(bounds):
        dxs[s:t] = dh0[s:t] @ w0[e].T
        dxs[s:t] += dh1[s:t] @ w1[e].T
        dw0[e] = xs[s:t].T @ dh0[s:t]
        dw1[e] = xs[s:t].T @ dh1[s:t]
        if has_b:
            dh0[s:t].sum(axis=0, out=db0[e])
            dh1[s:t].sum(axis=0, out=db1[e])
    dx = np.zeros((T, d), dtype=dt)  # dispatch^T
    for j in range(k):
        dx += dxs[slot[:, j]]
    # router
    scores, idx = r["scores"], r["idx"]
    dwn = dw * kw.get("routed_scaling_factor", 1.0)
    if kw.get("norm_topk_prob"):
        chosen = np.take_along_axis(scores, idx, axis=1)
        denom = chosen.sum(axis=1, keepdims=True) + (1e-20 if kw.get("score_func") == "sigmoid" else 0.0)
        dchosen = (dwn - np.sum(dwn * (chosen / denom), axis=1, keepdims=True)) / denom
    else:
        dchosen = dwn
    dscores = np.zeros_like(scores)
    np.put_along_axis(dscores, idx, dchosen, axis=1)
    if kw.get("score_func", "softmax") == "softmax":
        dlogits = scores * (dscores - np.sum(dscores * scores, axis=1, keepdims=True))
    else:
        dlogits = dscores * scores * (1 - scores)
    g = {"router_weights": x.T @ dlogits}
    dx += dlogits @ rw.T
    if kw.get("shared_experts") is not None:
        s0, s1, so = kw["shared_experts"]
        hs0, hs1, as_ = r["hs"]
        dhs0, dhs1 = np_gated_grad(hs0, hs1, ct @ so.T, act, limit)
        g["shared_experts"] = (x.T @ dhs0, x.T @ dhs1, as_.T @ ct)
        dx += dhs0 @ s0.T
        dx += dhs1 @ s1.T
    g.update(x=dx, w0=dw0, w1=dw1, wo=dwo)
    if kw.get("router_bias") is not None:
        g["router_bias"] = dlogits.sum(axis=0)
    if has_b:
        g["w0_bias"], g["w1_bias"] = db0, db1
    if dbo is not None:
        g["wo_bias"] = dbo
    return g


def numpy_fn(inputs: dict, backward: bool):
    if not backward:
        return lambda: {"out": np_forward(inputs)[0]}

    def fwd_bwd():
        out, r = np_forward(inputs, save=True)
        return dict(flat_grads(np_backward(inputs, r, inputs["ct"])), out=out)

    return fwd_bwd


# ----------------------------------------------------------------------------------------------
# torch, 16-bit


def torch_half_fn(torch, i32: dict, dtype: str):
    """A torch per-expert loop with the expert weights and matmuls in the 16-bit ``dtype``, on
    the float32 inputs ``i32`` (forward only). The router runs in float32, as in raggeddot's
    moe_block: a 16-bit router picks other experts for near-tied tokens, which makes it another
    layer. Then, per expert that got tokens, F.linear on HF's [out, in] weights in the 16-bit
    dtype, the activation, and the weighted combine accumulated in float32 (index_add_); the
    result rounded."""
    kw = i32["options"]
    if kw.get("n_groups"):
        raise Unsupported("group-limited routing is not in the 16-bit torch loop")
    F, dt = torch.nn.functional, getattr(torch, dtype)
    act, limit, k = kw.get("activation", "silu"), kw.get("swiglu_limit", 7.0), kw["top_k"]
    sigmoid = kw.get("score_func", "softmax") == "sigmoid"

    def t32(a):
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a))

    x32, rw, rb, sb = (t32(a) for a in (i32["x"], i32["router_weights"], kw.get("router_bias"),
                                         kw.get("selection_bias")))
    xh = x32.to(dt)
    w0, w1, wo = (t32(i32[n].transpose(0, 2, 1)).to(dt) for n in ("w0", "w1", "wo"))
    b0, b1, bo = (None if kw.get(n) is None else t32(kw[n]).to(dt) for n in ("w0_bias", "w1_bias", "wo_bias"))
    shared = [t32(w.T).to(dt) for w in kw["shared_experts"]] if kw.get("shared_experts") is not None else None

    def mlp(h, e0, e1, eo, c0=None, c1=None, co=None):
        g, u = F.linear(h, e0, c0), F.linear(h, e1, c1)
        if act == "silu":
            z = F.silu(g) * u
        else:
            g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
            z = g * torch.sigmoid(g * 1.702) * (u + 1)
        return F.linear(z, eo, co)

    def fwd():
        with torch.inference_mode():
            logits = x32 @ rw if rb is None else x32 @ rw + rb
            scores = logits.sigmoid() if sigmoid else F.softmax(logits, dim=1)
            idx = torch.topk(scores if sb is None else scores + sb, k, dim=1)[1]
            w = scores.gather(1, idx)
            if kw.get("norm_topk_prob"):
                w = w / (w.sum(dim=1, keepdim=True) + (1e-20 if sigmoid else 0.0))
            w = w * kw.get("routed_scaling_factor", 1.0)
            out = torch.zeros(x32.shape, dtype=torch.float32)
            for e in torch.unique(idx).tolist():
                tok, slot = torch.where(idx == e)
                bias = [None if b is None else b[e] for b in (b0, b1, bo)]
                out.index_add_(0, tok, mlp(xh[tok], w0[e], w1[e], wo[e], *bias).float() * w[tok, slot, None])
            if shared is not None:
                out += mlp(xh, *shared).float()
            return {"out": out.to(dt)}

    return fwd


# ----------------------------------------------------------------------------------------------
# Hugging Face transformers: the library's own sparse-MoE blocks

#: transformers' experts implementations timed (config._experts_implementation): its plain
#: per-expert loop, and torch._grouped_mm (float32/bfloat16/float16 only)
HF_IMPLEMENTATIONS = ("eager", "grouped_mm")


def _hf_family(kw: dict, f: int, shared_width: int) -> str:
    """The transformers block that computes moe_block with options ``kw``:
    sigmoid + groups -> DeepSeek-V3; gpt-oss's clipped SwiGLU -> gpt-oss; softmax + SiLU ->
    Mixtral (renormalised top-k) or Qwen3-MoE (not renormalised)."""
    act, score = kw.get("activation", "silu"), kw.get("score_func", "softmax")
    has = {n for n in ("router_bias", "selection_bias", "w0_bias", "w1_bias", "wo_bias") if kw.get(n) is not None}
    if score == "sigmoid":
        if act != "silu" or has - {"selection_bias"} or not kw.get("n_groups"):
            raise Unsupported("sigmoid routing: DeepSeek-V3's block needs SiLU, groups and no biases")
        if shared_width % f:
            raise Unsupported(f"DeepSeek-V3's shared experts are n x f wide; got {shared_width} for f={f}")
        return "deepseek_v3"
    if kw.get("shared_experts") is not None or kw.get("n_groups") or kw.get("routed_scaling_factor", 1.0) != 1.0:
        raise Unsupported("softmax routing with shared experts, groups or scaling has no transformers block")
    if act == "swiglu_oai":
        if not kw.get("norm_topk_prob") or "selection_bias" in has:
            raise Unsupported("gpt-oss's block takes the softmax of the top-k logits (renormalised)")
        return "gpt_oss"
    if act != "silu" or has:
        raise Unsupported(f"activation {act!r} with biases {sorted(has)}: no transformers block")
    return "mixtral" if kw.get("norm_topk_prob") else "qwen3_moe"


def hf_block(torch, inputs: dict, implementation: str):
    """``(block, family)``: transformers' float32 block computing the spec's layer with its
    weights, in eval mode, its experts run by ``implementation``."""
    import transformers as tf
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    kw, x = inputs["options"], inputs["x"]
    w0, w1, wo = inputs["w0"], inputs["w1"], inputs["wo"]
    (E, d, f), k = w0.shape, kw["top_k"]
    shared = kw.get("shared_experts")
    family = _hf_family(kw, f, 0 if shared is None else shared[0].shape[1])
    common = dict(hidden_size=d, num_experts_per_tok=k, hidden_act="silu")
    if family == "mixtral":
        cfg = tf.MixtralConfig(intermediate_size=f, num_local_experts=E, **common)
        cls = MixtralSparseMoeBlock
    elif family == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(moe_intermediate_size=f, num_experts=E, norm_topk_prob=False, **common)
        cls = Qwen3MoeSparseMoeBlock
    elif family == "deepseek_v3":
        cfg = tf.DeepseekV3Config(moe_intermediate_size=f, n_routed_experts=E, n_group=kw["n_groups"],
                                  topk_group=kw["topk_groups"], norm_topk_prob=bool(kw.get("norm_topk_prob")),
                                  routed_scaling_factor=kw.get("routed_scaling_factor", 1.0),
                                  n_shared_experts=0 if shared is None else shared[0].shape[1] // f, **common)
        cls = DeepseekV3MoE
    else:
        cfg = tf.GptOssConfig(intermediate_size=f, num_local_experts=E, swiglu_limit=kw.get("swiglu_limit", 7.0),
                              **common)
        cls = GptOssMLP
    cfg._experts_implementation = implementation
    block = cls(cfg).to(torch.float32).eval()

    def put(param, value):
        with torch.no_grad():
            param.copy_(torch.from_numpy(np.ascontiguousarray(value)))

    def zeros(*shape):
        return np.zeros(shape, dtype=x.dtype)

    e = block.experts
    if family == "gpt_oss":        # [E, d, 2f] and [E, 2f], gate and up interleaved
        put(block.router.weight, inputs["router_weights"].T)
        put(block.router.bias, kw["router_bias"] if kw.get("router_bias") is not None else zeros(E))
        gate_up, gate_up_bias = np.empty((E, d, 2 * f), x.dtype), np.empty((E, 2 * f), x.dtype)
        gate_up[..., 0::2], gate_up[..., 1::2] = w0, w1
        gate_up_bias[:, 0::2] = kw["w0_bias"] if kw.get("w0_bias") is not None else 0
        gate_up_bias[:, 1::2] = kw["w1_bias"] if kw.get("w1_bias") is not None else 0
        put(e.gate_up_proj, gate_up)
        put(e.gate_up_proj_bias, gate_up_bias)
        put(e.down_proj, wo)
        put(e.down_proj_bias, kw["wo_bias"] if kw.get("wo_bias") is not None else zeros(E, d))
        return block, family
    put(block.gate.weight, inputs["router_weights"].T)       # [E, 2f, d]: gate rows, then up rows
    put(e.gate_up_proj, np.concatenate([w0.transpose(0, 2, 1), w1.transpose(0, 2, 1)], axis=1))
    put(e.down_proj, wo.transpose(0, 2, 1))
    if family == "deepseek_v3":
        sb = kw.get("selection_bias")
        put(block.gate.e_score_correction_bias, sb if sb is not None else zeros(E))
        if shared is not None:
            s = block.shared_experts
            for param, w in ((s.gate_proj.weight, shared[0]), (s.up_proj.weight, shared[1]),
                             (s.down_proj.weight, shared[2])):
                put(param, w.T)
    return block, family


def _hf_grads(block, family: str, x_grad) -> dict:
    """The block's gradients named and laid out as moe_block_vjp's main ones."""
    e = block.experts
    gu, down = e.gate_up_proj.grad.numpy(), e.down_proj.grad.numpy()
    if family == "gpt_oss":
        return {"x": x_grad, "router_weights": block.router.weight.grad.numpy().T,
                "w0": gu[..., 0::2], "w1": gu[..., 1::2], "wo": down}
    f = gu.shape[1] // 2
    return {"x": x_grad, "router_weights": block.gate.weight.grad.numpy().T,
            "w0": gu[:, :f].transpose(0, 2, 1), "w1": gu[:, f:].transpose(0, 2, 1), "wo": down.transpose(0, 2, 1)}


def hf_fn(torch, inputs: dict, backward: bool, implementation: str):
    """transformers' float32 block on the spec (see hf_block); forward under
    torch.inference_mode, forward + backward by autograd."""
    block, family = hf_block(torch, inputs, implementation)
    x = torch.from_numpy(inputs["x"])[None]            # [1, T, d]: the blocks take [batch, seq, d]

    def run(xt):
        out = block(xt)
        return out[0] if isinstance(out, tuple) else out  # gpt-oss: (out, router scores)

    if not backward:
        def fwd():
            with torch.inference_mode():
                return {"out": run(x)[0].numpy()}
        return fwd

    ct = torch.from_numpy(inputs["ct"])[None]

    def fwd_bwd():
        block.zero_grad(set_to_none=True)
        xt = x.detach().requires_grad_(True)
        out = run(xt)
        out.backward(ct)
        return dict(_hf_grads(block, family, xt.grad[0].numpy()), out=out.detach()[0].numpy())

    return fwd_bwd

"""The MoE layer of raggeddot.moe_block written three other ways, for the moe benchmark.

Each takes the inputs of an MoE spec (raggeddot.specs.make_inputs: x, router_weights, w0,
w1, wo, ct and ``options``, moe_block's keyword arguments with top_k) and returns
``{"out": ...}`` or, with the backward, the output and the gradients named as
moe_block_vjp names them (``shared_experts[i]`` for the shared expert's three).

- numpy: argsort routing, a stable argsort of the assignments by expert, a gather, one
  np.matmul per expert for each of the three projections, the activation, a weighted
  combine; its backward is the same per-expert loop (d_in = d_out @ w.T, d_w = in.T @ d_out).
  It is the oracle of the timed runs (itself checked against raggeddot.reference).
- torch: the expert loop of HF transformers (MixtralSparseMoeBlock: one_hot expert mask,
  torch.where per hit expert, F.linear on nn.Linear-layout [f, d] weights, index_add_),
  DeepSeek-V3's group-limited router; backward by autograd.
- jax: the same layer on jax.lax.ragged_dot, jitted; backward by jax.vjp.
- hf: transformers' own sparse-MoE block (Mixtral, Qwen3-MoE, DeepSeek-V3 or gpt-oss, as the
  spec's options say) with the spec's weights, its experts run by transformers' per-expert
  loop or by torch._grouped_mm; backward by autograd.
"""
from __future__ import annotations

import numpy as np

MAIN_GRADS = ("x", "router_weights", "w0", "w1", "wo")


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
# torch (HF transformers style)

#: (gradient name, tensor key, stored transposed in nn.Linear layout)
TORCH_LEAVES = [("x", "x", False), ("router_weights", "rw", True), ("w0", "w0", True), ("w1", "w1", True),
                ("wo", "wo", True), ("router_bias", "router_bias", False), ("w0_bias", "w0_bias", False),
                ("w1_bias", "w1_bias", False), ("wo_bias", "wo_bias", False),
                ("shared_experts[0]", "s0", True), ("shared_experts[1]", "s1", True),
                ("shared_experts[2]", "so", True)]


def _torch_tensors(torch, inputs: dict) -> dict:
    """Leaf tensors in nn.Linear layout ([out, in]), as HF stores the experts."""
    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a))

    kw = inputs["options"]
    d = dict(x=t(inputs["x"]), rw=t(inputs["router_weights"].T), ct=t(inputs["ct"]),
             **{n: t(inputs[n].transpose(0, 2, 1)) for n in ("w0", "w1", "wo")})
    for name in ("router_bias", "selection_bias", "w0_bias", "w1_bias", "wo_bias"):
        if kw.get(name) is not None:
            d[name] = t(kw[name])
    if kw.get("shared_experts") is not None:
        d["s0"], d["s1"], d["so"] = (t(a.T) for a in kw["shared_experts"])
    return d


def torch_layer(torch, kw: dict, a: dict):
    """HF's sparse MoE block: router, then a loop over the experts that received tokens."""
    F = torch.nn.functional
    act, limit = kw.get("activation", "silu"), kw.get("swiglu_limit", 7.0)
    E, k, x = a["rw"].shape[0], kw["top_k"], a["x"]
    logits = F.linear(x, a["rw"], a.get("router_bias"))
    sigmoid = kw.get("score_func", "softmax") == "sigmoid"
    scores = logits.sigmoid() if sigmoid else F.softmax(logits, dim=1, dtype=x.dtype)
    if kw.get("n_groups") or "selection_bias" in a:
        # DeepseekV3TopkRouter.get_topk_indices (masking with -inf rather than 0)
        with torch.no_grad():
            choice = scores.detach() + (a["selection_bias"] if "selection_bias" in a else 0)
            if kw.get("n_groups"):
                G = kw["n_groups"]
                group_scores = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
                group_idx = torch.topk(group_scores, k=kw["topk_groups"], dim=-1, sorted=False)[1]
                group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
                score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
                choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
            selected = torch.topk(choice, k=k, dim=-1, sorted=False)[1]
    else:
        selected = torch.topk(scores.detach(), k, dim=-1)[1]
    weights = scores.gather(1, selected)
    if kw.get("norm_topk_prob"):
        weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if sigmoid else 0.0))
    weights = weights * kw.get("routed_scaling_factor", 1.0)

    def expert_mlp(h, w0, w1, wo, b0=None, b1=None, bo=None):
        g, u = F.linear(h, w0, b0), F.linear(h, w1, b1)
        if act == "silu":
            z = F.silu(g) * u
        else:
            g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
            z = g * torch.sigmoid(g * 1.702) * (u + 1)
        return F.linear(z, wo, bo)

    final = torch.zeros_like(x)
    with torch.no_grad():
        expert_mask = F.one_hot(selected, num_classes=E).permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for (e,) in expert_hit.tolist():
        idx, top_x = torch.where(expert_mask[e])
        biases = [a[b][e] if b in a else None for b in ("w0_bias", "w1_bias", "wo_bias")]
        y = expert_mlp(x[top_x], a["w0"][e], a["w1"][e], a["wo"][e], *biases)
        final.index_add_(0, top_x, y * weights[top_x, idx, None])
    if "s0" in a:
        final = final + expert_mlp(x, a["s0"], a["s1"], a["so"])
    return final


def torch_fn(torch, inputs: dict, backward: bool):
    kw, a = inputs["options"], _torch_tensors(torch, inputs)
    if not backward:
        def fwd():
            with torch.inference_mode():
                return {"out": torch_layer(torch, kw, a).numpy()}
        return fwd

    def fwd_bwd():
        params = {key: a[key].detach().requires_grad_(True) for _, key, _ in TORCH_LEAVES if key in a}
        out = torch_layer(torch, kw, dict(a, **params))
        out.backward(a["ct"])
        grads = {name: (params[key].grad.transpose(-1, -2) if transposed else params[key].grad).numpy()
                 for name, key, transposed in TORCH_LEAVES if key in params}
        return dict(grads, out=out.detach().numpy())

    return fwd_bwd


# ----------------------------------------------------------------------------------------------
# jax


def _jax_layer(jax, kw: dict, E: int):
    """A jax.jit-able layer(x, rw, w0, w1, wo, extras) on jax.lax.ragged_dot."""
    jnp = jax.numpy
    k, act, limit = kw["top_k"], kw.get("activation", "silu"), kw.get("swiglu_limit", 7.0)
    sigmoid = kw.get("score_func", "softmax") == "sigmoid"

    def gated(g, u):
        if act == "silu":
            return jax.nn.silu(g) * u
        g, u = jnp.minimum(g, limit), jnp.clip(u, -limit, limit)
        return g * jax.nn.sigmoid(1.702 * g) * (u + 1)

    def layer(x, rw, w0, w1, wo, ex):
        T = x.shape[0]
        logits = x @ rw + ex.get("router_bias", 0.0)
        scores = jax.nn.sigmoid(logits) if sigmoid else jax.nn.softmax(logits, axis=-1)
        sel = jax.lax.stop_gradient(scores) + ex.get("selection_bias", 0.0)
        if kw.get("n_groups"):
            G = kw["n_groups"]
            gscore = jax.lax.top_k(sel.reshape(T, G, E // G), 2)[0].sum(-1)
            _, keep = jax.lax.top_k(gscore, kw["topk_groups"])
            mask = jnp.zeros((T, G), bool).at[jnp.arange(T)[:, None], keep].set(True)
            sel = jnp.where(jnp.repeat(mask, E // G, axis=1), sel, -jnp.inf)
        _, idx = jax.lax.top_k(sel, k)  # ties: lower index first
        w = jnp.take_along_axis(scores, idx, axis=1)
        if kw.get("norm_topk_prob"):
            w = w / (w.sum(-1, keepdims=True) + (1e-20 if sigmoid else 0.0))
        w = w * kw.get("routed_scaling_factor", 1.0)
        flat = idx.reshape(-1)
        order = jnp.argsort(flat, stable=True)
        tok, expert = order // k, flat[order]
        gs = jnp.bincount(flat, length=E).astype(jnp.int32)
        xs = x[tok]
        h0 = jax.lax.ragged_dot(xs, w0, gs)
        h1 = jax.lax.ragged_dot(xs, w1, gs)
        if "w0_bias" in ex:
            h0, h1 = h0 + ex["w0_bias"][expert], h1 + ex["w1_bias"][expert]
        y = jax.lax.ragged_dot(gated(h0, h1), wo, gs)
        if "wo_bias" in ex:
            y = y + ex["wo_bias"][expert]
        out = jnp.zeros_like(x).at[tok].add(y * w.reshape(-1)[order][:, None])
        if "shared_experts" in ex:
            s0, s1, so = ex["shared_experts"]
            out = out + gated(x @ s0, x @ s1) @ so
        return out

    return layer


def jax_fn(jax, inputs: dict, backward: bool):
    jnp, kw = jax.numpy, inputs["options"]
    ex = {n: jnp.asarray(kw[n]) for n in ("router_bias", "selection_bias", "w0_bias", "w1_bias", "wo_bias")
          if kw.get(n) is not None}
    if kw.get("shared_experts") is not None:
        ex["shared_experts"] = tuple(jnp.asarray(a) for a in kw["shared_experts"])
    args = [jnp.asarray(inputs[n]) for n in MAIN_GRADS]
    layer = _jax_layer(jax, kw, inputs["w0"].shape[0])
    if not backward:
        fn = jax.jit(layer)
        return lambda: {"out": fn(*args, ex)}

    def fwd_bwd(x, rw, w0, w1, wo, ex, ct):
        out, vjp_fn = jax.vjp(lambda *a: layer(*a, ex), x, rw, w0, w1, wo)
        return dict(zip(MAIN_GRADS, vjp_fn(ct)), out=out)

    fn, ct = jax.jit(fwd_bwd), jnp.asarray(inputs["ct"])
    return lambda: fn(*args, ex, ct)


# ----------------------------------------------------------------------------------------------
# Hugging Face transformers: the library's own sparse-MoE blocks

#: transformers' experts implementations timed (config._experts_implementation): its plain
#: per-expert loop, and torch._grouped_mm (float32/bfloat16/float16 only)
HF_IMPLEMENTATIONS = ("eager", "grouped_mm")


class HFUnsupported(Exception):
    """No transformers MoE block computes this spec's layer (the reason is the message)."""


def _hf_family(kw: dict, f: int, shared_width: int) -> str:
    """The transformers block that computes moe_block with options ``kw``:
    sigmoid + groups -> DeepSeek-V3; gpt-oss's clipped SwiGLU -> gpt-oss; softmax + SiLU ->
    Mixtral (renormalised top-k) or Qwen3-MoE (not renormalised)."""
    act, score = kw.get("activation", "silu"), kw.get("score_func", "softmax")
    has = {n for n in ("router_bias", "selection_bias", "w0_bias", "w1_bias", "wo_bias") if kw.get(n) is not None}
    if score == "sigmoid":
        if act != "silu" or has - {"selection_bias"} or not kw.get("n_groups"):
            raise HFUnsupported("sigmoid routing: DeepSeek-V3's block needs SiLU, groups and no biases")
        if shared_width % f:
            raise HFUnsupported(f"DeepSeek-V3's shared experts are n x f wide; got {shared_width} for f={f}")
        return "deepseek_v3"
    if kw.get("shared_experts") is not None or kw.get("n_groups") or kw.get("routed_scaling_factor", 1.0) != 1.0:
        raise HFUnsupported("softmax routing with shared experts, groups or scaling has no transformers block")
    if act == "swiglu_oai":
        if not kw.get("norm_topk_prob") or "selection_bias" in has:
            raise HFUnsupported("gpt-oss's block takes the softmax of the top-k logits (renormalised)")
        return "gpt_oss"
    if act != "silu" or has:
        raise HFUnsupported(f"activation {act!r} with biases {sorted(has)}: no transformers block")
    return "mixtral" if kw.get("norm_topk_prob") else "qwen3_moe"


def hf_block(torch, inputs: dict, implementation: str):
    """``(block, family)``: transformers' block computing the spec's layer with its weights,
    in eval mode, in x's dtype, its experts run by ``implementation``."""
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
    dtype = torch.float64 if x.dtype == np.float64 else torch.float32
    block = cls(cfg).to(dtype).eval()

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


def float64_routing(torch):
    """A torch function mode (a context manager) in which transformers' float32 routing runs
    in float64; the one copy, used by this benchmark and by tests/test_hf_conformance.py.

    transformers casts the router's logits or scores to float32 (``.float()``,
    ``softmax(..., dtype=torch.float)``, ``.type(torch.float32)``, ``.to(torch.float32)``)
    even in a float64 model. While the mode is active, ``Tensor.float()`` of a float64 tensor
    returns it unchanged, and ``torch.float32`` given to any torch function (positionally or
    as ``dtype=``) means ``torch.float64``. Nothing else changes, and in a float64 block
    nothing but the routing asks for float32, so the block computes in float64 throughout.

    ``torch`` is passed in so that importing this module does not import torch."""
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


def hf_fn(torch, inputs: dict, backward: bool, implementation: str):
    """transformers' block on the spec (see hf_block); forward under torch.inference_mode,
    forward + backward by autograd. A float64 spec runs with float64 routing
    (float64_routing), without which it is off by float32 rounding."""
    import contextlib

    block, family = hf_block(torch, inputs, implementation)
    x = torch.from_numpy(inputs["x"])[None]            # [1, T, d]: the blocks take [batch, seq, d]
    f64 = inputs["x"].dtype == np.float64

    def run(xt):
        out = block(xt)
        return out[0] if isinstance(out, tuple) else out  # gpt-oss: (out, router scores)

    def routing():
        return float64_routing(torch) if f64 else contextlib.nullcontext()

    if not backward:
        def fwd():
            with torch.inference_mode(), routing():
                return {"out": run(x)[0].numpy()}
        return fwd

    ct = torch.from_numpy(inputs["ct"])[None]

    def fwd_bwd():
        block.zero_grad(set_to_none=True)
        xt = x.detach().requires_grad_(True)
        with routing():
            out = run(xt)
            out.backward(ct)
        return dict(_hf_grads(block, family, xt.grad[0].numpy()), out=out.detach()[0].numpy())

    return fwd_bwd

"""The MoE layer of raggeddot.moe_block computed other ways from the inputs of an MoE spec:
``{"out": ...}``, with the backward also the gradients as moe_block_vjp names them. numpy: a
stable argsort of the assignments by expert, one np.matmul per expert and projection, a weighted
combine, its backward the same loops (the oracle of the timed runs); torch: transformers' eager
expert loop (torch_fn).
"""
from __future__ import annotations

import itertools

import numpy as np

MAIN_GRADS = ("x", "router_weights", "w0", "w1", "wo")


class Unsupported(Exception):
    """The baseline does not compute this spec's layer (the reason is the message)."""


def flat_grads(grads: dict) -> dict:
    """{name: array}, shared_experts expanded to shared_experts[i], None entries dropped."""
    out = {k: v for k, v in grads.items() if k != "shared_experts" and v is not None}
    return dict(out, **{f"shared_experts[{i}]": a for i, a in enumerate(grads.get("shared_experts") or ())})


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
    h0, h1, y = (np.empty(shape, dtype=x.dtype) for shape in ((N, f), (N, f), (N, d)))

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
    """Gradients of sum(out * ct) with the expert choice held fixed, per-expert loops (None for
    the biases the layer lacks)."""
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
    rb = dlogits.sum(axis=0) if kw.get("router_bias") is not None else None
    g.update(x=dx, w0=dw0, w1=dw1, wo=dwo, router_bias=rb, w0_bias=db0, w1_bias=db1, wo_bias=dbo)
    return g


def numpy_fn(inputs: dict, backward: bool):
    if not backward:
        return lambda: {"out": np_forward(inputs)[0]}

    def fwd_bwd():
        out, r = np_forward(inputs, save=True)
        return dict(flat_grads(np_backward(inputs, r, inputs["ct"])), out=out)

    return fwd_bwd


def torch_fn(torch, i32: dict, backward: bool, dtype: str):
    """transformers' eager experts' layer (Mixtral, Qwen3-MoE: softmax routing, SiLU experts;
    others are Unsupported): the router in float32 on the float32 inputs ``i32`` (as raggeddot's
    moe_block: a 16-bit router picks other experts for near-tied tokens), per expert with tokens
    F.linear on [out, in] weights in ``dtype``, the SiLU gate, the weighted combine accumulated
    in float32 (index_add_). The backward (float32) by autograd."""
    kw = i32["options"]
    other = sorted(k for k, v in kw.items() if k not in ("top_k", "norm_topk_prob") and v is not None)
    if other:
        raise Unsupported(f"the torch expert loop has no {', '.join(other)}")
    F, dt = torch.nn.functional, getattr(torch, dtype)
    # (a list of x: the forward takes them in turn, as the decode benchmark's steps do)
    x32s = [torch.from_numpy(a) for a in (i32["x"] if isinstance(i32["x"], list) else [i32["x"]])]
    x32, next_x = x32s[0], itertools.cycle(x32s).__next__
    rw, ct = (torch.from_numpy(i32[n]) for n in ("router_weights", "ct"))
    ws = [torch.from_numpy(np.ascontiguousarray(i32[n].transpose(0, 2, 1))).to(dt) for n in MAIN_GRADS[2:]]

    def layer(x, rw, w0, w1, wo):
        w, idx = torch.topk(F.softmax(x @ rw, dim=1), kw["top_k"], dim=1)
        w = w / w.sum(dim=1, keepdim=True) if kw.get("norm_topk_prob") else w
        out, xh = torch.zeros(x.shape, dtype=x.dtype), x.to(dt)
        for e in torch.unique(idx).tolist():
            tok, slot = torch.where(idx == e)
            y = F.linear(F.silu(F.linear(xh[tok], w0[e])) * F.linear(xh[tok], w1[e]), wo[e])
            out.index_add_(0, tok, y.to(x.dtype) * w[tok, slot, None])
        return out.to(dt)

    def fwd():
        with torch.inference_mode():
            return {"out": layer(next_x(), rw, *ws)}

    def fwd_bwd():
        leaves = [a.detach().requires_grad_(True) for a in (x32, rw, *ws)]
        out = layer(*leaves)
        out.backward(ct)
        grads = [a.grad if i < 2 else a.grad.transpose(1, 2) for i, a in enumerate(leaves)]
        return dict(zip(MAIN_GRADS, grads), out=out.detach())

    return fwd_bwd if backward else fwd

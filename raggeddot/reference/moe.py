"""The Mixture-of-Experts layer and its gathers in plain NumPy (the oracle).

``moe_block`` states the math of :func:`raggeddot.moe_block` as directly as
possible, written independently of the C code: per token it computes the
scores, picks the expert groups and the top-k experts with a stable argsort
(ties go to the lower index), then loops over the experts, one matmul each,
and adds every kept assignment's weighted output to its token. It imports only
NumPy and math. Arithmetic is in float64 (the result is cast to the promoted
dtype of the inputs once, at the end); speed is not a goal.

The layer::

    logits    = x @ router_weights (+ router_bias)                        [T, E]
    scores    = softmax(logits) | sigmoid(logits)
    selection = scores (+ selection_bias)        # steers the choice only
    n_groups/topk_groups: keep the topk_groups groups whose two best selection
              values sum highest (ties to the lower group), the rest -> -inf
    chosen    = the top_k experts by selection (ties to the lower index)
    weights   = scores[chosen] (/ (sum + 1e-20 for sigmoid) if norm_topk_prob)
                * routed_scaling_factor
    capacity  = ceil(T * top_k / E * capacity_factor) assignments per expert,
                first come first served in token order (None: no limit)
    out[t]    = sum over kept (t, e): weight * FFN_e(x[t])      (router_weights_on="output")
              | sum over kept (t, e): FFN_e(weight * x[t])      (router_weights_on="input")
                (+ the shared experts' gated MLP of x[t], times
                 sigmoid(x[t] @ shared_expert_gate) when given)
    FFN_e(z)  = (act(z @ w0[e] + b0[e]) * (z @ w1[e] + b1[e])) @ wo[e] + bo[e]

Fused gate/up weights (w1=None) are split into two arrays first: along
their 2f axis, halves ("concat") or even/odd entries ("interleaved").
"""
import math

import numpy as np

__all__ = ["moe_block", "ragged_gather", "ragged_gather_reduce"]


# ------------------------------------------------------------------ gathers

def ragged_gather(x, indices, weights=None):
    """``out[i] = x[indices[i]] * weights[i]`` (weights default 1); x's dtype."""
    x = np.asarray(x)
    w = np.ones(len(indices)) if weights is None else np.asarray(weights, dtype=np.float64)
    return (x.astype(np.float64)[np.asarray(indices, dtype=np.int64)] * w[:, None]).astype(x.dtype)


def ragged_gather_reduce(y, indices, weights=None):
    """``out[t] = sum_j weights[t, j] * y[indices[t, j]]`` over indices >= 0; y's dtype."""
    y, idx = np.asarray(y), np.asarray(indices, dtype=np.int64)
    w = np.ones(idx.shape) if weights is None else np.asarray(weights, dtype=np.float64)
    rows = np.concatenate([y.astype(np.float64), np.zeros((1, y.shape[1]))])[np.where(idx < 0, -1, idx)]
    return np.einsum("tk,tkd->td", np.where(idx < 0, 0.0, w), rows).astype(y.dtype)


# -------------------------------------------------------------- elementwise

def _sigmoid(z):
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


_erf = np.frompyfunc(math.erf, 1, 1)


def _gated(gate, up, activation, limit, alpha=1.702):
    """act(gate) * up, or gpt-oss's clipped swiglu."""
    if activation == "silu":
        return gate * _sigmoid(gate) * up
    if activation == "gelu":
        return 0.5 * gate * (1.0 + _erf(gate / math.sqrt(2.0)).astype(np.float64)) * up
    if activation == "gelu_tanh":
        return 0.5 * gate * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (gate + 0.044715 * gate**3))) * up
    if activation == "relu":
        return np.maximum(gate, 0.0) * up
    if activation == "swiglu_oai":
        g = np.minimum(gate, limit)
        u = np.clip(up, -limit, limit)
        return g * _sigmoid(alpha * g) * (u + 1.0)
    raise ValueError(f"moe_block: unknown 'activation' {activation!r}")


# ------------------------------------------------------------------ routing

def _route_token(logits, score_func, selection_bias, n_groups, topk_groups, top_k,
                 norm_topk_prob, scale):
    """(scores [E], chosen experts [top_k], their weights [top_k]) of one token."""
    E = logits.shape[0]
    if score_func == "softmax":
        scores = _softmax(logits)
    elif score_func == "sigmoid":
        scores = _sigmoid(logits)
    else:
        raise ValueError(f"moe_block: 'score_func' must be 'softmax' or 'sigmoid', got {score_func!r}")
    selection = scores.copy() if selection_bias is None else scores + selection_bias
    if n_groups is not None:
        size = E // n_groups
        groups = selection.reshape(n_groups, size)
        group_score = np.array([np.sort(g)[::-1][:2].sum() for g in groups])
        kept_groups = np.argsort(-group_score, kind="stable")[:topk_groups]
        mask = np.full(n_groups, True)
        mask[kept_groups] = False
        selection = selection.copy()
        selection.reshape(n_groups, size)[mask] = -np.inf
    chosen = np.argsort(-selection, kind="stable")[:top_k]
    weights = scores[chosen]
    if norm_topk_prob:
        weights = weights / (weights.sum() + (1e-20 if score_func == "sigmoid" else 0.0))
    return scores, chosen, weights * scale


def _unfuse(fused, axis, gate_up):
    """(gate, up) of a fused array along ``axis`` (size 2f), copies."""
    n = fused.shape[axis]
    if n % 2:
        raise ValueError(f"moe_block: fused gate/up axis must have an even size, got {n}")
    if gate_up == "concat":
        idx0, idx1 = np.arange(n // 2), np.arange(n // 2, n)
    elif gate_up == "interleaved":
        idx0, idx1 = np.arange(0, n, 2), np.arange(1, n, 2)
    else:
        raise ValueError(f"moe_block: 'gate_up' must be 'concat' or 'interleaved', got {gate_up!r}")
    return np.take(fused, idx0, axis=axis), np.take(fused, idx1, axis=axis)


def _expert_weights(w0, w1, wo, d, E, layout):
    """w0, w1 as [E, d, f] and wo as [E, f, d], whatever the stored layout."""
    if layout not in ("edf", "efd"):
        raise ValueError(f"moe_block: 'weights_layout' must be 'edf' or 'efd', got {layout!r}")
    for name, a in (("w0", w0), ("w1", w1), ("wo", wo)):
        if a.ndim != 3:
            raise ValueError(f"moe_block: expected 3-D '{name}', got shape {a.shape}")
    if layout == "efd":
        w0, w1, wo = w0.transpose(0, 2, 1), w1.transpose(0, 2, 1), wo.transpose(0, 2, 1)
    f = w0.shape[2]
    for name, a, want in (("w0", w0, (E, d, f)), ("w1", w1, (E, d, f)), ("wo", wo, (E, f, d))):
        if a.shape != want:
            raise ValueError(f"moe_block: '{name}' does not fit weights_layout={layout!r}: "
                             f"got {a.shape} in [E, d, f]/[E, f, d] order, expected {want}")
    return w0, w1, wo


# ------------------------------------------------------------------ the layer

def moe_block(x, router_weights, w0, w1, wo, *, top_k, score_func="softmax", router_bias=None,
              selection_bias=None, n_groups=None, topk_groups=None, norm_topk_prob=False,
              routed_scaling_factor=1.0, activation="silu", w0_bias=None, w1_bias=None, wo_bias=None,
              shared_experts=None, capacity_factor=None, weights_layout="edf", return_aux=False,
              swiglu_limit=7.0, swiglu_alpha=1.702, shared_expert_gate=None, router_weights_on="output",
              gate_up="concat", load_balance="switch"):
    """The MoE layer of :func:`raggeddot.moe_block`, same arguments and results."""
    arrays = [np.asarray(a) for a in (x, router_weights, w0, w1, wo) if a is not None]
    out_dtype = np.result_type(*arrays)
    if w1 is None:   # fused gate/up: split along the 2f axis
        fused = np.asarray(w0, dtype=np.float64)
        w0, w1 = _unfuse(fused, 2 if weights_layout == "edf" else 1, gate_up)
        if w1_bias is not None:
            raise ValueError("moe_block: 'w1_bias' must be None with fused weights")
        if w0_bias is not None:
            w0_bias, w1_bias = _unfuse(np.asarray(w0_bias, dtype=np.float64), 1, gate_up)
    x, rw, w0, w1, wo = (np.asarray(a).astype(np.float64) for a in (x, router_weights, w0, w1, wo))
    if router_weights_on not in ("output", "input"):
        raise ValueError(f"moe_block: 'router_weights_on' must be 'output' or 'input', got {router_weights_on!r}")
    if load_balance not in ("switch", "hf", "maxtext"):
        raise ValueError(f"moe_block: 'load_balance' must be 'switch', 'hf' or 'maxtext', got {load_balance!r}")
    lead, d = x.shape[:-1], x.shape[-1]
    xt = x.reshape(-1, d)
    T, E = xt.shape[0], rw.shape[1]
    if rw.shape[0] != d:
        raise ValueError(f"moe_block: 'router_weights' has d={rw.shape[0]}, 'x' has d={d}")
    if not 1 <= top_k <= E:
        raise ValueError(f"moe_block: 'top_k' must be in [1, {E}], got {top_k}")
    if n_groups is None and topk_groups is not None:
        raise ValueError("moe_block: 'topk_groups' needs 'n_groups'")
    if n_groups is not None:
        if n_groups < 1 or E % n_groups:
            raise ValueError(f"moe_block: 'n_groups'={n_groups} must divide E={E}")
        topk_groups = n_groups if topk_groups is None else topk_groups
        if not 1 <= topk_groups <= n_groups:
            raise ValueError(f"moe_block: 'topk_groups'={topk_groups} not in [1, {n_groups}]")
        if topk_groups * (E // n_groups) < top_k:
            raise ValueError(f"moe_block: 'top_k'={top_k} exceeds the experts of the kept groups")
    w0, w1, wo = _expert_weights(w0, w1, wo, d, E, weights_layout)
    f64 = lambda a: None if a is None else np.asarray(a, dtype=np.float64)  # noqa: E731
    b0, b1, bo = f64(w0_bias), f64(w1_bias), f64(wo_bias)
    sel_bias = f64(selection_bias)

    # 1. routing, token by token
    logits = xt @ rw
    if router_bias is not None:
        logits = logits + f64(router_bias)
    scores = np.zeros((T, E))
    chosen = np.zeros((T, top_k), dtype=np.int64)
    weights = np.zeros((T, top_k))
    for t in range(T):
        scores[t], chosen[t], weights[t] = _route_token(
            logits[t], score_func, sel_bias, n_groups, topk_groups, top_k, norm_topk_prob,
            float(routed_scaling_factor))

    # 2. capacity: each expert takes assignments in token order until it is full
    capacity = math.inf if capacity_factor is None else math.ceil(T * top_k / E * capacity_factor)
    load = np.zeros(E, dtype=np.int64)
    kept = np.zeros((T, top_k), dtype=bool)
    for t in range(T):
        for j in range(top_k):
            e = chosen[t, j]
            if load[e] < capacity:
                load[e] += 1
                kept[t, j] = True

    # 3. the experts, one matmul each over the tokens they kept
    out = np.zeros((T, d))
    for e in range(E):
        tokens, slots = np.nonzero((chosen == e) & kept)
        if tokens.size == 0:
            continue
        on_input = router_weights_on == "input"
        xe = xt[tokens] * (weights[tokens, slots][:, None] if on_input else 1.0)
        gate = xe @ w0[e] + (0.0 if b0 is None else b0[e])
        up = xe @ w1[e] + (0.0 if b1 is None else b1[e])
        y = _gated(gate, up, activation, swiglu_limit, swiglu_alpha) @ wo[e] + (0.0 if bo is None else bo[e])
        for r, (t, j) in enumerate(zip(tokens, slots)):
            out[t] += y[r] if on_input else weights[t, j] * y[r]

    # 4. the shared experts, on every token (gated per token when asked)
    if shared_expert_gate is not None and shared_experts is None:
        raise ValueError("moe_block: 'shared_expert_gate' needs 'shared_experts'")
    if shared_experts is not None:
        s0, s1, so = (f64(a) for a in shared_experts)
        mlp = _gated(xt @ s0, xt @ s1, activation, swiglu_limit, swiglu_alpha) @ so
        if shared_expert_gate is not None:
            mlp = mlp * _sigmoid(xt @ f64(shared_expert_gate).reshape(d, 1))
        out += mlp

    out = out.reshape(lead + (d,)).astype(out_dtype)
    if not return_aux:
        return out

    # 5. statistics: load-balancing loss, z-loss and DeepSeek's bias update direction
    assigned = np.bincount(chosen.ravel(), minlength=E).astype(np.float64)
    probs = np.array([_softmax(row) for row in logits]) if T else np.zeros((0, E))
    aux = {
        "topk_indices": chosen.reshape(lead + (top_k,)),
        "topk_weights": weights.reshape(lead + (top_k,)).astype(out_dtype),
        "group_sizes": _kept_load(chosen, kept, E),
        "load_balance_loss": _balance_loss(load_balance, chosen, probs, E, top_k, x.shape),
        "router_z_loss": float(np.mean([_logsumexp(row) ** 2 for row in logits])) if T else 0.0,
        "router_logits": logits.reshape(lead + (E,)).astype(out_dtype),
        "bias_updates": np.sign(assigned.mean() - assigned),
        "dropped": int(np.sum(~kept)),
    }
    aux["slot_of"], aux["token_of_slot"] = _dispatch_order(chosen, kept, E)
    aux["slot_of"] = aux["slot_of"].reshape(lead + (top_k,))
    return out, aux


def _dispatch_order(chosen, kept, E):
    """``(slot_of [T, k], token_of_slot [N])`` of the kept assignments sorted
    by expert, in token order within an expert (then by j): slot_of[t, j] is
    the sorted position of assignment (t, j), -1 when dropped."""
    T, k = chosen.shape
    slot_of = np.full((T, k), -1, dtype=np.int64)
    token_of_slot = []
    for e in range(E):
        for t in range(T):
            for j in range(k):
                if chosen[t, j] == e and kept[t, j]:
                    slot_of[t, j] = len(token_of_slot)
                    token_of_slot.append(t)
    return slot_of, np.array(token_of_slot, dtype=np.int64)


def _logsumexp(row):
    m = row.max()
    return m + math.log(np.exp(row - m).sum())


def _balance_loss(convention, chosen, probs, E, top_k, x_shape):
    """E * sum_e (assignments to e / norm) * (mean probability of e), over
    all tokens ("switch": norm = T * top_k; "hf": norm = T) or per sequence
    of x [..., S, d] and averaged over the sequences ("maxtext", norm = S)."""
    T = chosen.shape[0]
    if T == 0:
        return 0.0
    if convention == "maxtext":
        S = x_shape[-2] if len(x_shape) >= 3 else T
        if S == 0:
            return 0.0
        losses = []
        for b in range(T // S):
            rows = slice(b * S, (b + 1) * S)
            counts = np.bincount(chosen[rows].ravel(), minlength=E)
            losses.append(E * np.sum(counts / S * probs[rows].mean(axis=0)))
        return float(np.mean(losses))
    counts = np.bincount(chosen.ravel(), minlength=E)
    norm = T * top_k if convention == "switch" else T
    return float(E * np.sum(counts / norm * probs.mean(axis=0)))


def _kept_load(chosen, kept, E):
    """Rows of each expert after capacity dropping (the grouped matmuls' group_sizes)."""
    return np.bincount(chosen[kept], minlength=E).astype(np.int64)

"""moe_block: a whole Mixture-of-Experts layer, forward and backward, on the C kernels.

The layer (MaxText's sparse path)::

    logits  = x @ router_weights (+ router_bias)                   [T, E]
    scores  = softmax(logits) | sigmoid(logits)
    choose  = top_k experts per token by scores (+ selection_bias), optionally
              restricted to the topk_groups best of n_groups expert groups
    weights = scores at the chosen experts (/ their sum if norm_topk_prob) * routed_scaling_factor
    sort    = the T*top_k assignments counted by expert (stable, token order)
    xs      = ragged_gather(x, token of each sorted slot)             [N, d]
    h       = act(xs @ w0[e] + b0[e]) * (xs @ w1[e] + b1[e])          [N, f]
    y       = h @ wo[e] + bo[e]                                       [N, d]
    out[t]  = sum_j weights[t, j] * y[slot of (t, j)]  (+ shared experts)

All of it runs in C (routing, counting sort, gathers, activations, the three
grouped matmuls) with no Python loop over tokens or experts.
"""
import inspect
import math

import numpy as np

from . import _autodiff
from . import _gateway as gw
from . import _validate as v

__all__ = ["moe_block", "moe_block_vjp", "ragged_gather", "ragged_gather_reduce"]



# --------------------------------------------------------------------- gathers

def _gather_indices(indices, ndim, shape_doc, lo, hi, fn):
    """The index argument of the gathers: integers in [lo, hi), as int64."""
    idx = v.as_array(indices, "indices", fn, ndim=ndim, shape_doc=shape_doc)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{fn}: 'indices' must be integers, got {idx.dtype}")
    if idx.size and (idx.min() < lo or idx.max() >= hi):
        raise ValueError(f"{fn}: 'indices' must lie in [{lo}, {hi}), got values in "
                         f"[{idx.min()}, {idx.max()}]")
    return np.ascontiguousarray(idx, dtype=np.int64)


def _gather_weights(weights, idx, shape_doc, dtype, fn):
    """The optional weights of the gathers: floats shaped like the indices."""
    if weights is None:
        return None
    w = v.as_array(weights, "weights", fn, ndim=idx.ndim, shape_doc=shape_doc)
    v.float_dtype(w, "weights", fn)
    if w.shape != idx.shape:
        raise ValueError(f"{fn}: 'weights' must have shape {idx.shape}, got {w.shape}")
    return np.ascontiguousarray(w, dtype=dtype)


def ragged_gather(x, indices, weights=None):
    """Dispatch: ``out[i] = x[indices[i]]`` (times ``weights[i]`` when given).

    In an MoE layer ``indices[i]`` is the token of sorted slot i, so this fans
    ``x [T, d]`` out to ``[N, d]`` (N = T * top_k), each expert's rows together.

    Args:
      x: ``[T, d]`` float array.
      indices: ``[N]`` integers in ``[0, T)``.
      weights: optional ``[N]`` scale per output row.
    Returns:
      ``[N, d]`` in x's dtype (float16/bfloat16 computed in float32).
    """
    fn = "ragged_gather"
    x = v.as_array(x, "x", fn, ndim=2, shape_doc=" [T, d]")
    ct = gw.compute_dtype(v.float_dtype(x, "x", fn))
    idx = _gather_indices(indices, 1, " [N]", 0, x.shape[0], fn)
    scale = _gather_weights(weights, idx, " [N]", ct, fn)
    out = gw.gather_rows(x, idx, scale)
    return out if out.dtype == x.dtype else out.astype(x.dtype)


def ragged_gather_reduce(y, indices, weights=None):
    """Combine: ``out[t] = sum_j weights[t, j] * y[indices[t, j]]``, j = 0..k-1 in order.

    In an MoE layer ``indices[t, j]`` is the sorted slot of token t's j-th
    expert, so this brings ``y [N, d]`` back to ``[T, d]`` weighted by the
    router. An index of -1 (a dropped assignment) contributes nothing. The k
    terms are always added in the same order, so results do not depend on the
    thread count.

    Args:
      y: ``[N, d]`` float array.
      indices: ``[T, k]`` integers in ``[-1, N)``.
      weights: optional ``[T, k]`` (default 1).
    Returns:
      ``[T, d]`` in y's dtype.
    """
    fn = "ragged_gather_reduce"
    y = v.as_array(y, "y", fn, ndim=2, shape_doc=" [N, d]")
    ct = gw.compute_dtype(v.float_dtype(y, "y", fn))
    idx = _gather_indices(indices, 2, " [T, k]", -1, y.shape[0], fn)
    w = _gather_weights(weights, idx, " [T, k]", ct, fn)
    out = gw.gather_reduce(y, idx, w)
    return out if out.dtype == y.dtype else out.astype(y.dtype)


# ------------------------------------------------------------------ validation

class _Config:
    """The checked arguments of one moe_block call, as the kernels want them."""


def _check_weight(arr, name, shape, axes_doc, fn, layout):
    if arr.ndim != 3:
        raise ValueError(f"{fn}: expected 3-D '{name}' {axes_doc} (weights_layout={layout!r}), "
                         f"got shape {arr.shape}")
    for axis, (got, want, label) in enumerate(zip(arr.shape, shape, axes_doc.strip("[]").split(", "))):
        if got != want:
            raise ValueError(f"{fn}: '{name}' {axes_doc} (weights_layout={layout!r}) has {label}={got} "
                             f"on axis {axis}, expected {want}; got shape {arr.shape}")


def _prepare(x, router_weights, w0, w1, wo, top_k, score_func, router_bias, selection_bias,
             n_groups, topk_groups, norm_topk_prob, routed_scaling_factor, activation, w0_bias,
             w1_bias, wo_bias, shared_experts, capacity_factor, weights_layout, swiglu_limit):
    fn = "moe_block"
    c = _Config()
    x = v.as_array(x, "x", fn)
    if x.ndim < 1:
        raise ValueError(f"{fn}: 'x' must have at least one dimension [..., d], got a scalar")
    rw = v.as_array(router_weights, "router_weights", fn, ndim=2, shape_doc=" [d, E]")
    d = x.shape[-1]
    if rw.shape[0] != d:
        raise ValueError(f"{fn}: 'router_weights' [d, E] has d={rw.shape[0]} but 'x' has d={d} "
                         f"(x.shape={x.shape})")
    E = rw.shape[1]
    if E < 1:
        raise ValueError(f"{fn}: 'router_weights' must have at least one expert, got shape {rw.shape}")
    w0, w1, wo = (v.as_array(a, name, fn) for a, name in ((w0, "w0"), (w1, "w1"), (wo, "wo")))
    if weights_layout not in ("edf", "efd"):
        raise ValueError(f"{fn}: 'weights_layout' must be 'edf' or 'efd', got {weights_layout!r}")
    if w0.ndim != 3:
        raise ValueError(f"{fn}: expected 3-D 'w0', got shape {w0.shape}")
    f = w0.shape[2] if weights_layout == "edf" else w0.shape[1]
    if weights_layout == "edf":
        _check_weight(w0, "w0", (E, d, f), "[E, d, f]", fn, weights_layout)
        _check_weight(w1, "w1", (E, d, f), "[E, d, f]", fn, weights_layout)
        _check_weight(wo, "wo", (E, f, d), "[E, f, d]", fn, weights_layout)
    else:
        _check_weight(w0, "w0", (E, f, d), "[E, f, d]", fn, weights_layout)
        _check_weight(w1, "w1", (E, f, d), "[E, f, d]", fn, weights_layout)
        _check_weight(wo, "wo", (E, d, f), "[E, d, f]", fn, weights_layout)

    dts = [v.float_dtype(a, n, fn) for a, n in ((x, "x"), (rw, "router_weights"), (w0, "w0"),
                                                 (w1, "w1"), (wo, "wo"))]
    out_dtype = dts[0]
    for dt in dts[1:]:
        out_dtype = np.result_type(out_dtype, dt) if not v.is_bfloat16(dt) else out_dtype
    ct = gw.compute_dtype(*dts)

    top_k = v.index(top_k, "top_k", fn)
    if not 1 <= top_k <= E:
        raise ValueError(f"{fn}: 'top_k' must be in [1, E={E}], got {top_k}")
    if score_func not in gw.SCORE_FUNCS:
        raise ValueError(f"{fn}: 'score_func' must be 'softmax' or 'sigmoid', got {score_func!r}")
    if activation not in gw.ACTIVATIONS:
        raise ValueError(f"{fn}: 'activation' must be one of {sorted(gw.ACTIVATIONS)}, got {activation!r}")
    if n_groups is None:
        if topk_groups is not None:
            raise ValueError(f"{fn}: 'topk_groups'={topk_groups} needs 'n_groups'")
        n_groups, topk_groups = 1, 1
    else:
        n_groups = v.index(n_groups, "n_groups", fn)
        if n_groups < 1 or E % n_groups:
            raise ValueError(f"{fn}: 'n_groups'={n_groups} must be positive and divide E={E}")
        topk_groups = n_groups if topk_groups is None else v.index(topk_groups, "topk_groups", fn)
        if not 1 <= topk_groups <= n_groups:
            raise ValueError(f"{fn}: 'topk_groups'={topk_groups} must be in [1, n_groups={n_groups}]")
        if topk_groups * (E // n_groups) < top_k:
            raise ValueError(f"{fn}: top_k={top_k} exceeds the {topk_groups * (E // n_groups)} experts "
                             f"in topk_groups={topk_groups} groups of {E // n_groups}")
    scale = float(routed_scaling_factor)
    if capacity_factor is not None:
        capacity_factor = float(capacity_factor)
        if not capacity_factor > 0:
            raise ValueError(f"{fn}: 'capacity_factor' must be positive or None, got {capacity_factor}")

    def vec(a, name, size):
        if a is None:
            return None
        a = v.as_array(a, name, fn, ndim=1, shape_doc=f" [{size}]")
        v.float_dtype(a, name, fn)
        if a.shape[0] != size:
            raise ValueError(f"{fn}: '{name}' must have shape ({size},), got {a.shape}")
        return np.ascontiguousarray(a, dtype=ct)

    def bias(a, name, size):
        if a is None:
            return None
        a = v.as_array(a, name, fn, ndim=2, shape_doc=f" [E, {size}]")
        v.float_dtype(a, name, fn)
        if a.shape != (E, size):
            raise ValueError(f"{fn}: '{name}' must have shape ({E}, {size}), got {a.shape}")
        return gw.operand(a, ct)

    c.router_bias = vec(router_bias, "router_bias", E)
    c.selection_bias = vec(selection_bias, "selection_bias", E)
    c.b0, c.b1, c.bo = bias(w0_bias, "w0_bias", f), bias(w1_bias, "w1_bias", f), bias(wo_bias, "wo_bias", d)

    c.shared = None
    if shared_experts is not None:
        try:
            s0, s1, so = shared_experts
        except (TypeError, ValueError):
            raise TypeError(f"{fn}: 'shared_experts' must be a tuple (w0 [d, fs], w1 [d, fs], wo [fs, d])") from None
        s0 = v.as_array(s0, "shared_experts[0]", fn, ndim=2, shape_doc=" [d, fs]")
        fs = s0.shape[1]
        s1 = v.as_array(s1, "shared_experts[1]", fn, ndim=2, shape_doc=" [d, fs]")
        so = v.as_array(so, "shared_experts[2]", fn, ndim=2, shape_doc=" [fs, d]")
        for a, name, want in ((s0, "shared_experts[0]", (d, fs)), (s1, "shared_experts[1]", (d, fs)),
                              (so, "shared_experts[2]", (fs, d))):
            v.float_dtype(a, name, fn)
            if a.shape != want:
                raise ValueError(f"{fn}: '{name}' must have shape {want}, got {a.shape}")
        c.shared = tuple(gw.operand(a, ct) for a in (s0, s1, so))

    c.x_shape, c.out_dtype, c.ct = x.shape, out_dtype, ct
    T = int(np.prod(x.shape[:-1], dtype=np.int64))
    c.xf = gw.operand(x.reshape(T, d), ct, gw.ROWS)
    c.rw = gw.operand(rw, ct)
    c.layout = weights_layout
    # [E, d, f] / [E, f, d] views for the kernels, whatever the stored layout
    if weights_layout == "edf":
        c.w0, c.w1, c.wo = gw.operand(w0, ct), gw.operand(w1, ct), gw.operand(wo, ct)
    else:
        c.w0 = gw.operand(w0, ct).transpose(0, 2, 1)
        c.w1 = gw.operand(w1, ct).transpose(0, 2, 1)
        c.wo = gw.operand(wo, ct).transpose(0, 2, 1)
    c.T, c.d, c.E, c.f, c.top_k = T, d, E, f, top_k
    c.score_func, c.n_groups, c.topk_groups = score_func, n_groups, topk_groups
    c.norm, c.scale = bool(norm_topk_prob), scale
    c.act, c.limit = activation, float(swiglu_limit)
    c.capacity = -1 if capacity_factor is None else int(math.ceil(T * top_k / E * capacity_factor))
    return c


# --------------------------------------------------------------------- forward

def _add_group_bias(h, bias, bounds):
    if bias is not None:
        for e in range(bias.shape[0]):
            if bounds[e + 1] > bounds[e]:
                h[bounds[e]:bounds[e + 1]] += bias[e]


def _forward(c, save):
    ct = c.ct
    logits = gw.matmul(c.xf, c.rw)
    if c.router_bias is not None:
        logits += c.router_bias
    scores, idx, w = gw.route(logits, c.score_func, c.selection_bias, c.n_groups,
                              c.topk_groups, c.top_k, c.norm, c.scale)
    slot_of, tok, gs = gw.sort_by_expert(idx, c.E, c.capacity)
    bounds = np.zeros(c.E + 1, dtype=np.int64)
    np.cumsum(gs, out=bounds[1:])
    N = int(bounds[-1])

    xs = gw.gather_rows(c.xf, tok, None)                       # dispatch  [N, d]
    h0 = gw.empty((N, c.f), ct)
    h1 = gw.empty((N, c.f), ct)
    if N and c.f:
        gw.rows(xs, c.w0, bounds, h0)
        gw.rows(xs, c.w1, bounds, h1)
    _add_group_bias(h0, c.b0, bounds)
    _add_group_bias(h1, c.b1, bounds)
    a = gw.gated_act(h0, h1, c.act, c.limit)
    y = np.zeros((N, c.d), dtype=ct)
    if N and c.f:
        gw.rows(a, c.wo, bounds, y)
    _add_group_bias(y, c.bo, bounds)
    out = gw.gather_reduce(y, slot_of, w)                      # combine  [T, d]

    hs = None
    if c.shared is not None:
        s0, s1, so = c.shared
        hs0, hs1 = gw.matmul(c.xf, s0), gw.matmul(c.xf, s1)
        as_ = gw.gated_act(hs0, hs1, c.act, c.limit)
        gw.matmul(as_, so, out=out, accumulate=True)
        hs = (hs0, hs1, as_)

    res = None
    if save:
        res = dict(logits=logits, scores=scores, idx=idx, w=w, slot_of=slot_of, tok=tok, gs=gs,
                   bounds=bounds, xs=xs, h0=h0, h1=h1, a=a, y=y, hs=hs)
    return out, (scores, idx, w, slot_of, gs, logits), res


def _aux(c, routing):
    scores, idx, w, slot_of, gs, logits = routing
    counts = np.bincount(idx.ravel(), minlength=c.E).astype(np.float64)
    frac = counts / max(1, c.T * c.top_k)
    if c.score_func == "softmax":
        probs = scores
    else:
        z = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(z)
        probs /= probs.sum(axis=1, keepdims=True)
    mean_prob = probs.mean(axis=0) if c.T else np.zeros(c.E)
    load_balance = float(c.E * np.sum(frac * mean_prob))
    bias_updates = np.sign(counts.mean() - counts)
    lead = c.x_shape[:-1]
    return {
        "topk_indices": idx.reshape(lead + (c.top_k,)),
        "topk_weights": w.reshape(lead + (c.top_k,)).astype(c.out_dtype, copy=False),
        "group_sizes": gs,
        "load_balance_loss": load_balance,
        "bias_updates": bias_updates,
        "dropped": int(np.sum(slot_of < 0)),
    }


def moe_block(x, router_weights, w0, w1, wo, *, top_k, score_func="softmax", router_bias=None,
              selection_bias=None, n_groups=None, topk_groups=None, norm_topk_prob=False,
              routed_scaling_factor=1.0, activation="silu", w0_bias=None, w1_bias=None, wo_bias=None,
              shared_experts=None, capacity_factor=None, weights_layout="edf", return_aux=False,
              swiglu_limit=7.0):
    """A Mixture-of-Experts layer (route, dispatch, gated expert FFNs, combine) in C.

    Args:
      x: ``[..., d]`` tokens (leading dims are flattened into T tokens).
      router_weights: ``[d, E]``.
      w0, w1: gate and up projections ``[E, d, f]`` (``[E, f, d]`` with
        ``weights_layout="efd"``, the PyTorch/HF layout, read without copies).
      wo: down projection ``[E, f, d]`` (``[E, d, f]`` with "efd").
      top_k: experts per token.
      score_func: "softmax" (Mixtral, Qwen3, gpt-oss) or "sigmoid" (DeepSeek-V3).
      router_bias: ``[E]`` added to the logits (gpt-oss).
      selection_bias: ``[E]`` added to the scores for choosing only (DeepSeek's
        aux-loss-free balancing); the weights stay the unbiased scores.
      n_groups, topk_groups: group-limited routing: experts form n_groups groups;
        only the topk_groups groups with the highest sum of their two best
        selection scores are eligible.
      norm_topk_prob: divide the chosen weights by their sum (+1e-20 for sigmoid).
      routed_scaling_factor: multiplies the weights.
      activation: "silu", "gelu", "gelu_tanh", "relu" (all ``act(x@w0) * (x@w1)``)
        or "swiglu_oai" (gpt-oss: ``g * sigmoid(1.702 g) * (u + 1)`` with
        ``g = min(x@w0, limit)``, ``u = clip(x@w1, -limit, limit)``, limit =
        ``swiglu_limit``).
      w0_bias, w1_bias: ``[E, f]``; wo_bias: ``[E, d]``; added after each matmul.
      shared_experts: ``(w0 [d, fs], w1 [d, fs], wo [fs, d])``, a dense gated
        MLP added for every token.
      capacity_factor: None is dropless; else each expert keeps at most
        ``ceil(T * top_k / E * capacity_factor)`` assignments, first come first
        served in token order, and dropped assignments contribute zero.
      return_aux: also return a dict: topk_indices ``[..., k]``, topk_weights
        ``[..., k]``, group_sizes ``[E]``, load_balance_loss (Switch:
        ``E * sum_e f_e P_e``, f_e the fraction of assignments to e, P_e the mean
        softmax probability of e), bias_updates (``sign(mean load - load_e)``,
        DeepSeek's aux-loss-free update direction), dropped (count).

    Returns:
      ``out [..., d]`` (and ``aux`` when return_aux), in the promoted dtype of
      the inputs; arithmetic in float32 (float64 when any input is float64).
    """
    c = _prepare(x, router_weights, w0, w1, wo, top_k, score_func, router_bias, selection_bias,
                 n_groups, topk_groups, norm_topk_prob, routed_scaling_factor, activation, w0_bias,
                 w1_bias, wo_bias, shared_experts, capacity_factor, weights_layout, swiglu_limit)
    out, routing, _ = _forward(c, save=False)
    out = out.reshape(c.x_shape).astype(c.out_dtype, copy=False)
    if return_aux:
        return out, _aux(c, routing)
    return out


# -------------------------------------------------------------------- backward

def _segment_sum(rows, bounds, E):
    out = np.zeros((E, rows.shape[1]), dtype=rows.dtype)
    for e in range(E):
        if bounds[e + 1] > bounds[e]:
            rows[bounds[e]:bounds[e + 1]].sum(axis=0, out=out[e])
    return out


def _weight_grad(lhs_t, rhs, bounds, E, transposed):
    """d_w[e] = lhs_t[:, rows_e] @ rhs[rows_e]  ([E, a, b]); `transposed` gives
    [E, b, a] by contracting the other way round (for the "efd" layout)."""
    if transposed:
        lhs_t, rhs = rhs.T, lhs_t.T
    out = gw.empty((E, lhs_t.shape[0], rhs.shape[1]), rhs.dtype)
    return gw.contract(lhs_t, rhs, bounds, out)


def moe_block_vjp(x, router_weights, w0, w1, wo, **kwargs):
    """``(out, vjp_fn)`` for moe_block with the same arguments.

    ``vjp_fn(d_out)`` returns a dict of gradients with the shapes and layout of
    the inputs: ``x``, ``router_weights``, ``w0``, ``w1``, ``wo``, and when given
    ``router_bias``, ``w0_bias``, ``w1_bias``, ``wo_bias``, ``shared_experts``
    (a tuple of three). The expert choice is held fixed (top-k and
    selection_bias are not differentiable, as in every framework); gradients
    flow through the router weights of the chosen experts into the logits.
    Built from the same kernels as the forward: ragged_dot against transposed
    weights, the ragged-contraction kernel (tgmm) for weight gradients, and the
    gathers with their roles swapped.
    """
    try:  # the arguments and defaults of moe_block itself
        bound = inspect.signature(moe_block).bind(x, router_weights, w0, w1, wo, **kwargs)
    except TypeError as e:
        raise TypeError(f"moe_block_vjp: {e}") from None
    bound.apply_defaults()
    kw = dict(bound.arguments)
    if kw.pop("return_aux"):
        raise ValueError("moe_block_vjp: 'return_aux' is not differentiable; call moe_block for aux")
    c = _prepare(**kw)
    out, _, r = _forward(c, save=True)
    input_dtypes = {"x": np.asarray(x).dtype, "router_weights": np.asarray(router_weights).dtype,
                    "w0": np.asarray(w0).dtype, "w1": np.asarray(w1).dtype, "wo": np.asarray(wo).dtype}

    def vjp_fn(d_out):
        ct = c.ct
        g = v.as_array(d_out, "d_out", "moe_block_vjp")
        if g.shape != c.x_shape:
            raise ValueError(f"moe_block_vjp: cotangent must have shape {c.x_shape}, got {g.shape}")
        g = gw.operand(g.reshape(c.T, c.d), ct, gw.ROWS)
        bounds, E = r["bounds"], c.E
        N = int(bounds[-1])
        kept = r["slot_of"] >= 0
        # combine^T: each slot receives its token's cotangent times its router weight
        w_slot = np.zeros(N, dtype=ct)
        w_slot[r["slot_of"][kept]] = r["w"][kept]
        dy = gw.gather_rows(g, r["tok"], w_slot)                       # [N, d]
        # router weight gradients: d_w[t, j] = <d_out[t], y[slot(t, j)]>
        dw = np.zeros((c.T, c.top_k), dtype=ct)
        for j in range(c.top_k):
            kj = kept[:, j]
            if kj.any():
                dw[kj, j] = np.einsum("td,td->t", g[kj], r["y"][r["slot_of"][kj, j]])
        # down projection
        da = gw.empty((N, c.f), ct)
        if N and c.f:
            gw.rows(dy, c.wo.transpose(0, 2, 1), bounds, da)
        dwo = _weight_grad(r["a"].T, dy, bounds, E, c.layout == "efd")
        dbo = _segment_sum(dy, bounds, E) if c.bo is not None else None
        dh0, dh1 = gw.gated_act_grad(r["h0"], r["h1"], da, c.act, c.limit)
        # gate and up projections
        dxs = np.zeros((N, c.d), dtype=ct)
        if N and c.f:
            gw.rows(dh0, c.w0.transpose(0, 2, 1), bounds, dxs)
            gw.rows(dh1, c.w1.transpose(0, 2, 1), bounds, dxs, accumulate=True)
        dw0 = _weight_grad(r["xs"].T, dh0, bounds, E, c.layout == "efd")
        dw1 = _weight_grad(r["xs"].T, dh1, bounds, E, c.layout == "efd")
        db0 = _segment_sum(dh0, bounds, E) if c.b0 is not None else None
        db1 = _segment_sum(dh1, bounds, E) if c.b1 is not None else None
        # dispatch^T: every slot's gradient goes back to its token
        dx = gw.gather_reduce(dxs, r["slot_of"], None)                  # [T, d]
        # router: weights -> scores -> logits
        scores, idx, w = r["scores"], r["idx"], r["w"]
        dwn = dw * c.scale                        # through routed_scaling_factor
        if c.norm:
            wn = w / c.scale if c.scale != 0 else np.zeros_like(w)
            chosen = np.take_along_axis(scores, idx, axis=1)
            denom = chosen.sum(axis=1, keepdims=True)
            if c.score_func == "sigmoid":
                denom = denom + 1e-20
            dchosen = (dwn - np.sum(dwn * wn, axis=1, keepdims=True)) / denom
        else:
            dchosen = dwn
        dscores = np.zeros_like(scores)
        np.put_along_axis(dscores, idx, dchosen, axis=1)
        if c.score_func == "softmax":
            dlogits = scores * (dscores - np.sum(dscores * scores, axis=1, keepdims=True))
        else:
            dlogits = dscores * scores * (1 - scores)
        drw = gw.matmul(c.xf.T, dlogits)
        gw.matmul(dlogits, c.rw.T, out=dx, accumulate=True)
        grads = {}
        if c.shared is not None:
            s0, s1, so = c.shared
            hs0, hs1, as_ = r["hs"]
            dso = gw.matmul(as_.T, g)
            das = gw.matmul(g, so.T)
            dhs0, dhs1 = gw.gated_act_grad(hs0, hs1, das, c.act, c.limit)
            ds0, ds1 = gw.matmul(c.xf.T, dhs0), gw.matmul(c.xf.T, dhs1)
            gw.matmul(dhs0, s0.T, out=dx, accumulate=True)
            gw.matmul(dhs1, s1.T, out=dx, accumulate=True)
            sh = kw["shared_experts"]
            grads["shared_experts"] = tuple(
                gr.astype(np.asarray(p).dtype, copy=False) for gr, p in zip((ds0, ds1, dso), sh))
        grads["x"] = dx.reshape(c.x_shape).astype(input_dtypes["x"], copy=False)
        grads["router_weights"] = drw.astype(input_dtypes["router_weights"], copy=False)
        grads["w0"] = dw0.astype(input_dtypes["w0"], copy=False)
        grads["w1"] = dw1.astype(input_dtypes["w1"], copy=False)
        grads["wo"] = dwo.astype(input_dtypes["wo"], copy=False)
        if c.router_bias is not None:
            grads["router_bias"] = dlogits.sum(axis=0).astype(np.asarray(kw["router_bias"]).dtype, copy=False)
        for name, val in (("w0_bias", db0), ("w1_bias", db1), ("wo_bias", dbo)):
            if val is not None:
                grads[name] = val.astype(np.asarray(kw[name]).dtype, copy=False)
        return grads

    return out.reshape(c.x_shape).astype(c.out_dtype, copy=False), vjp_fn


def _moe_block_vjp_rule(args, wanted):
    """raggeddot.vjp(moe_block, x, router_weights, w0, w1, wo) support."""
    del wanted  # one backward pass yields every gradient
    kwargs = dict(args)
    primals = [kwargs.pop(name) for name in ("x", "router_weights", "w0", "w1", "wo")]
    if kwargs.pop("return_aux"):
        raise ValueError("vjp of moe_block: 'return_aux' must be False (aux is not differentiable)")
    return moe_block_vjp(*primals, **kwargs)


_autodiff.defvjp(moe_block, _moe_block_vjp_rule, ("x", "router_weights", "w0", "w1", "wo"))

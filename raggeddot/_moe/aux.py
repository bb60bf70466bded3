"""The MoE layer's auxiliary outputs, from the forward's residuals: the
router's load-balancing loss (Switch's, or the sequence-wise one), its
z-loss, the expert counts and bias updates, and the cotangent of the
router's logits that the aux outputs' own cotangents give the backward."""
import numpy as np

from .. import _validate as v


def _probs(layer, res):
    """softmax(logits) ``[T, E]`` (the router's scores when it is softmax)."""
    logits = res.route.logits
    if layer.router.score_func == "softmax":
        return res.route.scores
    z = logits - logits.max(axis=1, keepdims=True) if logits.size else logits
    probs = np.exp(z)
    probs /= probs.sum(axis=1, keepdims=True)
    return probs


def _logsumexp(logits):
    """``[T]``: log sum_e exp(logits[t, e])."""
    if logits.shape[0] == 0:
        return np.zeros(0, dtype=logits.dtype)
    mx = logits.max(axis=1)
    return mx + np.log(np.exp(logits - mx[:, None]).sum(axis=1))


def aux_sums(layer, res):
    """The sums moe_block's statistics come from, over this call's tokens:
    ``(counts [E] float64, assignments per expert before any capacity;
    prob_sum [E], the sum over tokens of the softmax probabilities; T)``."""
    E = layer.num_experts
    counts = np.bincount(res.route.topk_idx.ravel(), minlength=E).astype(np.float64)
    return counts, _probs(layer, res).sum(axis=0), layer.x.shape[0]


def z_sum(res):
    """``sum_t logsumexp_e(logits[t, e])**2`` over this call's tokens (float)."""
    return float(np.sum(np.square(_logsumexp(res.route.logits)), dtype=np.float64))


def _sequences(layer):
    """(B, S): MaxText's batch of sequences, x ``[..., S, d]`` (one sequence
    of T tokens for a 2-D x)."""
    T = layer.x.shape[0]
    S = layer.x_shape[-2] if len(layer.x_shape) >= 3 else T
    return (T // S if S else 0), S


def _balance_slope(layer, res, counts, T):
    """``dL/dprobs``, where L is the load-balancing loss: ``[E]`` (the same
    for every token) or, for "maxtext", ``[B, E]`` (per sequence)."""
    E, top_k = layer.num_experts, layer.router.top_k
    if layer.load_balance == "maxtext":
        B, S = _sequences(layer)
        if not B * S:
            return np.zeros((B, E))
        seq_counts = np.zeros((B, E))
        idx = res.route.topk_idx.reshape(B, S * top_k)
        np.add.at(seq_counts, (np.arange(B)[:, None], idx), 1.0)
        return E * (seq_counts / S) / (S * B)
    per = T * top_k if layer.load_balance == "switch" else T
    return E * (counts / max(1, per)) / max(1, T)


def load_balance_loss(layer, res, counts, prob_sum, T):
    """The load-balancing loss of ``layer.load_balance``'s convention, from
    :func:`aux_sums`' statistics of ``T`` tokens (see moe_block)."""
    if layer.load_balance == "maxtext":
        B, S = _sequences(layer)
        if not B * S:
            return 0.0
        seq_probs = _probs(layer, res).reshape(B, S, -1).sum(axis=1)
        return float(np.sum(_balance_slope(layer, res, counts, T) * seq_probs))
    return float(np.sum(_balance_slope(layer, res, counts, T) * prob_sum))


def aux_dict(layer, res, counts, prob_sum, T, group_sizes, dropped, z_total=None):
    """moe_block's aux dict (see its docstring) of this call's routing and
    the statistics of ``T`` tokens: ``counts`` and ``prob_sum`` as
    :func:`aux_sums` gives them, ``group_sizes [E]`` kept per expert,
    ``dropped`` assignments and ``z_total`` (:func:`z_sum` over the T
    tokens; None: this call's)."""
    idx, w = res.route.topk_idx, res.route.topk_weights
    E, top_k = layer.num_experts, layer.router.top_k
    bias_updates = np.sign(counts.mean() - counts)
    z_total = z_sum(res) if z_total is None else z_total
    lead = layer.x_shape[:-1]
    return {
        "topk_indices": idx.reshape(lead + (top_k,)),
        "topk_weights": w.reshape(lead + (top_k,)).astype(layer.out_dtype, copy=False),
        "group_sizes": group_sizes,
        "load_balance_loss": load_balance_loss(layer, res, counts, prob_sum, T),
        "router_z_loss": z_total / T if T else 0.0,
        "router_logits": res.route.logits.reshape(lead + (E,)).astype(layer.out_dtype),
        "bias_updates": bias_updates,
        "dropped": int(dropped),
    }


def _aux(layer, res):
    """moe_block's aux dict (see its docstring)."""
    aux = aux_dict(layer, res, *aux_sums(layer, res), res.plan.group_sizes, np.sum(res.plan.slot_of < 0))
    aux["slot_of"] = res.plan.slot_of.reshape(layer.x_shape[:-1] + (layer.router.top_k,)).copy()
    aux["token_of_slot"] = res.plan.token_of_slot.copy()
    return aux


AUX_DIFFERENTIABLE = ("load_balance_loss", "router_z_loss", "router_logits")


def aux_cotangents(layer, d_aux, fn):
    """``(scalars, d_logits)`` of the aux cotangents ``d_aux`` (None, or a
    dict with any of :data:`AUX_DIFFERENTIABLE`), checked: the nonzero
    cotangents of load_balance_loss and router_z_loss (a dict of floats),
    and that of router_logits as ``[T, E]`` (or None)."""
    if d_aux is None:
        return {}, None
    if not isinstance(d_aux, dict):
        raise TypeError(f"{fn}: 'd_aux' must be a dict with keys among {AUX_DIFFERENTIABLE}, "
                        f"got {type(d_aux).__name__}")
    unknown = sorted(set(d_aux) - set(AUX_DIFFERENTIABLE))
    if unknown:
        raise ValueError(f"{fn}: 'd_aux' has keys {unknown} that are not differentiable aux outputs; "
                         f"the differentiable ones are {AUX_DIFFERENTIABLE}")
    scalars = {}
    for name in ("load_balance_loss", "router_z_loss"):
        c = d_aux.get(name)
        if c is not None:
            c = v.as_array(c, f"d_aux[{name!r}]", fn)
            if c.size != 1 or (c.dtype.kind not in "fiu" and not v.is_bfloat16(c.dtype)):
                raise ValueError(f"{fn}: d_aux[{name!r}] must be a real scalar, got shape {c.shape} "
                                 f"dtype {c.dtype}")
            value = float(c.astype(np.float64).reshape(()))
            if value:
                scalars[name] = value
    g = None
    if d_aux.get("router_logits") is not None:
        g = v.as_array(d_aux["router_logits"], "d_aux['router_logits']", fn)
        want = layer.x_shape[:-1] + (layer.num_experts,)
        if g.shape != want:
            raise ValueError(f"{fn}: d_aux['router_logits'] must have shape {want}, got {g.shape}")
        g = g.reshape(layer.x.shape[0], layer.num_experts)
    return scalars, g


def aux_logits_cotangent(layer, res, d_aux, fn):
    """``d_logits [T, E]`` (compute dtype) of the differentiable aux
    outputs for their cotangents ``d_aux`` (a dict with any of
    :data:`AUX_DIFFERENTIABLE`), or None when there is none. The expert
    choice is held fixed: the load-balancing loss is differentiated
    through the mean probabilities only."""
    if d_aux is None:
        return None
    scalars, g = aux_cotangents(layer, d_aux, fn)
    ct, logits = layer.compute_dtype, res.route.logits
    T, E = logits.shape
    d_logits = np.zeros((T, E), dtype=ct)
    if g is not None:
        d_logits += g
    if T and scalars:
        probs = _probs(layer, res)
        d_probs = np.zeros((T, E), dtype=ct)
        if scalars.get("load_balance_loss"):
            counts = np.bincount(res.route.topk_idx.ravel(), minlength=E).astype(np.float64)
            slope = _balance_slope(layer, res, counts, T)
            if slope.ndim == 2:      # per sequence
                slope = np.repeat(slope, T // slope.shape[0], axis=0)
            d_probs += scalars["load_balance_loss"] * slope
        if scalars.get("router_z_loss"):
            # d(lse^2)/d logits = 2 lse softmax(logits)
            d_logits += (scalars["router_z_loss"] * 2.0 / T) * _logsumexp(logits)[:, None] * probs
        d_logits += probs * (d_probs - np.sum(d_probs * probs, axis=1, keepdims=True))
    return d_logits

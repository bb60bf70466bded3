"""The expert-parallel MoE layer: moe_block and moe_block_vjp over the ranks
of an MPI communicator, the single-process layer's steps with two
exchanges of rows between them.

Forward on rank r (P ranks, E experts, El = E/P held per rank)::

    route     x_r [T_r, d]         -> topk_idx, topk_weights [T_r, k]   (all E scored)
    counts    Allgather of bincount(topk_idx) -> counts [P, E]; capacity shares
    dispatch  x_r, topk_idx        -> xs_r [N_r, d] sorted by expert
                                      (rows scaled by their weights: router_weights_on="input")
    exchange  xs_r rows of expert e -> the rank holding e               (ragged all-to-all)
    experts   held experts [r*El, (r+1)*El) on the rows received        (group_offset r*El)
    exchange  expert outputs -> back to the tokens' ranks, in xs_r's order
    combine   y_r, plan, weights   -> out_r [T_r, d]  (+ shared experts on x_r)

Backward in reverse, with the same two exchanges carrying d_y to the
experts and d_xs back; the router's and the shared experts' gradients are
summed over ranks in rank order (:func:`~._mpi.ordered_sum`).

The aux outputs are statistics of every rank's tokens: the per-expert
counts (from the Allgather above), and the sums over tokens of the softmax
probabilities and of logsumexp^2 (ordered_sum), normalised by the total
token count; the gradient of the aux losses for a rank's tokens uses the
same totals.

See :mod:`.exchange` for the layouts and the capacity rule.
"""
import dataclasses
import inspect
from typing import NamedTuple

import numpy as np

from .. import _gateway as gw
from .. import _validate as v
from .._moe import aux as moe_aux
from .._moe import block, combine, dispatch, experts, route, shared
from .._moe.config import LOAD_BALANCE, ROUTER_WEIGHTS_ON, capacity_of, prepare
from ._mpi import abort_on_error, agree, check_comm, ordered_sum
from .exchange import ExpertExchange, kept_counts, move, plan

__all__ = ["moe_block", "moe_block_vjp"]

FN = "raggeddot.distributed.moe_block"
FN_VJP = "raggeddot.distributed.moe_block_vjp"


class Residuals(NamedTuple):
    """One rank's residuals: the steps' (as single-process moe_block's), the
    exchange plan and every rank's per-expert counts ``[P, E]``."""
    steps: block.Residuals
    exchange: ExpertExchange
    counts: np.ndarray


# moe_block's options that the shared checks (config.prepare) take on one
# process only: this layer checks and applies them itself (_prepare), with
# prepare given their defaults
_APPLIED_HERE = {"shared_expert_gate": None, "router_weights_on": "output", "load_balance": "switch"}


def _choice(value, name, allowed, fn):
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{fn}: '{name}' must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def _prepare(kw, held, fn):
    """This rank's checked :class:`~raggeddot._moe.config.Layer` of the
    bound arguments ``kw``, its expert weights and biases holding ``held``
    experts, with router_weights_on, load_balance and shared_expert_gate
    applied as single-process moe_block applies them."""
    layer = prepare(**{**kw, **_APPLIED_HERE}, held_experts=held, fn=fn)
    layer.weights_on = _choice(kw["router_weights_on"], "router_weights_on", ROUTER_WEIGHTS_ON, fn)
    layer.load_balance = _choice(kw["load_balance"], "load_balance", LOAD_BALANCE, fn)
    gate = kw["shared_expert_gate"]
    if gate is not None:
        if layer.shared is None:
            raise ValueError(f"{fn}: 'shared_expert_gate' gates the shared experts' output, but "
                             "'shared_experts' is None")
        d = layer.x.shape[1]
        g = v.as_array(gate, "shared_expert_gate", fn)
        v.float_dtype(g, "shared_expert_gate", fn)
        if g.shape not in ((d,), (d, 1)):
            raise ValueError(f"{fn}: 'shared_expert_gate' must have shape ({d},) or ({d}, 1) "
                             f"([d] or [d, 1], d={d}), got {g.shape}")
        layer.gate_shape = g.shape
        layer.shared.gate = np.ascontiguousarray(g.reshape(d, 1), dtype=layer.compute_dtype)
    return layer


def _sequence_length(layer):
    """S of load_balance="maxtext": x ``[..., S, d]`` holds whole sequences
    of S tokens on each rank; None for a 2-D x, whose tokens on all ranks
    form one sequence (the concatenation)."""
    return layer.x_shape[-2] if len(layer.x_shape) >= 3 else None


def _setup(comm, fn, bind, return_aux=False):
    """Collective: ``(kw, layer, tokens)``, the bound arguments (``bind()``),
    this rank's checked Layer and every rank's token count ``[P]``; or the
    same exception on every rank."""
    P = comm.size
    error, kw, layer, same, signature, T = None, None, None, [], "", 0
    try:
        kw = bind()
        rw = v.as_array(kw["router_weights"], "router_weights", fn)
        held = None
        if rw.ndim == 2:
            E = rw.shape[1]
            if E % P:
                raise ValueError(f"{fn}: E={E} experts cannot be split evenly over P={P} ranks "
                                 "('router_weights' [d, E]): E must be a multiple of the number of ranks")
            held = E // P
        layer = _prepare(kw, held, fn)
        E, d = layer.num_experts, layer.x.shape[1]
        same = [("E (experts in 'router_weights' [d, E])", E), ("d (the last axis of 'x')", d),
                ("'top_k'", layer.router.top_k),
                ("'router_bias' given (1) or not (0)", layer.router.bias is not None),
                ("fs (the width of 'shared_experts', -1 without)",
                 -1 if layer.shared is None else layer.shared.w0.shape[1]),
                ("'shared_expert_gate' given (1) or not (0)",
                 layer.shared is not None and layer.shared.gate is not None)]
        signature = (f"compute dtype {layer.compute_dtype}, capacity_factor={_capacity_factor(kw)!r}, "
                     f"return_aux={bool(return_aux)}")
        if return_aux:
            signature += f", load_balance={layer.load_balance!r}"
            if layer.load_balance == "maxtext":
                S = _sequence_length(layer)
                signature += (" over one sequence of every rank's tokens (2-D 'x')" if S is None else
                              f" over sequences of S={S} tokens ('x' [..., S, d])")
        T = layer.x.shape[0]
    except Exception as e:      # any failure here must reach every rank, or they would wait
        error = e
        same = [(label, 0) for label in ("E", "d", "top_k", "router_bias", "fs", "shared_expert_gate")]
    tokens = agree(comm, fn, error, same=same, values=[T], signature=signature)[:, 0]
    return kw, layer, tokens


def _forward(comm, layer, tokens, capacity_factor):
    """Collective forward: ``(out_r [T_r, d], Residuals)``. The router
    weights scale the expert outputs in the combine, or (router_weights_on
    "input") the rows the dispatch gathers, before they are sent."""
    P, r, E = comm.size, comm.rank, layer.num_experts
    topk_idx, topk_weights, r_route = route.forward(layer.router, layer.x)
    counts = np.empty((P, E), dtype=np.int64)
    comm.Allgather(np.bincount(topk_idx.ravel(), minlength=E).astype(np.int64), counts)
    capacity = capacity_of(int(tokens.sum()), layer.router.top_k, E, capacity_factor)
    kept = kept_counts(counts, capacity)
    on_input = layer.weights_on == "input"
    rows = layer.x if layer.x_hidden is None else layer.x_hidden   # the experts' dtype, as moe_block's
    xs, dplan = dispatch.forward(rows, topk_idx, E, kept[r] if capacity >= 0 else -1,
                                 weights=topk_weights if on_input else None)
    if xs.dtype != rows.dtype:   # 16-bit rows scaled by their weights in float32
        xs = gw.narrow(xs, rows.dtype)
    ex = plan(kept, r)
    y_here, r_experts = experts.forward(layer.experts, move(comm, xs, ex.to_experts), ex.sizes_here,
                                        ex.first_expert)
    out, r_combine = combine.forward(move(comm, y_here, ex.to_tokens), dplan,
                                     None if on_input else topk_weights)
    r_shared = None
    if layer.shared is not None:
        r_shared = shared.forward(layer.shared, layer.x, out)
    steps = block.Residuals(r_route, dplan, r_experts, r_combine, r_shared)
    return out, Residuals(steps, ex, counts)


def _backward(comm, layer, res, d_out, d_logits=None):
    """Collective backward for ``d_out [T_r, d]`` (and ``d_logits [T_r,
    E]``, the aux outputs' cotangent of the router logits, or None):
    moe_block's gradient dict (see :func:`raggeddot._moe.block.backward`),
    with the router's and the shared experts' gradients summed over ranks."""
    s, ex = res.steps, res.exchange
    d_y, d_topk_weights = combine.backward(s.combine, d_out)
    d_xs_here, expert_grads = experts.backward(layer.experts, s.experts, move(comm, d_y, ex.to_experts))
    d_xs = move(comm, d_xs_here, ex.to_tokens)
    if layer.weights_on == "input":
        d_x, d_topk_weights = dispatch.backward(s.plan, d_xs, layer.x, s.route.topk_weights)
    else:
        d_x = dispatch.backward(s.plan, d_xs)
    d_x, d_rw, d_rb = route.backward(layer.router, s.route, d_topk_weights, d_x, d_logits)
    replicated = [d_rw] + ([d_rb] if d_rb is not None else [])
    n_shared = 0
    if layer.shared is not None:
        sg = list(shared.backward(layer.shared, s.shared, d_out, d_x))
        n_shared = len(sg)
        replicated += sg
    summed = ordered_sum(comm, replicated)
    grads = {"x": d_x, "router_weights": summed[0], "router_bias": summed[1] if d_rb is not None else None,
             **expert_grads._asdict()}
    if n_shared:
        sg = summed[len(summed) - n_shared:]
        grads["shared_experts"] = tuple(sg[:3])
        if n_shared == 4:
            grads["shared_expert_gate"] = sg[3]
    return grads


# ----------------------------------------------------------------- aux outputs
# The aux outputs are statistics of every rank's tokens: the counts per
# expert (from the Allgather of the forward), the sums over tokens of the
# softmax probabilities and of logsumexp^2 (ordered_sum), and T the total
# token count. Each rank's share of their gradients, for its own tokens,
# uses the same totals, so that the values and gradients are those of
# single-process moe_block on the concatenated tokens.


class AuxStats(NamedTuple):
    """The totals over every rank's tokens the aux outputs are made of."""
    counts: np.ndarray    # [E] float64: assignments per expert, before any capacity
    prob_sum: np.ndarray  # [E]: sum over tokens of softmax(logits)
    T: int                # tokens
    z_total: float        # sum over tokens of logsumexp(logits)^2
    S: object             # "maxtext": tokens a sequence (None: one sequence of all T)
    seq_sum: float        # "maxtext" with S: sum over sequences of their "hf" value


def _seq_counts(layer, steps, S):
    """``[B_r, E]``: the assignments of each of this rank's sequences of S
    tokens to each expert."""
    T, E = layer.x.shape[0], layer.num_experts
    B = T // S if S else 0
    counts = np.zeros((B, E))
    if B:
        np.add.at(counts, (np.arange(B)[:, None], steps.route.topk_idx.reshape(B, -1)), 1.0)
    return counts


def _aux_stats(comm, layer, res, tokens):
    """Collective: the :class:`AuxStats` of every rank's tokens."""
    _, prob_sum, _ = moe_aux.aux_sums(layer, res.steps)
    S = _sequence_length(layer) if layer.load_balance == "maxtext" else None
    seq = 0.0
    if S:       # E * sum_e (c_be / S) * (sum_s p_bse / S) over this rank's sequences b
        B = layer.x.shape[0] // S
        seq_probs = moe_aux._probs(layer, res.steps).reshape(B, S, -1).sum(axis=1)
        seq = float(np.sum(layer.num_experts * (_seq_counts(layer, res.steps, S) / S) * seq_probs / S))
    prob_sum, scalars = ordered_sum(comm, [prob_sum, np.array([moe_aux.z_sum(res.steps), seq], dtype=np.float64)])
    return AuxStats(res.counts.sum(axis=0).astype(np.float64), prob_sum, int(tokens.sum()),
                    float(scalars[0]), S, float(scalars[1]))


def _loss_layer(layer, stats):
    """The layer whose single-process load-balancing formulas, given the
    totals, give this layer's: "maxtext" over one sequence of all tokens (a
    2-D x) is the "hf" value of all tokens."""
    if layer.load_balance == "maxtext" and stats.S is None:
        return dataclasses.replace(layer, load_balance="hf")
    return layer


def _aux(layer, res, stats):
    """moe_block's aux dict for this rank's tokens, its statistics over all
    ranks' tokens."""
    kept = res.exchange.kept
    aux = moe_aux.aux_dict(_loss_layer(layer, stats), res.steps, stats.counts, stats.prob_sum, stats.T,
                           kept.sum(axis=0), int(res.counts.sum() - kept.sum()), z_total=stats.z_total)
    if layer.load_balance == "maxtext" and stats.S is not None:
        B = stats.T // stats.S if stats.S else 0
        aux["load_balance_loss"] = stats.seq_sum / B if B else 0.0
    return aux


def _aux_logits_cotangent(layer, res, stats, scalars, g):
    """``d_logits [T_r, E]`` of the aux outputs for this rank's tokens, or
    None: the single-process rule (the expert choice and the counts held
    fixed) with the totals of every rank's tokens."""
    if not scalars and g is None:
        return None
    steps = res.steps
    logits = steps.route.logits
    T, E = logits.shape
    d_logits = np.zeros((T, E), dtype=layer.compute_dtype)
    if g is not None:
        d_logits += g
    if T and scalars:
        probs = moe_aux._probs(layer, steps)
        d_probs = np.zeros((T, E), dtype=layer.compute_dtype)
        c = scalars.get("load_balance_loss")
        if c:
            if layer.load_balance == "maxtext" and stats.S is not None:
                B = stats.T // stats.S
                slope = np.repeat(E * (_seq_counts(layer, steps, stats.S) / stats.S) / (stats.S * B),
                                  stats.S, axis=0)
            else:
                slope = moe_aux._balance_slope(_loss_layer(layer, stats), steps, stats.counts, stats.T)
            d_probs += c * slope
        c = scalars.get("router_z_loss")
        if c:       # d(lse^2)/d logits = 2 lse softmax(logits), over the T tokens of every rank
            d_logits += (c * 2.0 / stats.T) * moe_aux._logsumexp(logits)[:, None] * probs
        d_logits += probs * (d_probs - np.sum(d_probs * probs, axis=1, keepdims=True))
    return d_logits


def _capacity_factor(kw):
    cf = kw["capacity_factor"]
    return None if cf is None else float(cf)


def moe_block(x, router_weights, w0, w1, wo, *, comm, **kwargs):
    """raggeddot.moe_block with its experts spread over the ranks of ``comm``.

    Collective: every rank calls it, with its own tokens and its share of
    the experts. With P ranks, E experts (E a multiple of P) and rank r
    holding experts ``[r*E/P, (r+1)*E/P)``, the result on rank r is
    single-process moe_block's on the tokens of all ranks concatenated in
    rank order (along the first axis of x), with all experts, restricted
    to rank r's tokens::

        out_r[t] = sum_j w[t, j] * FFN_e(t,j)(x_r[t])        (router_weights_on="output")
        out_r[t] = sum_j FFN_e(t,j)(w[t, j] * x_r[t])        (router_weights_on="input")
                   (+ shared MLP(x_r[t]), gated when shared_expert_gate is given)

    Args:
      x: ``[..., d]`` this rank's tokens (T_r of them, any number, 0
        included; leading dims flattened as in moe_block).
      router_weights: ``[d, E]``, all E experts (replicated).
      w0, w1: ``[E/P, d, f]`` (``[E/P, f, d]`` with ``weights_layout="efd"``),
        the experts this rank holds; wo ``[E/P, f, d]`` (``[E/P, d, f]``).
        w1=None: w0 holds both, fused, ``[E/P, d, 2f]`` (``[E/P, 2f, d]``),
        split as ``gate_up`` says. As in moe_block they may be
        :class:`~raggeddot.QArray` (or AsQArray) or
        :class:`~raggeddot.PackedRhs` (prepacked) weights: this rank's
        slice of the experts, e.g. ``q[r*E/P:(r+1)*E/P]`` of a QArray
        ``q`` of all experts, or ``prepack(w[r*E/P:(r+1)*E/P])``.
      comm: an mpi4py intra-communicator (e.g. ``MPI.COMM_WORLD``).
      **kwargs: every keyword argument of :func:`raggeddot.moe_block`, same
        names, defaults and meaning: ``top_k`` (required), score_func,
        router_bias ``[E]``, selection_bias ``[E]``, n_groups, topk_groups,
        norm_topk_prob, routed_scaling_factor, activation, the per-expert
        biases of the held experts (w0_bias, w1_bias ``[E/P, f]``, wo_bias
        ``[E/P, d]``), shared_experts and shared_expert_gate (replicated,
        computed on the token's rank), capacity_factor, weights_layout,
        gate_up, swiglu_limit, swiglu_alpha, router_weights_on,
        load_balance, return_aux. The replicated arguments (router, biases
        of the router, shared experts, options) must be equal on every
        rank; their shapes and the options the exchanges and reductions
        depend on are checked.

    Capacity: ``capacity_factor`` keeps, for each expert, the first ``C =
    ceil(T * top_k / E * capacity_factor)`` assignments of all ranks' tokens
    taken in rank order, T the total number of tokens: exactly what
    single-process moe_block keeps on the concatenated tokens, and at most
    C rows arrive at an expert's rank.

    Returns:
      ``out [..., d]`` for this rank's tokens (and with return_aux, aux:
      topk_indices, topk_weights, router_logits of this rank's tokens;
      group_sizes ``[E]``, load_balance_loss, router_z_loss, bias_updates
      and dropped over all ranks' tokens: their statistics are summed over
      the ranks, and normalised by the total token count T, as the
      single-process layer normalises them over its tokens).
      load_balance="maxtext" averages over sequences: with ``x [..., S,
      d]`` (S the same on every rank) each rank holds whole sequences and
      the loss is the mean over all ranks' sequences; with a 2-D x the
      concatenated tokens are one sequence, whose value is "hf" over all
      tokens.

    Equality with single-process moe_block on the concatenated tokens: out
    is bitwise equal (each row's router, expert and combine arithmetic
    does not depend on the other rows, and each expert sees its rows in the
    single-process order), and so are topk_indices, topk_weights,
    group_sizes, bias_updates and dropped. load_balance_loss and
    router_z_loss sum over tokens in another order: within rounding.

    Raises:
      ValueError or TypeError, the same on every rank before any exchange,
      when an argument is bad on some rank (naming the rank), E is not a
      multiple of P, or E, d, top_k, the compute dtype, capacity_factor,
      return_aux, whether router_bias, shared experts or their gate are
      given, or (with return_aux) load_balance and maxtext's sequence
      length differ between ranks. An exception raised after the
      exchanges have started (not caused by checked arguments) prints its
      traceback and calls ``comm.Abort(1)``, which ends every rank of the
      job (with a single rank the exception propagates as usual).
    """
    comm = check_comm(comm, FN)
    kwargs = dict(kwargs)
    return_aux = bool(kwargs.pop("return_aux", False))
    kw, layer, tokens = _setup(comm, FN, lambda: block.bind_arguments(FN, x, router_weights, w0, w1, wo, kwargs),
                               return_aux)
    with abort_on_error(comm):
        out, res = _forward(comm, layer, tokens, _capacity_factor(kw))
        aux = _aux(layer, res, _aux_stats(comm, layer, res, tokens)) if return_aux else None
    out = block.deliver_out(layer, out)
    return (out, aux) if return_aux else out


def moe_block_vjp(x, router_weights, w0, w1, wo, *, comm, **kwargs):
    """``(out, vjp_fn)`` for :func:`moe_block` with the same arguments
    (collective); with ``return_aux=True``, ``((out, aux), vjp_fn)``.

    ``vjp_fn(d_out)``, ``d_out`` this rank's cotangent of out's shape, is
    collective too (every rank calls it, as often as the others) and
    returns this rank's gradients with its inputs' shapes and dtypes:

    - ``x``: of this rank's tokens;
    - ``w0``, ``w1``, ``wo`` and ``w0_bias``, ``w1_bias``, ``wo_bias``: of
      the experts this rank holds, ``[E/P, ...]``;
    - ``router_weights``, ``router_bias``, ``shared_experts`` and
      ``shared_expert_gate``: the full gradient over all ranks' tokens, the
      rank sums added in rank order, the same bits on every rank.

    With ``return_aux=True`` it is ``vjp_fn(d_out, d_aux=None)`` as for
    single-process moe_block_vjp: ``d_aux`` a dict with any of
    "load_balance_loss", "router_z_loss" (the cotangents of the two scalar
    losses, which are over every rank's tokens: the same value on every
    rank, checked) and "router_logits" (``[..., E]``, this rank's tokens).
    Each rank adds the losses' gradient for its own tokens, with the
    counts, probability sums and token count T of all ranks (the
    single-process rule on the concatenated tokens: the expert choice and
    the counts held fixed); the router's gradients are then summed over
    the ranks. ``d_out=None`` means a zero cotangent of out.

    Equality with single-process moe_block_vjp on the concatenated tokens:
    ``x`` and the expert weights' and biases' gradients are bitwise equal
    without aux cotangents (the expert products and the weight-gradient
    contractions see each expert's rows in the single-process order; each
    token's gradient is assembled from its own rows in the single-process
    order). The router's and the shared experts' gradients are sums over
    tokens whose grouping differs (per rank, then across ranks), and so are
    the aux losses' totals: within rounding.
    """
    comm = check_comm(comm, FN_VJP)
    kwargs = dict(kwargs)
    return_aux = bool(kwargs.pop("return_aux", False))
    kw, layer, tokens = _setup(comm, FN_VJP,
                               lambda: block.bind_arguments(FN_VJP, x, router_weights, w0, w1, wo, kwargs),
                               return_aux)
    with abort_on_error(comm):
        out, res = _forward(comm, layer, tokens, _capacity_factor(kw))
        stats = _aux_stats(comm, layer, res, tokens) if return_aux else None
        aux = _aux(layer, res, stats) if return_aux else None

    def gradients(d_out, d_aux):
        error, g, scalars, g_logits = None, None, {}, None
        try:
            scalars, g_logits = moe_aux.aux_cotangents(layer, d_aux, FN_VJP)
            if d_out is None:
                g = np.zeros(layer.x.shape, dtype=layer.compute_dtype)
            else:
                g = block.cotangent(layer, d_out, FN_VJP)
        except Exception as e:
            error = e
        # the losses are over every rank's tokens: their cotangents are one value
        agree(comm, FN_VJP, error, signature=", ".join(
            f"d_aux[{name!r}]={scalars[name]!r}" for name in sorted(scalars)))
        with abort_on_error(comm):
            d_logits = _aux_logits_cotangent(layer, res, stats, scalars, g_logits)
            grads = _backward(comm, layer, res, g, d_logits)
        return block.deliver_grads(layer, kw, grads)

    out = block.deliver_out(layer, out)
    if not return_aux:
        return out, lambda d_out: gradients(d_out, None)

    def vjp_fn(d_out, d_aux=None):
        return gradients(d_out, d_aux)

    return (out, aux), vjp_fn


def _signature(fn):
    """moe_block's signature with ``comm`` (keyword-only, required) after top_k."""
    params = []
    for p in inspect.signature(fn).parameters.values():
        params.append(p)
        if p.name == "top_k":
            params.append(inspect.Parameter("comm", inspect.Parameter.KEYWORD_ONLY))
    return inspect.Signature(params)


moe_block.__signature__ = _signature(block.moe_block)
moe_block_vjp.__signature__ = _signature(block.moe_block)

"""The expert-parallel MoE layer: moe_block and moe_block_vjp over the ranks
of an MPI communicator, the single-process layer's steps with two
exchanges of rows between them.

Forward on rank r (P ranks, E experts, El = E/P held per rank)::

    route     x_r [T_r, d]         -> topk_idx, topk_weights [T_r, k]   (all E scored)
    counts    Allgather of bincount(topk_idx) -> counts [P, E]; capacity shares
    dispatch  x_r, topk_idx        -> xs_r [N_r, d] sorted by expert
    exchange  xs_r rows of expert e -> the rank holding e               (ragged all-to-all)
    experts   held experts [r*El, (r+1)*El) on the rows received        (group_offset r*El)
    exchange  expert outputs -> back to the tokens' ranks, in xs_r's order
    combine   y_r, plan, weights   -> out_r [T_r, d]  (+ shared experts on x_r)

Backward in reverse, with the same two exchanges carrying d_y to the
experts and d_xs back; the router's and the shared experts' gradients are
summed over ranks in rank order (:func:`~._mpi.ordered_sum`).

See :mod:`.exchange` for the layouts and the capacity rule.
"""
import inspect
from typing import NamedTuple

import numpy as np

from .._moe import block, combine, dispatch, experts, route, shared
from .._moe.config import capacity_of, prepare
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


def _setup(comm, fn, bind):
    """Collective: ``(kw, layer, tokens)``, the bound arguments (``bind()``),
    this rank's checked Layer and every rank's token count ``[P]``; or the
    same exception on every rank."""
    P = comm.size
    error, kw, layer, same, signature, T = None, None, None, [], "", 0
    try:
        kw = bind()
        rw = np.asarray(kw["router_weights"])
        held = None
        if rw.ndim == 2:
            E = rw.shape[1]
            if E % P:
                raise ValueError(f"{fn}: E={E} experts cannot be split evenly over P={P} ranks "
                                 "('router_weights' [d, E]): E must be a multiple of the number of ranks")
            held = E // P
        layer = prepare(**kw, held_experts=held, fn=fn)
        E, d = layer.num_experts, layer.x.shape[1]
        same = [("E (experts in 'router_weights' [d, E])", E), ("d (the last axis of 'x')", d),
                ("'top_k'", layer.router.top_k),
                ("'router_bias' given (1) or not (0)", layer.router.bias is not None),
                ("fs (the width of 'shared_experts', -1 without)",
                 -1 if layer.shared is None else layer.shared.w0.shape[1])]
        signature = f"compute dtype {layer.compute_dtype}, capacity_factor={_capacity_factor(kw)!r}"
        T = layer.x.shape[0]
    except Exception as e:      # any failure here must reach every rank, or they would wait
        error = e
        same = [(label, 0) for label in ("E", "d", "top_k", "router_bias", "fs")]
    tokens = agree(comm, fn, error, same=same, values=[T], signature=signature)[:, 0]
    return kw, layer, tokens


def _forward(comm, layer, tokens, capacity_factor):
    """Collective forward: ``(out_r [T_r, d], Residuals)``."""
    P, r, E = comm.size, comm.rank, layer.num_experts
    topk_idx, topk_weights, r_route = route.forward(layer.router, layer.x)
    counts = np.empty((P, E), dtype=np.int64)
    comm.Allgather(np.bincount(topk_idx.ravel(), minlength=E).astype(np.int64), counts)
    capacity = capacity_of(int(tokens.sum()), layer.router.top_k, E, capacity_factor)
    kept = kept_counts(counts, capacity)
    xs, dplan = dispatch.forward(layer.x, topk_idx, E, kept[r] if capacity >= 0 else -1)
    ex = plan(kept, r)
    y_here, r_experts = experts.forward(layer.experts, move(comm, xs, ex.to_experts), ex.sizes_here,
                                        ex.first_expert)
    out, r_combine = combine.forward(move(comm, y_here, ex.to_tokens), dplan, topk_weights)
    r_shared = None
    if layer.shared is not None:
        r_shared = shared.forward(layer.shared, layer.x, out)
    steps = block.Residuals(r_route, dplan, r_experts, r_combine, r_shared)
    return out, Residuals(steps, ex, counts)


def _backward(comm, layer, res, d_out):
    """Collective backward for ``d_out [T_r, d]``: moe_block's gradient dict
    (see :func:`raggeddot._moe.block.backward`), with the router's and the
    shared experts' gradients summed over ranks."""
    s, ex = res.steps, res.exchange
    d_y, d_topk_weights = combine.backward(s.combine, d_out)
    d_xs_here, expert_grads = experts.backward(layer.experts, s.experts, move(comm, d_y, ex.to_experts))
    d_x = dispatch.backward(s.plan, move(comm, d_xs_here, ex.to_tokens))
    d_x, d_rw, d_rb = route.backward(layer.router, s.route, d_topk_weights, d_x)
    replicated = [d_rw] + ([d_rb] if d_rb is not None else [])
    if layer.shared is not None:
        replicated += list(shared.backward(layer.shared, s.shared, d_out, d_x))
    summed = ordered_sum(comm, replicated)
    grads = {"x": d_x, "router_weights": summed[0], "router_bias": summed[1] if d_rb is not None else None,
             **expert_grads._asdict()}
    if layer.shared is not None:
        grads["shared_experts"] = tuple(summed[-3:])
    return grads


def _aux(comm, layer, res, tokens):
    """moe_block's aux dict for this rank's tokens, its statistics over all
    ranks' tokens (the probability sums added in rank order)."""
    _, prob_sum, _ = block.aux_sums(layer, res.steps)
    prob_sum, z_total = ordered_sum(comm, [prob_sum, np.array([block.z_sum(res.steps)], dtype=prob_sum.dtype)])
    kept = res.exchange.kept
    return block.aux_dict(layer, res.steps, res.counts.sum(axis=0).astype(np.float64), prob_sum,
                          int(tokens.sum()), kept.sum(axis=0), int(res.counts.sum() - kept.sum()),
                          z_total=float(z_total[0]))


def _capacity_factor(kw):
    cf = kw["capacity_factor"]
    return None if cf is None else float(cf)


def moe_block(x, router_weights, w0, w1, wo, *, comm, **kwargs):
    """raggeddot.moe_block with its experts spread over the ranks of ``comm``.

    Collective: every rank calls it, with its own tokens and its share of
    the experts. With P ranks, E experts (E a multiple of P) and rank r
    holding experts ``[r*E/P, (r+1)*E/P)``, the result on rank r is
    single-process moe_block's on the tokens of all ranks concatenated in
    rank order, with all experts, restricted to rank r's tokens::

        out_r[t] = sum_j w[t, j] * FFN_e(t,j)(x_r[t])  (+ shared MLP(x_r[t]))

    Args:
      x: ``[..., d]`` this rank's tokens (T_r of them, any number, 0
        included; leading dims flattened as in moe_block).
      router_weights: ``[d, E]``, all E experts (replicated).
      w0, w1: ``[E/P, d, f]`` (``[E/P, f, d]`` with ``weights_layout="efd"``),
        the experts this rank holds; wo ``[E/P, f, d]`` (``[E/P, d, f]``).
      comm: an mpi4py intra-communicator (e.g. ``MPI.COMM_WORLD``).
      **kwargs: every keyword argument of :func:`raggeddot.moe_block`, same
        names and defaults: ``top_k`` (required), score_func, router_bias
        ``[E]``, selection_bias ``[E]``, n_groups, topk_groups,
        norm_topk_prob, routed_scaling_factor, activation, the per-expert
        biases of the held experts (w0_bias, w1_bias ``[E/P, f]``, wo_bias
        ``[E/P, d]``), shared_experts (replicated, computed on the token's
        rank), capacity_factor, weights_layout, return_aux, swiglu_limit.
        The replicated arguments (router, biases of the router, shared
        experts, options) must be equal on every rank; only their shapes
        and the options the exchange depends on are checked.

    Capacity: ``capacity_factor`` keeps, for each expert, the first ``C =
    ceil(T * top_k / E * capacity_factor)`` assignments of all ranks' tokens
    taken in rank order, T the total number of tokens: exactly what
    single-process moe_block keeps on the concatenated tokens, and at most
    C rows arrive at an expert's rank.

    Returns:
      ``out [..., d]`` for this rank's tokens (and with return_aux, aux:
      topk_indices, topk_weights, router_logits of this rank's tokens;
      group_sizes ``[E]``, load_balance_loss, router_z_loss, bias_updates
      and dropped over all ranks' tokens). shared_expert_gate,
      router_weights_on="input" and load_balance="maxtext" are refused
      (ValueError); moe_block_vjp refuses return_aux.

    Equality with single-process moe_block on the concatenated tokens: out
    is bitwise equal (each row's router, expert and combine arithmetic
    does not depend on the other rows, and each expert sees its rows in the
    single-process order), and so are topk_indices, topk_weights,
    group_sizes, bias_updates and dropped. load_balance_loss sums
    probabilities in another order: within rounding.

    Raises:
      ValueError or TypeError, the same on every rank before any exchange,
      when an argument is bad on some rank (naming the rank), E is not a
      multiple of P, or E, d, top_k, the compute dtype, capacity_factor,
      whether router_bias or shared experts are given differ between
      ranks. An exception raised after the exchanges have started (not
      caused by checked arguments) prints its traceback and calls
      ``comm.Abort(1)``, which ends every rank of the job (with a single
      rank the exception propagates as usual).
    """
    comm = check_comm(comm, FN)
    return_aux = bool(kwargs.pop("return_aux", False))
    kw, layer, tokens = _setup(comm, FN, lambda: block.bind_arguments(FN, x, router_weights, w0, w1, wo, kwargs))
    with abort_on_error(comm):
        out, res = _forward(comm, layer, tokens, _capacity_factor(kw))
        aux = _aux(comm, layer, res, tokens) if return_aux else None
    out = block.deliver_out(layer, out)
    return (out, aux) if return_aux else out


def moe_block_vjp(x, router_weights, w0, w1, wo, *, comm, **kwargs):
    """``(out, vjp_fn)`` for :func:`moe_block` with the same arguments
    (collective; return_aux refused).

    ``vjp_fn(d_out)``, ``d_out`` this rank's cotangent of out's shape, is
    collective too (every rank calls it, as often as the others) and
    returns this rank's gradients with its inputs' shapes and dtypes:

    - ``x``: of this rank's tokens;
    - ``w0``, ``w1``, ``wo`` and ``w0_bias``, ``w1_bias``, ``wo_bias``: of
      the experts this rank holds, ``[E/P, ...]``;
    - ``router_weights``, ``router_bias`` and ``shared_experts``: the full
      gradient over all ranks' tokens, the rank sums added in rank order, the
      same bits on every rank.

    Equality with single-process moe_block_vjp on the concatenated tokens:
    ``x`` and the expert weights' and biases' gradients are bitwise equal
    (the expert products and the weight-gradient contractions see each
    expert's rows in the single-process order; each token's gradient is
    assembled from its own rows in the single-process order). The router's
    and the shared experts' gradients are sums over tokens whose grouping
    differs (per rank, then across ranks): within rounding.
    """
    comm = check_comm(comm, FN_VJP)
    kw, layer, tokens = _setup(comm, FN_VJP,
                               lambda: block.bind_arguments(FN_VJP, x, router_weights, w0, w1, wo, kwargs))
    with abort_on_error(comm):
        out, res = _forward(comm, layer, tokens, _capacity_factor(kw))

    def vjp_fn(d_out):
        error, g = None, None
        try:
            g = block.cotangent(layer, d_out, FN_VJP)
        except Exception as e:
            error = e
        agree(comm, FN_VJP, error)
        with abort_on_error(comm):
            grads = _backward(comm, layer, res, g)
        return block.deliver_grads(layer, kw, grads)

    return block.deliver_out(layer, out), vjp_fn


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

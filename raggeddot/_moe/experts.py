"""Step 3 of the MoE layer, the experts: three grouped matmuls and a gated
activation over the rows sorted by expert; and its backward.

Forward, for rows ``xs [N, d]`` whose expert groups have ``group_sizes``,
with rows of expert e (local index ``l = e - group_offset``) in
``rows_e``::

    h0[rows_e] = xs[rows_e] @ w0[l] (+ b0[l])                          [N, f]
    h1[rows_e] = xs[rows_e] @ w1[l] (+ b1[l])                          [N, f]
    a          = act(h0) * h1        (or gpt-oss's clipped swiglu)     [N, f]
    y[rows_e]  = a[rows_e] @ wo[l] (+ bo[l])                           [N, d]

The step computes the experts it holds, groups ``[group_offset,
group_offset + n)`` of ``group_sizes`` (megablox's group_offset meaning);
rows of other experts get ``y = 0``. A layer on one process holds every
expert; an expert-parallel one calls it with its local experts only.

Backward (``d_y`` -> ``d_xs`` and the weight gradients)::

    d_a        = d_y[rows_e] @ wo[l]^T;  d_h0, d_h1 = act's gradient
    d_xs[rows] = d_h0 @ w0[l]^T + d_h1 @ w1[l]^T
    d_w0[l]    = xs[rows_e]^T @ d_h0[rows_e]   (the ragged contraction, tgmm)
    d_w1[l]    = xs[rows_e]^T @ d_h1[rows_e];  d_wo[l] = a[rows_e]^T @ d_y[rows_e]
    d_b*[l]    = the column sums of d_h0, d_h1, d_y over rows_e

Forward mode (:func:`jvp`), along ``t_xs`` and the weights' tangents
``t_w0``, ``t_w1``, ``t_wo`` (the biases held constant), with
``da/dh0`` and ``da/dh1`` the elementwise partial derivatives of ``a``::

    t_h0 = t_xs @ w0[l] + xs @ t_w0[l];   t_h1 = t_xs @ w1[l] + xs @ t_w1[l]
    t_a  = da/dh0 * t_h0 + da/dh1 * t_h1
    t_y  = t_a @ wo[l] + a @ t_wo[l]

With activation quantization the weight terms use the quantized rows the
forward multiplied, the others pass straight through (as the backward).

Fused gate/up weights (one stored array ``w0`` holding both projections,
as gpt-oss, Llama4 and transformers' Qwen/Mixtral experts keep them) are
read as two strided views of it, never copied; their gradients are written
into one array of the stored shape through the same views
(:func:`split_gate_up`).
"""
import dataclasses
from typing import NamedTuple, Optional

import numpy as np

from .. import _gateway as gw
from .. import _validate as v
from .._prepack import PackedRhs, meet
from ..quant import QArray
from ..runtime import get_num_threads
from .rows import (Deferred, Gathered, ScaledRows, held, kernels_quantize, naming_rows, quantized, rows_product,
                   values)

__all__ = ["Experts", "ExpertsResiduals", "ExpertGrads", "GATE_UP", "Gathered", "fuses", "split_gate_up", "forward",
           "backward", "jvp"]

GATE_UP = ("concat", "interleaved")


def split_gate_up(fused, axis, gate_up):
    """``(gate, up)``: views of ``fused`` (no copy) along ``axis``, of size
    2f there: "concat" gives the first f and the last f entries,
    "interleaved" the even and the odd ones."""
    lo, hi = [slice(None)] * fused.ndim, [slice(None)] * fused.ndim
    if gate_up == "concat":
        f = fused.shape[axis] // 2
        lo[axis], hi[axis] = slice(0, f), slice(f, 2 * f)
    else:
        lo[axis], hi[axis] = slice(0, None, 2), slice(1, None, 2)
    return fused[tuple(lo)], fused[tuple(hi)]


@dataclasses.dataclass
class Experts:
    """The expert FFNs a step holds, in the compute dtype.

    Attributes:
      w0, w1: gate and up projections ``[n, d, f]`` (views: with the
        "efd" layout they are transposes of the stored ``[n, f, d]``).
      wo: down projection ``[n, f, d]``.
      b0, b1: ``[n, f]`` or None; bo: ``[n, d]`` or None.
      activation: one of ``_gateway.ACTIVATIONS``.
      limit: the clip of "swiglu_oai".
      transposed: the weights are stored "efd" (``[n, f, d]`` gate and up,
        ``[n, d, f]`` down): their gradients are returned in that layout.
      alpha: the sigmoid's slope of "swiglu_oai".
      act_qtype: None, or the qtype the rows and the gated activations are
        quantized to per row (one scale a token) before each product
        (dynamic activation quantization; straight-through gradients).
      gate_up: None when w0 and w1 are stored apart; "concat" or
        "interleaved" when they are views of one fused array (``[n, d,
        2f]``, or ``[n, 2f, d]`` with ``transposed``), whose gradient is then
        returned fused as ``w0`` (and the bias gradient, when b0 is a view
        of a fused ``[n, 2f]`` bias, as ``w0_bias``).
    """
    w0: np.ndarray
    w1: np.ndarray
    wo: np.ndarray
    b0: Optional[np.ndarray]
    b1: Optional[np.ndarray]
    bo: Optional[np.ndarray]
    activation: str
    limit: float
    transposed: bool = False
    alpha: float = 1.702
    gate_up: Optional[str] = None
    act_qtype: Optional[str] = None

    @property
    def num_experts(self):
        return self.w0.shape[0]


class ExpertsResiduals(NamedTuple):
    """What the experts backward reads. h0, h1 and a hold only the rows of
    the held experts, ``[first, first + len(h0))`` of xs; ``bounds [n + 1]``
    are their group bounds counted from ``first``. With activation
    quantization, xs_q and a_q are the quantized rows the products read
    (QArrays of the held rows, or the Deferred quantization the kernels
    made while packing, made again when read), for the weight gradients;
    else None. xs is the rows ``[N, d]``, or the :class:`Gathered` tokens
    and index the forward read them through (the weight gradients read them
    so too: no [N, d] copy is held)."""
    xs: np.ndarray      # [N, d], or a Gathered
    h0: np.ndarray      # [rows, f]
    h1: np.ndarray      # [rows, f]
    a: np.ndarray       # [rows, f]
    bounds: np.ndarray  # [n + 1] int64
    first: int
    xs_q: Optional[QArray] = None
    a_q: Optional[QArray] = None


class ExpertGrads(NamedTuple):
    """Gradients of the held experts' parameters, in their stored layout
    (None for an absent bias; with fused gate/up weights, w0 and w0_bias
    are the fused gradients and w1, w1_bias are None)."""
    w0: np.ndarray
    w1: np.ndarray
    wo: np.ndarray
    w0_bias: Optional[np.ndarray]
    w1_bias: Optional[np.ndarray]
    wo_bias: Optional[np.ndarray]


def _add_group_bias(h, bias, bounds):
    """h[rows of group l] += bias[l]."""
    if bias is not None:
        for e in range(bias.shape[0]):
            if bounds[e + 1] > bounds[e]:
                h[bounds[e]:bounds[e + 1]] += bias[e]


def _segment_sum(rows, bounds, num_groups):
    """[num_groups, d]: the sum of each group's rows (0 for an empty group),
    in the compute dtype (16-bit rows are summed in float32)."""
    ct = gw.compute_dtype(rows.dtype)
    out = np.zeros((num_groups, rows.shape[1]), dtype=ct)
    for e in range(num_groups):
        if bounds[e + 1] > bounds[e]:
            rows[bounds[e]:bounds[e + 1]].sum(axis=0, dtype=ct, out=out[e])
    return out


def _buffer(shape, dtype):
    """An uninitialised array the kernels write, a cached result buffer
    (gw.empty: no page faults of fresh memory for each layer's arrays)."""
    return gw.empty(shape, dtype)


def _held_rows(rows, cols, dtype, first, last, written):
    """``[rows, cols]`` of ``dtype`` from the buffer cache, zero outside the
    held experts' rows ``[first, last)``, and inside them too unless the
    kernels write them (``written``)."""
    out = _buffer((rows, cols), np.dtype(dtype))
    if written:
        if first:
            out[:first] = 0
        if last < rows:
            out[last:] = 0
    else:
        out[...] = 0
    return out


def _weight_grad(lhs_t, rhs, bounds, num_groups, transposed, dtype, out=None, cols=None):
    """d_w[l] = lhs_t[:, rows_l] @ rhs[rows_l]  ([n, a, b]) of ``dtype``;
    `transposed` gives [n, b, a] by contracting the other way round (for the
    "efd" layout). Written into ``out`` (any strides) when given. ``cols``:
    lhs_t's columns are ``lhs_t[:, cols]``, read through that index while
    packed (rhs's rows when contracting the other way round)."""
    index = dict(lhs_cols=cols)
    if transposed:
        lhs_t, rhs, index = rhs.T, lhs_t.T, dict(rhs_rows=cols)
    if out is None:
        out = _buffer((num_groups, lhs_t.shape[0], rhs.shape[1]), dtype)
    return gw.contract(lhs_t, rhs, bounds, out, **index)


def _rows_grad(xs, dh, bounds, num_groups, transposed, dtype, out=None):
    """:func:`_weight_grad` of ``xs^T`` and ``dh``: ``xs`` the rows the
    forward multiplied, an array or a :class:`Gathered` (read through its
    index while packed, as the forward read it: no [rows, d] copy)."""
    if isinstance(xs, Gathered):
        return _weight_grad(xs.x.T, dh, bounds, num_groups, transposed, dtype, out, cols=xs.index)
    return _weight_grad(xs.T, dh, bounds, num_groups, transposed, dtype, out)


def _transposed(w):
    """The weights ``[n, a, b]`` as ``[n, b, a]`` (a view; prepacked weights,
    laid out for the forward product only, are unpacked first)."""
    return (w.unpack() if isinstance(w, PackedRhs) else w).transpose(0, 2, 1)


def in_kernel(experts, x, *weights):
    """Whether rows of ``x``'s dtype are quantized (activation_qtype) by
    the kernels while they pack them for every product with ``weights``:
    no int8 copy of them is made."""
    q = experts.act_qtype
    return q is not None and all(kernels_quantize(x, w, q) for w in weights)


def gate_up_one_pass(experts, x):
    """Whether the gate and up products of rows of ``x``'s dtype run as one
    pass (gw.gated_rows), with activation quantization or without: then
    ``h0`` and ``h1`` are stored only when the forward keeps them."""
    if experts.act_qtype is None:
        return bool(_fused(x, experts.w0, experts.w1))
    return in_kernel(experts, x, experts.w0, experts.w1) and \
        bool(_fused_int8(x, experts.w0, experts.w1))


def fuses(experts, x):
    """Whether the experts' forward over rows of ``x`` (an array of the
    rows' dtype) runs its gate and up products as one pass and can read the
    rows through the dispatch's index (:class:`Gathered`)."""
    return experts.act_qtype is None and bool(_fused(x, experts.w0, experts.w1))


#: The columns of the down product each thread must have for the combine in
#: its epilogue (forward with ``combine``) to pay: the ordered pass splits the
#: columns between the threads, each packing every row of ``a`` for its own
#: (measured, 2 threads, float32, T=2048 top-4 E=32 f=768, against the
#: product and the combine apart: 1.11x at 1024 columns a thread, 1.06x at
#: 512, 0.96x at 256, 0.88x at 128).
COMBINE_MIN_COLS = 512


def combines(experts, x):
    """Whether the experts' forward over rows of ``x`` (an array of the
    hidden dtype) can run its down product with the combine in its
    epilogue (:func:`forward` with ``combine``): a plain float ``a`` (no
    activation quantization), down weights the one-pass product reads, and
    at least :data:`COMBINE_MIN_COLS` output columns a thread."""
    d = experts.wo.shape[2]
    return experts.act_qtype is None and d >= COMBINE_MIN_COLS * get_num_threads() \
        and bool(_fused(x, experts.wo, experts.wo))


def sums_rows(experts, dh0, w0_t, w1_t):
    """Whether the backward's d_xs products (``dh0 w0^T + dh1 w1^T``, of
    rows of ``dh0``'s dtype) run as one pass with the dispatch's backward in
    its epilogue (gw.combine_rows with a second pair): weights (``w0_t``,
    ``w1_t``: transposed, prepacked ones unpacked) the one-pass product
    reads, and :data:`COMBINE_MIN_COLS` columns a thread (the ordered pass,
    as the forward's combine)."""
    d = experts.wo.shape[2]
    return d >= COMBINE_MIN_COLS * get_num_threads() and bool(_fused(dh0, w0_t, w1_t))


#: The layouts of int8 dot products (rows quantized to int8 per row meet them).
_INT8_DOT = ("int8-dot", "int8-mmla", "int8-int4-dot", "int8-mxfp4-dot")


def _fused_int8(rows, w0, w1):
    """The gate and up weights as the one-pass product of rows the kernels
    quantize per row reads them (gw.gated_rows with quantize_lhs), or None:
    two int8 QArrays of one kind (integral zero points), or two PackedRhs
    that multiply such rows in one int8 dot layout. The rows' caller made
    them a :class:`Deferred` only where the kernels quantize them for
    both weights."""
    if isinstance(w0, PackedRhs) and isinstance(w1, PackedRhs):
        (_, p0), (_, p1) = (meet(w, rows, np.dtype(np.float32), "moe_block", "w0/w1", quantize_lhs=True)
                            for w in (w0, w1))
        return (p0, p1) if _one_layout(p0, p1) and p0.ctype in _INT8_DOT else None
    if isinstance(w0, QArray) and isinstance(w1, QArray) and w0.qvalue.dtype == w1.qvalue.dtype == np.int8 \
            and w0.shape == w1.shape and np.shape(w0.scale) == np.shape(w1.scale) \
            and (w0.zero_point is None) == (w1.zero_point is None):
        return w0, w1
    return None


def _one_layout(p0, p1):
    """Whether ``p0`` and ``p1`` are PackedRhs of one layout (compute type,
    shape, blocking, storage, scale tiles, zero points or none), which one
    pass reads as a pair."""
    return isinstance(p0, PackedRhs) and isinstance(p1, PackedRhs) and p0.ctype == p1.ctype \
        and p0.shape == p1.shape and (p0.kc, p0.nr, p0._storage, p0._qtile, p0._zero_point is None) == \
        (p1.kc, p1.nr, p1._storage, p1._qtile, p1._zero_point is None)


def _fused(lhs, w0, w1):
    """The gate and up weights as the one-pass product of ``lhs`` reads them
    (gw.gated_rows), or None where it does not run: a plain float lhs (no
    activation quantization), and plain weights of one dtype the packing
    reads, two QArrays of one kind, or two PackedRhs that multiply it in one
    float layout (the ones ``meet`` gives, made once and kept); or rows the
    kernels quantize to int8 (a :class:`Deferred`) and :func:`_fused_int8`'s
    weights."""
    if isinstance(lhs, Gathered):
        lhs = lhs.x
    if isinstance(lhs, Deferred):
        return _fused_int8(lhs.rows, w0, w1)
    if not isinstance(lhs, np.ndarray):
        return None
    ct = gw.compute_dtype(lhs.dtype)
    if not (lhs.dtype.isnative and gw._packing_reads(lhs.dtype, ct)):
        return None
    if isinstance(w0, PackedRhs) and isinstance(w1, PackedRhs):
        (x0, p0), (x1, p1) = (meet(w, lhs, ct, "moe_block", "w0/w1") for w in (w0, w1))
        same = x0 is lhs and x1 is lhs and _one_layout(p0, p1) and p0.ctype not in ("int8-dot", "int8-mmla")
        return (p0, p1) if same else None
    if isinstance(w0, np.ndarray) and isinstance(w1, np.ndarray) and w0.dtype == w1.dtype \
            and w0.dtype.isnative and gw._packing_reads(w0.dtype, ct):
        return w0, w1
    if isinstance(w0, QArray) and isinstance(w1, QArray) and w0.qtype == w1.qtype and w0.shape == w1.shape \
            and w0.dtype == w1.dtype and (w0.zero_point is None) == (w1.zero_point is None):
        return w0, w1      # dequantized while packed, as the separate products do
    return None


def forward(experts, xs, group_sizes, group_offset=0, keep=True, combine=None):
    """The held experts' FFNs over ``xs [N, d]`` (compute dtype).

    Args:
      experts: the :class:`Experts` held, ``n`` of them.
      xs: ``[N, d]`` rows sorted by expert, or a :class:`Gathered` (with
        ``keep=False`` and where :func:`fuses`): the residuals then hold no xs.
        (The experts' weights may be plain arrays or PackedRhs.)
      group_sizes: ``[g]`` int64 rows per expert (``sum <= N``).
      group_offset: the held experts are groups ``[group_offset,
        group_offset + n)``; ``0 <= group_offset <= g - n``.

      keep: keep h0 and h1 in the residuals (for the backward or the jvp);
        without, the gate and up products are never stored whole.
      combine: None, or ``(tokens [N] int64, weights [N] or None, T)``
        (where :func:`combines`): the combine done in the down product's
        epilogue, ``out[tokens[r]] += weights[r] * y[r]`` each token's rows
        in slot order, with no ``[N, d]`` array of y (the combine's bits).

    Returns:
      ``(y [N, d], residuals)``; rows outside the held experts' are 0. With
      ``combine``, ``(out [T, d], residuals)`` in the compute dtype.

    The gate and up products run as one pass where they can
    (:func:`_fused`): each block of rows packed once for both, the biases,
    the rounding to the hidden dtype and the activation applied to each tile
    as it completes (gw.gated_rows): the bits of the separate products and
    gated_act.
    """
    n = experts.num_experts
    f, d = experts.w0.shape[2], experts.wo.shape[2]
    gs = np.asarray(group_sizes)
    start = v.local_group_start(group_offset, gs.shape[0], n, "moe experts", local_doc="len(experts)")
    bounds = gw.group_bounds(gs, start, n)
    first, last = int(bounds[0]), int(bounds[-1])
    if first:
        bounds = bounds - first
    hd = xs.dtype                     # of the hidden activations
    ct = gw.compute_dtype(hd)         # of the accumulations

    def product(lhs, w, bias, out_rows, fill_zero=False):
        """lhs @ w[l] (+ bias[l]) over the groups, of ``hd``: with a bias,
        computed in ct, the bias added, then rounded once."""
        dt = ct if bias is not None else hd
        computes = last > first and f
        out = _held_rows(out_rows, w.shape[2], dt, first, last, computes) if fill_zero \
            else _buffer((out_rows, w.shape[2]), np.dtype(dt))
        part = out[first:last] if fill_zero else out
        if computes:
            rows_product(lhs, w, bounds, part)
        _add_group_bias(part, bias, bounds)
        return out if out.dtype == hd else gw.narrow(out, hd)

    gathered = isinstance(xs, Gathered)
    rows = Gathered(xs.x, xs.index[first:last]) if gathered else xs[first:last]
    rows_q = None if gathered else quantized(rows, experts.act_qtype, experts.w0, experts.w1)
    lhs = rows if rows_q is None else rows_q
    fused = _fused(lhs, experts.w0, experts.w1)
    if fused:
        count = last - first
        a = _buffer((count, f), hd)
        h0, h1 = (_buffer((count, f), hd) for _ in range(2)) if keep else (None, None)
        deferred = isinstance(lhs, Deferred)
        if count and f:
            with naming_rows(lhs):
                gw.gated_rows(lhs.x if gathered else lhs.rows if deferred else lhs, *fused, bounds, a, h0, h1,
                              experts.b0, experts.b1, experts.activation, experts.limit, experts.alpha,
                              rows=lhs.index if gathered else None, quantize_lhs=deferred)
    else:
        h0 = product(lhs, experts.w0, experts.b0, last - first)
        h1 = product(lhs, experts.w1, experts.b1, last - first)
        a = gw.gated_act(h0, h1, experts.activation, experts.limit, experts.alpha)
    a_q = quantized(a, experts.act_qtype, experts.wo)
    if combine is not None:
        tokens, weights, T = combine
        out = np.zeros((T, d), dtype=ct)
        wo = _fused(a, experts.wo, experts.wo)[0]
        if last > first and f:
            gw.combine_rows(a, wo, bounds, out, tokens[first:last],
                            None if weights is None else weights[first:last], experts.bo, hd)
        return out, ExpertsResiduals(None, h0, h1, None, bounds, first, rows_q, None)
    y = product(a if a_q is None else a_q, experts.wo, experts.bo, xs.shape[0], fill_zero=True)
    return y, ExpertsResiduals(None if gathered and not keep else xs, h0, h1, a, bounds, first, rows_q, a_q)


def backward(experts, res, d_y, combine=None):
    """Backward of :func:`forward` for the cotangent ``d_y [N, d]``.

    Returns ``(d_xs [N, d], grads)``, ``grads`` an :class:`ExpertGrads`;
    rows of ``d_xs`` outside the held experts' are 0. With ``combine``
    ``(tokens [N] int64, slot_of [T, k] int64)`` (the dispatch's plan):
    ``(d_x [T, d], grads)``, ``d_x[t]`` the sum of the rows of ``d_xs``
    whose slot holds token t, in slot order (the dispatch's backward,
    ``gw.gather_reduce`` ordered, bit for bit), added as the d_xs products
    complete where :func:`sums_rows` (no ``[N, d]`` array of d_xs).
    """
    n = experts.num_experts
    f, d = experts.w0.shape[2], experts.wo.shape[2]
    bounds, first = res.bounds, res.first
    count = res.h0.shape[0]
    last = first + count
    hd = res.h0.dtype                 # of the hidden activations and weight gradients
    ct = gw.compute_dtype(hd)         # of d_xs and the accumulations
    wo_t = _transposed(experts.wo)
    scaled = isinstance(d_y, ScaledRows)
    fused = count and f and _fused(d_y.x if scaled else d_y, wo_t, wo_t)
    dy = d_y.rows(first, last) if scaled else d_y[first:last]
    # read through the index by the fused product and a float a's dwo ([n, f, d]) only
    if scaled and not (fused and experts.bo is None and not experts.transposed and res.a_q is None):
        dy, scaled = dy.get(), False
    # down projection, and the activation's gradient: fused in the product's
    # epilogue where the weights are plain arrays (no [rows, f] array of d_a)
    dh = None       # [count, 2f]: dh0 and dh1 side by side, where the fused product writes them
    if fused:
        dh = _buffer((count, 2 * f), hd)
        dh0, dh1 = dh[:, :f], dh[:, f:]
        gw.gated_grad_rows(dy.x if scaled else dy, wo_t, bounds, res.h0, res.h1, dh0, dh1, experts.activation,
                           experts.limit, experts.alpha, rows=dy.index if scaled else None,
                           row_scale=dy.scale if scaled else None)
    else:
        da = _buffer((count, f), hd)
        if count and f:
            gw.rows(dy, wo_t, bounds, da)
        dh0, dh1 = gw.gated_act_grad(res.h0, res.h1, da, experts.activation, experts.limit, experts.alpha)
    a_read = res.a if res.a_q is None else values(res.a_q)     # what the forward multiplied
    if scaled:
        dwo = gw.contract(a_read.T, dy.x, bounds, _buffer((n, f, d), hd), rhs_rows=dy.index, rhs_row_scale=dy.scale)
    else:
        dwo = _weight_grad(a_read.T, dy, bounds, n, experts.transposed, hd)
    dbo = _segment_sum(dy, bounds, n) if experts.bo is not None else None
    # gate and up projections: d_xs = dh0 w0^T + dh1 w1^T
    w0_t, w1_t = _transposed(experts.w0), _transposed(experts.w1)
    if combine is not None and sums_rows(experts, dh0, w0_t, w1_t):
        tokens, slot_of = combine
        d_xs = np.zeros((slot_of.shape[0], d), dtype=ct)
        if count and f:
            gw.combine_rows(dh0, w0_t, bounds, d_xs, tokens[first:last], None, None, ct, lhs1=dh1, w1=w1_t)
    else:
        d_xs = _held_rows(res.xs.shape[0], d, ct, first, last, count and f)
        if count and f:
            gw.rows(dh0, w0_t, bounds, d_xs[first:last])
            gw.rows(dh1, w1_t, bounds, d_xs[first:last], accumulate=True)
        if combine is not None:
            d_xs = gw.gather_reduce(d_xs, combine[1], ordered=True)
    xs = held(res.xs, first, last) if res.xs_q is None else values(res.xs_q)
    db0 = _segment_sum(dh0, bounds, n) if experts.b0 is not None else None
    db1 = _segment_sum(dh1, bounds, n) if experts.b1 is not None else None
    if experts.gate_up is None:
        dw0 = _rows_grad(xs, dh0, bounds, n, experts.transposed, hd)
        dw1 = _rows_grad(xs, dh1, bounds, n, experts.transposed, hd)
        return d_xs, ExpertGrads(dw0, dw1, dwo, db0, db1, dbo)
    # fused: both gradients written through the views the forward read; with
    # gate and up concatenated, in one pass over the rows (xs packed once for
    # both: each column's sum is the one the two products take)
    shape = (n, 2 * f, d) if experts.transposed else (n, d, 2 * f)
    dw = _buffer(shape, hd)
    if dh is not None and experts.gate_up == "concat":
        _rows_grad(xs, dh, bounds, n, experts.transposed, hd, out=dw)
    else:
        for dh_half, view in zip((dh0, dh1), split_gate_up(dw, 1 if experts.transposed else 2, experts.gate_up)):
            _rows_grad(xs, dh_half, bounds, n, experts.transposed, hd, out=view)
    db = None
    if db0 is not None:
        db = np.empty((n, 2 * f), dtype=ct)
        g0, g1 = split_gate_up(db, 1, experts.gate_up)
        g0[...], g1[...] = db0, db1
    return d_xs, ExpertGrads(dw, None, dwo, db, None, dbo)


def jvp(experts, res, t_xs=None, t_w0=None, t_w1=None, t_wo=None):
    """Forward-mode derivative of :func:`forward` (see the module
    docstring) along ``t_xs [N, d]`` and the held experts' weight tangents
    ``t_w0, t_w1 [n, d, f]``, ``t_wo [n, f, d]`` (the views the forward
    reads; compute dtype; None for zero). Returns ``t_y [N, d]`` in the
    compute dtype (rows outside the held experts' are 0), or None when
    every tangent is None."""
    if t_xs is None and t_w0 is None and t_w1 is None and t_wo is None:
        return None
    bounds, first = res.bounds, res.first
    count = res.h0.shape[0]
    last = first + count
    f, d = experts.w0.shape[2], experts.wo.shape[2]
    ct = gw.compute_dtype(res.h0.dtype)
    t_y = np.zeros((res.xs.shape[0], d), dtype=ct)
    if not count:
        return t_y
    xs = held(res.xs, first, last) if res.xs_q is None else values(res.xs_q)   # what the forward multiplied
    if isinstance(xs, Gathered):    # (the tangent products take the rows as an array)
        xs = xs.x[xs.index]
    t_rows = None if t_xs is None else t_xs[first:last]

    def product(lhs, w, t_lhs, t_w, cols):
        """t_lhs @ w[l] + lhs @ t_w[l] over the groups, [count, cols]."""
        out = np.zeros((count, cols), dtype=ct)
        if cols and t_lhs is not None:
            rows_product(t_lhs, w, bounds, out)
        if cols and t_w is not None:
            gw.rows(lhs, t_w, bounds, out, accumulate=True)
        return out

    t_h0 = product(xs, experts.w0, t_rows, t_w0, f)
    t_h1 = product(xs, experts.w1, t_rows, t_w1, f)
    h0, h1 = (np.asarray(h, dtype=ct) for h in (res.h0, res.h1))
    da_dh0, da_dh1 = gw.gated_act_grad(h0, h1, np.ones_like(h0), experts.activation, experts.limit,
                                       experts.alpha)
    t_a = da_dh0 * t_h0 + da_dh1 * t_h1
    a = res.a if res.a_q is None else values(res.a_q)
    t_y[first:last] = product(a, experts.wo, t_a, t_wo, d)
    return t_y

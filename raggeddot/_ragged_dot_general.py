"""ragged_dot_general: jax.lax.ragged_dot_general's three modes on the C
kernels, and their derivative rules.

Every mode is mapped onto the gateway's ``rows`` or ``contract`` kernels by
permuting and reshaping views of the operands (the kernels read any strides):
no dense group masks and no per-group copies. A reshape copies only when the
operand's memory layout cannot be viewed with the merged dimensions.
"""
import dataclasses
import math
import operator

import numpy as np

from . import _autodiff
from . import _gateway as gw
from . import _operand
from . import _precision
from . import _validate as v
from ._prepack import PackedRhs
from ._ragged_dot import _ragged_dot
from .quant import QArray

__all__ = ["RaggedDotDimensionNumbers", "ragged_dot_general"]

_FN = "ragged_dot_general"


def _int_tuple(dims, name):
    """`dims` (any sequence of integers) as a tuple of Python ints."""
    if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
        raise TypeError(f"RaggedDotDimensionNumbers: '{name}' must be a sequence of ints, got {dims!r}")
    try:
        return tuple(operator.index(d) for d in dims)
    except TypeError:
        raise TypeError(f"RaggedDotDimensionNumbers: '{name}' must be a sequence of ints, got {dims!r}") from None


def _pair(value, name):
    try:
        first, second = value
    except (TypeError, ValueError):
        raise TypeError(
            f"RaggedDotDimensionNumbers: '{name}' must be a pair (lhs dims, rhs dims), got {value!r}"
        ) from None
    return first, second


@dataclasses.dataclass(frozen=True)
class RaggedDotDimensionNumbers:
    """Dimension numbers of ragged_dot_general, as ``jax.lax.RaggedDotDimensionNumbers``.

    Attributes:
      dot_dimension_numbers: ``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))``.
      lhs_ragged_dimensions: the lhs ragged dimension, ``(r,)`` (exactly one).
      rhs_group_dimensions: ``(d,)`` in the ragged non-contracting mode, ``()`` otherwise.

    Any sequences of integers are accepted and stored as tuples of ints.
    """
    dot_dimension_numbers: tuple
    lhs_ragged_dimensions: tuple
    rhs_group_dimensions: tuple

    def __post_init__(self):
        contract, batch = _pair(self.dot_dimension_numbers, "dot_dimension_numbers")
        lc, rc = _pair(contract, "dot_dimension_numbers[0]")
        lb, rb = _pair(batch, "dot_dimension_numbers[1]")
        dnums = ((_int_tuple(lc, "lhs contracting dimensions"), _int_tuple(rc, "rhs contracting dimensions")),
                 (_int_tuple(lb, "lhs batch dimensions"), _int_tuple(rb, "rhs batch dimensions")))
        object.__setattr__(self, "dot_dimension_numbers", dnums)
        object.__setattr__(self, "lhs_ragged_dimensions",
                           _int_tuple(self.lhs_ragged_dimensions, "lhs_ragged_dimensions"))
        object.__setattr__(self, "rhs_group_dimensions",
                           _int_tuple(self.rhs_group_dimensions, "rhs_group_dimensions"))


def _dimension_numbers(dnums):
    """Our RaggedDotDimensionNumbers from ours or any object with the same
    three attributes (jax's among them)."""
    if isinstance(dnums, RaggedDotDimensionNumbers):
        return dnums
    names = ("dot_dimension_numbers", "lhs_ragged_dimensions", "rhs_group_dimensions")
    if not all(hasattr(dnums, a) for a in names):
        raise TypeError(
            f"{_FN}: 'ragged_dot_dimension_numbers' must be a RaggedDotDimensionNumbers (or an object "
            f"with attributes {', '.join(names)}), got {type(dnums).__name__}"
        )
    return RaggedDotDimensionNumbers(*(getattr(dnums, a) for a in names))


def _size(shape):
    return math.prod(shape)


def _view(arr, shape):
    """`arr` reshaped to `shape` without copying, or None when that needs a copy."""
    try:
        return np.reshape(arr, shape, copy=False)
    except ValueError:
        return None
    except TypeError:  # numpy < 2.1 has no copy argument
        out = arr.view()
        try:
            out.shape = shape
        except AttributeError:
            return None
        return out


def _offsets(gs):
    """[..., g + 1] group start offsets along the last axis: 0, cumsum(gs)."""
    out = np.zeros(gs.shape[:-1] + (gs.shape[-1] + 1,), dtype=np.int64)
    np.cumsum(gs, axis=-1, out=out[..., 1:])
    return out


def ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, precision=None,
                       preferred_element_type=None, group_offset=None):
    """Ragged dot with general dimension numbers, as ``jax.lax.ragged_dot_general``.

    ``lhs`` has exactly one ragged dimension ``r`` (``lhs_ragged_dimensions``);
    ``group_sizes[..., i]`` consecutive positions along it form group ``i`` and
    positions past ``sum(group_sizes)`` belong to no group. Writing ``b`` for the
    batch dims, ``m`` for lhs's other dims, ``k`` for the contracting dims and
    ``n`` for rhs's other dims, the kind of dimension ``r`` picks the mode:

    1. ragged non-contracting (``r`` among ``m``; the MoE forward)::

           [b..., m..., k...] x [g, b..., k..., n...] -> [b..., m..., n...]

       rhs has exactly one group dimension (not batch, not contracting) of
       size g; a position of ``r`` in group i is multiplied by rhs's group i.
       Positions in no group give exact zeros.
    2. ragged contracting (``r`` among ``k``; the weight gradient, "tgmm")::

           [b..., m..., k...] x [b..., k..., n...] -> [g, b..., m..., n...]

       rhs has no group dimension; ``out[i]`` contracts only the positions of
       group i (all of the other contracting dims). Empty groups give zeros.
    3. ragged batch (``r`` among ``b``)::

           [b..., m..., k...] x [b..., k..., n...] -> [b..., m..., n...]

       a plain batched dot; group_sizes is validated but does not change the
       result.

    The output dims are ordered as jax orders them: (g,) in mode 2, then the
    batch dims (in the order listed), lhs's free dims, rhs's free dims (both in
    increasing dimension order).

    Args:
      lhs, rhs: float arrays (float16, bfloat16, float32 or float64), or
        :class:`~raggeddot.QArray` s read as their dequantized values (views
        of a QArray copy at most its scales, never dequantized values).
      group_sizes: integers, non-negative, shape ``[g]`` (the same groups
        everywhere) or ``lhs.shape[prefix] + (g,)``, where the prefix dims are
        the batch dims (listed order) followed by the lhs dims of r's kind outer
        to r: free dims before r (mode 1, increasing order), contracting dims
        listed before r (mode 2), or the batch dims listed before r (mode 3,
        then without the batch dims themselves). Each row must sum to at most
        ``lhs.shape[r]``.
      ragged_dot_dimension_numbers: a ``RaggedDotDimensionNumbers`` (this
        module's or jax's).
      precision: as for ``ragged_dot`` (jax's values and meanings; a
        refused one raises before anything runs).
      preferred_element_type: dtype of the result; default is the promoted
        type of lhs and rhs.
      group_offset: mode 1 only, megablox's meaning as in ``ragged_dot``: rhs's
        group dimension holds groups ``[group_offset, group_offset + size)`` of
        the g groups; positions of other groups are 0. NotImplementedError in
        modes 2 and 3 (jax raises it in every mode).

    Returns:
      The result, accumulated in float32 (float64 when an input or the output
      is float64) and cast once at the end.
    """
    dn = _dimension_numbers(ragged_dot_dimension_numbers)
    if isinstance(rhs, PackedRhs):
        return _packed(lhs, rhs, group_sizes, dn, precision, preferred_element_type, group_offset)
    lhs, rhs, lt, rt, _ = _operand.operands(lhs, rhs, _FN)
    out_dtype = v.output_dtype(preferred_element_type, v.promote(lt, rt), _FN)
    ct = gw.compute_dtype(lt, rt, out_dtype)
    algo = _precision.resolve(precision, lt, rt, ct, _FN)

    lb, rb, lc, rc, lf, rf, r, groups = v.ragged_dimensions(dn, lhs.shape, rhs.shape, _FN)

    # Half-precision operands stay as they are (the packing converts them
    # value by value); a dtype the packing does not read is converted before
    # the modes reshape it, so that a reshape that must copy copies once; a
    # QArray's views (transposes, merged axes, slices) are taken of its
    # one-byte values and its scales alike
    lhs = lhs if isinstance(lhs, QArray) else gw.operand(lhs, ct, gw.PACKED)
    rhs = rhs if isinstance(rhs, QArray) else gw.operand(rhs, ct, gw.PACKED)
    with v.memory_for(_FN, "the operands' reshaped copies or the kernels' packed panels"):
        if r in lf:
            out = _noncontracting(lhs, rhs, ct, group_sizes, lb, rb, lc, rc, lf, rf, r, groups[0],
                                  group_offset, algo)
        elif r in lc:
            out = _contracting(lhs, rhs, ct, group_sizes, lb, rb, lc, rc, lf, rf, r, group_offset, algo)
        else:
            out = _batch(lhs, rhs, ct, group_sizes, lb, rb, lc, rc, lf, rf, r, group_offset, algo)
    with v.memory_for(_FN, f"the result in {out_dtype}"):
        return out if out.dtype == out_dtype else out.astype(out_dtype)


def _packed(lhs, rhs, group_sizes, dn, precision, preferred_element_type, group_offset):
    """A prepacked rhs ``[g, k, n]``: the dimension numbers of ragged_dot
    (lhs ``[m, k]`` ragged along m, rhs group dimension 0, contraction k),
    which is what the layout serves; anything else is refused."""
    if dn.dot_dimension_numbers != (((1,), (1,)), ((), ())) or tuple(dn.lhs_ragged_dimensions) != (0,) \
            or tuple(dn.rhs_group_dimensions) != (0,):
        raise ValueError(
            f"{_FN}: a prepacked 'rhs' (PackedRhs, shape {rhs.shape}) is [g, k, n] for ragged_dot's "
            "dimension numbers only (dot_dimension_numbers=(([1], [1]), ([], [])), "
            f"lhs_ragged_dimensions=[0], rhs_group_dimensions=[0]); got {dn}. {v.PACKED_TAKEN[0].upper()}"
            f"{v.PACKED_TAKEN[1:]}: for other dimension numbers pass the plain weights, "
            "'rhs'.unpack()")
    return _ragged_dot(lhs, rhs, group_sizes, precision, preferred_element_type, group_offset, None, _FN)


def _shape(arr, dims):
    return tuple(arr.shape[d] for d in dims)


def _noncontracting(lhs, rhs, ct, group_sizes, lb, rb, lc, rc, lf, rf, r, rg, group_offset, algo):
    """Mode 1: one ragged_rows call per batch x outer-free index.

    lhs -> [B..., X..., R*I, K] (X, I: the free dims before / after r), rhs ->
    [g, B..., K, N], out -> [B..., X..., R*I, N]; group bounds scale by I.
    """
    p = lf.index(r)
    prefix_dims = lb + lf[:p]
    prefix_shape = _shape(lhs, prefix_dims)
    ragged_size = lhs.shape[r]
    inner = _size(_shape(lhs, lf[p + 1:]))
    gs = v.prefixed_group_sizes(group_sizes, _FN, prefix_shape, f"batch + free dims before {r}: {list(prefix_dims)}",
                      ragged_size, r)
    g = gs.shape[-1]
    local = rhs.shape[rg]
    start = v.local_group_start(group_offset, g, local, _FN, local_doc=f"rhs.shape[{rg}]")

    b_shape = _shape(lhs, lb)
    k_size = _size(_shape(lhs, lc))
    n_shape = _shape(rhs, rf)
    n_size = _size(n_shape)
    rows = ragged_size * inner
    with v.memory_for(_FN, "the result (ragged non-contracting mode)"):
        out = np.empty(prefix_shape + _shape(lhs, lf[p:]) + n_shape, dtype=ct)
    if out.size == 0:
        return out
    out3 = out.reshape(prefix_shape + (rows, n_size))
    lhs3 = lhs.transpose(prefix_dims + lf[p:] + lc).reshape(prefix_shape + (rows, k_size))
    rhs3 = rhs.transpose((rg,) + rb + rc + rf).reshape((local,) + b_shape + (k_size, n_size))
    bounds = np.broadcast_to(_offsets(gs)[..., start:start + local + 1] * inner, prefix_shape + (local + 1,))
    for idx in np.ndindex(*prefix_shape):
        o = out3[idx]
        bd = np.ascontiguousarray(bounds[idx])
        first, last = int(bd[0]), int(bd[-1])
        o[:first] = 0
        o[last:] = 0
        gw.rows(lhs3[idx], rhs3[(slice(None),) + idx[:len(lb)]], bd, o, algo=algo)
    return out


def _contracting(lhs, rhs, ct, group_sizes, lb, rb, lc, rc, lf, rf, r, group_offset, algo):
    """Mode 2: one ragged_contract call per batch x varying-outer-contracting index.

    The contracting dims along which group_sizes varies (V, listed before r)
    are looped over with accumulate=True; all others are flattened behind r,
    so group i is the contiguous range [start_i * W, end_i * W) with W the
    product of their sizes. lhs -> [B..., V..., M, R*W], rhs -> [B..., V...,
    R*W, N], out[:, b] -> [g, M, N].
    """
    if group_offset is not None:
        raise NotImplementedError(
            f"{_FN}: 'group_offset' is implemented only for a ragged non-contracting dimension "
            "(jax implements it in no mode)"
        )
    p = lc.index(r)
    prefix_dims = lb + lc[:p]
    prefix_shape = _shape(lhs, prefix_dims)
    ragged_size = lhs.shape[r]
    gs = v.prefixed_group_sizes(group_sizes, _FN, prefix_shape,
                      f"batch + contracting dims listed before {r}: {list(prefix_dims)}", ragged_size, r)
    g = gs.shape[-1]
    nb = len(lb)
    b_shape = _shape(lhs, lb)
    m_shape = _shape(lhs, lf)
    n_shape = _shape(rhs, rf)
    with v.memory_for(_FN, "the result [g, batch..., m..., n...] (ragged contracting mode)"):
        out = np.empty((g,) + b_shape + m_shape + n_shape, dtype=ct)
    if out.size == 0:
        return out
    if _size(_shape(lhs, lc)) == 0:
        out[...] = 0
        return out

    # Outer contracting positions (of lc) along which group_sizes really varies.
    varying = []
    if gs.ndim > 1:
        for j in range(p):
            axis = nb + j
            if gs.shape[axis] > 1 and not (gs == gs.take([0], axis=axis)).all():
                varying.append(j)
    rest = [j for j in range(len(lc)) if j != p and j not in varying]
    l_v = tuple(lc[j] for j in varying)
    r_v = tuple(rc[j] for j in varying)
    l_w = (r,) + tuple(lc[j] for j in rest)
    r_w = (rc[p],) + tuple(rc[j] for j in rest)
    v_shape = _shape(lhs, l_v)
    w_size = _size(_shape(lhs, l_w[1:]))
    rows = ragged_size * w_size
    m_size, n_size = _size(m_shape), _size(n_shape)

    lhs4 = lhs.transpose(lb + l_v + lf + l_w).reshape(b_shape + v_shape + (m_size, rows))
    rhs4 = rhs.transpose(rb + r_v + r_w + rf).reshape(b_shape + v_shape + (rows, n_size))
    out4 = out.reshape((g,) + b_shape + (m_size, n_size))
    offsets = _offsets(gs)
    if gs.ndim > 1:  # keep the batch and varying axes, take index 0 of the constant ones
        keep = set(range(nb)) | {nb + j for j in varying}
        offsets = offsets[tuple(slice(None) if a in keep else 0 for a in range(gs.ndim - 1))]
    bounds = np.broadcast_to(offsets * w_size, b_shape + v_shape + (g + 1,))
    for bi in np.ndindex(*b_shape):
        o = out4[(slice(None),) + bi]
        for j, vi in enumerate(np.ndindex(*v_shape)):
            idx = bi + vi
            gw.contract(lhs4[idx], rhs4[idx], np.ascontiguousarray(bounds[idx]), o, accumulate=j > 0,
                        algo=algo)
    return out


def _batch(lhs, rhs, ct, group_sizes, lb, rb, lc, rc, lf, rf, r, group_offset, algo):
    """Mode 3: a batched dot. One ragged_rows call whose groups are the batch
    elements (lhs -> [B*M, K], rhs -> [B, K, N], bounds [0, M, 2M, ...]) when
    lhs can be viewed that way, else one single-group call per batch element.
    """
    if group_offset is not None:
        raise NotImplementedError(
            f"{_FN}: 'group_offset' is implemented only for a ragged non-contracting dimension "
            "(jax implements it in no mode)"
        )
    q = lb.index(r)
    prefix_dims = lb[:q]
    v.prefixed_group_sizes(group_sizes, _FN, _shape(lhs, prefix_dims), f"batch dims listed before {r}: {list(prefix_dims)}",
                 lhs.shape[r], r)
    b_shape = _shape(lhs, lb)
    m_shape = _shape(lhs, lf)
    n_shape = _shape(rhs, rf)
    b_size, m_size = _size(b_shape), _size(m_shape)
    k_size, n_size = _size(_shape(lhs, lc)), _size(n_shape)
    with v.memory_for(_FN, "the result (ragged batch mode)"):
        out = np.empty(b_shape + m_shape + n_shape, dtype=ct)
    if out.size == 0:
        return out
    lhs_t = lhs.transpose(lb + lf + lc)
    rhs3 = rhs.transpose(rb + rc + rf).reshape((b_size, k_size, n_size))
    lhs2 = lhs_t.reshape(b_size * m_size, k_size) if isinstance(lhs_t, QArray) else _view(lhs_t, (b_size * m_size, k_size))
    if lhs2 is not None:
        bounds = np.arange(b_size + 1, dtype=np.int64) * m_size
        gw.rows(lhs2, rhs3, bounds, out.reshape(b_size * m_size, n_size), algo=algo)
        return out
    lhs3 = lhs_t.reshape(b_shape + (m_size, k_size))
    out3 = out.reshape(b_shape + (m_size, n_size))
    bounds = np.array([0, m_size], dtype=np.int64)
    for i, bi in enumerate(np.ndindex(*b_shape)):
        gw.rows(lhs3[bi], rhs3[i:i + 1], bounds, out3[bi], algo=algo)
    return out


# ---------------------------------------------------------------------------
# Derivative rules, all three modes
# ---------------------------------------------------------------------------
# Each operand is first viewed (a free transpose) in a canonical layout:
#   L = lhs as [B, F, K]       B: batch dims (listed order), F: lhs free dims
#                              (ascending), K: contracting dims (listed order)
#   R = rhs as [(G,) B, K, N]  G: the group dim (mode 1 only), N: rhs free dims
# The output layout ([B, F, N], or [g, B, F, N] in mode 2) is the same for the
# canonical and the original operands, and so is group_sizes' prefix (B, then
# the F or K dims before the ragged one, in these orders). Each gradient is one
# ragged_dot_general on canonical operands, transposed back:
#   mode 1 (ragged F, rhs [g, B, K, N], ct [B, F, N]):
#     dL [B,F,K] = rdg(ct, R)  contract N, batch B, ragged F (mode 1, rhs group 0)
#     dR [g,B,K,N] = rdg(L, ct) contract F, batch B, ragged F (mode 2)
#   mode 2 (ragged K, rhs [B, K, N], ct [g, B, F, N]):
#     dL [B,K,F] = rdg(R, ct)  contract N, batch B, ragged K (mode 1, ct's group 0)
#     dR [B,K,N] = rdg(L, ct)  contract F, batch B, ragged K (mode 1, ct's group 0)
#   mode 3 (ragged B, a plain batched dot, ct [B, F, N]):
#     dL [B,F,K] = rdg(ct, R)  contract N, batch B, ragged B (mode 3)
#     dR [B,K,N] = rdg(L, ct)  contract F, batch B, ragged B (mode 3)
# group_offset (mode 1 only): dL passes it on; dR, a mode-2 product that takes
# no group_offset, contracts only the rows of the local groups: with [g] group
# sizes L and ct are sliced to those rows; with per-prefix sizes one leading
# pseudo-group takes the rows before them and is dropped.


def _rdg_layout(dn, lhs_ndim, rhs_ndim):
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    lc, rc, lb, rb = ([int(d) for d in x] for x in (lc, rc, lb, rb))
    r = int(list(dn.lhs_ragged_dimensions)[0])
    rg = [int(d) for d in dn.rhs_group_dimensions]
    lf = [d for d in range(lhs_ndim) if d not in lc and d not in lb]
    rn = [d for d in range(rhs_ndim) if d not in rc and d not in rb and d not in rg]
    if r in lf:
        mode, pos = 1, lf.index(r)
    elif r in lc:
        mode, pos = 2, lc.index(r)
    else:
        mode, pos = 3, lb.index(r)
    return dict(mode=mode, pos=pos, lperm=lb + lf + lc, rperm=rg + rb + rc + rn,
                nb=len(lb), nf=len(lf), nc=len(lc), nn=len(rn))


def _rng(a, b):
    return list(range(a, b))


def _rdg_vjp(a, wanted):
    rdg, DN = ragged_dot_general, RaggedDotDimensionNumbers
    lhs, rhs = _autodiff.operand(a["lhs"]), _autodiff.operand(a["rhs"])
    if isinstance(rhs, PackedRhs):   # the derivatives need the weights transposed
        rhs = rhs.unpack()
    gs = np.asarray(a["group_sizes"])
    dn = a["ragged_dot_dimension_numbers"]
    off = a.get("group_offset")
    extra = {k: val for k, val in a.items()
             if k not in ("lhs", "rhs", "group_sizes", "ragged_dot_dimension_numbers",
                          "preferred_element_type")}
    out = rdg(lhs, rhs, gs, dn, preferred_element_type=a["preferred_element_type"], **extra)
    cdt = gw.compute_dtype(lhs.dtype, rhs.dtype, out.dtype)
    lay = _rdg_layout(dn, lhs.ndim, rhs.ndim)
    L, R = lhs.transpose(lay["lperm"]), rhs.transpose(lay["rperm"])
    mode, p, nb, nf, nc, nn = (lay[x] for x in ("mode", "pos", "nb", "nf", "nc", "nn"))
    B = _rng(0, nb)
    precision = a.get("precision")

    def call(x, y, contract, batch, ragged, group, sizes=gs, group_offset=None):
        d = DN(dot_dimension_numbers=(contract, batch), lhs_ragged_dimensions=[ragged],
               rhs_group_dimensions=group)
        kw = {} if group_offset is None else {"group_offset": group_offset}
        return rdg(x, y, sizes, d, precision=precision, preferred_element_type=cdt, **kw)

    def mode1_drhs(ct):
        """[g_local, B, K, N]: a ragged contracting product over the local groups."""
        contract, batch, ragged = (_rng(nb, nb + nf), _rng(nb, nb + nf)), (B, B), nb + p
        if off is None:
            return call(L, ct, contract, batch, ragged, [])
        start, local = v.index(off, "group_offset", "ragged_dot_general"), R.shape[0]
        if gs.ndim == 1:  # the local groups are one range of the ragged dim: slice it
            ends = np.concatenate([[0], np.cumsum(gs.astype(np.int64))])
            rows = [slice(None)] * L.ndim
            rows[ragged] = slice(int(ends[start]), int(ends[start + local]))
            return call(L[tuple(rows)], ct[tuple(rows)], contract, batch, ragged, [],
                        sizes=gs[start:start + local])
        # group_sizes varies with the prefix: one leading pseudo-group for the
        # rows before the local groups, dropped; rows after belong to no group.
        lead = gs[..., :start].astype(np.int64).sum(axis=-1, keepdims=True)
        sizes = np.concatenate([lead, gs[..., start:start + local].astype(np.int64)], axis=-1)
        return call(L, ct, contract, batch, ragged, [], sizes=sizes)[1:]

    def backward(ct):
        ct = ct.astype(cdt, copy=False)
        grads = {}
        if "lhs" in wanted:
            if mode == 1:
                dL = call(ct, R, (_rng(nb + nf, nb + nf + nn), _rng(1 + nb + nc, 1 + nb + nc + nn)),
                          (B, _rng(1, 1 + nb)), nb + p, [0], group_offset=off)
            elif mode == 2:
                dL = call(R, ct, (_rng(nb + nc, nb + nc + nn), _rng(1 + nb + nf, 1 + nb + nf + nn)),
                          (B, _rng(1, 1 + nb)), nb + p, [0])          # [B, K, F]
                dL = dL.transpose(B + _rng(nb + nc, nb + nc + nf) + _rng(nb, nb + nc))
            else:
                dL = call(ct, R, (_rng(nb + nf, nb + nf + nn), _rng(nb + nc, nb + nc + nn)),
                          (B, B), p, [])
            grads["lhs"] = dL.transpose(np.argsort(lay["lperm"]))
        if "rhs" in wanted:
            if mode == 1:
                dR = mode1_drhs(ct)
            elif mode == 2:
                dR = call(L, ct, (_rng(nb, nb + nf), _rng(1 + nb, 1 + nb + nf)),
                          (B, _rng(1, 1 + nb)), nb + nf + p, [0])
            else:
                dR = call(L, ct, (_rng(nb, nb + nf), _rng(nb, nb + nf)), (B, B), p, [])
            grads["rhs"] = dR.transpose(np.argsort(lay["rperm"]))
        return grads

    return out, backward


def _rdg_jvp(a, t):
    rdg = ragged_dot_general
    lhs, rhs, gs = _autodiff.operand(a["lhs"]), _autodiff.operand(a["rhs"]), a["group_sizes"]
    if isinstance(rhs, PackedRhs):
        rhs = rhs.unpack()
    dn = a["ragged_dot_dimension_numbers"]
    extra = {k: val for k, val in a.items()
             if k not in ("lhs", "rhs", "group_sizes", "ragged_dot_dimension_numbers",
                          "preferred_element_type")}
    out = rdg(lhs, rhs, gs, dn, preferred_element_type=a["preferred_element_type"], **extra)
    cdt = gw.compute_dtype(lhs.dtype, rhs.dtype, out.dtype)
    terms = []
    if t.get("lhs") is not None:
        terms.append(rdg(t["lhs"], rhs, gs, dn, preferred_element_type=cdt, **extra))
    if t.get("rhs") is not None:
        terms.append(rdg(lhs, t["rhs"], gs, dn, preferred_element_type=cdt, **extra))
    return out, _autodiff.sum_terms(terms, out)


_autodiff.defvjp(ragged_dot_general, _rdg_vjp, ("lhs", "rhs"))
_autodiff.defjvp(ragged_dot_general, _rdg_jvp, ("lhs", "rhs"), packed_argnames=("rhs",))

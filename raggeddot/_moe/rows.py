"""The experts' rows as the products read them: the product of rows and
weights (plain or prepacked), rows quantized per row by the kernels while
they pack them (:class:`Deferred`), and rows left ungathered, read through
an index while packed (:class:`Gathered`, :class:`ScaledRows`)."""
from typing import NamedTuple, Optional

import numpy as np

from .. import _gateway as gw
from .._prepack import PackedRhs, meet, quantizes_in_kernel
from ..quant import quantize, refuse_non_finite

__all__ = ["Deferred", "Gathered", "ScaledRows", "held", "kernels_quantize", "naming_rows", "quantized",
           "rows_product", "values"]


def rows_product(x, w, bounds, out, accumulate=False):
    """gw.rows, or gw.rows_packed for prepacked weights, on the layout that
    multiplies ``x`` as the plain weights would (``_prepack.meet``: made
    once and kept on the PackedRhs when it is not its own). ``x`` may be a
    :class:`Deferred` quantization, done by the kernels while they pack
    it."""
    deferred = isinstance(x, Deferred)
    lhs = x.rows if deferred else x
    with naming_rows(x):
        if isinstance(w, PackedRhs):
            lhs, w = meet(w, lhs, gw.kernel_dtype(out), "moe_block", "w0/w1/wo", quantize_lhs=deferred)
            if isinstance(w, PackedRhs):
                return gw.rows_packed(lhs, w, bounds, out, accumulate, quantize_lhs=deferred)
        return gw.rows(lhs, w, bounds, out, accumulate, quantize_lhs=deferred)


class naming_rows:
    """``with naming_rows(x):`` where the kernels quantize ``x`` (a
    :class:`Deferred`) and refuse its infinities and NaNs from the rows'
    scales (a ValueError that cannot name the call), the error that names
    moe_block and the first one. (A class: a generator's context manager
    costs a decode step's products a few microseconds each.)"""
    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None and issubclass(kind, ValueError) and isinstance(self.x, Deferred):
            refuse_non_finite(self.x.rows, self.x.qtype, "moe_block", QUANTIZED_ROWS)
        return False


class Deferred(NamedTuple):
    """Rows quantized per row to int8 by the kernels while they pack them
    (gw.rows(..., quantize_lhs=True)): no NumPy pass, no int8 copy. Its
    :meth:`get` makes the same QArray (bit for bit) when the backward or the
    jvp needs the values the products read."""
    rows: np.ndarray
    qtype: str

    def get(self):
        return quantize(self.rows, self.qtype, channelwise_axes=(0,))


QUANTIZED_ROWS = ("the experts' input rows (x, or the activations of the gate and up products), quantized "
                   "per row for activation_qtype,")


def quantized(rows, qtype, *weights):
    """``rows [r, d]`` quantized per row (one absmax scale a row), or None
    without activation quantization; a :class:`Deferred` when the kernels
    can quantize them while packing for every product with ``weights``
    (they refuse an infinity or a NaN from the rows' scales before writing
    anything, so no pass of their own checks the rows: :func:`rows_product` names
    them in the error)."""
    if qtype is None:
        return None
    if weights and all(kernels_quantize(rows, w, qtype) for w in weights):
        return Deferred(rows, qtype)
    refuse_non_finite(rows, qtype, "moe_block", QUANTIZED_ROWS)
    return quantize(rows, qtype, channelwise_axes=(0,))


def kernels_quantize(rows, w, qtype):
    """Whether the kernels quantize ``rows`` per row to ``qtype`` while they
    pack them for the product with ``w`` (a PackedRhs: as for the plain
    weights it holds)."""
    if isinstance(w, PackedRhs):
        return qtype in ("int8", np.int8) and quantizes_in_kernel(rows, w)
    return gw.quantizes_in_kernel(rows, w, qtype)


def values(q):
    """The QArray a product read (a deferred quantization made now)."""
    return q.get() if isinstance(q, Deferred) else q


#: dtype and shape ``[N, d]`` of rows ``x [T, d]`` read through ``index [N]`` (Gathered, ScaledRows)
_INDEXED_DTYPE = property(lambda self: self.x.dtype)
_INDEXED_SHAPE = property(lambda self: (self.index.shape[0], self.x.shape[1]))


class Gathered(NamedTuple):
    """The dispatched rows ``x[index]`` ``[N, d]`` left ungathered: the
    fused gate and up pass reads them through the index while it packs them
    (:func:`forward` with it needs :func:`fuses`)."""
    x: np.ndarray           # [T, d]
    index: np.ndarray       # [N] int64, the token of each slot
    dtype = _INDEXED_DTYPE
    shape = _INDEXED_SHAPE


class ScaledRows(NamedTuple):
    """The cotangent of the experts' outputs ``d_y [N, d]``, ``d_y[i] =
    scale[i] * x[index[i]]`` (the combine's backward: each slot's token's
    cotangent times its router weight; no scale: 1), left ungathered: the
    backward's first product and the down weights' gradient read it through
    the index while they pack it (:func:`backward`), with the bits of
    :meth:`get`."""
    x: np.ndarray                   # [T, d] of the compute dtype, contiguous rows
    index: np.ndarray               # [N] int64
    scale: Optional[np.ndarray]     # [N] of the compute dtype, or None
    dtype = _INDEXED_DTYPE
    shape = _INDEXED_SHAPE

    def rows(self, first, last):
        return ScaledRows(self.x, self.index[first:last], None if self.scale is None else self.scale[first:last])

    def get(self):
        return gw.gather_rows(self.x, self.index, self.scale)


def held(xs, first, last):
    """The held experts' rows ``[first, last)`` of ``xs`` (an array or a
    :class:`Gathered`)."""
    return Gathered(xs.x, xs.index[first:last]) if isinstance(xs, Gathered) else xs[first:last]

"""The operands of the grouped matmuls, brought into shape in one pass.

An operand comes as a float array-like, a :class:`~raggeddot.QArray`, an
:class:`~raggeddot.AsQArray` (a float array to quantize) or, as the weights
of ragged_dot, gmm and moe_block, a :class:`~raggeddot.PackedRhs`. The ops
hand theirs to this module and get back what the gateway's products take
(``_gateway.rows``, ``rows_packed``, ``contract``): an array, a QArray or a
PackedRhs, its rank checked, with the float dtype it contributes to the
result. The gateway converts them for the kernels once the compute dtype is
known (``_gateway.operand``).

Layering: this module reads the operand types (``quant``, ``_prepack``) and
the kernels' capabilities (``_gateway``); the checks of plain values
(``_validate``) are below all of them and know none of these types but
PackedRhs's base class.
"""
from typing import NamedTuple

import numpy as np

from . import _gateway as gw
from . import _validate as v
from ._prepack import PackedRhs, quantizes_in_kernel
from .quant import AsQArray, QArray, refuse_non_finite

__all__ = ["Operands", "operands", "operand", "dtype", "storage"]


class Operands(NamedTuple):
    """The two operands of a grouped matmul, checked.

    Attributes:
      lhs: an array or a QArray; with ``quantize_lhs``, the float32 or
        bfloat16 rows the kernels quantize to int8 per row while they pack
        them (an ``AsQArray(rows, "int8", channelwise_axes=(0,))`` given).
      rhs: an array, a QArray or (where taken) a PackedRhs.
      lhs_dtype, rhs_dtype: the float dtypes they contribute to the result
        (a QArray's: its dequantized dtype; a quantization left to the
        kernels: float32, the dtype of its scales).
      quantize_lhs: whether the kernels quantize lhs (``_gateway.rows``'s
        ``quantize_lhs``).
    """
    lhs: object
    rhs: object
    lhs_dtype: np.dtype
    rhs_dtype: np.dtype
    quantize_lhs: bool = False


def _rank(shape_doc):
    """The rank a shape note such as " [g, k, n]" names (None for none)."""
    return shape_doc.count(",") + 1 if shape_doc else None


def operand(x, name, fn, shape_doc="", packed=False):
    """The operand ``x`` (argument ``name`` of ``fn``), checked: a QArray as
    it is, an AsQArray quantized (now, once), a PackedRhs as it is where
    ``packed`` (it is taken as the weights), anything else as
    ``_validate.as_array`` makes it (which refuses a PackedRhs naming
    ``name``). ``shape_doc`` (e.g. " [m, k]") gives the rank required, none
    when empty; its float dtype is checked by :func:`dtype`."""
    if packed and isinstance(x, PackedRhs):
        return x
    if isinstance(x, AsQArray):
        _finite(x, v.as_array(x.array, name, fn), fn, name)
        x = x.quantize()
    ndim = _rank(shape_doc)
    if isinstance(x, QArray):
        if ndim is not None and x.ndim != ndim:
            raise ValueError(f"{fn}: expected {ndim}-D '{name}'{shape_doc} but got a {x.ndim}-D "
                             f"QArray of shape {x.shape}")
        return x
    return v.as_array(x, name, fn, ndim, shape_doc)


def dtype(x, name, fn):
    """The float dtype a checked operand contributes to the result: a QArray's
    dequantized dtype, a PackedRhs's weights', an array's own
    (``_validate.float_dtype``: TypeError naming ``name`` for another)."""
    if isinstance(x, (QArray, PackedRhs)):
        return x.dtype
    return v.float_dtype(x, name, fn)


def operands(lhs, rhs, fn, lhs_doc="", rhs_doc="", *, packed=False, transposed=False, in_kernel=False):
    """lhs and rhs of the grouped matmul ``fn``, checked, as :class:`Operands`.

    Args:
      lhs_doc, rhs_doc: their shapes as the messages name them (" [m, k]",
        " [g, k, n]"), which give the ranks required; empty for any rank.
      packed: rhs may be a PackedRhs, with an array or QArray lhs (the op
        then takes the layout for that lhs: ``_prepack.meet``).
      transposed: rhs is given transposed (gmm's ``transpose_rhs``), which a
        PackedRhs, laid out as ``[g, k, n]``, cannot be: ValueError.
      in_kernel: an lhs ``AsQArray(rows, "int8", channelwise_axes=(0,))`` of
        float32 or bfloat16 rows is left to the kernels to quantize while they
        pack it, where they can for this rhs (``_gateway.quantizes_in_kernel``),
        the product then that of the QArray quantize() would make, bit for
        bit; any other AsQArray is quantized here. The kernels refuse rows
        holding an infinity or a NaN (from the rows' scales, before they
        write anything): the caller names that refusal
        (:func:`refuse_lhs_non_finite`); no pass over the rows here.

    The checks run in this order: the ranks of lhs then rhs, the float
    dtypes of lhs then rhs.
    """
    rows = None
    if in_kernel and _per_row_int8(lhs):
        rows = v.as_array(lhs.array, "lhs", fn, _rank(lhs_doc), lhs_doc)
    else:
        lhs = operand(lhs, "lhs", fn, lhs_doc)
    rhs = operand(rhs, "rhs", fn, rhs_doc, packed)
    if isinstance(rhs, PackedRhs) and transposed:
        raise ValueError(f"{fn}: a prepacked 'rhs' is already [g, k, n] (give transpose_rhs to "
                         f"prepack, not to {fn}); got transpose_rhs=True")
    if rows is not None:
        in_k = quantizes_in_kernel(rows, rhs) if isinstance(rhs, PackedRhs) else \
            gw.quantizes_in_kernel(rows, rhs, "int8")
        if in_k:
            return Operands(rows, rhs, gw.compute_dtype(rows.dtype), dtype(rhs, "rhs", fn), True)
        lhs = operand(lhs, "lhs", fn, lhs_doc)
    if isinstance(rhs, PackedRhs):
        if not isinstance(lhs, (np.ndarray, QArray)):
            raise TypeError(f"{fn}: a prepacked 'rhs' takes an array or QArray 'lhs', got {type(lhs).__name__}")
    return Operands(lhs, rhs, dtype(lhs, "lhs", fn), dtype(rhs, "rhs", fn))


def _finite(asq, arr, fn, name):
    """An AsQArray's float array ``arr``, to be quantized, holds no infinity
    or NaN (``quant.refuse_non_finite``: ValueError naming ``fn`` and
    ``name``), whether the kernels or quantize() quantize it."""
    if arr.dtype.kind == "f" or v.is_bfloat16(arr.dtype):
        qtype = asq.qtype if isinstance(asq.qtype, str) else getattr(np.dtype(asq.qtype), "name", asq.qtype)
        refuse_non_finite(arr, qtype, fn, _quantized_by_the_call(name))


def product_rows(lhs, rhs, bounds, res, algo, quantize_lhs, fn):
    """The grouped product of ragged_dot and gmm into ``res``: gw.rows_packed
    (a PackedRhs ``rhs``) or gw.rows; the kernels' refusal of a non-finite
    row they quantize (``quantize_lhs``) named (:func:`refuse_lhs_non_finite`)."""
    try:
        if isinstance(rhs, PackedRhs):
            gw.rows_packed(lhs, rhs, bounds, res, quantize_lhs=quantize_lhs)
        else:
            gw.rows(lhs, rhs, bounds, res, algo=algo, quantize_lhs=quantize_lhs)
    except ValueError:
        if quantize_lhs:
            refuse_lhs_non_finite(lhs, fn)
        raise


def refuse_lhs_non_finite(rows, fn):
    """Where the kernels refused to quantize ``rows`` (:func:`operands`'
    in-kernel lhs), the ValueError that names ``fn`` and the first
    non-finite value; returns when the rows are all finite."""
    refuse_non_finite(rows, "int8", fn, _quantized_by_the_call("lhs"))


def _quantized_by_the_call(name):
    """How the refusals of non-finite values name an AsQArray argument."""
    return f"'{name}' (an AsQArray, which the call quantizes)"


def _per_row_int8(x):
    """An AsQArray asking for int8, one absmax scale per row of a 2-D array:
    the quantization the int8 dot-product kernels can do while packing."""
    if not isinstance(x, AsQArray) or x.calibration_method != "absmax" or x.tiled_axes:
        return False
    try:
        qtype = np.dtype(x.qtype).name if not isinstance(x.qtype, str) else x.qtype
        axes = (x.channelwise_axes,) if isinstance(x.channelwise_axes, (int, np.integer)) else tuple(x.channelwise_axes)
    except TypeError:
        return False
    return qtype == "int8" and getattr(x.array, "ndim", 0) == 2 and len(axes) == 1 and axes[0] in (0, -2)


def storage(x):
    """The array holding a checked operand's stored values (a QArray's
    qvalue, a PackedRhs's panels), for the checks that an output shares no
    memory with it."""
    if isinstance(x, QArray):
        return getattr(x.qvalue, "codes", x.qvalue)   # a PackedFloat4's bytes
    if isinstance(x, PackedRhs):
        return x._buf
    return x

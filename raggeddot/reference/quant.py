"""The oracle of quantized operands: a QArray stands for its dequantized value.

Any object with the attributes ``qvalue``, ``scale`` and ``zero_point`` (qwix's
``QArray``, raggeddot's) is read as::

    x = (qvalue - zero_point) * scale repeated over each tile,
    tile = qvalue.shape // scale.shape   (per axis)

(4-bit values, float4_e2m1fn, and float8_e8m0fnu scales read through
ml_dtypes; raggeddot's packed 4-bit values through their ``__array__``)

in float64, and the reference ops multiply that: the result of a product of
quantized operands is the float product of the dequantized ones. Its dtype is
the one the op would give for operands of the scales' dtype.  NumPy only.
"""

import numpy as np

__all__ = ["dequantize", "is_quantized"]


def is_quantized(x):
    return all(hasattr(x, a) for a in ("qvalue", "scale", "zero_point"))


def dequantize(q):
    """``(qvalue - zero_point) * scale`` per tile, as a float64 array."""
    qvalue, scale = np.asarray(q.qvalue), np.asarray(q.scale)
    if scale.ndim != qvalue.ndim:
        raise ValueError(f"scale has {scale.ndim} dims, qvalue {qvalue.ndim}.")
    x = qvalue.astype(np.float64)
    s = scale.astype(np.float64)
    z = None if q.zero_point is None else np.asarray(q.zero_point).astype(np.float64)
    for axis, (n, k) in enumerate(zip(qvalue.shape, scale.shape)):
        if n == 0:
            return np.zeros(qvalue.shape)
        if k == 0 or n % k:
            raise ValueError(f"scale dim {k} does not divide qvalue dim {n} on axis {axis}.")
        s = np.repeat(s, n // k, axis=axis)
        if z is not None:
            z = np.repeat(z, n // k, axis=axis)
    if z is not None:
        x = x - z
    return x * s


def _dtype(q):
    """The dtype a quantized operand stands for: its ``dtype`` where it has
    one (raggeddot's QArray: float32 for "mxfp4", whose float8_e8m0fnu
    scales are no compute dtype), else its scales'."""
    dt = getattr(q, "dtype", None)
    return np.dtype(dt) if dt is not None else np.asarray(q.scale).dtype


def operands(lhs, rhs):
    """``(lhs, rhs, lhs_like, rhs_like)``: the operands as arrays (quantized
    ones dequantized in float64) and, for the dtype rules, arrays of no
    elements with the dtype each operand stands for (a quantized operand:
    its scales' dtype)."""
    out = []
    for x in (lhs, rhs):
        if is_quantized(x):
            out.append((dequantize(x), np.empty(0, _dtype(x))))
        else:
            x = np.asarray(x)
            out.append((x, x))
    return out[0][0], out[1][0], out[0][1], out[1][1]

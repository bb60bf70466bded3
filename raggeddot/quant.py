"""Quantized operands (qwix's ``QArray``): quantize, dequantize, and the views
the grouped matmuls take of them.

A :class:`QArray` holds quantized values ``qvalue`` with one scale (and
optionally one zero point) per *tile*: with ``len(scale.shape) ==
len(qvalue.shape)`` and each scale dimension dividing the value dimension,
the tile shape is ``qvalue.shape // scale.shape`` and::

    dequantize(q)[i] = (qvalue[i] - zero_point[t]) * scale[t],   t = i // tile

``ragged_dot``, ``ragged_dot_general``, ``gmm`` and ``tgmm`` take a QArray for
``lhs``, ``rhs`` or both; the result is the product of the dequantized
operands. The C kernels dequantize each value while packing it into the
cache-sized panels the micro-kernels read, so no dequantized copy of an
operand is ever made. When both operands of a float32 product are int8 (or
int4) with integral zero points, the products are summed exactly in int32
within each block of the reduction and scaled once per block in float32.
Derivatives (``raggeddot.vjp``/``jvp``) treat a
quantized operand as its dequantized value (the straight-through estimator,
as qwix): its gradient is that of ``dequantize(q)``, and the gradient of the
other operand multiplies the quantized one through the same packing path.

Quantized types (``qtype``):

- ``"int8"``: values in [-128, 127], stored as int8;
- ``"int4"``: values in [-8, 7], stored as int8 (ml_dtypes' int4 arrays are
  accepted and copied into int8 storage, one byte a value either way);
- ``"float8_e4m3fn"``: ml_dtypes' float8_e4m3fn (largest finite 448);
- ``"float4_e2m1fn"``: ml_dtypes' float4_e2m1fn (0, ±0.5, ±1, ±1.5, ±2, ±3,
  ±4, ±6), float scales of any tiling (as qwix and tokamax define them);
- ``"mxfp4"`` (OCP Microscaling): float4_e2m1fn values with
  ``float8_e8m0fnu`` scales (powers of two 2^(e - 127); 0xFF, NaN, refused),
  one per 32 values along one axis. Dequantized to float32; bfloat16 holds
  every such value exactly too (up to overflow past 2^127 * 6, where both
  give infinity), so a product with a bfloat16 lhs is that of the bfloat16
  weights, on the bfloat16 dot-product kernels where those serve.

4-bit values are kept two a byte (:class:`PackedFloat4`: the low nibble the
even element along the axis they are packed on, as the OCP and gpt-oss
order them): 4.25 bits a weight in memory for "mxfp4".
"""
import math
import operator

import numpy as np

from . import _validate as v
from ._float4 import PackedFloat4

try:
    import ml_dtypes
except ImportError:  # then float8_e4m3fn and ml_dtypes' int4 are unavailable
    ml_dtypes = None

__all__ = ["QArray", "AsQArray", "PackedFloat4", "quantize", "dequantize", "from_mxfp4", "refuse_non_finite",
           "QTYPES"]

#: Accepted qtypes: name -> (smallest value, largest value).
QTYPES = {"int8": (-128, 127), "int4": (-8, 7), "float8_e4m3fn": (-448.0, 448.0),
          "float4_e2m1fn": (-6.0, 6.0), "mxfp4": (-6.0, 6.0)}

_INT_QTYPES = ("int8", "int4")
_F4_QTYPES = ("float4_e2m1fn", "mxfp4")
_MX_BLOCK = 32      # values a scale along the tiled axis of "mxfp4"


def _qtype_name(qtype, fn, name="qtype"):
    """The qtype's name ("int8", "int4", "float8_e4m3fn") from a name or a dtype."""
    if isinstance(qtype, str):
        key = qtype
    else:
        try:
            key = np.dtype(qtype).name
        except TypeError:
            key = None
    if key not in QTYPES:
        raise ValueError(f"{fn}: '{name}' must be one of {', '.join(QTYPES)} (or their dtypes), got {qtype!r}")
    if key in ("float8_e4m3fn",) + _F4_QTYPES and ml_dtypes is None:
        raise ValueError(f"{fn}: '{name}'={key!r} needs the ml_dtypes package")
    return key


def _storage_dtype(qtype):
    if qtype in _F4_QTYPES:
        return np.dtype(ml_dtypes.float4_e2m1fn)
    return np.dtype(ml_dtypes.float8_e4m3fn) if qtype == "float8_e4m3fn" else np.dtype(np.int8)


def _is_e8m0(dtype):
    return dtype.name == "float8_e8m0fnu" and dtype.itemsize == 1


def _is_int4(dtype):
    return dtype.name == "int4" and dtype.itemsize == 1


def _mx_tiles(shape, sshape):
    """Whether scales of shape ``sshape`` tile values of ``shape`` as MXFP4
    does: one scale per 32 values along one axis, one per index along the
    others (always for no values)."""
    if math.prod(shape) == 0:
        return True
    tiles = [n // s for n, s in zip(shape, sshape)]
    return sorted(tiles)[-1:] == [_MX_BLOCK] and all(t == 1 for t in sorted(tiles)[:-1])


def _check_e8m0(scale, fn, name):
    """``scale`` of an "mxfp4" QArray: float8_e8m0fnu, no NaN (0xFF)."""
    if not _is_e8m0(scale.dtype):
        raise TypeError(f"{fn}: '{name}' of an 'mxfp4' QArray must be float8_e8m0fnu (power-of-two scales), "
                        f"got {scale.dtype}")
    nan = scale.view(np.uint8) == 0xFF
    if nan.any():
        where = tuple(int(i) for i in np.argwhere(nan)[0])
        raise ValueError(f"{fn}: '{name}' holds the NaN scale 0xFF at {where} ({int(nan.sum())} of them)")


class QArray:
    """Quantized values with per-tile scales (qwix's ``QArray``).

    Args:
      qvalue: array of the quantized values: int8 for ``qtype`` "int8" or
        "int4" (ml_dtypes.int4 also accepted for "int4"), ml_dtypes'
        float8_e4m3fn for "float8_e4m3fn", a :class:`PackedFloat4` for
        "float4_e2m1fn" and "mxfp4" (a float4_e2m1fn array, one byte a
        value, is packed two a byte along its last axis: a copy).
      scale: float array (float16, bfloat16, float32 or float64) with as
        many dimensions as qvalue, each dimension dividing qvalue's; for
        "mxfp4" float8_e8m0fnu, one per 32 values along one axis and one
        per index along the others, no NaN (0xFF).
      zero_point: None (symmetric) or a real array of scale's shape (none
        for the 4-bit qtypes).
      qtype: "int8", "int4", "float8_e4m3fn", "float4_e2m1fn", "mxfp4" (or
        their dtypes); default from qvalue's dtype ("int8" for int8 values;
        "mxfp4" for float8_e8m0fnu scales).

    Attributes: ``qvalue``, ``scale``, ``zero_point``, ``qtype``, and derived
    ``shape``, ``ndim``, ``dtype`` (the dtype of :func:`dequantize`: scale's)
    and ``tile_shape`` (``qvalue.shape // scale.shape``; 1 along an empty
    axis). A QArray is immutable; its values are trusted to lie in the
    qtype's range (int4 values outside [-8, 7] are still read as they are).
    """

    __slots__ = ("qvalue", "scale", "zero_point", "qtype")

    def __init__(self, qvalue, scale, zero_point=None, qtype=None):
        fn = "QArray"
        if not isinstance(qvalue, PackedFloat4):
            qvalue = v.as_array(qvalue, "qvalue", fn)
        scale = v.as_array(scale, "scale", fn)
        if qtype is None:
            qtype = ("mxfp4" if _is_e8m0(scale.dtype)
                     else "float4_e2m1fn" if qvalue.dtype.name == "float4_e2m1fn"
                     else "float8_e4m3fn" if qvalue.dtype.name == "float8_e4m3fn"
                     else "int4" if _is_int4(qvalue.dtype) else "int8")
        qtype = _qtype_name(qtype, fn)
        want = _storage_dtype(qtype)
        if qtype == "int4" and _is_int4(qvalue.dtype):
            qvalue = qvalue.astype(np.int8)
        if qtype in _F4_QTYPES and not isinstance(qvalue, PackedFloat4) and qvalue.dtype == want:
            qvalue = PackedFloat4.pack(qvalue, -1)   # one byte a value given: two a byte kept
        if qvalue.dtype != want:
            raise TypeError(f"{fn}: 'qvalue' of qtype {qtype!r} must have dtype {want.name}"
                            f"{' (or int4)' if qtype == 'int4' else ''}"
                            f"{' (a PackedFloat4 or a float4_e2m1fn array)' if qtype in _F4_QTYPES else ''}"
                            f", got {qvalue.dtype.name}")
        if qtype == "mxfp4":
            _check_e8m0(scale, fn, "scale")
        else:
            v.float_dtype(scale, "scale", fn)
        if qtype in _F4_QTYPES and zero_point is not None:
            raise ValueError(f"{fn}: a {qtype!r} QArray has no 'zero_point' (symmetric float values)")
        if scale.ndim != qvalue.ndim:
            raise ValueError(f"{fn}: 'scale' must have as many dimensions as 'qvalue' ({qvalue.ndim}), "
                             f"got shape {scale.shape} for qvalue shape {qvalue.shape}")
        for axis, (n, s) in enumerate(zip(qvalue.shape, scale.shape)):
            if (s == 0 and n != 0) or (s != 0 and n % s):
                raise ValueError(f"{fn}: 'scale' has {s} entries on axis {axis}, which does not divide "
                                 f"qvalue's {n} (qvalue {qvalue.shape}, scale {scale.shape})")
        if qtype == "mxfp4" and not _mx_tiles(qvalue.shape, scale.shape):
            tiles = tuple(n // s if s else 1 for n, s in zip(qvalue.shape, scale.shape))
            raise ValueError(f"{fn}: an 'mxfp4' QArray has one float8_e8m0fnu scale per {_MX_BLOCK} values along "
                             f"one axis and one per index along the others; got tiles {tiles} (qvalue "
                             f"{qvalue.shape}, scale {scale.shape}): for another tiling of power-of-two scales "
                             "give them as float32 with qtype 'float4_e2m1fn' (scale.astype(np.float32))")
        if zero_point is not None:
            zero_point = v.as_array(zero_point, "zero_point", fn)
            if zero_point.shape != scale.shape:
                raise ValueError(f"{fn}: 'zero_point' must have scale's shape {scale.shape}, "
                                 f"got {zero_point.shape}")
            if zero_point.dtype.kind not in "fiu" and not v.is_bfloat16(zero_point.dtype):
                raise TypeError(f"{fn}: 'zero_point' must be a real array, got dtype {zero_point.dtype}")
        for name, val in (("qvalue", qvalue), ("scale", scale), ("zero_point", zero_point)):
            object.__setattr__(self, name, val)
        object.__setattr__(self, "qtype", qtype)

    def __setattr__(self, name, value):
        raise AttributeError("QArray is immutable")

    def __repr__(self):
        zp = "None" if self.zero_point is None else f"{self.zero_point.shape}"
        return (f"QArray(shape={self.shape}, qtype={self.qtype!r}, scale={self.scale.shape} "
                f"{self.scale.dtype.name}, zero_point={zp})")

    @property
    def shape(self):
        return self.qvalue.shape

    @property
    def ndim(self):
        return self.qvalue.ndim

    @property
    def size(self):
        return self.qvalue.size

    @property
    def dtype(self):
        """The dtype of the dequantized values (scale's, native byte order;
        float32 for "mxfp4")."""
        if self.qtype == "mxfp4":
            return np.dtype(np.float32)
        return v.native(self.scale.dtype)

    @property
    def tile_shape(self):
        return tuple(n // s if s and n // s else 1 for n, s in zip(self.qvalue.shape, self.scale.shape))

    # ------------------------------------------------------------ views
    # The same view of the values and of their scales. They copy at most the
    # scales (an axis whose tiles a view cannot keep gets one scale per value
    # along it) and the one-byte values (a reshape NumPy cannot view).

    def _new(self, qvalue, scale, zero_point):
        """The QArray of a view: of this qtype, but an "mxfp4" view whose
        scales no longer run 32 deep along one axis (a slice off the block
        bounds, a reshape that splits blocks) is the "float4_e2m1fn" QArray
        of the same values and scales (float32: every e8m0 scale is one
        exactly), which it then is."""
        if self.qtype == "mxfp4" and not _mx_tiles(qvalue.shape, scale.shape):
            return QArray(qvalue, scale.astype(np.float32), None, "float4_e2m1fn")
        return QArray(qvalue, scale, zero_point, self.qtype)

    def _scales(self, f):
        return f(self.scale), None if self.zero_point is None else f(self.zero_point)

    def transpose(self, *axes):
        """The QArray of ``dequantize(self).transpose(*axes)``."""
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], (int, np.integer))):
            axes = axes[0]
        elif not axes:
            axes = None
        axes = None if axes is None else tuple(operator.index(a) for a in axes)
        s, z = self._scales(lambda a: a.transpose(axes))
        return self._new(self.qvalue.transpose(axes), s, z)

    @property
    def T(self):
        return self.transpose()

    def _untile(self, axis):
        """Self with one scale per value along ``axis`` (repeated scales)."""
        t = self.tile_shape[axis]
        if t == 1:
            return self
        s, z = self._scales(lambda a: np.repeat(a, t, axis=axis))
        return self._new(self.qvalue, s, z)

    def __getitem__(self, key):
        """Basic indexing by integers and unit-step slices, one per leading axis."""
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) > self.ndim:
            raise IndexError(f"QArray: too many indices ({len(key)}) for {self.ndim} dimensions")
        q = self
        for axis, k in enumerate(key):
            if isinstance(k, slice):
                start, stop, step = k.indices(q.shape[axis])
                t = q.tile_shape[axis]
                length = max(0, stop - start)
                if step != 1 or (t > 1 and length > 1 and (start % t or stop % t)):
                    q = q._untile(axis)
            elif not isinstance(k, (int, np.integer)):
                raise TypeError(f"QArray: indices must be integers or slices, got {type(k).__name__}")
        qkey, skey = [], []
        for axis, k in enumerate(key):
            t, n = q.tile_shape[axis], q.shape[axis]
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                qkey.append(k)
                if step != 1:                                   # untiled above
                    skey.append(k)
                elif stop - start <= 0:
                    skey.append(slice(0, 0))
                else:
                    skey.append(slice(start // t, (stop - 1) // t + 1))
            else:
                i = operator.index(k)
                if not -n <= i < n:
                    raise IndexError(f"QArray: index {i} is out of bounds for axis {axis} with size {n}")
                i %= n
                qkey.append(i)
                skey.append(i // t)
        s, z = q._scales(lambda a: a[tuple(skey)])
        return q._new(q.qvalue[tuple(qkey)], s, z)

    def reshape(self, *shape):
        """The QArray of ``dequantize(self).reshape(shape)``, for a shape that
        merges runs of adjacent axes (and adds or drops axes of size 1)."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        shape = tuple(operator.index(d) for d in shape)
        if math.prod(shape) != self.size or any(d < 0 for d in shape):
            raise ValueError(f"QArray: cannot reshape {self.shape} into {shape}")
        if self.size == 0:
            ones = (1,) * len(shape)
            s, z = self._scales(lambda a: np.zeros(ones, a.dtype))
            return self._new(self.qvalue.reshape(shape), s, z)
        # drop the size-1 axes (their one scale), merge runs, insert size-1 axes
        q = self[tuple(0 if d == 1 else slice(None) for d in self.shape)]
        groups, dims, i = [], list(q.shape), 0
        for d in shape:
            if d == 1:
                groups.append(None)
                continue
            run, p = [], 1
            while p < d and i < len(dims):
                p *= dims[i]
                run.append(i)
                i += 1
            if p != d:
                raise ValueError(f"QArray: reshape {self.shape} -> {shape} is not a merge of adjacent axes")
            groups.append(run)
        for run in groups:              # each run: outer axes with tile 1, see _merged_tile
            if run:
                for a in run[:_merge_axis(q, run)]:
                    q = q._untile(a)
        sshape = []
        for run in groups:
            sshape.append(1 if run is None else math.prod(q.scale.shape[a] for a in run))
        s, z = q._scales(lambda a: a.reshape(sshape))
        return self._new(q.qvalue.reshape(shape), s, z)


def _merge_axis(q, run):
    """Merging the adjacent axes ``run`` keeps one tile size when every axis
    outer to some axis c has tile 1 and every axis inner to it is one whole
    tile: c is the innermost axis whose tile is not the whole axis."""
    tiles = q.tile_shape
    for j in range(len(run) - 1, -1, -1):
        if tiles[run[j]] < q.shape[run[j]]:
            return j
    return 0


# ---------------------------------------------------------------- quantize


def refuse_non_finite(x, qtype, fn, what):
    """ValueError naming ``fn`` and ``what`` (the argument, e.g. "'x'")
    when the float array ``x``, to be quantized to ``qtype``, holds an
    infinity or a NaN: no qtype holds
    one (a tile holding one would get an infinite or NaN scale and silently
    wrong values; OCP MX v1.0 marks such an MXFP4 block with the NaN scale
    0xFF, which raggeddot refuses). One pass, no temporary: the float64 sum
    of float16 / bfloat16 / float32 values is finite exactly when they all
    are (float64 sums of float32 values cannot overflow); float64 values
    are tested one by one."""
    if x.size == 0:
        return
    with np.errstate(invalid="ignore"):     # (inf + -inf: NaN, as it should)
        if x.dtype.itemsize < 8:
            if np.isfinite(np.sum(x, dtype=np.float64)):
                return
        elif np.isfinite(x).all():
            return
    bad = ~np.isfinite(x.astype(np.float64) if x.dtype.itemsize < 8 else x)
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    rule = (" (OCP MX v1.0 gives such a block the NaN scale 0xFF, which MXFP4 weights here may not hold)"
            if qtype == "mxfp4" else "")
    count = int(bad.sum())
    raise ValueError(f"{fn}: {what} holds {count} non-finite value{'s' if count > 1 else ''} (the first, "
                     f"{float(np.asarray(x)[where])}, at {where}), which qtype {qtype!r} cannot represent: "
                     f"the scale of its tile would be infinite or NaN{rule}; replace them first "
                     "(e.g. np.nan_to_num, or clip to the finite range)")


def quantize(x, qtype, *, channelwise_axes=(), tiled_axes=None, calibration_method="absmax"):
    """Quantize ``x`` into a :class:`QArray` (qwix's ``quantize``).

    Every axis gets a tile size: 1 for ``channelwise_axes`` (one scale per
    index), ``tiled_axes[axis]`` for tiled axes (one scale per tile), the
    whole axis for the others (they share their scales). For each tile::

        "absmax":  scale = max|x| / (qmax + 0.5)     (int8: 127.5, int4: 7.5)
                   scale = max|x| / 448              (float8_e4m3fn)
                   q = clip(round_half_even(x / scale), qmin, qmax)   (int)
                   q = float8_e4m3fn(x / scale)   (ml_dtypes' rounding)
                   scale = max|x| / 6                (float4_e2m1fn)
                   scale = 2^(floor(log2(max|x|)) - 2) (mxfp4, OCP MX v1.0)
                   q = float4_e2m1fn(clip(x / scale, -6, 6))  (nearest, ties even)
        "minmax":  (int qtypes; asymmetric) lo = min(x, 0), hi = max(x, 0),
                   scale = (hi - lo) / (qmax - qmin),
                   zero_point = clip(round(qmin - lo / scale), qmin, qmax),
                   q = clip(round(x / scale) + zero_point, qmin, qmax)

    A tile of zeros gets scale 1. Because of the +0.5, the int8 value -128
    occurs (for the tile's most negative value when it is -max|x|). An
    infinity or NaN in ``x`` is refused (ValueError naming it): no qtype
    holds one, and the scale of its tile would be infinite or NaN (OCP MX
    v1.0 gives such an MXFP4 block the NaN scale, refused here as in
    :func:`from_mxfp4`).

    Args:
      x: float array (float16, bfloat16, float32, float64).
      qtype: "int8", "int4", "float8_e4m3fn", "float4_e2m1fn" or "mxfp4"
        (or their dtypes). "mxfp4" takes one tiled axis of tile 32 and
        every other axis channelwise: ``quantize(w, "mxfp4",
        channelwise_axes=(0, 2), tiled_axes={1: 32})`` for ``[g, k, n]``
        weights.
      channelwise_axes: axes with one scale per index.
      tiled_axes: ``{axis: tile}``, each tile a positive divisor of the axis.
      calibration_method: "absmax" or "minmax".

    Returns:
      A QArray: qvalue of qtype's storage dtype (4-bit values: a
      :class:`PackedFloat4` packed along the last axis), scale float32
      (float64 for a float64 ``x``; float8_e8m0fnu for "mxfp4") of shape
      ``x.shape // tile``.
    """
    fn = "quantize"
    x = v.as_array(x, "x", fn)
    xt = v.float_dtype(x, "x", fn)
    qtype = _qtype_name(qtype, fn)
    if calibration_method not in ("absmax", "minmax"):
        raise ValueError(f"{fn}: 'calibration_method' must be 'absmax' or 'minmax', got {calibration_method!r}")
    if calibration_method == "minmax" and qtype not in _INT_QTYPES:
        raise ValueError(f"{fn}: calibration_method='minmax' needs an integer qtype, got {qtype!r}")
    if isinstance(channelwise_axes, (int, np.integer)):
        channelwise_axes = (channelwise_axes,)
    chan = v.axes(channelwise_axes, x.ndim, "channelwise_axes", fn)
    tiled_axes = {} if tiled_axes is None else tiled_axes
    if not isinstance(tiled_axes, dict):
        raise TypeError(f"{fn}: 'tiled_axes' must be a dict {{axis: tile}}, got {type(tiled_axes).__name__}")
    tiled = dict(zip(v.axes(tiled_axes.keys(), x.ndim, "tiled_axes", fn), tiled_axes.values()))
    both = set(chan) & set(tiled)
    if both:
        raise ValueError(f"{fn}: axes {sorted(both)} are both in 'channelwise_axes' and 'tiled_axes'")
    tile = list(x.shape)
    for a in chan:
        tile[a] = 1
    for a, t in tiled.items():
        try:
            t = operator.index(t)
        except TypeError:
            raise TypeError(f"{fn}: 'tiled_axes' must map axes to integer tile sizes, got {t!r} "
                            f"for axis {a}") from None
        if t < 1 or x.shape[a] % t:
            raise ValueError(f"{fn}: 'tiled_axes' tile {t} for axis {a} must be a positive divisor "
                             f"of its size {x.shape[a]}")
        tile[a] = t
    refuse_non_finite(x, qtype, fn, "'x'")
    ct = np.dtype(np.float64) if xt == np.float64 else np.dtype(np.float32)
    sshape = tuple(n // t if t else 1 for n, t in zip(x.shape, tile))
    if qtype == "mxfp4":
        blocks = [t for t in tile if t != 1]
        if len(blocks) != 1 or blocks[0] != _MX_BLOCK or len(chan) + 1 != x.ndim:
            raise ValueError(f"{fn}: 'mxfp4' takes one scale per {_MX_BLOCK} values along one axis "
                             f"(tiled_axes={{axis: {_MX_BLOCK}}}, the size of that axis a multiple of "
                             f"{_MX_BLOCK}) and every other axis in 'channelwise_axes'; got tiles {tuple(tile)} "
                             f"for x of shape {x.shape}")
    if x.size == 0:
        zp = np.zeros(sshape, ct) if calibration_method == "minmax" else None
        if qtype == "mxfp4":
            return QArray(np.zeros(x.shape, _storage_dtype(qtype)),
                          np.full(sshape, 127, np.uint8).view(ml_dtypes.float8_e8m0fnu), None, qtype)
        return QArray(np.zeros(x.shape, _storage_dtype(qtype)), np.ones(sshape, ct), zp, qtype)
    # x viewed as [s0, t0, s1, t1, ...]: a tile is a fixed (s0, s1, ...) index
    split = tuple(d for s, t in zip(sshape, tile) for d in (s, t))
    xs = x.astype(ct).reshape(split)
    red = tuple(range(1, 2 * x.ndim, 2))
    qmin, qmax = QTYPES[qtype]
    zp = None
    if qtype in _F4_QTYPES:
        return _quantize_f4(xs, red, ct, qtype, x.shape, sshape)
    if calibration_method == "absmax":
        amax = np.abs(xs).max(axis=red, keepdims=True)
        scale = amax / ct.type(qmax + 0.5 if qtype in _INT_QTYPES else qmax)
        scale = np.where(scale == 0, ct.type(1), scale).astype(ct)
        y = xs / scale
        if qtype in _INT_QTYPES:
            q = np.clip(np.rint(y), qmin, qmax).astype(np.int8)
        else:
            q = np.clip(y, qmin, qmax).astype(_storage_dtype(qtype))
    else:
        lo = np.minimum(xs.min(axis=red, keepdims=True), 0)
        hi = np.maximum(xs.max(axis=red, keepdims=True), 0)
        scale = (hi - lo) / ct.type(qmax - qmin)
        scale = np.where(scale == 0, ct.type(1), scale).astype(ct)
        zp = np.clip(np.rint(qmin - lo / scale), qmin, qmax).astype(ct)
        q = np.clip(np.rint(xs / scale) + zp, qmin, qmax).astype(np.int8)
        zp = zp.reshape(sshape)
    return QArray(q.reshape(x.shape), scale.reshape(sshape), zp, qtype)


def _quantize_f4(xs, red, ct, qtype, shape, sshape):
    """quantize's 4-bit qtypes, ``xs`` the tiles as quantize splits them.

    "float4_e2m1fn": scale = max|x| / 6 (its largest value); "mxfp4" (OCP
    MX v1.0): the shared scale 2^(floor(log2(max|x|)) - 2), 2 being the
    exponent of e2m1's largest power of two, clamped to e8m0's [2^-127,
    2^127] (2^0 for a tile of zeros). Then each value x / scale rounded to
    the nearest float4_e2m1fn, ties to even, saturating at +-6."""
    amax = np.abs(xs).max(axis=red, keepdims=True)
    if qtype == "mxfp4":
        _, e = np.frexp(amax)                     # amax = f * 2^e, f in [0.5, 1): floor(log2) = e - 1
        e = np.clip(np.where(amax > 0, e - 1 - 2, 0), -127, 127).astype(np.int64)
        scale = np.ldexp(ct.type(1), e).astype(ct)
        stored = (e + 127).astype(np.uint8).reshape(sshape).view(ml_dtypes.float8_e8m0fnu)
    else:
        scale = amax / ct.type(6)
        scale = np.where(scale == 0, ct.type(1), scale).astype(ct)
        stored = scale.reshape(sshape)
    q = np.clip(xs / scale, -6, 6).astype(ml_dtypes.float4_e2m1fn).reshape(shape)
    return QArray(PackedFloat4.pack(q, -1), stored, None, qtype)


def from_mxfp4(blocks, scales):
    """The MXFP4 weights of a checkpoint (gpt-oss's ``*_blocks`` and
    ``*_scales`` tensors) as a :class:`QArray` over the same bytes.

    Args:
      blocks: uint8 ``[..., out, in / 32, 16]``: per row and block of 32
        values, 16 bytes, value ``2j`` in the low nibble of byte ``j`` and
        ``2j + 1`` in its high nibble (float4_e2m1fn codes). Any array NumPy
        reads without a copy (a NumPy array, a CPU torch tensor).
      scales: uint8 ``[..., out, in / 32]``: the e8m0 exponent of each
        block's scale, 2^(e - 127) (255, NaN, refused).

    Returns:
      A QArray of qtype "mxfp4" and shape ``[..., out, in]`` whose values
      are ``blocks`` (reshaped, not copied, when its last two axes are
      contiguous) and whose scales are ``scales`` viewed as
      float8_e8m0fnu. For expert weights it is ``[E, out, in]``, the
      checkpoint's layout (the 32-value blocks run along ``in``): multiply
      it with ``transpose_rhs=True`` (gmm) or prepack it with
      ``transpose_rhs=True``, as any ``[E, out, in]`` weights. transformers'
      gpt-oss experts module holds the dequantized weights transposed,
      ``gate_up_proj [E, in, out]`` = ``[E, d, 2f]`` and ``down_proj
      [E, f, d]``; ``raggeddot.torch.hold_mxfp4`` takes this ``[E, out,
      in]`` QArray for either kind of module.
    """
    fn = "from_mxfp4"
    if ml_dtypes is None:
        raise ValueError(f"{fn}: needs the ml_dtypes package")
    blocks = v.as_array(blocks, "blocks", fn)
    scales = v.as_array(scales, "scales", fn)
    for name, a in (("blocks", blocks), ("scales", scales)):
        if a.dtype != np.uint8 and not (name == "scales" and _is_e8m0(a.dtype)):
            raise TypeError(f"{fn}: '{name}' must be uint8, got {a.dtype}")
    if blocks.ndim < 3 or blocks.shape[-1] != _MX_BLOCK // 2:
        raise ValueError(f"{fn}: 'blocks' must be [..., out, in / {_MX_BLOCK}, {_MX_BLOCK // 2}] uint8 "
                         f"({_MX_BLOCK // 2} bytes a block of {_MX_BLOCK} values), got shape {blocks.shape}")
    if scales.shape != blocks.shape[:-1]:
        raise ValueError(f"{fn}: 'scales' must have shape {blocks.shape[:-1]} (one per block of 'blocks' "
                         f"{blocks.shape}), got {scales.shape}")
    scales = scales.view(ml_dtypes.float8_e8m0fnu)
    _check_e8m0(scales, fn, "scales")
    nb = blocks.shape[-2]
    codes = blocks.reshape(blocks.shape[:-2] + (nb * (_MX_BLOCK // 2),))
    return QArray(PackedFloat4(codes, -1, nb * _MX_BLOCK), scales, None, "mxfp4")


def dequantize(q):
    """``(qvalue - zero_point) * scale`` broadcast over the tiles, in scale's
    dtype (qwix's ``dequantize``): an array of ``q.shape``."""
    if not isinstance(q, QArray):
        raise TypeError(f"dequantize: 'q' must be a QArray, got {type(q).__name__}")
    dt = q.dtype
    if q.size == 0:
        return np.zeros(q.shape, dt)
    split = tuple(d for s, t in zip(q.scale.shape, q.tile_shape) for d in (s, t))
    bshape = tuple(d for s in q.scale.shape for d in (s, 1))
    if q.qtype in _F4_QTYPES:   # exact: values of 2 bits times the scales, rounded once to dt
        x = q.qvalue.astype(np.float32).reshape(split)
        return (x * q.scale.astype(np.float32).reshape(bshape)).astype(dt).reshape(q.shape)
    x = q.qvalue.astype(dt).reshape(split)
    if q.zero_point is not None:
        x = x - q.zero_point.astype(dt).reshape(bshape)
    return (x * q.scale.astype(dt, copy=False).reshape(bshape)).reshape(q.shape)


class AsQArray:
    """A float operand that the op receiving it quantizes itself (tokamax's
    ``AsQArray``): ``ragged_dot(AsQArray(x, "int8", channelwise_axes=(0,)),
    w, gs)`` multiplies ``dequantize(quantize(x, "int8", channelwise_axes=(0,)))``
    (per token) by ``w``, quantizing ``x`` once at the start of the call (an
    int8 copy of it with its scales; the product then dequantizes value by
    value while packing, as for any QArray). The arguments are those of
    :func:`quantize`, checked when the op runs. Derivatives are straight
    through: the gradient with respect to the wrapped array is that of the
    dequantized operand, with the array's shape and dtype.
    """

    __slots__ = ("array", "qtype", "channelwise_axes", "tiled_axes", "calibration_method")

    def __init__(self, array, qtype, *, channelwise_axes=(), tiled_axes=None, calibration_method="absmax"):
        for name, val in (("array", array), ("qtype", qtype), ("channelwise_axes", channelwise_axes),
                          ("tiled_axes", tiled_axes), ("calibration_method", calibration_method)):
            object.__setattr__(self, name, val)

    def __setattr__(self, name, value):
        raise AttributeError("AsQArray is immutable")

    def quantize(self):
        """The QArray the op multiplies."""
        return quantize(self.array, self.qtype, channelwise_axes=self.channelwise_axes,
                        tiled_axes=self.tiled_axes, calibration_method=self.calibration_method)

"""float4_e2m1fn values kept two a byte (:class:`PackedFloat4`): the storage
of the 4-bit QArrays of ``raggeddot.quant`` (qtypes "float4_e2m1fn" and
"mxfp4")."""
import math
import operator

import numpy as np

from . import _validate as v

try:
    import ml_dtypes
except ImportError:  # then no 4-bit values exist
    ml_dtypes = None

__all__ = ["PackedFloat4"]


class PackedFloat4:
    """float4_e2m1fn values kept two a byte: the storage of a 4-bit
    :class:`QArray` (qtypes "float4_e2m1fn" and "mxfp4").

    ``codes`` is a uint8 array of the values' shape but along ``axis``,
    where it has ``(length + 1) // 2`` bytes of unit stride: value ``2j``
    is the low nibble of byte ``j``, value ``2j + 1`` its high nibble (the
    order of the OCP Microscaling formats and of gpt-oss's checkpoints; an
    odd ``length`` leaves the last high nibble unused). It behaves as an
    array of float4_e2m1fn of that shape for what a QArray does with its
    values: ``shape``, ``ndim``, ``size``, ``dtype``, ``transpose``, basic
    indexing, ``reshape`` (merging adjacent axes), ``astype`` and
    ``np.asarray`` (one byte a value, a copy). Views keep the codes where
    they can and copy them (repacked) where the pairs do not survive.

    Build one with :meth:`pack` (from float4_e2m1fn values) or from the
    bytes themselves: ``PackedFloat4(codes, axis, length)``.
    """

    __slots__ = ("codes", "axis", "length")

    def __init__(self, codes, axis=-1, length=None):
        fn = "PackedFloat4"
        codes = v.as_array(codes, "codes", fn)
        if codes.dtype != np.uint8:
            raise TypeError(f"{fn}: 'codes' must be uint8 (two float4_e2m1fn codes a byte), got {codes.dtype}")
        if codes.ndim == 0:
            raise ValueError(f"{fn}: 'codes' must have at least one dimension")
        axis = v.axes((axis,), codes.ndim, "axis", fn)[0]
        have = codes.shape[axis]
        length = 2 * have if length is None else operator.index(length)
        if (length + 1) // 2 != have:
            raise ValueError(f"{fn}: 'length' {length} needs {(length + 1) // 2} bytes along axis {axis}, "
                             f"'codes' has {have}")
        if length > 2 and codes.strides[axis] != 1:
            codes = np.ascontiguousarray(np.moveaxis(codes, axis, -1))
            codes = np.moveaxis(codes, -1, axis)
        for name, val in (("codes", codes), ("axis", axis), ("length", length)):
            object.__setattr__(self, name, val)

    def __setattr__(self, name, value):
        raise AttributeError("PackedFloat4 is immutable")

    def __repr__(self):
        return f"PackedFloat4(shape={self.shape}, axis={self.axis})"

    @classmethod
    def pack(cls, values, axis=-1):
        """``values`` (float4_e2m1fn, or uint8 codes 0-15 one a byte) packed
        two a byte along ``axis``."""
        values = np.asarray(values)
        if values.dtype.name != "float4_e2m1fn" and values.dtype != np.uint8:
            raise TypeError(f"PackedFloat4.pack: 'values' must be float4_e2m1fn, got {values.dtype}")
        codes = values.view(np.uint8)
        if values.ndim == 0:
            raise ValueError("PackedFloat4.pack: 'values' must have at least one dimension")
        axis = v.axes((axis,), values.ndim, "axis", "PackedFloat4.pack")[0]
        c = np.moveaxis(codes & 0xF, axis, -1)
        n = c.shape[-1]
        if n % 2:
            c = np.concatenate([c, np.zeros(c.shape[:-1] + (1,), np.uint8)], axis=-1)
        packed = np.ascontiguousarray(c[..., 0::2] | (c[..., 1::2] << 4))
        return cls(np.moveaxis(packed, -1, axis), axis, n)

    # -------------------------------------------------- the array it stands for
    @property
    def shape(self):
        s = list(self.codes.shape)
        s[self.axis] = self.length
        return tuple(s)

    @property
    def ndim(self):
        return self.codes.ndim

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def dtype(self):
        return np.dtype(ml_dtypes.float4_e2m1fn)

    @property
    def nbytes(self):
        return self.codes.nbytes

    def unpack(self):
        """The values one a byte: a new float4_e2m1fn array."""
        c = np.moveaxis(self.codes, self.axis, -1)
        out = np.empty(c.shape[:-1] + (2 * c.shape[-1],), np.uint8)
        out[..., 0::2] = c & 0xF
        out[..., 1::2] = c >> 4
        out = out[..., :self.length]
        return np.moveaxis(out, -1, self.axis).view(ml_dtypes.float4_e2m1fn)

    def __array__(self, dtype=None, copy=None):
        x = self.unpack()
        return x if dtype is None else x.astype(dtype)

    def astype(self, dtype, copy=True):
        return self.unpack().astype(dtype)

    # ------------------------------------------------------------- views
    def transpose(self, *axes):
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], (int, np.integer))):
            axes = axes[0]
        axes = tuple(reversed(range(self.ndim))) if not axes else tuple(operator.index(a) % self.ndim for a in axes)
        return PackedFloat4(self.codes.transpose(axes), axes.index(self.axis), self.length)

    def __getitem__(self, key):
        """Basic indexing (integers and slices); the codes are kept where
        the packed axis is sliced from an even start with unit step (or not
        indexed), repacked along the last axis otherwise."""
        if not isinstance(key, tuple):
            key = (key,)
        key = key + (slice(None),) * (self.ndim - len(key))
        k = key[self.axis]
        if isinstance(k, slice):
            start, stop, step = k.indices(self.length)
            n = len(range(start, stop, step))
            if step == 1 and start % 2 == 0:
                ckey = list(key)
                ckey[self.axis] = slice(start // 2, start // 2 + (n + 1) // 2)
                axis = self.axis - sum(not isinstance(x, slice) for x in key[:self.axis])
                return PackedFloat4(self.codes[tuple(ckey)], axis, n)
        values = self.unpack()[key]
        return PackedFloat4.pack(values, -1) if values.ndim else values

    def reshape(self, *shape):
        """A reshape that merges adjacent axes (or adds and drops axes of
        size 1) keeps the codes when the packed axis stays the innermost of
        its merged axes (with an even length if it merges with others);
        any other is repacked along the last axis."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        shape = tuple(operator.index(d) for d in shape)
        old = self.shape
        before, inner, n = math.prod(old[:self.axis]), math.prod(old[self.axis + 1:]), self.length
        for j, d in enumerate(shape):
            if math.prod(shape[j + 1:]) != inner or n == 0 or d % n:
                continue
            if math.prod(shape[:j]) * d != before * n or (d != n and n % 2):
                continue
            cshape = list(shape)
            cshape[j] = d // n * ((n + 1) // 2)
            return PackedFloat4(self.codes.reshape(cshape), j, d)
        return PackedFloat4.pack(self.unpack().reshape(shape), -1)

"""Weights laid out once in the micro-kernel's panel order: :func:`prepack`
and the :class:`PackedRhs` it returns, read in place by every later call."""
import numpy as np

from . import _gateway as gw
from . import _validate as v

__all__ = ["PackedRhs", "prepack"]

# The compute type a prepacked rhs of each storage dtype is laid out for:
# float32 / float64 panels as packing makes them per call, and 16-bit
# panels that the micro-kernels widen to float32 in registers (so bfloat16
# and float16 weights keep their 2 bytes an element in memory).
_LAYOUT = {"float32": "float32", "float64": "float64",
           "bfloat16": "float32-bfloat16w", "float16": "float32-float16w"}


class PackedRhs:
    """``rhs [g, k, n]`` laid out once in the panel order of the micro-kernel
    selected when :func:`prepack` ran, read in place by ragged_dot, gmm and
    ragged_dot_general (its ragged_dot-shaped mode) instead of being packed
    again on every call.

    Per group, the contraction is cut in blocks of KC rows, and each block
    into panels of NR columns (zero-padded past n): the order in which the
    micro-kernel reads B. A call with a few rows per group then streams the
    weights once, in order, from memory. float32 and float64 weights keep
    their dtype; bfloat16 and float16 weights keep 2 bytes an element and are
    widened to float32 exactly by the micro-kernel (products and sums are
    then those of the float32 kernel on the same values: results equal an
    unpacked call bit for bit).

    Attributes:
      shape: ``(g, k, n)``; dtype: the weights' dtype; nbytes: the bytes the
        layout holds (``g * ceil(n / NR) * NR * k`` elements, plus k padding
        for k-pair kernels); kernel, nr, kc: the kernel family and the
        blocking it was laid out for. A call made while another kernel family
        serves that product (``runtime.set_kernel``) raises ValueError: the
        panels would not fit its register block.

    Derivatives: the gradient with respect to a PackedRhs is that of the
    ``[g, k, n]`` weights it holds (a plain array); the gradient of lhs needs
    the weights transposed, so the backward unpacks a copy
    (:meth:`unpack`) for it.
    """

    __slots__ = ("_buf", "shape", "dtype", "ctype", "nr", "kc", "kernel", "_per_group")

    def __init__(self, buf, shape, dtype, ctype, nr, kc, kernel, per_group):
        self._buf = buf
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.ctype, self.nr, self.kc, self.kernel = ctype, nr, kc, kernel
        self._per_group = per_group

    ndim = 3

    @property
    def nbytes(self):
        return self._buf.nbytes

    def __repr__(self):
        g, k, n = self.shape
        return (f"PackedRhs(shape=({g}, {k}, {n}), dtype={self.dtype.name}, kernel={self.kernel!r}, "
                f"nr={self.nr}, kc={self.kc}, nbytes={self.nbytes})")

    def unpack(self):
        """The weights ``[g, k, n]`` as a new array of their dtype (exactly
        the values given to :func:`prepack`)."""
        g, k, n = self.shape
        nr, kc = self.nr, self.kc
        panels = -(-n // nr)
        elem = np.dtype(np.float64) if self.ctype == "float64" else \
            np.dtype(np.float32) if self.ctype == "float32" else self.dtype
        flat = self._buf.view(np.uint8).view(elem).reshape(g, -1)
        if self.ctype == "float32-bfloat16w":   # each row holds its two halves interleaved
            pos = np.arange(nr)
            order = np.where(pos < nr // 2, 2 * pos, 2 * (pos - nr // 2) + 1)
        else:
            order = slice(None)
        out = np.empty((g, k, n), dtype=self.dtype)
        start = 0
        for pc in range(0, k, kc):
            depth = min(kc, k - pc)
            block = flat[:, start:start + panels * depth * nr].reshape(g, panels, depth, nr)
            block = block[..., order].transpose(0, 2, 1, 3).reshape(g, depth, panels * nr)
            out[:, pc:pc + depth, :] = block[:, :, :n]
            start += panels * depth * nr
        return out


def prepack(rhs, *, transpose_rhs=False):
    """Lay the weights ``rhs`` out once in the micro-kernel's panel order.

    Args:
      rhs: ``[g, k, n]`` weights (``[g, n, k]`` with ``transpose_rhs``, read
        as its transpose, as :func:`~raggeddot.gmm` reads it): float32,
        float64, bfloat16 or float16, any strides.
    Returns:
      A :class:`PackedRhs` of the ``[g, k, n]`` weights, accepted as ``rhs``
      by ragged_dot, gmm and ragged_dot_general wherever the plain array is
      (ragged_dot_general: the ragged_dot form of its dimension numbers).
      It holds its own copy: ``rhs`` may be dropped afterwards.
    """
    fn = "prepack"
    rhs = v.as_array(rhs, "rhs", fn, ndim=3, shape_doc=" [g, n, k]" if transpose_rhs else " [g, k, n]")
    dt = v.float_dtype(rhs, "rhs", fn)
    if not rhs.dtype.isnative or not rhs.flags.aligned:
        rhs = np.array(rhs, dtype=dt)
    w = rhs.transpose(0, 2, 1) if transpose_rhs else rhs
    g, k, n = w.shape
    ctype = _LAYOUT[dt.name]
    per_group, nr, kc, kernel = gw.prepack_layout(ctype, dt.name, k, n)
    buf = _aligned(g * per_group)
    if buf.size:
        gw.prepack(w, buf, ctype, kc, nr)
    return PackedRhs(buf, (g, k, n), dt, ctype, nr, kc, kernel, per_group)


def _aligned(nbytes, alignment=64):
    """A new uint8 array of ``nbytes`` whose data starts on an ``alignment``
    boundary (the micro-kernels' aligned vector loads)."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    skip = -raw.ctypes.data % alignment
    return raw[skip:skip + nbytes]


def is_packed(x):
    return isinstance(x, PackedRhs)

"""Weights laid out once in the micro-kernel's panel order: :func:`prepack`
and the :class:`PackedRhs` it returns, read in place by every later call."""
import threading

import numpy as np

from . import _gateway as gw
from . import _validate as v
from ._layouts import (_BF16_DOT, _BF16_MMLA, _F4LAYOUT, _I4LAYOUT, _INT8_DOT, _INT8_LAYOUTS, _INT8_MMLA, _LAYOUT,
                       _QLAYOUT, _W4A8)
from ._layouts import unpack as _unpack
from .quant import QArray, dequantize

__all__ = ["PackedRhs", "prepack", "meet", "check", "quantizes_in_kernel"]


def _bf16_layout():
    """The layout of bfloat16 weights for a bfloat16 lhs with the kernels
    selected now (None: no bfloat16 dot products are served)."""
    return _first_served((_BF16_MMLA, _BF16_DOT))


def _int8_layout():
    """The layout of int8 weights for an int8 lhs with the kernels selected
    now (None: no int8 dot products are served)."""
    return _first_served((_INT8_MMLA, _INT8_DOT))


def _first_served(ctypes):
    """The first of ``ctypes`` a kernel serves now, or None; kept while the
    selection stays the same (a decode step asks a dozen times)."""
    gen = gw.selection()
    hit = _FIRST_SERVED.get(ctypes)
    if hit is None or hit[0] != gen:
        hit = _FIRST_SERVED[ctypes] = (gen, next((ct for ct in ctypes if gw.served(ct)), None))
    return hit[1]


_FIRST_SERVED = {}


def _w4a8_layout(q):
    """The w4a8 layout of the 4-bit QArray weights ``q`` (int4 values in
    [-8, 7] without zero points, or "mxfp4") for an int8 lhs with the
    kernels selected now, or None (other weights, or not served)."""
    ct = _W4A8.get(q.qtype)
    qtile = q.tile_shape[1] if q.ndim == 3 else 0
    if ct is None or q.zero_point is not None or not gw.served(ct) or (qtile % 4 and qtile < q.shape[1]):
        return None     # (runs of scales along k in whole k-quads)
    return ct if q.qtype == "mxfp4" or _int4_values(q) else None


class PackedRhs(v.Prepacked):
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

    Quantized weights (a :class:`~raggeddot.QArray`, qtype int8, int4 or
    float8_e4m3fn) keep one byte a value (4-bit weights with power-of-two
    scales, every "mxfp4" QArray: 4 bits a value, and one e8m0 exponent
    byte a column per scale run, 4.25 bits a weight; "float4_e2m1fn" with
    other scales: one byte, as float8_e4m3fn, which holds every e2m1 value); after each panel of a block come
    the float32 scales (and zero points) of its columns for that block, per
    scale tile along k that the block meets. The micro-kernel widens each
    value exactly and computes ``(q - zero_point) * scale`` in float32
    before its products: the value the per-call path dequantizes into its
    panels, so results equal a call with the QArray itself bit for bit.

    It is laid out for one kind of lhs (prepack's ``lhs_dtype``); a call
    with another kind gets the plain weights' result from the layout that
    lhs runs on, made once and kept (see :func:`prepack`).

    Attributes:
      shape: ``(g, k, n)``; dtype: the weights' dtype (for a QArray, that of
        its dequantized value: its scale's dtype); qtype: the QArray's qtype,
        or None for float weights; nbytes: the bytes it holds for its own
        layout: the panels a call reads (``g * ceil(n / NR) * NR * k``
        elements, plus k padding for k-pair kernels; for a QArray, one byte
        a value, half a byte for 4-bit ones, plus the scales and zero points
        after each panel) and, for a QArray, the copy of its scales and zero
        points that :meth:`unpack` gives back; kernel, nr, kc: the kernel
        family and the blocking it was laid out for. A call made while
        another kernel family serves that product (``runtime.set_kernel``)
        raises ValueError naming the function and the argument: the panels
        would not fit its register block. layouts: ``{compute type: bytes}``
        of its own layout (``nbytes``) and those made for other kinds of
        lhs; ``sum(layouts.values())`` is all it holds.

    A layout made for another kind of lhs is made once even when several
    threads meet it first at the same time (the others wait for it).

    Derivatives: the gradient with respect to a PackedRhs is that of the
    ``[g, k, n]`` weights it holds (their dequantized value for a QArray:
    straight through); the gradient of lhs needs the weights transposed, so
    the backward unpacks a copy (:meth:`unpack`) for it.
    """

    __slots__ = ("_buf", "shape", "dtype", "ctype", "nr", "kc", "kernel", "_per_group", "qtype",
                 "_storage", "_qtile", "_scale", "_zero_point", "_kept", "_lock", "_checks")

    def __init__(self, buf, shape, dtype, ctype, nr, kc, kernel, per_group, quant=None):
        self._buf = buf
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.ctype, self.nr, self.kc, self.kernel = ctype, nr, kc, kernel
        self._per_group = per_group
        if quant is None:
            self.qtype, self._storage, self._qtile, self._scale, self._zero_point = \
                None, self.dtype, 0, None, None
        else:   # (qtype, storage dtype, scale tile along k, scale, zero_point)
            self.qtype, self._storage, self._qtile, self._scale, self._zero_point = quant
        # layouts made for other kinds of lhs, by compute type (see meet);
        # None: the plain weights, for products no layout serves
        self._kept = {}
        self._lock = threading.Lock()    # held while a layout of _kept is made
        self._checks = {}   # check's answers for array lhs (see check)

    def __getstate__(self):    # (copy, deepcopy, pickle: the lock is not state)
        return {name: getattr(self, name) for name in self.__slots__ if name not in ("_lock", "_checks")}

    def __setstate__(self, state):
        for name, value in state.items():
            setattr(self, name, value)
        if self._buf.size and self._buf.ctypes.data % 64:   # a copied array starts where NumPy put it
            buf = _aligned(self._buf.nbytes)
            buf[...] = self._buf
            self._buf = buf
        self._lock = threading.Lock()
        self._checks = {}

    ndim = 3

    @property
    def nbytes(self):
        """Bytes held for the layout made by prepack: its panels, and for
        quantized weights the copy of the scales (and zero points) that
        :meth:`unpack` gives back (see also :attr:`layouts`)."""
        held = self._buf.nbytes
        for a in (self._scale, self._zero_point):
            held += 0 if a is None else a.nbytes
        return held

    @property
    def layouts(self):
        """``{compute type: bytes}`` of every layout this PackedRhs holds:
        its own first, then those made for calls with another kind of lhs
        (see :func:`prepack`), and ``"plain"`` for weights kept unpacked for
        a product no layout serves."""
        kept = {self.ctype: self.nbytes}
        for ctype, held in list(self._kept.items()):
            if isinstance(held, QArray):    # values, scales and zero points
                nbytes = sum(0 if a is None else getattr(a, "nbytes", 0)
                             for a in (held.qvalue, held.scale, held.zero_point))
            else:
                nbytes = held.nbytes
            kept["plain" if ctype is None else ctype] = nbytes
        return kept

    def __repr__(self):
        g, k, n = self.shape
        q = "" if self.qtype is None else f", qtype={self.qtype!r}"
        return (f"PackedRhs(shape=({g}, {k}, {n}), dtype={self.dtype.name}{q}, kernel={self.kernel!r}, "
                f"nr={self.nr}, kc={self.kc}, nbytes={self.nbytes})")

    def _layout(self, ctype):
        """The layout of compute type ``ctype`` (None: the plain weights)
        made from these weights once and kept; remade when another kernel
        family now serves ``ctype``. Made under the lock: threads that
        need it at the same time wait for the one making it."""
        held = self._kept.get(ctype)
        if held is not None and self._current(ctype, held):
            return held
        with self._lock:
            held = self._kept.get(ctype)
            if held is None or not self._current(ctype, held):
                held = self._kept[ctype] = _layout_of(self, ctype)
            return held

    @staticmethod
    def _current(ctype, held):
        """Whether ``held``, kept for ``ctype``, is of the kernel family
        that serves ``ctype`` now."""
        return ctype is None or held.kernel == gw.prepack_layout(ctype, v._dtype_name(held._storage), 0, 0)[3]

    def unpack(self):
        """The weights ``[g, k, n]`` as given to :func:`prepack` (transposed
        back to ``[g, k, n]`` when given with ``transpose_rhs``): a new array
        of their dtype, or for quantized weights a new
        :class:`~raggeddot.QArray` with the same values, scales, zero points
        and qtype (not its dequantized value)."""
        return _unpack(self)


def _pow2_scales(q):
    """Whether every scale of the 4-bit QArray ``q`` is an e8m0 power of two
    (2^-127 to 2^127): always for "mxfp4"."""
    if q.qtype == "mxfp4":
        return True
    s = np.asarray(q.scale, dtype=np.float32)
    m, e = np.frexp(s)
    return bool(np.all((m == 0.5) & (e >= -126) & (e <= 128)))


def _as_float8(q):
    """A 4-bit QArray as the float8_e4m3fn one of the same values and scales
    (every e2m1 value is an e4m3 value): one byte a weight."""
    import ml_dtypes
    values = np.asarray(q.qvalue).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    return QArray(values, q.scale, None, "float8_e4m3fn")


def prepack(rhs, *, transpose_rhs=False, lhs_dtype=None):
    """Lay the weights ``rhs`` out once in the micro-kernel's panel order.

    Args:
      rhs: ``[g, k, n]`` weights (``[g, n, k]`` with ``transpose_rhs``, read
        as its transpose, as :func:`~raggeddot.gmm` reads it): float32,
        float64, bfloat16 or float16, any strides; or a
        :class:`~raggeddot.QArray` of qtype int8, int4, float8_e4m3fn,
        float4_e2m1fn or mxfp4 with
        any tiling of its scales (per tensor, per channel ``[g, 1, n]``,
        subchannel ``[g, k / bk, n]``, tiles along n or g), with or without
        zero points, and float32, bfloat16 or float16 scales. Its product
        is that of the dequantized weights ``(q - zero_point) * scale``
        computed in float32, as a call with the QArray computes it.
      lhs_dtype: the dtype of the lhs the weights will mostly be multiplied
        with, which picks the layout (default: the weights' own dtype;
        float16, bfloat16, float32 or float64, and for int8, int4 or mxfp4 QArray
        weights also int8). bfloat16 weights for a bfloat16 lhs are laid out
        in k-pairs for the bfloat16 dot-product kernels (``vdpbf16ps``)
        where the CPU has them; for a float32 or float16 lhs
        (``lhs_dtype=np.float32``) they keep the 16-bit layout the float32
        kernels widen. int8 (or int4) QArray weights with ``lhs_dtype=np.int8``
        (an int8 QArray lhs with one scale per row, as ``moe_block``'s
        ``activation_qtype="int8"`` makes) are laid out in k-quads with their
        column sums for the int8 dot-product kernels (``vpdpbusd``) where the
        CPU has them; int4 weights (values in [-8, 7], no zero points) and
        MXFP4 ones keep 4 bits a weight there, where the AVX-512 VNNI kernels
        serve them (w4a8: an MXFP4 value v is the int8 2v with its scale
        halved, exactly); by default quantized weights are laid out for a
        float lhs, which they widen and dequantize in the micro-kernel.

    A PackedRhs meeting an lhs it was not laid out for: every call gives the
    result of the plain weights (the array or QArray given here) bit for
    bit, and at the speed of the layout that lhs runs on. When a call's lhs
    runs on another layout (a float32 lhs with bfloat16 weights laid out for
    a bfloat16 one, a bfloat16 lhs with the widening layout where the
    bfloat16 dot products serve, an int8 QArray lhs with quantized weights
    laid out for a float lhs, a float or float8 lhs with weights laid out
    for int8), that layout is made once, from the PackedRhs's own copy, on
    first use, and kept on the PackedRhs for later calls: it costs as much
    memory again as the PackedRhs (``nbytes``; a few bytes more per column
    for the int8 layout's column sums). Where no layout serves the product
    (int8 x int8 QArrays on a CPU without int8 dot products, or an int8
    lhs with scales along k), the weights are kept unpacked once (the
    QArray: one byte a value and its scales) and the call runs as with the
    QArray. :attr:`PackedRhs.layouts` lists what it holds. A call whose
    product no layout of these weights computes (a float64 product of
    float32, 16-bit or quantized weights) raises a ValueError naming the
    function, the argument and the fix; never a silently slower or
    different result.

    Returns:
      A :class:`PackedRhs` of the ``[g, k, n]`` weights, accepted as ``rhs``
      by ragged_dot, gmm and ragged_dot_general wherever the plain array is
      (ragged_dot_general: the ragged_dot form of its dimension numbers),
      and as moe_block's ``w0``, ``w1``, ``wo``, with a float lhs (float32,
      bfloat16, float16; float64 for float64 weights) or a QArray lhs. It
      holds its own copy: ``rhs`` may be dropped afterwards.
    Raises:
      ValueError for float8_e4m3fn values holding NaN codes (the layout has
      no NaN weights) or a QArray with float64 scales (a float64 product);
      TypeError for an ``lhs_dtype`` these weights are not multiplied with
      (naming the fix).
    """
    fn = "prepack"
    shape_doc = " [g, n, k]" if transpose_rhs else " [g, k, n]"
    if isinstance(rhs, QArray):
        return _prepack_quantized(rhs, transpose_rhs, shape_doc, fn, lhs_dtype)
    rhs = v.as_array(rhs, "rhs", fn, ndim=3, shape_doc=shape_doc)
    dt = v.float_dtype(rhs, "rhs", fn)
    lhs = _lhs_dtype(lhs_dtype, dt, fn)
    if not rhs.dtype.isnative or not rhs.flags.aligned:
        rhs = np.array(rhs, dtype=dt)
    w = rhs.transpose(0, 2, 1) if transpose_rhs else rhs
    g, k, n = w.shape
    ctype = _LAYOUT[dt.name]
    if dt.name == "bfloat16" and lhs.name == "bfloat16" and _bf16_layout():
        ctype = _bf16_layout()
    per_group, nr, kc, kernel = gw.prepack_layout(ctype, dt.name, k, n)
    buf = _aligned(g * per_group)
    if buf.size:
        gw.prepack(w, buf, ctype, kc, nr)
    return PackedRhs(buf, (g, k, n), dt, ctype, nr, kc, kernel, per_group)


def _prepack_quantized(q, transpose_rhs, shape_doc, fn, lhs_dtype=None):
    """prepack of a QArray ``q`` (checked here; laid out by the C layout)."""
    if q.ndim != 3:
        raise ValueError(f"{fn}: expected 3-D 'rhs'{shape_doc} but got a {q.ndim}-D QArray of shape {q.shape}")
    dt = q.dtype
    if dt.itemsize == 8:
        raise ValueError(f"{fn}: the QArray 'rhs' has float64 scales (a float64 product); prepacked "
                         "quantized weights compute in float32: give float32 scales")
    lhs = _lhs_dtype(lhs_dtype, dt, fn, qtype=q.qtype)
    if q.qtype == "float8_e4m3fn":
        codes = q.qvalue.view(np.uint8)
        nan = (codes & 0x7F) == 0x7F
        if nan.any():
            where = tuple(int(i) for i in np.argwhere(nan)[0])
            raise ValueError(f"{fn}: the float8_e4m3fn QArray 'rhs' holds NaN at {where} "
                             f"({int(nan.sum())} NaN values): NaN weights cannot be prepacked")
    w = q.transpose(0, 2, 1) if transpose_rhs else q
    g, k, n = w.shape
    w4 = _w4a8_layout(w) if lhs == np.int8 else None
    if w4 is not None:      # 4 bits a weight for the int8 dot products
        return _prepack_as(q, w, dt, w4)
    if q.qtype in ("float4_e2m1fn", "mxfp4"):
        if _pow2_scales(w):
            return _prepack_as(q, w, dt, _F4LAYOUT)     # 4 bits a weight, an exponent byte a column and run
        w = _as_float8(w)       # float scales: the same values one byte a weight
    ctype = _QLAYOUT[w.qtype]
    if lhs == np.int8 and ctype == "float32-int8w" \
            and _int8_layout() and gw.integral_zero_points(w.zero_point):
        ctype = _int8_layout()
    elif ctype == "float32-int8w" and _int4_values(w):
        ctype = _I4LAYOUT       # (int4 values held in int8: 4 bits a weight)
    return _prepack_as(q, w, dt, ctype)


def _prepack_as(q, w, dt, ctype):
    """prepack of QArray weights ``w [g, k, n]`` (``q`` as given) in the
    layout of ``ctype``, whose C layout reads them as they are (4-bit
    weights with power-of-two scales, _F4LAYOUT: 4 bits a weight and one
    exponent byte a column per scale run, 4.25 bits a weight for MXFP4)."""
    g, k, n = w.shape
    storage = np.dtype(w.qvalue.dtype)
    qtile = w.tile_shape[1]
    zp = w.zero_point is not None
    per_group, nr, kc, kernel = gw.prepack_layout(ctype, storage.name, k, n, qtile, zp)
    buf = _aligned(g * per_group)
    if buf.size:
        gw.prepack(gw.operand(w, _FLOAT32, gw.PACKED), buf, ctype, kc, nr)
    kept = (q.qtype, storage, qtile, np.array(w.scale, copy=True),
            None if w.zero_point is None else np.array(w.zero_point, copy=True))
    return PackedRhs(buf, (g, k, n), dt, ctype, nr, kc, kernel, per_group, kept)


def _int4_values(q):
    """Whether the QArray ``q`` is int4 with every value in [-8, 7] (an int4
    QArray may hold others, read as they are: those keep one byte)."""
    if q.qtype != "int4":
        return False
    x = np.asarray(q.qvalue).view(np.int8)
    return x.size == 0 or bool(x.min() >= -8 and x.max() <= 7)


_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)
_LHS_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _lhs_dtype(lhs_dtype, weights, fn, qtype=None):
    """prepack's ``lhs_dtype`` as a dtype (the weights' dtype ``weights``
    when None), checked against the weights (``qtype``: a QArray's, or None
    for float weights): a float dtype of a product these weights serve, or
    int8 for int8 / int4 QArray weights; TypeError naming it and the fix
    otherwise."""
    if lhs_dtype is None:
        return weights
    try:
        dt = np.dtype(lhs_dtype)
    except TypeError:
        dt = None
    what = "quantized weights" if qtype else f"{weights.name} weights"
    if dt is not None and dt == np.int8:
        if qtype in ("int8", "int4", "mxfp4"):
            return dt
        if qtype:
            raise TypeError(f"{fn}: 'lhs_dtype'=int8 (the int8 dot-product layout) takes int8, int4 or "
                            f"mxfp4 QArray weights, got {qtype} ones: leave lhs_dtype out (a float lhs)")
        raise TypeError(f"{fn}: 'lhs_dtype'=int8 is for int8 QArray weights, got {what}: quantize them "
                        "first (raggeddot.quantize(rhs, 'int8', channelwise_axes=(0, 2))), or leave "
                        "lhs_dtype out for a float lhs")
    if dt is None or dt.name not in _LHS_FLOATS:
        kinds = "float16, bfloat16, float32, float64" + (" or int8" if qtype in ("int8", "int4", "mxfp4") else "")
        raise TypeError(f"{fn}: 'lhs_dtype' must be a dtype of the lhs these {what} will be multiplied "
                        f"with ({kinds}), got {lhs_dtype!r}")
    if dt.name == "float64" and weights.name != "float64":
        raise TypeError(f"{fn}: 'lhs_dtype'=float64 makes float64 products, which prepacked {what} do "
                        "not compute (their layouts are float32 products): prepack float64 weights, "
                        "or multiply them by a float32 lhs")
    return dt


# ----------------------------------------------------------------- meeting an lhs

def _int8_exact(packed):
    """Whether the weights hold int8 values with integral zero points in
    [-128, 127] (or none): those the int8 dot-product layout holds (kept:
    a PackedRhs's values and zero points are its own)."""
    hit = packed._checks.get("int8_exact")
    if hit is None:
        hit = packed._checks["int8_exact"] = packed.ctype in _INT8_LAYOUTS or (
            packed.qtype in ("int8", "int4") and gw.integral_zero_points(packed._zero_point))
    return hit


def _int8_lhs(lhs):
    """An int8 QArray lhs whose products with int8 weights are the exact
    integer ones (as for the plain QArray weights)."""
    return isinstance(lhs, QArray) and lhs.qvalue.dtype == np.int8 and gw.integral_zero_points(lhs.zero_point)


def quantizes_in_kernel(rows, packed):
    """Whether float ``rows`` multiplied by ``packed`` can be quantized to
    int8 per row by the kernels while they pack them (as for the plain
    QArray weights: int8 values, the int8 dot products served)."""
    return isinstance(rows, np.ndarray) and v._dtype_name(rows.dtype) in ("float32", "bfloat16") \
        and (_int8_exact(packed) or packed.qtype == "mxfp4") and _int8_layout() is not None


def _wanted(packed, lhs, quantize_lhs, exact=False):
    """The compute type of the layout that multiplies ``lhs`` as the plain
    weights would (the product the kernels choose for the plain weights),
    or None when no prepacked layout computes it. ``exact``: the call asks
    for exact float32 products (no bfloat16 dot products)."""
    if packed.qtype is None:
        if v._dtype_name(packed.dtype) == "bfloat16":
            bf16 = isinstance(lhs, np.ndarray) and v._dtype_name(lhs.dtype) == "bfloat16" \
                and not quantize_lhs and not exact
            return (_bf16_layout() if bf16 else None) or _LAYOUT["bfloat16"]
        return packed.ctype
    if (quantize_lhs or _int8_lhs(lhs)) and (_int8_exact(packed) or packed.qtype == "mxfp4"):
        per_row = quantize_lhs or lhs.scale.shape[-1] == 1      # one scale along k
        if not per_row:
            return None
        w4 = packed.ctype if packed.ctype in _W4A8.values() else _W4A8.get(packed.qtype)
        # 4 bits a weight, no zero points on either side (the same bits as
        # the one-byte layout: this picks the speed only); int4 values known
        # to lie in [-8, 7] where their float layout is the 4-bit one
        if w4 is not None and (quantize_lhs or lhs.zero_point is None) and packed._zero_point is None \
                and gw.served(w4) and (packed.qtype == "mxfp4" or packed.ctype in (_I4LAYOUT, w4)
                                       or w4 in packed._kept):
            return w4
        return _int8_layout()
    if packed.ctype == _W4A8["mxfp4"]:
        return _F4LAYOUT        # (MXFP4 laid out for int8 rows: the 4-bit float layout)
    if packed.qtype in ("float4_e2m1fn", "mxfp4"):
        return packed.ctype     # its 4-bit (or float8) layout takes every float lhs
    if packed.ctype not in _INT8_LAYOUTS:
        return packed.ctype     # its own layout is the float one
    if packed.qtype == "int4":  # (int4 weights laid out for int8 activations: their float layout)
        held = [ct for ct in (_I4LAYOUT, _QLAYOUT["int4"]) if ct in packed._kept]
        return held[0] if held else _I4LAYOUT if _int4_values(packed.unpack()) else _QLAYOUT["int4"]
    return _QLAYOUT[packed.qtype]


def check(packed, lhs, ct, fn, arg="rhs", quantize_lhs=False, exact=False):
    """The checks of :func:`meet`, which make nothing: the compute type
    (ValueError when no layout of these weights computes in ``ct``) and,
    when the product runs on the PackedRhs's own layout, the kernel family
    (ValueError when the family serving its products now takes panels of
    another width, or none serves them: ``runtime.set_kernel`` since
    prepack). Each message names ``fn``, ``arg`` and the fix. Returns the
    compute type of the layout the product runs on (None: the plain
    weights)."""
    # the answer for an array lhs (or none) depends on its dtype, the
    # options, the layouts kept and the selection: kept while they stay the
    # same (a decode step asks it a few times a product)
    key = None
    if lhs is None or isinstance(lhs, np.ndarray):
        key = (None if lhs is None else lhs.dtype, ct, bool(quantize_lhs), bool(exact), len(packed._kept))
        hit = packed._checks.get(key)
        gen = gw.selection()
        if hit is not None and hit[0] == gen:
            return hit[1]
    own = _FLOAT64 if packed.ctype == "float64" else _FLOAT32
    if ct != own:
        plain = "the QArray" if packed.qtype else "the plain weights"
        raise ValueError(f"{fn}: '{arg}' was prepacked for {own.name} products ({packed.dtype.name} "
                         f"weights{', ' + packed.qtype if packed.qtype else ''}), but this call computes "
                         f"in {ct.name} (an operand or the result is {ct.name}): give {own.name} (or "
                         f"16-bit) operands and result, or pass {plain} ('{arg}'.unpack()) or prepack "
                         f"{ct.name} weights")
    ctype = _wanted(packed, lhs, quantize_lhs, exact)
    if ctype == packed.ctype:
        again = (f"prepack the weights again under these kernels (raggeddot.prepack('{arg}'.unpack()"
                 f"{', lhs_dtype=np.int8' if ctype in _INT8_LAYOUTS else ''})), or select the {packed.kernel} "
                 "kernels they were laid out for (raggeddot.runtime.set_kernel)")
        try:
            nr, kernel = gw.prepack_layout(ctype, v._dtype_name(packed._storage), 0, 0)[1::2]
        except ValueError:
            raise ValueError(f"{fn}: '{arg}' was prepacked for the {packed.kernel} kernels ({ctype} products), "
                             "and no kernel of the selection in force serves those products: "
                             f"{again}") from None
        if nr != packed.nr:
            raise ValueError(f"{fn}: '{arg}' was prepacked for the {packed.kernel} kernels, in panels of "
                             f"{packed.nr} columns, but the {kernel} kernels serve its {ctype} products now "
                             f"and take panels of {nr}: {again}")
    if key is not None:
        packed._checks[key] = (gen, ctype)
    return ctype


def meet(packed, lhs, ct, fn, arg="rhs", quantize_lhs=False, exact=False):
    """``(lhs, weights)`` for a product of ``lhs`` (an array, a QArray, or
    with ``quantize_lhs`` float rows the kernels quantize to int8) and the
    PackedRhs ``packed``, computed in ``ct`` (the call's compute dtype):
    ``weights`` the layout that product runs on as the plain weights'
    would (``packed`` itself, or one made once and kept on it), or the
    plain weights when no layout computes it; ``lhs`` as that layout reads
    it (a QArray dequantized in ``ct`` for a float layout, as the packing of
    the plain call dequantizes it). :func:`check` runs first, so a refused
    product makes no layout. ``exact``: the call asks for exact float32
    products (a precision that rules out the bfloat16 dot products:
    bfloat16 weights then take the widening layout)."""
    ctype = check(packed, lhs, ct, fn, arg, quantize_lhs, exact)
    weights = packed if ctype == packed.ctype else packed._layout(ctype)
    if isinstance(lhs, QArray) and isinstance(weights, PackedRhs) and weights.ctype not in _INT8_LAYOUTS:
        lhs = _dequantized(lhs, ct)
    return lhs, weights


def _dequantized(q, ct):
    """``(qvalue - zero_point) * scale`` in ``ct``, each value as the
    packing of a quantized operand computes it."""
    zp = None if q.zero_point is None else np.asarray(q.zero_point).astype(ct)
    return dequantize(QArray(q.qvalue, np.asarray(q.scale).astype(ct), zp, q.qtype))


def _layout_of(packed, ctype):
    """The layout of compute type ``ctype`` made from ``packed``'s weights
    (None: the plain weights)."""
    w = packed.unpack()
    if ctype is None:
        return w
    lhs_dtype = np.int8 if ctype in _INT8_LAYOUTS else {"float32-bfloat16w": np.float32}.get(ctype)
    if ctype in (_INT8_DOT, _INT8_MMLA) and w.qtype == "mxfp4":
        w = gw.mxfp4_as_int8(w)     # (w4a8 where its own layout is not served)
    elif ctype in (_INT8_DOT, _INT8_MMLA) and w.qtype == "int4":    # (not the 4-bit one)
        w = QArray(w.qvalue, w.scale, w.zero_point, "int8")
    made = prepack(w, lhs_dtype=lhs_dtype)
    if made.ctype != ctype:     # (the selection changed under the caller)
        raise RuntimeError(f"prepack laid weights out for {made.ctype}, not {ctype}")
    return made


def _aligned(nbytes, alignment=64):
    """A new uint8 array of ``nbytes`` whose data starts on an ``alignment``
    boundary (the micro-kernels' aligned vector loads)."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    skip = -raw.ctypes.data % alignment
    return raw[skip:skip + nbytes]

"""The layouts :func:`~raggeddot.prepack` makes (their compute types, as the
C layout names them) and how to read weights back out of them (unpack):
the panel order of each, block by block, with its trailers."""
import numpy as np

from .quant import PackedFloat4, QArray

# The compute type a prepacked rhs of each storage dtype is laid out for:
# float32 / float64 panels as packing makes them per call, and 16-bit
# panels that the micro-kernels widen to float32 in registers (so bfloat16
# and float16 weights keep their 2 bytes an element in memory).
_LAYOUT = {"float32": "float32", "float64": "float64",
           "bfloat16": "float32-bfloat16w", "float16": "float32-float16w"}
# bfloat16 weights to be multiplied by a bfloat16 lhs, where the bfloat16
# dot-product kernels (vdpbf16ps) serve: k-pairs, as those kernels read B;
# where Arm's BFMMLA kernels serve, their blocks of 4 steps.
_BF16_DOT = "bfloat16-dot"
_BF16_MMLA = "bfloat16-mmla"
# int8 weights for an int8 lhs, where the int8 dot-product kernels (vpdpbusd)
# serve: k-quads, each panel followed by its columns' sums, scales and zero
# points, block after block cut at the scale tiles along k; where Arm's
# USMMLA kernels serve, blocks of 8 steps with the same trailers.
_INT8_DOT = "int8-dot"
_INT8_MMLA = "int8-mmla"
# 4-bit weights for an int8 lhs (w4a8), where the AVX-512 VNNI or Arm
# DotProd kernels serve: 4 bits a weight in k-quads, decoded to int8 in the
# micro-kernel, each panel followed by the runs of its scales within the
# scale tiles along k (a float a column for int4, the e8m0 byte for MXFP4,
# whose values the kernels double as they halve the scale).
_W4A8 = {"int4": "int8-int4-dot", "mxfp4": "int8-mxfp4-dot"}
_INT8_LAYOUTS = (_INT8_DOT, _INT8_MMLA) + tuple(_W4A8.values())
# the steps of a block of the contraction in each of those layouts
_UNIT = {_BF16_DOT: 2, _BF16_MMLA: 4, _INT8_DOT: 4, _INT8_MMLA: 8}
# Quantized weights (a QArray): one byte a value in the panels, widened and
# dequantized by the micro-kernel, (q - zero_point) * scale per column, in
# float32 (int4 values are held in int8).
_QLAYOUT = {"int8": "float32-int8w", "int4": "float32-int8w", "float8_e4m3fn": "float32-float8w"}
_TRAILER = 16   # bytes of the header before a quantized panel's scales (rd_qtrailer_t)
# 4-bit weights with power-of-two scales (every "mxfp4" QArray): 4 bits a
# value in the panels, one e8m0 exponent a column per scale run after them.
_F4LAYOUT = "float32-float4w"
# int4 weights (values in [-8, 7]): 4 bits a value in the same nibble order,
# the scales (and zero points) of the one-byte layout after them.
_I4LAYOUT = "float32-int4w"


def unpack(p):
    """The weights a PackedRhs ``p`` holds, ``[g, k, n]`` (PackedRhs.unpack):
    a new array of their dtype, or a new QArray for quantized weights."""
    if p.qtype is not None:
        return _unpack_quantized(p)
    if p.ctype in (_BF16_DOT, _BF16_MMLA):
        return _unpack_pairs(p)
    g, k, n = p.shape
    nr, kc = p.nr, p.kc
    panels = -(-n // nr)
    elem = np.dtype(np.float64) if p.ctype == "float64" else \
        np.dtype(np.float32) if p.ctype == "float32" else p.dtype
    flat = p._buf.view(np.uint8).view(elem).reshape(g, -1)
    if p.ctype == "float32-bfloat16w":   # each row holds its two halves interleaved
        pos = np.arange(nr)
        order = np.where(pos < nr // 2, 2 * pos, 2 * (pos - nr // 2) + 1)
    else:
        order = slice(None)
    out = np.empty((g, k, n), dtype=p.dtype)
    start = 0
    for pc in range(0, k, kc):
        depth = min(kc, k - pc)
        block = flat[:, start:start + panels * depth * nr].reshape(g, panels, depth, nr)
        block = block[..., order].transpose(0, 2, 1, 3).reshape(g, depth, panels * nr)
        out[:, pc:pc + depth, :] = block[:, :, :n]
        start += panels * depth * nr
    return out


def _unpack_pairs(p):
    """unpack of the k-pair layout (and of the blocks of 4 steps of the
    MMLA one): per KC block of depth d (kp = d rounded up to the unit u),
    panels of [kp / u, NR, u] bfloat16 values."""
    g, k, n = p.shape
    nr, kc, u = p.nr, p.kc, _UNIT[p.ctype]
    panels = -(-n // nr)
    flat = p._buf.view(np.uint8).view(p.dtype).reshape(g, -1)
    out = np.empty((g, k, n), dtype=p.dtype)
    start = 0
    for pc in range(0, k, kc):
        depth = min(kc, k - pc)
        kp = -(-depth // u) * u
        block = flat[:, start:start + panels * kp * nr].reshape(g, panels, kp // u, nr, u)
        block = block.transpose(0, 2, 4, 1, 3).reshape(g, kp, panels * nr)
        out[:, pc:pc + depth, :] = block[:, :depth, :n]
        start += panels * kp * nr
    return out


def _unpack_quantized(p):
    """unpack of the quantized layouts (the QArray given to prepack)."""
    if p.ctype == _F4LAYOUT:
        return _unpack_float4(p)
    g, k, n = p.shape
    nr, kc = p.nr, p.kc
    panels = -(-n // nr)
    flat = p._buf.view(np.uint8).reshape(g, -1)
    values = np.empty((g, k, n), dtype=np.uint8)
    start, pc = 0, 0
    while pc < k:
        if p.ctype in _W4A8.values():  # [kq / 4, 2 NR] bytes, then the trailer of runs
            depth = min(kc, k - pc)
            r = (pc + depth) % p._qtile     # (a block ends where a tile starts: rd_w4a8_depth)
            depth = depth - r if pc + depth < k and 0 < r < depth else depth
            kq = -(-depth // 4) * 4
            step = nr * kq // 2 + _TRAILER + _runs(pc, depth, p._qtile) * nr * (1 if p.qtype == "mxfp4" else 4)
            block = flat[:, start:start + panels * step].reshape(g, panels, step)[:, :, :nr * kq // 2]
            block = block.reshape(g, panels, kq // 4, nr // 2, 4)
            both = np.concatenate([block & 0xF, block >> 4], axis=3)       # codes [g, panels, kq/4, nr, 4]
            block = both.transpose(0, 2, 4, 1, 3).reshape(g, kq, panels * nr)
            if p.qtype != "mxfp4":
                block = ((block ^ 8).astype(np.int16) - 8).astype(np.int8).view(np.uint8)
        elif p.ctype in _INT8_LAYOUTS:   # [kq / u, NR, u] (u: 4, or 8), then 12 bytes a column
            u = _UNIT[p.ctype]
            depth = min(kc, k - pc, p._qtile - pc % p._qtile)
            kq = -(-depth // u) * u
            step = nr * kq + 12 * nr
            block = flat[:, start:start + panels * step].reshape(g, panels, step)[:, :, :nr * kq]
            block = block.reshape(g, panels, kq // u, nr, u).transpose(0, 2, 4, 1, 3).reshape(g, kq, -1)
        elif p.ctype == _I4LAYOUT:     # [depth, NR / 2] nibbles, then the one-byte layout's trailer
            depth = min(kc, k - pc)
            step = _qpanel_bytes(nr, pc, depth, p._qtile, p._zero_point is not None, nibbles=True)
            block = flat[:, start:start + panels * step].reshape(g, panels, step)[:, :, :nr * depth // 2]
            block = block.reshape(g, panels, depth, nr // 2)
            both = np.concatenate([block & 0xF, block >> 4], axis=-1)   # codes, [g, panels, depth, nr]
            both = ((both ^ 8).astype(np.int16) - 8).astype(np.int8).view(np.uint8)
            block = both.transpose(0, 2, 1, 3).reshape(g, depth, panels * nr)
        else:
            depth = min(kc, k - pc)
            step = _qpanel_bytes(nr, pc, depth, p._qtile, p._zero_point is not None)
            block = flat[:, start:start + panels * step].reshape(g, panels, step)[:, :, :nr * depth]
            block = block.reshape(g, panels, depth, nr).transpose(0, 2, 1, 3).reshape(g, depth, panels * nr)
        values[:, pc:pc + depth, :] = block[:, :depth, :n]
        start += panels * step
        pc += depth
    zp = None if p._zero_point is None else p._zero_point.copy()
    if p.qtype == "mxfp4":
            return QArray(PackedFloat4.pack(values.view(p._storage), -1), p._scale.copy(), None, p.qtype)
    return QArray(values.view(p._storage), p._scale.copy(), zp, p.qtype)


def _unpack_float4(p):
    """unpack of the 4-bit layout: per block (KC deep, cut nowhere
    else), panels of ``depth * NR / 2`` bytes (columns j and j + NR/2
    in the low and high nibbles of byte j of a step), then the trailer."""
    g, k, n = p.shape
    nr, kc = p.nr, p.kc
    panels = -(-n // nr)
    flat = p._buf.view(np.uint8).reshape(g, -1)
    codes = np.empty((g, k, panels * nr), dtype=np.uint8)
    start = 0
    for pc in range(0, k, kc):
        depth = min(kc, k - pc)
        step = _f4panel_bytes(nr, pc, depth, p._qtile)
        block = flat[:, start:start + panels * step].reshape(g, panels, step)[:, :, :depth * nr // 2]
        block = block.reshape(g, panels, depth, nr // 2)
        both = np.concatenate([block & 0xF, block >> 4], axis=-1)      # [g, panels, depth, nr]
        codes[:, pc:pc + depth, :] = both.transpose(0, 2, 1, 3).reshape(g, depth, panels * nr)
        start += panels * step
    values = PackedFloat4.pack(codes[:, :, :n].view(p._storage), -1)
    return QArray(values, p._scale.copy(), None, p.qtype)


def _runs(pc, kc, qtile):
    """Runs of the block at ``pc`` (``kc`` deep) within the scale tiles along
    k, ``qtile`` deep (rd_qruns of rd_ptrailer's trailer)."""
    first, tile = min(qtile - pc % qtile, kc), min(qtile, kc)
    return 1 if kc <= first else 1 + -(-(kc - first) // tile)


def _f4panel_bytes(nr, pc, kc, qtile):
    """Bytes of one micro-panel of 4-bit weights in the block at ``pc``
    (``kc`` deep): the values, the trailer header, one exponent byte a
    column per run (rd_ppanel_bytes)."""
    return nr * kc // 2 + _TRAILER + _runs(pc, kc, qtile) * nr


def _qpanel_bytes(nr, pc, kc, qtile, zp, nibbles=False):
    """Bytes of one micro-panel of quantized weights in the block at ``pc``
    (``kc`` deep): the values (half a byte each with ``nibbles``), the
    trailer header, then per run of the block within one scale tile along k
    (``qtile`` deep) ``nr`` scales (and ``nr`` zero points). The C layout's
    rule (rd_ppanel_bytes)."""
    return (nr * kc // 2 if nibbles else nr * kc) + _TRAILER + _runs(pc, kc, qtile) * nr * 4 * (2 if zp else 1)

"""w4a8: int4 and MXFP4 weights times int8 rows on the int8 dot products, the
weights 4 bits each in their prepacked layout (int8-int4-dot, int8-mxfp4-dot).

The semantics (rd_kernel.h): an MXFP4 value v is the int8 2v with the scale
2^(e - 128) (exact), so MXFP4 meeting int8 rows is the int8 QArray of the
same weights; per run of the contraction within one scale tile, the exact
integer sum t of the products, then (float32)t * (sa * sb), the runs added
into the result in order (the first one stored). Held here to an
independent NumPy oracle bit for bit, to the plain QArray's call, to the
one-byte int8-dot layout, on every family that serves the types (the native
AVX-512 VNNI kernels and their plain-C twin), at 1 to 13 rows a group
(few-row kernels and micro-kernel), every thread count, panel edges and
contractions that are not a multiple of 4."""
import ml_dtypes
import numpy as np
import pytest

import raggeddot
from raggeddot import quant, runtime
from raggeddot import _gateway as gw

from helpers import DOT_KERNELS, bits

W4A8 = {"int4": "int8-int4-dot", "mxfp4": "int8-mxfp4-dot"}
FAMILIES = DOT_KERNELS["int8-int4-dot"]


def _weights(rng, qtype, g, k, n, tile):
    w = rng.standard_normal((g, k, n)).astype(np.float32) * np.float32(0.05)
    tiled = {} if tile is None else {"tiled_axes": {1: tile}}
    return quant.quantize(w, qtype, channelwise_axes=(0, 2), **tiled)


def _int8_values(q):
    """(values int64 [g, k, n], scales float32 [g, k // tile, n], tile) as the
    int8 products read the 4-bit QArray q."""
    if q.qtype == "mxfp4":
        v = np.asarray(q.qvalue).astype(np.float64) * 2
        s = np.asarray(q.scale, dtype=np.float32) * np.float32(0.5)
    else:
        v = np.asarray(q.qvalue).astype(np.float64)
        s = np.asarray(q.scale, dtype=np.float32)
    return v.astype(np.int64), s, q.shape[1] // s.shape[1]


KC = 2048   # the contraction's cache block of every family serving w4a8 (and int8-dot)


def _oracle(xq, q, group_sizes, kc=KC):
    """ragged_dot of the int8 QArray rows xq (one scale a row) and q, as the
    w4a8 semantics define it, in NumPy: per row, group and run (a scale tile
    along k, cut every KC steps from its start, as the int8 products cut
    their blocks), the exact integer sum, scaled in float32 and added in
    order."""
    a = np.asarray(xq.qvalue).astype(np.int64)
    sa = np.asarray(xq.scale, dtype=np.float32).reshape(-1)
    v, s, tile = _int8_values(q)
    m, k = a.shape
    out = np.zeros((m, q.shape[2]), dtype=np.float32)
    row = 0
    for e, size in enumerate(group_sizes):
        for i in range(row, row + size):
            acc = None
            cuts = sorted({c for t0 in range(0, k, tile) for c in range(t0, min(k, t0 + tile), kc)} | {k})
            for p0, p1 in zip(cuts[:-1], cuts[1:]):
                total = a[i, p0:p1] @ v[e, p0:p1]
                f = total.astype(np.float32) * (sa[i] * s[e, p0 // tile])
                acc = f if acc is None else (acc + f).astype(np.float32)
            out[i] = acc
        row += size
    return out


CASES = [("int4", 32, 256, 70), ("int4", 128, 512, 64), ("int4", 12, 96, 33), ("int4", None, 223, 40),
         ("mxfp4", 32, 224, 97), ("mxfp4", 32, 64, 31), ("mxfp4", 32, 2080, 40), ("int4", 96, 2112, 33),
         ("int4", 2200, 4400, 24),
         # 150 scale runs in a block: the few-row kernels take them in parts of whole runs
         ("int4", 4, 600, 40)]


@pytest.mark.skipif(not FAMILIES, reason="no kernel family serves w4a8 products on this build")
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("qtype,tile,k,n", CASES)
def test_w4a8_layout_gives_the_oracle_and_the_plain_bits(rng, family, qtype, tile, k, n):
    gs = np.array([1, 2, 0, 3, 4, 5, 13, 6, 8, 7], dtype=np.int64)     # (1-8 rows: the few-row kernels)
    q = _weights(rng, qtype, len(gs), k, n, tile)
    x = rng.standard_normal((int(gs.sum()), k)).astype(np.float32)
    xq = raggeddot.quantize(x, "int8", channelwise_axes=(0,))
    want = _oracle(xq, q, gs)
    with runtime.configured(kernel=family):
        packed = raggeddot.prepack(q, lhs_dtype=np.int8)
        assert packed.ctype == W4A8[qtype]
        for threads in (1, 2, 3):
            with runtime.configured(num_threads=threads):
                got = raggeddot.ragged_dot(xq, packed, gs)
            assert np.array_equal(bits(got), bits(want)), (family, qtype, tile, threads)
        # the plain QArray (MXFP4: as the int8 QArray of its values) and the
        # one-byte layout of the int8 dot products give the same bits
        plain = raggeddot.ragged_dot(xq, q, gs)
        assert np.array_equal(bits(plain), bits(want))
        as_int8 = gw.mxfp4_as_int8(q) if qtype == "mxfp4" else quant.QArray(q.qvalue, q.scale, None, "int8")
        byte = raggeddot.prepack(as_int8, lhs_dtype=np.int8)
        assert byte.ctype in ("int8-dot", "int8-mmla")
        assert np.array_equal(bits(raggeddot.ragged_dot(xq, byte, gs)), bits(want))
        # into an out holding other values
        out = np.full_like(want, 3.0)
        raggeddot.ragged_dot(xq, packed, gs, out=out)
        assert np.array_equal(bits(out), bits(want))
        # the weights it holds come back as they were given
        u = packed.unpack()
        assert u.qtype == q.qtype
        assert np.array_equal(quant.dequantize(u), quant.dequantize(q))


@pytest.mark.skipif(not FAMILIES, reason="no kernel family serves w4a8 products on this build")
@pytest.mark.parametrize("family", FAMILIES)
def test_a_block_longer_than_the_few_row_kernels_take_runs_on_the_micro_kernel(rng, family):
    """The few-row kernels take contraction blocks of at most 2048 steps (their
    copy of the rows lives on the stack); weights prepacked under a longer
    block (4096, set for the type) run on the micro-kernel at 1-4 rows a group,
    with the oracle's bits at that block (one scale a column: the block's cut
    is the only one, so the bits tell the blocks apart)."""
    from raggeddot import _core
    gs = np.array([1, 2, 3, 4, 1], dtype=np.int64)
    q = _weights(rng, "int4", len(gs), 4400, 40, None)
    x = rng.standard_normal((int(gs.sum()), 4400)).astype(np.float32)
    xq = raggeddot.quantize(x, "int8", channelwise_axes=(0,))
    with runtime.configured(kernel=family):
        _core.set_blocking("int8-int4-dot", 144, 4096, 4080)
        packed = raggeddot.prepack(q, lhs_dtype=np.int8)
        got = raggeddot.ragged_dot(xq, packed, gs)
    assert np.array_equal(bits(got), bits(_oracle(xq, q, gs, kc=4096)))
    assert not np.array_equal(bits(got), bits(_oracle(xq, q, gs)))


@pytest.mark.skipif(not FAMILIES, reason="no kernel family serves w4a8 products on this build")
@pytest.mark.parametrize("family", FAMILIES)
def test_the_layout_serves_float_rows_too(rng, family):
    # a float lhs meets the weights' float layout (made once, kept): the
    # bits of the QArray with that lhs
    g, k, n = 3, 128, 48
    gs = np.array([2, 1, 3], dtype=np.int64)
    x = rng.standard_normal((6, k)).astype(np.float32)
    with runtime.configured(kernel=family):
        for qtype in W4A8:
            q = _weights(rng, qtype, g, k, n, 32)
            packed = raggeddot.prepack(q, lhs_dtype=np.int8)
            got = raggeddot.ragged_dot(x, packed, gs)
            assert np.array_equal(bits(got), bits(raggeddot.ragged_dot(x, q, gs))), qtype
            assert set(packed.layouts) == {W4A8[qtype], "float32-int4w" if qtype == "int4" else "float32-float4w"}


@pytest.mark.skipif(not FAMILIES, reason="no kernel family serves w4a8 products on this build")
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("x_dtype", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bfloat16"])
def test_moe_block_w4a8_decode_and_prefill(rng, family, x_dtype):
    # activation_qtype="int8": the rows quantized while packed; the plain
    # QArrays, the w4a8 layouts and (for int4) the layouts for a float lhs
    # meeting int8 rows give one result bit for bit, at decode and prefill
    E, d, f = 8, 128, 96
    router = rng.standard_normal((d, E)).astype(np.float32)
    ws = [rng.standard_normal(s).astype(np.float32) * np.float32(0.1) for s in ((E, d, f), (E, d, f), (E, f, d))]
    with runtime.configured(kernel=family):
        for qtype in W4A8:
            qs = [quant.quantize(w, qtype, channelwise_axes=(0, 2), tiled_axes={1: 32}) for w in ws]
            w4 = [raggeddot.prepack(q, lhs_dtype=np.int8) for q in qs]
            assert all(p.ctype == W4A8[qtype] for p in w4)
            for T in (1, 3, 40):
                x = rng.standard_normal((T, d)).astype(x_dtype)
                want = raggeddot.moe_block(x, router, *qs, top_k=2, activation_qtype="int8")
                got = raggeddot.moe_block(x, router, *w4, top_k=2, activation_qtype="int8")
                assert np.array_equal(bits(got), bits(want)), (qtype, T)
                # the same layer in float is near (the rows' quantization aside)
                ref = raggeddot.moe_block(x, router, *qs, top_k=2).astype(np.float32)
                err = np.abs(np.asarray(got, np.float32) - ref).max() / np.abs(ref).max()
                assert err < 0.05, (qtype, T, err)


@pytest.mark.skipif(not FAMILIES, reason="no kernel family serves w4a8 products on this build")
def test_weights_the_4bit_layout_cannot_hold_take_the_byte_layout(rng):
    g, k, n = 2, 96, 40
    gs = np.array([2, 1], dtype=np.int64)
    x = rng.standard_normal((3, k)).astype(np.float32)
    xq = raggeddot.quantize(x, "int8", channelwise_axes=(0,))
    w = rng.standard_normal((g, k, n)).astype(np.float32)
    held = [quant.quantize(w, "int4", channelwise_axes=(0, 2), tiled_axes={1: 6}),        # runs of 6 steps
            quant.quantize(w, "int4", channelwise_axes=(0, 2), calibration_method="minmax")]  # zero points
    for q in held:
        packed = raggeddot.prepack(q, lhs_dtype=np.int8)
        assert packed.ctype in ("int8-dot", "int8-mmla")
        assert np.array_equal(bits(raggeddot.ragged_dot(xq, packed, gs)), bits(raggeddot.ragged_dot(xq, q, gs)))
    # an int8 lhs with zero points on w4a8 weights: the one-byte layout, made once
    q = quant.quantize(w, "int4", channelwise_axes=(0, 2), tiled_axes={1: 32})
    packed = raggeddot.prepack(q, lhs_dtype=np.int8)
    xz = raggeddot.quantize(x, "int8", channelwise_axes=(0,), calibration_method="minmax")
    assert xz.zero_point is not None
    got = raggeddot.ragged_dot(xz, packed, gs)
    assert np.array_equal(bits(got), bits(raggeddot.ragged_dot(xz, q, gs)))
    assert {"int8-dot", "int8-mmla"} & set(packed.layouts)


def test_the_c_layout_refuses_what_it_cannot_hold(rng):
    from raggeddot import _core
    if not FAMILIES:
        pytest.skip("no kernel family serves w4a8 products on this build")
    w = rng.standard_normal((1, 64, 32)).astype(np.float32)
    wide = quant.quantize(w, "int8", channelwise_axes=(0, 2))          # values past [-8, 7]
    two = quant.quantize(w, "int4", channelwise_axes=(0, 2), tiled_axes={1: 2})    # runs of 2 steps
    zp = quant.quantize(w, "int4", channelwise_axes=(0, 2), calibration_method="minmax")
    for q, what in [(wide, "[-8, 7]"), (two, "multiple of 4"), (zp, "no zero points")]:
        per, nr, kc, _ = _core.prepack_layout("int8-int4-dot", "int8", 64, 32, q.tile_shape[1], q.zero_point is not None)
        buf = np.zeros(per + 64, np.uint8)
        buf = buf[-buf.ctypes.data % 64:][:per]
        with pytest.raises(ValueError, match=what.replace("[", r"\[").replace("]", r"\]")):
            _core.prepack(gw.operand(q, np.dtype(np.float32), gw.PACKED), buf, "int8-int4-dot", kc, nr)
    # MXFP4's layout reads 4-bit floats only
    with pytest.raises(TypeError, match="int8-mxfp4-dot"):
        _core.prepack_layout("int8-mxfp4-dot", "int8", 64, 32, 32, False)

"""Prepacked quantized weights (raggeddot.prepack of a QArray): one byte a
weight in the panels, widened and dequantized by the micro-kernel. Results
equal a call with the QArray itself bit for bit (the per-call path
dequantizes into float32 panels), on every kernel family and every tiling of
the scales, and are close to the NumPy reference on the dequantized weights.
"""
import ml_dtypes
import numpy as np
import pytest

import raggeddot
from raggeddot import RaggedDotDimensionNumbers as DN
from raggeddot import quant, reference, runtime

from helpers import KERNELS, check_close, random_group_sizes

QTYPES = ["int8", "int4", "float8_e4m3fn"]

# (name, quantize keywords for w [g, k, n]): k = 384 runs past one KC block
# (256), so subchannel tiles of 32 and 128 lie within blocks (several to a
# block) and the tile [192, 288) of 96 is cut by the block boundary at 256;
# tiles along n of 8 and 24 are not multiples of NR.
TILINGS = [
    ("per_tensor", dict()),
    ("per_channel", dict(channelwise_axes=(0, 2))),
    ("sub_k32", dict(channelwise_axes=(0, 2), tiled_axes={1: 32})),
    ("sub_k64_n24", dict(channelwise_axes=(0,), tiled_axes={1: 64, 2: 24})),
    ("sub_k128", dict(channelwise_axes=(0, 2), tiled_axes={1: 128})),
    ("sub_k96", dict(channelwise_axes=(0, 2), tiled_axes={1: 96})),
    ("tiles_n8_g", dict(tiled_axes={0: 2, 2: 8})),
    ("zero_points", dict(channelwise_axes=(0, 2), tiled_axes={1: 32}, calibration_method="minmax")),
    ("zero_points_k96", dict(channelwise_axes=(0,), tiled_axes={1: 96}, calibration_method="minmax")),
]


def _weights(rng, qtype, g, k, n, kw):
    if kw.get("calibration_method") == "minmax" and qtype == "float8_e4m3fn":
        # qwix's float8 is symmetric: zero points given by hand
        q = quant.quantize(rng.standard_normal((g, k, n)).astype(np.float32), qtype,
                           **{a: b for a, b in kw.items() if a != "calibration_method"})
        zp = rng.integers(-3, 4, q.scale.shape).astype(np.float32)
        return quant.QArray(q.qvalue, q.scale, zp, qtype)
    return quant.quantize(rng.standard_normal((g, k, n)).astype(np.float32), qtype, **kw)


def _check(lhs, q, gs, packed, rtol=1e-5):
    want = raggeddot.ragged_dot(lhs, q, gs)
    got = raggeddot.ragged_dot(lhs, packed, gs)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    ref = reference.ragged_dot(lhs.astype(np.float64), quant.dequantize(q).astype(np.float64), gs)
    check_close(got.astype(np.float64), ref, rtol=rtol if lhs.dtype == np.float32 else 2e-2)
    return got


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("tiling", TILINGS, ids=[t[0] for t in TILINGS])
def test_equals_the_quantized_call_bit_for_bit(rng, kernel, qtype, tiling):
    _, kw = tiling
    g, k, n, m = 4, 384, 48, 90
    q = _weights(rng, qtype, g, k, n, kw)
    gs = random_group_sizes(rng, g, m)
    gs[1] = 0
    with runtime.configured(kernel=kernel):
        packed = raggeddot.prepack(q)
        assert packed.kernel == kernel and packed.qtype == qtype
        assert packed.shape == (g, k, n) and packed.dtype == np.float32
        for lt in (np.float32, ml_dtypes.bfloat16):
            lhs = rng.standard_normal((m, k)).astype(lt)
            got = _check(lhs, q, gs, packed)
            assert got.dtype == np.float32
        # gmm and ragged_dot_general (ragged_dot's dimension numbers)
        lhs = rng.standard_normal((m, k)).astype(np.float32)
        assert np.array_equal(raggeddot.gmm(lhs, packed, gs), raggeddot.gmm(lhs, q, gs))
        dn = DN((([1], [1]), ([], [])), [0], [0])
        assert np.array_equal(raggeddot.ragged_dot_general(lhs, packed, gs, dn),
                              raggeddot.ragged_dot_general(lhs, q, gs, dn))
        # unpack gives the QArray back
        u = packed.unpack()
        assert isinstance(u, quant.QArray) and u.qtype == qtype
        assert np.array_equal(u.qvalue.view(np.uint8), q.qvalue.view(np.uint8))
        assert np.array_equal(u.scale, q.scale)
        assert (u.zero_point is None) == (q.zero_point is None)
        if q.zero_point is not None:
            assert np.array_equal(u.zero_point, q.zero_point)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("qtype", QTYPES)
def test_transposed_weights_and_odd_shapes(rng, kernel, qtype):
    """transpose_rhs ([g, n, k] given); k = 1, odd n, n < NR, k not a
    multiple of anything, float16 lhs, group_offset; with several threads."""
    with runtime.configured(kernel=kernel, num_threads=2):
        for g, k, n, m, kw in [(3, 1, 7, 20, dict(channelwise_axes=(0, 2))),
                               (2, 515, 5, 33, dict(channelwise_axes=(0, 1), tiled_axes={2: 5})),
                               (5, 96, 33, 70, dict(channelwise_axes=(0, 1), tiled_axes={2: 32})),
                               (1, 257, 64, 9, dict())]:
            wt = _weights(rng, qtype, g, n, k, kw)             # [g, n, k]
            packed = raggeddot.prepack(wt, transpose_rhs=True)
            q = wt.transpose(0, 2, 1)
            lhs = rng.standard_normal((m, k)).astype(np.float32)
            gs = random_group_sizes(rng, g, m)
            _check(lhs, q, gs, packed)
            assert np.array_equal(raggeddot.gmm(lhs, packed, gs), raggeddot.gmm(lhs, wt, gs, transpose_rhs=True))
            h = lhs.astype(np.float16)
            assert np.array_equal(raggeddot.ragged_dot(h, packed, gs), raggeddot.ragged_dot(h, q, gs))
            assert np.array_equal(packed.unpack().qvalue.view(np.uint8), q.qvalue.view(np.uint8))
        # a slice of the groups, with group_offset
        q = _weights(rng, qtype, 6, 40, 20, dict(channelwise_axes=(0, 2)))
        packed = raggeddot.prepack(q[2:5])
        lhs = rng.standard_normal((60, 40)).astype(np.float32)
        gs = np.array([5, 10, 0, 20, 15, 10])
        assert np.array_equal(raggeddot.ragged_dot(lhs, packed, gs, group_offset=2),
                              raggeddot.ragged_dot(lhs, q[2:5], gs, group_offset=2))


def test_float8_widening_is_exact_for_every_code(rng):
    """Every float8_e4m3fn code but the NaNs, through every family: one
    column per code, k = 1, scale 1, lhs rows 1 and -0.5: the output is the code's
    value exactly (ml_dtypes' conversion as the oracle; a -0 code sums to +0
    from the accumulator's +0, as in the per-call path)."""
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    n = codes.size
    qv = codes.view(ml_dtypes.float8_e4m3fn).reshape(1, 1, n)
    q = quant.QArray(qv, np.ones((1, 1, 1), np.float32))
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    for kernel in KERNELS:
        with runtime.configured(kernel=kernel):
            lhs = np.array([[1.0], [-0.5]], np.float32)
            got = raggeddot.ragged_dot(lhs, raggeddot.prepack(q), np.array([2]))
            assert np.array_equal(got, want * lhs)
            assert np.array_equal(got.view(np.uint32),
                                  raggeddot.ragged_dot(lhs, q, np.array([2])).view(np.uint32))


def test_empty_groups_and_empty_weights(rng):
    q = _weights(rng, "int8", 4, 64, 20, dict(channelwise_axes=(0, 2)))
    packed = raggeddot.prepack(q)
    lhs = rng.standard_normal((30, 64)).astype(np.float32)
    for gs in ([0, 0, 0, 0], [30, 0, 0, 0], [0, 0, 0, 25], [0, 10, 0, 10]):
        gs = np.array(gs)
        assert np.array_equal(raggeddot.ragged_dot(lhs, packed, gs), raggeddot.ragged_dot(lhs, q, gs))
    for shape in [(2, 0, 3), (2, 4, 0)]:
        e = quant.quantize(np.ones(shape, np.float32), "int8", channelwise_axes=(0, 2))
        lhs = np.ones((5, shape[1]), np.float32)
        gs = np.array([2, 2])
        got = raggeddot.ragged_dot(lhs, raggeddot.prepack(e), gs)
        assert np.array_equal(got, raggeddot.ragged_dot(lhs, e, gs)) and got.shape == (5, shape[2])


def test_memory_is_one_byte_a_weight_plus_scales(rng):
    """int8 weights: the panels hold k * ceil(n / NR) * NR bytes a group, the
    scales after each panel add 4 bytes a column per KC block (per tile
    within a block with subchannel scales), nbytes counts those and the copy
    of the scales kept for unpack(), and nothing depends on the QArray
    afterwards."""
    g, k, n = 3, 512, 256
    w = rng.standard_normal((g, k, n)).astype(np.float32)
    q = quant.quantize(w, "int8", channelwise_axes=(0, 2))
    packed = raggeddot.prepack(q)
    nr, kc = packed.nr, packed.kc
    blocks = -(-k // kc)
    assert packed.nbytes == g * (k * n + blocks * (n // nr) * (16 + 4 * nr)) + q.scale.nbytes
    assert packed.nbytes < w.nbytes / 3.9
    lhs = rng.standard_normal((24, k)).astype(np.float32)
    gs = np.array([8, 8, 8])
    want = raggeddot.ragged_dot(lhs, q, gs)
    q.qvalue[...] = 0
    q.scale[...] = 0
    assert np.array_equal(raggeddot.ragged_dot(lhs, packed, gs), want)


def test_derivatives_are_those_of_the_dequantized_weights(rng):
    q = _weights(rng, "int8", 5, 70, 24, dict(channelwise_axes=(0, 2), tiled_axes={1: 35}))
    packed = raggeddot.prepack(q)
    lhs = rng.standard_normal((120, 70)).astype(np.float32)
    gs = random_group_sizes(rng, 5, 120)
    ct = rng.standard_normal((120, 24)).astype(np.float32)
    for op in (raggeddot.ragged_dot, raggeddot.gmm):
        out, vjp_fn = raggeddot.vjp(op, lhs, packed, gs)
        want_out, want_fn = raggeddot.vjp(op, lhs, q, gs)
        assert np.array_equal(out, want_out)
        (dl, dr, _), (wl, wr, _) = vjp_fn(ct), want_fn(ct)
        assert np.array_equal(dl, wl) and np.array_equal(dr, wr)
        assert dr.shape == q.shape and dr.dtype == np.float32
        t_l = rng.standard_normal(lhs.shape).astype(np.float32)
        t_r = rng.standard_normal(q.shape).astype(np.float32)
        _, tan = raggeddot.jvp(op, (lhs, packed, gs), (t_l, t_r, None))
        _, want_tan = raggeddot.jvp(op, (lhs, q, gs), (t_l, t_r, None))
        assert np.array_equal(tan, want_tan)


@pytest.mark.parametrize("qtype", QTYPES)
def test_moe_block_with_prepacked_quantized_experts(rng, qtype):
    """moe_block and moe_block_vjp with prepacked quantized w0, w1, wo equal
    those with the QArrays, bit for bit (forward and every gradient)."""
    T, d, f, E = 96, 64, 48, 6
    x = rng.standard_normal((T, d)).astype(np.float32)
    rw = rng.standard_normal((d, E)).astype(np.float32)
    qs = [quant.quantize(rng.standard_normal(s).astype(np.float32) / 4, qtype, channelwise_axes=(0, 2),
                         tiled_axes={1: 16})
          for s in ((E, d, f), (E, d, f), (E, f, d))]
    packed = [raggeddot.prepack(q) for q in qs]
    kw = dict(top_k=2, norm_topk_prob=True)
    assert np.array_equal(raggeddot.moe_block(x, rw, *packed, **kw), raggeddot.moe_block(x, rw, *qs, **kw))
    out, vjp_fn = raggeddot.moe_block_vjp(x, rw, *packed, **kw)
    want, want_fn = raggeddot.moe_block_vjp(x, rw, *qs, **kw)
    assert np.array_equal(out, want)
    d_out = rng.standard_normal(out.shape).astype(np.float32)
    got, exp = vjp_fn(d_out), want_fn(d_out)
    assert got.keys() == exp.keys() and {"x", "w0", "w1", "wo"} <= set(got)
    for name in exp:
        assert got[name].dtype == exp[name].dtype and np.array_equal(got[name], exp[name]), name


def test_errors_name_what_is_wrong(rng):
    q = _weights(rng, "int8", 2, 16, 8, dict(channelwise_axes=(0, 2)))
    # int8 codes whose bits look like float8 NaNs (127, -1) are values
    qv = q.qvalue.copy()
    qv[0, 0, :2] = [127, -1]
    raggeddot.prepack(quant.QArray(qv, q.scale))
    # float8 NaN codes (0x7f, 0xff) are refused, naming rhs
    codes = np.zeros((2, 16, 8), np.uint8)
    codes[1, 3, 2] = 0xFF
    f8 = quant.QArray(codes.view(ml_dtypes.float8_e4m3fn), np.ones((2, 1, 8), np.float32))
    with pytest.raises(ValueError, match=r"'rhs' holds NaN at \(1, 3, 2\)"):
        raggeddot.prepack(f8)
    codes[1, 3, 2] = 0x7F
    with pytest.raises(ValueError, match="NaN"):
        raggeddot.prepack(quant.QArray(codes.view(ml_dtypes.float8_e4m3fn), np.ones((2, 1, 8), np.float32)))
    with pytest.raises(ValueError, match="3-D 'rhs'"):
        raggeddot.prepack(q[0])
    with pytest.raises(ValueError, match="float64 scales"):
        raggeddot.prepack(quant.QArray(q.qvalue, q.scale.astype(np.float64)))
    packed = raggeddot.prepack(q)
    lhs = rng.standard_normal((10, 16)).astype(np.float32)
    gs = np.array([5, 5])
    with pytest.raises(ValueError, match="^ragged_dot: 'rhs' was prepacked for float32 products.*float64"):
        raggeddot.ragged_dot(lhs.astype(np.float64), packed, gs)
    with pytest.raises(ValueError, match="contracting"):
        raggeddot.ragged_dot(lhs[:, :10], packed, gs)
    for kernel in KERNELS:
        with runtime.configured(kernel=kernel):
            if raggeddot.prepack(q).nr != packed.nr:
                with pytest.raises(ValueError, match=r"^ragged_dot: 'rhs' was prepacked for the .* kernels.*prepack the weights again"):
                    raggeddot.ragged_dot(lhs, packed, gs)

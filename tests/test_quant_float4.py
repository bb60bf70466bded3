"""4-bit float weights: the "float4_e2m1fn" and "mxfp4" qtypes, their
storage two values a byte, from_mxfp4, and products that equal those on the
dequantized weights bit for bit on every kernel family."""
import functools

import numpy as np
import pytest

import raggeddot as rd
from raggeddot import _gateway as gw
from raggeddot import quant, reference, runtime
from raggeddot.quant import PackedFloat4, QArray

from helpers import KERNELS

ml_dtypes = pytest.importorskip("ml_dtypes")
F4 = np.dtype(ml_dtypes.float4_e2m1fn)
E8 = np.dtype(ml_dtypes.float8_e8m0fnu)
BF16 = np.dtype(ml_dtypes.bfloat16)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def mx(rng, shape, axis=1, spread=4):
    """An "mxfp4" QArray of random values and scales over a wide range."""
    w = rng.standard_normal(shape).astype(np.float32)
    w *= np.exp2(rng.integers(-spread, spread + 1, shape[:axis] + (1,) * (len(shape) - axis))).astype(np.float32)
    chan = tuple(a for a in range(len(shape)) if a != axis)
    return quant.quantize(w, "mxfp4", channelwise_axes=chan, tiled_axes={axis: 32})


def mx_oracle(x):
    """OCP MX v1.0 along the last axis (blocks of 32), element by element."""
    xb = x.reshape(-1, 32).astype(np.float64)
    codes = np.empty(xb.shape, np.uint8)
    exps = np.empty(xb.shape[0], np.int64)
    for i, row in enumerate(xb):
        amax = np.abs(row).max()
        e = int(np.floor(np.log2(amax))) - 2 if amax > 0 else 0
        e = min(max(e, -127), 127)
        exps[i] = e + 127
        for j, val in enumerate(row / 2.0 ** e):
            val = min(max(val, -6.0), 6.0)
            d = np.abs(E2M1 - val)
            best = np.flatnonzero(d == d.min())
            if len(best) > 1:      # a tie: the even code (mantissa bit 0), sign of the value
                best = [b for b in best if b % 2 == 0 and (b >= 8) == (val < 0)] or best
            codes.flat[i * 32 + j] = best[0]
    return codes.reshape(x.shape), exps.reshape(x.shape[:-1] + (x.shape[-1] // 32,))


@pytest.fixture(params=KERNELS)
def kernel(request):
    with runtime.configured(kernel=request.param):
        yield request.param


# ------------------------------------------------------------ qtypes


def test_mxfp4_quantize_follows_the_ocp_rule():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 96)).astype(np.float32) * np.float32(3.0)
    x[0, :32] = 0                                  # a zero block: scale 2^0
    x[1, 5] = 7.0                                  # amax 7: scale 2^0, 7 saturates at 6
    x[2, 0:4] = [0.25, 0.75, 2.5, -5.0]            # ties to even
    x[2, 4:32] = 0.01
    q = quant.quantize(x, "mxfp4", channelwise_axes=(0,), tiled_axes={1: 32})
    codes, exps = mx_oracle(x)
    assert q.qtype == "mxfp4" and q.scale.dtype == E8 and q.dtype == np.float32
    assert np.array_equal(np.asarray(q.qvalue).view(np.uint8), codes)
    assert np.array_equal(q.scale.view(np.uint8), exps)
    assert q.qvalue.nbytes == x.size // 2


def test_float4_quantize_and_dequantize():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 8, 5)).astype(np.float32)
    q = quant.quantize(x, "float4_e2m1fn", channelwise_axes=(0, 2))
    s = np.abs(x).max(axis=1, keepdims=True) / np.float32(6)
    want = np.clip(x / s, -6, 6).astype(F4).astype(np.float32) * s
    assert q.scale.dtype == np.float32
    assert np.array_equal(quant.dequantize(q), want)
    values = np.clip(x / s, -6, 6).astype(F4).astype(np.float64)
    assert np.array_equal(reference.dequantize(q), values * s.astype(np.float64))


def test_dequantize_is_exact_in_float32_and_bfloat16():
    q = mx(np.random.default_rng(2), (2, 64, 6), spread=100)
    d = quant.dequantize(q)
    want = np.asarray(q.qvalue).astype(np.float64) * np.repeat(q.scale.astype(np.float64), 32, axis=1)
    assert d.dtype == np.float32
    assert np.array_equal(d.astype(np.float64), want)
    assert np.array_equal(d.astype(BF16).astype(np.float64), want)


def test_packed_views_match_the_values():
    rng = np.random.default_rng(3)
    vals = rng.integers(0, 16, (3, 10, 7), dtype=np.uint8).view(F4)
    for axis in (0, 1, 2):
        p = PackedFloat4.pack(vals, axis)
        assert p.shape == vals.shape and p.codes.shape[axis] == (vals.shape[axis] + 1) // 2
        for view in (lambda a: a.transpose(2, 0, 1), lambda a: a[1], lambda a: a[:, 2:9],
                     lambda a: a[:, 3:8, 1], lambda a: a[2:, :, 4:], lambda a: a.reshape(30, 7),
                     lambda a: a.reshape(3, 70), lambda a: a.transpose(0, 2, 1).reshape(21, 10)):
            want = view(vals)
            got = view(p)
            assert np.array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))


def test_qarray_views_dequantize_as_the_dequantized_views():
    q = mx(np.random.default_rng(4), (3, 64, 10))
    d = quant.dequantize(q)
    for view in (lambda a: a.transpose(0, 2, 1), lambda a: a[1], lambda a: a[:, 3:40],
                 lambda a: a[:, :, 2:7], lambda a: a.reshape(192, 10)):
        assert np.array_equal(quant.dequantize(view(q)), view(d))


def test_from_mxfp4_views_the_checkpoint_bytes():
    rng = np.random.default_rng(5)
    blocks = rng.integers(0, 256, (4, 6, 3, 16), dtype=np.uint8)
    scales = rng.integers(100, 140, (4, 6, 3), dtype=np.uint8)
    q = quant.from_mxfp4(blocks, scales)
    assert q.shape == (4, 6, 96) and q.qtype == "mxfp4"
    assert np.shares_memory(q.qvalue.codes, blocks) and np.shares_memory(q.scale, scales)
    codes = np.stack([blocks & 0xF, blocks >> 4], axis=-1).reshape(4, 6, 96)
    want = E2M1[codes] * np.exp2(np.repeat(scales.astype(np.float64) - 127, 32, axis=-1))
    assert np.array_equal(quant.dequantize(q).astype(np.float64), want)


def test_from_mxfp4_takes_torch_tensors():
    torch = pytest.importorskip("torch")
    blocks = torch.randint(0, 256, (2, 4, 2, 16), dtype=torch.uint8)
    scales = torch.full((2, 4, 2), 127, dtype=torch.uint8)
    q = quant.from_mxfp4(blocks, scales)
    assert np.shares_memory(q.qvalue.codes, blocks.numpy())


@pytest.mark.parametrize("call, match", [
    (lambda b, s: quant.from_mxfp4(b, np.where(s == s.flat[0], 255, s).astype(np.uint8)), "'scales' holds the NaN"),
    (lambda b, s: quant.from_mxfp4(b, s[:, :, :2]), "'scales' must have shape"),
    (lambda b, s: quant.from_mxfp4(b[..., :8], s), "'blocks' must be"),
    (lambda b, s: quant.from_mxfp4(b.astype(np.int8), s), "'blocks' must be uint8"),
    (lambda b, s: quant.quantize(np.ones((2, 48, 4), np.float32), "mxfp4", channelwise_axes=(0, 2),
                                 tiled_axes={1: 32}), "'tiled_axes' tile 32"),
    (lambda b, s: quant.quantize(np.ones((2, 64, 4), np.float32), "mxfp4", channelwise_axes=(0,),
                                 tiled_axes={1: 32}), "'mxfp4' takes one scale per 32"),
    (lambda b, s: QArray(PackedFloat4.pack(np.zeros((2, 32), F4)), np.full((2, 1), 255, np.uint8).view(E8)),
     "'scale' holds the NaN"),
    (lambda b, s: QArray(PackedFloat4.pack(np.zeros((2, 32), F4)), np.ones((2, 1), np.float32), qtype="mxfp4"),
     "float8_e8m0fnu"),
    (lambda b, s: QArray(PackedFloat4.pack(np.zeros((2, 32), F4)), np.ones((2, 1), np.float32),
                         np.zeros((2, 1), np.float32)), "no 'zero_point'"),
])
def test_bad_inputs_name_the_argument(call, match):
    rng = np.random.default_rng(6)
    b = rng.integers(0, 256, (2, 3, 4, 16), dtype=np.uint8)
    s = rng.integers(100, 140, (2, 3, 4), dtype=np.uint8)
    with pytest.raises((ValueError, TypeError), match=match):
        call(b, s)


# ------------------------------------------------------------- products


@pytest.mark.parametrize("lhs_dtype", ["float32", "bfloat16", "float16"])
def test_ragged_dot_equals_the_dequantized_product(kernel, lhs_dtype):
    rng = np.random.default_rng(7)
    g, k, n = 4, 160, 72
    q = mx(rng, (g, k, n))
    gs = np.array([3, 0, 17, 9])
    x = rng.standard_normal((32, k)).astype(lhs_dtype)
    # every lhs: the float32 product of the float32 weights (bfloat16 ones too: exact products,
    # float32 sums, as for every quantized operand), plain and prepacked alike
    want = rd.ragged_dot(x, quant.dequantize(q).astype(np.float32), gs, preferred_element_type=np.float32,
                         precision="highest")
    assert np.array_equal(rd.ragged_dot(x, q, gs, preferred_element_type=np.float32), want)
    packed = rd.prepack(q)
    assert np.array_equal(rd.ragged_dot(x, packed, gs, preferred_element_type=np.float32), want)
    assert packed.layouts == {"float32-float4w": packed.nbytes}    # no bfloat16 copy made


def test_gmm_transposed_and_its_gradient(kernel):
    rng = np.random.default_rng(8)
    g, n, k = 3, 40, 96                     # [E, out, in], as a checkpoint holds them
    q = mx(rng, (g, n, k), axis=2)
    dq = quant.dequantize(q).astype(np.float32)
    gs = np.array([7, 2, 11])
    x = rng.standard_normal((24, k)).astype(np.float32)
    out = rd.gmm(x, q, gs, transpose_rhs=True)
    assert np.array_equal(out, rd.gmm(x, dq, gs, transpose_rhs=True))
    ct = rng.standard_normal(out.shape).astype(np.float32)
    fun = functools.partial(rd.gmm, transpose_rhs=True)
    _, f = rd.vjp(fun, x, q, gs)
    _, f_ref = rd.vjp(fun, x, dq, gs)
    assert np.array_equal(f(ct)[0], f_ref(ct)[0])
    want = reference.ragged_dot(x, dq.transpose(0, 2, 1), gs)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


def test_float4_with_float_scales(kernel):
    rng = np.random.default_rng(9)
    w = rng.standard_normal((2, 64, 33)).astype(np.float32)
    q = quant.quantize(w, "float4_e2m1fn", channelwise_axes=(0, 2), tiled_axes={1: 16})
    gs = np.array([5, 6])
    x = rng.standard_normal((11, 64)).astype(np.float32)
    want = rd.ragged_dot(x, quant.dequantize(q), gs)
    assert np.array_equal(rd.ragged_dot(x, q, gs), want)
    assert np.array_equal(rd.ragged_dot(x, rd.prepack(q), gs), want)


def test_prepack_keeps_4_25_bits_a_weight():
    q = mx(np.random.default_rng(10), (2, 2048, 768))
    p = rd.prepack(q)
    bf16 = 2 * 2048 * 768 * 2
    assert p.ctype == "float32-float4w" and p.nbytes <= 0.3 * bf16
    u = p.unpack()
    assert u.qtype == "mxfp4" and np.array_equal(quant.dequantize(u), quant.dequantize(q))


def test_moe_block_forward_and_backward_with_mxfp4_experts():
    rng = np.random.default_rng(11)
    T, d, f, E = 12, 64, 32, 4
    x = rng.standard_normal((T, d)).astype(np.float32)
    router = rng.standard_normal((d, E)).astype(np.float32)
    w0 = mx(rng, (E, f, d), axis=2)
    w1 = mx(rng, (E, f, d), axis=2)
    wo = mx(rng, (E, d, f), axis=2)
    deq = [quant.dequantize(w).astype(np.float32) for w in (w0, w1, wo)]
    kw = dict(top_k=2, weights_layout="efd")
    out = rd.moe_block(x, router, w0, w1, wo, **kw)
    assert np.array_equal(out, rd.moe_block(x, router, *deq, **kw))
    ct = rng.standard_normal(out.shape).astype(np.float32)
    _, f_q = rd.vjp(functools.partial(rd.moe_block, **kw), x, router, w0, w1, wo)
    _, f_d = rd.vjp(functools.partial(rd.moe_block, **kw), x, router, *deq)
    for a, b in zip(f_q(ct)[:2], f_d(ct)[:2]):     # the activations' and the router's gradients
        assert np.array_equal(a, b)
    # int8 rows (w4a8): the exact int8 products of the int8 QArray of the
    # same weights (each value v as 2v, each scale halved), near the float
    # weights' layer with the same quantized rows
    q8 = rd.moe_block(x, router, w0, w1, wo, activation_qtype="int8", **kw)
    as_int8 = [gw.mxfp4_as_int8(w) for w in (w0, w1, wo)]
    assert all(np.array_equal(quant.dequantize(a), d) for a, d in zip(as_int8, deq))
    assert np.array_equal(q8, rd.moe_block(x, router, *as_int8, activation_qtype="int8", **kw))
    near = rd.moe_block(x, router, *deq, activation_qtype="int8", **kw)
    assert np.abs(q8 - near).max() <= 1e-5 * np.abs(near).max()

"""quantize and QArray at the edges of their formats.

- An infinity or NaN in the input of quantize is refused for every qtype
  and calibration (no qtype holds one: the tile's scale would be infinite
  or NaN and its other values silently wrong; OCP MX v1.0 gives such an
  MXFP4 block the NaN scale, which raggeddot refuses), naming the function,
  the argument and where; so is one in an AsQArray operand, whether the
  kernels or quantize() quantize it, and in moe_block's activations with
  activation_qtype. The input is left as it was.
- "mxfp4" means e8m0 scales one per 32 values along one axis: a QArray of
  other tilings is refused as "mxfp4", and a view that breaks the blocks
  (a slice off the block bounds, a reshape splitting them) is the
  "float4_e2m1fn" QArray of the same values, with float32 scales.
"""
import ml_dtypes
import numpy as np
import pytest

import raggeddot
from raggeddot import QArray, quant
from raggeddot import _gateway as gw

QTYPES = ["int8", "int4", "float8_e4m3fn", "float4_e2m1fn", "mxfp4"]
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
def test_non_finite_input_is_refused(rng, qtype, dtype, bad):
    x = rng.standard_normal((3, 64, 5)).astype(dtype)
    x[1, 37, 2] = bad
    kept = x.copy()
    calibrations = ["absmax", "minmax"] if qtype in ("int8", "int4") else ["absmax"]
    for calibration in calibrations:
        with pytest.raises(ValueError, match=r"^quantize: 'x' holds 1 non-finite value \(the first, "
                                             rf"{'nan' if bad != bad else repr(float(bad))}, at \(1, 37, 2\)\), "
                                             rf"which qtype '{qtype}' cannot represent") as e:
            quant.quantize(x, qtype, channelwise_axes=(0, 2), tiled_axes={1: 32}, calibration_method=calibration)
        assert ("OCP MX" in str(e.value)) == (qtype == "mxfp4")
    assert x.tobytes() == kept.tobytes()
    x[1, 37, 2] = 3.0       # the same block without it quantizes
    quant.quantize(x, qtype, channelwise_axes=(0, 2), tiled_axes={1: 32})


def test_the_reported_mxfp4_blocks(rng):
    """One block of 32 with an Inf (it used to get the scale 2^-3, the Inf
    stored as 0.75 and the others saturated at +-0.75) or a NaN (scale 2^0,
    the NaN stored as -0): refused, several of them counted."""
    x = rng.standard_normal((2, 32, 4)).astype(np.float32)
    x[0, 3, 0], x[1, 9, 3] = np.inf, np.nan
    with pytest.raises(ValueError, match=r"holds 2 non-finite values \(the first, inf, at \(0, 3, 0\)\)"):
        raggeddot.quantize(x, "mxfp4", channelwise_axes=(0, 2), tiled_axes={1: 32})


def test_non_finite_operands_quantized_by_the_call(rng):
    """An AsQArray lhs (quantized by the kernels while they pack it, or by
    quantize()) and moe_block's activations: refused naming the call."""
    w = rng.standard_normal((2, 64, 8)).astype(np.float32)
    lhs = rng.standard_normal((6, 64)).astype(np.float32)
    lhs[4, 5] = np.nan
    gs = np.array([3, 3])
    int8_w = raggeddot.quantize(w, "int8", channelwise_axes=(0, 2))
    for rhs in (w, int8_w, raggeddot.prepack(int8_w, lhs_dtype=np.int8)):
        for asq in (raggeddot.AsQArray(lhs, "int8", channelwise_axes=(0,)), raggeddot.AsQArray(lhs, "int4")):
            for fn in (raggeddot.ragged_dot, raggeddot.gmm):
                out = np.full((6, 8), 7.0, np.float32)      # (a refused call writes nothing into out)
                with pytest.raises(ValueError, match=rf"^{fn.__name__}: 'lhs' \(an AsQArray, which the call "
                                                     r"quantizes\) holds 1 non-finite value \(the first, nan, "
                                                     r"at \(4, 5\)\)"):
                    fn(asq, rhs, gs, out=out)
                assert np.all(out == 7.0)
    w_inf = w.copy()
    w_inf[1, 2, 3] = -np.inf
    with pytest.raises(ValueError, match=r"^gmm: 'rhs' \(an AsQArray, which the call quantizes\) holds 1 "
                                         r"non-finite value \(the first, -inf, at \(1, 2, 3\)\)"):
        raggeddot.gmm(np.nan_to_num(lhs), raggeddot.AsQArray(w_inf, "int8", channelwise_axes=(0, 2)), gs)
    E, d, f = 4, 64, 16
    x = rng.standard_normal((10, d)).astype(np.float32)
    x[7, 1] = np.inf
    ws = [raggeddot.quantize(rng.standard_normal(s).astype(np.float32), "int8", channelwise_axes=(0, 2))
          for s in ((E, d, f), (E, d, f), (E, f, d))]
    router = rng.standard_normal((d, E)).astype(np.float32)
    # plain and prepacked int8 weights (the kernels quantize the rows and find the infinity from its
    # row's scale), and float32 weights (quantize() does)
    for weights in (ws, [raggeddot.prepack(w, lhs_dtype=np.int8) for w in ws],
                    [raggeddot.dequantize(w) for w in ws]):
        for xs in (x, x.astype(ml_dtypes.bfloat16)):
            with pytest.raises(ValueError, match=r"^moe_block: the experts' input rows .* activation_qtype, "
                                                 r"holds 1 non-finite value \(the first, inf, at"):
                raggeddot.moe_block(xs, router.astype(xs.dtype), *weights, top_k=1, activation_qtype="int8")
    # the kernels' own refusal, before they write anything
    out = np.full((10, f), 3.0, np.float32)
    with pytest.raises(ValueError, match="'lhs' holds an infinity or a NaN"):
        gw.rows(x, ws[0], np.array([0, 2, 5, 8, 10]), out, quantize_lhs=True)
    assert (out == 3.0).all()


# ---------------------------------------------------------------------------
# what "mxfp4" is
# ---------------------------------------------------------------------------

def _mx(rng, shape=(3, 64, 40)):
    return raggeddot.quantize(rng.standard_normal(shape).astype(np.float32), "mxfp4",
                              channelwise_axes=(0, 2), tiled_axes={1: 32})


def test_e8m0_scales_of_another_tiling_are_not_mxfp4(rng):
    q = _mx(rng)
    e8m0_per_value = np.repeat(q.scale, 32, axis=1)              # [3, 64, 40]: one scale a value
    e8m0_per_tensor = q.scale[:1, :1, :1]
    for scale in (e8m0_per_value, e8m0_per_tensor, np.repeat(q.scale, 2, axis=1)[:, ::4]):
        for qtype in (None, "mxfp4"):
            with pytest.raises(ValueError, match=r"^QArray: an 'mxfp4' QArray has one float8_e8m0fnu scale per 32 "
                                                 r"values along one axis.*qtype 'float4_e2m1fn'"):
                QArray(q.qvalue, scale, None, qtype)
    # the same scales as float32 make the float4_e2m1fn QArray of the same values
    f4 = QArray(q.qvalue, e8m0_per_value.astype(np.float32), None, "float4_e2m1fn")
    np.testing.assert_array_equal(raggeddot.dequantize(f4), raggeddot.dequantize(q))


def test_views_that_break_the_blocks_leave_mxfp4(rng):
    """Slices on block bounds, transposes, and reshapes that keep the
    blocks stay "mxfp4"; a slice off the bounds or a reshape that splits
    the blocks gives "float4_e2m1fn" (float32 scales, the same values),
    which products, prepack and the gradients take as such."""
    q = _mx(rng)
    whole = raggeddot.dequantize(q)
    for view, expect in [(q[:, 32:64], "mxfp4"), (q[1:], "mxfp4"), (q[:, :, 3:17], "mxfp4"),
                         (q.transpose(0, 2, 1), "mxfp4"), (q.reshape(192, 40), "mxfp4"),
                         (q[:, 3:40], "float4_e2m1fn"), (q[:, 16:48], "float4_e2m1fn"),
                         (q[:, ::2], "float4_e2m1fn"), (q[1, 5:9], "float4_e2m1fn")]:
        assert view.qtype == expect, (view, expect)
        assert view.scale.dtype == (ml_dtypes.float8_e8m0fnu if expect == "mxfp4" else np.float32)
    np.testing.assert_array_equal(raggeddot.dequantize(q[:, 3:40]), whole[:, 3:40])
    np.testing.assert_array_equal(raggeddot.dequantize(q[:, 16:48]), whole[:, 16:48])
    part = q[:, 8:40]                                   # [3, 32, 40], blocks cut in two
    lhs = rng.standard_normal((9, 32)).astype(np.float32)
    gs = np.array([3, 3, 3])
    want = raggeddot.ragged_dot(lhs, whole[:, 8:40], gs)
    np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, part, gs), want)
    np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, raggeddot.prepack(part), gs), want)


def test_moe_block_with_bfloat16_x_and_mxfp4_experts_is_float32(rng):
    """What the README states: a QArray's values are float32 (its scales'
    dtype), so a bfloat16 x with MXFP4 experts, plain or prepacked, gives
    the float32 layer on x widened, bit for bit."""
    bf16 = ml_dtypes.bfloat16
    E, d, f = 4, 64, 32
    x = rng.standard_normal((20, d)).astype(bf16)
    router = rng.standard_normal((d, E)).astype(bf16)
    q = [raggeddot.quantize(rng.standard_normal(s).astype(np.float32), "mxfp4", channelwise_axes=(0, 2),
                            tiled_axes={1: 32}) for s in ((E, d, f), (E, d, f), (E, f, d))]
    want = raggeddot.moe_block(x.astype(np.float32), router.astype(np.float32), *q, top_k=2)
    for weights in (q, [raggeddot.prepack(w) for w in q]):
        got = raggeddot.moe_block(x, router, *weights, top_k=2)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)

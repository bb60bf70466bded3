"""Quantized operands: raggeddot.QArray, quantize, dequantize, and every grouped
matmul with QArray operands against the NumPy oracle (raggeddot.reference,
which reads a QArray as its float64 dequantized value).

Layouts of the scales are named by the tiles they give: per tensor (one
scale), per channel (one per output column / token), subchannel (blocks
along the contraction) and blocks along every other axis that can carry one.
"""

import functools

import numpy as np
import pytest

import raggeddot as rd
from raggeddot import reference, runtime
from raggeddot.testing import check_grads

from helpers import (GRAD_TOLERANCE, KERNELS, assert_unchanged, check_close, random_group_sizes,
                     snapshot)

ml_dtypes = pytest.importorskip("ml_dtypes")
F8 = np.dtype(ml_dtypes.float8_e4m3fn)
QTYPES = ["int8", "int4", "float8_e4m3fn"]


@pytest.fixture(params=KERNELS)
def kernel(request):
    with runtime.configured(kernel=request.param):
        yield request.param


def f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def check(actual, expected, label=""):
    assert actual.dtype == expected.dtype, f"{label}: dtype {actual.dtype} != {expected.dtype}"
    check_close(actual, expected, err_msg=label)


# ---------------------------------------------------------------------------
# quantize / dequantize
# ---------------------------------------------------------------------------


def test_int8_rounds_half_to_even_and_reaches_minus_128():
    # absmax 127.5 gives scale 1: x / scale is x itself
    x = np.array([[0.5, 1.5, 2.5, -2.5, 126.5, -127.5, 127.5, 3.49]], np.float32)
    q = rd.quantize(x, "int8")
    assert q.scale.shape == (1, 1) and q.scale[0, 0] == 1.0
    assert q.qvalue.dtype == np.int8
    np.testing.assert_array_equal(q.qvalue[0], [0, 2, 2, -2, 126, -128, 127, 3])


def test_int8_minus_128_on_gaussian_data(rng):
    x = f32(rng, (64, 256))
    x[:, 7] = -np.abs(x).max(axis=1) - 1            # each row's absmax is negative
    q = rd.quantize(x, "int8", channelwise_axes=(0,))
    # x / scale of the most negative value is -127.5 up to the rounding of
    # scale: -128 or -127, never clipped from further out
    lows = q.qvalue.min(axis=1)
    assert (lows >= -128).all() and (lows <= -127).all() and (lows == -128).sum() > len(lows) // 2
    np.testing.assert_array_equal(q.qvalue, np.clip(np.rint(x / q.scale), -128, 127))
    np.testing.assert_allclose(q.scale[:, 0], np.abs(x).max(axis=1) / np.float32(127.5), rtol=1e-6)


@pytest.mark.parametrize("qtype,qmax,div", [("int8", 127, 127.5), ("int4", 7, 7.5)])
def test_int_quantize_formula(rng, qtype, qmax, div):
    x = f32(rng, (4, 96, 10))
    q = rd.quantize(x, qtype, channelwise_axes=(0, 2), tiled_axes={1: 32})
    assert q.scale.shape == (4, 3, 10) and q.tile_shape == (1, 32, 1)
    blocks = x.reshape(4, 3, 32, 10)
    amax = np.abs(blocks).max(axis=2)
    np.testing.assert_allclose(q.scale, amax / np.float32(div), rtol=1e-6)
    want = np.clip(np.rint(blocks / q.scale[:, :, None, :]), -qmax - 1, qmax).reshape(x.shape)
    np.testing.assert_array_equal(q.qvalue, want)
    assert q.qvalue.min() >= -qmax - 1 and q.qvalue.max() <= qmax
    # the error of a value is at most half a step (plus the clipped top edge)
    err = np.abs(rd.dequantize(q) - x).reshape(4, 3, 32, 10).max(axis=2)
    assert (err <= q.scale * 0.5 * 1.0001 + 1e-7).all()


def test_float8_quantize_uses_ml_dtypes_rounding(rng):
    x = f32(rng, (6, 40))
    q = rd.quantize(x, "float8_e4m3fn", channelwise_axes=(0,))
    assert q.qvalue.dtype == F8 and q.qtype == "float8_e4m3fn"
    np.testing.assert_allclose(q.scale[:, 0], np.abs(x).max(axis=1) / 448, rtol=1e-6)
    np.testing.assert_array_equal(q.qvalue.astype(np.float32), (x / q.scale).astype(F8).astype(np.float32))
    assert np.abs(q.qvalue.astype(np.float32)).max() == 448


def test_minmax_has_zero_point(rng):
    x = f32(rng, (8, 64)) + 2.0                      # mostly positive: asymmetric pays
    q = rd.quantize(x, "int8", channelwise_axes=(0,), calibration_method="minmax")
    assert q.zero_point is not None and q.zero_point.shape == q.scale.shape
    err = np.abs(rd.dequantize(q) - x)
    assert (err <= q.scale * 0.5 * 1.0001 + 1e-6).all()
    check_close(rd.dequantize(q), reference.dequantize(q), dtype=np.float32)


def test_zero_tile_gets_scale_one():
    x = np.zeros((2, 8), np.float32)
    x[1] = 1.0
    q = rd.quantize(x, "int8", channelwise_axes=(0,))
    assert q.scale[0, 0] == 1.0 and (q.qvalue[0] == 0).all()
    d = rd.dequantize(q)
    assert (d[0] == 0).all()
    # 1 / (1 / 127.5) = 127.5 rounds to 128 (even) and is clipped to 127
    np.testing.assert_array_equal(q.qvalue[1], 127)
    np.testing.assert_array_equal(d[1], np.float32(127) * q.scale[1, 0])


@pytest.mark.parametrize("qtype", QTYPES)
def test_dequantize_matches_reference(rng, qtype):
    x = f32(rng, (3, 16, 12))
    q = rd.quantize(x, qtype, channelwise_axes=(0,), tiled_axes={1: 4, 2: 6})
    d = rd.dequantize(q)
    assert d.dtype == np.float32 and d.shape == x.shape
    check_close(d, reference.dequantize(q), dtype=np.float32)


def test_float64_input_gives_float64_scales(rng):
    q = rd.quantize(rng.standard_normal((5, 8)), "int8")
    assert q.scale.dtype == np.float64 and q.dtype == np.float64


def test_int4_from_ml_dtypes_int4(rng):
    vals = rng.integers(-8, 8, (4, 6)).astype(np.int8)
    q = rd.QArray(vals.astype(ml_dtypes.int4), np.ones((1, 1), np.float32))
    assert q.qtype == "int4" and q.qvalue.dtype == np.int8
    np.testing.assert_array_equal(q.qvalue, vals)


@pytest.mark.parametrize("call,pattern", [
    (lambda x: rd.quantize(x, "int8", tiled_axes={1: 5}), "tiled_axes"),
    (lambda x: rd.quantize(x, "int8", tiled_axes={3: 2}), "tiled_axes"),
    (lambda x: rd.quantize(x, "int8", tiled_axes={1: 0}), "tiled_axes"),
    (lambda x: rd.quantize(x, "int8", channelwise_axes=(0,), tiled_axes={0: 2}), "channelwise_axes"),
    (lambda x: rd.quantize(x, "int8", channelwise_axes=(2,)), "channelwise_axes"),
    (lambda x: rd.quantize(x, "int2"), "qtype"),
    (lambda x: rd.quantize(x, "float8_e4m3fn", calibration_method="minmax"), "calibration_method"),
    (lambda x: rd.quantize(x, "int8", calibration_method="mse"), "calibration_method"),
    (lambda x: rd.quantize(x.astype(np.int32), "int8"), "'x'"),
    (lambda x: rd.QArray(np.zeros((4, 8), np.int8), np.ones((4,), np.float32)), "'scale'"),
    (lambda x: rd.QArray(np.zeros((4, 8), np.int8), np.ones((4, 3), np.float32)), "'scale'"),
    (lambda x: rd.QArray(np.zeros((4, 8), np.int16), np.ones((4, 1), np.float32)), "'qvalue'"),
    (lambda x: rd.QArray(np.zeros((4, 8), np.int8), np.ones((4, 1), np.float32), qtype="float8_e4m3fn"),
     "'qvalue'"),
    (lambda x: rd.QArray(np.zeros((4, 8), np.int8), np.ones((4, 1), np.int32)), "'scale'"),
    (lambda x: rd.QArray(np.zeros((4, 8), np.int8), np.ones((4, 1), np.float32), np.zeros((1, 1))),
     "'zero_point'"),
])
def test_errors_name_the_argument(call, pattern):
    x = np.ones((4, 8), np.float32)
    with pytest.raises((ValueError, TypeError), match=pattern):
        call(x)


def test_qarray_is_immutable():
    q = rd.quantize(np.ones((2, 2), np.float32), "int8")
    with pytest.raises(AttributeError):
        q.scale = None


# Views of a QArray equal the same views of its dequantized value.
VIEWS = [
    ("transpose", lambda a: a.transpose(2, 0, 1)),
    ("T", lambda a: a.T),
    ("int index", lambda a: a[3]),
    ("aligned slice", lambda a: a[:, 4:12]),
    ("unaligned slice", lambda a: a[:, 3:10]),
    ("one-element slice", lambda a: a[:, 5:6]),
    ("step slice", lambda a: a[:, ::-2]),
    ("merge inner", lambda a: a.reshape(6, 16 * 10)),
    ("merge outer", lambda a: a.reshape(6 * 16, 10)),
    ("add and drop unit axes", lambda a: a[:, :, 2:3].reshape(1, 6, 16)),
]


@pytest.mark.parametrize("tiles", [{}, {1: 4}, {0: 3, 1: 8, 2: 5}, {1: 16}], ids=str)
@pytest.mark.parametrize("name,view", VIEWS, ids=[v[0] for v in VIEWS])
def test_views(rng, name, view, tiles):
    x = f32(rng, (6, 16, 10))
    chan = tuple(a for a in range(3) if a not in tiles)
    q = rd.quantize(x, "int8", channelwise_axes=chan[:1], tiled_axes=tiles)
    got = view(q)
    assert isinstance(got, rd.QArray)
    np.testing.assert_array_equal(rd.dequantize(got), view(rd.dequantize(q)))


# ---------------------------------------------------------------------------
# ragged_dot / gmm / tgmm against the oracle, every kernel family
# ---------------------------------------------------------------------------

M, K, N, G = 53, 96, 40, 5

# rhs [g, k, n]: (channelwise_axes, tiled_axes, calibration)
RHS_LAYOUTS = {
    "per_tensor": ((), None, "absmax"),
    "per_channel": ((0, 2), None, "absmax"),
    "subchannel_k32": ((0, 2), {1: 32}, "absmax"),
    "subchannel_k8_n8": ((0,), {1: 8, 2: 8}, "absmax"),
    "blocks_n": ((0, 1), {2: 20}, "absmax"),
    "shared_groups": ((2,), {0: G, 1: 48}, "absmax"),
    "asymmetric": ((0, 2), {1: 32}, "minmax"),
}
# lhs [m, k]
LHS_LAYOUTS = {
    "per_tensor": ((), None, "absmax"),
    "per_token": ((0,), None, "absmax"),
    "per_token_subchannel": ((0,), {1: 32}, "absmax"),
    "row_blocks": ((1,), {0: 53}, "absmax"),
    "asymmetric": ((0,), {1: 48}, "minmax"),
}


def quant(x, qtype, layout):
    chan, tiled, cal = layout
    if cal == "minmax" and qtype == "float8_e4m3fn":
        cal = "absmax"
    return rd.quantize(x, qtype, channelwise_axes=chan, tiled_axes=tiled, calibration_method=cal)


def _group_sizes(rng, total=M):
    gs = random_group_sizes(rng, G, total - 3)       # some rows in no group
    gs[1] = 0
    return gs


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("layout", list(RHS_LAYOUTS))
def test_ragged_dot_quantized_rhs(rng, kernel, qtype, layout):
    x, w = f32(rng, (M, K)), f32(rng, (G, K, N))
    gs = _group_sizes(rng)
    qw = quant(w, qtype, RHS_LAYOUTS[layout])
    copies = snapshot([qw.qvalue, qw.scale, x])
    check(rd.ragged_dot(x, qw, gs), reference.ragged_dot(x, qw, gs), "ragged_dot")
    check(rd.gmm(x, qw, gs), reference.gmm(x, qw, gs), "gmm")
    check(rd.gmm(x, qw.transpose(0, 2, 1), gs, transpose_rhs=True), reference.gmm(x, qw, gs),
          "gmm transpose_rhs")
    assert_unchanged([qw.qvalue, qw.scale, x], copies)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("layout", list(LHS_LAYOUTS))
def test_ragged_dot_quantized_lhs_and_both(rng, kernel, qtype, layout):
    x, w = f32(rng, (M, K)), f32(rng, (G, K, N))
    gs = _group_sizes(rng)
    qx = quant(x, qtype, LHS_LAYOUTS[layout])
    qw = quant(w, qtype, RHS_LAYOUTS["subchannel_k32"])
    check(rd.ragged_dot(qx, w, gs), reference.ragged_dot(qx, w, gs), "quantized lhs")
    check(rd.ragged_dot(qx, qw, gs), reference.ragged_dot(qx, qw, gs), "both quantized")
    check(rd.gmm(qx, qw[1:4], gs, group_offset=1), reference.gmm(qx, qw[1:4], gs, group_offset=1),
          "gmm group_offset")


# tgmm: lhs [k, m] and rhs [m, n] with scale blocks along m (its reduction)
# that group bounds cut through, and blocks along k.
TGMM_LAYOUTS = {
    "per_tensor": (((), None), ((), None)),
    "per_channel": (((0,), None), ((1,), None)),
    "m_blocks_4": (((0,), {1: 4}), ((1,), {0: 4})),
    "m_blocks_13_k_16": (((), {0: 16, 1: 13}), ((), {0: 13, 1: 8})),
    "m_whole_k_blocks": (((), {0: 32}), ((1,), None)),
}


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("layout", list(TGMM_LAYOUTS))
def test_tgmm(rng, kernel, qtype, layout):
    m = 52
    a, b = f32(rng, (K, m)), f32(rng, (m, N))
    gs = random_group_sizes(rng, G, m - 2)
    (ca, ta), (cb, tb) = TGMM_LAYOUTS[layout]
    qa = rd.quantize(a, qtype, channelwise_axes=ca, tiled_axes=ta)
    qb = rd.quantize(b, qtype, channelwise_axes=cb, tiled_axes=tb)
    for L, R, what in ((qa, b, "lhs"), (a, qb, "rhs"), (qa, qb, "both")):
        check(rd.tgmm(L, R, gs), reference.tgmm(L, R, gs), what)
    ex = f32(rng, (G, K, N))
    check(rd.tgmm(qa, qb, gs, existing_out=ex), reference.tgmm(qa, qb, gs, existing_out=ex), "existing_out")


@pytest.mark.parametrize("kc", [5, 13, 64])
def test_blocking_across_scale_blocks(rng, restore_runtime, kc):
    """Cache blocks of the contraction smaller and larger than the scale
    blocks, not aligned with them (tgmm reduces over m, gmm over k)."""
    runtime.set_blocking("float32", 24, kc, 32)
    a, b = f32(rng, (K, 60)), f32(rng, (60, N))
    gs = np.array([7, 0, 30, 23])
    qa = rd.quantize(a, "int8", channelwise_axes=(0,), tiled_axes={1: 12})
    qb = rd.quantize(b, "int8", channelwise_axes=(1,), tiled_axes={0: 20})
    check(rd.tgmm(qa, qb, gs), reference.tgmm(qa, qb, gs), "tgmm")
    x, w = f32(rng, (60, K)), f32(rng, (4, K, N))
    qw = rd.quantize(w, "int8", channelwise_axes=(0, 2), tiled_axes={1: 32})
    qx = rd.quantize(x, "int8", channelwise_axes=(0,), tiled_axes={1: 48})
    check(rd.gmm(qx, qw, gs), reference.gmm(qx, qw, gs), "gmm")


def test_float64_product(rng):
    x, w = rng.standard_normal((M, K)), rng.standard_normal((G, K, N))
    qw = rd.quantize(w, "int8", channelwise_axes=(0, 2), tiled_axes={1: 16})
    gs = _group_sizes(rng)
    out = rd.ragged_dot(x, qw, gs)
    assert out.dtype == np.float64
    check(out, reference.ragged_dot(x, qw, gs))
    out32 = rd.ragged_dot(x.astype(np.float32), qw, gs, preferred_element_type=np.float32)
    check(out32, reference.ragged_dot(x.astype(np.float32), qw, gs, preferred_element_type=np.float32))


def test_half_precision_scales(rng):
    x, w = f32(rng, (M, K)), f32(rng, (G, K, N))
    qw = rd.quantize(w, "int8", channelwise_axes=(0, 2))
    qw16 = rd.QArray(qw.qvalue, qw.scale.astype(np.float16))
    gs = _group_sizes(rng)
    out = rd.ragged_dot(x.astype(np.float16), qw16, gs)
    assert out.dtype == np.float16
    check(out, reference.ragged_dot(x.astype(np.float16), qw16, gs))


def test_tokamax_like_shapes(rng, kernel):
    """m=1024, k=128, n=256, 8 groups (two empty), per-channel and subchannel."""
    m, k, n, g = 1024, 128, 256, 8
    x, w = f32(rng, (m, k)), f32(rng, (g, k, n))
    gs = np.array([200, 0, 130, 300, 0, 150, 144, 90])
    for name, chan, tiled in (("per_channel", (0, 2), None), ("subchannel", (0, 2), {1: 32})):
        qw = rd.quantize(w, "int8", channelwise_axes=chan, tiled_axes=tiled)
        qx = rd.quantize(x, "int8", channelwise_axes=(0,), tiled_axes=tiled and {1: 32})
        check(rd.gmm(x, qw, gs), reference.gmm(x, qw, gs), name)
        check(rd.ragged_dot(qx, qw, gs), reference.ragged_dot(qx, qw, gs), name + " both")
        y = f32(rng, (m, n))
        check(rd.tgmm(qx.T, y, gs), reference.tgmm(qx.T, y, gs), name + " tgmm")


def test_int8_subchannel_cosine_against_float(rng):
    m, k, n, g = 256, 512, 128, 4
    x, w = f32(rng, (m, k)), f32(rng, (g, k, n))
    gs = np.array([64, 100, 0, 92])
    qx = rd.quantize(x, "int8", channelwise_axes=(0,), tiled_axes={1: 128})
    qw = rd.quantize(w, "int8", channelwise_axes=(0, 2), tiled_axes={1: 128})
    exact = rd.ragged_dot(x, w, gs).ravel()
    got = rd.ragged_dot(qx, qw, gs).ravel()
    cos = float(exact @ got / np.linalg.norm(exact) / np.linalg.norm(got))
    assert cos >= 0.999, cos


def test_out_and_threads_bitwise(rng, restore_runtime):
    x, w = f32(rng, (200, K)), f32(rng, (G, K, N))
    gs = random_group_sizes(rng, G, 200)
    qw = quant(w, "int8", RHS_LAYOUTS["subchannel_k8_n8"])
    results = []
    for t in (1, 2, 3):
        with runtime.configured(num_threads=t):
            out = np.empty((200, N), np.float32)
            assert rd.ragged_dot(x, qw, gs, out=out) is out
            results.append(out)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_op_errors(rng):
    x, w = f32(rng, (M, K)), f32(rng, (G, K, N))
    qx = rd.quantize(x, "int8")
    with pytest.raises(ValueError, match="'rhs'"):
        rd.ragged_dot(x, qx, np.array([M]))
    with pytest.raises(ValueError, match="'lhs'"):
        rd.gmm(rd.quantize(w, "int8"), w, np.array([1] * G))
    with pytest.raises(TypeError, match="'q'"):
        rd.dequantize(x)


def test_core_rejects_bad_quantized_operands(rng):
    from raggeddot import _core
    x = f32(rng, (8, 16))
    out = np.zeros((8, 4), np.float32)
    q, s = np.zeros((1, 16, 4), np.int8), np.ones((1, 3, 4), np.float32)
    b = np.array([0, 8], np.int64)
    with pytest.raises(ValueError, match="'rhs scale'"):
        _core.ragged_rows(x, (q, s, None), b, out, False)
    with pytest.raises(TypeError, match="'rhs scale'"):
        _core.ragged_rows(x, (q, np.ones((1, 1, 4)), None), b, out, False)
    with pytest.raises(TypeError, match="'rhs'"):
        _core.ragged_rows(x, (q.astype(np.float32), np.ones((1, 1, 4), np.float32), None), b, out, False)
    with pytest.raises(TypeError, match="'rhs'"):
        _core.ragged_rows(x, q, b, out, False)        # int8 without scales
    with pytest.raises(ValueError, match="'rhs zero_point'"):
        _core.ragged_rows(x, (q, np.ones((1, 1, 4), np.float32), np.ones((1, 2, 4), np.float32)),
                          b, out, False)


# ---------------------------------------------------------------------------
# ragged_dot_general, all modes
# ---------------------------------------------------------------------------


def _tiles_for(rng, shape):
    """A random tiling: per axis a tile that divides it (1, the whole axis,
    or a divisor in between)."""
    tiles = {}
    for a, n in enumerate(shape):
        divs = [d for d in range(1, n + 1) if n % d == 0]
        tiles[a] = int(rng.choice(divs))
    return tiles


def _general_cases():
    import test_general
    return test_general.CASES, test_general.Case, test_general.NUM_GROUPS


@pytest.mark.parametrize("qtype", ["int8", "float8_e4m3fn"])
@pytest.mark.parametrize("name", list(_general_cases()[0]))
def test_ragged_dot_general(rng, name, qtype):
    cases, Case, g = _general_cases()
    case = Case(*cases[name])
    lhs_shape, rhs_shape = case.shapes(g)
    lhs, rhs = f32(rng, lhs_shape), f32(rng, rhs_shape)
    size = lhs_shape[case.lhs_axes.index(case.ragged)]
    gs = random_group_sizes(rng, g, size - 1 if size > 1 else size)
    dn = case.dims()
    for trial in range(3):
        ql = rd.quantize(lhs, qtype, tiled_axes=_tiles_for(rng, lhs_shape))
        qr = rd.quantize(rhs, qtype, tiled_axes=_tiles_for(rng, rhs_shape))
        for L, R, what in ((ql, rhs, "lhs"), (lhs, qr, "rhs"), (ql, qr, "both")):
            check(rd.ragged_dot_general(L, R, gs, dn), reference.ragged_dot_general(L, R, gs, dn),
                  f"{name} {what} trial {trial}")


# ---------------------------------------------------------------------------
# Derivatives: straight through, on the dequantized value
# ---------------------------------------------------------------------------


def _grads_on_dequantized(fun, qargs, argnums):
    """check_grads of ``fun`` at the dequantized arguments, with the
    derivatives computed by raggeddot.vjp/jvp from the QArray arguments."""
    dq = tuple(rd.dequantize(a) if isinstance(a, rd.QArray) else a for a in qargs)

    def vjp(f, *args):
        return rd.vjp(f, *qargs)

    def jvp(f, args, tangents):
        return rd.jvp(f, qargs, tangents)

    return check_grads(fun, dq, argnums=argnums, vjp=vjp, jvp=jvp, rtol=GRAD_TOLERANCE[np.dtype(np.float64)])


def test_grads_ragged_dot(rng):
    x, w = rng.standard_normal((9, 8)), rng.standard_normal((3, 8, 5))
    gs = np.array([3, 0, 4])
    qx = rd.quantize(x, "int8", channelwise_axes=(0,), tiled_axes={1: 4})
    qw = rd.quantize(w, "int4", channelwise_axes=(0, 2), tiled_axes={1: 2})
    _grads_on_dequantized(rd.ragged_dot, (qx, qw, gs), (0, 1))
    _grads_on_dequantized(rd.ragged_dot, (x, qw, gs), (0, 1))


def test_grads_gmm_and_tgmm(rng):
    x, w = rng.standard_normal((9, 8)), rng.standard_normal((3, 5, 8))
    gs = np.array([3, 0, 4])
    qw = rd.quantize(w, "float8_e4m3fn", channelwise_axes=(0, 1), tiled_axes={2: 4})
    _grads_on_dequantized(functools.partial(rd.gmm, transpose_rhs=True), (x, qw, gs), (0, 1))
    a, b = rng.standard_normal((6, 9)), rng.standard_normal((9, 4))
    qa = rd.quantize(a, "int8", channelwise_axes=(0,), tiled_axes={1: 3})
    qb = rd.quantize(b, "int8", tiled_axes={0: 3, 1: 2})
    _grads_on_dequantized(rd.tgmm, (qa, qb, gs), (0, 1))


@pytest.mark.parametrize("name", ["1_batch", "2_inner_contracting", "3_basic"])
def test_grads_ragged_dot_general(rng, name):
    cases, Case, g = _general_cases()
    case = Case(*cases[name])
    sizes = dict(b=2, c=2, m=4, p=2, q=2, k=4, l=2, n=3, o=2)
    lhs_shape, rhs_shape = case.shapes(g, sizes)
    lhs, rhs = rng.standard_normal(lhs_shape), rng.standard_normal(rhs_shape)
    size = lhs_shape[case.lhs_axes.index(case.ragged)]
    gs = random_group_sizes(rng, g, size)
    ql = rd.quantize(lhs, "int8", tiled_axes={a: 2 for a, n in enumerate(lhs_shape) if n % 2 == 0})
    qr = rd.quantize(rhs, "int8", channelwise_axes=(0,))
    fun = functools.partial(rd.ragged_dot_general, ragged_dot_dimension_numbers=case.dims())
    _grads_on_dequantized(fun, (ql, qr, gs), (0, 1))


def test_vjp_gradient_of_quantized_operand(rng):
    """d(rhs) of a quantized rhs is that of its dequantized value, with its
    shape and dtype; d(lhs) multiplies the cotangent by the quantized rhs."""
    x, w = f32(rng, (20, 16)), f32(rng, (2, 16, 6))
    gs = np.array([12, 8])
    qw = rd.quantize(w, "int8", channelwise_axes=(0, 2), tiled_axes={1: 8})
    out, vjp_fn = rd.vjp(rd.ragged_dot, x, qw, gs)
    ct = f32(rng, out.shape)
    dx, dw, _ = vjp_fn(ct)
    _, vjp_ref = rd.vjp(rd.ragged_dot, x, rd.dequantize(qw), gs)
    ex, ew, _ = vjp_ref(ct)
    assert dw.shape == qw.shape and dw.dtype == np.float32
    check(dx, ex)
    check(dw, ew)


# ---------------------------------------------------------------------------
# AsQArray: a float operand the op quantizes
# ---------------------------------------------------------------------------


def test_as_qarray_forward(rng):
    x, w = f32(rng, (M, K)), f32(rng, (G, K, N))
    gs = _group_sizes(rng)
    qw = rd.quantize(w, "int8", channelwise_axes=(0, 2), tiled_axes={1: 32})
    spec = dict(channelwise_axes=(0,), tiled_axes={1: 32})
    want = reference.ragged_dot(rd.quantize(x, "int8", **spec), qw, gs)
    check(rd.ragged_dot(rd.AsQArray(x, "int8", **spec), qw, gs), want, "ragged_dot")
    check(rd.gmm(rd.AsQArray(x, "int8", **spec), qw, gs), reference.gmm(rd.quantize(x, "int8", **spec), qw, gs),
          "gmm")
    with pytest.raises(ValueError, match="tiled_axes"):
        rd.ragged_dot(rd.AsQArray(x, "int8", tiled_axes={1: 7}), qw, gs)


def test_as_qarray_gradient_is_straight_through(rng):
    x, w = f32(rng, (20, 16)), f32(rng, (2, 16, 6))
    gs = np.array([12, 8])
    out, vjp_fn = rd.vjp(rd.ragged_dot, rd.AsQArray(x, "int8", channelwise_axes=(0,)), w, gs)
    ct = f32(rng, out.shape)
    dx, dw, _ = vjp_fn(ct)
    qx = rd.quantize(x, "int8", channelwise_axes=(0,))
    _, vjp_ref = rd.vjp(rd.ragged_dot, rd.dequantize(qx), w, gs)
    ex, ew, _ = vjp_ref(ct)
    assert dx.shape == x.shape and dx.dtype == x.dtype
    check(dx, ex)
    check(dw, ew)
    _, t_out = rd.jvp(rd.ragged_dot, (rd.AsQArray(x, "int8", channelwise_axes=(0,)), w, gs), (x, None, None))
    check(t_out, reference.ragged_dot(x, w, gs).astype(np.float32))

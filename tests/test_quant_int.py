"""Exact integer products of int8 x int8 quantized operands.

When both operands of a float32 product are int8 QArrays (int4 values held
in int8 too; zero points, if any, integers in [-128, 127]) the kernels sum
the integer products exactly in int32 within each block of the reduction
and apply the scales once per block in float32. The oracles:

- with unit scales and sums that float32 holds exactly, an int64 NumPy
  product of the same values, compared bit for bit (q = -128 everywhere is
  the worst case for int16 saturation, which vpmaddwd does not have);
- with real scales, raggeddot.reference on the dequantized values.

The reduction axis is k for ragged_dot/gmm and m for tgmm; scale blocks
along it are cut by the cache blocking (forced with runtime.set_blocking)
and, for tgmm, by the group bounds.
"""

import numpy as np
import pytest

import raggeddot as rd
from raggeddot import reference, runtime

from helpers import DOT_KERNELS, KERNELS, assert_unchanged, check_close, random_group_sizes, snapshot

INT = "int8-int32"   # the compute type's name in runtime.set_blocking / build_info


@pytest.fixture(params=KERNELS + DOT_KERNELS["int8-dot"] + DOT_KERNELS["int8-tile"] + DOT_KERNELS["int8-mmla"])
def kernel(request):
    """Every float family (vpmaddwd, int8-int32), every int8 dot-product
    family (vpdpbusd, int8-dot), tile family (TDPBUSD, int8-tile) and MMLA
    family (USMMLA, int8-mmla), natives and twins; INT names the compute
    type the family serves, for set_blocking."""
    global INT
    with runtime.configured(kernel=request.param):
        INT = next((ct for ct in ("int8-dot", "int8-tile", "int8-mmla") if request.param in DOT_KERNELS[ct]),
                   "int8-int32")
        try:
            yield request.param
        finally:
            INT = "int8-int32"


def ints(rng, shape, lo=-128, hi=127, minus128=False):
    q = rng.integers(lo, hi + 1, shape).astype(np.int8)
    if minus128:
        q[...] = -128
    return q


def unit(q, scale_shape):
    return rd.QArray(q, np.ones(scale_shape, np.float32))


def exact_rows(ql, qr, gs):
    """int64 ragged_dot of lhs [m, k] and rhs [g, k, n] (rows past the groups zero)."""
    out = np.zeros((ql.shape[0], qr.shape[2]), np.int64)
    o = 0
    for j, s in enumerate(gs):
        out[o:o + s] = ql[o:o + s].astype(np.int64) @ qr[j].astype(np.int64)
        o += s
    return out


def exact_contract(ql, qr, gs):
    """int64 tgmm of lhs [k, m] and rhs [m, n]: [g, k, n]."""
    out = np.zeros((len(gs), ql.shape[0], qr.shape[1]), np.int64)
    o = 0
    for j, s in enumerate(gs):
        out[j] = ql[:, o:o + s].astype(np.int64) @ qr[o:o + s].astype(np.int64)
        o += s
    return out


def assert_exact(got, want_int, what):
    """got (float32) equals the integer result, which float32 holds exactly."""
    assert np.abs(want_int).max(initial=0) < 2 ** 24, "test sizes must keep the sums exact in float32"
    assert got.dtype == np.float32, what
    bad = np.flatnonzero(got.ravel() != want_int.ravel())
    assert bad.size == 0, (f"{what}: {bad.size} entries differ, first at {np.unravel_index(bad[0], got.shape)}: "
                           f"{got.ravel()[bad[0]]} != {want_int.ravel()[bad[0]]}")


# ---------------------------------------------------------------------------
# Bit-exact integer sums (unit scales)
# ---------------------------------------------------------------------------

KC_CASES = [7, 32, 300, 4096]   # odd, smaller than k, about k, all of k


@pytest.mark.parametrize("kc", KC_CASES)
@pytest.mark.parametrize("minus128", [False, True], ids=["random", "all_-128"])
def test_ragged_dot_unit_scales_bit_exact(rng, kernel, kc, minus128):
    m, k, n, g = 83, 301, 45, 4
    runtime.set_blocking(INT, 48, kc, 64)
    ql, qr = ints(rng, (m, k), minus128=minus128), ints(rng, (g, k, n), minus128=minus128)
    gs = random_group_sizes(rng, g, m - 3)
    want = exact_rows(ql, qr, gs)
    for sl, sr, what in (((1, 1), (1, 1, 1), "per tensor"), ((m, 1), (g, 1, n), "per channel"),
                         ((m, k), (g, k, n), "per element"), ((1, 7), (1, 43, 1), "blocks 43 and 7")):
        L, R = unit(ql, sl), unit(qr, sr)
        copies = snapshot([ql, qr])
        got = rd.ragged_dot(L, R, gs)
        assert_unchanged([ql, qr], copies, ["lhs qvalue", "rhs qvalue"])
        assert_exact(got[:int(gs.sum())], want[:int(gs.sum())], f"{kernel} kc={kc} {what}")
        assert_exact(rd.gmm(L, R, gs)[:int(gs.sum())], want[:int(gs.sum())], f"gmm {what}")


@pytest.mark.parametrize("kc", KC_CASES)
@pytest.mark.parametrize("minus128", [False, True], ids=["random", "all_-128"])
def test_tgmm_unit_scales_bit_exact(rng, kernel, kc, minus128):
    k, m, n, g = 37, 290, 51, 5
    runtime.set_blocking(INT, 24, kc, 32)
    ql, qr = ints(rng, (k, m), minus128=minus128), ints(rng, (m, n), minus128=minus128)
    gs = random_group_sizes(rng, g, m - 4)
    want = exact_contract(ql, qr, gs)
    for sl, sr, what in (((1, 1), (1, 1), "per tensor"), ((k, 1), (1, n), "per channel"),
                         ((1, 29), (29, 1), "m blocks of 10")):
        got = rd.tgmm(unit(ql, sl), unit(qr, sr), gs)
        assert_exact(got, want, f"{kernel} kc={kc} {what}")


def test_int32_sum_of_one_block_is_exact_beyond_float32(rng, kernel):
    """Within one block the sum is an integer, rounded to float32 once: a
    float32 accumulation of the same products (whose partial sums pass
    2**24) would round at every step."""
    m, k, n = 30, 2048, 40
    runtime.set_blocking(INT, 48, k, 64)
    ql, qr = ints(rng, (m, k), 100, 127), ints(rng, (1, k, n), 100, 127)
    gs = np.array([m])
    want = exact_rows(ql, qr, gs)
    assert want.min() > 2 ** 24
    got = rd.ragged_dot(unit(ql, (1, 1)), unit(qr, (1, 1, 1)), gs)
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_int4_values_and_integral_zero_points_bit_exact(rng, kernel):
    m, k, n, g = 40, 200, 33, 3
    ql, qr = ints(rng, (m, k), -8, 7), ints(rng, (g, k, n))
    gs = np.array([10, 0, 30])
    L = rd.QArray(ql, np.ones((m, 1), np.float32), qtype="int4")
    zl = rng.integers(-128, 128, (m, 1)).astype(np.float32)
    zr = rng.integers(-128, 128, (g, 1, n)).astype(np.float32)
    assert_exact(rd.ragged_dot(L, unit(qr, (1, 1, 1)), gs), exact_rows(ql, qr, gs), "int4 lhs")
    Lz = rd.QArray(ql, np.ones((m, 1), np.float32), zl)
    Rz = rd.QArray(qr, np.ones((g, 1, n), np.float32), zr)
    # q - z lies in [-255, 255]: still exact int16 pairs
    want = exact_rows(ql.astype(np.int64) - zl.astype(np.int64), qr.astype(np.int64) - zr.astype(np.int64), gs)
    assert_exact(rd.ragged_dot(Lz, Rz, gs), want, "zero points")


def test_fractional_zero_points_take_the_float_path(rng):
    m, k, n = 20, 64, 16
    ql, qr = ints(rng, (m, k)), ints(rng, (1, k, n))
    L = rd.QArray(ql, np.full((m, 1), 0.01, np.float32), np.full((m, 1), 0.5, np.float32))
    R = rd.QArray(qr, np.full((1, 1, n), 0.02, np.float32))
    gs = np.array([m])
    check_close(rd.ragged_dot(L, R, gs), reference.ragged_dot(L, R, gs).astype(np.float32))


# ---------------------------------------------------------------------------
# Real scales against the dequantized oracle
# ---------------------------------------------------------------------------

def scales(rng, shape):
    return rng.uniform(0.25, 2.0, shape).astype(np.float32)


# (lhs scale shape, rhs scale shape) for lhs [m, k], rhs [g, k, n]
ROW_LAYOUTS = {
    "per_channel_rhs_per_tensor_lhs": (lambda m, k, g, n: ((1, 1), (g, 1, n))),
    "per_token_per_channel": (lambda m, k, g, n: ((m, 1), (g, 1, n))),
    "subchannel_32": (lambda m, k, g, n: ((m, k // 32), (g, k // 32, n))),
    "subchannel_128": (lambda m, k, g, n: ((m, k // 128), (g, k // 128, n))),
    "subchannel_32_lhs_128_rhs": (lambda m, k, g, n: ((m, k // 32), (g, k // 128, n))),
}


@pytest.mark.parametrize("kc", [16, 48, 200, 1024])   # smaller / larger than the blocks
@pytest.mark.parametrize("layout", list(ROW_LAYOUTS))
def test_ragged_dot_scales_against_oracle(rng, kernel, layout, kc):
    m, k, n, g = 70, 256, 40, 3
    runtime.set_blocking(INT, 48, kc, 64)
    sl, sr = ROW_LAYOUTS[layout](m, k, g, n)
    L = rd.QArray(ints(rng, (m, k)), scales(rng, sl))
    R = rd.QArray(ints(rng, (g, k, n)), scales(rng, sr))
    gs = np.array([25, 0, 40])
    check_close(rd.ragged_dot(L, R, gs), reference.ragged_dot(L, R, gs).astype(np.float32), err_msg=layout)
    ex = rng.standard_normal((m, n)).astype(np.float32)
    check_close(rd.gmm(L, R, gs, existing_out=ex), reference.gmm(L, R, gs, existing_out=ex).astype(np.float32),
                err_msg="existing_out")
    check_close(rd.gmm(L, R.transpose(0, 2, 1), gs, transpose_rhs=True),
                reference.gmm(L, R, gs).astype(np.float32), err_msg="transpose_rhs")


@pytest.mark.parametrize("kc", [8, 40, 512])
@pytest.mark.parametrize("mblock", [8, 24, 60])
def test_tgmm_scale_blocks_along_m(rng, kernel, mblock, kc):
    """tgmm reduces over m: its scale blocks along m are smaller than the
    groups and cut by their bounds; the cache blocks along m (kc) are smaller
    and larger than them; the output tiles along k (rows) and n span several
    scale blocks of those axes. A split taken from the k tiling is wrong here."""
    k, m, n = 96, 240, 64
    runtime.set_blocking(INT, 24, kc, 32)
    gs = np.array([50, 0, 77, 3, 90])            # bounds 50, 127, 130: inside blocks
    la = rd.QArray(ints(rng, (k, m)), scales(rng, (k // 16, m // mblock)))      # blocks 16 along k
    lb = rd.QArray(ints(rng, (m, n)), scales(rng, (m // mblock, n // 8)))       # blocks 8 along n
    check_close(rd.tgmm(la, lb, gs), reference.tgmm(la, lb, gs).astype(np.float32), err_msg="tgmm")
    # lhs and rhs with different blocks along m
    lc = rd.QArray(ints(rng, (k, m)), scales(rng, (k, m // 12)))
    check_close(rd.tgmm(lc, lb, gs), reference.tgmm(lc, lb, gs).astype(np.float32), err_msg="mixed blocks")


def test_threads_give_the_same_bits(rng, restore_runtime):
    L = rd.QArray(ints(rng, (200, 256)), scales(rng, (200, 2)))
    R = rd.QArray(ints(rng, (4, 256, 96)), scales(rng, (4, 2, 96)))
    gs = np.array([60, 40, 0, 100])
    runtime.set_num_threads(1)
    one = rd.ragged_dot(L, R, gs)
    runtime.set_num_threads(2)
    np.testing.assert_array_equal(rd.ragged_dot(L, R, gs), one)


def test_int8_subchannel_128_cosine_against_float(rng):
    m, k, n, g = 256, 512, 128, 4
    x, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((g, k, n)).astype(np.float32)
    gs = np.array([64, 100, 0, 92])
    qx = rd.quantize(x, "int8", channelwise_axes=(0,), tiled_axes={1: 128})
    qw = rd.quantize(w, "int8", channelwise_axes=(0, 2), tiled_axes={1: 128})
    exact = rd.ragged_dot(x, w, gs).ravel()
    got = rd.ragged_dot(qx, qw, gs).ravel()
    cos = float(exact @ got / np.linalg.norm(exact) / np.linalg.norm(got))
    assert cos >= 0.999, cos
    check_close(got, reference.ragged_dot(qx, qw, gs).astype(np.float32).ravel())


def test_dynamic_int8_activations(rng, kernel):
    """AsQArray quantizes x per token and block once per call; the product
    with int8 weights runs on integers and equals the oracle's product of
    the same quantized values."""
    x = rng.standard_normal((50, 128)).astype(np.float32)
    qw = rd.quantize(rng.standard_normal((3, 128, 24)).astype(np.float32), "int8",
                     channelwise_axes=(0, 2), tiled_axes={1: 64})
    gs = np.array([20, 20, 10])
    spec = dict(channelwise_axes=(0,), tiled_axes={1: 64})
    got = rd.gmm(rd.AsQArray(x, "int8", **spec), qw, gs)
    check_close(got, reference.gmm(rd.quantize(x, "int8", **spec), qw, gs).astype(np.float32))


def test_float64_and_float8_mixes_stay_float(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x, w = rng.standard_normal((30, 64)), rng.standard_normal((2, 64, 20))
    gs = np.array([10, 20])
    qx = rd.quantize(x.astype(np.float32), "int8", channelwise_axes=(0,))
    qw = rd.quantize(w.astype(np.float32), "int8", channelwise_axes=(0, 2))
    got = rd.ragged_dot(qx, qw, gs, preferred_element_type=np.float64)
    assert got.dtype == np.float64
    check_close(got, reference.ragged_dot(qx, qw, gs, preferred_element_type=np.float64))
    f8 = rd.quantize(w.astype(np.float32), np.dtype(ml_dtypes.float8_e4m3fn), channelwise_axes=(0, 2))
    check_close(rd.ragged_dot(qx, f8, gs), reference.ragged_dot(qx, f8, gs).astype(np.float32))

"""The dot-product kernels: bfloat16 pairs (vdpbf16ps on x86, BFMMLA on
Arm) and int8 (vpdpbusd, USMMLA, UDOT), native and emulated twins.

Every family that serves a dot-product type on this CPU is run: the twins
everywhere (plain C, on every architecture), the native families where the
CPU has the instruction, and then native and twin must agree bit for bit.
The independent oracles:

- bfloat16: a NumPy model of each instruction's arithmetic, blocked as the
  driver blocks the contraction (KC). vdpbf16ps: per pair the odd element's
  product added first, then the even one's, each addition rounded to
  float32 (products of bfloat16 values are exact in float32). Arm's BFDOT and BFMMLA:
  per pair the two products summed, then added to the accumulator, each sum
  rounded to odd (truncated, the last bit set when inexact). On
  normal-range data the models are exact, so every family must equal its
  instruction's model bit for bit.
- int8: exact integer products from NumPy (int64), and the vpmaddwd integer
  kernel (int8-int32), whose block sums and float epilogue these equal bit
  for bit.
"""
import numpy as np
import pytest

import raggeddot
from raggeddot import QArray, reference, runtime

from helpers import FLOAT_FAMILY, THREAD_COUNTS, check_close

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

TABLE = runtime.build_info()
CPU = TABLE["cpu"]


def _serving(ctype):
    """The runnable families with a kernel for compute type ``ctype``."""
    return [k["name"] for k in TABLE["kernels"] if k["runnable"] and ctype in k["types"]]


# the bfloat16 pair families: dot products (vdpbf16ps) and Arm's matrix
# multiply-accumulate (BFMMLA), which reads the same B panels
BF16_FAMILIES = _serving("bfloat16-dot") + _serving("bfloat16-mmla")
# the int8 tile (AMX) and MMLA (USMMLA) families give the int8 dot types'
# sums and results
INT8_TILE_FAMILIES = _serving("int8-tile")
INT8_FAMILIES = _serving("int8-dot") + _serving("int8-mmla") + INT8_TILE_FAMILIES


def _product(family, dtype):
    """The compute type ``family`` runs ``dtype`` ("bfloat16", "int8")
    products on when named."""
    with runtime.configured(kernel=family):
        return runtime.build_info()["products"][dtype]["compute"]


def _i8(family):
    """The int8 compute type ``family`` serves."""
    return _product(family, "int8")


# the native dot families and their twins (a twin is listed by every build)
TWIN_OF = {"avx512-bf16": "avx512-bf16-twin", "neon-bf16": "neon-bf16-twin", "avx512-vnni": "avx512-vnni-twin",
           "avx-vnni": "avx-vnni-twin", "neon-i8mm": "neon-i8mm-twin", "neon-dot": "neon-dot-twin",
           "amx": "amx-twin"}
# the families whose bfloat16 pairs take Arm's arithmetic (BFDOT, BFMMLA)
ARM_BF16 = ("neon-bf16", "neon-bf16-twin")


def _base(family):
    """The float family whose integer kernel (int8-int32) ``family`` is
    checked against: the one this CPU runs float32 on (the ref family's
    where that family has none)."""
    return FLOAT_FAMILY


def test_the_cpu_runs_its_native_families_and_the_twins():
    """Where the CPU has an instruction its native family is runnable and
    chosen automatically; the twins run on every CPU (every build lists
    them) and are never chosen automatically."""
    names = {k["name"]: k for k in TABLE["kernels"]}
    for twin in TWIN_OF.values():
        assert names[twin]["runnable"], twin
    natives = {"avx512-bf16": ("avx512_bf16", "avx512f"), "avx512-vnni": ("avx512_vnni", "avx512f"),
               "avx-vnni": ("avx_vnni", "avx2"), "neon-bf16": ("bf16",), "neon-i8mm": ("i8mm",),
               "neon-dot": ("dotprod",)}
    for family, flags in natives.items():
        if all(flag in CPU for flag in flags):    # this architecture's
            assert names[family]["runnable"] == all(CPU[f] for f in flags), family
        else:                                     # the other's: not built here
            assert family not in names, family
    assert names["amx-twin"]["runnable"]
    assert ("amx" in names) == ("avx2" in CPU)
    if "amx" in names:
        assert names["amx"]["runnable"] == CPU["amx"] == (TABLE["amx"]["why"] == "")
    with runtime.configured(kernel="auto"):
        info = runtime.build_info()
    products = {dtype: (p["compute"], p["kernel"]) for dtype, p in info["products"].items()}
    # the native family of each product here and the compute type it runs
    # on (Arm's families the MMLA types), the first the CPU runs
    bf16_natives = {"avx512-bf16": "bfloat16-dot", "neon-bf16": "bfloat16-mmla"}
    int8_natives = {"avx512-vnni": "int8-dot", "avx-vnni": "int8-dot", "neon-i8mm": "int8-mmla",
                    "neon-dot": "int8-dot"}
    native_bf = next((f for f in bf16_natives if f in names and names[f]["runnable"]), None)
    native_i8 = next((f for f in int8_natives if f in names and names[f]["runnable"]), None)
    # the bfloat16 dot products serve automatically only where they outrun
    # the float32 FMAs
    pays = info["bf16dot_vs_fma"] >= 1.0
    amx = CPU.get("amx", False)
    want_bf = (("bfloat16-tile", "amx") if amx else (bf16_natives[native_bf], native_bf) if native_bf and pays
               else ("float32", info["kernel"]))
    assert products["bfloat16"] == want_bf
    want_i8 = (("int8-tile", "amx") if amx else (int8_natives[native_i8], native_i8) if native_i8
               else ("int8-int32", info["kernel"]))
    assert products["int8"] == want_i8
    assert info["products"]["bfloat16_highest"]["compute"] == "float32"
    # naming a float family forces the widening path: no dot-product type
    with runtime.configured(kernel="ref"):
        assert "bfloat16-dot" not in runtime.build_info()["blocking"]


# ---------------------------------------------------------------------------
# bfloat16
# ---------------------------------------------------------------------------

def _bf16_model(a, b, kc):
    """``a [m, k] @ b [k, n]`` (bfloat16 values) as the bfloat16 dot kernels
    compute it: each KC block summed from zero pair by pair (odd element
    first), then added to the result (the first block stored)."""
    a = a.astype(np.float32)
    b = b.astype(np.float32)
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), np.float32)
    for p0 in range(0, k, kc):
        acc = np.zeros_like(out)
        for p in range(p0, min(k, p0 + kc), 2):
            if p + 1 < min(k, p0 + kc):
                acc = acc + np.multiply.outer(a[:, p + 1], b[p + 1])   # float32: products exact
            acc = acc + np.multiply.outer(a[:, p], b[p])
        out = acc if p0 == 0 else out + acc
    return out


def _round_odd(s, e):
    """float32 of the exact values s + e (float64 arrays, e the error of the
    sum that made s), truncated and the last bit set where inexact: Arm's
    round to odd. Tiny values (below 2^-126) flush to 0; normal-range data
    never overflows."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = s.astype(np.float32)
        r = (s - f.astype(np.float64)) + e            # the exact value less f: its sign is exact
    bits = f.view(np.uint32).copy()
    inexact = r != 0
    toward_zero = inexact & ((r > 0) != (f > 0))      # f was rounded away from zero: step back
    bits[toward_zero] -= 1
    bits[inexact] |= 1
    out = bits.view(np.float32)
    tiny = (np.abs(s) < 2.0 ** -126) | ((np.abs(s) == 2.0 ** -126) & (e * s < 0))
    return np.where(tiny, np.copysign(np.float32(0), s).astype(np.float32), out)


def _add_odd(x, y):
    """x + y (float32 arrays) rounded to odd: the exact sum as s + e (TwoSum)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    s = x + y
    bb = s - x
    return _round_odd(s, (x - (s - bb)) + (y - bb))


def _bfdot_model(a, b, kc):
    """``a [m, k] @ b [k, n]`` (bfloat16 values) as Arm's BFMMLA computes it:
    each KC block summed from zero pair by pair, each pair's two products
    (exact) summed and added to the accumulator with rounding to odd, then
    added to the result (the first block stored)."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), np.float32)
    for p0 in range(0, k, kc):
        acc = np.zeros_like(out)
        end = min(k, p0 + kc)
        for p in range(p0, end, 2):
            t = np.multiply.outer(a[:, p], b[p]).astype(np.float32)        # exact
            if p + 1 < end:
                t = _add_odd(t, np.multiply.outer(a[:, p + 1], b[p + 1]).astype(np.float32))
            acc = _add_odd(acc, t)
        out = acc if p0 == 0 else out + acc
    return out


def _model_for(family):
    """The NumPy model of the bfloat16 pairs' arithmetic of ``family``."""
    return _bfdot_model if family in ARM_BF16 else _bf16_model


def _model_rows(lhs, rhs, sizes, kc, model=_bf16_model):
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
    start = 0
    for g, s in enumerate(sizes):
        if s:
            out[start:start + s] = model(lhs[start:start + s], rhs[g], kc)
        start += s
    return out


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint32 if x.dtype.itemsize == 4 else np.uint16)


def _kc(family):
    with runtime.configured(kernel=family):
        return runtime.build_info()["blocking"][_product(family, "bfloat16")]["KC"]


SHAPES = [  # m, k, n, group sizes: odd k (pair padding), m and n around the 12 x 32 block
    (5, 1, 3, [2, 3]),
    (13, 2, 31, [13]),
    (25, 3, 33, [12, 0, 11]),
    (40, 5, 64, [1, 11, 0, 24]),
    (37, 63, 45, [37]),
    (30, 127, 65, [4, 0, 0, 26]),
    (24, 1001, 40, [12, 12]),
]


@pytest.mark.parametrize("family", BF16_FAMILIES)
@pytest.mark.parametrize("m, k, n, sizes", SHAPES, ids=lambda v: str(v))
def test_bf16_kernels_equal_the_model_of_the_instruction(rng, family, m, k, n, sizes):
    lhs = rng.standard_normal((m, k)).astype(BF16)
    rhs = rng.standard_normal((len(sizes), k, n)).astype(BF16)
    with runtime.configured(kernel=family):
        got = raggeddot.ragged_dot(lhs, rhs, np.array(sizes), preferred_element_type=np.float32)
    want = _model_rows(lhs, rhs, sizes, _kc(family), _model_for(family))
    assert np.array_equal(_bits(got), _bits(want)), np.argwhere(got != want)[:3]


@pytest.mark.parametrize("family", BF16_FAMILIES)
def test_bf16_tgmm_transposed_strided_and_16bit_outputs(rng, family):
    """The same arithmetic through tgmm (pairs along m, each group padded to
    even), a transposed rhs, strided lhs, and a bfloat16 result (the float32
    tile rounded once)."""
    kc, model = _kc(family), _model_for(family)
    sizes = np.array([7, 0, 12, 1])
    x = rng.standard_normal((20, 9)).astype(BF16)         # [m, k]
    dy = rng.standard_normal((20, 6)).astype(BF16)        # [m, n]
    with runtime.configured(kernel=family):
        got = raggeddot.tgmm(x.T, dy, sizes, preferred_element_type=np.float32)
    start = 0
    for g, s in enumerate(sizes):
        want = model(x[start:start + s].T, dy[start:start + s], kc) if s else np.zeros((9, 6), np.float32)
        assert np.array_equal(_bits(got[g]), _bits(want)), g
        start += s

    big = rng.standard_normal((60, 2 * 33)).astype(BF16)
    lhs = big[::2, ::2]                                    # strided [30, 33]
    w = rng.standard_normal((2, 40, 33)).astype(BF16)     # rhs given as [g, n, k]
    sizes = np.array([10, 20])
    with runtime.configured(kernel=family):
        got = raggeddot.gmm(lhs, w, sizes, preferred_element_type=np.float32, transpose_rhs=True)
        got16 = raggeddot.gmm(lhs, w, sizes, preferred_element_type=BF16, transpose_rhs=True)
    want = _model_rows(np.ascontiguousarray(lhs), np.ascontiguousarray(w.transpose(0, 2, 1)), sizes, kc, model)
    assert np.array_equal(_bits(got), _bits(want))
    assert got16.dtype == BF16 and np.array_equal(_bits(got16), _bits(want.astype(BF16)))


def test_bf16_native_equals_twin_on_denormals_and_extremes(rng):
    """Where the CPU has a bfloat16 dot instruction (vdpbf16ps, BFMMLA): its
    results and its twin's are equal bit for bit on data full of denormals,
    tiny and huge values (the flushing, overflow and NaN cases the models
    above leave out)."""
    pairs = [(f, TWIN_OF[f]) for f in ("avx512-bf16", "neon-bf16") if f in BF16_FAMILIES]
    if not pairs:
        assert not (CPU.get("avx512_bf16") or CPU.get("bf16"))
        pytest.skip("this CPU has no bfloat16 dot instruction: the twins are checked against the models above")
    bits = rng.integers(0, 1 << 16, (6000,), dtype=np.uint16)
    exps = rng.choice([0, 1, 2, 0x7e, 0x7f, 0x80, 0xfe], size=6000)       # denormal .. huge exponents
    bits = (bits & 0x807f) | (exps.astype(np.uint16) << 7)
    vals = bits.view(BF16)
    lhs = vals[:40 * 75].reshape(40, 75)
    rhs = vals[3000:3000 + 2 * 75 * 19].reshape(2, 75, 19)
    sizes = np.array([17, 23])
    for native, twin in pairs:
        outs = []
        for family in (native, twin):
            with runtime.configured(kernel=family):
                outs.append(raggeddot.ragged_dot(lhs, rhs, sizes, preferred_element_type=np.float32))
        a, b = outs
        assert np.array_equal(_bits(a), _bits(b)), native
        assert np.isnan(a).any() or np.isinf(a).any() or (a == 0).any()   # the data reached the edge cases


def test_bf16_twin_flushes_denormals_and_leaves_mxcsr_alone():
    """Denormal bfloat16 inputs count as 0 and denormal results are flushed
    (the instruction's arithmetic) in every family serving the type, while
    the widening float32 kernels keep them; and the caller's MXCSR is
    restored: NumPy's float32 arithmetic still makes denormals afterwards."""
    tiny = np.array([[1e-39]], np.float32).astype(BF16)           # a bfloat16 denormal
    one = np.ones((1, 1, 1), BF16)
    half = np.array([[2.0 ** -100]], np.float32).astype(BF16)
    small = np.full((1, 1, 1), 2.0 ** -30, np.float32).astype(BF16)   # product 2^-130: denormal
    with runtime.configured(kernel=FLOAT_FAMILY):
        assert raggeddot.ragged_dot(tiny, one, np.array([1]), preferred_element_type=np.float32)[0, 0] != 0
        assert raggeddot.ragged_dot(half, small, np.array([1]), preferred_element_type=np.float32)[0, 0] != 0
    for family in BF16_FAMILIES:
        with runtime.configured(kernel=family):
            assert raggeddot.ragged_dot(tiny, one, np.array([1]), preferred_element_type=np.float32)[0, 0] == 0
            assert raggeddot.ragged_dot(half, small, np.array([1]), preferred_element_type=np.float32)[0, 0] == 0
        assert np.float32(1e-38) * np.float32(1e-3) != 0


def _same_bits_on_every_thread_count(family, lhs, rhs, sizes):
    outs = []
    for t in THREAD_COUNTS:
        with runtime.configured(kernel=family, num_threads=t):
            outs.append(raggeddot.ragged_dot(lhs, rhs, sizes, preferred_element_type=np.float32))
    for o in outs[1:]:
        assert np.array_equal(_bits(o), _bits(outs[0]))


@pytest.mark.parametrize("family", BF16_FAMILIES)
def test_bf16_results_do_not_depend_on_threads(rng, family):
    lhs = rng.standard_normal((300, 130)).astype(BF16)
    rhs = rng.standard_normal((3, 130, 70)).astype(BF16)
    _same_bits_on_every_thread_count(family, lhs, rhs, np.array([120, 0, 170]))


def _preset():
    jax = pytest.importorskip("jax")
    return jax.lax.DotAlgorithmPreset.BF16_BF16_F32


@pytest.mark.parametrize("family", sorted({"auto", FLOAT_FAMILY, "ref"}) + BF16_FAMILIES)
def test_bf16_preset_rounds_float32_operands(rng, family):
    """precision=BF16_BF16_F32 on float32 operands is the product of the
    operands rounded to bfloat16 (nearest even), bit for bit, on every
    kernel: the dot-product kernels where they serve, the float32 kernels
    on the rounded values otherwise."""
    preset = _preset()
    lhs = rng.standard_normal((45, 37)).astype(np.float32)
    rhs = rng.standard_normal((3, 37, 29)).astype(np.float32)
    sizes = np.array([20, 0, 25])
    with runtime.configured(kernel=family):
        got = raggeddot.ragged_dot(lhs, rhs, sizes, precision=preset)
        want = raggeddot.ragged_dot(lhs.astype(BF16), rhs.astype(BF16), sizes, preferred_element_type=np.float32)
        plain = raggeddot.ragged_dot(lhs, rhs, sizes)
        dn = raggeddot.RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0])
        general = raggeddot.ragged_dot_general(lhs, rhs, sizes, dn, precision=preset)
    assert got.dtype == np.float32
    assert np.array_equal(_bits(got), _bits(want)) and np.array_equal(_bits(general), _bits(want))
    assert not np.array_equal(got, plain)
    check_close(got, reference.ragged_dot(lhs.astype(np.float64), rhs.astype(np.float64), sizes),
                rtol=2e-2)


def test_bf16_preset_refuses_float64(rng):
    preset = _preset()
    lhs = rng.standard_normal((4, 3))
    with pytest.raises(TypeError, match="BF16_BF16_F32.*float64"):
        raggeddot.ragged_dot(lhs, rng.standard_normal((1, 3, 2)), np.array([4]), precision=preset)


# ---------------------------------------------------------------------------
# int8
# ---------------------------------------------------------------------------

def _int8(rng, shape, extremes=True):
    v = rng.integers(-128, 128, shape).astype(np.int8)
    if extremes:   # rows and columns of -128 and 127, both sides
        v.reshape(-1)[::7] = -128
        v.reshape(-1)[3::11] = 127
    return v


@pytest.mark.parametrize("family", INT8_FAMILIES)
@pytest.mark.parametrize("k", [1, 2, 3, 5, 63, 127, 1001])
def test_int8_sums_are_exact(rng, family, k):
    """Unit scales: the float32 result is the exact integer product (all
    sums below 2^24 here), values -128 and 127 on both sides."""
    sizes = np.array([5, 0, 13, 1])
    m, n = int(sizes.sum()) + 2, 35
    a, b = _int8(rng, (m, k)), _int8(rng, (4, k, n))
    lhs = QArray(a, np.ones((m, 1), np.float32))
    rhs = QArray(b, np.ones((4, 1, n), np.float32))
    with runtime.configured(kernel=family):
        got = raggeddot.ragged_dot(lhs, rhs, sizes, preferred_element_type=np.float32)
    want = np.zeros((m, n), np.int64)
    start = 0
    for g, s in enumerate(sizes):
        want[start:start + s] = a[start:start + s].astype(np.int64) @ b[g].astype(np.int64)
        start += s
    assert np.array_equal(got, want.astype(np.float32)) and np.abs(want).max() < 2 ** 24


@pytest.mark.parametrize("family", INT8_FAMILIES)
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("bk", [0, 10, 25])
def test_int8_equals_the_vpmaddwd_kernel(rng, family, zero_points, bk):
    """Per-token lhs scales, per-channel (bk 0) or subchannel rhs scales,
    integral zero points on both sides: the same bits as the int8-int32
    kernels of the float family with the same KC, and close to the float64
    product of the dequantized operands."""
    k, n, sizes = 100, 47, np.array([9, 0, 30, 14])
    m = int(sizes.sum()) + 1
    a, b = _int8(rng, (m, k)), _int8(rng, (4, k, n))
    sshape = (4, 1 if bk == 0 else k // bk, n)
    lz = rng.integers(-128, 128, (m, 1)).astype(np.float32) if zero_points else None
    rz = rng.integers(-128, 128, sshape).astype(np.float32) if zero_points else None
    lhs = QArray(a, rng.uniform(0.01, 0.1, (m, 1)).astype(np.float32), lz)
    rhs = QArray(b, rng.uniform(0.01, 0.1, sshape).astype(np.float32), rz)
    with runtime.configured(kernel=family):
        got = raggeddot.ragged_dot(lhs, rhs, sizes, preferred_element_type=np.float32)
        kc = runtime.build_info()["blocking"][_i8(family)]["KC"]
    with runtime.configured(kernel=_base(family)):
        runtime.set_blocking("int8-int32", 144, kc, 4080)   # the same blocks: the same sums
        want = raggeddot.ragged_dot(lhs, rhs, sizes, preferred_element_type=np.float32)
    assert np.array_equal(_bits(got), _bits(want))
    ref = reference.ragged_dot(raggeddot.dequantize(lhs).astype(np.float64),
                               raggeddot.dequantize(rhs).astype(np.float64), sizes)
    check_close(got, ref, rtol=1e-5)


@pytest.mark.parametrize("family", INT8_FAMILIES)
def test_int8_tgmm_with_subchannel_scales_along_m(rng, family):
    """tgmm of int8 operands whose scales vary along m (the reduced axis):
    the contraction splits at the scale blocks; the same bits as the
    vpmaddwd kernel and close to the float64 reference."""
    sizes = np.array([10, 0, 22, 8])
    m, k, n = 40, 13, 11
    x = QArray(_int8(rng, (k, m)), rng.uniform(0.01, 0.1, (k, m // 8)).astype(np.float32))
    dy = QArray(_int8(rng, (m, n)), rng.uniform(0.01, 0.1, (m // 8, n)).astype(np.float32))
    with runtime.configured(kernel=family):
        got = raggeddot.tgmm(x, dy, sizes, preferred_element_type=np.float32)
        kc = runtime.build_info()["blocking"][_i8(family)]["KC"]
    with runtime.configured(kernel=_base(family)):
        runtime.set_blocking("int8-int32", 144, kc, 4080)
        want = raggeddot.tgmm(x, dy, sizes, preferred_element_type=np.float32)
    assert np.array_equal(_bits(got), _bits(want))
    ref = reference.tgmm(raggeddot.dequantize(x).astype(np.float64), raggeddot.dequantize(dy).astype(np.float64),
                         sizes)
    check_close(got, ref, rtol=1e-5)


def test_int8_native_equals_twin(rng):
    """Where the CPU has an int8 dot instruction (AVX512-VNNI, AVX-VNNI, AMX,
    I8MM, DotProd): native and twin agree bit for bit (they also each equal
    the vpmaddwd kernel, above)."""
    pairs = [(f, TWIN_OF[f]) for f in ("avx512-vnni", "avx-vnni", "amx", "neon-i8mm", "neon-dot")
             if f in INT8_FAMILIES]
    if not pairs:
        assert not any(CPU.get(f) for f in ("avx512_vnni", "avx_vnni", "amx", "i8mm", "dotprod"))
        pytest.skip("this CPU has no int8 dot instruction: the twins are checked against the exact products above")
    m, k, n = 70, 301, 90
    sizes = np.array([30, 40])
    lhs = QArray(_int8(rng, (m, k)), rng.uniform(0.01, 0.1, (m, 1)).astype(np.float32),
                 rng.integers(-128, 128, (m, 1)).astype(np.float32))
    rhs = QArray(_int8(rng, (2, k, n)), rng.uniform(0.01, 0.1, (2, 1, n)).astype(np.float32))
    for native, twin in pairs:
        outs = []
        for family in (native, twin):
            with runtime.configured(kernel=family):
                outs.append(raggeddot.ragged_dot(lhs, rhs, sizes, preferred_element_type=np.float32))
        assert np.array_equal(_bits(outs[0]), _bits(outs[1])), native


@pytest.mark.parametrize("family", INT8_FAMILIES)
def test_int8_results_do_not_depend_on_threads(rng, family):
    lhs = QArray(_int8(rng, (200, 90)), rng.uniform(0.01, 0.1, (200, 1)).astype(np.float32))
    rhs = QArray(_int8(rng, (3, 90, 70)), rng.uniform(0.01, 0.1, (3, 1, 70)).astype(np.float32))
    _same_bits_on_every_thread_count(family, lhs, rhs, np.array([50, 0, 150]))


@pytest.mark.parametrize("family", INT8_FAMILIES)
def test_int8_weights_prepacked_in_k_quads(rng, family):
    """prepack(q, lhs_dtype=np.int8): k-quads (blocks of 8 steps for the
    MMLA families) with column sums, blocks cut at the scale tiles along k;
    the same bits as the QArray call, unpack() gives the values back, and a
    float lhs gets the QArray call's bits too."""
    with runtime.configured(kernel=family):
        for m, k, n, g, bk, zp in [(300, 70, 50, 16, 0, False), (64, 1, 33, 8, 0, True),
                                   (200, 600, 100, 7, 100, True), (40, 1025, 33, 3, 25, False)]:
            sshape = (g, 1 if bk == 0 else k // bk, n)
            w = QArray(_int8(rng, (g, k, n)), rng.uniform(0.01, 0.1, sshape).astype(np.float32),
                       rng.integers(-128, 128, sshape).astype(np.float32) if zp else None)
            x = QArray(_int8(rng, (m, k)), rng.uniform(0.01, 0.1, (m, 1)).astype(np.float32),
                       rng.integers(-128, 128, (m, 1)).astype(np.float32) if zp else None)
            sizes = rng.multinomial(m, np.full(g, 1 / g))
            packed = raggeddot.prepack(w, lhs_dtype=np.int8)
            assert packed.ctype == ("int8-mmla" if _i8(family) == "int8-mmla" else "int8-dot")
            assert packed.kernel == family
            unpacked = packed.unpack()
            assert np.array_equal(unpacked.qvalue, w.qvalue) and np.array_equal(unpacked.scale, w.scale)
            got = raggeddot.ragged_dot(x, packed, sizes, preferred_element_type=np.float32)
            want = raggeddot.ragged_dot(x, w, sizes, preferred_element_type=np.float32)
            assert np.array_equal(_bits(got), _bits(want)), (m, k, n, g, bk, zp)
        # a float lhs: the float layout, made once and kept (prepack's rule)
        fx = raggeddot.dequantize(x)
        assert np.array_equal(_bits(raggeddot.ragged_dot(fx, packed, sizes)),
                              _bits(raggeddot.ragged_dot(fx, w, sizes)))
        assert raggeddot.prepack(w).ctype == "float32-int8w"          # a float lhs by default
        fractional = QArray(w.qvalue, w.scale, np.full(w.scale.shape, 0.5, np.float32))
        assert raggeddot.prepack(fractional, lhs_dtype=np.int8).ctype == "float32-int8w"


@pytest.mark.parametrize("family", INT8_FAMILIES)
def test_moe_block_w8a8_with_prepacked_int8_weights(rng, family):
    """moe_block with activation_qtype="int8" on weights prepacked for int8
    activations: the same output and gradients as with the QArray weights."""
    T, d, f, E = 40, 48, 40, 6
    x = rng.standard_normal((T, d)).astype(np.float32)
    router = rng.standard_normal((d, E)).astype(np.float32)
    ws = [raggeddot.quantize(rng.standard_normal(s).astype(np.float32), "int8", channelwise_axes=(0, 2))
          for s in ((E, d, f), (E, d, f), (E, f, d))]
    ct = rng.standard_normal((T, d)).astype(np.float32)
    with runtime.configured(kernel=family):
        packed = [raggeddot.prepack(w, lhs_dtype=np.int8) for w in ws]
        out, vjp_fn = raggeddot.moe_block_vjp(x, router, *packed, top_k=2, activation_qtype="int8")
        want, want_fn = raggeddot.moe_block_vjp(x, router, *ws, top_k=2, activation_qtype="int8")
        assert np.array_equal(_bits(out), _bits(want))
        got_g, want_g = vjp_fn(ct), want_fn(ct)
        for name in want_g:
            if want_g[name] is not None:
                assert np.array_equal(np.asarray(got_g[name]), np.asarray(want_g[name])), name
        # float activations: the QArray weights' result (prepack's rule)
        assert np.array_equal(_bits(raggeddot.moe_block(x, router, *packed, top_k=2)),
                              _bits(raggeddot.moe_block(x, router, *ws, top_k=2)))


# ---------------------------------------------------------------------------
# int8 activations quantized by the kernels while they pack them
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", INT8_FAMILIES)
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["float32", "bfloat16"])
def test_rows_quantized_while_packed_equal_quantize_first(rng, family, dtype):
    """AsQArray(x, "int8", channelwise_axes=(0,)) times int8 weights (plain
    QArray or prepacked for int8 activations): the kernels quantize each row
    while packing it, with the bits of quantize() first (rows of zeros, the
    -absmax value that rounds to -128, rows spanning 1e-3..1e3)."""
    m, k, n, g = 60, 77, 40, 3
    x = (rng.standard_normal((m, k)) * np.logspace(-3, 3, m)[:, None]).astype(dtype)
    x[5] = 0
    x[7, 3] = -np.abs(x[7]).max() * 1.5
    w = QArray(_int8(rng, (g, k, n)), rng.uniform(0.01, 0.1, (g, 1, n)).astype(np.float32))
    sizes = np.array([20, 0, 38])
    want = raggeddot.ragged_dot(raggeddot.quantize(x, "int8", channelwise_axes=(0,)), w, sizes)
    with runtime.configured(kernel=family):
        for rhs in (w, raggeddot.prepack(w, lhs_dtype=np.int8)):
            got = raggeddot.ragged_dot(raggeddot.AsQArray(x, "int8", channelwise_axes=(0,)), rhs, sizes)
            assert got.dtype == want.dtype and np.array_equal(_bits(got), _bits(want))
            # gmm takes the same path (its weights [g, k, n], or [g, n, k] with transpose_rhs)
            got = raggeddot.gmm(raggeddot.AsQArray(x, "int8", channelwise_axes=(0,)), rhs, sizes)
            assert np.array_equal(_bits(got), _bits(want))
        wt = QArray(np.ascontiguousarray(w.qvalue.transpose(0, 2, 1)), w.scale.transpose(0, 2, 1))
        got = raggeddot.gmm(raggeddot.AsQArray(x, "int8", channelwise_axes=(0,)), wt, sizes, transpose_rhs=True)
        assert np.array_equal(_bits(got), _bits(want))


def test_moe_block_quantizes_activations_in_the_kernels(rng, monkeypatch):
    """moe_block(activation_qtype="int8") with int8 weights, where the int8
    dot products serve: the forward makes no quantize() pass (the kernels
    quantize the rows and the gated activations while packing), and its
    output and gradients equal those of the layer that quantizes first (a
    float family named: no int8 dot products), bit for bit."""
    from raggeddot._moe import rows
    T, d, f, E = 50, 40, 36, 5
    x = rng.standard_normal((T, d)).astype(np.float32)
    router = rng.standard_normal((d, E)).astype(np.float32)
    ws = [raggeddot.quantize(rng.standard_normal(s).astype(np.float32), "int8", channelwise_axes=(0, 2))
          for s in ((E, d, f), (E, d, f), (E, f, d))]
    ct = rng.standard_normal((T, d)).astype(np.float32)
    with runtime.configured(kernel=FLOAT_FAMILY):
        # the vpmaddwd kernels with the int8-dot kernels' blocking: the same sums
        runtime.set_blocking("int8-int32", 144, 2048, 4080)
        want, want_fn = raggeddot.moe_block_vjp(x, router, *ws, top_k=2, activation_qtype="int8")
        want_g = want_fn(ct)
    calls = []
    real = rows.quantize
    monkeypatch.setattr(rows, "quantize", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for family in INT8_FAMILIES:
        calls.clear()
        with runtime.configured(kernel=family):
            runtime.set_blocking(_i8(family), 144, 2048, 4080)
            out = raggeddot.moe_block(x, router, *ws, top_k=2, activation_qtype="int8")
            assert calls == [] and np.array_equal(_bits(out), _bits(want))
            out, vjp_fn = raggeddot.moe_block_vjp(x, router, *ws, top_k=2, activation_qtype="int8")
            got_g = vjp_fn(ct)
        assert np.array_equal(_bits(out), _bits(want))
        for name in want_g:
            if want_g[name] is not None:
                assert np.array_equal(np.asarray(got_g[name]), np.asarray(want_g[name])), name

"""The C kernel library through its binding: the table of kernel families,
packing of every storage dtype, and the grouped GEMM entry points' checks.

These tests call ``raggeddot._core`` on purpose: they test the binding itself.
"""
import numpy as np
import pytest

import raggeddot
from raggeddot import _core, reference, runtime

from helpers import KERNELS

ml_dtypes = pytest.importorskip("ml_dtypes")

STORAGE = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
BOUNDS = np.array([0, 10, 10, 45], dtype=np.int64)
SIZES = np.diff(BOUNDS)


def _rows(lhs, rhs, out_dtype, bounds=BOUNDS):
    out = np.full((lhs.shape[0], rhs.shape[2]), 7.0, dtype=out_dtype)
    _core.ragged_rows(lhs, rhs, bounds, out, False)
    return out


def test_kernel_table_rows_are_selectable_or_refused():
    table = _core.kernel_table()
    names = [row["name"] for row in table]
    assert names[-1] == "ref" and len(set(names)) == len(names)
    assert runtime.compiled_kernels() == names
    assert runtime.runnable_kernels() == [r["name"] for r in table if r["runnable"]]
    for row in table:
        # a float family serves every float type; a dot-product family only its own
        # (the tile families: bfloat16 and int8 tiles; Arm's MMLA families one MMLA type;
        # the AVX-512 VNNI families also the w4a8 types, 4-bit weights times int8 rows)
        assert set(row["types"]) <= set(_core.PACKING_READS)
        assert {"float32", "float64"} <= set(row["types"]) or set(row["types"]) in (
            {"bfloat16-dot"}, {"int8-dot"}, {"bfloat16-tile", "int8-tile"}, {"bfloat16-mmla"}, {"int8-mmla"},
            {"int8-dot", "int8-int4-dot", "int8-mxfp4-dot"})
        with runtime.configured():
            if row["runnable"]:
                runtime.set_kernel(row["name"])
                assert runtime.get_kernel() == row["name"]
                info = runtime.build_info()
                for t in row["types"]:
                    assert info["blocking"][t]["kernel"] == row["name"]
            else:
                with pytest.raises(RuntimeError, match="cannot run"):
                    runtime.set_kernel(row["name"])
    with pytest.raises(ValueError, match="unknown kernel"):
        runtime.set_kernel("no-such-kernel")


def test_auto_picks_the_first_runnable_row():
    with runtime.configured(kernel="ref"):
        runtime.set_kernel("auto")
        assert runtime.get_kernel() == KERNELS[0]


# every (lhs, rhs, out) storage combination a product reads; a float32
# product does not read float64 operands (tested below)
COMBOS = [(a, b, o) for o in (np.float32, np.float64) for a in STORAGE for b in STORAGE
          if o == np.float64 or np.float64 not in (a, b)]


@pytest.mark.parametrize("lhs_dtype, rhs_dtype, out_dtype", COMBOS,
                         ids=lambda d: np.dtype(d).name)
def test_packing_widens_every_storage_dtype_exactly(rng, lhs_dtype, rhs_dtype, out_dtype):
    """A product read from half/single storage equals the product of the
    operands converted first, bitwise: packing converts exactly."""
    lhs = rng.standard_normal((45, 37)).astype(lhs_dtype)
    rhs = rng.standard_normal((3, 37, 29)).astype(rhs_dtype)
    for kernel in KERNELS:   # the float families: widened exactly, float32 arithmetic
        with runtime.configured(kernel=kernel):
            got = _rows(lhs, rhs, out_dtype)
            want = _rows(lhs.astype(out_dtype), rhs.astype(out_dtype), out_dtype)
        assert np.array_equal(got[:45], want[:45]), kernel
        ref = reference.ragged_dot(lhs.astype(np.float64), rhs.astype(np.float64), SIZES)
        tol = 1e-12 if np.dtype(out_dtype) == np.float64 else 1e-5
        assert np.max(np.abs(got - ref)) <= tol * max(1.0, np.max(np.abs(ref)))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_every_half_bit_pattern_is_widened_exactly(dtype):
    values = np.arange(1 << 16, dtype=np.uint16).view(dtype).reshape(-1, 1)
    ones = np.ones((1, 1, 1), dtype=np.float32)
    out = np.empty((values.shape[0], 1), dtype=np.float32)
    _core.ragged_rows(values, ones, np.array([0, values.shape[0]]), out, False)
    want = values.astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(out[~nan], want[~nan])
    assert np.isnan(out[nan]).all()


def test_float32_product_refuses_float64_operands(rng):
    lhs = rng.standard_normal((45, 37))
    rhs = rng.standard_normal((3, 37, 29)).astype(np.float32)
    with pytest.raises(TypeError, match="float32 product cannot read 'lhs'"):
        _rows(lhs, rhs, np.float32)


@pytest.mark.parametrize("bad, match", [
    (lambda a, b, o: (a.astype(np.int32), b, o), "'lhs' has dtype"),
    (lambda a, b, o: (a, b.astype(np.complex64), o), "'rhs' has dtype"),
    (lambda a, b, o: (a, b, o.astype(np.int8)), "'out' has dtype"),
    (lambda a, b, o: (a.byteswap().view(a.dtype.newbyteorder()), b, o), "native byte order"),
    (lambda a, b, o: (a, b, o[None]), "'out' must be 2-D"),
])
def test_binding_refuses_bad_operands(rng, bad, match):
    lhs = rng.standard_normal((45, 37)).astype(np.float32)
    rhs = rng.standard_normal((3, 37, 29)).astype(np.float32)
    out = np.zeros((45, 29), np.float32)
    a, b, o = bad(lhs, rhs, out)
    with pytest.raises((TypeError, ValueError), match=match):
        _core.ragged_rows(a, b, BOUNDS, o, False)


def test_binding_refuses_read_only_out_and_bad_bounds(rng):
    lhs = rng.standard_normal((45, 37)).astype(np.float32)
    rhs = rng.standard_normal((3, 37, 29)).astype(np.float32)
    out = np.zeros((45, 29), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="'out' must be writeable"):
        _core.ragged_rows(lhs, rhs, BOUNDS, out, False)
    out = np.zeros((45, 29), np.float32)
    for bounds, match in ((np.array([0, 10, 5, 45]), "non-decreasing"),
                          (np.array([0, 10, 45]), "must have rhs.shape\\[0\\] \\+ 1"),
                          (np.array([0, 10, 10, 46]), "within \\[0, 45\\]")):
        with pytest.raises(ValueError, match=match):
            _core.ragged_rows(lhs, rhs, bounds, out, False)


def test_moe_pieces_take_float_arrays_only(rng):
    x = rng.standard_normal((4, 3)).astype(np.int8)
    with pytest.raises(TypeError, match="'x' has dtype .* expected float32, float64, float16 or bfloat16"):
        _core.gather_rows(x, np.array([0, 1]), None)
    with pytest.raises(TypeError, match="'y' has dtype .* expected float32, float64, float16 or bfloat16"):
        _core.gather_reduce(x, np.array([[0, 1]]), None)
    with pytest.raises(TypeError, match="'gate' has dtype .* expected float32, float64, float16 or bfloat16"):
        _core.gated_act(x, x, 0, 7.0)


def test_enums_are_exported():
    assert set(_core.ACTIVATIONS) == {"silu", "gelu", "gelu_tanh", "relu", "swiglu_oai"}
    assert sorted(_core.ACTIVATIONS.values()) == list(range(5))
    assert _core.SCORE_FUNCS == {"softmax": 0, "sigmoid": 1}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blocking_changes_the_reduction_order_only(rng, dtype):
    """Another KC changes how the contraction is split into blocks, so the
    result may round differently, but stays within tolerance; MC/NC round up
    to the register block; set_kernel restores the defaults."""
    lhs = rng.standard_normal((45, 600)).astype(dtype)
    rhs = rng.standard_normal((3, 600, 29)).astype(dtype)
    base = _rows(lhs, rhs, dtype)
    with runtime.configured():
        kernel = runtime.get_kernel()
        defaults = runtime.build_info()["blocking"][dtype]
        runtime.set_blocking(dtype, 7, 100, 3)
        b = runtime.build_info()["blocking"][dtype]
        assert b["KC"] == 100 and b["MC"] % b["MR"] == 0 and b["NC"] % b["NR"] == 0
        assert b["MC"] >= 7 and b["NC"] >= 3
        tuned = _rows(lhs, rhs, dtype)
        runtime.set_kernel(kernel)
        assert runtime.build_info()["blocking"][dtype] == defaults
    tol = 1e-12 if dtype == "float64" else 1e-4
    assert np.max(np.abs(tuned - base)) <= tol * np.max(np.abs(base))
    with pytest.raises(ValueError, match="set_blocking"):
        _core.set_blocking("bfloat16", 1, 1, 1)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("k", [1, 2, 7, 8, 9, 17, 64, 301])
def test_transposed_operands_pack_to_the_same_panels(rng, dtype, k):
    """Packing a transposed operand (rows contiguous along the contraction:
    gmm's transpose_rhs weights, a row-major lhs) transposes blocks of eight
    rows in registers; the results equal those of the same values laid out
    the other way, bit for bit, on every family that serves the product."""
    sizes = np.array([13, 0, 40, 27])
    lhs = rng.standard_normal((80, k)).astype(dtype)
    w_t = rng.standard_normal((4, 70, k)).astype(dtype)            # [g, n, k]
    w = np.ascontiguousarray(w_t.transpose(0, 2, 1))               # [g, k, n]
    lhs_t = np.ascontiguousarray(lhs.T).T                          # column-major lhs
    families = KERNELS + [f for f in runtime.runnable_kernels() if f not in KERNELS]
    for family in families:
        with runtime.configured(kernel=family):
            want = raggeddot.gmm(lhs_t, w, sizes, preferred_element_type=np.float32)
            got = raggeddot.gmm(lhs, w_t, sizes, preferred_element_type=np.float32, transpose_rhs=True)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), family

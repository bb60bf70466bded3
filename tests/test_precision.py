"""``precision=``: every value jax.lax takes means here what it means in jax,
or is refused, before anything runs, with a message naming the function,
``precision`` and the operand (raggeddot._precision has the rule).

- Exact float32 products of 16-bit operands, bit for bit the float32
  product of the widened operands on every bfloat16 kernel family: HIGHEST
  in each spelling jax takes ("highest", "float32", either entry of a pair),
  F32_F32_F32 and ``DotAlgorithm(float32, float32, float32)``, the
  emulations of float32 (_X3/_X6/_X9), and the algorithms whose operand
  types hold the operands (F16_F16_F32 on float16, TF32_TF32_F32 on 16-bit
  operands); in ragged_dot, ragged_dot_general, gmm, tgmm, their gradients,
  prepacked bfloat16 weights, and raggeddot.jax (eager and jitted, and
  ``precision=None`` under ``jax.default_matmul_precision``).
- BF16_BF16_F32 (and BF16_BF16_BF16, a DotAlgorithm of bfloat16 operands):
  float32 operands rounded to bfloat16, in numpy and in raggeddot.jax.
- Refused: roundings the kernels do not do (F16_F16_F32 / TF32 on float32,
  any algorithm rounding float64 operands), the float8 presets, float64
  accumulation in a float32 call, values jax does not take; a refused call
  writes nothing into ``out=`` and makes no layout of a PackedRhs.
- jax.lax's result type of mixed operands: float16 with bfloat16 gives
  bfloat16.
"""
import functools

import jax
import ml_dtypes
import numpy as np
import pytest

import raggeddot
from raggeddot import RaggedDotDimensionNumbers as DN
from raggeddot import reference, runtime

from helpers import check_close

rj = pytest.importorskip("raggeddot.jax")
jnp = jax.numpy
P, PRESET, ALGO = jax.lax.Precision, jax.lax.DotAlgorithmPreset, jax.lax.DotAlgorithm
BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
DN_RAGGED = DN((([1], [1]), ([], [])), [0], [0])


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


def _bf16_families():
    """The kernel families that may serve bfloat16 x bfloat16 here: "auto",
    the AMX twin (any CPU), and the vdpbf16ps kernels and their twin where
    this CPU runs them; every one sums differently from the float32 kernels
    (pair order, flushing), which the operands below show."""
    runnable = runtime.runnable_kernels()
    return ["auto", "amx-twin"] + [f for f in ("amx", "avx512-bf16", "avx512-bf16-twin") if f in runnable]


# precision values that ask for exact products, and the operand dtypes they
# hold exactly (those they take here)
EXACT = [
    ("highest", (BF16, F16)),
    ("float32", (BF16, F16)),                                  # jax's string for HIGHEST
    (P.HIGHEST, (BF16, F16)),
    ((P.DEFAULT, P.HIGHEST), (BF16, F16)),
    (("highest", "default"), (BF16, F16)),
    (PRESET.F32_F32_F32, (BF16, F16)),
    ("F32_F32_F32", (BF16, F16)),
    (ALGO(np.float32, np.float32, np.float32), (BF16, F16)),
    (ALGO(np.float32, np.float32, None), (BF16, F16)),
    (PRESET.BF16_BF16_F32_X3, (BF16, F16)),
    (PRESET.BF16_BF16_F32_X6, (BF16, F16)),
    (PRESET.BF16_BF16_F32_X9, (BF16, F16)),
    (ALGO(jnp.bfloat16, jnp.bfloat16, np.float32, 1, 1, 6), (BF16, F16)),
    (PRESET.TF32_TF32_F32_X3, (BF16, F16)),
    (PRESET.TF32_TF32_F32, (BF16, F16)),                      # TF32 holds every 16-bit value
    (PRESET.F16_F16_F32, (F16,)),
    (PRESET.F16_F16_F16, (F16,)),                              # summed in float32, as jax's CPU does
]


def _operands(rng, dtype, m=70, k=600, n=40):
    """lhs [m, k], rhs [3, k, n], group sizes. k past the bfloat16 cache
    block (KC 256 for the AMX kernels, whose twin adds across it where the
    float32 kernels add block sums) and a denormal make every bfloat16
    family sum otherwise than the float32 kernels."""
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs = rng.standard_normal((3, k, n)).astype(dtype)
    if dtype == BF16:
        lhs[0, :5] = 1e-39          # denormal in float32 (bfloat16 keeps it): the dot kernels flush it
    return lhs, rhs, np.array([m // 3, 0, m - m // 3 - 5])


@pytest.mark.parametrize("precision,dtypes", EXACT, ids=[repr(p) for p, _ in EXACT])
def test_exact_spellings_give_the_widened_float32_product(rng, precision, dtypes):
    """On every bfloat16 family, in every op: bit for bit the float32 product
    of the operands widened first; DEFAULT takes the fast kernels, which
    differ from it (so the check can tell them apart)."""
    fast_differs = False
    for dtype in dtypes:
        lhs, rhs, sizes = _operands(rng, dtype)
        l32, r32 = lhs.astype(np.float32), rhs.astype(np.float32)
        dy = rng.standard_normal((lhs.shape[0], rhs.shape[2])).astype(dtype)
        want = raggeddot.ragged_dot(l32, r32, sizes)
        want_t = raggeddot.tgmm(l32.T, dy.astype(np.float32), sizes)
        for family in _bf16_families() if dtype == BF16 else ["auto"]:
            with runtime.configured(kernel=family):
                kw = dict(precision=precision, preferred_element_type=np.float32)
                got = {"ragged_dot": raggeddot.ragged_dot(lhs, rhs, sizes, **kw),
                       "ragged_dot_general": raggeddot.ragged_dot_general(lhs, rhs, sizes, DN_RAGGED, **kw),
                       "gmm": raggeddot.gmm(lhs, rhs, sizes, **kw),
                       "gmm transposed": raggeddot.gmm(lhs, np.ascontiguousarray(rhs.transpose(0, 2, 1)), sizes,
                                                       transpose_rhs=True, **kw)}
                if dtype == BF16:
                    packed = raggeddot.prepack(rhs)      # k-pairs where the dot kernels serve
                    got["prepacked"] = raggeddot.ragged_dot(lhs, packed, sizes, **kw)
                    got["prepacked gmm"] = raggeddot.gmm(lhs, packed, sizes, **kw)
                for op, value in got.items():
                    assert value.dtype == np.float32
                    assert np.array_equal(_bits(value), _bits(want)), (op, family)
                t = raggeddot.tgmm(lhs.T, dy, sizes, **kw)
                assert np.array_equal(_bits(t), _bits(want_t)), ("tgmm", family)
                fast = raggeddot.ragged_dot(lhs, rhs, sizes, preferred_element_type=np.float32)
                fast_differs |= not np.array_equal(fast, want)
                check_close(fast, want, rtol=1e-2)
    if BF16 in dtypes:
        assert fast_differs, "no bfloat16 family here sums otherwise than the float32 kernels"


@pytest.mark.parametrize("precision", ["float32", ALGO(np.float32, np.float32, np.float32)], ids=repr)
def test_gradients_keep_the_precision(rng, precision):
    """The gradients of ragged_dot and gmm are products at the same precision."""
    lhs, rhs, sizes = _operands(rng, BF16)
    dy = rng.standard_normal((lhs.shape[0], rhs.shape[2])).astype(np.float32)
    l32, r32 = lhs.astype(np.float32), rhs.astype(np.float32)
    want = raggeddot.vjp(raggeddot.ragged_dot, l32, r32, sizes)[1](dy)
    with runtime.configured(kernel="avx512-bf16-twin" if "avx512-bf16-twin" in runtime.runnable_kernels()
                            else "amx-twin"):
        for op in (raggeddot.ragged_dot, raggeddot.gmm):
            f = functools.partial(op, precision=precision, preferred_element_type=np.float32)
            got = raggeddot.vjp(f, lhs, rhs, sizes)[1](dy)
            for g, w in zip(got[:2], want[:2]):
                assert np.array_equal(_bits(g), _bits(w.astype(BF16))), op


def test_bf16_presets_round_float32_operands(rng):
    """BF16_BF16_F32, BF16_BF16_BF16 (float32 sums: at least the precision
    asked) and a DotAlgorithm of bfloat16 operands: the product of the
    operands rounded to bfloat16, in ragged_dot, gmm and tgmm."""
    lhs = rng.standard_normal((45, 37)).astype(np.float32)
    rhs = rng.standard_normal((3, 37, 29)).astype(np.float32)
    sizes = np.array([20, 0, 25])
    want = raggeddot.ragged_dot(lhs.astype(BF16), rhs.astype(BF16), sizes, preferred_element_type=np.float32)
    for p in (PRESET.BF16_BF16_F32, "BF16_BF16_BF16", ALGO(jnp.bfloat16, jnp.bfloat16, np.float32)):
        assert np.array_equal(_bits(raggeddot.ragged_dot(lhs, rhs, sizes, precision=p)), _bits(want)), p
        assert np.array_equal(_bits(raggeddot.gmm(lhs, rhs, sizes, precision=p)), _bits(want)), p
    assert not np.array_equal(raggeddot.ragged_dot(lhs, rhs, sizes), want)


# ---------------------------------------------------------------------------
# refused, and a refused call changes nothing
# ---------------------------------------------------------------------------

REFUSED = [   # (precision, operand dtype, exception, message)
    (PRESET.F16_F16_F32, F32, TypeError, r"F16_F16_F32 rounds 'lhs' \(float32\) to float16"),
    (PRESET.F16_F16_F32, BF16, TypeError, r"F16_F16_F32 rounds 'lhs' \(bfloat16\) to float16"),
    (PRESET.TF32_TF32_F32, F32, TypeError, r"TF32_TF32_F32 rounds 'lhs' \(float32\) to tf32"),
    (PRESET.BF16_BF16_F32, F16, TypeError, r"BF16_BF16_F32 rounds 'lhs' \(float16\) to bfloat16"),
    (PRESET.F32_F32_F32, np.dtype(np.float64), TypeError, r"F32_F32_F32 rounds 'lhs' \(float64\) to float32"),
    (PRESET.ANY_F8_ANY_F8_F32, F32, TypeError, r"ANY_F8_ANY_F8_F32 multiplies float8 operands"),
    (PRESET.ANY_F8_ANY_F8_ANY_FAST_ACCUM, BF16, TypeError, r"ANY_F8_ANY_F8_ANY_FAST_ACCUM multiplies float8"),
    (ALGO(jnp.float8_e4m3fn, jnp.float8_e4m3fn, np.float32), F32, TypeError, "multiplies float8 operands"),
    (PRESET.F64_F64_F64, F32, ValueError, "F64_F64_F64 asks for float64 accumulation"),
    (ALGO(np.int8, np.int8, np.int32), F32, ValueError, r"accumulation_type=int32\) accumulates in int32"),
    (ALGO(np.float32, np.float32, np.float32, 2, 1, 1), F32, ValueError, "component counts"),
    ("HIGHEST", F32, ValueError, "'precision' must be"),                 # jax takes the lower-case strings only
    ("f32_f32_f32", F32, ValueError, "'precision' must be"),             # and the presets' exact names
    ((P.HIGHEST, "highest"), F32, ValueError, "'precision' must be"),    # a pair of one kind
    ((PRESET.F32_F32_F32,) * 2, F32, ValueError, "'precision' must be"),
    ((P.HIGH,), F32, ValueError, "'precision' must be"),
    (3, F32, ValueError, "'precision' must be"),
]


@pytest.mark.parametrize("precision,dtype,exc,match", REFUSED, ids=[repr(r[0]) + "-" + r[1].name for r in REFUSED])
@pytest.mark.parametrize("op", ["ragged_dot", "ragged_dot_general", "gmm", "tgmm"])
def test_refused_before_anything_runs(rng, precision, dtype, exc, match, op):
    """Each message names the function and the precision; ``out=`` is left
    as it was."""
    lhs = rng.standard_normal((9, 4)).astype(dtype)
    rhs = rng.standard_normal((2, 4, 3)).astype(dtype)
    gs = np.array([5, 3])
    wide = np.float64 if dtype == np.float64 else np.float32       # megablox's result type
    if op == "tgmm":
        dy = rng.standard_normal((9, 3)).astype(dtype)
        call = lambda **kw: raggeddot.tgmm(lhs.T, dy, gs, **kw)  # noqa: E731
        shape, out_dtype = (2, 4, 3), wide
    elif op == "ragged_dot_general":
        call = lambda **kw: raggeddot.ragged_dot_general(lhs, rhs, gs, DN_RAGGED, **kw)  # noqa: E731
        shape = None
    else:
        call = lambda **kw: getattr(raggeddot, op)(lhs, rhs, gs, **kw)  # noqa: E731
        shape, out_dtype = (9, 3), dtype if op == "ragged_dot" else wide
    with pytest.raises(exc, match=f"^{op}: .*{match}"):
        call(precision=precision)
    if shape is not None:
        out = np.full(shape, 7, out_dtype)
        with pytest.raises(exc, match=f"^{op}: .*{match}"):
            call(precision=precision, out=out)
        assert (out == 7).all()


def test_refused_on_prepacked_weights_touches_nothing(rng):
    """BF16_BF16_F32 with prepacked weights and a float32 lhs (a rounding of
    lhs the prepacked call does not do), or with prepacked float32 weights:
    refused before the call makes a layout or writes ``out``, the message
    naming the function (ragged_dot_general's own name too) and what to do."""
    lhs32 = rng.standard_normal((30, 64)).astype(np.float32)
    w = rng.standard_normal((2, 64, 48)).astype(BF16)
    gs = np.array([10, 10])
    packed = raggeddot.prepack(w)
    layouts = dict(packed.layouts)
    out = np.full((30, 48), 7, np.float32)
    for op, call in [("ragged_dot", lambda **kw: raggeddot.ragged_dot(lhs32, packed, gs, **kw)),
                     ("gmm", lambda **kw: raggeddot.gmm(lhs32, packed, gs, **kw)),
                     ("ragged_dot_general", lambda **kw: raggeddot.ragged_dot_general(lhs32, packed, gs, DN_RAGGED,
                                                                                      **kw))]:
        with pytest.raises(TypeError, match=rf"^{op}: precision=DotAlgorithmPreset.BF16_BF16_F32 rounds 'lhs' "
                                            r"\(float32\) to bfloat16, which a product with prepacked 'rhs' does "
                                            r"not do: pass a bfloat16 'lhs'"):
            call(precision=PRESET.BF16_BF16_F32, **({} if op == "ragged_dot_general" else {"out": out}))
        assert (out == 7).all() and packed.layouts == layouts, op
    packed32 = raggeddot.prepack(w.astype(np.float32))
    with pytest.raises(TypeError, match=r"^ragged_dot: .*'rhs' is prepacked float32 weights.*prepack bfloat16"):
        raggeddot.ragged_dot(lhs32, packed32, gs, precision="BF16_BF16_F32", out=out)
    assert (out == 7).all() and list(packed32.layouts) == [packed32.ctype]
    # a bfloat16 lhs needs no rounding: the prepacked call runs, as the plain weights' would
    lhs = lhs32.astype(BF16)
    np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, packed, gs, precision=PRESET.BF16_BF16_F32),
                                  raggeddot.ragged_dot(lhs, w, gs, precision=PRESET.BF16_BF16_F32))


def test_a_refused_out_makes_no_layout(rng):
    """``out=`` of the wrong shape with prepacked weights that meet an lhs
    they were not laid out for: refused before that layout is made."""
    w = rng.standard_normal((2, 16, 8)).astype(BF16)
    packed = raggeddot.prepack(w, lhs_dtype=np.float32)
    layouts = dict(packed.layouts)
    lhs = rng.standard_normal((6, 16)).astype(BF16)
    with runtime.configured(kernel="amx-twin"):       # a bfloat16 lhs meets the k-pair layout
        for op in (raggeddot.ragged_dot, raggeddot.gmm):
            with pytest.raises(ValueError, match="'out' must have shape"):
                op(lhs, packed, np.array([3, 3]), out=np.zeros((5, 8), BF16))
            assert packed.layouts == layouts


# ---------------------------------------------------------------------------
# raggeddot.jax
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_jax_takes_the_presets_and_means_them(rng, jit):
    """raggeddot.jax with every preset that names an accumulation type
    (this used to fail on a dtype comparison), as the NumPy API computes
    it; F32_F32_F32, DotAlgorithm(float32, float32, float32) and "float32"
    exact on bfloat16 operands, BF16_BF16_F32 rounding float32 ones; the
    values jax.lax.ragged_dot gives on the CPU within float32 rounding."""
    x = rng.standard_normal((40, 96)).astype(np.float32)
    w = rng.standard_normal((3, 96, 24)).astype(np.float32)
    x[0, :4] = 1e-39
    gs = np.array([10, 0, 25], np.int32)
    cases = [(PRESET.F32_F32_F32, BF16), ("F32_F32_F32", BF16), (ALGO(np.float32, np.float32, np.float32), BF16),
             ("float32", BF16), (PRESET.BF16_BF16_F32_X6, BF16), (PRESET.BF16_BF16_F32, F32),
             (PRESET.BF16_BF16_F32, BF16), (PRESET.F16_F16_F16, F16), (PRESET.TF32_TF32_F32, BF16)]
    for p, dtype in cases:
        xa, wa = x.astype(dtype), w.astype(dtype)
        f = lambda a, b, p=p: rj.ragged_dot(a, b, gs, precision=p, preferred_element_type=jnp.float32)  # noqa: E731
        got = np.asarray((jax.jit(f) if jit else f)(jnp.asarray(xa), jnp.asarray(wa)))
        want = raggeddot.ragged_dot(xa, wa, gs, precision=p, preferred_element_type=np.float32)
        assert np.array_equal(_bits(got), _bits(want)), (p, dtype)
        general = rj.ragged_dot_general(jnp.asarray(xa), jnp.asarray(wa), gs, DN_RAGGED, precision=p,
                                        preferred_element_type=jnp.float32)
        assert np.array_equal(_bits(general), _bits(want)), (p, dtype)
        # jax.lax on the CPU: TF32 and DotAlgorithms refused, BF16_BF16_F32 on float32 storage not
        # rounded (the backend ignores it), F16_F16_F16's float32 result rounded to float16 (here:
        # float32 sums, rounded once to the result type), so only the others compare
        if p not in (PRESET.TF32_TF32_F32, PRESET.F16_F16_F16) and not isinstance(p, ALGO) \
                and not (p == PRESET.BF16_BF16_F32 and dtype == F32):
            lax = np.asarray(jax.lax.ragged_dot(xa, wa, gs, precision=p, preferred_element_type=jnp.float32))
            check_close(got, lax, rtol=2e-6 if p != PRESET.BF16_BF16_F32 else 1e-5)
    exact = raggeddot.ragged_dot(x.astype(BF16).astype(np.float32), w.astype(BF16).astype(np.float32), gs)
    got = rj.ragged_dot(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16), gs,
                        precision=PRESET.F32_F32_F32, preferred_element_type=jnp.float32)
    assert np.array_equal(_bits(got), _bits(exact))


def test_jax_refuses_what_the_numpy_api_refuses(rng):
    x, w = jnp.ones((4, 3), jnp.float32), jnp.ones((1, 3, 2), jnp.float32)
    with pytest.raises(TypeError, match=r"^ragged_dot: precision=DotAlgorithmPreset.F16_F16_F32 rounds 'lhs'"):
        rj.ragged_dot(x, w, np.array([4]), precision=PRESET.F16_F16_F32)
    with pytest.raises(ValueError, match="^ragged_dot_general: 'precision' must be"):
        rj.ragged_dot_general(x, w, np.array([4]), DN_RAGGED, precision="HIGHEST")


def test_jax_none_reads_the_default_matmul_precision(rng):
    """precision=None means jax's ``jax_default_matmul_precision``, as in
    jax.lax: exact products under "highest" (or "float32"), the fast
    kernels under "bfloat16"."""
    x = rng.standard_normal((40, 600)).astype(BF16)
    w = rng.standard_normal((3, 600, 36)).astype(BF16)
    x[0, :4] = 1e-39
    gs = np.array([10, 0, 25])
    exact = raggeddot.ragged_dot(x.astype(np.float32), w.astype(np.float32), gs)
    with runtime.configured(kernel="amx-twin"):
        fast = raggeddot.ragged_dot(x, w, gs, preferred_element_type=np.float32)
        for setting, want in (("highest", exact), ("float32", exact), ("bfloat16", fast)):
            with jax.default_matmul_precision(setting):
                got = np.asarray(jax.jit(lambda a, b: rj.ragged_dot(a, b, gs, preferred_element_type=jnp.float32))(
                    jnp.asarray(x), jnp.asarray(w)))
            assert np.array_equal(_bits(got), _bits(want)), setting
    assert not np.array_equal(fast, exact)


# ---------------------------------------------------------------------------
# the result type of mixed operands
# ---------------------------------------------------------------------------

def test_float16_with_bfloat16_gives_bfloat16_as_jax_lax(rng):
    """jax.lax's dot rule: the type of the larger range wins, so bfloat16
    (not float32, jax.numpy's promotion). The values are the exact products
    summed in float32 and rounded once (jax.lax on the CPU rounds the float16
    operand to bfloat16 first, which a cast of it reproduces)."""
    x = rng.standard_normal((40, 64)).astype(BF16)
    w = rng.standard_normal((3, 64, 36)).astype(F16)
    gs = np.array([10, 0, 25])
    for a, b in ((x, w), (x.astype(F16), w.astype(BF16))):
        want = raggeddot.ragged_dot(a.astype(np.float32), b.astype(np.float32), gs).astype(BF16)
        for got in (raggeddot.ragged_dot(a, b, gs), raggeddot.ragged_dot_general(a, b, gs, DN_RAGGED),
                    np.asarray(rj.ragged_dot(jnp.asarray(a), jnp.asarray(b), gs))):
            assert got.dtype == BF16 and np.array_equal(_bits(got), _bits(want))
        lax = np.asarray(jax.lax.ragged_dot(a, b, gs))
        assert lax.dtype == BF16
        cast = [t.astype(BF16) for t in (a, b)]
        assert np.array_equal(_bits(lax), _bits(raggeddot.ragged_dot(*cast, gs, precision="highest")))
    check_close(raggeddot.ragged_dot(x, w, gs, preferred_element_type=np.float32),
                reference.ragged_dot(x.astype(np.float64), w.astype(np.float64), gs), rtol=1e-5)


# ---------------------------------------------------------------------------
# every preset on every operand dtype
# ---------------------------------------------------------------------------
# What each preset does with two operands of one dtype: "fast" (the plain
# call), "exact" (the float32 product of the widened operands; float64
# operands: the plain float64 call), "bf16" (the product of the operands
# rounded to bfloat16), or the exception it raises. Written out from the
# presets' definitions, independently of the implementation's table.
F64 = np.dtype(np.float64)
_ALL = (F16, BF16, F32, F64)


def _table():
    t = {}
    for name in PRESET.__members__:
        if name == "DEFAULT":
            row = {d: "fast" for d in _ALL}
        elif name.startswith("ANY_F8"):
            row = {d: TypeError for d in _ALL}
        elif name.startswith("F16_F16"):
            row = {F16: "exact", BF16: TypeError, F32: TypeError, F64: TypeError}
        elif name in ("BF16_BF16_BF16", "BF16_BF16_F32"):
            row = {F16: TypeError, BF16: "bf16", F32: "bf16", F64: TypeError}
        elif name == "TF32_TF32_F32":
            row = {F16: "exact", BF16: "exact", F32: TypeError, F64: TypeError}
        elif name == "F64_F64_F64":
            row = {F16: ValueError, BF16: ValueError, F32: ValueError, F64: "exact"}
        else:   # F32_F32_F32 and the emulations of float32 (_X3, _X6, _X9)
            row = {F16: "exact", BF16: "exact", F32: "exact", F64: TypeError}
        t[name] = row
    return t


TABLE = _table()


@pytest.mark.parametrize("name", list(TABLE))
def test_every_preset_on_every_operand_dtype(rng, name):
    for dtype in _ALL:
        lhs, rhs, gs = _operands(rng, dtype, m=40, k=36, n=12)
        expected = TABLE[name][dtype]
        for p in (getattr(PRESET, name), name):      # the member, and its name as jax takes it
            if not isinstance(expected, str):
                with pytest.raises(expected, match=f"^ragged_dot: precision=DotAlgorithmPreset.{name}"):
                    raggeddot.ragged_dot(lhs, rhs, gs, precision=p)
                continue
            got = raggeddot.ragged_dot(lhs, rhs, gs, precision=p, preferred_element_type=np.float32)
            if expected == "fast":
                want = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float32)
            elif expected == "bf16":
                want = raggeddot.ragged_dot(lhs.astype(BF16), rhs.astype(BF16), gs, preferred_element_type=np.float32)
            elif dtype == F64:
                want = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float32)
            else:
                want = raggeddot.ragged_dot(lhs.astype(np.float32), rhs.astype(np.float32), gs)
            assert np.array_equal(_bits(got), _bits(want)), (name, dtype)
    # float32 operands with a float64 result accumulate in float64: F64_F64_F64 holds
    lhs, rhs, gs = _operands(rng, F32, m=40, k=36, n=12)
    if name == "F64_F64_F64":
        got = raggeddot.ragged_dot(lhs, rhs, gs, precision=name, preferred_element_type=np.float64)
        np.testing.assert_array_equal(got, raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float64))


def test_precision_pairs_and_strings_as_jax_takes_them(rng):
    """Pairs of Precision values or of strings, one for each operand: the
    exact products when either is HIGHEST; every string of jax's."""
    lhs, rhs, gs = _operands(rng, BF16)
    exact = raggeddot.ragged_dot(lhs.astype(np.float32), rhs.astype(np.float32), gs)
    with runtime.configured(kernel="amx-twin"):
        fast = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float32)
        for p, want in [((P.HIGHEST, P.DEFAULT), exact), (["default", "highest"], exact), (("float32", "high"), exact),
                        ((P.HIGH, P.DEFAULT), fast), (("bfloat16", "tensorfloat32"), fast), ("fastest", fast),
                        ("bfloat16_3x", fast), ("high", fast), ("default", fast), (None, fast), (P.DEFAULT, fast)]:
            got = raggeddot.ragged_dot(lhs, rhs, gs, precision=p, preferred_element_type=np.float32)
            assert np.array_equal(_bits(got), _bits(want)), p
    assert not np.array_equal(fast, exact)

"""Inputs a new user passes that the ops used to refuse.

- Byte-swapped float inputs (``'>f4'`` on a little-endian machine, or
  ``'<f4'`` on a big-endian one) in every op: ragged_dot, ragged_dot_general
  (three modes), gmm and tgmm (with existing_out), moe_block and its vjp,
  the gathers, and vjp/jvp of the ops. Each is converted once and gives
  exactly the result of the native arrays, in native byte order; the
  inputs are not modified.
- ``precision`` given as jax's ``DotAlgorithmPreset`` or ``DotAlgorithm``
  (real jax objects): accepted when the CPU's accumulation is at least as
  precise as the one asked for, refused with a ValueError naming the
  algorithm otherwise; ``Precision`` values and pairs still accepted; and
  none of it imports jax.
"""
import functools
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest

import raggeddot
from raggeddot import RaggedDotDimensionNumbers as DN


def swapped(a):
    """``a``'s values in the other byte order (same values, swapped memory)."""
    a = np.asarray(a)
    out = a.astype(a.dtype.newbyteorder("S"))
    assert not out.dtype.isnative and np.array_equal(out, a)
    return out


def assert_native_equal(got, want):
    assert got.dtype == want.dtype and got.dtype.isnative, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


FLOATS = [np.float32, np.float64, np.float16]


# ---------------------------------------------------------------------------
# byte-swapped inputs
# ---------------------------------------------------------------------------

def test_the_reported_case():
    """np.ones((4, 3), '>f4') with a native float32 rhs."""
    lhs = np.ones((4, 3), ">f4" if np.little_endian else "<f4")
    rhs = np.ones((2, 3, 5), np.float32)
    got = raggeddot.ragged_dot(lhs, rhs, np.array([1, 2]))
    want = raggeddot.ragged_dot(np.ones((4, 3), np.float32), rhs, np.array([1, 2]))
    assert_native_equal(got, want)
    assert (got[:3] == 3).all() and (got[3] == 0).all()


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("which", ["lhs", "rhs", "both"])
def test_ragged_dot(rng, dtype, which):
    lhs = rng.standard_normal((17, 6)).astype(dtype)
    rhs = rng.standard_normal((3, 6, 5)).astype(dtype)
    gs = np.array([4, 0, 9])
    want = raggeddot.ragged_dot(lhs, rhs, gs)
    a = swapped(lhs) if which in ("lhs", "both") else lhs
    b = swapped(rhs) if which in ("rhs", "both") else rhs
    keep = a.copy(), b.copy()
    assert_native_equal(raggeddot.ragged_dot(a, b, gs), want)
    assert_native_equal(raggeddot.ragged_dot(a, b[1:], gs, group_offset=1),
                        raggeddot.ragged_dot(lhs, rhs[1:], gs, group_offset=1))
    out = np.empty_like(want)
    assert raggeddot.ragged_dot(a, b, gs, out=out) is out
    assert_native_equal(out, want)
    # preferred_element_type given byte-swapped still gives a native result
    assert_native_equal(raggeddot.ragged_dot(a, b, gs, preferred_element_type=np.dtype(">f8")),
                        raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float64))
    for x, k in zip((a, b), keep):
        assert x.dtype == k.dtype and np.array_equal(x, k)      # inputs untouched


def test_ragged_dot_mixed_widths(rng):
    """A byte-swapped float16 with a native float32 promotes to float32."""
    lhs = rng.standard_normal((8, 4)).astype(np.float16)
    rhs = rng.standard_normal((2, 4, 3)).astype(np.float32)
    assert_native_equal(raggeddot.ragged_dot(swapped(lhs), rhs, [3, 5]), raggeddot.ragged_dot(lhs, rhs, [3, 5]))
    assert_native_equal(raggeddot.ragged_dot(lhs, swapped(rhs), [3, 5]), raggeddot.ragged_dot(lhs, rhs, [3, 5]))


@pytest.mark.parametrize("mode", [1, 2, 3])
def test_ragged_dot_general(rng, mode):
    lhs = rng.standard_normal((2, 9, 4)).astype(np.float32)          # [b, m, k]
    if mode == 1:
        rhs = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)   # [g, b, k, n]
        dn = DN((([2], [2]), ([0], [1])), [1], [0])
        gs = np.array([[2, 3, 4], [0, 9, 0]])
    else:
        rhs = rng.standard_normal((2, 4, 5)).astype(np.float32)      # [b, k, n]
        dn = DN((([2], [1]), ([0], [0])), [2 if mode == 2 else 0], [])
        gs = np.array([1, 0, 3]) if mode == 2 else np.array([1, 1])
    want = raggeddot.ragged_dot_general(lhs, rhs, gs, dn)
    for a, b in ((swapped(lhs), rhs), (lhs, swapped(rhs)), (swapped(lhs), swapped(rhs))):
        assert_native_equal(raggeddot.ragged_dot_general(a, b, gs, dn), want)


def test_gmm_and_tgmm(rng):
    lhs = rng.standard_normal((12, 5)).astype(np.float32)
    rhs = rng.standard_normal((3, 5, 4)).astype(np.float32)
    gs = np.array([3, 4, 2])
    existing = rng.standard_normal((12, 4)).astype(np.float32)
    want = raggeddot.gmm(lhs, rhs[1:], gs, group_offset=1, existing_out=existing)
    got = raggeddot.gmm(swapped(lhs), swapped(rhs[1:]), gs, group_offset=1, existing_out=swapped(existing))
    assert_native_equal(got, want)
    got = raggeddot.gmm(swapped(lhs), swapped(rhs[1:]), gs, group_offset=1, existing_out=swapped(existing),
                        preferred_element_type=np.float32)
    assert_native_equal(got, want)
    rt = np.ascontiguousarray(rhs.transpose(0, 2, 1))
    assert_native_equal(raggeddot.gmm(lhs, swapped(rt), gs, transpose_rhs=True),
                        raggeddot.gmm(lhs, rt, gs, transpose_rhs=True))

    ct = rng.standard_normal((12, 4)).astype(np.float32)
    acc = rng.standard_normal((3, 5, 4)).astype(np.float32)
    want = raggeddot.tgmm(lhs.T, ct, gs, existing_out=acc)
    assert_native_equal(raggeddot.tgmm(swapped(lhs).T, swapped(ct), gs, existing_out=swapped(acc)), want)
    assert_native_equal(raggeddot.tgmm(swapped(lhs.T), ct, gs), raggeddot.tgmm(lhs.T, ct, gs))


def test_gathers(rng):
    x = rng.standard_normal((6, 4))
    idx = np.array([5, 0, 0, 3, 2])
    w = rng.standard_normal(5)
    assert_native_equal(raggeddot.ragged_gather(swapped(x), swapped(idx), swapped(w)),
                        raggeddot.ragged_gather(x, idx, w))
    y = rng.standard_normal((5, 4)).astype(np.float32)
    slots = np.array([[0, 4], [-1, 2], [1, 3]])
    wt = rng.standard_normal((3, 2)).astype(np.float32)
    assert_native_equal(raggeddot.ragged_gather_reduce(swapped(y), swapped(slots), swapped(wt)),
                        raggeddot.ragged_gather_reduce(y, slots, wt))


def test_make_group_metadata_with_swapped_sizes():
    gs = np.array([3, 0, 5], np.int32)
    got = raggeddot.make_group_metadata(group_sizes=swapped(gs), m=8, tm=4)
    want = raggeddot.make_group_metadata(group_sizes=gs, m=8, tm=4)
    for a, b in zip(got[0], want[0]):
        np.testing.assert_array_equal(a, b)
    assert got[1] == want[1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_moe_block_and_its_vjp(rng, dtype):
    T, d, f, E = 13, 8, 6, 4
    x = rng.standard_normal((T, d)).astype(dtype)
    rw = rng.standard_normal((d, E)).astype(dtype)
    w0, w1 = (rng.standard_normal((E, d, f)).astype(dtype) / 3 for _ in range(2))
    wo = rng.standard_normal((E, f, d)).astype(dtype) / 3
    kw = dict(top_k=2, router_bias=rng.standard_normal(E).astype(dtype),
              wo_bias=rng.standard_normal((E, d)).astype(dtype),
              shared_experts=(rng.standard_normal((d, 3)).astype(dtype), rng.standard_normal((d, 3)).astype(dtype),
                              rng.standard_normal((3, d)).astype(dtype)))
    skw = dict(kw, router_bias=swapped(kw["router_bias"]), wo_bias=swapped(kw["wo_bias"]),
               shared_experts=tuple(swapped(s) for s in kw["shared_experts"]))
    sargs = [swapped(a) for a in (x, rw, w0, w1, wo)]
    want, aux = raggeddot.moe_block(x, rw, w0, w1, wo, return_aux=True, **kw)
    got, saux = raggeddot.moe_block(*sargs, return_aux=True, **skw)
    assert_native_equal(got, want)
    assert_native_equal(saux["topk_weights"], aux["topk_weights"])

    ct = rng.standard_normal((T, d)).astype(dtype)
    _, vjp_fn = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, **kw)
    out, svjp_fn = raggeddot.moe_block_vjp(*sargs, **skw)
    assert_native_equal(out, want)
    grads, sgrads = vjp_fn(ct), svjp_fn(swapped(ct))
    assert set(grads) == set(sgrads)
    for name in grads:
        if name == "shared_experts":
            for a, b in zip(sgrads[name], grads[name]):
                assert_native_equal(a, b)
        else:
            assert_native_equal(sgrads[name], grads[name])


def test_vjp_and_jvp_of_swapped_primals(rng):
    lhs = rng.standard_normal((10, 4)).astype(np.float32)
    rhs = rng.standard_normal((2, 4, 3)).astype(np.float32)
    gs = np.array([6, 4])
    ct = rng.standard_normal((10, 3)).astype(np.float32)
    out, vjp_fn = raggeddot.vjp(raggeddot.ragged_dot, lhs, rhs, gs)
    s_out, s_vjp_fn = raggeddot.vjp(raggeddot.ragged_dot, swapped(lhs), swapped(rhs), gs)
    assert_native_equal(s_out, out)
    for a, b in zip(s_vjp_fn(swapped(ct))[:2], vjp_fn(ct)[:2]):
        assert_native_equal(a, b)
    out, t = raggeddot.jvp(raggeddot.ragged_dot, (lhs, rhs, gs), (lhs, rhs, None))
    s_out, s_t = raggeddot.jvp(raggeddot.ragged_dot, (swapped(lhs), swapped(rhs), gs),
                               (swapped(lhs), rhs, None))
    assert_native_equal(s_out, out)
    assert_native_equal(s_t, t)
    tg = functools.partial(raggeddot.tgmm, num_actual_groups=2)
    out, vjp_fn = raggeddot.vjp(tg, lhs.T, ct, gs)
    s_out, s_vjp_fn = raggeddot.vjp(tg, swapped(lhs).T, swapped(ct), gs)
    assert_native_equal(s_out, out)
    g = rng.standard_normal(out.shape).astype(np.float32)
    for a, b in zip(s_vjp_fn(g)[:2], vjp_fn(g)[:2]):
        assert_native_equal(a, b)


# ---------------------------------------------------------------------------
# precision: jax's DotAlgorithmPreset and DotAlgorithm
# ---------------------------------------------------------------------------
# The CPU accumulates in float32, or float64 when an input or the output is
# float64. An algorithm is accepted when that is at least as precise as the
# accumulation it asks for (ANY, float16, bfloat16, float32; float64 only
# with float64 data), refused with a ValueError naming it otherwise.

jnp = jax.numpy
PRESETS = list(jax.lax.DotAlgorithmPreset)
F64_ACCUMULATING = {"F64_F64_F64"}


def small_problem(rng, dtype):
    lhs = rng.standard_normal((9, 4)).astype(dtype)
    rhs = rng.standard_normal((2, 4, 3)).astype(dtype)
    return lhs, rhs, np.array([5, 3])


def test_every_preset_of_this_jax_is_known():
    """The presets listed here are the ones jax has: none is refused as unknown."""
    names = {p.name for p in PRESETS}
    assert {"DEFAULT", "F32_F32_F32", "BF16_BF16_F32", "BF16_BF16_F32_X3", "BF16_BF16_F32_X6",
            "BF16_BF16_F32_X9", "TF32_TF32_F32", "TF32_TF32_F32_X3", "F16_F16_F32", "F16_F16_F16",
            "BF16_BF16_BF16", "F64_F64_F64", "ANY_F8_ANY_F8_F32", "ANY_F8_ANY_F8_F32_FAST_ACCUM",
            "ANY_F8_ANY_F8_ANY", "ANY_F8_ANY_F8_ANY_FAST_ACCUM"} <= names


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_presets_with_float32_accumulation(rng, dtype, preset):
    lhs, rhs, gs = small_problem(rng, dtype)
    base = raggeddot.ragged_dot(lhs, rhs, gs)
    if preset.name in F64_ACCUMULATING:
        with pytest.raises(ValueError, match=f"ragged_dot: precision=DotAlgorithmPreset.{preset.name} "
                                             "asks for float64 accumulation.*accumulates in float32"):
            raggeddot.ragged_dot(lhs, rhs, gs, precision=preset)
        with pytest.raises(ValueError, match=preset.name):
            raggeddot.ragged_dot(lhs, rhs, gs, precision=preset.name)      # by name, as jax takes it
    elif preset.name == "BF16_BF16_F32":   # jax's meaning: operands rounded to bfloat16, float32 sums
        if dtype == np.float16:
            with pytest.raises(TypeError, match="BF16_BF16_F32 multiplies bfloat16-rounded operands: 'lhs' and 'rhs' must be float32 or bfloat16 arrays, got a float16 'lhs'"):
                raggeddot.ragged_dot(lhs, rhs, gs, precision=preset)
            return
        bf16 = ml_dtypes.bfloat16
        want = raggeddot.ragged_dot(lhs.astype(bf16), rhs.astype(bf16), gs, preferred_element_type=np.float32)
        np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, rhs, gs, precision=preset), want)
        np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, rhs, gs, precision=preset.name), want)
    else:
        np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, rhs, gs, precision=preset), base)
        np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, rhs, gs, precision=preset.name), base)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_presets_with_float64_accumulation(rng, preset):
    """Every preset is honoured when the call accumulates in float64, but
    BF16_BF16_F32, which asks for bfloat16 operands summed in float32."""
    lhs, rhs, gs = small_problem(rng, np.float64)
    if preset.name == "BF16_BF16_F32":
        with pytest.raises(TypeError, match="BF16_BF16_F32 multiplies bfloat16-rounded operands"):
            raggeddot.ragged_dot(lhs, rhs, gs, precision=preset)
        return
    base = raggeddot.ragged_dot(lhs, rhs, gs)
    np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, rhs, gs, precision=preset), base)
    lhs32, rhs32 = lhs.astype(np.float32), rhs.astype(np.float32)   # a float64 output suffices
    np.testing.assert_array_equal(
        raggeddot.ragged_dot(lhs32, rhs32, gs, precision=preset, preferred_element_type=np.float64),
        raggeddot.ragged_dot(lhs32, rhs32, gs, preferred_element_type=np.float64))


ALGORITHMS = [   # (lhs, rhs, accumulation) precision types, accepted with float32 data?
    ((np.float32, np.float32, np.float32), True),
    ((jnp.bfloat16, jnp.bfloat16, np.float32), True),
    ((np.float16, np.float16, np.float16), True),
    ((jnp.bfloat16, jnp.bfloat16, jnp.bfloat16), True),
    ((jnp.float8_e4m3fn, jnp.float8_e4m3fn, np.float32), True),
    ((np.float32, np.float32, None), True),
    ((np.float32, np.float32, np.float64), False),
    ((np.float64, np.float64, np.float64), False),
]


@pytest.mark.parametrize("types,accepted", ALGORITHMS, ids=lambda t: str(t))
def test_dot_algorithm(rng, types, accepted):
    algorithm = jax.lax.DotAlgorithm(*types)
    assert isinstance(algorithm, tuple) and len(algorithm) != 2     # a NamedTuple, not a pair
    lhs, rhs, gs = small_problem(rng, np.float32)
    base = raggeddot.ragged_dot(lhs, rhs, gs)
    if accepted and types[:2] == (jnp.bfloat16, jnp.bfloat16) and types[2] == np.float32:
        # jax's BF16_BF16_F32 algorithm: the operands rounded to bfloat16, float32 sums
        bf16 = ml_dtypes.bfloat16
        want = raggeddot.ragged_dot(lhs.astype(bf16), rhs.astype(bf16), gs, preferred_element_type=np.float32)
        np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, rhs, gs, precision=algorithm), want)
        with pytest.raises(TypeError, match="multiplies bfloat16-rounded operands"):
            raggeddot.ragged_dot(lhs.astype(np.float64), rhs.astype(np.float64), gs, precision=algorithm)
        return
    if accepted:
        np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, rhs, gs, precision=algorithm), base)
    else:
        with pytest.raises(ValueError, match=r"ragged_dot: precision=DotAlgorithm\(lhs_precision_type="
                                             r".*accumulation_type=float64\) asks for float64 accumulation"):
            raggeddot.ragged_dot(lhs, rhs, gs, precision=algorithm)
    # with float64 data every one of these is honoured
    l64, r64 = lhs.astype(np.float64), rhs.astype(np.float64)
    np.testing.assert_array_equal(raggeddot.ragged_dot(l64, r64, gs, precision=algorithm),
                                  raggeddot.ragged_dot(l64, r64, gs))


def test_dot_algorithm_with_integer_accumulation_is_refused(rng):
    lhs, rhs, gs = small_problem(rng, np.float64)
    algorithm = jax.lax.DotAlgorithm(np.int8, np.int8, np.int32)
    with pytest.raises(ValueError, match=r"precision=DotAlgorithm\(.*accumulation_type=int32\) accumulates in int32"):
        raggeddot.ragged_dot(lhs, rhs, gs, precision=algorithm)


def test_ragged_dot_general_and_vjp_take_algorithms(rng):
    lhs, rhs, gs = small_problem(rng, np.float32)
    dn = DN((([1], [1]), ([], [])), [0], [0])
    base = raggeddot.ragged_dot_general(lhs, rhs, gs, dn)
    P = jax.lax.DotAlgorithmPreset
    for p in (P.BF16_BF16_F32_X6, P.F16_F16_F16, jax.lax.DotAlgorithm(np.float32, np.float32, np.float32)):
        np.testing.assert_array_equal(raggeddot.ragged_dot_general(lhs, rhs, gs, dn, precision=p), base)
    with pytest.raises(ValueError, match="ragged_dot_general: precision=DotAlgorithmPreset.F64_F64_F64"):
        raggeddot.ragged_dot_general(lhs, rhs, gs, dn, precision=P.F64_F64_F64)
    ct = rng.standard_normal(base.shape).astype(np.float32)
    want = raggeddot.vjp(raggeddot.ragged_dot, lhs, rhs, gs)[1](ct)
    got = raggeddot.vjp(functools.partial(raggeddot.ragged_dot, precision=P.TF32_TF32_F32), lhs, rhs, gs)[1](ct)
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(a, b)


def test_precision_values_and_pairs_are_still_accepted(rng):
    lhs, rhs, gs = small_problem(rng, np.float32)
    base = raggeddot.ragged_dot(lhs, rhs, gs)
    P = jax.lax.Precision
    for p in (None, P.DEFAULT, P.HIGH, P.HIGHEST, "default", "high", "highest", "bfloat16", "float32",
              "tensorfloat32", "fastest", (P.HIGH, P.HIGHEST), [P.DEFAULT, P.DEFAULT], ("highest", "default")):
        np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, rhs, gs, precision=p), base, err_msg=repr(p))


@pytest.mark.parametrize("bad", ["fast", (jax.lax.Precision.HIGH,), ("high", "high", "high"),
                                 (jax.lax.DotAlgorithmPreset.F32_F32_F32,) * 2, 3, "f32_f32_f32"],
                         ids=repr)
def test_other_precisions_are_refused(rng, bad):
    """As jax refuses them: a wrong string, a sequence not of two Precision values, a number."""
    lhs, rhs, gs = small_problem(rng, np.float32)
    with pytest.raises(ValueError, match="ragged_dot: .*precision"):
        raggeddot.ragged_dot(lhs, rhs, gs, precision=bad)


def test_precision_checks_do_not_import_jax():
    code = ("import sys, numpy as np, raggeddot\n"
            "l, r = np.ones((3, 2), np.float32), np.ones((1, 2, 2), np.float32)\n"
            "raggeddot.ragged_dot(l, r, [3], precision='BF16_BF16_F32')\n"
            "try:\n"
            "    raggeddot.ragged_dot(l, r, [3], precision='F64_F64_F64')\n"
            "except ValueError as e:\n"
            "    assert 'F64_F64_F64' in str(e)\n"
            "else:\n"
            "    raise SystemExit('F64_F64_F64 was accepted for float32')\n"
            "assert 'jax' not in sys.modules, 'raggeddot imported jax'\n")
    subprocess.run([sys.executable, "-c", code], check=True)

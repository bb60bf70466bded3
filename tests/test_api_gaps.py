"""Inputs a new user passes that the ops used to refuse.

- Byte-swapped float inputs (``'>f4'`` on a little-endian machine, or
  ``'<f4'`` on a big-endian one) in every op: ragged_dot, ragged_dot_general
  (three modes), gmm and tgmm (with existing_out), moe_block and its vjp,
  the gathers, and vjp/jvp of the ops. Each is converted once and gives
  exactly the result of the native arrays, in native byte order; the
  inputs are not modified.
- ``precision`` given as jax's ``DotAlgorithmPreset`` names: checked
  without importing jax (their meanings: tests/test_precision.py).
"""
import functools
import subprocess
import sys

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
# precision (the values and their meanings: tests/test_precision.py)
# ---------------------------------------------------------------------------

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

"""A PackedRhs (raggeddot.prepack) given where prepacked weights are not
taken raises a TypeError that names the argument, says where a PackedRhs
is accepted (the weights of ragged_dot, gmm, ragged_dot_general's
ragged_dot form and moe_block) and how to get the plain weights back
(``.unpack()``), at every entry point: the operands of tgmm, the lhs of
ragged_dot / gmm / ragged_dot_general, existing_out and out, the gathers,
moe_block's other arrays, and the vjp / jvp paths (primals, tangents,
cotangents). ragged_dot_general with other dimension numbers keeps its
ValueError, now with the same advice."""
import functools
import re

import numpy as np
import pytest

import raggeddot
from raggeddot import RaggedDotDimensionNumbers as DN

RD_FORM = DN((([1], [1]), ([], [])), [0], [0])
CONTRACTING = DN((([0], [0]), ([], [])), [0], [])     # lhs [m, k] x rhs [m, n] -> [g, k, n]


def _case(rng, dtype=np.float32, m=12, k=5, n=4, g=3):
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs = rng.standard_normal((g, k, n)).astype(dtype)
    gs = np.array([4, 0, 6])
    return lhs, rhs, gs, raggeddot.prepack(rhs)


def _refused(call, fn, what, kind="array"):
    """``call()`` raises the PackedRhs TypeError for ``what`` in ``fn``."""
    with pytest.raises(TypeError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(f"{fn}: {what} is a PackedRhs"), msg
    for words in ("not accepted here", "ragged_dot, gmm, ragged_dot_general with ragged_dot's dimension numbers",
                  "moe_block", "PackedRhs.unpack()", f"as a new {kind}"):
        assert words in msg, (words, msg)
    assert "dtype object" not in msg
    return msg


def test_direct_calls_name_the_argument(rng):
    lhs, rhs, gs, p = _case(rng)
    m, k = lhs.shape
    y = rng.standard_normal((m, 4)).astype(np.float32)
    _refused(lambda: raggeddot.ragged_dot(p, rhs, gs), "ragged_dot", "'lhs'")
    _refused(lambda: raggeddot.gmm(p, rhs, gs), "gmm", "'lhs'")
    _refused(lambda: raggeddot.tgmm(p, y, gs), "tgmm", "'lhs'")
    _refused(lambda: raggeddot.tgmm(lhs.T, p, gs), "tgmm", "'rhs'")
    _refused(lambda: raggeddot.ragged_dot_general(p, rhs, gs, RD_FORM), "ragged_dot_general", "'lhs'")
    _refused(lambda: raggeddot.ragged_dot_general(p, y, gs, CONTRACTING), "ragged_dot_general", "'lhs'")
    # arrays beside the operands
    out = np.zeros((m, 4), np.float32)
    _refused(lambda: raggeddot.gmm(lhs, rhs, gs, existing_out=p), "gmm", "'existing_out'")
    _refused(lambda: raggeddot.tgmm(lhs.T, y, gs, existing_out=p), "tgmm", "'existing_out'")
    _refused(lambda: raggeddot.ragged_dot(lhs, rhs, gs, out=p), "ragged_dot", "'out'")
    _refused(lambda: raggeddot.gmm(lhs, rhs, p), "gmm", "'group_sizes'")
    # the weights themselves are still taken, with the plain array's result
    np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, p, gs), raggeddot.ragged_dot(lhs, rhs, gs))
    np.testing.assert_array_equal(raggeddot.ragged_dot(out=out, lhs=lhs, rhs=p, group_sizes=gs), out)


def test_general_with_other_dimension_numbers_says_how(rng):
    lhs, rhs, gs, p = _case(rng)
    with pytest.raises(ValueError) as info:
        raggeddot.ragged_dot_general(lhs, p, gs, CONTRACTING)
    msg = str(info.value)
    for words in ("prepacked 'rhs' (PackedRhs, shape (3, 5, 4))", "ragged_dot's dimension numbers only",
                  "moe_block", "'rhs'.unpack()"):
        assert words in msg, (words, msg)


def test_quantized_packed_points_to_a_qarray(rng):
    lhs, rhs, gs, _ = _case(rng)
    q = raggeddot.quantize(rhs, "int8", channelwise_axes=(0, 2))
    p = raggeddot.prepack(q)
    msg = _refused(lambda: raggeddot.tgmm(lhs.T, p, gs), "tgmm", "'rhs'", kind="QArray")
    assert "shape (3, 5, 4)" in msg
    assert isinstance(p.unpack(), raggeddot.QArray)


def test_vjp_and_jvp_paths(rng):
    lhs, rhs, gs, p = _case(rng)
    m = lhs.shape[0]
    y = rng.standard_normal((m, 4)).astype(np.float32)
    ct = np.ones((m, 4), np.float32)
    # primals where a PackedRhs is not taken
    _refused(lambda: raggeddot.vjp(raggeddot.tgmm, lhs.T, p, gs), "tgmm", "'rhs'")
    _refused(lambda: raggeddot.vjp(raggeddot.ragged_dot, p, rhs, gs), "ragged_dot", "'lhs'")
    _refused(lambda: raggeddot.grad(raggeddot.gmm)(p, rhs, gs), "gmm", "'lhs'")
    _refused(lambda: raggeddot.jvp(raggeddot.tgmm, (lhs.T, p, gs), (None, y, None)),
             "jvp of raggeddot.tgmm", "'rhs'")
    _refused(lambda: raggeddot.jvp(raggeddot.ragged_dot, (p, rhs, gs), (lhs, None, None)),
             "jvp of raggeddot.ragged_dot", "'lhs'")
    _refused(lambda: raggeddot.jvp(raggeddot.ragged_gather, (p, np.zeros((2, 1), np.int64)), (None, None)),
             "jvp of raggeddot.ragged_gather", "'x'")
    # tangents and cotangents are arrays
    _refused(lambda: raggeddot.jvp(raggeddot.ragged_dot, (lhs, rhs, gs), (None, p, None)),
             "jvp of raggeddot.ragged_dot", "the tangent of 'rhs'")
    _refused(lambda: raggeddot.jvp(functools.partial(raggeddot.gmm, transpose_rhs=False), (lhs, p, gs),
                                   (None, p, None)),
             "jvp of raggeddot.gmm", "the tangent of 'rhs'")
    _, vjp_fn = raggeddot.vjp(raggeddot.ragged_dot, lhs, p, gs)
    _refused(lambda: vjp_fn(p), "vjp of raggeddot.ragged_dot", "'cotangent'")
    # where a PackedRhs is taken, its derivatives are those of the plain weights
    got, want = vjp_fn(ct), raggeddot.vjp(raggeddot.ragged_dot, lhs, rhs, gs)[1](ct)
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(a, b)
    t_rhs = rng.standard_normal(rhs.shape).astype(np.float32)
    np.testing.assert_array_equal(raggeddot.jvp(raggeddot.ragged_dot, (lhs, p, gs), (lhs, t_rhs, None))[1],
                                  raggeddot.jvp(raggeddot.ragged_dot, (lhs, rhs, gs), (lhs, t_rhs, None))[1])


def test_moe_block_and_gathers(rng):
    T, d, f, E = 6, 4, 3, 2
    x = rng.standard_normal((T, d)).astype(np.float32)
    rw = rng.standard_normal((d, E)).astype(np.float32)
    w0, w1 = (rng.standard_normal((E, d, f)).astype(np.float32) for _ in range(2))
    wo = rng.standard_normal((E, f, d)).astype(np.float32)
    px, prw = raggeddot.prepack(x[None]), raggeddot.prepack(rw[None])
    kw = dict(top_k=1)
    _refused(lambda: raggeddot.moe_block(px, rw, w0, w1, wo, **kw), "moe_block", "'x'")
    _refused(lambda: raggeddot.moe_block(x, prw, w0, w1, wo, **kw), "moe_block", "'router_weights'")
    shared = (raggeddot.prepack(rng.standard_normal((1, d, 2)).astype(np.float32)),
              np.ones((d, 2), np.float32), np.ones((2, d), np.float32))
    _refused(lambda: raggeddot.moe_block(x, rw, w0, w1, wo, shared_experts=shared, **kw), "moe_block",
             "'shared_experts[0]'")
    _, vjp_fn = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, **kw)
    _refused(lambda: vjp_fn(px), "moe_block_vjp", "'d_out'")
    idx = np.zeros((T, 1), np.int64)
    _refused(lambda: raggeddot.ragged_gather(px, idx), "ragged_gather", "'x'")
    _refused(lambda: raggeddot.ragged_gather_reduce(px, idx), "ragged_gather_reduce", "'y'")


def test_message_is_one_sentence_per_fact(rng):
    """The message is readable as it stands: no repr of the buffer."""
    lhs, rhs, gs, p = _case(rng)
    msg = _refused(lambda: raggeddot.tgmm(p, lhs, gs), "tgmm", "'lhs'")
    assert re.search(r"shape \(3, 5, 4\), dtype float32", msg)
    assert "_buf" not in msg and "uint8" not in msg

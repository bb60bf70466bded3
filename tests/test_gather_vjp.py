"""Derivatives of the gathers: raggeddot.vjp/jvp of ragged_gather and
ragged_gather_reduce against finite differences (testing.check_grads) and
against jax.vjp/jax.jvp of the same gathers written with jnp (a gather and a
masked weighted sum), in float32 and float64, with repeated and dropped
indices; and Llama4's routed path composed from the gathers and ragged_dot
under raggeddot.vjp, against the NumPy reference and jax.
"""
import functools

import numpy as np
import pytest

import raggeddot
from raggeddot import reference as ref
from raggeddot.testing import check_grads

from helpers import ALLCLOSE, FLOATS, GRAD_TOLERANCE, dtype_id, randn

D = 5


def _gather_case(rng, dtype, T=6, N=11):
    """x [T, d], indices [N] with repeats and a row (T-1) that no index reads, weights [N]."""
    x = randn(rng, (T, D), dtype)
    idx = rng.integers(0, T - 1, size=N)
    idx[:3] = 0                                   # a row read three times
    w = randn(rng, (N,), dtype)
    return x, idx, w


def _reduce_case(rng, dtype, N=9, T=5, k=3):
    """y [N, d], indices [T, k] with repeats, -1 (dropped) and unread rows, weights [T, k]."""
    y = randn(rng, (N, D), dtype)
    idx = rng.integers(0, N - 2, size=(T, k))     # rows N-2, N-1 never read
    idx[0] = [1, 1, 1]                            # one row three times in one token
    idx[1, 2] = -1
    idx[3, :] = -1                                # a token that reads nothing
    w = randn(rng, (T, k), dtype)
    return y, idx, w


# ---------------------------------------------------------------------------
# Finite differences
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("weighted", [True, False], ids=["weights", "no-weights"])
def test_ragged_gather_fd(rng, dtype, weighted):
    x, idx, w = _gather_case(rng, dtype)
    args = (x, idx, w) if weighted else (x, idx)
    check_grads(raggeddot.ragged_gather, args, rtol=GRAD_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("weighted", [True, False], ids=["weights", "no-weights"])
def test_ragged_gather_reduce_fd(rng, dtype, weighted):
    y, idx, w = _reduce_case(rng, dtype)
    args = (y, idx, w) if weighted else (y, idx)
    check_grads(raggeddot.ragged_gather_reduce, args, rtol=GRAD_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_ragged_gather_reduce_ordered_fd(rng, dtype):
    """ordered=True (each row's terms in the order of their indices): the
    same derivatives, checked against finite differences."""
    y = randn(rng, (9, D), dtype)
    idx = np.stack([rng.permutation(9)[:3] for _ in range(5)])
    idx[1, 2] = -1
    w = randn(rng, (5, 3), dtype)
    check_grads(functools.partial(raggeddot.ragged_gather_reduce, ordered=True), (y, idx, w),
                rtol=GRAD_TOLERANCE[dtype])


def test_ragged_gather_reduce_ordered_refuses_repeated_indices(rng):
    y, idx, w = _reduce_case(rng, np.float64)        # idx[0] reads row 1 three times
    with pytest.raises(ValueError, match="ragged_gather_reduce: with ordered=True a row's indices must be distinct"):
        raggeddot.ragged_gather_reduce(y, idx, w, ordered=True)
    with pytest.raises(TypeError, match="'ordered' must be True or False"):
        raggeddot.ragged_gather_reduce(y, idx, w, ordered="yes")


def test_gather_vjp_shapes_and_dtypes(rng):
    """One entry per primal, None for the indices, each gradient in its primal's dtype."""
    x, idx, w = _gather_case(rng, np.float32)
    out, vjp_fn = raggeddot.vjp(raggeddot.ragged_gather, x, idx.astype(np.int32), w.astype(np.float64))
    d_x, d_idx, d_w = vjp_fn(np.ones_like(out))
    assert d_idx is None
    assert d_x.shape == x.shape and d_x.dtype == np.float32
    assert d_w.shape == w.shape and d_w.dtype == np.float64
    # d_x[t] = sum of w over the positions reading t: row T-1 (never read) is 0
    want = np.zeros(x.shape[0])
    np.add.at(want, idx, w.astype(np.float64))
    np.testing.assert_allclose(d_x[:, 0], want, rtol=1e-6, atol=1e-6)
    assert (d_x[-1] == 0).all()


def test_gather_reduce_vjp_unread_rows_are_zero(rng):
    y, idx, w = _reduce_case(rng, np.float64)
    out, vjp_fn = raggeddot.vjp(raggeddot.ragged_gather_reduce, y, idx, w)
    d_y, d_idx, d_w = vjp_fn(randn(rng, out.shape))
    assert d_idx is None
    assert (d_y[-2:] == 0).all()                  # rows no index reads
    assert (d_w[idx < 0] == 0).all()              # dropped assignments


def test_gather_vjp_empty(rng):
    """No positions: the gradients are zeros of the primals' shapes."""
    x = randn(rng, (4, D))
    out, vjp_fn = raggeddot.vjp(raggeddot.ragged_gather, x, np.zeros(0, np.int64), np.zeros(0))
    d_x, _, d_w = vjp_fn(np.zeros_like(out))
    assert d_x.shape == x.shape and (d_x == 0).all() and d_w.shape == (0,)
    y = randn(rng, (3, D))
    out, vjp_fn = raggeddot.vjp(raggeddot.ragged_gather_reduce, y, np.full((4, 2), -1), np.ones((4, 2)))
    d_y, _, d_w = vjp_fn(np.ones_like(out))
    assert (out == 0).all() and (d_y == 0).all() and (d_w == 0).all()


# ---------------------------------------------------------------------------
# Against jax
# ---------------------------------------------------------------------------


def _jnp_gather(jnp, idx):
    return lambda x, w: w[:, None] * x[idx]


def _jnp_gather_reduce(jnp, idx):
    kept = jnp.asarray(idx >= 0)
    safe = np.where(idx >= 0, idx, 0)
    return lambda y, w: jnp.sum(jnp.where(kept[..., None], w[..., None] * y[safe], 0), axis=1)


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("op", ["gather", "gather_reduce"])
def test_gather_vjp_jvp_vs_jax(rng, jax, x64, dtype, op):
    jnp = jax.numpy
    if op == "gather":
        rows, idx, w = _gather_case(rng, dtype, T=7, N=20)
        fn, jfn = raggeddot.ragged_gather, _jnp_gather(jnp, idx)
    else:
        rows, idx, w = _reduce_case(rng, dtype, N=12, T=8, k=3)
        fn, jfn = raggeddot.ragged_gather_reduce, _jnp_gather_reduce(jnp, idx)
    out, vjp_fn = raggeddot.vjp(fn, rows, idx, w)
    ct = randn(rng, out.shape, dtype)
    d_rows, _, d_w = vjp_fn(ct)
    t_rows, t_w = randn(rng, rows.shape, dtype), randn(rng, w.shape, dtype)
    out_j, t_out = raggeddot.jvp(fn, (rows, idx, w), (t_rows, None, t_w))
    with x64(dtype == np.float64):
        want, jvp_fn = jax.vjp(jfn, rows, w)
        want_rows, want_w = jvp_fn(ct)
        _, want_t = jax.jvp(jfn, (rows, w), (t_rows, t_w))
    tol = ALLCLOSE[np.dtype(dtype)]
    for got, exp in ((out, want), (out_j, want), (d_rows, want_rows), (d_w, want_w), (t_out, want_t)):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, np.asarray(exp), **tol)


# ---------------------------------------------------------------------------
# Llama4's routed experts, composed
# ---------------------------------------------------------------------------
# Llama4 routes each token to its top-1 expert with weight sigmoid(logit),
# scales the expert's *input* by that weight and adds the expert outputs
# unweighted:  out[t] = sum_j FFN_e(t,j)(s[t, j] * x[t]),
#   FFN_e(z) = (silu(z @ w0[e]) * (z @ w1[e])) @ wo[e].
# With the assignments sorted by expert (token_of_slot [N], slot_of [T, k]):
#   xs = ragged_gather(x, token_of_slot, weights=s_of_slot)
#   h  = silu(ragged_dot(xs, w0, gs)) * ragged_dot(xs, w1, gs)
#   y  = ragged_dot(h, wo, gs)
#   out = ragged_gather_reduce(y, slot_of)


def _silu(z):
    return z / (1 + np.exp(-z))


def _llama4_routing(x, router, top_k):
    """(token_of_slot [N], slot_of [T, k], group_sizes [E], scores [T, k])
    of Llama4's routing: top-k logits, sigmoid of them."""
    logits = x @ router
    E = router.shape[1]
    chosen = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    scores = 1 / (1 + np.exp(-np.take_along_axis(logits, chosen, axis=1)))
    flat = chosen.ravel()
    order = np.argsort(flat, kind="stable")
    token_of_slot = order // top_k
    slot_of = np.empty(flat.shape[0], np.int64)
    slot_of[order] = np.arange(flat.shape[0])
    return token_of_slot, slot_of.reshape(chosen.shape), np.bincount(flat, minlength=E), scores


def _llama4_composed_vjp(x, scores_of_slot, w0, w1, wo, token_of_slot, slot_of, gs):
    """out and a vjp_fn returning (d_x, d_scores_of_slot, d_w0, d_w1, d_wo), by chaining raggeddot.vjp."""
    xs, vjp_gather = raggeddot.vjp(raggeddot.ragged_gather, x, token_of_slot, scores_of_slot)
    g, vjp_g = raggeddot.vjp(raggeddot.ragged_dot, xs, w0, gs)
    u, vjp_u = raggeddot.vjp(raggeddot.ragged_dot, xs, w1, gs)
    sig = 1 / (1 + np.exp(-g))
    h = g * sig * u
    y, vjp_o = raggeddot.vjp(raggeddot.ragged_dot, h, wo, gs)
    out, vjp_reduce = raggeddot.vjp(raggeddot.ragged_gather_reduce, y, slot_of)

    def vjp_fn(ct):
        d_y, _ = vjp_reduce(ct)
        d_h, d_wo, _ = vjp_o(d_y)
        d_g = d_h * u * sig * (1 + g * (1 - sig))
        d_u = d_h * g * sig
        d_xs_g, d_w0, _ = vjp_g(d_g)
        d_xs_u, d_w1, _ = vjp_u(d_u)
        d_x, _, d_s = vjp_gather(d_xs_g + d_xs_u)
        return d_x, d_s, d_w0, d_w1, d_wo

    return out, vjp_fn


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("top_k", [1, 2])
def test_llama4_routed_path_composed(rng, jax, x64, dtype, top_k):
    T, d, f, E = 12, 8, 6, 6          # 12 tokens, top-1 over 6 experts: some experts get none
    x = randn(rng, (T, d), dtype)
    router = randn(rng, (d, E), dtype)
    w0, w1 = randn(rng, (E, d, f), dtype) / 2, randn(rng, (E, d, f), dtype) / 2
    wo = randn(rng, (E, f, d), dtype) / 2
    token_of_slot, slot_of, gs, scores = _llama4_routing(x.astype(np.float64), router.astype(np.float64), top_k)
    s_slot = np.empty(T * top_k, dtype)
    s_slot[slot_of.ravel()] = scores.ravel()
    out, vjp_fn = _llama4_composed_vjp(x, s_slot, w0, w1, wo, token_of_slot, slot_of, gs)

    # forward: the NumPy reference, token by token
    want = np.zeros((T, d))
    X, W0, W1, WO = (a.astype(np.float64) for a in (x, w0, w1, wo))
    chosen = np.argsort(-(X @ router.astype(np.float64)), axis=1, kind="stable")[:, :top_k]
    for t in range(T):
        for j in range(top_k):
            e, z = chosen[t, j], scores[t, j] * X[t]
            want[t] += (_silu(z @ W0[e]) * (z @ W1[e])) @ WO[e]
    tol = ALLCLOSE[np.dtype(dtype)]
    np.testing.assert_allclose(out, want, **tol)
    # the gathers as the reference module computes them, step by step
    xs = raggeddot.ragged_gather(x, token_of_slot, s_slot)
    np.testing.assert_allclose(xs, ref.ragged_gather(x, token_of_slot, s_slot), **tol)

    # backward: jax.vjp of the same composition written with jnp
    jnp = jax.numpy

    def jfun(x, s, w0, w1, wo):
        xs = s[:, None] * x[token_of_slot]
        g = jax.lax.ragged_dot(xs, w0, gs)
        h = jax.nn.silu(g) * jax.lax.ragged_dot(xs, w1, gs)
        return jax.lax.ragged_dot(h, wo, gs)[slot_of].sum(axis=1)

    ct = randn(rng, out.shape, dtype)
    with x64(dtype == np.float64):
        jout, jvp_fn = jax.vjp(jfun, x, s_slot, w0, w1, wo)
        want_grads = jvp_fn(jnp.asarray(ct))
    np.testing.assert_allclose(out, np.asarray(jout), **tol)
    for name, got, exp in zip(("x", "scores", "w0", "w1", "wo"), vjp_fn(ct), want_grads):
        assert got.dtype == dtype, name
        np.testing.assert_allclose(got, np.asarray(exp), err_msg=name, **tol)


def test_llama4_routed_path_fd(rng):
    """The composed gradient against finite differences of the composed forward (float64)."""
    T, d, f, E = 7, 4, 3, 5
    x, router = randn(rng, (T, d)), randn(rng, (d, E))
    w0, w1, wo = randn(rng, (E, d, f)), randn(rng, (E, d, f)), randn(rng, (E, f, d))
    token_of_slot, slot_of, gs, scores = _llama4_routing(x, router, 1)
    s_slot = np.empty(T)
    s_slot[slot_of.ravel()] = scores.ravel()
    fwd = functools.partial(_llama4_composed_vjp, token_of_slot=token_of_slot, slot_of=slot_of, gs=gs)
    primals = [x, s_slot, w0, w1, wo]
    out, vjp_fn = fwd(*primals)
    ct = randn(rng, out.shape)
    grads = vjp_fn(ct)
    eps = 1e-6
    for i, (p, g) in enumerate(zip(primals, grads)):
        direction = randn(rng, p.shape)
        plus = [q + eps * direction if j == i else q for j, q in enumerate(primals)]
        minus = [q - eps * direction if j == i else q for j, q in enumerate(primals)]
        numeric = np.sum((fwd(*plus)[0] - fwd(*minus)[0]) * ct) / (2 * eps)
        analytic = np.sum(g * direction)
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), (i, numeric, analytic)

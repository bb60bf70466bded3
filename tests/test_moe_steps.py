"""The MoE layer's steps (raggeddot._moe: route, dispatch, experts, combine,
shared) on their own.

- Composed by hand, forward and backward, they give moe_block's output and
  moe_block_vjp's gradients bit for bit, over routing presets, biases,
  shared experts, capacity dropping, both weight layouts and both dtypes.
- Each step's backward against central finite differences of its forward in
  float64 (``raggeddot.testing.check_grads`` with the step's own vjp); the
  routing data keeps the expert choice fixed under the perturbation.
- The experts step holds a range of experts (megablox's group_offset):
  split between two holders it gives the whole layer's results bit for
  bit, rows of other experts get zeros, and an empty expert gets
  exact-zero gradients.
"""
import dataclasses
import functools
import inspect
import math

import numpy as np
import pytest

import raggeddot
from raggeddot._moe import combine, dispatch, experts, route, shared
from raggeddot._moe.config import prepare
from raggeddot.testing import check_grads

pytestmark = pytest.mark.usefixtures("restore_runtime")


def layer_of(x, rw, w0, w1, wo, **kwargs):
    """moe_block's checked arguments, with moe_block's own defaults."""
    bound = inspect.signature(raggeddot.moe_block).bind(x, rw, w0, w1, wo, **kwargs)
    bound.apply_defaults()
    args = dict(bound.arguments)
    args.pop("return_aux")
    return prepare(**args)


def make_case(rng, T, d, f, E, dtype, layout="edf"):
    x = rng.standard_normal((T, d)).astype(dtype)
    rw = (rng.standard_normal((d, E)) * (2 / math.sqrt(d))).astype(dtype)
    w0 = (rng.standard_normal((E, d, f)) / math.sqrt(d)).astype(dtype)
    w1 = (rng.standard_normal((E, d, f)) / math.sqrt(d)).astype(dtype)
    wo = (rng.standard_normal((E, f, d)) / math.sqrt(f)).astype(dtype)
    if layout == "efd":
        w0, w1, wo = (np.ascontiguousarray(w.transpose(0, 2, 1)) for w in (w0, w1, wo))
    return x, rw, w0, w1, wo


CONFIGS = {
    "mixtral": lambda rng, E, d, f, dt: dict(top_k=2, norm_topk_prob=True),
    "deepseek": lambda rng, E, d, f, dt: dict(
        top_k=2, score_func="sigmoid", selection_bias=(0.1 * rng.standard_normal(E)).astype(dt),
        n_groups=4, topk_groups=2, norm_topk_prob=True, routed_scaling_factor=2.5,
        shared_experts=((rng.standard_normal((d, 6)) / math.sqrt(d)).astype(dt),
                        (rng.standard_normal((d, 6)) / math.sqrt(d)).astype(dt),
                        (rng.standard_normal((6, d)) / math.sqrt(6)).astype(dt))),
    "gpt-oss": lambda rng, E, d, f, dt: dict(
        top_k=2, activation="swiglu_oai", router_bias=(0.5 * rng.standard_normal(E)).astype(dt),
        w0_bias=(0.3 * rng.standard_normal((E, f))).astype(dt),
        w1_bias=(0.3 * rng.standard_normal((E, f))).astype(dt),
        wo_bias=(0.3 * rng.standard_normal((E, d))).astype(dt)),
    "capacity": lambda rng, E, d, f, dt: dict(top_k=1, activation="gelu", capacity_factor=0.5),
    "efd": lambda rng, E, d, f, dt: dict(top_k=3, activation="gelu_tanh", weights_layout="efd"),
}


def compose(layer):
    """The layer's forward, step by step; returns (out, every step's residuals)."""
    topk_idx, topk_weights, r_route = route.forward(layer.router, layer.x)
    xs, plan = dispatch.forward(layer.x, topk_idx, layer.num_experts, layer.capacity)
    y, r_experts = experts.forward(layer.experts, xs, plan.group_sizes)
    out, r_combine = combine.forward(y, plan, topk_weights)
    r_shared = shared.forward(layer.shared, layer.x, out) if layer.shared is not None else None
    return out, (r_route, plan, r_experts, r_combine, r_shared)


def compose_backward(layer, residuals, d_out):
    r_route, plan, r_experts, r_combine, r_shared = residuals
    d_y, d_topk_weights = combine.backward(r_combine, d_out)
    d_xs, grads = experts.backward(layer.experts, r_experts, d_y)
    d_x = dispatch.backward(plan, d_xs)
    d_x, d_rw, d_rb = route.backward(layer.router, r_route, d_topk_weights, d_x)
    out = {"x": d_x, "router_weights": d_rw, "router_bias": d_rb, **grads._asdict()}
    if layer.shared is not None:
        out["shared_experts"] = shared.backward(layer.shared, r_shared, d_out, d_x)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_steps_composed_by_hand_are_moe_block_bitwise(rng, name, dtype):
    T, d, f, E = 29, 16, 12, 8
    layout = "efd" if name == "efd" else "edf"
    args = make_case(rng, T, d, f, E, dtype, layout)
    kw = CONFIGS[name](rng, E, d, f, dtype)
    layer = layer_of(*args, **kw)
    out, residuals = compose(layer)
    want, aux = raggeddot.moe_block(*args, return_aux=True, **kw)
    assert out.dtype == want.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(residuals[1].group_sizes, aux["group_sizes"])
    np.testing.assert_array_equal(residuals[0].topk_idx, aux["topk_indices"])
    if name == "capacity":
        assert aux["dropped"] > 0 and (residuals[1].slot_of < 0).sum() == aux["dropped"]

    d_out = rng.standard_normal(out.shape).astype(dtype)
    got = compose_backward(layer, residuals, d_out)
    out_vjp, vjp_fn = raggeddot.moe_block_vjp(*args, **kw)
    np.testing.assert_array_equal(out_vjp, want)
    grads = vjp_fn(d_out)
    for key, value in grads.items():
        if key == "shared_experts":
            for a, b in zip(got[key], value):
                np.testing.assert_array_equal(a, b, err_msg=key)
        else:
            np.testing.assert_array_equal(got[key], value, err_msg=key)
    present = {"x", "router_weights", "w0", "w1", "wo"} | {k for k in kw if k.endswith("bias")
                                                            and k != "selection_bias"}
    assert set(grads) == present | ({"shared_experts"} if "shared_experts" in kw else set())


# ---------------------------------------------------------------------------
# Each step's backward against finite differences (float64)
# ---------------------------------------------------------------------------

def step_vjp(forward_fn, backward_fn):
    """A check_grads vjp from a step's forward (-> out, residuals) and backward."""
    def vjp(fun, *args):
        out, res = forward_fn(*args)
        return out, lambda ct: backward_fn(res, ct, args)
    return vjp


@pytest.mark.parametrize("activation", ["silu", "gelu", "swiglu_oai"])
@pytest.mark.parametrize("layout", ["edf", "efd"])
def test_experts_backward_finite_differences(rng, activation, layout):
    n, d, f = 4, 5, 3
    gs = np.array([3, 0, 4, 2])                           # expert 1 empty
    N = int(gs.sum()) + 2                                 # two rows of no expert
    xs = rng.standard_normal((N, d))
    shape_w = (n, d, f) if layout == "edf" else (n, f, d)
    shape_o = (n, f, d) if layout == "edf" else (n, d, f)
    w0, w1 = rng.standard_normal(shape_w) / 2, rng.standard_normal(shape_w) / 2
    wo = rng.standard_normal(shape_o) / 2
    b0, b1, bo = rng.standard_normal((n, f)), rng.standard_normal((n, f)), rng.standard_normal((n, d))

    def held(w0, w1, wo, b0, b1, bo):
        views = (w0, w1, wo) if layout == "edf" else tuple(w.transpose(0, 2, 1) for w in (w0, w1, wo))
        return experts.Experts(*views, b0, b1, bo, activation, 7.0, transposed=layout == "efd")

    def fun(xs, w0, w1, wo, b0, b1, bo):
        return experts.forward(held(w0, w1, wo, b0, b1, bo), xs, gs)[0]

    def backward(res, ct, args):
        d_xs, g = experts.backward(held(*args[1:]), res, ct)
        return d_xs, g.w0, g.w1, g.wo, g.w0_bias, g.w1_bias, g.wo_bias

    vjp = step_vjp(lambda *a: experts.forward(held(*a[1:]), a[0], gs), backward)
    worst = check_grads(fun, (xs, w0, w1, wo, b0, b1, bo), modes=("rev",), vjp=vjp, return_error=True)
    assert worst < 1e-6
    y = fun(xs, w0, w1, wo, b0, b1, bo)
    assert (y[-2:] == 0).all()                           # rows of no expert
    _, res = experts.forward(held(w0, w1, wo, b0, b1, bo), xs, gs)
    d_xs, g = experts.backward(held(w0, w1, wo, b0, b1, bo), res, np.ones_like(y))
    for grad in (g.w0, g.w1, g.wo, g.w0_bias, g.w1_bias, g.wo_bias):
        assert (grad[1] == 0).all()                      # the empty expert: exact zeros
    assert (d_xs[-2:] == 0).all()


ROUTERS = {
    "softmax": dict(score_func="softmax", top_k=2, norm_topk_prob=False, scaling=1.0),
    "softmax-norm": dict(score_func="softmax", top_k=2, norm_topk_prob=True, scaling=1.5),
    "sigmoid-groups": dict(score_func="sigmoid", top_k=2, norm_topk_prob=True, scaling=2.5,
                           n_groups=3, topk_groups=2),
}


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_route_backward_finite_differences(rng, name):
    T, d, E = 6, 4, 6
    opts = dict(ROUTERS[name])
    n_groups, topk_groups = opts.pop("n_groups", 1), opts.pop("topk_groups", 1)
    x = rng.standard_normal((T, d))
    rw = rng.standard_normal((d, E))
    rb = rng.standard_normal(E) * 0.5
    sel = rng.standard_normal(E) * 0.1

    def router(rw, rb):
        return route.Router(rw, rb, sel, opts["score_func"], opts["top_k"], n_groups, topk_groups,
                            opts["norm_topk_prob"], opts["scaling"])

    base_idx = route.forward(router(rw, rb), x)[0]

    def fun(x, rw, rb):
        idx, w, _ = route.forward(router(rw, rb), x)
        np.testing.assert_array_equal(idx, base_idx)      # the choice must not flip under the step
        return w

    def forward_fn(x, rw, rb):
        idx, w, res = route.forward(router(rw, rb), x)
        return w, res

    def backward(res, ct, args):
        return route.backward(router(*args[1:]), res, ct)

    worst = check_grads(fun, (x, rw, rb), modes=("rev",), vjp=step_vjp(forward_fn, backward), return_error=True)
    assert worst < 1e-6
    # the router's input gradient is added into a given d_x by the kernel
    _, res = forward_fn(x, rw, rb)
    ct = rng.standard_normal((T, opts["top_k"]))
    alone = route.backward(router(rw, rb), res, ct)[0]
    into = np.ones((T, d))
    route.backward(router(rw, rb), res, ct, into)
    np.testing.assert_allclose(into, alone + 1, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("capacity", [-1, 2])
def test_dispatch_and_combine_backward_finite_differences(rng, capacity):
    T, d, E, k = 5, 3, 4, 2
    idx = np.array([[0, 1], [1, 0], [0, 2], [3, 0], [1, 3]])
    x = rng.standard_normal((T, d))
    xs, plan = dispatch.forward(x, idx, E, capacity)
    assert xs.shape == (int(plan.group_sizes.sum()), d)
    np.testing.assert_array_equal(xs, x[plan.token_of_slot])
    if capacity >= 0:
        assert (plan.slot_of < 0).any() and (plan.group_sizes <= capacity).all()

    def dispatch_fun(x):
        return dispatch.forward(x, idx, E, capacity)[0]

    vjp = step_vjp(lambda x: dispatch.forward(x, idx, E, capacity),
                   lambda plan, ct, args: (dispatch.backward(plan, ct),))
    assert check_grads(dispatch_fun, (x,), modes=("rev",), vjp=vjp, return_error=True) < 1e-6

    y = rng.standard_normal(xs.shape)
    w = rng.standard_normal((T, k))

    def combine_fun(y, w):
        return combine.forward(y, plan, w)[0]

    vjp = step_vjp(lambda y, w: combine.forward(y, plan, w),
                   lambda res, ct, args: combine.backward(res, ct))
    assert check_grads(combine_fun, (y, w), modes=("rev",), vjp=vjp, return_error=True) < 1e-6
    # a dropped assignment gets no weight gradient
    _, res = combine.forward(y, plan, w)
    _, d_w = combine.backward(res, rng.standard_normal((T, d)))
    assert (d_w[plan.slot_of < 0] == 0).all()


def test_shared_backward_finite_differences(rng):
    T, d, fs = 5, 4, 3
    x = rng.standard_normal((T, d))
    s0, s1, so = rng.standard_normal((d, fs)), rng.standard_normal((d, fs)), rng.standard_normal((fs, d))

    def fun(x, s0, s1, so):
        out = np.zeros((T, d))
        shared.forward(shared.SharedExperts(s0, s1, so, "silu", 7.0), x, out)
        return out

    def forward_fn(x, s0, s1, so):
        out = np.zeros((T, d))
        res = shared.forward(shared.SharedExperts(s0, s1, so, "silu", 7.0), x, out)
        return out, res

    def backward(res, ct, args):
        d_x = np.zeros((T, d))
        d_s = shared.backward(shared.SharedExperts(*args[1:], "silu", 7.0), res, ct, d_x)
        return (d_x,) + tuple(d_s)

    assert check_grads(fun, (x, s0, s1, so), modes=("rev",), vjp=step_vjp(forward_fn, backward), return_error=True) < 1e-6


# ---------------------------------------------------------------------------
# Experts held in ranges (expert parallelism) and experts without tokens
# ---------------------------------------------------------------------------

def test_experts_split_between_two_holders(rng):
    T, d, f, E = 31, 8, 6, 8
    args = make_case(rng, T, d, f, E, np.float64)
    layer = layer_of(*args, top_k=2, w0_bias=rng.standard_normal((E, f)), wo_bias=rng.standard_normal((E, d)))
    topk_idx, _, _ = route.forward(layer.router, layer.x)
    xs, plan = dispatch.forward(layer.x, topk_idx, E, -1)
    y, res = experts.forward(layer.experts, xs, plan.group_sizes)
    d_y = rng.standard_normal(y.shape)
    d_xs, grads = experts.backward(layer.experts, res, d_y)

    ex = layer.experts
    halves = []
    for lo, hi in ((0, 3), (3, E)):
        part = dataclasses.replace(ex, w0=ex.w0[lo:hi], w1=ex.w1[lo:hi], wo=ex.wo[lo:hi], b0=ex.b0[lo:hi],
                                   bo=ex.bo[lo:hi])
        y_part, r_part = experts.forward(part, xs, plan.group_sizes, group_offset=lo)
        rows = slice(int(plan.group_sizes[:lo].sum()), int(plan.group_sizes[:hi].sum()))
        outside = np.ones(len(xs), bool)
        outside[rows] = False
        assert (y_part[outside] == 0).all()              # rows of experts held elsewhere
        np.testing.assert_array_equal(y_part[rows], y[rows])
        d_part, g_part = experts.backward(part, r_part, d_y)
        assert (d_part[outside] == 0).all()
        np.testing.assert_array_equal(d_part[rows], d_xs[rows])
        halves.append(g_part)
    for field in ("w0", "w1", "wo", "w0_bias", "wo_bias"):
        joined = np.concatenate([getattr(h, field) for h in halves])
        np.testing.assert_array_equal(joined, getattr(grads, field), err_msg=field)
    assert halves[0].w1_bias is None and grads.w1_bias is None

    with pytest.raises(ValueError, match="group_offset"):
        experts.forward(part, xs, plan.group_sizes, group_offset=4)   # 5 experts from 4 exceed 8


def test_experts_without_tokens(rng):
    """T=3 tokens, top_k=1 of E=8 experts: at least five experts get no row."""
    T, d, f, E = 3, 6, 4, 8
    args = make_case(rng, T, d, f, E, np.float64)
    kw = dict(top_k=1, w1_bias=rng.standard_normal((E, f)))
    layer = layer_of(*args, **kw)
    out, residuals = compose(layer)
    gs = residuals[1].group_sizes
    empty = np.flatnonzero(gs == 0)
    assert len(empty) >= E - T
    np.testing.assert_array_equal(out, raggeddot.moe_block(*args, **kw))
    grads = compose_backward(layer, residuals, rng.standard_normal(out.shape))
    for field in ("w0", "w1", "wo", "w1_bias"):
        assert (grads[field][empty] == 0).all(), field
        assert np.abs(grads[field][gs > 0]).sum() > 0, field
    # and the experts step with these group sizes against finite differences
    xs = residuals[2].xs

    def fun(xs, w0, w1, wo):
        held = dataclasses.replace(layer.experts, w0=w0, w1=w1, wo=wo)
        return experts.forward(held, xs, gs)[0]

    def backward(res, ct, a):
        d_xs, g = experts.backward(dataclasses.replace(layer.experts, w0=a[1], w1=a[2], wo=a[3]), res, ct)
        return d_xs, g.w0, g.w1, g.wo

    vjp = step_vjp(lambda xs, w0, w1, wo: experts.forward(
        dataclasses.replace(layer.experts, w0=w0, w1=w1, wo=wo), xs, gs), backward)
    ex = layer.experts
    assert check_grads(fun, (xs, np.array(ex.w0), np.array(ex.w1), np.array(ex.wo)), modes=("rev",),
                       vjp=vjp, return_error=True) < 1e-6


def test_moe_block_vjp_is_the_registered_rule(rng):
    """raggeddot.vjp(moe_block) goes through the same steps: the same bits."""
    args = make_case(rng, 9, 8, 4, 4, np.float64)
    out, vjp_fn = raggeddot.vjp(functools.partial(raggeddot.moe_block, top_k=2), *args)
    out2, vjp2 = raggeddot.moe_block_vjp(*args, top_k=2)
    np.testing.assert_array_equal(out, out2)
    ct = rng.standard_normal(out.shape)
    for a, (name, b) in zip(vjp_fn(ct), [(n, vjp2(ct)[n]) for n in ("x", "router_weights", "w0", "w1", "wo")]):
        np.testing.assert_array_equal(a, b, err_msg=name)

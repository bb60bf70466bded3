"""moe_block and moe_block_vjp with quantized expert weights (QArray w0, w1,
wo): the layer computes with the dequantized weights, which the grouped
kernels' packing reads value by value (no dequantized copy is made), and the
gradients with respect to the weights are those of the dequantized values
(straight-through). Oracle: raggeddot.reference.moe_block in float64 on the
dequantized weights, its derivatives by central differences."""

import numpy as np
import pytest

import raggeddot as rd
from raggeddot import quant, reference

from helpers import assert_unchanged, check_close, snapshot

T, D, F, E, K = 37, 64, 48, 5, 2


def quantized(w, axis_d, block):
    """int8 weights [E, ., .], per expert and output channel, blocks of
    `block` along axis_d (None: per channel only)."""
    out_axis = 3 - axis_d
    tiled = None if block is None else {axis_d: block}
    return rd.quantize(w, "int8", channelwise_axes=(0, out_axis), tiled_axes=tiled)


def make_layer(rng, layout, fused, block, dtype=np.float32):
    x = rng.standard_normal((T, D)).astype(dtype)
    rw = rng.standard_normal((D, E)).astype(dtype)
    f0 = 2 * F if fused else F
    if layout == "edf":
        shapes, daxes = [(E, D, f0), (E, D, F), (E, F, D)], [1, 1, 2]
    else:
        shapes, daxes = [(E, f0, D), (E, F, D), (E, D, F)], [2, 2, 1]
    ws = [0.2 * rng.standard_normal(s).astype(np.float32) for s in shapes]
    # the contraction of wo runs over f; its blocks are along f
    qs = [quantized(w, a, block) for w, a in zip(ws, daxes[:2])] + [quantized(ws[2], 3 - daxes[2], block)]
    if fused:
        qs[1] = None
    return x, rw, qs


def dequantized(qs):
    """The weights' values, exactly, in float64."""
    return [None if q is None else quant.dequantize(rd.QArray(q.qvalue, q.scale.astype(np.float64)))
            for q in qs]


CASES = [("edf", False, None, "concat"), ("edf", False, 16, "concat"), ("efd", False, 16, "concat"),
         ("edf", True, 16, "concat"), ("edf", True, 16, "interleaved"), ("efd", True, None, "interleaved")]


@pytest.mark.parametrize("layout, fused, block, gate_up", CASES)
def test_forward_against_oracle(rng, layout, fused, block, gate_up):
    x, rw, qs = make_layer(rng, layout, fused, block)
    kw = dict(top_k=K, weights_layout=layout, gate_up=gate_up)
    values = snapshot([x, rw] + [q.qvalue for q in qs if q is not None])
    out = rd.moe_block(x, rw, *qs, **kw)
    assert_unchanged([x, rw] + [q.qvalue for q in qs if q is not None], values)
    want = reference.moe_block(x.astype(np.float64), rw.astype(np.float64), *dequantized(qs), **kw)
    assert out.dtype == np.float32
    check_close(out, want.astype(np.float32), err_msg=f"{layout} fused={fused} block={block}")


def test_float64_layer(rng):
    x, rw, qs = make_layer(rng, "edf", False, 16, np.float64)
    out = rd.moe_block(x, rw, *qs, top_k=K, activation="gelu")
    assert out.dtype == np.float64
    check_close(out, reference.moe_block(x, rw, *dequantized(qs), top_k=K, activation="gelu"))


def test_weights_are_never_dequantized_whole(rng, monkeypatch):
    x, rw, qs = make_layer(rng, "edf", False, 16)
    want = rd.moe_block(x, rw, *qs, top_k=K)

    def refuse(q):
        raise AssertionError("a whole dequantized copy of an expert weight was made")
    monkeypatch.setattr(quant, "dequantize", refuse)
    got, vjp = rd.moe_block_vjp(x, rw, *qs, top_k=K)
    vjp(np.ones_like(got))
    np.testing.assert_array_equal(got, want)


def _fd_check(fun, args, grads, names, rng, eps=1e-6, rtol=2e-3):
    """<u, f(a + eps s) - f(a - eps s)> / 2 eps against <grad, s> per argument."""
    base = fun(*args)
    u = rng.standard_normal(base.shape)
    for i, name in names:
        s = rng.standard_normal(args[i].shape)
        plus, minus = list(args), list(args)
        plus[i], minus[i] = args[i] + eps * s, args[i] - eps * s
        fd = float(np.sum(u * (fun(*plus) - fun(*minus)))) / (2 * eps)
        got = float(np.sum(grads(u)[name].astype(np.float64) * s))
        assert abs(got - fd) <= rtol * max(1.0, abs(fd)), f"{name}: vjp {got} vs finite difference {fd}"


@pytest.mark.parametrize("layout, fused, block", [("edf", False, 16), ("efd", True, 16)])
def test_vjp_is_straight_through(rng, layout, fused, block):
    x, rw, qs = make_layer(rng, layout, fused, block)
    kw = dict(top_k=K, weights_layout=layout, activation="silu")
    out, vjp = rd.moe_block_vjp(x, rw, *qs, **kw)
    names = ["x", "router_weights", "w0"] + ([] if fused else ["w1"]) + ["wo"]
    g = vjp(np.ones_like(out))
    assert set(g) == set(names)
    for q, name in zip(qs, ["w0", "w1", "wo"]):
        if q is not None:
            assert g[name].shape == q.shape and g[name].dtype == np.float32, name
    args = [x.astype(np.float64), rw.astype(np.float64)] + [a for a in dequantized(qs) if a is not None]

    def fun(*a):
        ws = list(a[2:])
        if fused:
            ws.insert(1, None)
        return reference.moe_block(a[0], a[1], *ws, **kw)

    def grads(u):
        return vjp(u.astype(np.float32))
    _fd_check(fun, args, grads, list(enumerate(names)), rng)


def test_as_qarray_weights(rng):
    """Weights wrapped in AsQArray are quantized once per call; gradients
    come back for the wrapped float arrays."""
    x, rw, _ = make_layer(rng, "edf", False, None)
    ws = [0.2 * rng.standard_normal(s).astype(np.float32) for s in ((E, D, F), (E, D, F), (E, F, D))]
    spec = dict(channelwise_axes=(0, 2), tiled_axes={1: 16})
    out, vjp = rd.moe_block_vjp(x, rw, *(rd.AsQArray(w, "int8", **spec) for w in ws), top_k=K)
    want = reference.moe_block(x.astype(np.float64), rw.astype(np.float64),
                               *dequantized([rd.quantize(w, "int8", **spec) for w in ws]), top_k=K)
    check_close(out, want.astype(np.float32))
    g = vjp(np.ones_like(out))
    assert all(g[n].shape == w.shape and g[n].dtype == np.float32 for n, w in zip(("w0", "w1", "wo"), ws))


def test_bad_quantized_weight_names_it(rng):
    x, rw, qs = make_layer(rng, "edf", False, None)
    with pytest.raises(ValueError, match="'wo'"):
        rd.moe_block(x, rw, qs[0], qs[1], qs[0], top_k=K)
    with pytest.raises(ValueError, match="'w1'"):
        rd.moe_block(x, rw, qs[0], qs[1][:, :, :2], qs[2], top_k=K)

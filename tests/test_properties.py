"""Property-based tests of every public op (hypothesis).

Random shapes (0 and 1 included), group patterns (all empty, one full, sums
below m), dtypes, memory layouts (Fortran order, negative and non-unit
strides, zero-stride broadcast views, misaligned and read-only data), thread
counts and kernels: each call either matches ``raggeddot.reference`` or
raises the documented exception, and never modifies an input.

Examples per test: RAGGEDDOT_PROPERTY_EXAMPLES (default 400, 2,800 in all).
For a long run, e.g. 10**5 examples over the 7 tests:

    RAGGEDDOT_PROPERTY_EXAMPLES=14300 python -m pytest tests/test_properties.py
"""
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
ml_dtypes = pytest.importorskip("ml_dtypes")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import raggeddot  # noqa: E402
from raggeddot import reference, runtime  # noqa: E402

EXAMPLES = int(os.environ.get("RAGGEDDOT_PROPERTY_EXAMPLES", "400"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
LAYOUTS = ["C", "F", "negative", "strided", "broadcast", "misaligned", "readonly"]
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}


def layout(arr, kind):
    """`arr`'s values (for 'broadcast': its first row everywhere) in another
    memory layout."""
    if kind == "C":
        return np.ascontiguousarray(arr)
    if kind == "F":
        return np.asfortranarray(arr)
    if kind == "negative":
        return np.flip(np.flip(arr).copy())
    if kind == "strided":
        big = np.zeros(arr.shape[:-1] + (2 * arr.shape[-1] + 1,), arr.dtype)
        big[..., 1::2] = arr
        return big[..., 1::2]
    if kind == "broadcast":
        return np.broadcast_to(arr[:1], arr.shape) if arr.shape[0] else arr
    if kind == "misaligned":
        if arr.dtype.itemsize == 1 or arr.size == 0:
            return arr
        raw = np.zeros(arr.nbytes + 1, np.uint8)
        out = raw[1:].view(arr.dtype).reshape(arr.shape)
        out[...] = arr
        assert not out.flags.aligned
        return out
    if kind == "readonly":
        out = arr.copy()
        out.flags.writeable = False
        return out
    raise AssertionError(kind)


@st.composite
def operand(draw, shape, dtypes=FLOATS, layouts=LAYOUTS):
    dtype = draw(st.sampled_from(dtypes))
    data = draw(st.sampled_from(["normal", "normal", "normal", "zeros", "integers"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if data == "normal":
        arr = rng.standard_normal(shape)
    elif data == "zeros":
        arr = np.zeros(shape)
    else:
        arr = rng.integers(-3, 4, shape).astype(np.float64)
    return layout(arr.astype(dtype), draw(st.sampled_from(layouts)))


@st.composite
def group_sizes(draw, g, total_max):
    """g sizes with sum <= total_max: all empty, one full, or random cuts."""
    kind = draw(st.sampled_from(["random", "random", "empty", "one-full", "below"]))
    if g == 0 or kind == "empty":
        return np.zeros(g, np.int64)
    if kind == "one-full":
        gs = np.zeros(g, np.int64)
        gs[draw(st.integers(0, g - 1))] = total_max
        return gs
    total = total_max if kind == "random" else draw(st.integers(0, total_max))
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=g - 1, max_size=g - 1)))
    gs = np.diff(np.array([0] + cuts + [total], np.int64))
    return gs.astype(draw(st.sampled_from([np.int32, np.int64, np.uint16])))


settings_strategy = st.tuples(st.sampled_from(runtime.runnable_kernels()), st.integers(1, 3))


def snapshot(*arrays):
    return [np.array(a, copy=True) for a in arrays]


def unchanged(before, arrays):
    return all(np.array_equal(b, a, equal_nan=True) for b, a in zip(before, arrays))


def check(got, want, out_dtype, depth):
    """Scaled error within a tolerance from the output's rounding and the
    float32 (or float64) accumulation over `depth` terms."""
    assert got.shape == want.shape and got.dtype == want.dtype
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g64), np.isnan(w64))
    finite = np.isfinite(w64)
    if not finite.any():
        return
    acc = EPS["float64"] if out_dtype == np.float64 else EPS["float32"]
    tol = 2 * EPS[np.dtype(out_dtype).name] + 4 * (depth + 1) * acc
    scale = max(1.0, float(np.max(np.abs(w64[finite]))))
    assert np.max(np.abs(g64[finite] - w64[finite])) <= tol * scale


@st.composite
def ragged_case(draw):
    m, k, n, g = (draw(st.integers(0, hi)) for hi in (40, 20, 24, 6))
    lhs = draw(operand((m, k)))
    rhs = draw(operand((g, k, n)))
    gs = draw(group_sizes(g, m))
    return lhs, rhs, gs


@PROPERTY
@given(ragged_case(), settings_strategy)
def test_ragged_dot(case, cfg):
    lhs, rhs, gs = case
    before = snapshot(lhs, rhs, gs)
    with runtime.configured(kernel=cfg[0], num_threads=cfg[1]):
        got = raggeddot.ragged_dot(lhs, rhs, gs)
    want = reference.ragged_dot(lhs, rhs, gs)      # jax.lax's result type (float16 with bfloat16: bfloat16)
    check(got, want, want.dtype, lhs.shape[1])
    assert unchanged(before, (lhs, rhs, gs))


@PROPERTY
@given(ragged_case(), st.booleans(), st.data(), settings_strategy)
def test_gmm(case, transpose_rhs, data, cfg):
    lhs, rhs, gs = case
    if transpose_rhs:
        rhs = layout(np.swapaxes(rhs, 1, 2), data.draw(st.sampled_from(LAYOUTS)))
    offset = data.draw(st.integers(0, rhs.shape[0])) if rhs.shape[0] else 0
    local = rhs[offset:]
    full_gs = np.concatenate([np.zeros(offset, np.int64), gs.astype(np.int64)[offset:]])
    before = snapshot(lhs, local, full_gs)
    with runtime.configured(kernel=cfg[0], num_threads=cfg[1]):
        got = raggeddot.gmm(lhs, local, full_gs, group_offset=offset, transpose_rhs=transpose_rhs)
    want = reference.gmm(lhs, local, full_gs, group_offset=offset, transpose_rhs=transpose_rhs)
    check(got, want, want.dtype, lhs.shape[1])
    assert unchanged(before, (lhs, local, full_gs))


@PROPERTY
@given(st.data(), settings_strategy)
def test_tgmm(data, cfg):
    m, k, n, g = (data.draw(st.integers(0, hi)) for hi in (40, 20, 24, 6))
    lhs = data.draw(operand((k, m)))
    rhs = data.draw(operand((m, n)))
    gs = data.draw(group_sizes(g, m))
    existing = data.draw(st.none() | operand((g, k, n), dtypes=[np.dtype(np.float32), np.dtype(np.float64)]))
    before = snapshot(lhs, rhs, gs) + ([] if existing is None else snapshot(existing))
    with runtime.configured(kernel=cfg[0], num_threads=cfg[1]):
        got = raggeddot.tgmm(lhs, rhs, gs, existing_out=existing)
    want = reference.tgmm(lhs, rhs, gs, existing_out=existing)
    check(got, want, want.dtype, m + 1)
    assert unchanged(before, (lhs, rhs, gs) + (() if existing is None else (existing,)))


# ragged_dot_general: one template per mode, sizes drawn
RDG_CASES = {
    "noncontracting": (((1,), (1,)), ((), ()), (0,), (0,), lambda b, m, k, n, g: ((m, k), (g, k, n))),
    "noncontracting-batch": (((2,), (2,)), ((0,), (1,)), (1,), (0,),
                             lambda b, m, k, n, g: ((b, m, k), (g, b, k, n))),
    "contracting": (((0,), (0,)), ((), ()), (0,), (), lambda b, m, k, n, g: ((k, m), (k, n))),
    "contracting-batch": (((1,), (1,)), ((0,), (0,)), (1,), (), lambda b, m, k, n, g: ((b, k, m), (b, k, n))),
    "batch": (((2,), (1,)), ((0,), (0,)), (0,), (), lambda b, m, k, n, g: ((b, m, k), (b, k, n))),
}


@PROPERTY
@given(st.sampled_from(sorted(RDG_CASES)), st.data(), settings_strategy)
def test_ragged_dot_general(name, data, cfg):
    contract, batch, ragged, group, shapes = RDG_CASES[name]
    b, m, k, n, g = (data.draw(st.integers(0, hi)) for hi in (3, 12, 10, 12, 4))
    lshape, rshape = shapes(b, m, k, n, g)
    lhs, rhs = data.draw(operand(lshape)), data.draw(operand(rshape))
    gs = data.draw(group_sizes(g, lshape[ragged[0]]))
    dn = raggeddot.RaggedDotDimensionNumbers(dot_dimension_numbers=(contract, batch),
                                             lhs_ragged_dimensions=ragged, rhs_group_dimensions=group)
    before = snapshot(lhs, rhs, gs)
    with runtime.configured(kernel=cfg[0], num_threads=cfg[1]):
        got = raggeddot.ragged_dot_general(lhs, rhs, gs, dn)
    want = reference.ragged_dot_general(lhs, rhs, gs, dn)
    check(got, want, want.dtype, max(k, m) + 1)
    assert unchanged(before, (lhs, rhs, gs))


@PROPERTY
@given(st.data(), settings_strategy)
def test_moe_block(data, cfg):
    T, d, f, E = (data.draw(st.integers(lo, hi)) for lo, hi in ((0, 12), (1, 6), (1, 6), (1, 6)))
    top_k = data.draw(st.integers(1, E))
    f64 = [np.dtype(np.float64)]
    lay = ["C", "F", "negative", "strided", "readonly", "misaligned"]
    x, rw = data.draw(operand((T, d), f64, lay)), data.draw(operand((d, E), f64, lay))
    w0, w1 = data.draw(operand((E, d, f), f64, lay)), data.draw(operand((E, d, f), f64, lay))
    wo = data.draw(operand((E, f, d), f64, lay))
    kw = dict(top_k=top_k,
              score_func=data.draw(st.sampled_from(["softmax", "sigmoid"])),
              activation=data.draw(st.sampled_from(["silu", "gelu", "gelu_tanh", "relu", "swiglu_oai"])),
              norm_topk_prob=data.draw(st.booleans()),
              capacity_factor=data.draw(st.sampled_from([None, 0.5, 1.0, 2.0])))
    before = snapshot(x, rw, w0, w1, wo)
    with runtime.configured(kernel=cfg[0], num_threads=cfg[1]):
        got = raggeddot.moe_block(x, rw, w0, w1, wo, **kw)
    want = reference.moe_block(x, rw, w0, w1, wo, **kw)
    check(got, want, np.float64, d * f + E)
    assert unchanged(before, (x, rw, w0, w1, wo))


@PROPERTY
@given(st.data())
def test_gathers(data):
    T, d, n, k = (data.draw(st.integers(0, hi)) for hi in (10, 6, 12, 3))
    x = data.draw(operand((T, d), [np.dtype(np.float32), np.dtype(np.float64)]))
    idx = np.array(data.draw(st.lists(st.integers(0, max(T - 1, 0)), min_size=n, max_size=n)) if T else [],
                   dtype=np.int64)
    w = data.draw(st.none() | operand((idx.size,), [x.dtype]))
    before = snapshot(x, idx)
    got = raggeddot.ragged_gather(x, idx, w)
    check(got, reference.ragged_gather(x, idx, w), x.dtype, 1)
    slots = np.array(data.draw(st.lists(st.integers(-1, idx.size - 1), min_size=T * k, max_size=T * k)),
                     dtype=np.int64).reshape(T, k)
    got2 = raggeddot.ragged_gather_reduce(got, slots)
    check(got2, reference.ragged_gather_reduce(got, slots), x.dtype, k)
    assert unchanged(before, (x, idx))


@PROPERTY
@given(st.integers(0, 40), st.integers(0, 6), st.data())
def test_invalid_group_sizes_raise_value_error(m, g, data):
    """Negative sizes or sums past m: a ValueError naming group_sizes, for
    every op that takes them; nothing else happens."""
    gs = np.array(data.draw(st.lists(st.integers(-5, m + 5), min_size=g, max_size=g)), np.int64)
    valid = (gs >= 0).all() and gs.sum() <= m
    lhs = np.ones((m, 3), np.float32)
    rhs = np.ones((g, 3, 2), np.float32)
    calls = [lambda: raggeddot.ragged_dot(lhs, rhs, gs), lambda: raggeddot.gmm(lhs, rhs, gs),
             lambda: raggeddot.tgmm(lhs.T, np.ones((m, 2), np.float32), gs)]
    for call in calls:
        if valid:
            call()
        else:
            with pytest.raises(ValueError, match="group_sizes"):
                call()

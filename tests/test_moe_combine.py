"""The experts' down product with the combine in its epilogue
(gw.combine_rows: each finished row of y scaled by its slot's weight and
added into its token's output row, the columns split between the threads so
that each output element sums its slots in slot order on one thread): the
bits of the separate product and the ordered gather_reduce, on every kernel
family, hidden dtype, weight form and thread count, with biases, dropped
assignments and empty experts; moe_block (no backward) takes it, and its
output does not depend on the number of threads."""
import numpy as np
import pytest

import raggeddot
from raggeddot import _core
from raggeddot import _gateway as gw
from raggeddot import runtime
from raggeddot._moe import combine, dispatch, experts

from helpers import DOT_KERNELS, FUSED_FAMILIES, bits

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), BF16, np.dtype(np.float16), np.dtype(np.float64)]
FAMILIES = FUSED_FAMILIES
_bits = bits


def _routing(rng, T, k, E, capacity=-1, empty=()):
    """A plan of T tokens' top-k choices among E experts (none of `empty`)."""
    allowed = np.array([e for e in range(E) if e not in empty])
    idx = np.stack([rng.permutation(allowed)[:k] for _ in range(T)]).astype(np.int64)
    return idx, dispatch.sort(idx, E, capacity)


def _separate(a, w, bounds, plan, T, k, weights, bias, hidden):
    """y = a @ w[g] (+ bias[g]) rounded to `hidden`, then the ordered combine."""
    ct = gw.compute_dtype(hidden)
    y = np.zeros((a.shape[0], w.shape[2]), dtype=ct)
    if isinstance(w, raggeddot.PackedRhs):
        gw.rows_packed(a, w, bounds, y)
    else:
        gw.rows(a, w, bounds, y)
    if bias is not None:
        for g in range(bias.shape[0]):
            y[bounds[g]:bounds[g + 1]] += bias[g]
    y = gw.narrow(y, hidden) if hidden != ct else y
    return gw.gather_reduce(y, plan.slot_of.reshape(T, k), weights, ordered=True)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("bias, weighted, capacity", [(False, True, -1), (True, True, 20), (True, False, -1)])
def test_combine_rows_equals_the_product_then_the_ordered_combine(rng, family, dtype, threads, bias, weighted,
                                                                  capacity):
    T, k, E, f, d = 45, 3, 6, 40, 100
    ct = gw.compute_dtype(dtype)
    idx, plan = _routing(rng, T, k, E, capacity, empty=(4,))
    N = int(plan.token_of_slot.shape[0])
    bounds = gw.group_bounds(np.asarray(plan.group_sizes), 0, E)
    a = rng.standard_normal((N, f)).astype(dtype)
    w = (rng.standard_normal((E, f, d)) / np.sqrt(f)).astype(dtype)
    tw = rng.random((T, k)).astype(ct) if weighted else None
    b = rng.standard_normal((E, d)).astype(ct) if bias else None
    with runtime.configured(kernel=family, num_threads=threads):
        want = _separate(a, w, bounds, plan, T, k, tw, b, dtype)
        out = np.zeros((T, d), dtype=ct)
        sw = None if tw is None else dispatch.slot_weights(plan.slot_of, tw, N)
        got = gw.combine_rows(a, w, bounds, out, plan.token_of_slot, sw, b, dtype)
    assert got is out
    assert np.array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("form", ["prepacked", "prepacked-bf16", "prepacked-bf16-dot", "int8", "float8_e4m3fn",
                                  "int4"])
def test_combine_rows_reads_prepacked_and_quantized_weights(rng, form):
    T, k, E, f, d = 50, 2, 4, 48, 72
    idx, plan = _routing(rng, T, k, E)
    N = T * k
    bounds = gw.group_bounds(np.asarray(plan.group_sizes), 0, E)
    a = rng.standard_normal((N, f)).astype(np.float32)
    w = (rng.standard_normal((E, f, d)) / np.sqrt(f)).astype(np.float32)
    if form == "prepacked":
        w = raggeddot.prepack(w)
    elif form == "prepacked-bf16":
        w = raggeddot.prepack(w.astype(BF16))
    elif form == "prepacked-bf16-dot":    # k-pairs for the dot-product kernels: met by a float layout
        with runtime.configured(kernel=DOT_KERNELS["bfloat16-dot"][0]):
            w = raggeddot.prepack(w.astype(BF16))
        assert w.ctype == "bfloat16-dot"
    else:
        w = raggeddot.quantize(w, form, channelwise_axes=(0, 2))
    tw = rng.random((T, k)).astype(np.float32)
    wo = experts._fused(a, w, w)[0]    # the layout the one-pass product reads (a float one: prepack's meet)
    want = _separate(a, wo, bounds, plan, T, k, tw, None, np.dtype(np.float32))
    out = np.zeros((T, d), dtype=np.float32)
    gw.combine_rows(a, wo, bounds, out, plan.token_of_slot, dispatch.slot_weights(plan.slot_of, tw, N), None,
                    np.dtype(np.float32))
    assert np.array_equal(_bits(out), _bits(want))


def test_gather_reduce_ordered_sums_each_row_in_index_order(rng):
    """ordered=True adds a token's terms in the order of their indices (the
    slot order), whatever their order in the row; the default keeps j order."""
    n, d, T, k = 30, 9, 12, 4
    y = (rng.standard_normal((n, d)) * 10.0 ** rng.integers(-6, 6, (n, 1))).astype(np.float32)
    idx = np.stack([rng.permutation(n)[:k] for _ in range(T)]).astype(np.int64)
    idx[3, 1] = -1
    w = rng.random((T, k)).astype(np.float32)
    for ordered in (False, True):
        want = np.zeros((T, d), np.float32)
        for t in range(T):
            js = [j for j in range(k) if idx[t, j] >= 0]
            for j in (sorted(js, key=lambda j: idx[t, j]) if ordered else js):
                want[t] += w[t, j] * y[idx[t, j]]
        got = gw.gather_reduce(y, idx, w, ordered=ordered)
        assert np.array_equal(_bits(got), _bits(want)), ordered


def _layer(rng, dtype, router_dtype, T, d, f, E, gate_up):
    """Tokens [T, d], a router [d, E] of router_dtype and the experts' weights (w0, w1, wo) of
    dtype: w0 [E, d, 2f] and w1 None with gate_up, else two [E, d, f]; wo [E, f, d]."""
    x = rng.standard_normal((T, d)).astype(dtype)
    router = rng.standard_normal((d, E)).astype(router_dtype)
    if gate_up:
        w0, w1 = (rng.standard_normal((E, d, 2 * f)) / np.sqrt(d)).astype(dtype), None
    else:
        w0, w1 = ((rng.standard_normal((E, d, f)) / np.sqrt(d)).astype(dtype) for _ in range(2))
    return x, router, (w0, w1, (rng.standard_normal((E, f, d)) / np.sqrt(f)).astype(dtype))


@pytest.fixture
def always_combines(monkeypatch):
    """The combine in the down product at any width (the rule that keeps it
    to wide outputs is a matter of speed), and a record of its calls."""
    calls = []
    real = gw.combine_rows
    monkeypatch.setattr(experts, "COMBINE_MIN_COLS", 1)
    monkeypatch.setattr(gw, "combine_rows", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("kw", [
    dict(), dict(router_weights_on="input"), dict(capacity_factor=0.6), dict(w0_bias=True, wo_bias=True),
    dict(shared=True), dict(gate_up="interleaved", activation="swiglu_oai", swiglu_limit=2.0)])
def test_moe_block_combines_in_the_down_product(rng, always_combines, dtype, kw):
    """moe_block (no backward) adds each slot's row into its token's output
    in the down product's epilogue; its output has the bits of the vjp's
    forward, which combines y [N, d] apart, and of any thread count."""
    T, d, f, E = 64, 40, 24, 5
    ct = gw.compute_dtype(dtype)
    kw = dict(kw)
    x, router, (w0, w1, wo) = _layer(rng, dtype, ct, T, d, f, E, kw.get("gate_up"))
    if kw.pop("w0_bias", False):
        kw["w0_bias"] = rng.standard_normal((E, f)).astype(ct)
    if kw.pop("wo_bias", False):
        kw["wo_bias"] = rng.standard_normal((E, d)).astype(ct)
    if kw.pop("shared", False):
        kw["shared_experts"] = tuple((rng.standard_normal(s) / np.sqrt(s[0])).astype(dtype)
                                     for s in ((d, 16), (d, 16), (16, d)))
    outs = []
    for threads in (1, 2, 3):
        with runtime.configured(num_threads=threads):
            outs.append(raggeddot.moe_block(x, router, w0, w1, wo, top_k=2, **kw))
    assert len(always_combines) == 3, "the combine ran in the down product"
    with runtime.configured(num_threads=2):
        want, _ = raggeddot.moe_block_vjp(x, router, w0, w1, wo, top_k=2, **kw)
    assert len(always_combines) == 3, "the vjp keeps y for its backward"
    for out in outs:
        assert np.array_equal(_bits(out), _bits(want))


def test_moe_block_combines_apart_where_the_columns_are_few(rng, monkeypatch):
    """Below COMBINE_MIN_COLS output columns a thread the ordered pass would
    pack every row of a once a thread: the combine runs apart."""
    calls = []
    real = gw.combine_rows
    monkeypatch.setattr(gw, "combine_rows", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    T, d, f, E = 32, 64, 16, 4
    x = rng.standard_normal((T, d)).astype(np.float32)
    ws = [rng.standard_normal(s).astype(np.float32) for s in ((d, E), (E, d, f), (E, d, f), (E, f, d))]
    with runtime.configured(num_threads=2):
        raggeddot.moe_block(x, *ws, top_k=2)
    assert not calls
    monkeypatch.setattr(experts, "COMBINE_MIN_COLS", d // 2)
    with runtime.configured(num_threads=2):
        raggeddot.moe_block(x, *ws, top_k=2)
    assert calls == [1]


_SUMMED_CASES = [dict(), dict(capacity_factor=0.6), dict(gate_up="concat", activation="gelu"),
                 dict(gate_up="interleaved", activation="swiglu_oai", swiglu_limit=2.0, w0_bias=True)]


@pytest.mark.parametrize("dtype, kw", [(dt, kw) for dt in DTYPES for kw in _SUMMED_CASES]
                         + [(np.dtype(np.float32), dict(quantized=True)),   # int8 weights: a float32 layer
                            (BF16, dict(hidden16=True)), (BF16, dict(hidden16=True, capacity_factor=0.6)),
                            (np.dtype(np.float16), dict(hidden16=True))],    # 16-bit hidden activations
                         ids=lambda p: p.name if isinstance(p, np.dtype) else "-".join(p) or "plain")
def test_backward_adds_the_row_gradients_into_the_tokens_as_the_d_xs_products_complete(
        rng, monkeypatch, always_combines, dtype, kw):
    """The backward's d_xs products (dh0 w0^T + dh1 w1^T) run as one ordered
    pass with the dispatch's backward in its epilogue (no [N, d] array of
    d_xs): every gradient has the bits of the separate passes (two products,
    the second accumulated, then each token's slots summed in slot order),
    at any thread count, with dropped slots, fused and interleaved gate/up
    weights, biases and int8 weights dequantized while packed, and 16-bit
    hidden activations (a router of the layer's dtype: their cotangent rows
    gathered as a 16-bit array); the separate passes gather the cotangent
    rows of every layer."""
    T, d, f, E = 64, 40, 24, 5
    ct = gw.compute_dtype(dtype)
    kw = dict(kw)
    x, router, (w0, w1, wo) = _layer(rng, dtype, dtype if kw.pop("hidden16", False) else ct, T, d, f, E,
                                     kw.get("gate_up"))
    if kw.pop("w0_bias", False):
        kw["w0_bias"] = rng.standard_normal((E, 2 * f)).astype(ct)
    if kw.pop("quantized", False):
        w0, w1, wo = (raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)) for w in (w0, w1, wo))
    d_out = rng.standard_normal((T, d)).astype(ct)
    summed = []
    real = gw.combine_rows
    monkeypatch.setattr(gw, "combine_rows",
                        lambda *a, **k: summed.append(k.get("lhs1") is not None) or real(*a, **k))
    grads = []
    for threads in (1, 2, 3):
        with runtime.configured(num_threads=threads):
            out, fn = raggeddot.moe_block_vjp(x, router, w0, w1, wo, top_k=2, **kw)
            grads.append(fn(d_out.astype(out.dtype)))
    assert summed == [True] * 3, "the d_xs products combined"
    monkeypatch.setattr(experts, "sums_rows", lambda *a: False)
    real_backward = combine.backward     # and the cotangent rows gathered into an array
    monkeypatch.setattr(combine, "backward", lambda res, d_out, lazy=False: real_backward(res, d_out))
    with runtime.configured(num_threads=2):
        out, fn = raggeddot.moe_block_vjp(x, router, w0, w1, wo, top_k=2, **kw)
        want = fn(d_out.astype(out.dtype))
    assert summed == [True] * 3
    for got in grads:
        for name, g in want.items():
            if g is not None:
                assert np.array_equal(_bits(np.asarray(got[name])), _bits(np.asarray(g))), name


def test_the_combine_binding_refuses_bad_arguments():
    """Direct calls of the C entry point with bad arguments raise, naming
    what is wrong, and never touch memory outside the arrays."""
    a, w = np.zeros((4, 8), np.float32), np.zeros((2, 8, 6), np.float32)
    out, b = np.zeros((3, 6), np.float32), np.array([0, 2, 4], np.int64)
    tok, sw, hid = np.array([0, 1, 2, 0], np.int64), np.ones(4, np.float32), np.empty(0, np.float32)
    bad = [
        (lambda: _core.combine_rows(a, w, b, out, np.array([0, 1, 3, 0]), sw, None, hid), "tokens"),
        (lambda: _core.combine_rows(a, w, b, out, tok[:3], sw[:3], None, hid), "disagree"),
        (lambda: _core.combine_rows(a, w, b, out[:, :5], tok, sw, None, hid), "disagree"),
        (lambda: _core.combine_rows(a, w, b, out.astype(np.float64), tok, sw, None, hid), "out"),
        (lambda: _core.combine_rows(a, w, b, out, tok, sw[:3], None, hid), "weights"),
        (lambda: _core.combine_rows(a, w, b, out, tok, sw, np.zeros((2, 5), np.float32), hid), "'bias' must be"),
        (lambda: _core.combine_rows(a, w, np.array([0, 5, 4]), out, tok, sw, None, hid), "bounds"),
        (lambda: _core.combine_rows(a, w, b, out, tok, sw, None, np.empty(0, np.int32)), "'hidden'"),
        (lambda: _core.combine_rows(a, w[:, :7], b, out, tok, sw, None, hid), "disagree"),
        (lambda: _core.combine_rows(a, w, b, out, tok, sw, None, hid, a), "come together"),
        (lambda: _core.combine_rows(a, (w, w, "float32", "float32", 2, 8, 6, 512, 32, 0, False), b, out, tok, sw,
                                    None, hid, a, w), "not prepacked"),
        (lambda: _core.combine_rows(a, w, b, out, tok, sw, None, hid, a[:3], w), "'lhs1'"),
        (lambda: _core.combine_rows(a, w, b, out, tok, sw, None, hid, a.astype(np.float64), w), "'lhs1'"),
        (lambda: _core.combine_rows(a, w, b, out, tok, sw, None, hid, a, w[:, :, :5]), "'w0' and 'w1'"),
    ]
    for call, message in bad:
        with pytest.raises((ValueError, TypeError), match=message):
            call()
    assert not out.any()


@pytest.mark.parametrize("da, dr", [(np.float32, np.float32), (np.float64, np.float32), (np.float32, BF16),
                                    (BF16, np.float16), (np.float64, np.float64)])
def test_slot_dots_sums_each_product_in_double(rng, da, dr):
    """The router's gradient's dot products (combine and dispatch backward):
    each <a[t], rows[slot]> summed in double, rounded once to the compute
    dtype; a dropped slot gives 0; 16-bit rows read as they are."""
    T, n, d = 9, 12, 700
    a = (rng.standard_normal((T, d)) * 10.0 ** rng.integers(-3, 3, (T, 1))).astype(da)
    rows = rng.standard_normal((n, d)).astype(dr)
    idx = np.stack([rng.permutation(n)[:3] for _ in range(T)]).astype(np.int64)
    idx[2, 1] = -1
    idx[5] = -1
    got = gw.slot_dots(a, rows, idx)
    ct = gw.compute_dtype(np.dtype(da), np.dtype(dr))
    assert got.dtype == ct and got.shape == (T, 3)
    want = np.array([[0.0 if s < 0 else np.dot(a[t].astype(np.float64), rows[s].astype(np.float64))
                      for s in idx[t]] for t in range(T)])
    np.testing.assert_allclose(got, want.astype(ct), rtol=2e-7 if ct == np.float32 else 1e-13, atol=0)
    assert (got[5] == 0).all() and got[2, 1] == 0


def test_slot_dots_refuses_bad_arguments():
    a, rows = np.zeros((4, 8), np.float32), np.zeros((6, 8), np.float32)
    bad = [
        (lambda: _core.slot_dots(a, rows, np.array([[0, 6]] * 4)), "index 6"),
        (lambda: _core.slot_dots(a, rows[:, :7], np.zeros((4, 2), np.int64)), "disagree"),
        (lambda: _core.slot_dots(a, rows, np.zeros((3, 2), np.int64)), "disagree"),
        (lambda: _core.slot_dots(a.astype(np.int32), rows, np.zeros((4, 2), np.int64)), "'a'"),
    ]
    for call, message in bad:
        with pytest.raises((ValueError, TypeError), match=message):
            call()

"""What a PackedRhs holds and keeps, and how it says no.

- A layout made for another kind of lhs is made once when several threads
  meet it first at the same time (the others wait for it), and every thread
  gets the plain weights' result.
- ``nbytes`` and ``layouts`` count every byte held: traced allocations
  (tracemalloc, which sees NumPy's) of prepack and of a layout made later
  equal them, the scale copies kept for ``unpack()`` included.
- Weights prepacked under one kernel family and used under another whose
  panels differ raise a ValueError naming the function and the argument
  (ragged_dot, gmm, ragged_dot_general, moe_block), float, MXFP4 and int8
  weights alike; a PackedRhs survives copy.deepcopy and pickle (its panels
  realigned: a copied array starts where NumPy puts it, not on 64 bytes).
"""
import copy
import pickle
import threading
import time
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

import raggeddot
from raggeddot import RaggedDotDimensionNumbers as DN
from raggeddot import _prepack, runtime

BF16 = np.dtype(ml_dtypes.bfloat16)
DN_RAGGED = DN((([1], [1]), ([], [])), [0], [0])


def test_a_layout_is_made_once_by_concurrent_first_use(rng, monkeypatch):
    """Four threads, released together, multiply a bfloat16 lhs by weights
    laid out for a float32 one: the k-pair layout is made once (counted at
    the function that makes layouts, slowed so that the threads overlap),
    and each result is the plain weights' bit for bit."""
    w = rng.standard_normal((3, 64, 40)).astype(BF16)
    lhs = rng.standard_normal((30, 64)).astype(BF16)
    gs = np.array([10, 5, 15])
    made, real = [], _prepack._layout_of

    def slow_layout_of(packed, ctype):
        made.append(ctype)
        time.sleep(0.05)
        return real(packed, ctype)

    monkeypatch.setattr(_prepack, "_layout_of", slow_layout_of)
    with runtime.configured(kernel="amx-twin"):        # bfloat16 x bfloat16 on a k-pair layout, any CPU
        packed = raggeddot.prepack(w, lhs_dtype=np.float32)
        assert packed.ctype == "float32-bfloat16w"
        want = raggeddot.ragged_dot(lhs, w, gs)
        barrier, results, errors = threading.Barrier(4), [None] * 4, []

        def use(i):
            try:
                barrier.wait()
                results[i] = raggeddot.ragged_dot(lhs, packed, gs)
            except Exception as e:      # reported below
                errors.append(e)

        threads = [threading.Thread(target=use, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert made == ["bfloat16-dot"], made
    assert list(packed.layouts) == ["float32-bfloat16w", "bfloat16-dot"]
    for r in results:
        np.testing.assert_array_equal(r, want)


def _traced(fn):
    """(result of fn(), bytes it left allocated, as tracemalloc counts them)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = fn()
        return out, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def _weights(rng, kind):
    w = rng.standard_normal((4, 256, 512)).astype(np.float32)
    if kind == "mxfp4":
        return raggeddot.quantize(w, "mxfp4", channelwise_axes=(0, 2), tiled_axes={1: 32})
    if kind == "int8, scales every 32 along k":
        return raggeddot.quantize(w, "int8", channelwise_axes=(0, 2), tiled_axes={1: 32})
    if kind == "int8 per channel, zero points":
        return raggeddot.quantize(w, "int8", channelwise_axes=(0, 2), calibration_method="minmax")
    return w.astype(BF16) if kind == "bfloat16" else w


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "mxfp4", "int8, scales every 32 along k",
                                  "int8 per channel, zero points"])
def test_nbytes_is_what_is_held(rng, kind):
    """The bytes prepack leaves allocated equal ``nbytes`` (within the
    Python objects' few hundred bytes), the scales and zero points kept for
    unpack() included; a layout made later adds what ``layouts`` says."""
    w = _weights(rng, kind)
    packed, held = _traced(lambda: raggeddot.prepack(w))
    slack = 4096         # the Python objects around the arrays (the copies checked are 8-16 KiB)
    assert abs(held - packed.nbytes) <= slack, (held, packed.nbytes)
    assert packed.layouts == {packed.ctype: packed.nbytes}
    if kind.startswith("int8"):      # the copies of scales (and zero points) are there, and counted
        extra = w.scale.nbytes + (0 if w.zero_point is None else w.zero_point.nbytes)
        assert packed.nbytes - packed._buf.nbytes == extra
    lhs = rng.standard_normal((8, 256)).astype(np.float32)
    if kind == "bfloat16":   # a float32 lhs on k-pair weights, or a bfloat16 one on widening weights
        lhs = lhs if packed.ctype in ("bfloat16-dot", "bfloat16-mmla") else lhs.astype(BF16)
    elif kind.startswith("int8"):    # an int8 lhs: the int8 layout, or the QArray kept unpacked
        lhs = raggeddot.quantize(lhs, "int8", channelwise_axes=(0,))
    else:
        return
    out, grown = _traced(lambda: raggeddot.ragged_dot(lhs, packed, np.array([2, 2, 2, 2])))
    made = sum(packed.layouts.values()) - packed.nbytes
    assert made > 0 and abs(grown - out.nbytes - made) <= slack, (grown, out.nbytes, packed.layouts)


def test_mxfp4_nbytes_counts_its_exponent_copy(rng):
    """MXFP4 weights: 4 bits a weight and one exponent byte a column per 32
    in the panels, plus the e8m0 scales kept for unpack(): about 4.5 bits a
    weight in all (the panels alone are about 4.25)."""
    q = _weights(rng, "mxfp4")
    packed = raggeddot.prepack(q)
    assert packed.nbytes == packed._buf.nbytes + q.scale.nbytes
    bits = 8 * packed.nbytes / (4 * 256 * 512)
    assert 4.45 < bits < 4.6, bits


def _pairs():
    """(family that lays the weights out, family that runs them) for every
    runnable pair."""
    runnable = runtime.runnable_kernels()
    return [(a, b) for a in runnable for b in runnable if a != b]


CASES = {   # weights, prepack's lhs_dtype, the lhs they meet
    "float32": (lambda w: w, None, lambda x: x),
    "mxfp4": (lambda w: raggeddot.quantize(w, "mxfp4", channelwise_axes=(0, 2), tiled_axes={1: 32}), None,
              lambda x: x),
    "int8 for a float lhs": (lambda w: raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)), None, lambda x: x),
    "int8 for an int8 lhs": (lambda w: raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)), np.int8,
                             lambda x: raggeddot.quantize(x, "int8", channelwise_axes=(0,))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_another_kernel_family_names_the_function_and_argument(rng, case):
    """For every pair of runnable families: where the product runs on the
    weights' own layout and the second family lays it out in panels of
    another width (what prepack under it gives), each op raises naming
    itself, 'rhs' and the fix, and writes nothing into out=; elsewhere the
    op gives the plain weights' result."""
    make, lhs_dtype, as_lhs = CASES[case]
    w = make(rng.standard_normal((2, 64, 48)).astype(np.float32))
    x = as_lhs(rng.standard_normal((12, 64)).astype(np.float32))
    gs = np.array([5, 7])
    refused = 0
    for a, b in _pairs():
        with runtime.configured(kernel=a):
            packed = raggeddot.prepack(w, lhs_dtype=lhs_dtype)
        with runtime.configured(kernel=b):
            other = raggeddot.prepack(w, lhs_dtype=lhs_dtype)
            # the product runs on the weights' own layout (not one made for this lhs, not the
            # plain weights) and this family lays that layout out in panels of another width
            mismatch = _prepack._wanted(packed, x, False, False) == packed.ctype == other.ctype \
                and other.nr != packed.nr
            calls = {"ragged_dot": lambda **kw: raggeddot.ragged_dot(x, packed, gs, **kw),
                     "gmm": lambda **kw: raggeddot.gmm(x, packed, gs, **kw),
                     "ragged_dot_general": lambda **kw: raggeddot.ragged_dot_general(x, packed, gs, DN_RAGGED)}
            for fn, call in calls.items():
                if mismatch:
                    out = np.full((12, 48), 7, np.float32)
                    with pytest.raises(ValueError, match=rf"^{fn}: 'rhs' was prepacked for the {packed.kernel} "
                                                         r"kernels.*prepack the weights again"):
                        call(**({} if fn == "ragged_dot_general" else {"out": out}))
                    assert (out == 7).all()
                    refused += 1
                else:
                    np.testing.assert_array_equal(call(), raggeddot.ragged_dot(x, w, gs), err_msg=f"{a} -> {b}")
    if case == "int8 for an int8 lhs":     # amx-twin (32 columns) and avx-vnni-twin (16) run on any x86-64
        assert refused, "no pair of families here lays int8 dot-product weights out differently"


def test_moe_block_names_the_weight(rng):
    """moe_block with weights prepacked under a family whose panels another
    family cannot read: refused before the layer runs, naming the weight."""
    E, d, f = 4, 32, 48
    w0, w1 = (rng.standard_normal((E, d, f)).astype(np.float32) for _ in range(2))
    wo = rng.standard_normal((E, f, d)).astype(np.float32)
    x = rng.standard_normal((10, d)).astype(np.float32)
    router = rng.standard_normal((d, E)).astype(np.float32)
    q = [raggeddot.quantize(a, "int8", channelwise_axes=(0, 2)) for a in (w0, w1, wo)]
    tried = 0
    for a, b in _pairs():
        for weights, kw in (((w0, w1, wo), {}), (q, {"lhs_dtype": np.int8})):
            with runtime.configured(kernel=a):
                packed = [raggeddot.prepack(t, **kw) for t in weights]
            with runtime.configured(kernel=b):
                other = raggeddot.prepack(weights[0], **kw)
                # the layer runs on the weights' own layouts: float32 ones, or int8 dot-product ones
                # where this family has them (else quantized rows meet the plain QArrays)
                own = packed[0].ctype in ("float32", "int8-dot") and other.ctype == packed[0].ctype
                if not own or other.nr == packed[0].nr:
                    continue
                act = {"activation_qtype": "int8"} if kw else {}
                with pytest.raises(ValueError, match=rf"^moe_block: 'w0' was prepacked for the {packed[0].kernel} "
                                                     "kernels.*prepack the weights again"):
                    raggeddot.moe_block(x, router, *packed, top_k=2, **act)
                tried += 1
    assert tried


def test_copies_keep_the_layouts(rng):
    """copy.deepcopy and pickle of a PackedRhs (a model holding one is
    copied so): the same results, its own lock."""
    w = rng.standard_normal((2, 32, 16)).astype(np.float32)
    packed = raggeddot.prepack(raggeddot.quantize(w, "mxfp4", channelwise_axes=(0, 2), tiled_axes={1: 32}))
    x = rng.standard_normal((6, 32)).astype(np.float32)
    want = raggeddot.ragged_dot(x, packed, np.array([3, 3]))
    for c in (copy.deepcopy(packed), pickle.loads(pickle.dumps(packed))):
        assert c._lock is not packed._lock and c.nbytes == packed.nbytes
        np.testing.assert_array_equal(raggeddot.ragged_dot(x, c, np.array([3, 3])), want)

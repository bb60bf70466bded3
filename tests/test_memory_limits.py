"""Results and workspaces larger than the machine's memory raise MemoryError
before anything is allocated or touched (item 15), whatever the operating
system's overcommit policy: an overcommitting Linux grants any allocation
and ends the process when its pages are touched, so the size is compared
with the physical memory where the array is allocated."""
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

import raggeddot
from raggeddot import _core
from raggeddot import _validate as v
from raggeddot._moe import block, config


def test_physical_memory_is_known():
    assert v.physical_memory() > 2 ** 28


def test_a_result_buffer_beyond_memory_is_refused_before_allocation():
    limit = v.physical_memory()
    n = limit // 4 + 1024                       # a float32 array just past the machine's memory
    with pytest.raises(MemoryError, match=rf"^cannot allocate {4 * n} bytes .*shape \({n},\) and dtype "
                                          r"float32: more than this machine's memory \(\d+ bytes\)$"):
        _core.empty((n,), np.dtype(np.float32))
    # a result of that size in an op: named, refused the same way
    rows = np.broadcast_to(np.zeros((1, 1), np.float32), (n // 1024 + 1, 1))
    with pytest.raises(MemoryError, match=r"^ragged_dot: out of memory for the result \[m, n\].*more than "
                                          r"this machine's memory"):
        raggeddot.ragged_dot(rows, np.zeros((1, 1, 1024), np.float32), np.array([rows.shape[0]]))


def test_moe_block_checks_its_activations_first(monkeypatch):
    """A layer whose activations do not fit raises before the router runs:
    nothing of their size is allocated (a machine of 64 MiB here)."""
    monkeypatch.setattr(v, "_PHYSICAL", 64 << 20)
    T = 2 ** 23
    x = np.broadcast_to(np.zeros(4, np.float32), (T, 4))
    w = np.zeros((4, 4, 3), np.float32)
    args = (x, np.zeros((4, 4), np.float32), w, w, np.zeros((4, 3, 4), np.float32))
    tracemalloc.start()
    try:
        for call in (raggeddot.moe_block, raggeddot.moe_block_vjp):
            name = call.__name__
            with pytest.raises(MemoryError, match=rf"^{name}: out of memory for the layer's activations.*"
                                                  rf"shape \({T}, 4\) and dtype float32: more than this "
                                                  r"machine's memory"):
                call(*args, top_k=2)
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()
    # activations that fit one by one but not together are refused too
    T = 2 ** 20
    x = np.broadcast_to(np.zeros(4, np.float32), (T, 4))
    with pytest.raises(MemoryError, match=r"^moe_block: out of memory.*together"):
        raggeddot.moe_block(x, *args[1:], top_k=2)


def test_moe_block_counts_what_its_forward_allocates(rng, monkeypatch):
    """The forward alone (moe_block) reads the tokens through the dispatch's
    index and never stores the gate and up products whole, so its pre-check
    counts only what it allocates: a layer that fits that way runs under a
    memory too small for the forward that keeps its residuals (the vjp's),
    which is refused; and what the forward allocates (traced) stays within
    its count."""
    T, d, f, E = 4096, 64, 256, 4
    x = rng.standard_normal((T, d)).astype(np.float32)
    router = rng.standard_normal((d, E)).astype(np.float32)
    w0, w1 = (rng.standard_normal((E, d, f)).astype(np.float32) for _ in range(2))
    wo = rng.standard_normal((E, f, d)).astype(np.float32)
    args = (x, router, w0, w1, wo)
    counted = {}
    check = v.check_fits

    def spy(arrays):
        counted.setdefault(spy.fn, sum(int(np.prod(s)) * np.dtype(t).itemsize for s, t in arrays))
        return check(arrays)
    monkeypatch.setattr(v, "check_fits", spy)
    monkeypatch.setattr(block, "activations_bound", lambda layer: float("inf"))     # (count them)
    for spy.fn in ("moe_block", "moe_block_vjp"):
        getattr(raggeddot, spy.fn)(*args, top_k=2)
    lean, kept = counted["moe_block"], counted["moe_block_vjp"]
    assert lean < 0.5 * kept     # h0, h1 and the dispatched rows not counted
    want = raggeddot.moe_block(*args, top_k=2)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        raggeddot.moe_block(*args, top_k=2)
        assert tracemalloc.get_traced_memory()[1] <= lean + (1 << 20)
    finally:
        tracemalloc.stop()
    monkeypatch.setattr(v, "_PHYSICAL", (lean + kept) // 2)
    assert np.array_equal(raggeddot.moe_block(*args, top_k=2), want)
    with pytest.raises(MemoryError, match=r"^moe_block_vjp: out of memory for the layer's activations"):
        raggeddot.moe_block_vjp(*args, top_k=2)


@pytest.mark.parametrize("dtype, kw", [("float32", {}), ("float32", {"activation_qtype": "int8"}),
                                       ("float32", {"router_weights_on": "input"}),
                                       ("float32", {"shared": True}), ("bfloat16", {}), ("float64", {})])
def test_the_activations_bound_holds_every_branch(rng, dtype, kw):
    """The bound a layer far below the memory is let through by (a decode
    step, without following the forward's branches) is at least what those
    branches count, the forward's and the vjp's."""
    dt = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    T, d, f, E = 37, 24, 40, 6
    x = rng.standard_normal((T, d)).astype(dt)
    ws = [rng.standard_normal(s).astype(dt) for s in ((E, d, f), (E, d, f), (E, f, d))]
    opts = dict(top_k=3, score_func="softmax", router_bias=None, selection_bias=None, n_groups=None,
                topk_groups=None, norm_topk_prob=False, routed_scaling_factor=1.0, activation="silu",
                w0_bias=None, w1_bias=None, wo_bias=None, capacity_factor=None, weights_layout="edf",
                swiglu_limit=7.0, activation_qtype=kw.get("activation_qtype"),
                router_weights_on=kw.get("router_weights_on", "output"),
                shared_experts=(ws[0][0], ws[1][0], ws[2][0]) if kw.get("shared") else None)
    layer = config.prepare(x, rng.standard_normal((d, E)).astype(dt), *ws, **opts)
    for keep in (False, True):
        counted = sum(int(np.prod(s)) * np.dtype(t).itemsize for s, t in block.activations(layer, keep))
        assert 0 < counted <= block.activations_bound(layer)


def test_w8a8_moe_block_counts_what_its_forward_allocates(rng, monkeypatch):
    """With int8 weights and activation_qtype="int8" the kernels quantize
    the rows while they pack them (no int8 copies) and the gate and up
    products run as one pass (h0 and h1 not stored): the forward's
    pre-check counts what it allocates, not those arrays."""
    if not raggeddot.runtime.build_info()["products"]["int8"]["compute"].startswith("int8-"):
        pytest.skip("no int8 dot products on this CPU: the rows are quantized by quantize()")
    T, d, f, E = 4096, 64, 256, 4
    x = rng.standard_normal((T, d)).astype(np.float32)
    router = rng.standard_normal((d, E)).astype(np.float32)
    ws = [raggeddot.quantize(rng.standard_normal(s).astype(np.float32), "int8", channelwise_axes=(0, 2))
          for s in ((E, d, f), (E, d, f), (E, f, d))]
    counted = []
    check = v.check_fits

    def spy(arrays):
        counted.append(sum(int(np.prod(s)) * np.dtype(t).itemsize for s, t in arrays))
        return check(arrays)
    monkeypatch.setattr(v, "check_fits", spy)
    monkeypatch.setattr(block, "activations_bound", lambda layer: float("inf"))
    raggeddot.moe_block(x, router, *ws, top_k=2, activation_qtype="int8")
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        raggeddot.moe_block(x, router, *ws, top_k=2, activation_qtype="int8")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    N = 2 * T
    assert peak <= counted[0] + (1 << 20)
    assert counted[0] < peak + N * f * 4, (counted[0], peak)     # not h0 and h1, nor int8 copies

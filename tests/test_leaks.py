"""No leaks on any path, errors included: 4000 calls of each entry point
(RAGGEDDOT_LEAK_CALLS to change it; the composite ones that call several
entry points each run a fifth of that) must not grow the heap (glibc's
count of allocated bytes, which sees the C library's mallocs), the RSS, the
memory tracemalloc sees, the number of live Python objects, or the
reference counts of the arguments, beyond small stated bounds.

The traced memory counted is what this process's own calls allocate:
allocations made from the test runner's machinery (pytest, and the
threads of pytest-xdist's worker channel, which run beside the test)
are filtered out."""
import ctypes
import gc
import os
import sys
import tracemalloc

import numpy as np
import pytest

import raggeddot
from raggeddot import _core

CALLS = int(os.environ.get("RAGGEDDOT_LEAK_CALLS", "4000"))
RSS_BOUND = 4 << 20          # bytes of RSS growth allowed over all the calls
HEAP_BOUND = 64 << 10        # bytes of malloc'ed heap growth allowed (16 bytes a call)
TRACED_BOUND = 64 << 10      # bytes of traced Python memory growth allowed
COMPOSITE = {"moe_block_vjp", "vjp", "ragged_dot_general", "moe_block"}


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


try:
    _mallinfo2 = ctypes.CDLL(None).mallinfo2
    _mallinfo2.restype = _Mallinfo2
except AttributeError:  # not glibc >= 2.33
    _mallinfo2 = None


def _heap():
    """Bytes in use from malloc: small blocks and mmapped large ones."""
    if _mallinfo2 is None:
        return 0
    info = _mallinfo2()
    return info.uordblks + info.hblkhd

rng = np.random.default_rng(7)
LHS = rng.standard_normal((24, 8)).astype(np.float32)
RHS = rng.standard_normal((3, 8, 5)).astype(np.float32)
GS = np.array([10, 0, 9])
CT = rng.standard_normal((24, 5)).astype(np.float32)
BOUNDS = np.array([0, 10, 10, 19], dtype=np.int64)
X = rng.standard_normal((6, 4))
MOE = (X, rng.standard_normal((4, 3)), rng.standard_normal((3, 4, 5)),
       rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 4)))
DN = raggeddot.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), (0,), (0,))


def _moe_vjp():
    out, fn = raggeddot.moe_block_vjp(*MOE, top_k=2)
    return fn(np.ones_like(out))


def _rd_vjp():
    out, fn = raggeddot.vjp(raggeddot.ragged_dot, LHS, RHS, GS)
    return fn(CT)


CALLS_OK = {
    "ragged_dot": lambda: raggeddot.ragged_dot(LHS, RHS, GS),
    "ragged_dot_out": lambda: raggeddot.ragged_dot(LHS, RHS, GS, out=np.empty((24, 5), np.float32)),
    "ragged_dot_general": lambda: raggeddot.ragged_dot_general(LHS, RHS, GS, DN),
    "gmm": lambda: raggeddot.gmm(LHS, RHS, GS, transpose_rhs=False),
    "tgmm": lambda: raggeddot.tgmm(LHS.T, CT, GS),
    "vjp": _rd_vjp,
    "metadata": lambda: raggeddot.make_group_metadata(group_sizes=GS, m=24, tm=8),
    "moe_block": lambda: raggeddot.moe_block(*MOE, top_k=2),
    "moe_block_vjp": _moe_vjp,
    "gather": lambda: raggeddot.ragged_gather(X, np.array([0, 5, 5])),
    "gather_reduce": lambda: raggeddot.ragged_gather_reduce(X, np.array([[0, -1], [3, 2]])),
    "core.ragged_rows": lambda: _core.ragged_rows(LHS, RHS, BOUNDS, np.empty((24, 5), np.float32), False),
    "core.ragged_contract": lambda: _core.ragged_contract(LHS.T, CT, BOUNDS, np.empty((3, 8, 5), np.float32),
                                                          False),
    "core.moe_route": lambda: _core.moe_route(X @ MOE[1], 0, None, 1, 1, 2, True, 1.0),
    "core.moe_sort": lambda: _core.moe_sort(np.array([[0, 2], [1, 2]]), 3, -1),
    "core.gated_act_grad": lambda: _core.gated_act_grad(X, X, X, 4, 7.0),
    "core.empty": lambda: _core.empty((100, 10), np.dtype(np.float64)),
    "core.empty_large": lambda: _core.empty((1 << 20,), np.dtype(np.float64)),
    "build_info": raggeddot.build_info,
}

CALLS_ERR = {
    "ragged_dot_bad_sizes": (lambda: raggeddot.ragged_dot(LHS, RHS, np.array([30, 0, 0])), ValueError),
    "ragged_dot_bad_dtype": (lambda: raggeddot.ragged_dot(LHS.astype(np.int8), RHS, GS), TypeError),
    "tgmm_bad_out": (lambda: raggeddot.tgmm(LHS.T, CT, GS, out=np.empty((2, 2))), ValueError),
    "moe_bad_topk": (lambda: raggeddot.moe_block(*MOE, top_k=7), ValueError),
    "gather_bad_index": (lambda: raggeddot.ragged_gather(X, np.array([9])), ValueError),
    "core.ragged_rows_bounds": (lambda: _core.ragged_rows(LHS, RHS, np.array([0, 30, 30, 30]),
                                                          np.empty((24, 5), np.float32), False), ValueError),
    "core.ragged_rows_dtype": (lambda: _core.ragged_rows(LHS, RHS.astype(np.float64), BOUNDS,
                                                         np.empty((24, 5), np.float32), False), TypeError),
    "core.gather_rows_index": (lambda: _core.gather_rows(X, np.array([9]), None), ValueError),
    "core.moe_sort_index": (lambda: _core.moe_sort(np.array([[5]]), 3, -1), ValueError),
    "core.empty_huge": (lambda: _core.empty((1 << 62, 1 << 62), np.dtype(np.float32)), MemoryError),
    "core.set_kernel": (lambda: _core.set_kernel("nope"), ValueError),
}


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_RUNNER = [tracemalloc.Filter(False, pattern) for pattern in
           ("*/_pytest/*", "*/pluggy/*", "*/execnet/*", "*/xdist/*", "*/threading.py",
            "*/queue.py", "*/socket.py", "*/selectors.py", "*/pickle.py", "*/tracemalloc.py")]


def _traced():
    """Bytes tracemalloc sees allocated now, less the test runner's own."""
    snap = tracemalloc.take_snapshot().filter_traces(_RUNNER)
    return sum(stat.size for stat in snap.statistics("filename"))


def _run(fn, exc, n):
    if exc is None:
        for _ in range(n):
            fn()
    else:
        for _ in range(n):
            try:
                fn()
            except exc:
                pass
            else:
                raise AssertionError("the call did not raise")


@pytest.mark.parametrize("name", sorted(CALLS_OK) + sorted(CALLS_ERR))
def test_no_growth_over_many_calls(name):
    fn, exc = (CALLS_OK[name], None) if name in CALLS_OK else CALLS_ERR[name]
    calls = CALLS // 5 if name in COMPOSITE else CALLS
    args = (LHS, RHS, GS, CT, BOUNDS, X) + MOE
    _run(fn, exc, 300)                            # warm-up: caches, pools, first-call setup
    gc.collect()    # (garbage of earlier tests may hold references to the arguments)
    refs = [sys.getrefcount(a) for a in args]
    # Two halves: a leak grows the memory in both; a one-time growth (an
    # allocator's arena, an interned string) shows in one half only.
    growth = []
    for _ in range(2):
        gc.collect()
        objects, rss, heap = len(gc.get_objects()), _rss(), _heap()
        _run(fn, exc, calls // 2)
        gc.collect()
        growth.append((len(gc.get_objects()) - objects, _heap() - heap, _rss() - rss))
    objs, heap_growth, rss_growth = (min(g[i] for g in growth) for i in range(3))
    assert objs <= 10, f"live Python objects grew by {growth} over two halves of {calls} calls"
    assert heap_growth <= HEAP_BOUND // 2, f"the heap grew in both halves of {calls} calls: {growth}"
    assert rss_growth <= RSS_BOUND // 2, f"RSS grew in both halves of {calls} calls: {growth}"
    after = [sys.getrefcount(a) for a in args]
    assert after == refs, f"an argument's reference count changed: {refs} -> {after}"
    tracemalloc.start()
    try:
        _run(fn, exc, 50)
        gc.collect()
        base = _traced()
        _run(fn, exc, max(calls // 10, 100))
        gc.collect()
        traced_growth = _traced() - base
    finally:
        tracemalloc.stop()
    assert traced_growth <= TRACED_BOUND, f"traced memory grew by {traced_growth} bytes"

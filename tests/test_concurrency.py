"""Concurrent callers: Python threads calling the ops at once, the GIL
released during a call, settings changed while others compute, and fork
after use."""
import multiprocessing
import threading
import time

import numpy as np
import pytest

import raggeddot
from raggeddot import runtime


def _problems(rng):
    """Different shapes per op: (name, fn) pairs computing one result each."""
    out = []
    for i in range(8):
        m, k, n, g = 64 + 37 * i, 48 + 11 * i, 40 + 13 * i, 3 + i % 4
        lhs = rng.standard_normal((m, k)).astype(np.float32)
        rhs = rng.standard_normal((g, k, n)).astype(np.float32)
        gs = np.diff(np.linspace(0, m - i, g + 1).astype(np.int64))
        ct = rng.standard_normal((m, n)).astype(np.float32)
        x = rng.standard_normal((20 + i, 16))
        moe = (x, rng.standard_normal((16, 6)), rng.standard_normal((6, 16, 24)),
               rng.standard_normal((6, 16, 24)), rng.standard_normal((6, 24, 16)))
        out.append((f"ragged_dot-{i}", lambda l=lhs, r=rhs, s=gs: raggeddot.ragged_dot(l, r, s)))
        out.append((f"tgmm-{i}", lambda l=lhs, c=ct, s=gs: raggeddot.tgmm(l.T, c, s)))
        out.append((f"moe-{i}", lambda a=moe: raggeddot.moe_block(*a, top_k=2)))
    return out


def _run_threads(problems, threads=8, rounds=3):
    """Every problem computed `rounds` times by `threads` Python threads at
    once; returns {name: [results]}."""
    results = {name: [] for name, _ in problems}
    lock = threading.Lock()
    errors = []
    barrier = threading.Barrier(threads)

    def worker(w):
        try:
            barrier.wait()
            for r in range(rounds):
                for j, (name, fn) in enumerate(problems):
                    if (j + w + r) % threads == 0:
                        res = fn()
                        with lock:
                            results[name].append(res)
        except Exception as e:  # reported below, not swallowed
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    return results


def test_eight_threads_give_the_serial_results_bitwise(rng):
    problems = _problems(rng)
    serial = {name: fn() for name, fn in problems}
    results = _run_threads(problems)
    for name, got in results.items():
        assert got, name
        for res in got:
            assert np.array_equal(res, serial[name]), name


def test_the_gil_is_released_during_a_call(rng):
    lhs = rng.standard_normal((4096, 1024)).astype(np.float32)
    rhs = rng.standard_normal((8, 1024, 1024)).astype(np.float32)
    gs = np.full(8, 512)
    done = threading.Event()
    ticks = []

    def count():
        while not done.is_set():
            ticks.append(time.perf_counter())

    t = threading.Thread(target=count)
    t.start()
    start = time.perf_counter()
    raggeddot.ragged_dot(lhs, rhs, gs)
    end = time.perf_counter()
    done.set()
    t.join()
    during = [x for x in ticks if start < x < end]
    # a Python thread holding no lock makes steady progress while the call runs
    assert end - start > 0.02
    assert len(during) > 1000


def test_settings_changed_while_others_compute(rng):
    """Kernel, thread count, blocking and buffer cache changed in a loop
    while eight threads compute: every result is one of the results the
    settings in force at some call's start would give, and nothing crashes."""
    lhs = rng.standard_normal((700, 300)).astype(np.float32)
    rhs = rng.standard_normal((5, 300, 130)).astype(np.float32)
    gs = np.array([100, 0, 250, 150, 150])
    kernels = runtime.runnable_kernels()
    allowed = []
    with runtime.configured():
        for kernel in kernels:
            runtime.set_kernel(kernel)
            allowed.append(raggeddot.ragged_dot(lhs, rhs, gs))
            runtime.set_blocking("float32", 48, 64, 256)
            allowed.append(raggeddot.ragged_dot(lhs, rhs, gs))
        stop = threading.Event()

        def churn():
            i = 0
            while not stop.is_set():
                runtime.set_kernel(kernels[i % len(kernels)])
                if i % 2:
                    runtime.set_blocking("float32", 48, 64, 256)
                runtime.set_num_threads(1 + i % 3)
                runtime.set_buffer_cache((i % 2) << 30)
                i += 1
                time.sleep(0.0005)

        changer = threading.Thread(target=churn)
        changer.start()
        try:
            results = _run_threads([("rd", lambda: raggeddot.ragged_dot(lhs, rhs, gs))], rounds=10)
        finally:
            stop.set()
            changer.join()
    assert len(results["rd"]) == 10
    for res in results["rd"]:
        assert any(np.array_equal(res, a) for a in allowed)


def _child(q, lhs, rhs, gs):
    raggeddot.set_num_threads(2)
    q.put((raggeddot.ragged_dot(lhs, rhs, gs), raggeddot.get_num_threads(),
           raggeddot.build_info()["forked_single_threaded"]))


# forking a process that ran threads is what this test checks (Python 3.12+
# warns of it in general)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_fork_after_use(rng):
    """GNU OpenMP's threads do not survive fork: a child forked after the
    parent ran threads computes single-threaded (same results) instead of
    waiting forever for a thread team."""
    lhs = rng.standard_normal((2000, 512)).astype(np.float32)
    rhs = rng.standard_normal((4, 512, 256)).astype(np.float32)
    gs = np.full(4, 500)
    with runtime.configured(num_threads=2):
        want = raggeddot.ragged_dot(lhs, rhs, gs)
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_child, args=(q, lhs, rhs, gs))
        p.start()
        try:
            got, threads, forked = q.get(timeout=60)
        finally:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert p.exitcode == 0
    assert np.array_equal(got, want)
    assert forked == runtime.build_info()["openmp"]
    assert threads == (1 if forked else raggeddot.get_num_threads())
    assert not runtime.build_info()["forked_single_threaded"]

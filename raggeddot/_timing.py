"""How raggeddot times things: one module for the plan tuner (raggeddot.tune) and the
benchmark runners, so that a figure in a benchmark table and a score in a tuning table mean
the same.

Machines are shared and drift: a score is the median of several calls after warm-up, and
variants compared with each other are timed in interleaved rounds (each round calls every
variant once), so that a drift of the machine's load weighs on all of them alike.
"""
from __future__ import annotations

import math
import statistics
import time

__all__ = ["call_time", "measure", "interleaved", "summary"]


def call_time(fn, sync=None):
    """(result, seconds) of one call of fn(); sync(result) waits for asynchronous work."""
    t0 = time.perf_counter()
    r = fn()
    if sync is not None:
        sync(r)
    return r, time.perf_counter() - t0


def measure(fn, *, sync=None, warmup=1, min_runs=3, max_runs=50, target_s=0.2, first_s=None):
    """Seconds of each timed call of fn(): `warmup` calls first, then as many calls as fill
    about `target_s` seconds (at least `min_runs`, at most `max_runs`), estimated from the
    last warm-up call (or from `first_s`, the time of a call already made, without warm-up)."""
    est = first_s
    for _ in range(warmup if first_s is None else 0):
        est = call_time(fn, sync)[1]
    if est is None:
        est = call_time(fn, sync)[1]
    runs = max(min_runs, min(max_runs, math.ceil(target_s / max(est, 1e-9))))
    return [call_time(fn, sync)[1] for _ in range(runs)]


def interleaved(fns, *, rounds=5, warmup=1, pause_s=0.0, sync=None, before=None):
    """{name: [seconds per round]} for the callables of the dict `fns`, timed in `rounds`
    rounds of one call each after `warmup` calls each; `pause_s` before every timed call lets
    the previous call's worker threads go idle (a spinning thread pool, as torch's), then one
    untimed call wakes this variant's threads and cores (measured on a shared 2-core Zen4
    host: the first call after an idle 0.2 s took up to 8 ms longer, at random, for every
    variant), and `before(name)`, when given, is called before every call of fns[name],
    outside the timing (to switch a setting the variants share)."""
    def call(name, fn):
        if before is not None:
            before(name)
        return call_time(fn, sync)[1]

    for name, fn in fns.items():
        for _ in range(warmup):
            call(name, fn)
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            if pause_s:
                time.sleep(pause_s)
                call(name, fn)
            times[name].append(call(name, fn))
    return times


def summary(samples):
    """{'median', 'min', 'spread', 'runs'} of a list of seconds; spread is the interquartile
    range over the median (0 for fewer than 4 samples' worth of spread), the noise measure."""
    s = sorted(samples)
    med = statistics.median(s)
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4)
        spread = (q[2] - q[0]) / med if med > 0 else 0.0
    else:
        spread = (s[-1] - s[0]) / med if med > 0 and len(s) > 1 else 0.0
    return {"median": med, "min": s[0], "spread": spread, "runs": len(s)}

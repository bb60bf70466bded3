"""Tuning the plans of grouped products by timing them: ``tune`` and ``tabulate``.

Every grouped product (ragged_dot, gmm, tgmm, the products of moe_block and of the
gradients) asks the C library's plan table how to run: which register block, what cache
blocking, which tiles, how many threads. The table is keyed by a *shape class*
``(op, ctype, family, k, n, g, bucket, threads)``; a class without an entry runs the
built-in choice (``_core.plan_default``). ``tune`` fills the table for the classes a
function's products fall in, by timing the function under each candidate plan.
"""
import functools
import itertools
import sys
import threading
import warnings

from . import _plans, _timing
from . import _validate as v

__all__ = ["tune", "tabulate", "Tuned", "Table"]

_lock = threading.RLock()   # one tuning at a time: the table and the record log are process-wide


def _check_hyperparams(hyperparams, fn):
    if hyperparams is None:
        return None
    if not isinstance(hyperparams, dict):
        raise TypeError(f"{fn}: 'hyperparams' must be None or a dict {{plan key: [values]}}, "
                        f"got {v.received(hyperparams)}")
    out = {}
    for key, values in hyperparams.items():
        if key not in _plans.PLAN_KEYS:
            raise ValueError(f"{fn}: 'hyperparams' has the key {key!r}, which is not a plan key; "
                             f"expected some of {_plans.PLAN_KEYS}")
        if not isinstance(values, (list, tuple)):
            raise TypeError(f"{fn}: 'hyperparams[{key!r}]' must be a list of values, got {v.received(values)}")
        if not values:
            raise ValueError(f"{fn}: 'hyperparams[{key!r}]' is empty: give at least one value")
        out[key] = list(values)
    return out


def candidates(cls, hyperparams=None):
    """The plans timed for class ``cls`` (settable keys only, no duplicates): without
    ``hyperparams``, ``_core.plan_candidates(cls)`` (the default plan first); with them,
    the cartesian product of their values, each over the default plan (keys not given keep
    the default's values), the default first when it is among them."""
    default = _plans.settable(_plans.plan_default(cls))
    if hyperparams is None:
        pool = [_plans.settable(p) for p in _plans.plan_candidates(cls)]
    else:
        keys = list(hyperparams)
        pool = [dict(default, **dict(zip(keys, values)))
                for values in itertools.product(*(hyperparams[k] for k in keys))]
    out = []
    for plan in pool:
        if plan not in out:
            out.append(plan)
    if default in out:
        out.remove(default)
        out.insert(0, default)
    return out


class _Progress:
    """tqdm's bar when tqdm is importable, else a one-line counter on stderr; silent when off."""

    def __init__(self, total, desc, enabled):
        self.n, self.total, self.desc, self.bar = 0, total, desc, None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                self._line()
            else:
                self.bar = tqdm(total=total, desc=desc, leave=False, file=sys.stderr)

    def _line(self):
        sys.stderr.write(f"\r{self.desc}: {self.n}/{self.total}")
        sys.stderr.flush()

    def update(self):
        self.n += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            self._line()

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _describe(cls):
    return " ".join(f"{name}={value}" for name, value in zip(_plans.CLASS_FIELDS, cls))


class Tuned:
    """A function wrapped by :func:`tune`: calls it, tuning the plans of the classes its
    grouped products fall in the first time each is seen. ``results`` maps each class this
    wrapper tuned to its rows (see :func:`tabulate`); ``classes`` lists the classes of the
    last call's products; ``__wrapped__`` is the function."""

    def __init__(self, fn, hyperparams, repeats, progress, persist):
        functools.update_wrapper(self, fn)
        self.hyperparams, self.repeats = hyperparams, repeats
        self.progress, self.persist = progress, persist
        self.results, self.classes = {}, []

    def __call__(self, *args, **kwargs):
        fn = self.__wrapped__
        with _lock:
            _plans.plan_record(True)
            try:
                result = fn(*args, **kwargs)
            finally:
                classes = _plans.plan_record(False)
            self.classes = [tuple(c) for c in classes]
            todo = [c for c in self.classes if c not in _plans.tuned and c not in _plans.loaded]
            done = [c for c in todo if self._tune_class(c, lambda: fn(*args, **kwargs))]
            if done and self.persist:
                _plans.save(done)
        return result

    def _tune_class(self, cls, call):
        """Time ``call`` under each candidate plan of ``cls``, leave the fastest in the
        table; False (the table as it was) when every candidate failed."""
        previous = _plans.plan_get(cls)
        previous = None if previous is None else _plans.settable(previous)
        default = _plans.settable(_plans.plan_default(cls))
        plans = candidates(cls, self.hyperparams)
        rows = [{"class": cls, "plan": plan, "median": None, "spread": None, "chosen": False, "error": None}
                for plan in plans]
        bar = _Progress(len(plans) * (self.repeats + 1), f"tuning {_describe(cls)}", self.progress)

        def use(i):
            _plans.plan_set(cls, plans[i])
            bar.update()

        try:
            # a warm-up call under each plan drops those that fail; the others are timed in
            # interleaved rounds, so that a drift of the machine's load weighs on all alike
            ok = {}
            for i, row in enumerate(rows):
                try:
                    use(i)
                    call()
                    ok[i] = call
                except Exception as e:     # a plan the library refuses, or a call that fails under it
                    row["error"] = f"{type(e).__name__}: {e}"
            if ok:
                times = _timing.interleaved(ok, rounds=self.repeats, warmup=0, before=use)
                for i, samples in times.items():
                    stats = _timing.summary(samples)
                    rows[i]["median"], rows[i]["spread"] = stats["median"], stats["spread"]
        finally:
            bar.close()
            _plans.plan_set(cls, previous)
        timed = [r for r in rows if r["error"] is None]
        self.results[cls] = rows
        if not timed:
            warnings.warn(f"tune: every candidate plan of class {cls} failed; the class keeps its plan "
                          f"(first error: {rows[0]['error'] if rows else 'no candidates'})", RuntimeWarning,
                          stacklevel=3)
            return False
        best = min(timed, key=lambda r: (r["median"], r["plan"] != default))   # ties: the default
        best["chosen"] = True
        _plans.plan_set(cls, best["plan"])
        _plans.tuned.add(cls)
        return True


def tune(fn, hyperparams=None, *, repeats=5, progress=True, persist=True):
    """A wrapper of ``fn`` that tunes the plans of its grouped products, then calls it as is.

    A call ``wrapper(*args, **kwargs)`` runs ``fn(*args, **kwargs)`` once while recording the
    shape classes ``(op, ctype, family, k, n, g, bucket, threads)`` of the grouped products
    it makes, then tunes each class not tuned before (in this process, by any wrapper, or
    loaded from the plans file at import), independently, one after another: each
    candidate plan in turn is set as the class's table entry (other classes' entries as
    they are) for one warm-up call of ``fn(*args, **kwargs)``, then the candidates are
    timed in ``repeats`` interleaved rounds of one call each, and each scores the median of
    its calls (``raggeddot._timing``). Candidates that raise are dropped. The
    fastest plan (on a tie, the default plan) becomes the class's entry, used by every later
    grouped product of that class in this process, and, with ``persist``, written to the
    plans file of this CPU and build under $RAGGEDDOT_CACHE_DIR (default
    ~/.cache/raggeddot), which later processes load when raggeddot is imported. Later calls
    of classes already tuned run ``fn`` once, untimed. The wrapper returns ``fn``'s result
    of the recorded call; the timing rows are kept for :func:`tabulate`.

    ``fn`` is called ``1 + candidates * (repeats + 1)`` times per new class, so it should
    have no side effects beyond its result. The record and the table are process-wide:
    products other threads make while ``fn`` runs are recorded too.

    Args:
      fn: a callable making grouped products (any raggeddot op).
      hyperparams: None, to time ``_core.plan_candidates(cls)`` (the default plan first), or
        a dict ``{plan key: [values]}`` over the keys ``kernel`` ('main', or 'stream' where
        the family has a streaming kernel, or 'vector' for a tile class: the vector kernels
        instead of AMX tiles), ``mc``, ``kc``, ``nc``, ``tm``, ``tn``,
        ``threads`` (0: automatic), ``split`` ('m', 'n') and ``team`` (0, 1): the candidates are then the cartesian product of the given values, each over
        the default plan (keys not given keep its values). This restricts the search (one
        value: that value only) or extends it to values plan_candidates would not try.
      repeats: timed calls per candidate, >= 1.
      progress: show a progress bar (tqdm when importable, else a line on stderr).
      persist: write the tuned plans to the plans file.

    Returns:
      a :class:`Tuned` callable.
    """
    name = "tune"
    if not callable(fn):
        raise TypeError(f"{name}: 'fn' must be callable, got {v.received(fn)}")
    hyperparams = _check_hyperparams(hyperparams, name)
    repeats = v.index(repeats, "repeats", name)
    if repeats < 1:
        raise ValueError(f"{name}: 'repeats' must be >= 1, got {repeats}")
    for flag, value in (("progress", progress), ("persist", persist)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: '{flag}' must be a bool, got {v.received(value)}")
    return Tuned(fn, hyperparams, repeats, progress, persist)


class Table:
    """The timing rows of a tuned function: ``rows`` is a list of dicts ``{'class': the
    class tuple, 'plan': the candidate's plan dict, 'median': seconds or None, 'spread':
    interquartile range over the median or None, 'chosen': bool, 'error': None or why the
    candidate failed}``; ``str()`` is an aligned text table, one line a row."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __str__(self):
        head = list(_plans.CLASS_FIELDS) + [f"plan.{k}" for k in _plans.PLAN_KEYS] + ["median ms", "spread",
                                                                                     "chosen", "error"]
        lines = [head]
        for r in self.rows:
            timing = ([f"{r['median'] * 1e3:.3f}", f"{r['spread']:.2f}"] if r["error"] is None else ["-", "-"])
            lines.append([str(x) for x in r["class"]] + [str(r["plan"].get(k, "")) for k in _plans.PLAN_KEYS]
                         + timing + ["*" if r["chosen"] else "", r["error"] or ""])
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        left = {0, 1, 2, len(head) - 1}     # the names and the error text; numbers to the right
        text = ["  ".join(cell.ljust(w) if i in left else cell.rjust(w)
                          for i, (cell, w) in enumerate(zip(line, widths))).rstrip() for line in lines]
        return "\n".join(text)

    __repr__ = __str__


def tabulate(tuned):
    """The :class:`Table` of the candidates ``tuned`` (a :func:`tune` wrapper) timed: one
    row per (class, candidate plan), classes in the order they were tuned."""
    if not isinstance(tuned, Tuned):
        raise TypeError(f"tabulate: 'tuned' must be a function returned by raggeddot.tune, got {v.received(tuned)}")
    return Table([row for rows in tuned.results.values() for row in rows])

"""python -m raggeddot: check raggeddot on the specs tagged 'main' (raggeddot.specs) and
time it against a NumPy per-group loop.

Each spec is first checked against the pure-NumPy oracle (raggeddot.reference): every
output within max |out - ref| / max |ref| <= 1e-4 (float32) or 1e-10 (float64). A spec
that fails is not timed. raggeddot and the loop are timed in interleaved rounds (each round
calls both once, after a warm-up), so that a change of the machine's load weighs on both
alike; times are medians of the rounds. A warning line says when the machine is loaded
(a load average above half its cores, at the start or the end): its times are then not
to be trusted. The run ends with a line "N passed, M failed" and exits with status 1 when a
check failed.

"python -m raggeddot tune --spec NAME ..." tunes the plans of named ragged_dot specs
instead (see "python -m raggeddot tune --help").
"""
import argparse
import gc
import os
import sys

import numpy as np

import raggeddot
from raggeddot import _timing, runtime, specs

MAIN_OPS = ("ragged_dot", "backward")


def _progress(items, desc):
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, leave=False, file=sys.stderr)


def _median_times(fns, budget):
    """{name: median seconds} of the callables ``fns`` timed in interleaved
    rounds (each round calls every one once, after a warm-up call each), as
    many rounds as fill about `budget` seconds (3 to 50)."""
    first = {name: _timing.call_time(fn)[1] for name, fn in fns.items()}   # (the warm-up)
    rounds = max(3, min(50, int(budget / max(sum(first.values()), 1e-9))))
    times = _timing.interleaved(fns, rounds=rounds, warmup=0)
    return {name: _timing.summary(t)["median"] for name, t in times.items()}


def _cores():
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_warning():
    """A warning line when the machine is loaded (the load average of the
    last minute above half the cores this process may use: other work then
    competes with the timed calls), else None."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = os.cpu_count() or 1
    if load <= 0.5 * cores:
        return None
    return (f"warning: the machine is loaded (load average {load:.1f} over the last minute, {cores} cores, "
            f"{_cores()} for this process): other work competes with the timed calls, so the times and "
            "'vs loop' are not to be trusted; rerun on an idle machine")


def _flops(spec, inputs):
    """2 * sum(group_sizes) * k * n per product; the backward step makes three."""
    k, n = inputs["rhs"].shape[1:]
    return 2.0 * float(np.sum(inputs["group_sizes"])) * k * n * (3 if spec.op == "backward" else 1)


def run_spec(spec, dtype, seed, scale, budget, cache):
    """One row of the table: check against the oracle, then (if it passed) time."""
    inputs = specs.make_inputs(spec, dtype, seed=seed, scale=scale, cache=cache)
    got, want = specs.run_raggeddot(spec, inputs), specs.run_reference(spec, inputs)
    results = {name: specs.check(got[name], ref, dtype) for name, ref in want.items()}
    del got, want
    ok = all(passed for passed, _ in results.values())
    err = max(e for _, e in results.values())
    shape = spec.resized(scale).shape
    row = [spec.name, spec.op, f"{shape['m']}x{shape['k']}x{shape['n']}", shape["g"],
           int((inputs["group_sizes"] == 0).sum()), f"{err:.1e}", "ok" if ok else "FAILED"]
    if not ok:
        return row + ["-", "-", "-"], False
    t = _median_times({"raggeddot": lambda: specs.run_raggeddot(spec, inputs),
                       "loop": specs.numpy_loop(spec, inputs)}, budget)
    t_rd, t_np = t["raggeddot"], t["loop"]
    return row + [f"{t_rd * 1e3:.2f}", f"{_flops(spec, inputs) / t_rd / 1e9:.1f}", f"{t_np / t_rd:.2f}"], True


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["tune"]:
        from raggeddot._tune_cli import main as tune_main
        return tune_main(argv[1:])
    # the docstring's first paragraph (whole sentences) is the description, the rest the epilog
    first, _, rest = __doc__.strip().partition("\n\n")
    parser = argparse.ArgumentParser(prog="python -m raggeddot", description=" ".join(first.split()),
                                     epilog=" ".join(rest.split()) or None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply m, k and n of every spec by this (e.g. 0.05 for a fast check)")
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of timed runs per variant")
    parser.add_argument("--spec", nargs="+", metavar="NAME", help="only the 'main' specs matching these globs")
    args = parser.parse_args(argv)

    info = runtime.build_info()
    print(f"raggeddot {raggeddot.__version__}: kernel={info['kernel']} compiled={info['simd']} "
          f"openmp={info['openmp']} threads={runtime.get_num_threads()}; {args.dtype}")
    warned = load_warning()
    if warned:
        print(warned)
    chosen = [s for s in specs.select(tags=["main"], patterns=args.spec or ()) if s.op in MAIN_OPS]
    rows, failed, cache = [], 0, {}
    for spec in _progress(chosen, "specs"):
        row, ok = run_spec(spec, args.dtype, args.seed, args.scale, args.budget, cache)
        rows.append(row)
        failed += not ok
        gc.collect()

    header = ["spec", "op", "m x k x n", "groups", "empty", "rel err", "check", "ms", "GFLOP/s", "vs loop"]
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(str(v).ljust(w) if i < 2 else str(v).rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
    if not warned:
        warned = load_warning()
        if warned:
            print(warned)
    print(f"{len(rows) - failed} passed, {failed} failed (checked against raggeddot.reference; GFLOP/s = "
          f"2*sum(group_sizes)*k*n per product / time; 'vs loop' = NumPy per-group loop time / raggeddot time)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m raggeddot tune: tune the plans of named ragged_dot specs (raggeddot.specs) and
check that the tuned plans are not slower than the built-in ones.

For each spec, raggeddot.ragged_dot on the spec's inputs is tuned (raggeddot.tune: every
candidate plan of each shape class the call makes, median of --repeats calls after a
warm-up), checked against the NumPy oracle (raggeddot.reference), and its timing table
printed. Then the call is timed in --rounds interleaved rounds with the tuned plans and
with the built-in ones (the classes' table entries removed), and the median speed of the
tuned plans over that of the built-in ones is printed per spec. Tuned plans are saved to
the plans file under $RAGGEDDOT_CACHE_DIR unless --no-save.
"""
import argparse
import statistics
import sys

from raggeddot import _plans, _timing, specs
from raggeddot._tune import tabulate, tune


def _parser():
    first, _, rest = __doc__.strip().partition("\n\n")
    parser = argparse.ArgumentParser(prog="python -m raggeddot tune", description=" ".join(first.split()),
                                     epilog=" ".join(rest.split()))
    parser.add_argument("--spec", nargs="+", metavar="NAME", required=True,
                        help="ragged_dot specs (names or globs) of raggeddot.specs")
    parser.add_argument("--dtype", default="float32", choices=list(specs.DTYPES))
    parser.add_argument("--repeats", type=int, default=5, metavar="N", help="timed calls per candidate plan")
    parser.add_argument("--rounds", type=int, default=7, metavar="N", help="interleaved rounds of the final check")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply m, k and n of every spec by this")
    parser.add_argument("--no-save", action="store_true", help="do not write the plans file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def _with_entries(call, entries):
    """call(), with the table entries of ``entries`` ({class: plan or None}) set first."""
    def run():
        for cls, plan in entries.items():
            _plans.plan_set(cls, plan)
        return call()
    return run


def tune_spec(spec, args):
    """Tune one spec; prints its table and returns (check passed, tuned / default speed)."""
    inputs = specs.make_inputs(spec, args.dtype, scale=args.scale)
    call = lambda: specs.run_raggeddot(spec, inputs)["out"]   # noqa: E731
    tuned = tune(call, repeats=args.repeats, progress=not args.no_progress, persist=not args.no_save)
    out = tuned()
    ok, err = specs.check(call(), specs.run_reference(spec, inputs)["out"], args.dtype)
    del out
    table = tabulate(tuned)
    print(f"\n{spec.name} ({spec.resized(args.scale).describe()}), {args.dtype}: "
          f"{'ok' if ok else 'FAILED'} against the oracle (rel err {err:.1e})")
    print(table if table.rows else "(every class of this call was tuned before; nothing timed)")
    chosen = {cls: _plans.plan_get(cls) for cls in tuned.classes}
    chosen = {cls: _plans.settable(plan) for cls, plan in chosen.items() if plan is not None}
    if not chosen:
        return ok, None
    try:
        times = _timing.interleaved({"default": _with_entries(call, dict.fromkeys(chosen)),
                                     "tuned": _with_entries(call, chosen)}, rounds=args.rounds)
    finally:
        for cls, plan in chosen.items():
            _plans.plan_set(cls, plan)
    ratio = statistics.median(times["default"]) / statistics.median(times["tuned"])
    print(f"{spec.name}: default {statistics.median(times['default']) * 1e3:.3f} ms, "
          f"tuned {statistics.median(times['tuned']) * 1e3:.3f} ms (medians of {args.rounds} interleaved "
          f"rounds): tuned/default speed {ratio:.3f}")
    return ok, ratio


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.repeats < 1 or args.rounds < 1:
        _parser().error(f"--repeats and --rounds must be >= 1, got {args.repeats} and {args.rounds}")
    try:
        chosen = specs.select(op="ragged_dot", patterns=args.spec)
    except ValueError as e:
        _parser().error(str(e))
    results = [(spec.name, *tune_spec(spec, args)) for spec in chosen]
    print("\nspec  check  tuned/default speed")
    for name, ok, ratio in results:
        print(f"{name}  {'ok' if ok else 'FAILED'}  {'-' if ratio is None else f'{ratio:.3f}'}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())

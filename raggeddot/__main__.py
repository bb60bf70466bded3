"""python -m raggeddot: check the compiled kernels on MoE-shaped problems and
time them against a NumPy per-group loop.

Each problem is checked against the pure-NumPy oracle (raggeddot.reference)
before it is timed; times are medians after a warm-up.
"""
import argparse
import sys
import time

import numpy as np

import raggeddot
from raggeddot import reference

# (name, tokens*top_k rows, k, n, groups): expert FFN shapes of well-known MoE
# models, scaled to a small CPU.
PROBLEMS = [
    ("Mixtral-like up-proj", 4096, 1024, 3584, 8),
    ("Qwen3-MoE-like up-proj", 8192, 2048, 768, 128),
    ("DeepSeek-V3-like down-proj", 8192, 512, 1792, 256),
    ("many tiny experts", 4096, 64, 64, 256),
]


def _progress(items, desc):
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, leave=False, file=sys.stderr)


def _median_time(fn, min_runs=3, budget=0.5):
    fn()  # warm-up
    times = []
    t_end = time.perf_counter() + budget
    while len(times) < min_runs or (time.perf_counter() < t_end and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _numpy_loop(lhs, rhs, group_sizes):
    out = np.zeros((lhs.shape[0], rhs.shape[2]), dtype=np.result_type(lhs, rhs))
    start = 0
    for i, size in enumerate(group_sizes):
        out[start:start + size] = lhs[start:start + size] @ rhs[i]
        start += size
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m raggeddot", description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    info = raggeddot.build_info()
    print(f"raggeddot {raggeddot.__version__}: kernel={info['kernel']} compiled={info['simd']} "
          f"openmp={info['openmp']} threads={raggeddot.get_num_threads()}")
    dtype = np.dtype(args.dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    rng = np.random.default_rng(args.seed)
    rows = []
    failures = 0
    for name, m, k, n, g in _progress(PROBLEMS, "problems"):
        # skewed router: Dirichlet-distributed expert loads, a few experts empty
        p = rng.dirichlet(np.full(g, 0.5))
        group_sizes = rng.multinomial(m - m // 16, p)
        lhs = rng.standard_normal((m, k)).astype(dtype)
        rhs = (rng.standard_normal((g, k, n)) / np.sqrt(k)).astype(dtype)

        got = raggeddot.ragged_dot(lhs, rhs, group_sizes)
        want = reference.ragged_dot(lhs, rhs, group_sizes)
        err = float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))
        ok = err <= tol
        failures += not ok

        flops = 2.0 * float(group_sizes.sum()) * k * n
        t_rd = _median_time(lambda: raggeddot.ragged_dot(lhs, rhs, group_sizes))
        t_np = _median_time(lambda: _numpy_loop(lhs, rhs, group_sizes))
        rows.append((name, f"{m}x{k}x{n}", g, int((group_sizes == 0).sum()), t_rd * 1e3,
                     flops / t_rd / 1e9, t_np / t_rd, f"{err:.1e}", "ok" if ok else "FAIL"))

    header = ("problem", "m x k x n", "groups", "empty", "ms", "GFLOP/s", "vs loop", "rel err", "check")
    widths = [max(len(str(h)), *(len(f"{r[i]:.2f}" if isinstance(r[i], float) else str(r[i])) for r in rows))
              for i, h in enumerate(header)]
    fmt = lambda r: "  ".join((f"{v:.2f}" if isinstance(v, float) else str(v)).rjust(w) for v, w in zip(r, widths))
    print(fmt(header))
    for r in rows:
        print(fmt(r))
    print(f"{len(rows) - failures} passed, {failures} failed (checked against raggeddot.reference, "
          f"rel tol {tol:g}; 'vs loop' is the speed-up over a NumPy per-group loop)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

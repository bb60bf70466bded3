"""Helpers shared by the raggeddot benchmark scripts.

Timing (warm-up, then the median of an adaptive number of runs), the accuracy check every
variant passes before it is timed, the machine's FMA peak, machine information, and the
text table / JSON / plot output. Nothing here imports raggeddot at module level, so a script
can report a missing build itself.
"""

from __future__ import annotations

import ctypes
import fnmatch
import datetime
import glob
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

# ----------------------------------------------------------------------------------------------
# Accuracy check

#: max |out - ref| / max |ref| allowed before a variant is reported FAILED.
REL_TOL = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-10}


def rel_err(out: Any, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref| (max |out - ref| when ref is all zeros); inf on a shape mismatch."""
    out = np.asarray(out)
    if out.shape != ref.shape:
        return math.inf
    diff = np.abs(out.astype(np.float64, copy=False) - ref.astype(np.float64, copy=False))
    worst = float(diff.max()) if diff.size else 0.0
    if not np.isfinite(worst):
        return math.inf
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    return worst / scale if scale > 0 else worst


def check(out: Any, ref: np.ndarray, dtype: np.dtype) -> tuple[bool, float]:
    """(passed, relative error) of out against the oracle's ref, with REL_TOL[dtype]."""
    err = rel_err(out, ref)
    return err <= REL_TOL[np.dtype(dtype)], err


# ----------------------------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    """Wall-clock samples of one variant; median_s is what the tables report."""

    times: list[float] = field(default_factory=list)
    warmup_s: float = 0.0
    cpu_util: float = math.nan  # process CPU seconds / wall seconds over the timed runs
    steal_s: float = math.nan  # CPU seconds the hypervisor took (all CPUs) over the timed runs

    @property
    def median_s(self) -> float:
        return statistics.median(self.times)

    @property
    def min_s(self) -> float:
        return min(self.times)

    def to_json(self) -> dict:
        return {
            "median_s": self.median_s,
            "min_s": self.min_s,
            "runs": len(self.times),
            "warmup_s": self.warmup_s,
            "cpu_util": self.cpu_util,
            "steal_s": self.steal_s,
            "times_s": self.times,
        }


def time_fn(
    fn: Callable[[], Any],
    *,
    target_s: float = 0.75,
    min_runs: int = 3,
    max_runs: int = 200,
    warmup: int = 1,
    sync: Callable[[Any], Any] | None = None,
    estimate_s: float | None = None,
) -> Timing:
    """Warm up `warmup` times, then time enough runs of fn() to fill ~target_s (>= min_runs).

    sync(result) is called inside the timed region (e.g. block_until_ready for JAX).
    The run count comes from the last warm-up call's time, so a variant that takes 1 s per
    call gets min_runs runs and a 1 ms one gets up to max_runs. With warmup=0 the caller's
    estimate_s (the time of a call it already made, e.g. the accuracy check) is used instead.
    """
    use_estimate = warmup <= 0 and estimate_s is not None
    t_warm = estimate_s if use_estimate else 0.0
    for _ in range(0 if use_estimate else max(1, warmup)):
        t0 = time.perf_counter()
        r = fn()
        if sync is not None:
            sync(r)
        t_warm = time.perf_counter() - t0
        del r
    runs = min_runs if t_warm <= 0 else int(math.ceil(target_s / t_warm))
    runs = max(min_runs, min(max_runs, runs))
    times = []
    st0 = steal_seconds()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(runs):
        t0 = time.perf_counter()
        r = fn()
        if sync is not None:
            sync(r)
        times.append(time.perf_counter() - t0)
        del r
    util = (time.process_time() - c0) / max(time.perf_counter() - w0, 1e-9)
    st1 = steal_seconds()
    steal = st1 - st0 if st0 is not None and st1 is not None else math.nan
    return Timing(times=times, warmup_s=t_warm, cpu_util=util, steal_s=steal)


def steal_seconds() -> float | None:
    """Total steal time of all CPUs (a VM's time taken by the hypervisor), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def settle(seconds: float = 0.05) -> None:
    """Sleep briefly so the spin-waiting worker threads of the previous library (OpenMP,
    OpenBLAS, Eigen) go idle before the next one is timed on this 2-core machine."""
    time.sleep(seconds)


def gflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e9 if seconds > 0 else math.nan


# ----------------------------------------------------------------------------------------------
# Machine peak and threads


def fma_peak(module: Any, threads: int, seconds: float, isa: str | None = None, repeats: int = 2) -> float | None:
    """Best of `repeats` calls of raggeddot._core.fma_peak(threads, seconds[, isa]) (float32
    GFLOP/s), or None when the core does not provide it, fails, or reports 0 (ISA missing)."""
    core = getattr(module, "_core", None)
    probe = getattr(core, "fma_peak", None)
    if probe is None:
        return None
    best = None
    for _ in range(max(1, repeats)):
        try:
            v = float(probe(int(threads), float(seconds)) if isa is None else probe(int(threads), float(seconds), isa))
        except Exception:  # noqa: BLE001 - a failing probe (or an older signature) is reported as n/a
            return None
        best = v if best is None else max(best, v)
    return best if best and best > 0 else None


def _openblas_lib() -> ctypes.CDLL | None:
    """The OpenBLAS that NumPy wheels bundle (numpy.libs/), loaded by NumPy already."""
    base = os.path.dirname(os.path.dirname(np.__file__))
    for pattern in ("numpy.libs/libscipy_openblas*.so*", "numpy.libs/libopenblas*.so*", "numpy/.dylibs/libopenblas*"):
        for path in glob.glob(os.path.join(base, pattern)):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


def _openblas_symbol(lib: ctypes.CDLL, name: str):
    for prefix in ("scipy_", ""):
        for suffix in ("64_", "_64", ""):
            fn = getattr(lib, f"{prefix}openblas_{name}{suffix}", None)
            if fn is not None:
                return fn
    return None


def numpy_blas_info() -> dict:
    """NumPy's BLAS: name/version from show_config, and OpenBLAS's thread count and core name."""
    info: dict[str, Any] = {}
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        info["name"] = blas.get("name")
        info["version"] = blas.get("version")
        info["config"] = blas.get("openblas configuration")
    except Exception:  # noqa: BLE001 - older NumPy
        pass
    lib = _openblas_lib()
    if lib is not None:
        fn = _openblas_symbol(lib, "get_num_threads")
        if fn is not None:
            fn.restype = ctypes.c_int
            info["num_threads"] = int(fn())
        fn = _openblas_symbol(lib, "get_corename")
        if fn is not None:
            fn.restype = ctypes.c_char_p
            info["corename"] = fn().decode(errors="replace")
    return info


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def busy_warning(ncpu: int | None = None) -> str | None:
    """A warning when other processes keep the CPUs busy (1-minute load average >= 1)."""
    la = loadavg()
    if la is None or la[0] < 1.0:
        return None
    return (f"warning: load average {la[0]:.2f} on {ncpu or os.cpu_count()} cpus before the run: other processes are "
            "busy, timings of multi-threaded variants will be low and noisy")


def cpu_info() -> dict:
    info: dict[str, Any] = {"machine": platform.machine(), "logical_cpus": os.cpu_count()}
    try:
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        for line in text.splitlines():
            if line.startswith("model name") and "model" not in info:
                info["model"] = line.split(":", 1)[1].strip()
            if line.startswith("flags") and "flags" not in info:
                flags = set(line.split(":", 1)[1].split())
                info["flags"] = sorted(f for f in ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
    except OSError:
        info["model"] = platform.processor() or "unknown"
    return info


def machine_info(extra: dict | None = None) -> dict:
    """CPU, Python/NumPy versions, NumPy's BLAS threads and the thread-related environment."""
    info = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_info(),
        "numpy": np.__version__,
        "numpy_blas": numpy_blas_info(),
        "env": {k: os.environ[k] for k in sorted(os.environ) if k in (
            "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY",
            "GOMP_SPINCOUNT", "OMP_PROC_BIND", "XLA_FLAGS", "RAGGEDDOT_NUM_THREADS")},
    }
    if extra:
        info.update(extra)
    return info


# ----------------------------------------------------------------------------------------------
# Output


def fmt_num(x: Any, digits: int = 1) -> str:
    """Numbers with `digits` decimals; strings (FAILED, skip, n/a) pass through."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and not math.isfinite(x):
        return "-"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{x:.{digits}f}"


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: Sequence[str] | None = None) -> str:
    """A plain-text table; align is a string per column of '<' or '>' (numbers right by default)."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    if align is None:
        align = ["<"] + [">"] * (len(headers) - 1)
    def line(cells):
        return "  ".join(f"{c:{a}{w}}" for c, a, w in zip(cells, align, widths)).rstrip()
    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def _json_default(o: Any):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def write_json(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=_json_default, allow_nan=True)
        f.write("\n")
    os.replace(tmp, path)


def progress(iterable: Sequence, desc: str, enabled: bool = True, label: Callable[[Any], str] = str):
    """(iterator, set_status, write): a tqdm bar on stderr when tqdm imports, else one plain
    stderr line per item (label(item))."""
    if enabled:
        try:
            from tqdm import tqdm

            bar = tqdm(iterable, desc=desc, unit="scn", file=sys.stderr, dynamic_ncols=True)
            return bar, bar.set_postfix_str, tqdm.write
        except ImportError:
            pass

    def plain():
        n = len(iterable)
        for i, item in enumerate(iterable):
            print(f"[{desc} {i + 1}/{n}] {label(item)}", file=sys.stderr, flush=True)
            yield item

    return plain(), (lambda s: None), (lambda s: print(s, file=sys.stderr, flush=True))


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def select_scenarios(patterns: Sequence[str] | None, known: Sequence[str], default: Sequence[str]) -> list[str]:
    """Names in `known` matching any of the glob `patterns` (in order, no repeats),
    or `default` when no pattern is given; an unmatched pattern ends the run."""
    if not patterns:
        return list(default)
    names: list[str] = []
    for pat in patterns:
        hits = [s for s in known if fnmatch.fnmatchcase(s, pat)]
        if not hits:
            sys.exit(f"unknown scenario {pat!r}; known: {', '.join(known)}")
        names += [h for h in hits if h not in names]
    return names


def run_main(main) -> None:
    """A benchmark script's entry point: exit with main()'s status, 130 on Ctrl-C, and 1 with
    the traceback on any other error."""
    import traceback

    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:  # noqa: BLE001 - show where, then fail
        traceback.print_exc()
        sys.exit(1)

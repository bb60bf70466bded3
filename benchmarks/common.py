"""What the benchmark scripts share: the machine (CPU, NumPy's OpenBLAS, load, stolen CPU time),
the yardsticks measured at start, medians of interleaved rounds, the checks before timing,
text tables and JSON."""
from __future__ import annotations

import ctypes
import datetime
import glob
import json
import math
import os
import platform
import sys

import numpy as np

from raggeddot import runtime, specs
from raggeddot._timing import interleaved, summary

#: the instruction a bfloat16 or int8 product runs natively, by the family serving it, and the
#: peak_gflops isas probing it
NATIVE = {"bfloat16": {"amx": ("TDPBF16PS", ("amx_bf16",)), "avx512-bf16": ("vdpbf16ps", ("avx512_bf16",)),
                       "neon-bf16": ("BFMMLA", ("neon_bf16",))},
          "int8": {"amx": ("TDPBUSD", ("amx_int8",)), "avx512-vnni": ("vpdpbusd", ("avx512_vnni", "avx_vnni")),
                   "avx-vnni": ("vpdpbusd", ("avx_vnni",)), "neon-i8mm": ("USMMLA", ("neon_i8mm",)),
                   "neon-dot": ("UDOT", ("neon_dot",))}}


def openblas(name: str, restype=ctypes.c_int):
    """openblas_<name>() of NumPy's bundled OpenBLAS, or None (get_corename: e.g. b'Haswell')."""
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "lib*openblas*.so*")):
        for symbol in (f"{p}openblas_{name}{s}" for p in ("scipy_", "") for s in ("64_", "_64", "")):
            fn = getattr(ctypes.CDLL(path), symbol, None)
            if fn is not None:
                fn.restype = restype
                return fn()
    return None


def numpy_blas_info() -> dict:
    try:   # (NumPy >= 1.26; Debian's 1.24 prints its configuration and returns None)
        blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    except TypeError:
        blas = {}
    core = openblas("get_corename", ctypes.c_char_p)
    return {"name": blas.get("name"), "version": blas.get("version"), "corename": core and core.decode(),
            "num_threads": openblas("get_num_threads"), "coretype_env": os.environ.get("OPENBLAS_CORETYPE")}


def cpu_info() -> dict:
    info = {"machine": platform.machine(), "logical_cpus": os.cpu_count(), "flags": []}
    try:
        with open("/proc/cpuinfo") as f:
            lines = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in f)]
    except OSError:
        lines = [("model name", platform.processor())]
    for key, value in lines:
        if key in ("model name", "cpu family", "CPU implementer", "CPU part") and key not in info:
            info[key] = value
        elif key in ("flags", "Features") and not info["flags"]:   # (x86-64, aarch64)
            info["flags"] = [x for x in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni",
                                         "asimd", "asimddp", "bf16", "i8mm", "sve", "sve2") if x in value.split()]
    return info


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def vm(key: str) -> int:
    """This process's /proc/self/status figure ``key`` in bytes: VmRSS, VmHWM (its own peak RSS,
    where getrusage's maxrss also counts a parent's from before the exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def steal_seconds() -> float | None:
    """Total steal time of all CPUs (a VM's time taken by the hypervisor), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def machine_info(extra: dict | None = None) -> dict:
    """CPU, versions, NumPy's BLAS, raggeddot's build and the thread-related environment."""
    env = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OMP_WAIT_POLICY",
           "GOMP_SPINCOUNT", "RAGGEDDOT_NUM_THREADS")
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "hostname": platform.node(),
            "python": sys.version.split()[0], "cpu": cpu_info(), "numpy": np.__version__,
            "numpy_blas": numpy_blas_info(), "env": {k: os.environ[k] for k in env if k in os.environ},
            "raggeddot": {"build_info": runtime.build_info(), "kernel": runtime.get_kernel(),
                          "threads": runtime.get_num_threads(), "runnable": runtime.runnable_kernels()},
            "loadavg_start": loadavg(), **(extra or {})}


def serving(dtype: str) -> tuple[str, tuple]:
    """(instruction, peak_gflops isas probing it) of the family that build_info() says serves
    ``dtype``'s products (NATIVE), else ("", ())."""
    family = runtime.build_info()["products"].get(dtype, {}).get("kernel")
    return NATIVE.get(dtype, {}).get(family, ("", ()))


def yardsticks(seconds: float, bandwidth_s: float = 0.5, bandwidth_mb: float = 256) -> dict:
    """Probes (runtime.peak_gflops for ``seconds``) at 1..ncpu threads, {threads: GFLOP/s or None}:
    peaks: the float32 FMA peaks (avx2 and avx512, or neon; best of two); peak_isa: the kernel's;
    native_peaks {float16, bfloat16, int8: {instruction, gflops, basis}}: the instruction serving
    bfloat16 / int8 ('native'), else bfloat16 the FMA peak ('fma'), int8 none ('absent'); float16
    the FMA peak. read_bandwidth: the best of two runs at raggeddot's threads."""
    def probe(isa, repeats=1):
        return {str(t): max(runtime.peak_gflops(isa, t, seconds) for _ in range(repeats)) or None
                for t in range(1, (os.cpu_count() or 1) + 1)}

    fallback = "neon" if "neon" in runtime.compiled_kernels() else "avx2"
    peaks = {isa: probe(isa, 2) for isa in ((fallback,) if fallback == "neon" else ("avx2", "avx512"))}
    isa = runtime.get_kernel() if (peaks.get(runtime.get_kernel()) or {}).get("1") else fallback
    fma = {"instruction": f"{isa} FMA", "gflops": peaks[isa], "basis": "fma"}
    native = {"float16": fma}
    for dtype in NATIVE:
        instruction, probes = serving(dtype)
        found = next((g for g in map(probe, probes) if all(g.values())), None)
        own = {"instruction": instruction or "none", "gflops": found, "basis": "native" if found else "absent"}
        native[dtype] = fma if dtype == "bfloat16" and not found else own
    threads = runtime.get_num_threads()
    gbs = max(runtime.read_bandwidth(threads, bandwidth_mb, bandwidth_s) for _ in range(2))
    return {"peaks": peaks, "peak_isa": isa, "native_peaks": native,
            "read_bandwidth": {"threads": threads, "megabytes": bandwidth_mb, "gbs": gbs}}


def describe_yardsticks(ys: dict) -> list[str]:
    def figs(gflops):
        return ", ".join(f"{t} thr {fmt(p)}" for t, p in gflops.items()) if gflops else "absent"

    lines = [f"FMA peak {isa} (float32 GFLOP/s; float64 half): {figs(p)}" for isa, p in ys["peaks"].items()]
    lines += [f"{dtype} peak ({pk['instruction']}, {pk['basis']}): {figs(pk['gflops'])}"
              for dtype, pk in ys["native_peaks"].items()]
    bw = ys["read_bandwidth"]
    return lines + [f"read bandwidth ({bw['threads']} thr, {bw['megabytes']} MB): {fmt(bw['gbs'])} GB/s"]


def medians(fns: dict, rounds: int, warmup: int = 2, pause_s: float = 0.2, **kw) -> dict:
    """{name: median seconds} of ``fns`` in interleaved rounds (each round calls every one once, so
    that a drifting load weighs on all alike), after ``warmup`` calls each and ``pause_s`` before
    every call (for torch's spinning threads); a single round has neither."""
    quiet = dict(warmup=warmup, pause_s=pause_s) if rounds > 1 else dict(warmup=0)
    return {name: summary(ts)["median"] for name, ts in interleaved(fns, rounds=rounds, **quiet, **kw).items()}


def require_close(what: str, got, ref, tol: float = 5e-2) -> None:
    """The check before timing: max |got - ref| / max |ref| within ``tol``, else the run ends."""
    err = specs.rel_err(got, ref)
    if not err <= tol:
        raise SystemExit(f"{what}: relative error {err:.2e} > {tol:g}")


def fmt(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return x if isinstance(x, str) else str(x) if isinstance(x, int) else f"{x:.{digits}f}"


def format_table(headers, rows) -> str:
    """Columns aligned: the first to the left, the others to the right."""
    rows = [[str(c) for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    rows.insert(1, ["-" * w for w in widths])
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows)


def write_json(path: str, obj) -> None:
    """``obj`` as indented JSON (NumPy scalars and arrays converted), written atomically."""
    def default(o):
        return o.tolist() if isinstance(o, (np.generic, np.ndarray)) else str(o)

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1, default=default)
    os.replace(path + ".tmp", path)

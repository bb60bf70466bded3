"""What the benchmarks record about the machine: CPU, NumPy's OpenBLAS (and the core
type it chose), load, stolen CPU time, the measured FMA peak, the peaks of the 16-bit and
int8 instructions where the CPU has them, and the measured read bandwidth."""
from __future__ import annotations

import ctypes
import datetime
import glob
import os
import platform
import sys

import numpy as np

from raggeddot import runtime

ISAS = ("avx2", "avx512")


def _openblas_lib():
    """The OpenBLAS that NumPy wheels bundle (numpy.libs/), loaded by NumPy already."""
    base = os.path.dirname(os.path.dirname(np.__file__))
    for pattern in ("numpy.libs/libscipy_openblas*.so*", "numpy.libs/libopenblas*.so*", "numpy/.dylibs/libopenblas*"):
        for path in glob.glob(os.path.join(base, pattern)):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


def _openblas_call(name: str, restype):
    """openblas_<name>() of the bundled OpenBLAS under any of its symbol spellings, or None."""
    lib = _openblas_lib()
    for prefix in ("scipy_", ""):
        for suffix in ("64_", "_64", ""):
            fn = getattr(lib, f"{prefix}openblas_{name}{suffix}", None) if lib is not None else None
            if fn is not None:
                fn.restype = restype
                return fn()
    return None


def blas_core() -> str | None:
    """The core type OpenBLAS chose at load time (e.g. 'Haswell', 'SkylakeX')."""
    core = _openblas_call("get_corename", ctypes.c_char_p)
    return core.decode(errors="replace") if core is not None else None


def numpy_blas_info() -> dict:
    info = {"corename": blas_core(), "num_threads": _openblas_call("get_num_threads", ctypes.c_int),
            "coretype_env": os.environ.get("OPENBLAS_CORETYPE")}
    try:
        blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
        info.update(name=blas.get("name"), version=blas.get("version"), config=blas.get("openblas configuration"))
    except Exception:  # noqa: BLE001 - show_config's layout is not a stable interface
        pass
    return info


def cpu_info() -> dict:
    info = {"machine": platform.machine(), "logical_cpus": os.cpu_count(), "flags": []}
    try:
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family") and key not in info:
                    info[key] = value.strip()
                elif key == "flags" and not info["flags"]:
                    have = set(value.split())
                    info["flags"] = [x for x in ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni",
                                                 "avx_vnni", "amx_tile") if x in have]
    except OSError:
        info["model name"] = platform.processor() or "unknown"
    return info


def has_avx512f() -> bool:
    return "avx512f" in cpu_info()["flags"]


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def steal_seconds() -> float | None:
    """Total steal time of all CPUs (a VM's time taken by the hypervisor), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def measure_peaks(seconds: float, repeats: int = 2) -> dict:
    """{isa: {threads: float32 GFLOP/s or None}}: the best of ``repeats`` runs of
    runtime.peak_gflops for 1..ncpu threads; None where the CPU lacks the ISA."""
    ncpu = os.cpu_count() or 1
    return {isa: {str(t): (max(runtime.peak_gflops(isa, t, seconds) for _ in range(repeats)) or None)
                  for t in range(1, ncpu + 1)} for isa in ISAS}


#: the instruction a 16-bit or int8 product would run natively: (CPU features, one of which
#: it needs; the runtime.peak_gflops isa names that may probe it)
NATIVE = {"bfloat16": ("vdpbf16ps", ("avx512_bf16",), ("avx512_bf16", "bf16")),
          "int8": ("vpdpbusd", ("avx512_vnni", "avx_vnni"), ("avx512_vnni", "avx_vnni", "vnni"))}


def native_peaks(peaks: dict, fma_isa: str, seconds: float) -> dict:
    """{bfloat16, float16, int8: {instruction, gflops: {threads: GFLOP/s} or None, basis, note}}:
    the yardstick of each low-precision product. bfloat16 and int8: their native instruction's
    peak (runtime.peak_gflops, when it probes it and the CPU has it); without it the figure is
    absent and the products are compared with the FMA peak of ``fma_isa`` (raggeddot widens
    16-bit values to float32 while packing and runs FMAs). float16 always runs FMAs."""
    cpu, ncpu = runtime.build_info()["cpu"], os.cpu_count() or 1
    fma = peaks.get(fma_isa) or {}
    out = {"float16": {"instruction": f"{fma_isa} FMA", "gflops": fma or None, "basis": "fma",
                       "note": "float16 values widened to float32: FMA peak"}}
    for dtype, (instr, features, probes) in NATIVE.items():
        has = [f for f in features if cpu.get(f)]
        rec = {"instruction": instr, "gflops": None, "features": has}
        if not has:
            rec["note"] = f"absent: the CPU has no {' / '.join(f.upper() for f in features)}"
        else:
            for isa in probes:
                try:
                    rec["gflops"] = {str(t): runtime.peak_gflops(isa, t, seconds) or None for t in range(1, ncpu + 1)}
                    rec["note"] = f"runtime.peak_gflops({isa!r})"
                    break
                except ValueError:
                    continue
            else:
                rec["note"] = f"the CPU has {', '.join(has)} but runtime.peak_gflops has no probe of {instr}"
        if rec["gflops"] is None and dtype == "bfloat16":
            rec.update(gflops=fma or None, basis="fma", instruction=f"{fma_isa} FMA",
                       note=rec["note"] + f"; bfloat16 compared with the {fma_isa} FMA peak (widened to float32)")
        else:
            rec["basis"] = "native" if rec["gflops"] else "absent"
        out[dtype] = rec
    return out


def measure_read_bandwidth(threads: int, seconds: float, megabytes: float = 256, repeats: int = 2) -> dict:
    """{threads, megabytes, gbs}: the best of ``repeats`` runs of runtime.read_bandwidth."""
    gbs = max(runtime.read_bandwidth(threads, megabytes, seconds) for _ in range(repeats))
    return {"threads": threads, "megabytes": megabytes, "gbs": gbs}


def peak_warnings(peaks: dict) -> list[str]:
    """Plausibility of the FMA probe: 512-bit FMAs more than ~2x the 256-bit ones means it
    did not time independent FMAs (or the machine was busy while it ran)."""
    a2, a5 = peaks.get("avx2", {}).get("1"), peaks.get("avx512", {}).get("1")
    if a2 and a5 and a5 / a2 > 2.3:
        return [f"FMA peak probe suspect: avx512/avx2 ratio {a5 / a2:.1f} on 1 thread, at most 2 is possible"]
    return []


def machine_info(extra: dict | None = None) -> dict:
    """CPU, versions, NumPy's BLAS, raggeddot's build and the thread-related environment."""
    info = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_info(),
        "numpy": np.__version__,
        "numpy_blas": numpy_blas_info(),
        "raggeddot": {"build_info": runtime.build_info(), "kernel": runtime.get_kernel(),
                      "threads": runtime.get_num_threads(), "runnable_kernels": runtime.runnable_kernels()},
        "env": {k: os.environ[k] for k in sorted(os.environ) if k in (
            "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "MKL_NUM_THREADS", "OMP_WAIT_POLICY",
            "GOMP_SPINCOUNT", "OMP_PROC_BIND", "XLA_FLAGS", "RAGGEDDOT_NUM_THREADS")},
        "loadavg_start": loadavg(),
    }
    info.update(extra or {})
    return info

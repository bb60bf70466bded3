"""What the benchmark scripts share: the machine they ran on (CPU, NumPy's OpenBLAS and the
core type it chose, load, stolen CPU time), the yardsticks measured at start (FMA peak, the
peaks of the 16-bit and int8 instructions, read bandwidth), and text tables and JSON."""
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

from raggeddot import runtime

#: the instruction a bfloat16 or int8 product runs natively, and the peak_gflops isas probing it
NATIVE = {"bfloat16": ("vdpbf16ps", ("avx512_bf16",)), "int8": ("vpdpbusd", ("avx512_vnni", "avx_vnni"))}


def _openblas_call(name: str, restype):
    """openblas_<name>() of the OpenBLAS NumPy wheels bundle, under any symbol spelling, or None."""
    base = os.path.dirname(os.path.dirname(np.__file__))
    for pattern in ("numpy.libs/libscipy_openblas*.so*", "numpy.libs/libopenblas*.so*", "numpy/.dylibs/libopenblas*"):
        for path in glob.glob(os.path.join(base, pattern)):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for symbol in (f"{p}openblas_{name}{s}" for p in ("scipy_", "") for s in ("64_", "_64", "")):
                fn = getattr(lib, symbol, None)
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
        info.update(name=blas.get("name"), version=blas.get("version"))
    except Exception:  # noqa: BLE001 - show_config's layout is not a stable interface
        pass
    return info


def cpu_info() -> dict:
    info = {"machine": platform.machine(), "logical_cpus": os.cpu_count(), "flags": []}
    try:
        with open("/proc/cpuinfo") as f:
            lines = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in f)]
    except OSError:
        lines = [("model name", platform.processor())]
    for key, value in lines:
        if key in ("model name", "cpu family") and key not in info:
            info[key] = value
        elif key == "flags" and not info["flags"]:
            info["flags"] = [x for x in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni")
                             if x in value.split()]
    return info


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


def machine_info(extra: dict | None = None) -> dict:
    """CPU, versions, NumPy's BLAS, raggeddot's build and the thread-related environment."""
    info = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "hostname": platform.node(),
        "python": sys.version.split()[0], "cpu": cpu_info(), "numpy": np.__version__,
        "numpy_blas": numpy_blas_info(),
        "raggeddot": {"build_info": runtime.build_info(), "kernel": runtime.get_kernel(),
                      "threads": runtime.get_num_threads(), "runnable_kernels": runtime.runnable_kernels()},
        "env": {k: v for k, v in sorted(os.environ.items()) if k in (
            "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
            "XLA_FLAGS", "RAGGEDDOT_NUM_THREADS")},
        "loadavg_start": loadavg(),
    }
    return dict(info, **(extra or {}))


def describe_machine(info: dict) -> str:
    """One line: CPU, its flags, raggeddot's kernel and threads, the load."""
    cpu, rd = info["cpu"], info["raggeddot"]
    return (f"CPU: {cpu.get('model name')} (family {cpu.get('cpu family')}, {cpu.get('logical_cpus')} cpus, "
            f"{' '.join(cpu['flags'])}); raggeddot kernel={rd['kernel']} threads={rd['threads']}; "
            f"load average {info['loadavg_start']}")


# ----------------------------------------------------------------------------------------------
# Yardsticks


def yardsticks(seconds: float, bandwidth_s: float = 0.5, bandwidth_mb: float = 256) -> dict:
    """Measured while the process is quiet, each probe (runtime.peak_gflops) run for ``seconds``
    at 1..ncpu threads ({threads: GFLOP/s, None where the CPU lacks the instruction}):
    peaks: the float32 FMA peaks of avx2 and avx512 (the best of two runs); peak_isa: the one
    of raggeddot's kernel; native_peaks: {float16, bfloat16, int8: {instruction, gflops,
    basis}}, the yardstick of each low-precision product: bfloat16 and int8 their native
    instruction's peak where the CPU has it (basis 'native'), else bfloat16 the FMA peak
    (raggeddot widens to float32: basis 'fma') and int8 none ('absent'); float16 the FMA peak.
    read_bandwidth: the best of two runs of runtime.read_bandwidth at raggeddot's threads.
    peak_warnings: an implausible FMA probe (512-bit FMAs more than ~2x the 256-bit ones)."""
    def probe(isa, repeats=1):
        return {str(t): max(runtime.peak_gflops(isa, t, seconds) for _ in range(repeats)) or None
                for t in range(1, (os.cpu_count() or 1) + 1)}

    peaks = {isa: probe(isa, 2) for isa in ("avx2", "avx512")}
    isa = "avx512" if runtime.get_kernel() == "avx512" and peaks["avx512"]["1"] else "avx2"
    fma = {"instruction": f"{isa} FMA", "gflops": peaks[isa], "basis": "fma"}
    native = {"float16": fma}
    for dtype, (instruction, probes) in NATIVE.items():
        found = next((g for g in map(probe, probes) if all(g.values())), None)
        native[dtype] = ({"instruction": instruction, "gflops": found, "basis": "native"} if found else
                         fma if dtype == "bfloat16" else {"instruction": instruction, "gflops": None, "basis": "absent"})
    threads = runtime.get_num_threads()
    gbs = max(runtime.read_bandwidth(threads, bandwidth_mb, bandwidth_s) for _ in range(2))
    a2, a5 = peaks["avx2"]["1"], peaks["avx512"]["1"]
    warn = [f"FMA peak probe suspect: avx512/avx2 ratio {a5 / a2:.1f} on 1 thread, at most 2 is possible"
            ] if a2 and a5 and a5 / a2 > 2.3 else []
    return {"peaks": peaks, "peak_isa": isa, "native_peaks": native, "peak_warnings": warn,
            "read_bandwidth": {"threads": threads, "megabytes": bandwidth_mb, "gbs": gbs}}


def describe_yardsticks(ys: dict) -> list[str]:
    def figs(gflops):
        return ", ".join(f"{t} thr {fmt(p)}" for t, p in gflops.items()) if gflops else "absent"

    lines = [f"FMA peak {isa} (float32 GFLOP/s; float64 half): {figs(p)}" for isa, p in ys["peaks"].items()]
    lines += [f"{dtype} peak ({pk['instruction']}, {pk['basis']}): {figs(pk['gflops'])}"
              for dtype, pk in ys["native_peaks"].items()]
    bw = ys["read_bandwidth"]
    lines.append(f"read bandwidth ({bw['threads']} thr, {bw['megabytes']} MB): {fmt(bw['gbs'])} GB/s")
    return lines + [f"warning: {w}" for w in ys["peak_warnings"]]


# ----------------------------------------------------------------------------------------------
# Output


def fmt(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, str):
        return x
    return str(x) if isinstance(x, int) else f"{x:.{digits}f}"


def format_table(headers, rows) -> str:
    """Columns aligned: the first to the left, the others to the right."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in [headers] + rows) for i in range(len(headers))]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def write_json(path: str, obj) -> None:
    """``obj`` as indented JSON (NumPy scalars and arrays converted), written atomically."""
    def default(o):
        if isinstance(o, (np.generic, np.ndarray)):
            return o.tolist()
        return list(o) if isinstance(o, (set, frozenset, tuple)) else str(o)

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1, default=default)
        f.write("\n")
    os.replace(path + ".tmp", path)

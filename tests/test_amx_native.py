"""The native AMX kernels (family "amx") on any x86-64 CPU, under an
emulator of an AMX CPU.

``tests/native/amx_check.c`` is built as a static program from the
library's own C (every ``csrc/**/*.c`` but the Python binding, without
OpenMP) and run twice: here, where it runs the twin "amx-twin" (and the
native family too, where this CPU runs it), and under ``bxrun`` (the Bochs
CPU emulator in its Sapphire Rapids model, ``../shared/amx-emu/bxrun`` beside
the repository), where it runs the native tile instructions and then the
twin. The program checks each product against its float64 truth itself
(exact where every partial sum is exact, else a float32 sum's error bound),
its guard values, the release of the tiles and native against twin element
by element; this test requires every line to pass and compares the runs:
the twin's hashes must be the same on both machines, and where the
arithmetic is exact (int8, bfloat16 small integers) the native hash must be
the twin's.

Without ``bxrun``, or without a static C library to link against, the test
skips and says why; with ``RAGGEDDOT_REQUIRE_AMX_EMU=1`` (CI) it fails
instead.
"""
import os
import platform
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BXRUN = ROOT.parent / "shared" / "amx-emu" / "bxrun"
PROGRAM = ROOT / "tests" / "native" / "amx_check.c"
REQUIRED = os.environ.get("RAGGEDDOT_REQUIRE_AMX_EMU") == "1"
FLAGS = ["-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-I", str(ROOT / "csrc")]

# bxrun's exit statuses of its own (README beside it): 110 + a CPU exception
EXITS = {116: "#UD: an instruction the CPU model lacks, or a tile operation without a configuration",
         123: "#GP: e.g. a tile configuration LDTILECFG rejects",
         114: "#PF: a wild pointer",
         105: "the program is not static"}


def _unavailable(why):
    if REQUIRED:
        pytest.fail(f"RAGGEDDOT_REQUIRE_AMX_EMU=1 but {why}")
    pytest.skip(why)


def _sources():
    """The library's C: every file under csrc but the Python binding."""
    py = ROOT / "csrc" / "py"
    return sorted(p for p in (ROOT / "csrc").rglob("*.c") if py not in p.parents)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    if platform.machine().lower() not in ("x86_64", "amd64"):
        _unavailable(f"the native AMX check runs on x86-64 (this is {platform.machine()})")
    if not (BXRUN.is_file() and os.access(BXRUN, os.X_OK)):
        _unavailable(f"{BXRUN} is absent: the native AMX kernels run here only under that emulator")
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        _unavailable(f"no C compiler ({cc})")
    tmp = tmp_path_factory.mktemp("amx-native")
    probe = tmp / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    out = subprocess.run([cc, "-static", str(probe), "-o", str(tmp / "probe")], capture_output=True, text=True)
    if out.returncode != 0:
        _unavailable(f"{cc} cannot link a static program (no static C library?): {out.stderr.strip()[-300:]}")
    start = time.perf_counter()

    def build(src):
        obj = tmp / (str(src.relative_to(ROOT)).replace(os.sep, "_") + ".o")
        # the library's files are held to -Werror by test_build.py (with the extension's flags)
        werror = ["-Werror"] if src == PROGRAM else []
        res = subprocess.run([cc, *FLAGS, *werror, "-c", str(src), "-o", str(obj)], capture_output=True,
                             text=True)
        assert res.returncode == 0, f"{src}: {res.stderr}"
        return obj

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        objects = list(pool.map(build, _sources() + [PROGRAM]))
    exe = tmp / "amx_check"
    res = subprocess.run([cc, "-static", *map(str, objects), "-lm", "-o", str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    print(f"amx_check built in {time.perf_counter() - start:.1f} s")
    return exe


def _run(cmd, timeout):
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    print(f"{' '.join(map(str, cmd))}: {time.perf_counter() - start:.1f} s, exit {res.returncode}")
    return res


def _parse(stdout):
    """case lines by (name, family); same lines by name; the other lines."""
    cases, same, other = {}, {}, []
    for line in stdout.splitlines():
        f = line.split()
        if f and f[0] == "case":
            fields = dict(x.split("=", 1) for x in f[4:] if "=" in x)
            cases[(f[1], f[2])] = dict(fields, kind=f[3], ok=f[-1] == "ok", line=line)
        elif f and f[0] == "same":
            same[f[1]] = line
        else:
            other.append(line)
    return cases, same, other


def _failed(res, what):
    """The exit status, the first failing lines (or the last lines), stderr."""
    lines = res.stdout.splitlines()
    bad = [line for line in lines if "FAIL" in line]
    shown = bad[:12] + ([f"... and {len(bad) - 12} more failing lines"] if len(bad) > 12 else []) + lines[-1:]
    return (f"{what}: exit {res.returncode} ({EXITS.get(res.returncode, 'the program found failures')})\n"
            + "\n".join(shown if bad else lines[-15:]) + f"\n{res.stderr[-2000:]}")


def test_native_amx_kernels_agree_with_their_twin_under_the_emulator(program):
    host = _run([program], timeout=120)
    assert host.returncode == 0, _failed(host, "on this machine")
    guest = _run([BXRUN, "-n", program], timeout=400)
    assert guest.returncode == 0, _failed(guest, "under bxrun")
    h_cases, h_same, h_other = _parse(host.stdout)
    g_cases, g_same, g_other = _parse(guest.stdout)

    # under the emulator the native family ran, and its release check can fail
    assert g_other[0] == "amx runnable", g_other[0]
    assert "release-check ok" in g_other
    names = sorted({name for name, family in g_cases})
    assert len(names) >= 45 and names == sorted({name for name, family in h_cases}), names
    for name in names:
        nat, twin, here = g_cases[(name, "amx")], g_cases[(name, "amx-twin")], h_cases[(name, "amx-twin")]
        for c in (nat, twin, here):
            assert c["ok"] and c["guards"] == "ok" and c["tiles"] == "released", c["line"]
        # the twin's arithmetic is ordinary C: the same bits on both machines
        assert twin["hash"] == here["hash"] and twin["ref"] == here["ref"], (twin["line"], here["line"])
        if nat["match"] == "bits":
            assert nat["hash"] == here["hash"], (nat["line"], here["line"])
            assert g_same[name].split()[2] == "equal", g_same[name]
        else:   # random bfloat16: each within its bound (checked above), not equal to the twin
            assert nat["kind"] == "bound" and nat["ref"].startswith("within"), nat["line"]
        assert g_same[name].endswith(" ok"), g_same[name]
        if (name, "amx") in h_cases:   # this CPU runs AMX itself: the same rules here
            c = h_cases[(name, "amx")]
            assert c["ok"] and (c["match"] == "bound" or c["hash"] == here["hash"]), c["line"]
            assert h_same[name].endswith(" ok"), h_same[name]
    exact = [n for n in names if g_cases[(n, "amx")]["match"] == "bits"]
    assert len(exact) >= 35

    # int8 at a few rows a group takes the vector kernels where a family serves them (the
    # emulated CPU has AVX512-VNNI), with the tiles' bits
    few = [line for line in g_other if line.startswith("few-rows-vector ")]
    assert len(few) == 1 and few[0].startswith("few-rows-vector ok: the vector kernels of avx512-vnni"), few

    # the refused permission request, simulated where the OS grants it
    perm = [line for line in g_other if line.startswith("perm ")]
    assert len(perm) == 4 and all(" ok: " in line for line in perm), perm
    assert all("refused the AMX tile state" in line for line in perm[:3]), perm
    assert perm[3] == "perm asked-again ok: runnable"
    assert g_other[-1] == f"summary {len(names)} cases, 0 failures"
    assert h_other[-1] == f"summary {len(names)} cases, 0 failures"

"""Build of the C extension raggeddot._core.

Only the Extension and its build hook live here; metadata is in pyproject.toml.
Any C compiler setuptools drives builds it: gcc >= 10, clang >= 14, Apple clang.
OpenMP is used when a small program built with it runs: first with -fopenmp
(gcc; clang with libomp), then, on macOS, the way Apple clang takes Homebrew's
libomp (-Xpreprocessor -fopenmp, -lomp, libomp's include and lib folders: from
RAGGEDDOT_LIBOMP_PREFIX, `brew --prefix libomp`, /opt/homebrew/opt/libomp or
/usr/local/opt/libomp). Without it the kernels run single-threaded, and
build_info()["openmp_note"] says why. RAGGEDDOT_NO_OPENMP=1 skips the probe.
Every file is compiled with -ffp-contract=off: the products' bits must not
depend on whether a compiler fuses a * b + c (gcc does by default on aarch64).
RAGGEDDOT_SANITIZE=1 builds with AddressSanitizer and UndefinedBehaviorSanitizer
(for the checks of .ci/sanitize; such a build needs libasan preloaded).
"""
import os
import shutil
import subprocess
import sys
import tempfile
from glob import glob

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPENMP_PROBE = r"""
#include <omp.h>
#include <stdio.h>
int main(void) {
    int n = 0;
    #pragma omp parallel reduction(+:n)
    n += 1;
    printf("%d\n", n > 0 && omp_get_max_threads() > 0);
    return 0;
}
"""

BASE_FLAGS = ["-O3", "-Wall", "-Wextra", "-fno-strict-aliasing", "-ffp-contract=off"]
# (-O1 after -O3: the sanitized copy compiles in half the time and still
# inlines enough to run its tests quickly)
SANITIZE_FLAGS = ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer", "-g"]


def _probe(compiler, compile_args, link_args):
    """Compile, link and run OPENMP_PROBE with the extension's compiler and
    these arguments; None when it ran, else what failed (one line)."""
    tmp = tempfile.mkdtemp(prefix="raggeddot-omp-")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(OPENMP_PROBE)
        objects = compiler.compile([src], output_dir=tmp, extra_postargs=compile_args)
        exe = os.path.join(tmp, "probe")
        compiler.link_executable(objects, exe, extra_postargs=link_args)
        out = subprocess.run([exe], capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and out.stdout.strip() == "1":
            return None
        return f"the probe program ran with status {out.returncode}"
    except Exception as e:  # any failure of the probe means: not with these arguments
        return str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _libomp_prefixes():
    """Where Homebrew's (or a user's) libomp may be, most specific first."""
    found = []
    env = os.environ.get("RAGGEDDOT_LIBOMP_PREFIX")
    if env:
        found.append(env)
    if shutil.which("brew"):
        try:
            out = subprocess.run(["brew", "--prefix", "libomp"], capture_output=True, text=True, timeout=60)
            if out.returncode == 0 and out.stdout.strip():
                found.append(out.stdout.strip())
        except (OSError, subprocess.TimeoutExpired):
            pass
    found += ["/opt/homebrew/opt/libomp", "/usr/local/opt/libomp"]
    return [p for i, p in enumerate(found) if p not in found[:i] and os.path.isdir(p)]


def _openmp_args(compiler):
    """(compile arguments, link arguments, note): the first way of building
    with OpenMP whose probe runs, or ([], [], why none did)."""
    if os.environ.get("RAGGEDDOT_NO_OPENMP", "") in ("1", "true", "yes"):
        return [], [], "built without OpenMP: RAGGEDDOT_NO_OPENMP was set"
    why = _probe(compiler, ["-fopenmp"], ["-fopenmp"])
    if why is None:
        return ["-fopenmp"], ["-fopenmp"], ""
    tried = [f"-fopenmp: {why}"]
    if sys.platform == "darwin":
        prefixes = _libomp_prefixes()
        for prefix in prefixes:
            inc, lib = os.path.join(prefix, "include"), os.path.join(prefix, "lib")
            cargs = ["-Xpreprocessor", "-fopenmp", "-I" + inc]
            largs = ["-L" + lib, "-lomp", "-Wl,-rpath," + lib]
            why = _probe(compiler, cargs, largs)
            if why is None:
                return cargs, largs, ""
            tried.append(f"-Xpreprocessor -fopenmp with {prefix}: {why}")
        if not prefixes:
            tried.append("no libomp found (brew install libomp, or set RAGGEDDOT_LIBOMP_PREFIX)")
    return [], [], "built without OpenMP (single-threaded): " + "; ".join(tried)


class BuildExt(build_ext):
    def build_extensions(self):
        cargs, largs, note = _openmp_args(self.compiler)
        if note:
            print("raggeddot: " + note, file=sys.stderr)
        sanitize = os.environ.get("RAGGEDDOT_SANITIZE", "") in ("1", "true", "yes")
        extra = SANITIZE_FLAGS if sanitize else []
        for ext in self.extensions:
            ext.extra_compile_args = BASE_FLAGS + cargs + extra
            ext.extra_link_args = largs + extra
            # the note as a C string literal (build_info()["openmp_note"])
            ext.define_macros = [m for m in ext.define_macros if m[0] != "RD_OPENMP_NOTE"]
            ext.define_macros.append(("RD_OPENMP_NOTE", '"' + note.replace("\\", "/").replace('"', "'") + '"'))
        if self.parallel is None:   # compile the C files on every core (pip gives no -j)
            self.parallel = os.cpu_count() or 1
        super().build_extensions()


def extension():
    """The C extension: every file under csrc/ (the portable frame, the
    kernels of every architecture, each guarded by its own macros)."""
    return Extension(
        "raggeddot._core",
        sources=sorted(glob("csrc/**/*.c", recursive=True)),
        depends=sorted(glob("csrc/**/*.h", recursive=True)),
        include_dirs=["csrc", numpy.get_include()],
        libraries=["m"],
    )


# (.ci/arm64 and .ci/compilers import this file for BASE_FLAGS and
# extension(); setuptools runs it as __main__)
if __name__ == "__main__":
    setup(ext_modules=[extension()], cmdclass={"build_ext": BuildExt})

"""Build of the C extension raggeddot._core.

Only the Extension and its build hook live here; metadata is in pyproject.toml.
OpenMP is used when a small program compiled and linked with -fopenmp runs;
RAGGEDDOT_NO_OPENMP=1 skips it, and the kernels then run single-threaded.
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

BASE_FLAGS = ["-O3", "-Wall", "-Wextra", "-fno-strict-aliasing"]
# (-O1 after -O3: the sanitized copy compiles in half the time and still
# inlines enough to run its tests quickly)
SANITIZE_FLAGS = ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer", "-g"]


def _openmp_works(compiler):
    """Compile, link and run OPENMP_PROBE with the extension's compiler."""
    tmp = tempfile.mkdtemp(prefix="raggeddot-omp-")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(OPENMP_PROBE)
        objects = compiler.compile([src], output_dir=tmp, extra_postargs=["-fopenmp"])
        exe = os.path.join(tmp, "probe")
        compiler.link_executable(objects, exe, extra_postargs=["-fopenmp"])
        out = subprocess.run([exe], capture_output=True, text=True, timeout=60)
        return out.returncode == 0 and out.stdout.strip() == "1"
    except Exception:  # any failure of the probe means: build without OpenMP
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class BuildExt(build_ext):
    def build_extensions(self):
        use_openmp = os.environ.get("RAGGEDDOT_NO_OPENMP", "") not in ("1", "true", "yes")
        if use_openmp and not _openmp_works(self.compiler):
            print("raggeddot: OpenMP probe failed; building single-threaded", file=sys.stderr)
            use_openmp = False
        sanitize = os.environ.get("RAGGEDDOT_SANITIZE", "") in ("1", "true", "yes")
        extra = SANITIZE_FLAGS if sanitize else []
        for ext in self.extensions:
            ext.extra_compile_args = BASE_FLAGS + (["-fopenmp"] if use_openmp else []) + extra
            ext.extra_link_args = (["-fopenmp"] if use_openmp else []) + extra
        if self.parallel is None:   # compile the C files on every core (pip gives no -j)
            self.parallel = os.cpu_count() or 1
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "raggeddot._core",
            sources=sorted(glob("csrc/**/*.c", recursive=True)),
            depends=sorted(glob("csrc/**/*.h", recursive=True)),
            include_dirs=["csrc", numpy.get_include()],
            libraries=["m"],
        )
    ],
    cmdclass={"build_ext": BuildExt},
)

"""Compile every C file of the extension with one compiler, the build's own
flags (setup.py's BASE_FLAGS) and -Werror, and optionally link the
extension: the checks that the C builds without a warning under compilers
and architectures other than the one pip uses here.

    python .ci/cbuild.py --cc clang-14                      (x86-64, this Python)
    python .ci/cbuild.py --cc aarch64-linux-gnu-gcc --root ROOT --link PATH.so
        (aarch64 against the Python and NumPy headers of the arm64 Debian
         userland ROOT; PATH.so the linked extension)
"""
import argparse
import concurrent.futures as cf
import glob
import os
import shlex
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
import setup  # noqa: E402  (the build's flags and sources; setup() runs only as __main__)


def include_dirs(root):
    """-I arguments: the repository's csrc, Python's and NumPy's headers
    (this interpreter's, or those of the userland at root)."""
    if root is None:
        import numpy
        return ["-I", "csrc", "-I", sysconfig.get_paths()["include"], "-I", numpy.get_include()]
    pys = sorted(glob.glob(os.path.join(root, "usr/include/python3.*/Python.h")))
    nps = sorted(glob.glob(os.path.join(root, "usr/lib/python3/dist-packages/numpy/core/include")) +
                 glob.glob(os.path.join(root, "usr/local/lib/python3*/dist-packages/numpy/core/include")))
    if not pys or not nps:
        sys.exit(f"cbuild: no Python or NumPy headers under {root}")
    # (the userland's pyconfig.h includes its multiarch one: its /usr/include
    # after the compiler's own headers)
    return ["-I", "csrc", "-I", os.path.dirname(pys[-1]), "-idirafter", os.path.join(root, "usr/include"),
            "-I", nps[-1]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cc", required=True, help="the compiler command (may hold arguments)")
    ap.add_argument("--root", help="an arm64 userland whose headers to build against")
    ap.add_argument("--no-openmp", action="store_true")
    ap.add_argument("--link", help="link the extension to this path")
    args = ap.parse_args()
    os.chdir(REPO)
    cc = shlex.split(args.cc)
    omp = [] if args.no_openmp else ["-fopenmp"]
    flags = setup.BASE_FLAGS + omp + ["-fPIC", "-Werror", '-DRD_OPENMP_NOTE=""'] + include_dirs(args.root)
    sources = setup.extension().sources
    out = os.path.join(REPO, "build", "cbuild-" + "-".join(os.path.basename(c) for c in cc[:2]).replace("=", "_"))
    os.makedirs(out, exist_ok=True)

    def compile_one(src):
        obj = os.path.join(out, src.replace("/", "_") + ".o")
        proc = subprocess.run(cc + ["-c", src, "-o", obj] + flags, capture_output=True, text=True)
        return src, obj, proc.returncode, proc.stderr

    failed = False
    objects = []
    with cf.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for src, obj, rc, err in pool.map(compile_one, sources):
            objects.append(obj)
            if rc != 0 or err.strip():
                failed = True
                print(f"cbuild: {args.cc}: {src}\n{err}", file=sys.stderr)
    if failed:
        sys.exit(1)
    print(f"cbuild: {args.cc}: {len(sources)} files, no warnings")
    if args.link:
        proc = subprocess.run(cc + ["-shared", "-o", args.link] + objects + omp + ["-lm"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"cbuild: linking {args.link} failed:\n{proc.stderr}")


if __name__ == "__main__":
    main()

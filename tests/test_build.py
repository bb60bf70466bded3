"""The C sources compile without warnings at -Wall -Wextra (and without -ffast-math)."""
import pathlib
import shutil
import subprocess
import sysconfig

import numpy as np
import pytest

import raggeddot
from raggeddot import runtime

ROOT = pathlib.Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"


@pytest.mark.skipif(not CSRC.is_dir(), reason="installed without its sources")
@pytest.mark.parametrize("openmp", [True, False], ids=["openmp", "no-openmp"])
def test_c_sources_compile_warning_free(openmp):
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "a C compiler is needed to build raggeddot"
    sources = sorted(str(p) for p in CSRC.rglob("*.c"))
    assert any(s.endswith("rd_py_module.c") for s in sources)
    cmd = [cc, "-fsyntax-only", "-O3", "-Wall", "-Wextra", "-Werror",
           f"-I{CSRC}", f"-I{np.get_include()}", f"-I{sysconfig.get_paths()['include']}"]
    cmd += ["-fopenmp"] if openmp else []
    result = subprocess.run(cmd + sources, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_setup_never_uses_fast_math():
    """-ffast-math/-Ofast break NaN propagation and finite-difference gradient checks."""
    setup = (ROOT / "setup.py").read_text()
    assert '"-O3"' in setup
    assert "fast-math" not in setup and "Ofast" not in setup


def test_build_info_reports_the_build():
    info = raggeddot.build_info()
    assert isinstance(info, dict)
    assert isinstance(info["openmp"], bool)
    assert isinstance(info["simd"], (list, tuple)) and "ref" in info["simd"]
    assert set(info["simd"]) == set(runtime.compiled_kernels())
    assert info["kernel"] in info["simd"] and info["kernel"] == runtime.get_kernel()


def test_every_twin_is_compiled_on_every_architecture():
    """The twins are plain C: every build lists them, runnable, whatever the
    CPU, so the shared suite runs the same families everywhere."""
    twins = {k["name"]: k["runnable"] for k in raggeddot.build_info()["kernels"] if k["name"].endswith("-twin")}
    assert twins == {name: True for name in ("avx512-bf16-twin", "avx512-vnni-twin", "avx-vnni-twin", "amx-twin",
                                             "neon-bf16-twin", "neon-i8mm-twin", "neon-dot-twin")}

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


def _setup_module():
    """setup.py as a module (its setup() call runs only as __main__)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("raggeddot_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not (ROOT / "setup.py").is_file(), reason="installed without its sources")
def test_openmp_is_found_the_apple_clang_way_or_the_build_says_why(monkeypatch, tmp_path):
    """Apple clang has no -fopenmp: the probe then tries -Xpreprocessor
    -fopenmp with libomp's include and lib folders (RAGGEDDOT_LIBOMP_PREFIX,
    Homebrew's); with neither, the build is single-threaded and its note
    says why and what to install."""
    setup = _setup_module()
    tried = []

    def probe(compiler, cargs, largs):
        tried.append(cargs)
        return None if "-Xpreprocessor" in cargs else "clang: error: unsupported option '-fopenmp'"

    monkeypatch.setattr(setup, "_probe", probe)
    monkeypatch.setattr(setup.sys, "platform", "darwin")
    monkeypatch.setattr(setup.shutil, "which", lambda name: None)      # no brew
    prefix = tmp_path / "libomp"
    (prefix / "include").mkdir(parents=True)
    (prefix / "lib").mkdir()
    monkeypatch.setenv("RAGGEDDOT_LIBOMP_PREFIX", str(prefix))
    cargs, largs, note = setup._openmp_args(None)
    assert tried[0] == ["-fopenmp"] and note == ""
    assert cargs == ["-Xpreprocessor", "-fopenmp", f"-I{prefix / 'include'}"]
    assert f"-L{prefix / 'lib'}" in largs and "-lomp" in largs

    monkeypatch.setattr(setup, "_libomp_prefixes", lambda: [])
    cargs, largs, note = setup._openmp_args(None)
    assert cargs == largs == [] and "single-threaded" in note and "brew install libomp" in note
    # elsewhere a failed -fopenmp is the whole story
    monkeypatch.setattr(setup.sys, "platform", "linux")
    assert setup._openmp_args(None)[2].startswith("built without OpenMP (single-threaded): -fopenmp: clang")
    monkeypatch.setenv("RAGGEDDOT_NO_OPENMP", "1")
    assert "RAGGEDDOT_NO_OPENMP" in setup._openmp_args(None)[2]


def test_build_info_says_why_there_are_no_threads():
    info = raggeddot.build_info()
    assert isinstance(info["openmp_note"], str)
    assert (info["openmp_note"] == "") == info["openmp"]

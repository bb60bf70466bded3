"""What a new user meets first: the submodules the README names are
attributes of the package (imported lazily, so ``import raggeddot`` stays
light), ml_dtypes is a dependency, errors of moe_block's activation_qtype
name it, and ``python -m raggeddot --help`` describes the run in whole
sentences."""
import pathlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import raggeddot

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAZY = ("reference", "testing", "specs", "distributed")


def _run(code):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True).stdout


def test_submodules_of_the_readme_table_are_attributes():
    table = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")]
    named = set()
    for line in table:
        first = line.split("|")[1]
        named.update(re.findall(r"`raggeddot\.(\w+)`", first))           # `raggeddot.runtime`
        named.update(re.findall(r"`(\w+)\.\w+\(", first))                 # `testing.check_grads(...)`
    assert {"runtime", "reference", "testing"} <= named
    out = _run("import raggeddot\n"
               f"for name in {sorted(named)!r}:\n"
               "    m = getattr(raggeddot, name)\n"
               "    print(name, type(m).__name__)\n"
               "raggeddot.testing.check_grads; raggeddot.reference.ragged_dot\n")
    assert out.split() == [w for name in sorted(named) for w in (name, "module")]


def test_submodules_load_on_first_use_only():
    out = _run("import sys, raggeddot\n"
               f"print(*[f'raggeddot.{{n}}' in sys.modules for n in {LAZY!r}])\n"
               "print('mpi4py' in sys.modules, 'raggeddot.testing' in dir(raggeddot) or 'testing' in dir(raggeddot))\n"
               "raggeddot.testing\n"
               "print('raggeddot.testing' in sys.modules, 'raggeddot.reference' in sys.modules)\n")
    lines = out.splitlines()
    assert lines[0].split() == ["False"] * len(LAZY)     # nothing imported by `import raggeddot`
    assert lines[1].split() == ["False", "True"]          # listed by dir(); no MPI import
    assert lines[2].split() == ["True", "False"]          # only the one asked for
    for name in LAZY:
        assert isinstance(getattr(raggeddot, name), types.ModuleType)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_module'"):
        raggeddot.no_such_module


def test_ml_dtypes_is_a_dependency():
    try:
        import tomllib
    except ImportError:   # Python < 3.11: the bench extra's tomli
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(re.match(r"ml[_-]dtypes\b", dep) for dep in project["dependencies"])


def _layer(rng):
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w = rng.standard_normal((3, 4, 2)).astype(np.float32)
    return (x, rng.standard_normal((4, 3)).astype(np.float32), w, w, rng.standard_normal((3, 2, 4)).astype(np.float32))


@pytest.mark.parametrize("qtype", ["int16", "float8", 5, [1], np.dtype(np.int16)])
def test_activation_qtype_errors_name_it(rng, qtype):
    with pytest.raises(ValueError, match=r"^moe_block: 'activation_qtype' must be None or one of"):
        raggeddot.moe_block(*_layer(rng), top_k=2, activation_qtype=qtype)


def test_activation_qtype_float8_without_ml_dtypes(rng, monkeypatch):
    from raggeddot import quant
    monkeypatch.setattr(quant, "ml_dtypes", None)
    with pytest.raises(ValueError, match=r"^moe_block: 'activation_qtype'='float8_e4m3fn' needs the ml_dtypes"):
        raggeddot.moe_block(*_layer(rng), top_k=2, activation_qtype="float8_e4m3fn")
    with pytest.raises(ValueError, match=r"^moe_block(_vjp)?: 'activation_qtype'='float8_e4m3fn' needs"):
        raggeddot.moe_block_vjp(*_layer(rng), top_k=2, activation_qtype="float8_e4m3fn")


def test_activation_qtype_dtype_is_accepted(rng):
    args = _layer(rng)
    assert np.array_equal(raggeddot.moe_block(*args, top_k=2, activation_qtype=np.dtype(np.int8)),
                          raggeddot.moe_block(*args, top_k=2, activation_qtype="int8"))


def test_main_help_describes_the_run():
    out = subprocess.run([sys.executable, "-m", "raggeddot", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    text = " ".join(out.split())
    assert "check raggeddot on the specs tagged 'main' (raggeddot.specs) and time it against a NumPy " \
           "per-group loop." in text
    assert 'The run ends with a line "N passed, M failed" and exits with status 1 when a check failed.' in text

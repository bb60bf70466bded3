"""The test run shows no warnings that are not raggeddot's to act on (item
12): the half-precision tests widen NaN patterns without NumPy's cast
warning, and the only filters of the configuration are of torch's and
transformers' deprecations."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _filters():
    try:
        import tomllib
    except ImportError:    # Python < 3.11
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["filterwarnings"]


def test_filters_are_of_torch_and_transformers_only():
    for f in _filters():
        action, message, category, module = (f.split(":") + ["", "", ""])[:4]
        assert action == "ignore", f
        assert "raggeddot" not in f, f
        assert category in ("DeprecationWarning", "FutureWarning"), f
        assert module.startswith(("torch", "transformers")) or "torch" in message, f


def test_half_precision_widening_warns_nothing():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
                           "tests/test_half_precision.py", "-k", "every_half_value and ref"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "warning" not in proc.stdout.lower(), proc.stdout[-3000:]

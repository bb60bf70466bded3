"""Fixtures of the raggeddot test suite (shared functions are in helpers.py).

- ``rng``: a NumPy Generator seeded from the test's node id (crc32, so the
  seed is stable across runs and processes, unlike ``hash()``): every
  parametrized case gets its own reproducible stream.
- ``restore_runtime``: every runtime setting (kernel, threads, streaming
  threshold, buffer cache) is put back after the test, whatever it did.
- ``jax``, ``x64``, ``megablox``: jax (on the CPU, float32 products in full
  precision: the oracle must not be a TF32 GPU product; 64-bit types off, its default), a
  context factory ``x64(enabled=True)`` that turns them on or off, and
  megablox's gmm module. They skip when jax is missing, except that with
  RAGGEDDOT_REQUIRE_JAX=1 (CI) a missing jax stops the run (pytest_configure).
- torch and transformers (the ``hf`` extra) are imported by the one module
  that uses them, through helpers.import_hf(): it skips that module when they
  are missing, except that with RAGGEDDOT_REQUIRE_HF=1 (CI) it fails. (Not
  in pytest_configure: every other pytest run, the sanitizer's included,
  stays free of torch.)
"""

import os
import zlib

# The NumPy oracle multiplies many small matrices, where a team of OpenBLAS
# threads costs more than it computes (it also competes with raggeddot's own
# OpenMP threads for the cores). Set before NumPy loads; an explicit setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# The suite must not run on plans tuned on this machine: `import raggeddot` leaves the
# user's plans file unread (test_tune.py writes and reads its own, in a temporary directory).
os.environ.setdefault("RAGGEDDOT_PLANS", "0")
# jax is the oracle of the conformance tests, and raggeddot.jax's custom calls are CPU
# ones: jax runs on the CPU whatever accelerator the machine has (on a GPU it would run
# jax.lax.ragged_dot in TF32), and float32 products in full precision. Set before any
# test module imports jax; the `jax` fixture checks both took.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from raggeddot import runtime  # noqa: E402


@pytest.fixture
def rng(request):
    seed = zlib.crc32(request.node.nodeid.encode("utf-8"))
    return np.random.default_rng(seed)


@pytest.fixture
def restore_runtime():
    with runtime.configured():
        yield


@pytest.fixture(scope="session")
def jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_default_matmul_precision", "highest")
    return jax


@pytest.fixture(scope="session")
def x64(jax):
    """``x64(enabled=True)``: a context in which jax's 64-bit types are on (or
    off); float64 inputs then stay float64. The global flag is never flipped."""
    def context(enabled=True):
        if hasattr(jax, "enable_x64"):
            return jax.enable_x64(enabled)
        from jax.experimental import disable_x64, enable_x64  # older jax
        return enable_x64() if enabled else disable_x64()
    return context


@pytest.fixture(scope="session")
def megablox(jax):
    """megablox's gmm *module* (the package re-exports the gmm function as ``gmm``)."""
    return pytest.importorskip("jax.experimental.pallas.ops.tpu.megablox.gmm")


def pytest_configure(config):
    """In CI (RAGGEDDOT_REQUIRE_JAX=1) the conformance tests against jax must
    run: a missing jax is an error there, not a reason to skip them."""
    if os.environ.get("RAGGEDDOT_REQUIRE_JAX") == "1":
        try:
            import jax  # noqa: F401
            from jax.experimental.pallas.ops.tpu.megablox import gmm  # noqa: F401
        except Exception as e:  # ImportError, or a broken install
            raise pytest.UsageError(
                f"RAGGEDDOT_REQUIRE_JAX=1 but jax (with megablox) cannot be imported: {e!r}; "
                "install the test extra: pip install -e '.[test]'"
            )


def pytest_collection_modifyitems(config, items):
    """The tests that import torch (the conformance tests against
    transformers, raggeddot.torch's) run last: running torch and
    transformers leaves state in the process (their objects, caches and
    threads) that the leak tests' measurements of reference counts and traced
    memory would see as growth if those ran after them."""
    torch_modules = ("test_hf_conformance.py", "test_hf_experts.py", "test_torch_ops.py")
    items.sort(key=lambda item: item.path.name in torch_modules)   # stable: order kept otherwise

"""raggeddot: grouped ("ragged") matrix multiplication for NumPy on the CPU.

The semantics are those of ``jax.lax.ragged_dot`` and of megablox's grouped
matmuls; the arithmetic runs in a C extension (``raggeddot._core``) with packed
panels, SIMD micro-kernels and OpenMP threads. ``raggeddot.reference`` states
the same math in plain NumPy.

The submodules ``reference`` (the NumPy oracle), ``testing``
(``check_grads``), ``specs`` (the named benchmark shapes) and
``distributed`` (expert parallelism over MPI) are attributes of the
package, imported on first use (``raggeddot.testing.check_grads`` works
after ``import raggeddot``) so that ``import raggeddot`` does not pay for
them; so are ``tiling`` (the tile-revisit efficiency) and the plan tuner's
``tune`` and ``tabulate``.

``import raggeddot`` sets the tuned plans of this CPU and build from the
cache directory's plans file, when there is one (``RAGGEDDOT_PLANS=0``
skips it; see ``raggeddot.tune``).
"""
import importlib

from . import _plans, runtime
from ._autodiff import grad, jvp, vjp
from ._megablox import gmm, make_group_metadata, tgmm
from ._moe import moe_block, moe_block_vjp, ragged_gather, ragged_gather_reduce
from ._prepack import PackedRhs, prepack
from ._ragged_dot import ragged_dot
from ._ragged_dot_general import RaggedDotDimensionNumbers, ragged_dot_general
from .quant import AsQArray, QArray, dequantize, quantize
from .runtime import build_info, get_num_threads, set_buffer_cache, set_num_threads

__version__ = "0.1.0"


__all__ = [
    "ragged_dot",
    "prepack",
    "PackedRhs",
    "ragged_dot_general",
    "RaggedDotDimensionNumbers",
    "QArray",
    "AsQArray",
    "quantize",
    "dequantize",
    "make_group_metadata",
    "gmm",
    "tgmm",
    "moe_block",
    "moe_block_vjp",
    "ragged_gather",
    "ragged_gather_reduce",
    "set_num_threads",
    "get_num_threads",
    "set_buffer_cache",
    "build_info",
    "vjp",
    "jvp",
    "grad",
    "runtime",
    "tune",
    "tabulate",
]

#: Submodules imported on first attribute access (PEP 562); ``jax`` and ``torch`` import jax and torch then.
_LAZY_SUBMODULES = ("reference", "testing", "specs", "distributed", "jax", "torch", "tiling")
#: Functions imported on first access, from these submodules.
_LAZY_FUNCTIONS = {"tune": "._tune", "tabulate": "._tune"}


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _LAZY_FUNCTIONS:
        value = getattr(importlib.import_module(_LAZY_FUNCTIONS[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value   # later accesses skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES) | set(_LAZY_FUNCTIONS))


_plans.load_at_import()

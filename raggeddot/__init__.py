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
them.
"""
import importlib

from . import runtime
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
]

#: Submodules imported on first attribute access (PEP 562); ``jax`` and ``torch`` import jax and torch then.
_LAZY_SUBMODULES = ("reference", "testing", "specs", "distributed", "jax", "torch")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module   # later accesses skip this function
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))

"""raggeddot: grouped ("ragged") matrix multiplication for NumPy on the CPU.

The semantics are those of ``jax.lax.ragged_dot`` and of megablox's grouped
matmuls; the arithmetic runs in a C extension (``raggeddot._core``) with packed
panels, SIMD micro-kernels and OpenMP threads. ``raggeddot.reference`` states
the same math in plain NumPy.
"""
from . import _core
from ._autodiff import grad, jvp, vjp
from ._general import RaggedDotDimensionNumbers, ragged_dot_general
from ._megablox import gmm, tgmm
from ._moe import moe_block, moe_block_vjp, ragged_gather, ragged_gather_reduce
from ._ops import make_group_metadata, ragged_dot

__version__ = "0.1.0"

__all__ = [
    "ragged_dot",
    "ragged_dot_general",
    "RaggedDotDimensionNumbers",
    "make_group_metadata",
    "gmm",
    "tgmm",
    "moe_block",
    "moe_block_vjp",
    "ragged_gather",
    "ragged_gather_reduce",
    "set_num_threads",
    "get_num_threads",
    "build_info",
    "vjp",
    "jvp",
    "grad",
]


def set_num_threads(n):
    """Set the number of threads of the kernels (default: RAGGEDDOT_NUM_THREADS,
    else OpenMP's default). Results are bitwise identical for every count."""
    import operator

    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"set_num_threads: 'n' must be an integer, got {n!r}") from None
    if n < 1:
        raise ValueError(f"set_num_threads: 'n' must be >= 1, got {n}")
    _core.set_num_threads(n)


def get_num_threads():
    """The number of threads the kernels run on (1 in a build without OpenMP)."""
    return _core.get_num_threads()


def build_info():
    """How the extension was built and what it runs: {'openmp': bool, 'simd':
    [compiled micro-kernels], 'kernel': kernel in use, 'cpu_avx2': bool,
    'num_threads': int, 'blocking': {dtype: {MR, NR, MC, KC, NC}}}."""
    return _core.build_info()

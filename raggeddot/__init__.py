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
    "set_buffer_cache",
    "build_info",
    "vjp",
    "jvp",
    "grad",
]


def _int_at_least(value, least, name, fn):
    import operator

    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: '{name}' must be an integer, got {value!r}") from None
    if value < least:
        raise ValueError(f"{fn}: '{name}' must be >= {least}, got {value}")
    return value


def set_num_threads(n):
    """Set the number of threads of the kernels (default: RAGGEDDOT_NUM_THREADS,
    else OpenMP's default). Results are bitwise identical for every count."""
    _core.set_num_threads(_int_at_least(n, 1, "n", "set_num_threads"))


def get_num_threads():
    """The number of threads the kernels run on (1 in a build without OpenMP)."""
    return _core.get_num_threads()


def set_buffer_cache(nbytes):
    """Limit the memory of freed result buffers kept for reuse; returns the
    previous limit (default 2 GiB). 0 keeps none and releases what is kept.

    The results of ragged_dot, gmm and tgmm (and so of the gradients and MoE
    layers built on them) of 4 MiB or more live in blocks that go back to
    this cache when their last array is deleted; the next result of about the
    same size reuses one. A fresh block of that size costs the OS's zeroing
    of every page on first touch, which for tgmm's ``[g, k, n]`` output with
    small groups takes longer than the products. A loop that computes
    same-shaped results step after step (training) pays it only once.
    Passing ``out=`` reuses a buffer explicitly instead."""
    return _core.set_buffer_cache(_int_at_least(nbytes, 0, "nbytes", "set_buffer_cache"))


def build_info():
    """How the extension was built and what it runs: {'openmp': bool, 'simd':
    [compiled micro-kernels], 'kernel': kernel in use, 'cpu_avx2': bool,
    'cpu_avx512': bool, 'num_threads': int, 'blocking': {dtype: {MR, NR, MC,
    KC, NC}}, 'stream_threshold': output bytes from which a written-once
    output gets non-temporal stores, 'buffer_cache': {'limit', 'idle'} bytes}."""
    return _core.build_info()

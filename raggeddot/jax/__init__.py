"""raggeddot inside jax programs: ``ragged_dot``, ``ragged_dot_general``,
``gmm`` and ``tgmm`` on jax arrays, with jax's and megablox's signatures,
eager or under ``jax.jit``, each an XLA FFI custom call (CPU) into
raggeddot's own C drivers: the kernels, thread count and results of the
NumPy API, without jax's dense CPU lowering of ragged_dot (a ``[g, m, k]``
masked copy of lhs and ``g`` times the FLOPs).

Group sizes (and group offsets) are runtime operands: under ``jax.jit`` a
negative size or sizes summing past the ragged dimension make the call
raise when it runs, with a message naming them. float16 / bfloat16 operands
are read in place; the output has the requested dtype. Every function is
differentiable in both modes (jvp, vjp, grad: the tangents and cotangents
are the same custom calls, megablox's backward) and batchable (``vmap``
maps onto the calls' batch dimension).

The C handlers (``rd_ffi.c`` in this package) are compiled on first use
into ``$RAGGEDDOT_CACHE_DIR`` (default ``~/.cache/raggeddot``) against the
installed jaxlib's FFI header; :func:`build_info` says where and why.
Requires jax and jaxlib (``pip install 'raggeddot[jax]'``) and a C compiler.
"""
try:
    import jax as _jax  # noqa: F401
except ImportError as e:   # pragma: no cover - depends on the environment
    raise ImportError("raggeddot.jax needs jax and jaxlib: pip install 'raggeddot[jax]'") from e

from ._api import gmm, ragged_dot, ragged_dot_general, tgmm
from ._build import build_info
from .._ragged_dot_general import RaggedDotDimensionNumbers

__all__ = ["ragged_dot", "ragged_dot_general", "gmm", "tgmm", "RaggedDotDimensionNumbers", "build_info"]

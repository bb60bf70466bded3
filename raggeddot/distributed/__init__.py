"""Expert parallelism across processes and machines, on MPI (mpi4py).

- :func:`ragged_all_to_all`: jax.lax.ragged_all_to_all's semantics over the
  ranks of a communicator (one MPI_Alltoallw on derived datatypes).
- :func:`moe_block`, :func:`moe_block_vjp`: raggeddot.moe_block with the
  experts spread over the ranks: each rank routes its own tokens, sends each
  token row to the rank holding its expert, computes its experts, and gets
  the results back for the weighted combine.

Every function is collective: each rank of ``comm`` calls it, in the same
order. Arguments are checked on every rank and the verdict is shared before
anything moves, so a bad argument on one rank raises the same exception on
every rank (no hang, no partial result); an exception after the exchanges
have started calls ``comm.Abort(1)``.

mpi4py is imported when a function is first called, not when this package
is imported; without it the call raises ImportError saying to
``pip install 'raggeddot[mpi]'``. Run with ``mpiexec -n P python script.py``
and ``RAGGEDDOT_NUM_THREADS`` x ranks per machine <= its cores.
"""
from .alltoall import ragged_all_to_all
from .moe import moe_block, moe_block_vjp

__all__ = ["ragged_all_to_all", "moe_block", "moe_block_vjp"]

"""The MPI plumbing of raggeddot.distributed: importing mpi4py on first use,
agreeing on errors before any data moves, a sum over ranks that gives the
same bits on every rank, and the abort that keeps a failure after an
exchange has started from becoming a deadlock.

Every function here is collective unless it says otherwise: each rank of
``comm`` must call it, in the same order.
"""
import contextlib
import sys
import traceback
import zlib

import numpy as np

__all__ = ["mpi", "check_comm", "agree", "ordered_sum", "abort_on_error"]

_INSTALL_HINT = ("raggeddot.distributed needs mpi4py and an MPI library: "
                 "pip install 'raggeddot[mpi]' (mpi4py and the MPICH wheel)")


def mpi():
    """The ``mpi4py.MPI`` module (not collective). ImportError with the
    install command when mpi4py is missing."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT}; importing mpi4py failed: {e}") from e
    return MPI


def check_comm(comm, fn):
    """``comm`` checked to be an MPI intra-communicator (not collective)."""
    MPI = mpi()
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"{fn}: 'comm' must be an mpi4py intra-communicator such as MPI.COMM_WORLD, "
                        f"got {type(comm).__name__}")
    return comm


def _strip(text, fn):
    return text[len(fn) + 2:] if text.startswith(fn + ": ") else text


def agree(comm, fn, error, same=(), values=(), signature=""):
    """Collective check that every rank may go on: nothing moves before it.

    Each rank gives ``error`` (an exception it raised while checking its own
    arguments, or None), ``same`` (pairs ``(label, int)`` that must be equal
    on every rank), ``values`` (ints every rank learns) and ``signature``
    (a string that must be equal on every rank, e.g. a dtype and row shape).
    The number of ``same`` and ``values`` entries is the same on every rank.

    In the common case this is one Allgather of ``2 + len(same) +
    len(values)`` int64 per rank. When a rank has an error, or the ``same``
    entries or signatures differ, every rank raises the same exception with
    the same message naming the offending rank(s): the class of the
    lowest-ranked error (TypeError or ValueError), else ValueError. Errors
    of other classes are passed on as ValueError, their class name leading
    the message.

    Returns ``values`` of every rank, an int64 array ``[P, len(values)]``.
    """
    MPI = mpi()
    P = comm.size
    text = b""
    if error is not None:
        text = _strip(str(error), fn)
        if not isinstance(error, (ValueError, TypeError)):   # unexpected: keep its kind in the text
            text = f"{type(error).__name__}: {text}"
        text = text.encode()
    kind = 2 if isinstance(error, TypeError) else 1
    sig = signature.encode()
    head = np.array([len(text) * 4 + (kind if error is not None else 0), zlib.crc32(sig)]
                    + [int(val) for _, val in same] + [int(val) for val in values], dtype=np.int64)
    table = np.empty((P, head.size), dtype=np.int64)
    comm.Allgather(head, table)
    failed = np.flatnonzero(table[:, 0])
    sig_differs = np.any(table[:, 1] != table[0, 1])
    if failed.size or sig_differs:
        # second round, taken by every rank alike: the texts themselves
        blob = text + b"\0" + sig
        sizes = np.empty(P, dtype=np.int64)
        comm.Allgather(np.array([len(blob)], dtype=np.int64), sizes)
        offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        gathered = np.empty(int(sizes.sum()), dtype=np.uint8)
        comm.Allgatherv(np.frombuffer(blob, dtype=np.uint8),
                        [gathered, sizes.tolist(), offsets.tolist(), MPI.BYTE])
        texts, sigs = [], []
        for r in range(P):
            own = bytes(gathered[offsets[r]:offsets[r] + sizes[r]])
            n = int(table[r, 0]) // 4        # the length of the error text
            texts.append(own[:n].decode(errors="replace"))
            sigs.append(own[n + 1:].decode(errors="replace"))
        if failed.size:
            cls = TypeError if table[failed[0], 0] % 4 == 2 else ValueError
            raise cls(_message(fn, failed, [texts[r] for r in failed]))
        raise ValueError(_message(fn, range(P), sigs, "settings that must be equal on every rank differ"))
    k = len(same)
    for col, (label, _) in enumerate(same, start=2):
        column = table[:, col]
        if np.any(column != column[0]):
            groups = {}
            for r, val in enumerate(column.tolist()):
                groups.setdefault(val, []).append(r)
            desc = "; ".join(f"{label}={val} on rank(s) {', '.join(map(str, rs))}" for val, rs in groups.items())
            raise ValueError(f"{fn}: {label} must be the same on every rank, got {desc}")
    return table[:, 2 + k:]


def _message(fn, ranks, texts, what="invalid arguments"):
    """One message for every rank, from the texts of ``ranks``."""
    ranks = list(ranks)
    if len(ranks) == 1:
        return f"{fn}: {what} (checked on rank {ranks[0]}): {texts[0]}"
    lines = [f"rank {r}: {t}" for r, t in zip(ranks, texts)]
    return f"{fn}: {what} (checked on ranks {', '.join(map(str, ranks))}):\n  " + "\n  ".join(lines)


def ordered_sum(comm, arrays):
    """``sum_r arrays_r`` for each array, added in rank order
    ``((a_0 + a_1) + a_2) + ...``: the same bits on every rank, whatever the
    MPI library's reduction algorithm.

    ``arrays``: a list of float arrays of one dtype, of equal shapes on
    every rank. One reduce-scatter (each rank adds the P pieces of its
    share of the concatenated elements, in rank order) and one allgather:
    ``2 (P - 1) / P`` of the data sent per rank, like a ring allreduce.
    Returns new arrays of the given shapes.
    """
    if not arrays:
        return []
    flat = np.concatenate([np.ascontiguousarray(a).reshape(-1) for a in arrays])
    P, r = comm.size, comm.rank
    if P > 1:
        n = flat.size
        counts = np.full(P, n // P, dtype=np.int64)
        counts[:n % P] += 1
        displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
        mine = int(counts[r])
        pieces = np.empty((P, mine), dtype=flat.dtype)
        comm.Alltoallv([flat, (counts.tolist(), displs.tolist())],
                       [pieces, ([mine] * P, (np.arange(P) * mine).tolist())])
        part = pieces[0].copy()
        for p in range(1, P):
            part += pieces[p]
        flat = np.empty(n, dtype=flat.dtype)
        comm.Allgatherv(part, [flat, (counts.tolist(), displs.tolist())])
    out, start = [], 0
    for a in arrays:
        out.append(flat[start:start + a.size].reshape(a.shape))
        start += a.size
    return out


@contextlib.contextmanager
def abort_on_error(comm):
    """Around work during which the ranks exchange data: an exception on one
    rank would leave the others waiting in a collective for ever, so it is
    printed with its traceback and ``comm.Abort(1)`` ends every process of
    the job (``mpiexec`` then exits non-zero). With one rank nothing can
    wait, and the exception propagates as usual."""
    try:
        yield
    except BaseException as e:
        if comm.size == 1:
            raise
        # one write: the launcher may stop forwarding output as soon as the abort begins
        sys.stderr.write(f"raggeddot.distributed: rank {comm.rank} of {comm.size} failed while the ranks "
                         f"were exchanging data ({type(e).__name__}: {e}); aborting every rank (MPI_Abort) "
                         "so that none waits for ever:\n" + traceback.format_exc())
        sys.stderr.flush()
        comm.Abort(1)
        raise   # Abort does not return; should the library let it, the error still ends this rank

"""ragged_all_to_all: jax.lax.ragged_all_to_all's semantics on MPI, and
:func:`move_rows`, the exchange of whole rows it and the MoE layer share.

The rows move in one ``MPI_Alltoallw``: for each peer, the blocks of rows
sent to it (and received from it) are one derived datatype, an hindexed
type over a contiguous "row" type. Block lengths count rows and
displacements are byte offsets (MPI_Aint), so no count overflows int32
however large the arrays; rows are copied by MPI straight from the operand
into the result (the library packs them only if its transport needs to),
with no pickling and no Python loop over rows. Rows travel as raw bytes:
every rank must use the same byte order (as every machine of a cluster
does).
"""
import numpy as np

from .. import _validate as v
from ._mpi import abort_on_error, agree, check_comm, mpi

__all__ = ["ragged_all_to_all", "move_rows"]

FN = "raggeddot.distributed.ragged_all_to_all"


def _peer_type(MPI, row, offsets, sizes, row_bytes):
    """``(count, datatype, datatype to free)`` for the blocks of rows
    ``[offsets[j], offsets[j] + sizes[j])`` of one peer; ``(0, BYTE, None)``
    when it has none."""
    nz = sizes > 0
    if not nz.any():
        return 0, MPI.BYTE, None
    t = row.Create_hindexed(sizes[nz].tolist(), (offsets[nz] * row_bytes).tolist()).Commit()
    return 1, t, t


def move_rows(comm, operand, output, send_offsets, send_sizes, recv_offsets, recv_sizes):
    """Collective: every rank sends blocks of rows of ``operand`` and
    receives blocks of rows into ``output``, in one Alltoallw.

    ``operand [rows, ...]`` and ``output [rows_out, ...]`` are C-contiguous,
    of one dtype and row shape (on every rank). The four int64 index arrays
    have length N = P * m; entries ``[q*m, (q+1)*m)`` describe peer q:
    ``operand[send_offsets[i] : + send_sizes[i]]`` goes to q, and from q,
    block j arrives in ``output[recv_offsets[i] : + recv_sizes[i]]``, i =
    q*m + j. The arguments are trusted (the callers check them or build
    them consistent): q's ``send_sizes`` for me equal my ``recv_sizes`` for
    q. Returns ``output``.
    """
    MPI = mpi()
    P = comm.size
    m = send_sizes.shape[0] // P
    row_bytes = operand.dtype.itemsize * int(np.prod(operand.shape[1:], dtype=np.int64))
    if row_bytes == 0:      # the row shape is the same everywhere: every rank returns here
        return output
    row = MPI.BYTE.Create_contiguous(row_bytes).Commit()
    owned = []
    try:
        sends, recvs = [], []
        for q in range(P):
            block = slice(q * m, (q + 1) * m)
            s = _peer_type(MPI, row, send_offsets[block], send_sizes[block], row_bytes)
            r = _peer_type(MPI, row, recv_offsets[block], recv_sizes[block], row_bytes)
            sends.append(s)
            recvs.append(r)
            owned += [t for _, _, t in (s, r) if t is not None]
        zeros = [0] * P
        comm.Alltoallw([operand, [c for c, _, _ in sends], zeros, [t for _, t, _ in sends]],
                       [output, [c for c, _, _ in recvs], zeros, [t for _, t, _ in recvs]])
    finally:
        for t in owned:
            t.Free()
        row.Free()
    return output


def _indices(a, name, N):
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise ValueError(f"{FN}: '{name}' must be 1-D [N], got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{FN}: '{name}' must be integers, got {arr.dtype}")
    if N is not None and arr.shape[0] != N:
        raise ValueError(f"{FN}: '{name}' has length {arr.shape[0]}, but 'input_offsets' has {N}")
    out = arr.astype(np.int64)
    if arr.dtype.kind == "u" and np.any(arr > np.iinfo(np.int64).max):
        raise ValueError(f"{FN}: '{name}' holds values beyond int64")
    return out


def _first_bad(mask):
    return int(np.flatnonzero(mask)[0])


def _check_local(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, P):
    """This rank's arguments checked on their own: ``(operand, output,
    index arrays)`` as arrays, or ValueError naming the argument."""
    for a, name in ((operand, "operand"), (output, "output")):
        if v.is_packed(a):
            raise v.packed_refused(a, f"'{name}'", FN)
    operand, output = np.asarray(operand), np.asarray(output)
    for a, name in ((operand, "operand"), (output, "output")):
        if a.ndim < 1:
            raise ValueError(f"{FN}: '{name}' must have at least one dimension [rows, ...], got a scalar")
        if a.dtype.hasobject:
            raise ValueError(f"{FN}: '{name}' must hold plain numbers, not Python objects ({a.dtype})")
    if output.dtype != operand.dtype:
        raise ValueError(f"{FN}: 'output' has dtype {output.dtype} but 'operand' has {operand.dtype}")
    if output.shape[1:] != operand.shape[1:]:
        raise ValueError(f"{FN}: 'output' rows have shape {output.shape[1:]} but 'operand' rows have "
                         f"{operand.shape[1:]} (operand.shape={operand.shape}, output.shape={output.shape})")
    io = _indices(input_offsets, "input_offsets", None)
    N = io.shape[0]
    ss, oo, rs = (_indices(a, name, N) for a, name in ((send_sizes, "send_sizes"),
                                                        (output_offsets, "output_offsets"),
                                                        (recv_sizes, "recv_sizes")))
    if N == 0 or N % P:
        raise ValueError(f"{FN}: the index arrays have length N={N}, which must be a positive multiple "
                         f"of the number of ranks P={P}")
    for arr, name in ((io, "input_offsets"), (ss, "send_sizes"), (oo, "output_offsets"), (rs, "recv_sizes")):
        if np.any(arr < 0):
            i = _first_bad(arr < 0)
            raise ValueError(f"{FN}: '{name}'[{i}]={arr[i]} is negative")
    rows = operand.shape[0]
    past = io + ss > rows
    if np.any(past):
        i = _first_bad(past)
        raise ValueError(f"{FN}: 'input_offsets'[{i}]={io[i]} + 'send_sizes'[{i}]={ss[i]} reaches past "
                         f"the {rows} rows of 'operand'")
    return operand, output, io, ss, oo, rs


def _check_received(got_sizes, got_offsets, recv_sizes, out_rows, P, me):
    """The receiver's checks, with the senders' ``send_sizes`` and
    ``output_offsets`` for this rank (``[P, m]`` each, row p from rank p):
    ValueError naming the ranks, else None."""
    m = got_sizes.shape[1]
    mine = recv_sizes.reshape(P, m)
    differ = got_sizes != mine
    if np.any(differ):
        p, j = np.argwhere(differ)[0]
        return ValueError(
            f"{FN}: 'send_sizes' does not match the peers' 'recv_sizes': rank {p} sends "
            f"send_sizes[{me * m + j}]={got_sizes[p, j]} rows to rank {me}, whose "
            f"recv_sizes[{p * m + j}]={mine[p, j]}")
    past = got_offsets + got_sizes > out_rows
    if np.any(past):
        p, j = np.argwhere(past)[0]
        return ValueError(
            f"{FN}: rank {p}'s 'output_offsets'[{me * m + j}]={got_offsets[p, j]} with "
            f"send_sizes[{me * m + j}]={got_sizes[p, j]} writes past the {out_rows} rows of rank {me}'s "
            f"'output'")
    starts, sizes = got_offsets.ravel(), got_sizes.ravel()
    nz = sizes > 0
    starts, sizes = starts[nz], sizes[nz]
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], starts[order] + sizes[order]
    if starts.size > 1 and np.any(ends[:-1] > starts[1:]):
        k = _first_bad(ends[:-1] > starts[1:])
        return ValueError(
            f"{FN}: slices sent to rank {me} overlap in its 'output': rows [{starts[k]}, {ends[k]}) "
            f"and [{starts[k + 1]}, {ends[k + 1]}) (from the senders' 'output_offsets')")
    return None


def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, comm):
    """jax.lax.ragged_all_to_all over the ranks of an MPI communicator.

    With P ranks and index arrays of length N = P * m, entry i of a rank's
    arrays is one update for rank ``q = i // m``::

        result_q[output_offsets[i] : output_offsets[i] + send_sizes[i]]
            = operand[input_offsets[i] : input_offsets[i] + send_sizes[i]]

    where ``result_q`` is rank q's ``output`` with every update it receives
    written in (rows not written keep ``output``'s values). The offsets
    into the receiver's output are the *sender's* ``output_offsets``; the
    receiver states how many rows it expects from each update:
    ``recv_sizes[p * m + j]`` on rank q must equal ``send_sizes[q * m + j]``
    on rank p (``send_sizes`` is the all-to-all of the peers'
    ``recv_sizes``).

    Args:
      operand: ``[rows, ...]`` array; whole rows (of any row shape) move.
      output: ``[rows_out, ...]`` array of operand's dtype and row shape.
        Not modified: the result is a new array.
      input_offsets, send_sizes, output_offsets, recv_sizes: ``[N]``
        non-negative integers, N a positive multiple of P, the same on every
        rank.
      comm: an mpi4py intra-communicator; every rank calls this function.

    Returns:
      A new C-contiguous array equal to ``output`` with the received slices
      written.

    Raises:
      ValueError, on every rank alike and before any row moves, naming the
      argument and the rank(s): index arrays of the wrong length or type,
      negative entries, a slice past the end of ``operand`` (on the sender)
      or of ``output`` (on the receiver, with the sender's offsets), slices
      overlapping in a receiver's output (jax leaves that undefined),
      ``send_sizes`` not the all-to-all of ``recv_sizes``, dtypes or row
      shapes that differ between ranks. A failure after the rows started to
      move (which checked arguments do not cause) aborts every rank with
      ``comm.Abort(1)`` rather than leaving peers waiting.
    """
    comm = check_comm(comm, FN)
    P, me = comm.size, comm.rank
    error, args, signature, N = None, None, "", 0
    try:
        args = _check_local(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, P)
        signature = f"dtype {args[0].dtype.str}, rows of shape {args[0].shape[1:]}"
        N = args[2].shape[0]
    except Exception as e:      # any failure here must reach every rank, or they would wait
        error = e
    # round 1: each rank's own checks, N, dtypes and row shapes
    agree(comm, FN, error, same=[("the length N of the index arrays", N)], signature=signature)
    operand, output, io, ss, oo, rs = args
    m = N // P
    # round 2: every receiver learns the sizes and offsets of what it will get
    sent = np.ascontiguousarray(np.stack([ss, oo], axis=1))           # [N, 2]
    got = np.empty_like(sent)
    comm.Alltoall(sent, got)
    got = got.reshape(P, m, 2)
    agree(comm, FN, _check_received(got[:, :, 0], got[:, :, 1], rs, output.shape[0], P, me))
    # the rows: straight from operand into a copy of output
    src = np.ascontiguousarray(operand)
    result = np.array(output, order="C", copy=True)
    with abort_on_error(comm):
        move_rows(comm, src, result, io, ss, got[:, :, 1].ravel(), rs)
    return result

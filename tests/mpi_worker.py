"""The MPI side of tests/test_distributed.py, run as ``mpiexec -n P python
tests/mpi_worker.py MODE``.

Every rank builds the same global data from fixed seeds and takes its
share, so the single-process oracles (raggeddot.moe_block on all ranks'
tokens concatenated, with all experts; a NumPy emulation of
jax.lax.ragged_all_to_all over every rank's arguments) need no
communication.

Modes:
  suite          every case below; each rank prints "rank r: passed N cases".
  options        every option of moe_block, QArray and prepacked expert
                 weights, return_aux in moe_block_vjp (run on 2 ranks);
                 each rank prints "rank r: passed N option cases".
  bad-sizes      rank 1 passes a negative send size to ragged_all_to_all and
                 does not catch the error: every rank must end with it.
  bad-moe        rank 0 passes x with the wrong width to moe_block, uncaught.
  step-error     the experts step raises on rank 1 after the exchange began:
                 comm.Abort must end every rank.
"""
import math
import sys

import ml_dtypes
import numpy as np
from mpi4py import MPI

import raggeddot
from raggeddot import distributed as dist

COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
#: max|a - e| / max(1, max|e|) for the sums over tokens (router, shared experts, load balance)
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12,
       np.dtype(np.float16): 2e-3, np.dtype(ml_dtypes.bfloat16): 1e-2}


# ------------------------------------------------------------- ragged_all_to_all

def emulate_ragged_all_to_all(args, me):
    """jax.lax.ragged_all_to_all's result on rank ``me``, from every rank's
    arguments ``args[p] = (operand, output, input_offsets, send_sizes,
    output_offsets, recv_sizes)``: each update i of each rank p whose target
    is ``me`` (``i // (N // P) == me``) writes p's operand rows at p's
    output_offsets[i] in a copy of me's output."""
    result = np.array(args[me][1], copy=True)
    for p in range(len(args)):
        operand, _, io, ss, oo, _ = args[p]
        m = len(io) // len(args)
        for i in range(len(io)):
            if i // m == me:
                result[oo[i]:oo[i] + ss[i]] = operand[io[i]:io[i] + ss[i]]
    return result


def a2a_args(rng, m, dtype, row_shape, max_rows=3):
    """Every rank's ragged_all_to_all arguments: random sizes (zeros too),
    operand blocks read from random (possibly overlapping) places, each
    receiver's blocks in a random order with gaps."""
    N = P * m
    sizes = rng.integers(0, max_rows + 1, size=(P, N))
    sizes[rng.random((P, N)) < 0.25] = 0
    operands, in_offs = [], []
    for p in range(P):
        rows = int(sizes[p].max(initial=0) + rng.integers(0, 3))
        operands.append((rng.standard_normal((rows,) + row_shape) * 100).astype(dtype))
        in_offs.append(np.array([rng.integers(0, rows - s + 1) for s in sizes[p]], dtype=np.int64))
    out_offs = np.zeros((P, N), dtype=np.int64)
    outputs, recv = [], []
    for q in range(P):
        updates = [(p, q * m + j) for p in range(P) for j in range(m)]
        pos = 0
        for k in rng.permutation(len(updates)):
            p, i = updates[k]
            pos += int(rng.integers(0, 2))              # a gap of unwritten rows
            out_offs[p, i] = pos
            pos += sizes[p, i]
        outputs.append((rng.standard_normal((pos + int(rng.integers(0, 2)),) + row_shape) * 100).astype(dtype))
        recv.append(np.array([sizes[p, q * m + j] for p in range(P) for j in range(m)], dtype=np.int64))
    return [(operands[p], outputs[p], in_offs[p], sizes[p].copy(), out_offs[p], recv[p]) for p in range(P)]


def check_a2a_matches_emulation():
    cases = 0
    for seed, (m, dtype, row_shape) in enumerate([(1, np.float32, (3,)), (2, np.float64, (2, 3)),
                                                  (3, np.int32, ()), (1, np.float64, (0,)),
                                                  (2, np.float32, (5,))]):
        rng = np.random.default_rng(100 + seed)
        args = a2a_args(rng, m, dtype, row_shape)
        mine = args[RANK]
        copies = [np.array(a, copy=True) for a in mine]
        operand = mine[0]
        if seed == 4 and operand.shape[0] > 1:       # a strided operand view
            wide = np.repeat(operand, 2, axis=0)
            operand = wide[::2]
        got = dist.ragged_all_to_all(operand, *mine[1:], comm=COMM)
        want = emulate_ragged_all_to_all(args, RANK)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        for a, c in zip(mine, copies):              # inputs are never written
            np.testing.assert_array_equal(a, c)
        cases += 1
    return cases


def expect_error(fn, *words, exc=ValueError):
    """fn() must raise ``exc`` on every rank, with one message on all ranks
    containing ``words``; returns the message."""
    try:
        fn()
    except exc as e:
        msg = str(e)
    else:
        msg = None
    msgs = COMM.allgather(msg)
    assert msgs[RANK] is not None, f"rank {RANK}: no {exc.__name__} raised"
    assert len(set(msgs)) == 1, f"ranks raised different messages: {msgs}"
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


def check_a2a_errors():
    rng = np.random.default_rng(7)
    base = a2a_args(rng, 2, np.float32, (3,))[RANK]
    operand, output, io, ss, oo, rs = base
    before = np.array(output, copy=True)

    def call(**changes):
        a = dict(operand=operand, output=output, input_offsets=io, send_sizes=ss, output_offsets=oo,
                 recv_sizes=rs)
        a.update(changes)
        return lambda: dist.ragged_all_to_all(**a, comm=COMM)

    on1 = lambda good, bad: bad if RANK == 1 else good           # noqa: E731
    # bad sizes on one rank
    neg = ss.copy(); neg[0] = -1
    expect_error(call(send_sizes=on1(ss, neg)), "'send_sizes'[0]=-1 is negative", "rank 1")
    # send sizes that are not the all-to-all of the recv sizes
    off = rs.copy(); off[0] += 1
    expect_error(call(recv_sizes=on1(rs, off)), "does not match the peers' 'recv_sizes'", "rank 1")
    # out of bounds on the sender (operand) and on the receiver (output)
    expect_error(call(input_offsets=on1(io, io + operand.shape[0] + 1)), "reaches past", "'operand'",
                 "rank 1")
    expect_error(call(output_offsets=on1(oo, oo + output.shape[0] + 5)), "writes past", "'output'")
    # lengths, types, dtypes and row shapes
    expect_error(call(recv_sizes=on1(rs, rs[:-1])), "'recv_sizes' has length", "rank 1")
    expect_error(call(input_offsets=io[:1], send_sizes=ss[:1], output_offsets=oo[:1], recv_sizes=rs[:1]),
                 "multiple of the number of ranks")
    expect_error(call(operand=on1(operand, operand.astype(np.float64)),
                      output=on1(output, output.astype(np.float64))),
                 "must be equal on every rank differ", "dtype <f8", "dtype <f4")
    expect_error(call(input_offsets=io.astype(np.float64)), "'input_offsets' must be integers")
    np.testing.assert_array_equal(output, before)
    return 8


# ----------------------------------------------------------------------- MoE

def moe_case(seed, dtype, E, T_per_rank, d=8, f=6, layout="edf", dead_experts=(), **options):
    """Global arguments of one layer: (x [T, d], router, w0, w1, wo, kwargs)
    with random per-expert biases / shared experts as the options ask."""
    rng = np.random.default_rng(seed)
    T = sum(T_per_rank)
    dt = np.dtype(dtype)
    x = rng.standard_normal((T, d)).astype(dt)
    rw = (rng.standard_normal((d, E)) * (2 / math.sqrt(d))).astype(dt)
    w0 = (rng.standard_normal((E, d, f)) / math.sqrt(d)).astype(dt)
    w1 = (rng.standard_normal((E, d, f)) / math.sqrt(d)).astype(dt)
    wo = (rng.standard_normal((E, f, d)) / math.sqrt(f)).astype(dt)
    if layout == "efd":
        w0, w1, wo = (np.ascontiguousarray(w.transpose(0, 2, 1)) for w in (w0, w1, wo))
    kw = dict(options)
    kw.setdefault("top_k", 2)
    kw["weights_layout"] = layout
    if dead_experts:        # experts no token chooses
        bias = np.zeros(E, dtype=dt)
        bias[list(dead_experts)] = -60.0
        kw["router_bias"] = bias
    if kw.pop("biases", False):
        kw["w0_bias"], kw["w1_bias"] = ((0.3 * rng.standard_normal((E, f))).astype(dt) for _ in range(2))
        kw["wo_bias"] = (0.3 * rng.standard_normal((E, d))).astype(dt)
    if kw.pop("shared", False):
        kw["shared_experts"] = ((rng.standard_normal((d, 5)) / math.sqrt(d)).astype(dt),
                                (rng.standard_normal((d, 5)) / math.sqrt(d)).astype(dt),
                                (rng.standard_normal((5, d)) / math.sqrt(5)).astype(dt))
    if kw.pop("shared_gate", False):
        kw["shared_expert_gate"] = (rng.standard_normal((d, 1)) / math.sqrt(d)).astype(dt)
    return x, rw, w0, w1, wo, kw


def local_share(case, T_per_rank):
    """This rank's tokens and experts (and biases) of a global case."""
    x, rw, w0, w1, wo, kw = case
    E = rw.shape[1]
    start = sum(T_per_rank[:RANK])
    tokens = slice(start, start + T_per_rank[RANK])
    held = slice(RANK * E // P, (RANK + 1) * E // P)
    kw = dict(kw)
    for name in ("w0_bias", "w1_bias", "wo_bias"):
        if name in kw:
            kw[name] = kw[name][held]
    return (x[tokens], rw, w0[held], w1[held], wo[held], kw), tokens, held


def scaled_err(a, e):
    a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
    return float(np.abs(a - e).max(initial=0) / max(1.0, np.abs(e).max(initial=0)))


def same_on_every_rank(a):
    blobs = COMM.allgather(np.ascontiguousarray(a).tobytes())
    assert all(b == blobs[0] for b in blobs), "a replicated gradient differs between ranks"


def check_moe(seed, dtype, E, T_per_rank, **options):
    case = moe_case(seed, dtype, E, T_per_rank, **options)
    x, rw, w0, w1, wo, kw = case
    (lx, lrw, lw0, lw1, lwo, lkw), tokens, held = local_share(case, T_per_rank)
    tol = TOL[np.dtype(dtype)]
    # forward with aux
    want, want_aux = raggeddot.moe_block(x, rw, w0, w1, wo, return_aux=True, **kw)
    got, aux = dist.moe_block(lx, lrw, lw0, lw1, lwo, comm=COMM, return_aux=True, **lkw)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want[tokens])                  # bitwise
    for name in ("topk_indices", "topk_weights"):
        np.testing.assert_array_equal(aux[name], want_aux[name][tokens])
    for name in ("group_sizes", "bias_updates", "dropped"):
        np.testing.assert_array_equal(aux[name], want_aux[name])
    assert scaled_err(aux["load_balance_loss"], want_aux["load_balance_loss"]) <= tol
    # backward
    ct = np.random.default_rng(seed + 1).standard_normal(x.shape).astype(dtype)
    out_ref, vjp_ref = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, **kw)
    out, vjp = dist.moe_block_vjp(lx, lrw, lw0, lw1, lwo, comm=COMM, **lkw)
    np.testing.assert_array_equal(out, out_ref[tokens])
    g_ref, g = vjp_ref(ct), vjp(ct[tokens])
    assert set(g) == set(g_ref), (set(g), set(g_ref))
    np.testing.assert_array_equal(g["x"], g_ref["x"][tokens])         # bitwise
    for name in ("w0", "w1", "wo", "w0_bias", "w1_bias", "wo_bias"):  # bitwise, the held experts
        if name in g:
            assert g[name].dtype == g_ref[name].dtype
            np.testing.assert_array_equal(g[name], g_ref[name][held], err_msg=name)
    check_replicated_grads(g, g_ref, tol)
    return 1


def check_replicated_grads(g, g_ref, tol):
    """The gradients of the parameters every rank holds whole (the router,
    its bias, the shared experts and their gate): sums over every rank's
    tokens, so within ``tol`` of the single-process ones, and equal on
    every rank."""
    replicated = [("router_weights", g["router_weights"], g_ref["router_weights"])]
    for name in ("router_bias", "shared_expert_gate"):
        if name in g:
            replicated.append((name, g[name], g_ref[name]))
    for i, (a, b) in enumerate(zip(g.get("shared_experts", ()), g_ref.get("shared_experts", ()))):
        replicated.append((f"shared_experts[{i}]", a, b))
    for name, a, b in replicated:
        assert a.dtype == b.dtype and a.shape == b.shape, name
        err = scaled_err(a, b)
        assert err <= tol, f"{name}: scaled error {err:.3g} > {tol}"
        same_on_every_rank(a)


def moe_cases():
    E = 2 * P
    uneven = [3 * (r % 3) + (r == 1) * 2 for r in range(P)]          # 0, 5, 6, 0 ... tokens
    uneven[0] = 0
    cases = [
        dict(seed=1, dtype=np.float32, E=E, T_per_rank=[4 + r for r in range(P)], norm_topk_prob=True),
        dict(seed=2, dtype=np.float64, E=E, T_per_rank=uneven, norm_topk_prob=True),
        dict(seed=3, dtype=np.float64, E=2 * E, T_per_rank=[5] * P, top_k=3, score_func="sigmoid",
             n_groups=2, topk_groups=1, norm_topk_prob=True, routed_scaling_factor=2.5, shared=True,
             selection_bias=np.linspace(-0.2, 0.2, 2 * E)),
        dict(seed=4, dtype=np.float32, E=E, T_per_rank=[6] * P, layout="efd", biases=True,
             activation="swiglu_oai", dead_experts=(0, E - 1)),
        dict(seed=5, dtype=np.float64, E=E, T_per_rank=[7] * P, capacity_factor=0.6, shared=True),
        dict(seed=6, dtype=np.float32, E=E, T_per_rank=uneven, capacity_factor=1.0, layout="efd",
             biases=True),
        dict(seed=7, dtype=np.float64, E=2 * E, T_per_rank=[9, 1, 4, 2][:P], capacity_factor=0.25,
             activation="gelu", dead_experts=(1,)),
        dict(seed=8, dtype=np.float32, E=E, T_per_rank=[0] * P),
        # 16-bit hidden activations moved between ranks as they are (the
        # bfloat16 dot-product kernels where the CPU has them), bit for bit
        # those of the single-process layer
        dict(seed=10, dtype=ml_dtypes.bfloat16, E=E, T_per_rank=[5 + r for r in range(P)], norm_topk_prob=True,
             biases=True, shared=True),
        dict(seed=11, dtype=np.float16, E=E, T_per_rank=uneven, norm_topk_prob=True),
    ]
    n = 0
    for c in cases:
        n += check_moe(**c)
    return n


def check_moe_errors():
    case = moe_case(9, np.float64, 2 * P, [3] * P)
    (x, rw, w0, w1, wo, kw), _, _ = local_share(case, [3] * P)
    fn = dist.moe_block
    # a bad argument on one rank
    expect_error(lambda: fn(x[:, :-1] if RANK == 1 else x, rw, w0, w1, wo, comm=COMM, **kw),
                 "'router_weights' [d, E] has d=8 but 'x' has d=7", "rank 1")
    # E not a multiple of P
    E = 2 * P + 1
    rw_odd = np.ones((x.shape[1], E))
    expect_error(lambda: fn(x, rw_odd, w0, w1, wo, comm=COMM, **kw), f"E={E}", "multiple of the number of ranks")
    # a setting the exchange depends on differs between ranks
    expect_error(lambda: fn(x, rw, w0, w1, wo, comm=COMM, **dict(kw, top_k=1 if RANK == 0 else 2)),
                 "'top_k' must be the same on every rank")
    expect_error(lambda: fn(x, rw, w0, w1, wo, comm=COMM, **dict(kw, capacity_factor=1.0 if RANK else None)),
                 "capacity_factor=1.0", "capacity_factor=None")
    # a held expert count that is not E/P
    expect_error(lambda: fn(x, rw, w0[:1], w1[:1], wo[:1], comm=COMM, **kw), "'w0' [E/P, d, f]")
    # a bad cotangent on one rank
    _, vjp = dist.moe_block_vjp(x, rw, w0, w1, wo, comm=COMM, **kw)
    expect_error(lambda: vjp(np.zeros((2, 2)) if RANK == P - 1 else np.zeros_like(x)),
                 "cotangent must have shape", f"rank {P - 1}")
    expect_error(lambda: fn(x, rw, w0, w1, wo, comm="world", **kw), "intra-communicator", exc=TypeError)
    # an unknown keyword on one rank
    expect_error(lambda: fn(x, rw, w0, w1, wo, comm=COMM, **dict(kw, **({"bogus": 1} if RANK == 1 else {}))),
                 "'bogus'", "rank 1", exc=TypeError)
    return 8


# ------------------------------------------- every option of moe_block (2 ranks)

def _local_weights(w, held, kind):
    """This rank's share of the global expert weights ``w`` (an array or a
    QArray of all experts): sliced, and prepacked for ``kind="packed"``."""
    share = w[held]
    return raggeddot.prepack(share) if kind == "packed" else share


def check_option(seed, dtype, E, T_per_rank, S=None, weights="array", fused=None, d_aux=None, **options):
    """Distributed moe_block (with aux) and moe_block_vjp (with aux and
    their cotangents ``d_aux``) against single-process moe_block on the
    concatenated tokens. ``S``: x is ``[B, S, d]`` (whole sequences on
    each rank); ``weights``: "array", "int8" (QArrays quantized per channel
    over all experts, each rank taking its slice) or "packed" (each rank's
    slice prepacked); ``fused``: a gate_up mode, w0 and w1 then fused."""
    case = moe_case(seed, dtype, E, T_per_rank, **options)
    x, rw, w0, w1, wo, kw = case
    (lx, _, _, _, _, lkw), tokens, held = local_share(case, T_per_rank)
    if weights == "int8":
        w0, w1, wo = (raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)) for w in (w0, w1, wo))
    if fused:                       # [E, d, 2f] (biases [E, 2f]) as gate_up says
        def fuse(a, b):
            if fused == "concat":
                return np.concatenate([a, b], axis=-1)
            return np.stack([a, b], axis=-1).reshape(a.shape[:-1] + (-1,))
        w0, w1 = fuse(w0, w1), None
        for k in (kw, lkw):
            k["gate_up"] = fused
            if "w0_bias" in k:
                k["w0_bias"] = fuse(k["w0_bias"], k.pop("w1_bias"))
    lw = [None if w is None else _local_weights(w, held, weights) for w in (w0, w1, wo)]
    if S is not None:               # [B, S, d]: each rank's tokens are whole sequences
        x, lx = x.reshape(-1, S, x.shape[1]), lx.reshape(-1, S, lx.shape[1])
    rows = slice(tokens.start // (S or 1), tokens.stop // (S or 1))
    tol = TOL[np.dtype(dtype)]
    # forward with aux
    want, want_aux = raggeddot.moe_block(x, rw, w0, w1, wo, return_aux=True, **kw)
    got, aux = dist.moe_block(lx, rw, *lw, comm=COMM, return_aux=True, **lkw)
    assert got.dtype == want.dtype and got.shape == lx.shape
    np.testing.assert_array_equal(got, want[rows])                     # bitwise
    for name in ("topk_indices", "topk_weights", "router_logits"):
        np.testing.assert_array_equal(aux[name], want_aux[name][rows], err_msg=name)
    for name in ("group_sizes", "bias_updates", "dropped"):
        np.testing.assert_array_equal(aux[name], want_aux[name], err_msg=name)
    for name in ("load_balance_loss", "router_z_loss"):
        assert want_aux[name] > 0 or not len(x), name
        assert scaled_err(aux[name], want_aux[name]) <= tol, (name, aux[name], want_aux[name])
        same_on_every_rank(np.float64(aux[name]))
    # backward with the aux outputs' cotangents
    rng = np.random.default_rng(seed + 1)
    ct = rng.standard_normal(want.shape).astype(dtype)
    d_aux_ref = None
    if d_aux:
        d_aux_ref = dict(d_aux)
        if d_aux_ref.pop("router_logits", False):
            d_aux_ref["router_logits"] = rng.standard_normal(want_aux["router_logits"].shape)
    (out_ref, _), vjp_ref = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, return_aux=True, **kw)
    (out, aux2), vjp = dist.moe_block_vjp(lx, rw, *lw, comm=COMM, return_aux=True, **lkw)
    np.testing.assert_array_equal(out, out_ref[rows])
    assert aux2["load_balance_loss"] == aux["load_balance_loss"]
    d_aux_mine = None if d_aux_ref is None else {
        k: (a[rows] if k == "router_logits" else a) for k, a in d_aux_ref.items()}
    g_ref, g = vjp_ref(ct, d_aux_ref), vjp(ct[rows], d_aux_mine)
    assert set(g) == set(g_ref), (set(g), set(g_ref))
    for name in ("w0", "w1", "wo"):                                   # bitwise, the held experts
        if name in g:
            assert g[name].dtype == g_ref[name].dtype and g[name].shape == g_ref[name][held].shape
            np.testing.assert_array_equal(g[name], g_ref[name][held], err_msg=name)
    err = scaled_err(g["x"], g_ref["x"][rows])
    assert err <= tol, f"x: scaled error {err:.3g} > {tol}"
    if not d_aux:
        np.testing.assert_array_equal(g["x"], g_ref["x"][rows])        # bitwise
    check_replicated_grads(g, g_ref, tol)
    return 1


def option_cases():
    """One case per option the expert-parallel layer took on besides the
    rest (2 ranks), then their errors."""
    E = 2 * P
    lb_z = {"load_balance_loss": 0.7, "router_z_loss": 0.3}
    all_aux = dict(lb_z, router_logits=True)
    cases = [
        dict(seed=21, dtype=np.float64, E=E, T_per_rank=[5, 7], router_weights_on="input", capacity_factor=0.8,
             d_aux=all_aux),
        dict(seed=22, dtype=np.float32, E=E, T_per_rank=[6, 3], router_weights_on="input", norm_topk_prob=True,
             layout="efd"),
        dict(seed=23, dtype=np.float64, E=E, T_per_rank=[8, 12], S=4, load_balance="maxtext", d_aux=lb_z),
        dict(seed=24, dtype=np.float64, E=E, T_per_rank=[0, 9], load_balance="maxtext", d_aux=all_aux),
        dict(seed=25, dtype=np.float64, E=2 * E, T_per_rank=[7, 4], load_balance="hf", score_func="sigmoid",
             shared=True, shared_gate=True, d_aux=all_aux),
        dict(seed=26, dtype=np.float32, E=E, T_per_rank=[6, 5], weights="int8", d_aux=lb_z),
        dict(seed=27, dtype=np.float32, E=E, T_per_rank=[4, 6], weights="int8", router_weights_on="input",
             capacity_factor=1.0),
        dict(seed=28, dtype=np.float32, E=E, T_per_rank=[5, 5], weights="packed", biases=True, d_aux=lb_z),
        dict(seed=29, dtype=np.float64, E=E, T_per_rank=[6, 2], fused="interleaved", activation="swiglu_oai",
             swiglu_alpha=1.5, biases=True),
        dict(seed=30, dtype=np.float64, E=E, T_per_rank=[3, 6], fused="concat", d_aux={"router_z_loss": 1.0}),
    ]
    n = 0
    for c in cases:
        n += check_option(**c)
    return n + check_option_errors()


def check_option_errors():
    case = moe_case(31, np.float64, 2 * P, [4] * P)
    (x, rw, w0, w1, wo, kw), _, _ = local_share(case, [4] * P)
    fn, fn_vjp = dist.moe_block, dist.moe_block_vjp
    expect_error(lambda: fn(x, rw, w0, w1, wo, comm=COMM, router_weights_on="inputs", **kw),
                 "'router_weights_on' must be one of 'output', 'input', got 'inputs'")
    # the sequence length of "maxtext" differs between ranks
    x3 = x.reshape((2, 2, -1) if RANK == 0 else (1, 4, -1))
    expect_error(lambda: fn(x3, rw, w0, w1, wo, comm=COMM, return_aux=True, load_balance="maxtext", **kw),
                 "load_balance='maxtext' over sequences of S=2", "S=4")
    # return_aux on some ranks only
    expect_error(lambda: fn(x, rw, w0, w1, wo, comm=COMM, return_aux=RANK == 0, **kw), "return_aux=True",
                 "return_aux=False")
    # a gate without shared experts
    expect_error(lambda: fn(x, rw, w0, w1, wo, comm=COMM, shared_expert_gate=np.ones(x.shape[1]), **kw),
                 "'shared_expert_gate'", "'shared_experts' is None")
    # the losses' cotangents differ between ranks
    (_, _), vjp = fn_vjp(x, rw, w0, w1, wo, comm=COMM, return_aux=True, **kw)
    expect_error(lambda: vjp(None, {"router_z_loss": 1.0 + RANK}), "d_aux['router_z_loss']=1.0",
                 "d_aux['router_z_loss']=2.0")
    expect_error(lambda: vjp(None, {"bogus": 1.0} if RANK == 1 else None), "'d_aux' has keys ['bogus']",
                 "rank 1")
    # a PackedRhs where it is not taken
    expect_error(lambda: fn(raggeddot.prepack(x[None]), rw, w0, w1, wo, comm=COMM, **kw),
                 "'x' is a PackedRhs", "unpack()", exc=TypeError)
    return 7


def options():
    n = option_cases()
    COMM.Barrier()
    print(f"rank {RANK}: passed {n} option cases", flush=True)


# -------------------------------------------------------------------- modes

def suite():
    n = check_a2a_matches_emulation() + check_a2a_errors() + moe_cases() + check_moe_errors()
    COMM.Barrier()
    print(f"rank {RANK}: passed {n} cases", flush=True)


def bad_sizes():
    sizes = np.full(P, -1 if RANK == 1 else 1)
    ones = np.ones(P, dtype=np.int64)
    dist.ragged_all_to_all(np.zeros((1, 2)), np.zeros((P, 2)), np.zeros(P, dtype=np.int64), sizes,
                           np.full(P, RANK), ones, comm=COMM)


def bad_moe():
    case = moe_case(10, np.float64, 2 * P, [3] * P)
    (x, rw, w0, w1, wo, kw), _, _ = local_share(case, [3] * P)
    dist.moe_block(x[:, :-1] if RANK == 0 else x, rw, w0, w1, wo, comm=COMM, **kw)


def step_error():
    from raggeddot._moe import experts

    forward = experts.forward

    def failing(*args, **kwargs):
        if RANK == 1:
            raise RuntimeError("an injected failure inside the experts step")
        return forward(*args, **kwargs)

    experts.forward = failing
    case = moe_case(11, np.float64, 2 * P, [3] * P)
    (x, rw, w0, w1, wo, kw), _, _ = local_share(case, [3] * P)
    dist.moe_block(x, rw, w0, w1, wo, comm=COMM, **kw)
    COMM.Barrier()          # a rank may finish its layer first (nothing to get from rank 1): held here
    print(f"rank {RANK}: went on after a failed layer", flush=True)


def main(mode):
    """Run ``mode``; an exception is printed and, once every rank has
    printed its own (a barrier: a rank that did not fail makes the job hang
    and the harness's timeout fail the test), raised again."""
    try:
        mode()
    except Exception as e:
        print(f"rank {RANK} raised {type(e).__name__}: {e}", flush=True)
        COMM.Barrier()
        raise


if __name__ == "__main__":
    main({"suite": suite, "options": options, "bad-sizes": bad_sizes, "bad-moe": bad_moe,
          "step-error": step_error}[sys.argv[1]])

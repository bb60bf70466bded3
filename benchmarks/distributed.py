#!/usr/bin/env python
"""Benchmark expert parallelism: one MoE layer (raggeddot.distributed.moe_block, forward) on P
MPI ranks (README: "Expert parallelism (MPI)").

    mpiexec -n P python benchmarks/distributed.py [--spec mixtral|deepseek|NAME] [--tokens T] [--smoke] ...
    python benchmarks/distributed.py --ranks 1,2,4 [same options]   # runs mpiexec for each P

T tokens split evenly over the ranks, rank r holding experts [r E/P, (r+1) E/P); every rank first
checks the layer against single-process moe_block (bitwise). Per rank, after a warm-up call,
medians over --runs calls (a barrier before each) of each of STEPS (exchange: the two ragged
all-to-alls, waiting for the slowest rank included; other: argument checks, the count
allgather) and the bytes sent to other ranks; tokens/s = T / the slowest rank's layer time.
Model (no overlap of compute and transfer): t(P, B) = c(P) + V(P) / B + 4 a, c(P) the compute
(route + dispatch + experts + combine) and V(P) the bytes sent of the slowest rank, B bytes/s a
rank each way, a the latency of a collective; with --ranks also with c(P) = c(1) / P.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections import defaultdict

import numpy as np

import common as C
from raggeddot import specs as S
from raggeddot._timing import call_time, summary

SPECS = {"deepseek": "deepseek-v3", **{s.name: s.name for s in S.select("moe")}}
STEPS = ("route", "dispatch", "exchange", "experts", "combine", "other")
CHECK_TOKENS = 16


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default="mixtral", choices=sorted(SPECS))
    p.add_argument("--tokens", type=int, default=None, help="tokens over all ranks (default 4096)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--runs", type=int, default=None, help="timed calls (default 10, 2 with --smoke)")
    p.add_argument("--threads", type=int, default=None,
                   help="raggeddot threads per rank (default: RAGGEDDOT_NUM_THREADS, else 1)")
    p.add_argument("--bandwidth", default="10,25,100,400", help="network bandwidths in Gbit/s for the model")
    p.add_argument("--latency-us", type=float, default=10.0, help="latency per exchange for the model")
    p.add_argument("--json", default=None, help="write rank 0's results here")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, two runs: does it run")
    p.add_argument("--ranks", default=None, help="e.g. 1,2,4: launch mpiexec -n P for each and compare")
    return p.parse_args(argv)


def local_share(args, comm, T: int, first: int | None = None):
    """The layer of the spec at T tokens (the same on every rank: one seed; --smoke: d = 64,
    f = 32) and this rank's share: (x, router, w0, w1, wo) of its tokens (its first `first`
    of them when given) and experts, moe_block's keyword arguments, the whole layer."""
    s = S.get(SPECS[args.spec])
    shape = dict(T=T, d=64, f=32, shared=32 if s.shape.get("shared") else 0) if args.smoke else dict(T=T)
    inputs = S.make_inputs(s.resized(**shape), args.dtype)
    layer = [inputs[name] for name in S.MOE_ARGS]
    P, r, E, Tr = comm.size, comm.rank, layer[1].shape[1], T // comm.size
    held = slice(r * E // P, (r + 1) * E // P)
    kw = {n: (a[held] if n in ("w0_bias", "w1_bias", "wo_bias") else a) for n, a in inputs["options"].items()}
    mine = layer[0][r * Tr:r * Tr + (Tr if first is None else min(first, Tr))]
    return (mine, layer[1], *(w[held] for w in layer[2:])), kw, (layer, inputs["options"])


def step_clock(comm):
    """({step: seconds}, [bytes sent to other ranks]) that the step functions of
    raggeddot.distributed.moe_block add to, once wrapped here (the layer calls them through
    their modules)."""
    from raggeddot.distributed import moe

    acc, sent = defaultdict(float), [0]

    def timed(fn, step):
        def call(*args, **kwargs):
            if step == "exchange":  # move(comm, rows, moves, ...)
                row = args[1].dtype.itemsize * int(np.prod(args[1].shape[1:]))
                sent[0] += args[2].bytes_to_peers(comm.rank, comm.size, row)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[step] += time.perf_counter() - t0
        return call

    for module, step in ((moe.route, "route"), (moe.dispatch, "dispatch"), (moe.experts, "experts"),
                         (moe.combine, "combine"), (moe.shared, "combine")):
        module.forward = timed(module.forward, step)
    moe.move = timed(moe.move, "exchange")
    return acc, sent


def run_ranks(args):
    """The benchmark on the ranks of MPI.COMM_WORLD; rank 0 returns the results dict."""
    from mpi4py import MPI

    import raggeddot
    from raggeddot import distributed as dist

    comm = MPI.COMM_WORLD
    P, r = comm.size, comm.rank
    threads = args.threads or int(os.environ.get("RAGGEDDOT_NUM_THREADS", "1"))
    raggeddot.set_num_threads(threads)
    T, runs = args.tokens or (64 if args.smoke else 4096), args.runs or (2 if args.smoke else 10)
    E = S.get(SPECS[args.spec]).shape["E"]
    if T % P or E % P:
        raise SystemExit(f"--tokens {T} and the E={E} experts of {args.spec}: not multiples of the {P} ranks")
    # check: bitwise equal to single-process moe_block on every rank's first tokens
    Tr, n = T // P, min(CHECK_TOKENS, T // P)
    arrays, kw, (layer, options) = local_share(args, comm, T, first=n)
    got, x = dist.moe_block(*arrays, comm=comm, **kw), layer[0]
    want = raggeddot.moe_block(np.concatenate([x[p * Tr:p * Tr + n] for p in range(P)]), *layer[1:], **options)
    if not all(comm.allgather(np.array_equal(got, want[r * n:(r + 1) * n]))):
        raise SystemExit("check FAILED: the distributed layer differs from single-process moe_block")
    arrays, kw, _ = local_share(args, comm, T)
    acc, sent = step_clock(comm)
    dist.moe_block(*arrays, comm=comm, **kw)        # warm-up
    samples = defaultdict(list)
    for _ in range(runs):
        acc.clear()
        sent[0] = 0
        comm.Barrier()
        total = call_time(lambda: dist.moe_block(*arrays, comm=comm, **kw))[1]
        for step, value in [(s, acc[s]) for s in STEPS[:-1]] + [("other", total - sum(acc.values())),
                                                               ("total_s", total), ("bytes", sent[0])]:
            samples[step].append(value)
    per_rank = comm.gather({"rank": r, **{s: summary(v)["median"] for s, v in samples.items()}}, root=0)
    if r != 0:
        return None
    slowest = max(p["total_s"] for p in per_rank)
    compute = max(sum(p[s] for s in ("route", "dispatch", "experts", "combine")) for p in per_rank)
    return {"spec": args.spec, "P": P, "T": T, "E": E, "d": x.shape[1], "top_k": kw["top_k"],
            "dtype": args.dtype, "threads_per_rank": threads, "runs": runs, "per_rank": per_rank,
            "layer_s": slowest, "tokens_per_s": T / slowest, "compute_s": compute,
            "bytes_max": max(p["bytes"] for p in per_rank), "machine": C.machine_info()}


def report(res, args, c1=None):
    """Text tables of one run's results (and the model)."""
    out = [f"{res['spec']}: P={res['P']} ranks x {res['threads_per_rank']} thread(s), T={res['T']} tokens, "
           f"E={res['E']}, d={res['d']}, top_k={res['top_k']}, {res['dtype']}, medians of {res['runs']} runs"]
    rows = [[p["rank"], *(f"{1e3 * p[s]:.2f}" for s in STEPS), f"{1e3 * p['total_s']:.2f}",
             f"{p['bytes'] / 1e6:.2f}"] for p in res["per_rank"]]
    out.append(C.format_table(["rank", *(f"{s} ms" for s in STEPS), "layer ms", "sent MB"], rows))
    out.append(f"tokens/s {res['tokens_per_s']:.0f}   (layer {1e3 * res['layer_s']:.2f} ms on the slowest "
               f"rank; compute c(P) {1e3 * res['compute_s']:.2f} ms, V(P) {res['bytes_max'] / 1e6:.2f} MB)")
    cs = [res["compute_s"]] + ([c1 / res["P"]] if c1 else [])   # the model of the module docstring:
    model = [[f"{b:g}", *(f"{res['T'] / (c + res['bytes_max'] / (b * 1e9 / 8) + 4 * args.latency_us * 1e-6):.0f}"
                          for c in cs)] for b in (float(b) for b in args.bandwidth.split(","))]
    heads = ["Gbit/s", "model tokens/s, measured c(P)"] + (["model tokens/s, c(1)/P"] if c1 else [])
    out.append(C.format_table(heads, model))
    return "\n".join(out)


def launch(args, argv):
    """--ranks: run this script under mpiexec for each P and print every report."""
    exe = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exe = exe if os.path.exists(exe) else "mpiexec"
    forward = [a for i, a in enumerate(argv) if a != "--ranks" and (i == 0 or argv[i - 1] != "--ranks")
               and not a.startswith("--ranks=")]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               RAGGEDDOT_NUM_THREADS=os.environ.get("RAGGEDDOT_NUM_THREADS", "1"))
    results, c1 = [], None
    for P in (int(p) for p in args.ranks.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "result.json")
            subprocess.run([exe, "-n", str(P), sys.executable, os.path.abspath(__file__), *forward, "--json", path],
                           check=True, env=env)
            with open(path) as f:
                results.append(json.load(f))
        c1 = results[-1]["compute_s"] if P == 1 else c1
    print("\n" + "\n\n".join(report(res, args, c1) for res in results))
    if args.json:
        C.write_json(args.json, results)
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.ranks:
        return launch(args, argv)
    from mpi4py import MPI

    try:
        res = run_ranks(args)
    except Exception:  # a failing rank ends the job rather than leave the others waiting in a collective
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    if res is not None:
        if args.json:
            C.write_json(args.json, res)
        else:
            print(report(res, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

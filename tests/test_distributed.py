"""raggeddot.distributed on real MPI processes: ``mpiexec -n 2`` and ``-n 4``
(oversubscribed on a 2-core machine) run tests/mpi_worker.py, which checks
on every rank, against single-process oracles:

- ragged_all_to_all against an emulation of jax.lax.ragged_all_to_all over
  every rank's arguments (random sizes with zeros, gaps, several dtypes and
  row shapes, a strided operand; inputs left unmodified), and its errors:
  bad sizes on one rank, send sizes that are not the all-to-all of the
  receive sizes, offsets out of bounds on the sender and on the receiver,
  lengths, index types, dtypes differing between ranks. Each raises the
  same ValueError on every rank.
- moe_block (with aux) and moe_block_vjp against raggeddot.moe_block /
  moe_block_vjp on all ranks' tokens concatenated, with all experts: out,
  d_x and the held experts' weight and bias gradients bit for bit; the
  router's and shared experts' gradients and the load-balance loss within
  1e-5 (float32) / 1e-12 (float64) of max(1, max|ref|), and identical on
  every rank. Cases: ranks with no tokens, experts that receive nothing,
  shared experts, biases, capacity dropping, both weight layouts, float32
  and float64, sigmoid group-limited routing; errors: a bad argument on
  one rank, E not a multiple of P, settings differing between ranks, a
  bad cotangent on one rank.
- every option of moe_block on 2 ranks, against the single-process layer on
  the concatenated tokens, forward (with aux) and moe_block_vjp with
  return_aux and the aux losses' cotangents: router_weights_on="input",
  load_balance="maxtext" (x [B, S, d] with whole sequences per rank, and a
  2-D x, one sequence over every rank), "hf", shared_expert_gate, QArray
  int8 expert weights (each rank's slice of the per-channel quantized
  experts), prepacked expert weights, fused gate/up weights ("concat",
  "interleaved") with swiglu_alpha; out, the aux outputs of the rank's
  tokens and the held experts' gradients bit for bit, the losses, d_x and
  the replicated gradients within the tolerance above. Errors: a bad
  option, maxtext's sequence length or return_aux differing between ranks,
  a gate without shared experts, loss cotangents that differ between ranks,
  a bad d_aux on one rank, a PackedRhs as x.
- Failures end every rank within the timeout: an uncaught bad argument
  (every rank prints the error), an exception inside a step after the
  exchange began (comm.Abort ends the job).

Without mpi4py or mpiexec the tests skip, unless RAGGEDDOT_REQUIRE_MPI=1
(set in CI), where they fail.
"""
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "mpi_worker.py"
TIMEOUT_S = 60


def _mpiexec():
    """The mpiexec beside this Python (a venv with the MPICH wheel), else on PATH."""
    local = pathlib.Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


@pytest.fixture(scope="module")
def mpiexec():
    missing = []
    if importlib.util.find_spec("mpi4py") is None:
        missing.append("mpi4py")
    exe = _mpiexec()
    if exe is None:
        missing.append("mpiexec")
    if missing:
        why = f"{' and '.join(missing)} not found: pip install 'raggeddot[mpi]'"
        if os.environ.get("RAGGEDDOT_REQUIRE_MPI") == "1":
            pytest.fail(f"RAGGEDDOT_REQUIRE_MPI=1 but {why}")
        pytest.skip(why)
    return exe


def _is_open_mpi(exe):
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    return "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout + out.stderr


def run_worker(exe, ranks, mode):
    """``mpiexec -n ranks python mpi_worker.py mode`` with a timeout: the
    CompletedProcess (stdout and stderr merged)."""
    env = dict(os.environ, RAGGEDDOT_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    cmd = [exe, "-n", str(ranks)]
    if _is_open_mpi(exe):
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        cmd.append("--oversubscribe")
    cmd += [sys.executable, str(WORKER), mode]
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=TIMEOUT_S, env=env, cwd=str(HERE.parent))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not end within {TIMEOUT_S} s (a hang):\n{e.output}")


@pytest.mark.parametrize("ranks", [2, 4])
def test_suite_against_single_process(mpiexec, ranks):
    res = run_worker(mpiexec, ranks, "suite")
    assert res.returncode == 0, res.stdout
    for r in range(ranks):
        assert f"rank {r}: passed" in res.stdout, res.stdout


def test_every_option_against_single_process(mpiexec):
    res = run_worker(mpiexec, 2, "options")
    assert res.returncode == 0, res.stdout
    for r in range(2):
        assert f"rank {r}: passed 17 option cases" in res.stdout, res.stdout


@pytest.mark.parametrize("mode, message", [
    ("bad-sizes", "ValueError: raggeddot.distributed.ragged_all_to_all: invalid arguments (checked on rank 1): "
                  "'send_sizes'[0]=-1 is negative"),
    ("bad-moe", "ValueError: raggeddot.distributed.moe_block: invalid arguments (checked on rank 0): "
                "'router_weights' [d, E] has d=8 but 'x' has d=7"),
], ids=["bad-sizes", "bad-moe"])
def test_bad_argument_on_one_rank_ends_every_rank(mpiexec, mode, message):
    res = run_worker(mpiexec, 4, mode)
    assert res.returncode != 0, res.stdout
    for r in range(4):
        assert f"rank {r} raised {message}" in res.stdout, res.stdout


def test_exception_inside_a_step_aborts_every_rank(mpiexec):
    res = run_worker(mpiexec, 4, "step-error")
    assert res.returncode != 0, res.stdout
    assert "an injected failure inside the experts step" in res.stdout, res.stdout
    assert "aborting every rank (MPI_Abort)" in res.stdout, res.stdout
    assert "went on after a failed layer" not in res.stdout, res.stdout


def test_import_without_mpi4py_then_clear_error():
    """raggeddot.distributed imports without mpi4py; calling it says what to install."""
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import raggeddot.distributed as d\n"
            "try:\n"
            "    d.ragged_all_to_all(None, None, None, None, None, None, comm=None)\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(HERE.parent))
    assert out.returncode == 0, out.stderr
    assert "pip install 'raggeddot[mpi]'" in out.stdout, out.stdout

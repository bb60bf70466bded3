"""Run the C extension's entry points under valgrind's memcheck and fail on
any error whose stack passes through the extension.

    python .ci/memcheck.py            (valgrind from Debian: apt-get install valgrind)

Errors whose stacks stay inside the interpreter (CPython as built here
reads uninitialised bytes on purpose in a few places) are counted and
reported, not failed on. Valgrind has no AVX-512: under it the CPU reports
no AVX-512 and the AVX2 and portable kernels run.
"""
import os
import re
import subprocess
import sys
import tempfile

DRIVER = r'''
import numpy as np, ml_dtypes, raggeddot
from raggeddot import runtime, _core
rng = np.random.default_rng(0)
gs = np.array([10, 0, 15])
for kernel in runtime.runnable_kernels():
    with runtime.configured(kernel=kernel, stream_threshold=0):
        for dt in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64):
            lhs = rng.standard_normal((30, 17)).astype(dt)
            rhs = rng.standard_normal((3, 17, 20)).astype(dt)
            out = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float32)
            raggeddot.tgmm(lhs.T, out.astype(dt), gs, preferred_element_type=np.float32)
            raggeddot.gmm(lhs, np.swapaxes(rhs, 1, 2), gs, transpose_rhs=True)
        x = rng.standard_normal((9, 6))
        args = (x, rng.standard_normal((6, 4)), rng.standard_normal((4, 6, 5)),
                rng.standard_normal((4, 6, 5)), rng.standard_normal((4, 5, 6)))
        for act in sorted(_core.ACTIVATIONS):
            o, fn = raggeddot.moe_block_vjp(*args, top_k=2, activation=act, capacity_factor=1.0)
            fn(np.ones_like(o))
raggeddot.make_group_metadata(group_sizes=gs, m=28, tm=4)
raggeddot.ragged_gather_reduce(raggeddot.ragged_gather(x, np.array([1, 0, 8])), np.array([[0, -1], [2, 1]]))
for bad in (lambda: raggeddot.ragged_dot(lhs, rhs, np.array([40, 0, 0])),
            lambda: _core.ragged_rows(lhs, rhs, np.array([0, 5, 3, 9]), np.empty((30, 20)), False),
            lambda: _core.gather_rows(x, np.array([99]), None),
            lambda: _core.empty((1 << 62, 1 << 62), np.dtype(np.float32))):
    try:
        bad()
    except (ValueError, TypeError, MemoryError):
        pass
big = _core.empty((1 << 21,), np.dtype(np.float64)); del big
print("driver done")
'''


def main():
    with tempfile.TemporaryDirectory() as tmp:
        script, log = os.path.join(tmp, "driver.py"), os.path.join(tmp, "vg.log")
        with open(script, "w") as f:
            f.write(DRIVER)
        env = dict(os.environ, PYTHONMALLOC="malloc", RAGGEDDOT_NUM_THREADS="2")
        cmd = ["valgrind", "--tool=memcheck", "--leak-check=no", "--num-callers=40",
               f"--log-file={log}", sys.executable, "-P", script]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        with open(log) as f:
            text = f.read()
    if run.returncode != 0 or "driver done" not in run.stdout:
        print(run.stdout, run.stderr, text[-3000:], sep="\n")
        return 1
    blocks = re.split(r"\n==\d+== \n", text)
    errors = [b for b in blocks if re.search(r"== (Invalid|Conditional|Use of|Syscall|Mismatched|Source and)", b)]
    ours = [b for b in errors if "_core.cpython" in b or "csrc/" in b]
    summary = re.search(r"ERROR SUMMARY: (\d+) errors from (\d+) contexts", text)
    print(f"memcheck: {summary.group(0) if summary else '?'}; "
          f"{len(errors)} error contexts in all, {len(ours)} with a frame in raggeddot's extension")
    for b in ours:
        print(b)
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())

"""Coverage-guided fuzzing (atheris) of raggeddot's entry points with
structured inputs: shapes, strides and layouts, dtypes, group sizes,
offsets, bounds, top-k and gather indices, valid or not.

    pip install atheris
    python -P .ci/fuzz_binding.py -max_total_time=300 CORPUS_DIR

Every call must either return or raise ValueError, TypeError, MemoryError
or NotImplementedError (the documented exceptions); anything else, and any
crash, is a finding. atheris instruments raggeddot's Python layer for
coverage (the C library is built by gcc, which libFuzzer's coverage does
not see). To have memory errors in the C library reported too, replay the
corpus the run grew against the sanitizer build (built as .ci/sanitize
does, into DIR):

    LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 PYTHONPATH=DIR \
        python -P .ci/fuzz_binding.py -runs=0 CORPUS_DIR
"""
import sys

import atheris
import numpy as np

with atheris.instrument_imports(include=["raggeddot"]):
    import raggeddot
    from raggeddot import _core, runtime

EXPECTED = (ValueError, TypeError, MemoryError, NotImplementedError)
DTYPES = [np.float32, np.float64, np.float16, np.int32]
try:
    import ml_dtypes
    DTYPES.append(ml_dtypes.bfloat16)
except ImportError:
    pass
KERNELS = runtime.runnable_kernels()


class Input:
    """Draws structured values from the fuzzer's bytes."""

    def __init__(self, data):
        self.f = atheris.FuzzedDataProvider(data)

    def int(self, lo, hi):
        return self.f.ConsumeIntInRange(lo, hi)

    def pick(self, seq):
        return seq[self.int(0, len(seq) - 1)]

    def ints(self, n, lo, hi):
        return np.array([self.int(lo, hi) for _ in range(n)], dtype=np.int64)

    def array(self, shape):
        """Values of a drawn dtype in a drawn layout (every view stays inside
        its own buffer: the fuzzer tests raggeddot, not NumPy's as_strided)."""
        dtype = self.pick(DTYPES)
        n = int(np.prod(shape))
        vals = np.array([self.f.ConsumeFloatInRange(-4.0, 4.0) for _ in range(min(n, 64))] or [0.0])
        arr = np.resize(vals, shape).astype(dtype)
        kind = self.int(0, 5)
        if kind == 1:
            arr = np.asfortranarray(arr)
        elif kind == 2 and arr.ndim:
            arr = np.flip(np.flip(arr).copy())
        elif kind == 3 and arr.ndim and shape[-1]:
            big = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
            big[..., ::2] = arr
            arr = big[..., ::2]
        elif kind == 4 and arr.ndim and shape[0]:
            arr = np.broadcast_to(arr[:1], shape)
        elif kind == 5 and arr.size and arr.dtype.itemsize > 1:
            raw = np.zeros(arr.nbytes + 1, np.uint8)
            mis = raw[1:].view(arr.dtype).reshape(shape)
            mis[...] = arr
            arr = mis
        return arr

    def sizes(self, g, m):
        gs = self.ints(g, -2, max(m, 0) + 2)
        if self.int(0, 3):  # mostly valid: clip into [0, m] with sum <= m
            gs = np.maximum(gs, 0)
            while gs.sum() > m:
                gs[np.argmax(gs)] -= 1
        return gs


def one_call(inp):
    m, k, n, g = inp.int(0, 24), inp.int(0, 12), inp.int(0, 12), inp.int(0, 5)
    op = inp.int(0, 10)
    if op == 0:
        return raggeddot.ragged_dot(inp.array((m, k)), inp.array((g, k, n)), inp.sizes(g, m))
    if op == 1:
        off = inp.int(-1, g + 1)
        return raggeddot.gmm(inp.array((m, k)), inp.array((max(g - max(off, 0), 0), n, k)), inp.sizes(g, m),
                             group_offset=off, transpose_rhs=True)
    if op == 2:
        ex = inp.array((g, k, n)) if inp.int(0, 1) else None
        return raggeddot.tgmm(inp.array((k, m)), inp.array((m, n)), inp.sizes(g, m), existing_out=ex)
    if op == 3:
        dn = raggeddot.RaggedDotDimensionNumbers((((inp.int(0, 2),), (inp.int(0, 2),)), ((), ())),
                                                 (inp.int(0, 2),), (inp.int(0, 1),) if inp.int(0, 1) else ())
        return raggeddot.ragged_dot_general(inp.array((m, k)), inp.array((g, k, n)), inp.sizes(g, m), dn)
    if op == 4:
        return raggeddot.make_group_metadata(group_sizes=inp.sizes(max(g, 1), m), m=m, tm=inp.int(-1, 9),
                                             start_group=inp.int(-1, g), num_nonzero_groups=inp.int(-1, g + 1))
    if op == 5:
        E, d, f = max(g, 1), max(k, 1), max(n, 1)
        return raggeddot.moe_block(inp.array((m, d)), inp.array((d, E)), inp.array((E, d, f)),
                                   inp.array((E, d, f)), inp.array((E, f, d)), top_k=inp.int(0, E + 1),
                                   capacity_factor=inp.pick([None, 0.5, 1.0]),
                                   activation=inp.pick(["silu", "relu", "swiglu_oai", "bad"]))
    if op == 6:
        return raggeddot.ragged_gather(inp.array((m, k)), inp.ints(n, -2, m + 1))
    if op == 7:
        return raggeddot.ragged_gather_reduce(inp.array((m, k)), inp.ints(n * 2, -2, m + 1).reshape(n, 2))
    if op == 8:  # the binding directly, with raw bounds
        bounds = np.sort(inp.ints(g + 1, -1, m + 1)) if inp.int(0, 1) else inp.ints(g + 1, -1, m + 1)
        out = np.zeros((m, n), inp.pick([np.float32, np.float64]))
        return _core.ragged_rows(inp.array((m, k)), inp.array((g, k, n)), bounds, out, bool(inp.int(0, 1)))
    if op == 9:
        bounds = inp.ints(g + 1, -1, m + 1)
        out = np.zeros((g, k, n), inp.pick([np.float32, np.float64]))
        return _core.ragged_contract(inp.array((k, m)), inp.array((m, n)), bounds, out, bool(inp.int(0, 1)))
    return _core.moe_sort(inp.ints(m * 2, -1, g + 1).reshape(m, 2), inp.int(-1, g + 1), inp.int(-2, 3))


def test_one_input(data):
    inp = Input(data)
    with runtime.configured(kernel=inp.pick(KERNELS), num_threads=inp.int(1, 3)):
        try:
            one_call(inp)
        except EXPECTED:
            pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()

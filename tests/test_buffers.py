"""Result buffers: non-temporal stores of written-once outputs, and the cache
of freed result buffers (the memory of a result is reused, so every kernel
must overwrite every element it owns).

The cache's allocator is tested through its binding, ``raggeddot._core.empty``
(the one private name used here); settings go through ``raggeddot.runtime``."""
import itertools

import numpy as np
import pytest

import raggeddot
from raggeddot import _core, reference, runtime

from helpers import FLOATS, KERNELS, check_close, dtype_id, random_group_sizes

MIB = 1 << 20


def address(a):
    return a.__array_interface__["data"][0]


def misaligned(shape, dtype):
    """A C-contiguous writeable array starting one element past a 64-byte line."""
    size = int(np.prod(shape))
    raw = np.empty(size + 64, dtype=dtype)
    first = (-address(raw) % 64) // raw.itemsize + 1
    out = raw[first:first + size].reshape(shape)
    assert address(out) % 64
    return out


# ------------------------------------------------------------ streaming stores


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_streamed_tgmm_is_bitwise_the_stored_one(rng, restore_runtime, kernel, dtype):
    """Streaming changes how C reaches memory, never a value: contractions of
    0 (zeros), 1, below, at and above KC (256; above it the output is
    accumulated and not streamed), full and edge tiles, aligned and
    misaligned outputs."""
    runtime.set_kernel(kernel)
    kc = raggeddot.build_info()["blocking"][np.dtype(dtype).name]["KC"]
    sizes = np.array([0, 1, 7, 31, 32, 33, kc - 1, kc, kc + 1, 0, 3])
    m = int(sizes.sum()) + 5
    for k, n in itertools.product([12, 25, 48], [16, 32, 33, 64]):
        lhs = rng.standard_normal((k, m)).astype(dtype)
        rhs = rng.standard_normal((m, n)).astype(dtype)
        runtime.set_stream_threshold(-1)
        stored = raggeddot.tgmm(lhs, rhs, sizes)
        runtime.set_stream_threshold(0)
        streamed = raggeddot.tgmm(lhs, rhs, sizes)
        out = misaligned(stored.shape, dtype)
        out[...] = np.nan
        raggeddot.tgmm(lhs, rhs, sizes, out=out)
        msg = f"kernel={kernel} k={k} n={n}"
        assert np.array_equal(streamed, stored), msg
        assert np.array_equal(out, stored), msg
        check_close(streamed, reference.tgmm(lhs, rhs, sizes), dtype, err_msg=msg)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_streamed_ragged_dot_is_bitwise_the_stored_one(rng, restore_runtime, kernel, dtype):
    """The forward streams when k fits one KC block."""
    runtime.set_kernel(kernel)
    m, g = 301, 6
    for k, n in itertools.product([5, 64, 300], [32, 47, 96]):
        lhs = rng.standard_normal((m, k)).astype(dtype)
        rhs = rng.standard_normal((g, k, n)).astype(dtype)
        gs = random_group_sizes(rng, g, m - 9)
        runtime.set_stream_threshold(-1)
        stored = raggeddot.ragged_dot(lhs, rhs, gs)
        runtime.set_stream_threshold(0)
        streamed = raggeddot.ragged_dot(lhs, rhs, gs)
        msg = f"kernel={kernel} k={k} n={n}"
        assert np.array_equal(streamed, stored), msg
        check_close(streamed, reference.ragged_dot(lhs, rhs, gs), dtype, err_msg=msg)


def test_streamed_results_identical_across_thread_counts(rng, restore_runtime):
    runtime.set_stream_threshold(0)
    lhs = rng.standard_normal((200, 700)).astype(np.float32)
    rhs = rng.standard_normal((700, 160)).astype(np.float32)
    gs = random_group_sizes(rng, 9, 690)
    raggeddot.set_num_threads(1)
    one = raggeddot.tgmm(lhs, rhs, gs)
    for t in (2, 3):
        raggeddot.set_num_threads(t)
        assert np.array_equal(raggeddot.tgmm(lhs, rhs, gs), one), t


def test_stream_threshold_round_trips(restore_runtime):
    first = raggeddot.build_info()["stream_threshold"]
    assert first > 0
    assert runtime.set_stream_threshold(123) == first
    assert raggeddot.build_info()["stream_threshold"] == 123
    assert runtime.set_stream_threshold(-5) == 123
    assert raggeddot.build_info()["stream_threshold"] == -1


# ----------------------------------------------------------- result buffers


def test_empty_is_aligned_contiguous_and_writeable():
    import ml_dtypes
    for shape, dtype in [((0, 5), np.float32), ((3, 4), np.float64), ((7,), np.float32),
                         ((2, 3, 5), np.float64), ((1024, 2048), np.float32), ((33, 7), np.float16),
                         ((512, 1024), ml_dtypes.bfloat16)]:
        a = _core.empty(shape, np.dtype(dtype))
        assert a.shape == shape and a.dtype == dtype
        assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
        assert address(a) % 64 == 0
        a[...] = 1.5
        assert (a == 1.5).all()


def test_empty_refuses_other_dtypes_and_bad_shapes():
    for dtype in (object, np.int64, np.int16, np.dtype(">f4"), np.dtype(">f2"), np.dtype([("a", np.float32)])):
        with pytest.raises(TypeError, match="native float32, float64, float16 or bfloat16"):
            _core.empty((3,), np.dtype(dtype))
    with pytest.raises(ValueError, match="negative dimension"):
        _core.empty((2, -1), np.dtype(np.float32))
    with pytest.raises(MemoryError, match="more bytes than memory can hold"):
        _core.empty((1 << 40, 1 << 40), np.dtype(np.float32))


def test_freed_large_buffer_is_reused_and_live_ones_never(restore_runtime):
    raggeddot.set_buffer_cache(0)  # start from an empty cache
    raggeddot.set_buffer_cache(64 * MIB)
    f32 = np.dtype(np.float32)
    shape = (2, 1024, 1024)  # 8 MiB
    a = _core.empty(shape, f32)
    pa = address(a)
    b = _core.empty(shape, f32)  # a is alive: another block
    assert address(b) != pa
    view = a[1]
    del a
    c = _core.empty(shape, f32)  # a's block is still held by its view
    assert address(c) not in (pa, address(b))
    del view
    d = _core.empty(shape, f32)
    assert address(d) == pa
    blocks = {address(x) for x in (b, c, d)}
    del b, c, d
    # an idle block at most a quarter larger than the request is reused ...
    e = _core.empty((2, 1024, 900), f32)
    assert address(e) in blocks
    # ... a much larger one is not
    f = _core.empty((2, 1024, 512), f32)
    assert address(f) not in blocks


def test_buffer_cache_limit_and_idle_accounting(restore_runtime):
    f32 = np.dtype(np.float32)
    raggeddot.set_buffer_cache(0)
    assert raggeddot.build_info()["buffer_cache"]["idle"] == 0
    assert raggeddot.set_buffer_cache(20 * MIB) == 0
    a, b, c = (_core.empty((2 * MIB,), f32) for _ in range(3))  # 8 MiB each
    pb, pc = address(b), address(c)
    del a
    del b
    assert raggeddot.build_info()["buffer_cache"]["idle"] == 16 * MIB
    del c  # 24 MiB > 20: the oldest idle block (a's) is released
    assert raggeddot.build_info()["buffer_cache"]["idle"] == 16 * MIB
    x = _core.empty((2 * MIB,), f32)
    assert address(x) in (pb, pc)
    assert raggeddot.build_info()["buffer_cache"]["idle"] == 8 * MIB
    small = _core.empty((1000,), np.dtype(np.float64))  # below 4 MiB: never kept
    del small
    assert raggeddot.build_info()["buffer_cache"]["idle"] == 8 * MIB
    assert raggeddot.set_buffer_cache(0) == 20 * MIB
    assert raggeddot.build_info()["buffer_cache"]["idle"] == 0
    del x  # limit 0: released at once
    assert raggeddot.build_info()["buffer_cache"]["idle"] == 0


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_reused_memory_is_fully_overwritten(rng, restore_runtime, dtype):
    """A reused block holds the previous result's values: empty groups, tail
    rows and rows of other experts must still come out as 0 (or
    existing_out's values)."""
    raggeddot.set_buffer_cache(256 * MIB)
    runtime.set_stream_threshold(0)
    m, k, n, g = 640, 96, 1536, 8  # results of 3.8-5.9 MiB (float32) to 7.5-11.8 (float64)
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs = rng.standard_normal((g, k, n)).astype(dtype)
    ct = rng.standard_normal((m, n)).astype(dtype)
    full = np.full(g, m // g)
    sparse = np.array([0, 100, 0, 0, 250, 0, 50, 0])  # empty groups, 240 tail rows
    for _ in range(2):
        # the first results fill the blocks with nonzeros; the second ones reuse them
        dense = [raggeddot.tgmm(lhs.T, ct, full), raggeddot.ragged_dot(lhs, rhs, full),
                 raggeddot.gmm(lhs, rhs, full)]
        assert all(np.count_nonzero(x) == x.size for x in dense)
        del dense
        check_close(raggeddot.tgmm(lhs.T, ct, sparse), reference.tgmm(lhs.T, ct, sparse), dtype)
        check_close(raggeddot.ragged_dot(lhs, rhs, sparse), reference.ragged_dot(lhs, rhs, sparse), dtype)
        check_close(raggeddot.gmm(lhs, rhs[2:5], sparse, group_offset=2),
                    reference.gmm(lhs, rhs[2:5], sparse, group_offset=2), dtype)


def test_set_buffer_cache_rejects_bad_values():
    with pytest.raises(ValueError, match="nbytes"):
        raggeddot.set_buffer_cache(-1)
    with pytest.raises(TypeError, match="nbytes"):
        raggeddot.set_buffer_cache(1.5)


def test_tracemalloc_sees_result_memory_while_an_array_holds_it(restore_runtime):
    import tracemalloc

    raggeddot.set_buffer_cache(64 * MIB)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        a = _core.empty((1024, 1024), np.dtype(np.float64))  # 8 MiB
        assert tracemalloc.get_traced_memory()[0] - base >= 8 * MIB
        del a  # kept idle in the cache, no longer array memory
        assert tracemalloc.get_traced_memory()[0] - base < MIB
        b = _core.empty((1024, 1024), np.dtype(np.float64))  # reused block, traced again
        assert tracemalloc.get_traced_memory()[0] - base >= 8 * MIB
        del b
    finally:
        tracemalloc.stop()

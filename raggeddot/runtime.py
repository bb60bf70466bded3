"""How raggeddot runs: threads, micro-kernels, cache blocking, streaming
stores, the result-buffer cache, and what the build holds.

Every setting here is process-wide. A call reads the settings once, when it
starts, into a plan of its own (kernel, blocking, threads); changing a
setting while other threads compute affects only calls that start after the
change, never a call in flight.

    >>> from raggeddot import runtime
    >>> runtime.runnable_kernels()            # e.g. ['avx512', 'avx2', 'ref']
    >>> with runtime.configured(kernel="ref", num_threads=1):
    ...     ...                               # settings restored on exit
"""
import contextlib
import operator

from . import _core

__all__ = [
    "set_num_threads",
    "get_num_threads",
    "set_kernel",
    "get_kernel",
    "compiled_kernels",
    "runnable_kernels",
    "set_blocking",
    "set_stream_threshold",
    "read_bandwidth",
    "get_stream_threshold",
    "set_buffer_cache",
    "get_buffer_cache",
    "build_info",
    "peak_gflops",
    "configured",
]


def _integer(value, name, fn):
    if isinstance(value, bool):
        raise TypeError(f"{fn}: '{name}' must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: '{name}' must be an integer, got {value!r}") from None


def _int_at_least(value, least, name, fn):
    value = _integer(value, name, fn)
    if value < least:
        raise ValueError(f"{fn}: '{name}' must be >= {least}, got {value}")
    return value


def set_num_threads(n):
    """Set the number of threads of the kernels, 1 to 4096 (default:
    RAGGEDDOT_NUM_THREADS, else OpenMP's default); ValueError naming ``n``
    outside that range. Results are bitwise identical for every count."""
    _core.set_num_threads(_int_at_least(n, 1, "n", "set_num_threads"))


def get_num_threads():
    """The number of threads the kernels run on (1 in a build without OpenMP)."""
    return _core.get_num_threads()


def compiled_kernels():
    """Names of the micro-kernel families compiled into this build, most
    preferred first (e.g. ``['avx512', 'avx2', 'ref']``)."""
    return [k["name"] for k in _core.kernel_table()]


def runnable_kernels():
    """The compiled kernel families this CPU can run, most preferred first;
    ``'ref'`` (portable C) is always among them."""
    return [k["name"] for k in _core.kernel_table() if k["runnable"]]


def set_kernel(name):
    """Force the micro-kernel family ``name`` (one of :func:`runnable_kernels`),
    or ``'auto'`` for the best one this CPU runs; returns the previous name.

    A family that has no kernel for some compute type leaves that type to
    the best runnable family that has one, except the dot-product types
    ("bfloat16-dot", "int8-dot"): those are then not used, and their
    products take the widening float32 / vpmaddwd kernels (so naming a float
    family such as ``'avx512'`` forces the widening path). The dot-product
    families ``'avx512-bf16'``, ``'avx512-vnni'``, ``'avx-vnni'`` serve only
    their type, and are chosen automatically where the CPU has their
    instruction; their twins (``'...-twin'``: the same kernels on an exact
    emulation of the instruction, runnable on any AVX-512 / AVX2 CPU) only
    by name. Resets the cache blocking to the family's defaults. ValueError
    for an unknown name, RuntimeError for a family this CPU cannot run."""
    if not isinstance(name, str):
        raise TypeError(f"set_kernel: 'name' must be a str, got {type(name).__name__}")
    return _core.set_kernel(name)


def get_kernel():
    """Name of the kernel family in use."""
    return _core.get_kernel()


def set_blocking(dtype, mc, kc, nc):
    """Cache blocking of the kernel in use for compute dtype ``dtype``
    ('float32' or 'float64'): MC rows of A (L2), KC of the contraction (L1),
    NC columns of B (L3). MC and NC are rounded up to the register block.
    For tuning; :func:`set_kernel` restores the defaults."""
    fn = "set_blocking"
    args = [_int_at_least(x, 1, name, fn) for x, name in ((mc, "mc"), (kc, "kc"), (nc, "nc"))]
    _core.set_blocking(str(dtype), *args)


def set_stream_threshold(nbytes):
    """Outputs of at least ``nbytes`` that a call writes once (no accumulation,
    the whole contraction in one KC block) get non-temporal stores; a
    negative value turns streaming off. Returns the previous threshold."""
    return _core.set_stream_threshold(_integer(nbytes, "nbytes", "set_stream_threshold"))


def get_stream_threshold():
    """The current streaming threshold in bytes (negative: never)."""
    return build_info()["stream_threshold"]


def set_buffer_cache(nbytes):
    """Limit the memory of freed result buffers kept for reuse; returns the
    previous limit (default 2 GiB). 0 keeps none and releases what is kept.

    The results of ragged_dot, gmm and tgmm (and so of the gradients and MoE
    layers built on them) of 4 MiB or more live in blocks that go back to
    this cache when their last array is deleted; the next result of about the
    same size reuses one. A fresh block of that size costs the OS's zeroing
    of every page on first touch, which for tgmm's ``[g, k, n]`` output with
    small groups takes longer than the products. A loop that computes
    same-shaped results step after step (training) pays it only once.
    Passing ``out=`` reuses a buffer explicitly instead."""
    return _core.set_buffer_cache(_int_at_least(nbytes, 0, "nbytes", "set_buffer_cache"))


def get_buffer_cache():
    """``{'limit': bytes, 'idle': bytes}`` of the result-buffer cache."""
    return dict(build_info()["buffer_cache"])


def build_info():
    """How the extension was built and what it runs, as a dict:

    - ``openmp``: bool; ``num_threads``: int.
    - ``kernels``: one dict per compiled kernel family, most preferred first:
      ``{'name', 'runnable', 'types': [compute dtypes it has kernels for]}``.
    - ``simd``: the compiled family names; ``kernel``: the family in use;
      ``kernel_selection``: what was asked for (a name, or ``'auto'``).
    - ``cpu``: ``{feature: bool}`` for the CPU features the kernels check.
    - ``blocking``: ``{dtype: {'kernel', 'MR', 'NR', 'MC', 'KC', 'NC'}}``, per
      compute dtype, of the kernel in use.
    - ``stream_threshold``: output bytes from which a written-once output gets
      non-temporal stores; ``buffer_cache``: ``{'limit', 'idle'}`` bytes.
    """
    return _core.build_info()


def peak_gflops(isa, threads=None, seconds=0.5):
    """Measured sustained throughput, GFLOP/s, of ``threads`` threads (default
    :func:`get_num_threads`) each running independent chains of one
    instruction for about ``seconds``: ``'avx2'`` (256-bit float32 FMA),
    ``'avx512'`` (512-bit float32 FMA), ``'avx512_bf16'`` (``vdpbf16ps``,
    64 flops an instruction), ``'avx512_vnni'`` (512-bit ``vpdpbusd``, 128
    int8 operations an instruction; giga-operations rather than FLOP),
    ``'avx_vnni'`` (256-bit ``vpdpbusd``), ``'amx_bf16'``, ``'amx_int8'``
    (AMX tiles); on aarch64 ``'neon'`` (4-lane float32 ``fmla``),
    ``'neon_bf16'`` (``BFMMLA``, 32 flops an instruction), ``'neon_dot'``
    (``UDOT``, 32 int8 operations) or ``'neon_i8mm'`` (``USMMLA``, 64). 0.0 when
    the CPU lacks it. The yardstick of the benchmarks' "% of peak"."""
    threads = get_num_threads() if threads is None else _int_at_least(threads, 1, "threads", "peak_gflops")
    return _core.fma_peak(threads, float(seconds), str(isa))


def read_bandwidth(threads=None, megabytes=256, seconds=0.5):
    """Measured read bandwidth, GB/s: ``threads`` threads (default
    :func:`get_num_threads`) each summing ``megabytes`` of its own memory
    (far beyond the caches) over and over for about ``seconds``. The
    yardstick of the benchmarks' weight-streaming shapes: a product that
    reads its weights once cannot take less than their bytes over this."""
    threads = get_num_threads() if threads is None else _int_at_least(threads, 1, "threads", "read_bandwidth")
    return _core.read_bandwidth(threads, float(megabytes), float(seconds))


@contextlib.contextmanager
def configured(*, kernel=None, num_threads=None, stream_threshold=None, buffer_cache=None):
    """A context in which the given settings hold; every setting (given or
    not) is restored on exit, whatever happens inside."""
    info = build_info()
    saved_kernel = info["kernel_selection"]      # "auto" stays automatic
    saved_threads = get_num_threads()
    saved_stream = info["stream_threshold"]
    saved_cache = info["buffer_cache"]["limit"]
    try:
        if kernel is not None:
            set_kernel(kernel)
        if num_threads is not None:
            set_num_threads(num_threads)
        if stream_threshold is not None:
            set_stream_threshold(stream_threshold)
        if buffer_cache is not None:
            set_buffer_cache(buffer_cache)
        yield
    finally:
        _core.set_kernel(saved_kernel)
        _core.set_num_threads(saved_threads)
        _core.set_stream_threshold(saved_stream)
        _core.set_buffer_cache(saved_cache)

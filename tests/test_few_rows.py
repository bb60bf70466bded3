"""Decoding shapes on prepacked weights: groups of one or two rows (three
and four for quantized weights on the AVX-512 family, three on AVX2) run on
the few-row kernels (several B panels at once, where a family has them), and
every element must be what the plain weights give bit for bit, on every float
family, for every weight format, at panel counts that take each run of panels
(4, 2, 1 at a time) and the masked right edge, over several KC blocks and the
scale runs inside them, with rows of 1 to 5 in the same call (5 goes to the
micro-kernel everywhere), into a fresh result or an ``out`` holding other
values, and for the gated pair of an MoE layer (two weights over the same
rows)."""
import ml_dtypes
import numpy as np
import pytest

import raggeddot
from raggeddot import quant, reference, runtime

from helpers import DOT_KERNELS, KERNELS

BF16 = np.dtype(ml_dtypes.bfloat16)


def _bits(x):
    x = np.ascontiguousarray(x)
    return x.view(np.uint8)


def _formats(rng, g, k, n):
    """(name, plain weights, tolerance of the product against the NumPy
    reference on the dequantized weights)."""
    w = rng.standard_normal((g, k, n)).astype(np.float32) * np.float32(0.05)
    tiled = dict(channelwise_axes=(0, 2), tiled_axes={1: 32})
    return [
        ("float32", w),
        ("bfloat16", w.astype(BF16)),
        ("float16", w.astype(np.float16)),
        ("int8", quant.quantize(w, "int8", channelwise_axes=(0, 2))),
        ("int8-zp-k32", quant.quantize(w, "int8", calibration_method="minmax", **tiled)),
        ("int4-k32", quant.quantize(w, "int4", **tiled)),
        ("float8", quant.quantize(w, "float8_e4m3fn", channelwise_axes=(0, 2))),
        ("mxfp4", quant.quantize(w, "mxfp4", **tiled)),
    ]


def _dense(w):
    return quant.dequantize(w) if isinstance(w, quant.QArray) else w.astype(np.float32)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("k,n", [(96, 33), (608, 31), (288, 257), (1120, 160), (64, 96)])
def test_prepacked_decode_gives_the_plain_weights_bits(rng, kernel, k, n):
    g = 7
    gs = np.array([1, 2, 0, 3, 4, 5, 1], dtype=np.int64)
    x = rng.standard_normal((int(gs.sum()), k)).astype(np.float32)
    with runtime.configured(kernel=kernel):
        for name, w in _formats(rng, g, k, n):
            packed = raggeddot.prepack(w, lhs_dtype=np.float32)
            want = raggeddot.ragged_dot(x, w, gs)
            got = raggeddot.ragged_dot(x, packed, gs)
            assert np.array_equal(_bits(got), _bits(want)), (kernel, name, k, n)
            ref = reference.ragged_dot(x.astype(np.float64), _dense(w).astype(np.float64), gs)
            scale = max(1.0, float(np.abs(ref).max()))
            assert np.abs(got - ref).max() / scale < 1e-5, (kernel, name)
            # accumulating into an out that holds other values: the rows of
            # the groups are overwritten, the rows past them zeroed
            out = np.full_like(want, 7.0)
            raggeddot.ragged_dot(x, packed, gs, out=out)
            assert np.array_equal(_bits(out), _bits(want)), (kernel, name, "out")


@pytest.mark.parametrize("kernel", KERNELS)
def test_one_row_groups_at_every_thread_count(rng, kernel):
    g, k, n = 16, 256, 200
    gs = np.ones(g, dtype=np.int64)
    x = rng.standard_normal((g, k)).astype(np.float32)
    with runtime.configured(kernel=kernel):
        for name, w in _formats(rng, g, k, n):
            packed = raggeddot.prepack(w, lhs_dtype=np.float32)
            want = raggeddot.ragged_dot(x, w, gs)
            for threads in (1, 2, 3):
                with runtime.configured(num_threads=threads):
                    got = raggeddot.ragged_dot(x, packed, gs)
                assert np.array_equal(_bits(got), _bits(want)), (kernel, name, threads)


@pytest.mark.parametrize("kernel", KERNELS)
def test_moe_decode_on_prepacked_experts_gives_the_plain_bits(rng, kernel):
    E, d, f, T = 6, 96, 160, 3
    x = rng.standard_normal((T, d)).astype(np.float32)
    router = rng.standard_normal((d, E)).astype(np.float32)
    w0, w1 = (rng.standard_normal((E, d, f)).astype(np.float32) * np.float32(0.1) for _ in range(2))
    wo = rng.standard_normal((E, f, d)).astype(np.float32) * np.float32(0.1)
    tiled = dict(channelwise_axes=(0, 2), tiled_axes={1: 32})
    with runtime.configured(kernel=kernel):
        for qtype in ("int8", "mxfp4"):
            ws = [quant.quantize(w, qtype, **tiled) for w in (w0, w1, wo)]
            want = raggeddot.moe_block(x, router, *ws, top_k=2)
            got = raggeddot.moe_block(x, router, *(raggeddot.prepack(w) for w in ws), top_k=2)
            assert np.array_equal(_bits(got), _bits(want)), (kernel, qtype)


BF16_KERNELS = sorted({k for ct in ("bfloat16-dot", "bfloat16-tile", "bfloat16-mmla") for k in DOT_KERNELS[ct]})


@pytest.mark.parametrize("kernel", ["auto"] + KERNELS + BF16_KERNELS)
@pytest.mark.parametrize("lhs_dtype", [np.float32, BF16, np.float16], ids=["float32", "bfloat16", "float16"])
def test_every_prepacked_format_gives_the_plain_bits_for_every_lhs(rng, kernel, lhs_dtype):
    # k = 1024 over groups of 1 to 90 rows: sums long enough that another
    # order of additions (the bfloat16 dot products' against float32 FMAs)
    # shows in the bits
    g, k, n = 4, 1024, 72
    gs = np.array([90, 1, 2, 40], dtype=np.int64)
    x = rng.standard_normal((int(gs.sum()), k)).astype(lhs_dtype)
    with runtime.configured(kernel=kernel):
        for name, w in _formats(rng, g, k, n):
            want = raggeddot.ragged_dot(x, w, gs, preferred_element_type=np.float32)
            packed = raggeddot.prepack(w)
            got = raggeddot.ragged_dot(x, packed, gs, preferred_element_type=np.float32)
            assert np.array_equal(_bits(got), _bits(want)), (kernel, name, np.dtype(lhs_dtype).name,
                                                           packed.layouts)

"""raggeddot.runtime: the public settings module."""
import threading

import numpy as np
import pytest

import raggeddot
from raggeddot import _core, _gateway, runtime


def test_build_info_describes_the_build():
    info = runtime.build_info()
    assert isinstance(info["openmp"], bool)
    assert [k["name"] for k in info["kernels"]] == info["simd"] == runtime.compiled_kernels()
    assert info["kernel"] in runtime.runnable_kernels()
    # every float type has a kernel; a dot-product or tile type only where a family serves it
    dot = {"bfloat16-dot", "int8-dot", "bfloat16-tile", "int8-tile", "bfloat16-mmla", "int8-mmla"}
    assert set(info["blocking"]) - dot == set(_core.PACKING_READS) - dot >= {"float32", "float64"}
    assert set(info["blocking"]) & dot == {t for t in dot if _core.kernel_for(t) != "none"}
    for b in info["blocking"].values():
        assert {"kernel", "MR", "NR", "MC", "KC", "NC"} <= set(b)
    assert all(isinstance(v, bool) for v in info["cpu"].values())
    assert info["num_threads"] == runtime.get_num_threads() >= 1
    assert runtime.get_buffer_cache() == info["buffer_cache"]
    assert runtime.get_stream_threshold() == info["stream_threshold"]
    # the package's top-level helpers are the runtime's
    assert raggeddot.build_info is runtime.build_info
    assert raggeddot.set_num_threads is runtime.set_num_threads


def test_configured_keeps_automatic_selection_automatic():
    with runtime.configured(kernel="auto"):
        assert runtime.build_info()["kernel_selection"] == "auto"
        with runtime.configured(kernel="ref"):
            assert runtime.build_info()["kernel_selection"] == "ref"
        assert runtime.build_info()["kernel_selection"] == "auto"


def test_selection_generation_moves_with_every_change_of_kernels():
    """What the Python layer keeps of the selection (served types, a PackedRhs's checks) is
    keyed by this number: set_kernel (even to the same family) and set_blocking change it,
    the calls that do not change the selection leave it."""
    with runtime.configured():
        g0 = _core.selection_generation()
        assert _core.selection_generation() == g0
        runtime.set_kernel(runtime.get_kernel())
        g1 = _core.selection_generation()
        assert g1 != g0
        b = runtime.build_info()["blocking"]["float32"]
        runtime.set_blocking("float32", b["MC"], b["KC"], b["NC"])
        g2 = _core.selection_generation()
        assert g2 not in (g0, g1)
        runtime.set_num_threads(runtime.get_num_threads())
        assert _core.selection_generation() == g2
        for kernel in runtime.runnable_kernels():
            runtime.set_kernel(kernel)
            assert _core.selection_generation() != g2
            for ct in _core.PACKING_READS:     # its answers follow the selection
                readers = {"bfloat16-dot": ("bfloat16-tile",), "int8-dot": ("int8-tile",)}.get(ct, ())
                assert _gateway.served(ct) == any(_core.kernel_for(t) != "none" for t in (ct,) + readers)
            g2 = _core.selection_generation()


def test_configured_restores_every_setting_even_on_error():
    before = runtime.build_info()
    with pytest.raises(KeyError):
        with runtime.configured(kernel="ref", num_threads=1, stream_threshold=0, buffer_cache=0):
            info = runtime.build_info()
            assert info["kernel"] == "ref" and info["num_threads"] == 1
            assert info["stream_threshold"] == 0 and info["buffer_cache"]["limit"] == 0
            raise KeyError("inside")
    after = runtime.build_info()
    for key in ("kernel", "kernel_selection", "num_threads", "stream_threshold", "blocking"):
        assert after[key] == before[key], key
    assert after["buffer_cache"]["limit"] == before["buffer_cache"]["limit"]


@pytest.mark.parametrize("call, exc, match", [
    (lambda: runtime.set_num_threads(0), ValueError, "'n' must be >= 1"),
    (lambda: runtime.set_num_threads(1.5), TypeError, "'n' must be an integer"),
    (lambda: runtime.set_num_threads(True), TypeError, "'n' must be an integer"),
    (lambda: runtime.set_kernel(3), TypeError, "'name' must be a str"),
    (lambda: runtime.set_kernel("sse9"), ValueError, "unknown kernel 'sse9'"),
    (lambda: runtime.set_buffer_cache(-1), ValueError, "'nbytes' must be >= 0"),
    (lambda: runtime.set_stream_threshold("big"), TypeError, "'nbytes' must be an integer"),
    (lambda: runtime.set_blocking("float32", 0, 1, 1), ValueError, "'mc' must be >= 1"),
    (lambda: runtime.set_blocking("int8", 1, 1, 1), ValueError, "set_blocking"),
    (lambda: runtime.peak_gflops("sse9", 1, 0.01), ValueError, "isa must be"),
])
def test_bad_settings_are_refused(call, exc, match):
    before = runtime.build_info()
    with pytest.raises(exc, match=match):
        call()
    assert runtime.build_info()["kernel"] == before["kernel"]


def test_peak_probe_reports_a_positive_rate_for_the_kernel_in_use():
    info = runtime.build_info()
    isa = "avx512" if info["cpu"].get("avx512f") else "avx2" if info["cpu"].get("avx2") else None
    if isa is None:
        assert runtime.peak_gflops("avx2", 1, 0.01) == 0.0
    else:
        assert runtime.peak_gflops(isa, 1, 0.05) > 1.0


def test_read_bandwidth_probe():
    """A positive rate in a sane range (0.1 GB/s to 10 TB/s), and its
    arguments checked."""
    assert 0.1 < runtime.read_bandwidth(1, megabytes=64, seconds=0.05) < 1e4
    for bad in ({"threads": 0}, {"megabytes": 0.5}, {"seconds": 0.0}, {"seconds": 100.0}):
        with pytest.raises(ValueError):
            runtime.read_bandwidth(**{"threads": 1, "megabytes": 64, "seconds": 0.05, **bad})


def test_a_call_in_flight_keeps_the_settings_it_started_with(rng):
    """Settings changed while a call runs reach only later calls: the call
    made its plan (kernel, blocking, threads) when it started."""
    lhs = rng.standard_normal((4096, 1024)).astype(np.float32)
    rhs = rng.standard_normal((8, 1024, 512)).astype(np.float32)
    gs = np.full(8, 512)
    want = raggeddot.ragged_dot(lhs, rhs, gs)
    # the settings the call may start with (the loop below may have run before it did):
    # each gives its own last bits, a call that changed settings midway none of them
    with runtime.configured(kernel="ref"):
        wants = [want, raggeddot.ragged_dot(lhs, rhs, gs)]
        runtime.set_blocking("float32", 48, 64, 256)
        wants.append(raggeddot.ragged_dot(lhs, rhs, gs))
    got = {}
    with runtime.configured():
        t = threading.Thread(target=lambda: got.setdefault("out", raggeddot.ragged_dot(lhs, rhs, gs)))
        t.start()
        while t.is_alive():
            runtime.set_kernel("ref")
            runtime.set_blocking("float32", 48, 64, 256)
            runtime.set_num_threads(1)
            runtime.set_kernel("auto")
        t.join()
    assert any(np.array_equal(got["out"], w) for w in wants)

"""The XLA FFI handlers of raggeddot.jax, compiled on first use.

Why on first use, and not with the extension: the handlers must be compiled
against ``xla/ffi/api/c_api.h`` of the jaxlib that will run them, which is
the one installed when raggeddot.jax is imported, not one visible when
raggeddot was built (pip builds in an isolated environment without jaxlib,
so a build-time check would silently leave the handlers out of a fresh
``pip install '.[jax]'``; jaxlib may also be upgraded later). Compiling one
small C file (``rd_ffi.c``, shipped in this package) takes about a second,
once per (source, header, compiler) into the user's cache directory
(``RAGGEDDOT_CACHE_DIR``, else ``~/.cache/raggeddot``); later imports load
the cached library. The handlers call raggeddot._core's drivers through the
table of C function pointers that _core exports as the capsule ``_C_API``
(``rd_capi.h``): the same kernels and thread pool as the NumPy API.

The compiler is ``$CC``, else Python's configured C compiler, else ``cc``.
"""
import ctypes
import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import threading

import jax
import jaxlib

from .. import _core
from .._cache import cache_dir, writable_dir

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCES = ("rd_ffi.c", "rd_capi.h")
_FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-pedantic", "-fPIC", "-shared"]
TARGETS = {"raggeddot_ragged_rows": "rd_ffi_ragged_rows",
           "raggeddot_ragged_contract": "rd_ffi_ragged_contract"}

_lock = threading.Lock()
_state = {}


def _compiler():
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc)


def _header():
    return os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")


def _key(cc):
    """Hash of everything the library depends on."""
    h = hashlib.sha256()
    for name in _SOURCES:
        with open(os.path.join(_HERE, name), "rb") as f:
            h.update(f.read())
    with open(_header(), "rb") as f:
        h.update(f.read())
    h.update(" ".join(cc + _FLAGS).encode())
    h.update(f"{sys.platform}-{sysconfig.get_platform()}".encode())
    return h.hexdigest()[:20]


def _compile(cc, path):
    """Compile rd_ffi.c into `path` (written under another name, then renamed:
    concurrent processes never see half a file). Returns the compiler's
    diagnostics (empty when clean)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    cmd = cc + _FLAGS + ["-I", jax.ffi.include_dir(), "-I", _HERE,
                         os.path.join(_HERE, "rd_ffi.c"), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        os.unlink(tmp)
        raise RuntimeError(
            f"raggeddot.jax: cannot run the C compiler {cc[0]!r} to build the XLA FFI handlers ({e}); "
            "install a C compiler or set CC"
        ) from None
    if proc.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(
            "raggeddot.jax: compiling the XLA FFI handlers failed:\n" + " ".join(cmd) + "\n" + proc.stderr
        )
    os.replace(tmp, path)
    return proc.stderr.strip()


def load():
    """Compile (once per cache) and load the handlers, bind them to _core and
    register the FFI targets with jax. Idempotent and thread-safe."""
    with _lock:
        if _state:
            return _state["lib"]
        cc = _compiler()
        path = os.path.join(writable_dir(cache_dir()), f"rd_ffi-{_key(cc)}.so")
        compiled, diagnostics = False, ""
        if not os.path.exists(path):
            diagnostics = _compile(cc, path)
            compiled = True
        lib = ctypes.CDLL(path)
        # (a prototype of our own: the shared ctypes.pythonapi entry is left as it is)
        get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
            ("PyCapsule_GetPointer", ctypes.pythonapi))
        if not hasattr(_core, "_C_API"):
            raise RuntimeError("raggeddot.jax: raggeddot._core predates its C API (_C_API); rebuild the "
                               "extension: python setup.py build_ext --inplace, or reinstall raggeddot")
        table = get(_core._C_API, b"raggeddot._core._C_API")
        lib.rd_ffi_bind.argtypes = [ctypes.c_void_p]
        lib.rd_ffi_bind.restype = ctypes.c_int
        if lib.rd_ffi_bind(table) != 0:
            raise RuntimeError(f"raggeddot.jax: the handlers in {path} do not match raggeddot._core's C API; "
                               f"remove that file")
        for target, symbol in TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
        _state.update(lib=lib, path=path, compiled=compiled, diagnostics=diagnostics, compiler=cc)
        return lib


def build_info():
    """How the handlers were built: a dict with ``handlers`` (how and why),
    ``library`` (path), ``compiled_now`` (False: loaded from the cache),
    ``compiler``, ``diagnostics`` (compiler output, empty when clean),
    ``jaxlib``, ``ffi_api`` (the header's XLA_FFI_API_MAJOR.MINOR) and
    ``num_threads`` (what a call started now runs with, asked of the
    handlers' library: raggeddot's own setting)."""
    lib = load()
    lib.rd_ffi_num_threads.restype = ctypes.c_int
    api = "?"
    with open(_header()) as f:
        text = f.read()
    vals = {}
    for name in ("XLA_FFI_API_MAJOR", "XLA_FFI_API_MINOR"):
        for line in text.splitlines():
            if line.startswith(f"#define {name} "):
                vals[name] = line.split()[2]
    if len(vals) == 2:
        api = f"{vals['XLA_FFI_API_MAJOR']}.{vals['XLA_FFI_API_MINOR']}"
    return {
        "handlers": ("compiled on first use against the installed jaxlib's FFI header, cached per "
                     "(source, header, compiler); not built with the extension, whose isolated pip "
                     "build cannot see jaxlib"),
        "library": _state["path"],
        "compiled_now": _state["compiled"],
        "compiler": " ".join(_state["compiler"]),
        "diagnostics": _state["diagnostics"],
        "jaxlib": jaxlib.__version__,
        "ffi_api": api,
        "targets": sorted(TARGETS),
        "num_threads": lib.rd_ffi_num_threads(),
    }

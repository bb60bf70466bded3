"""raggeddot.jax's FFI handlers (rd_ffi.c) compile against every XLA FFI
header from the oldest jaxlib the extra allows to the newest (item 13).

jaxlib 0.11's c_api.h renamed the struct of the extensions' common header
(XLA_FFI_Extension_Base, now XLA_FFI_InternalExtension, with a new, public
XLA_FFI_Extension of another layout beside it), and rd_ffi.c named it. The
handlers now read the chain through their own mirror of its leading fields:
compiled here against the installed header, and against that header with
the struct named the other way (-Werror, the flags of the build).
Headers named in RAGGEDDOT_XLA_FFI_HEADERS (paths of other c_api.h files,
separated by os.pathsep, e.g. saved from other jaxlib versions) are
compiled too.
"""
import os
import pathlib
import re
import shlex
import subprocess
import sysconfig

import pytest

jax = pytest.importorskip("jax")
from raggeddot.jax import _build  # noqa: E402

SOURCE = pathlib.Path(_build.__file__).resolve().parent / "rd_ffi.c"


def _compile(include_dir, tmp_path):
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    flags = [f for f in _build._FLAGS if f != "-shared"] + ["-Werror", "-c"]
    cmd = cc + flags + ["-I", str(include_dir), "-I", str(SOURCE.parent), str(SOURCE),
                        "-o", str(tmp_path / "rd_ffi.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not proc.stderr.strip(), proc.stderr


def _tree(tmp_path, name, text):
    root = tmp_path / name
    (root / "xla" / "ffi" / "api").mkdir(parents=True)
    (root / "xla" / "ffi" / "api" / "c_api.h").write_text(text)
    return root


def _installed():
    return pathlib.Path(_build._header()).read_text()


def renamed_as_in_jaxlib_0_11(text):
    """The installed header with the extensions' base struct renamed to
    XLA_FFI_InternalExtension and a public XLA_FFI_Extension of another
    layout declared beside it (the old name then exists nowhere)."""
    assert "XLA_FFI_Extension_Base" in text
    text = text.replace("XLA_FFI_Extension_Base", "XLA_FFI_InternalExtension")
    public = ("typedef struct XLA_FFI_ExtensionId { int64_t extension_type; int32_t major_version; "
              "int32_t minor_version; } XLA_FFI_ExtensionId;\n"
              "typedef struct XLA_FFI_Extension { size_t struct_size; XLA_FFI_ExtensionId id; "
              "const struct XLA_FFI_Extension* next; } XLA_FFI_Extension;\n")
    anchor = re.search(r"typedef enum \{\s*XLA_FFI_Extension_Metadata", text)
    assert anchor
    return text[:anchor.start()] + public + text[anchor.start():]


def test_compiles_against_the_installed_header(tmp_path):
    _compile(jax.ffi.include_dir(), tmp_path)


def named_as_up_to_jaxlib_0_10(text):
    """A newer installed header with the extensions' base struct named as
    jaxlib up to 0.10 names it (XLA_FFI_Extension_Base)."""
    assert "XLA_FFI_InternalExtension" in text
    text = text.replace("XLA_FFI_InternalExtension_Type", "XLA_FFI_Extension_Type")
    return text.replace("XLA_FFI_InternalExtension", "XLA_FFI_Extension_Base")


def test_compiles_against_the_other_naming(tmp_path):
    """The installed header renamed the other way: the handlers compile
    against both namings whichever jaxlib is installed."""
    text = _installed()
    if "XLA_FFI_Extension_Base" in text:
        other = renamed_as_in_jaxlib_0_11(text)
        assert "XLA_FFI_Extension_Base" not in other
    else:
        other = named_as_up_to_jaxlib_0_10(text)
        assert "XLA_FFI_InternalExtension" not in other
    _compile(_tree(tmp_path, "other", other), tmp_path)


def test_compiles_against_the_headers_named():
    named = [p for p in os.environ.get("RAGGEDDOT_XLA_FFI_HEADERS", "").split(os.pathsep) if p]
    for i, path in enumerate(named):
        tmp = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"rd_ffi_header_{os.getpid()}_{i}"
        tmp.mkdir(parents=True, exist_ok=True)
        _compile(_tree(tmp, "named", pathlib.Path(path).read_text()), tmp)


def test_handlers_name_no_extension_struct():
    """The code (comments aside) names neither extension struct."""
    code = re.sub(r"/\*.*?\*/", "", SOURCE.read_text(), flags=re.S)
    for name in ("XLA_FFI_Extension_Base", "XLA_FFI_InternalExtension", "XLA_FFI_Extension "):
        assert name not in code, name

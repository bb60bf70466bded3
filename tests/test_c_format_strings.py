"""Every format string given to CPython's own formatters (PyErr_Format,
PyUnicode_FromFormat, PyErr_WarnFormat and their V forms) in the C sources
uses only the conversions CPython implements. Python 3.12 raises
SystemError for any other (``%g``, ``%f``, ``%e``, ...), turning a message
into a crash of the call; numbers of other kinds are formatted with
snprintf first."""
import math
import pathlib
import re

import pytest

import raggeddot
from raggeddot import runtime

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = sorted(p for d in ("csrc", "raggeddot") for p in (ROOT / d).rglob("*") if p.suffix in (".c", ".h"))

# the formatter, and the index of its format argument
FORMATTERS = {"PyErr_Format": 1, "PyErr_FormatV": 1, "PyUnicode_FromFormat": 0, "PyUnicode_FromFormatV": 0,
              "PyErr_WarnFormat": 2, "PyBytes_FromFormat": 0}
# CPython's conversions (Objects/unicodeobject.c): flags '-' and '0', a width
# and a precision (or '*'), a length modifier for the integers, then the conversion
ALLOWED = {"", "h", "hh", "l", "ll", "z", "t", "j"}
ALLOWED_OBJECT = set("AUVSRT")            # objects: no length modifier


def _calls(text):
    """(formatter, line, arguments as source text) of every formatter call."""
    for m in re.finditer(r"\b(" + "|".join(FORMATTERS) + r")\s*\(", text):
        depth, i, args, start, quote = 1, m.end(), [], m.end(), None
        while depth:
            ch = text[i]
            if quote:
                if ch == "\\":
                    i += 1
                elif ch == quote:
                    quote = None
            elif ch in "\"'":
                quote = ch
            elif ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif ch == "," and depth == 1:
                args.append(text[start:i])
                start = i + 1
            i += 1
        args.append(text[start:i - 1])
        yield m.group(1), text.count("\n", 0, m.start()) + 1, args


def _literal(arg):
    """The concatenated string literals of an argument (None when it is not one)."""
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', arg)
    return "".join(parts) if parts else None


def _bad_conversions(fmt):
    bad = []
    for m in re.finditer(r"%(?:%|[-0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(hh|h|ll|l|z|t|j)?(.))", fmt):
        if m.group(0) == "%%":
            continue
        mod, conv = m.group(1) or "", m.group(2)
        if conv in ALLOWED_OBJECT and not mod:
            continue
        if conv in "csp" and not mod:
            continue
        if conv in "diux" and mod in ALLOWED:
            continue
        bad.append(m.group(0))
    return bad


def test_the_scan_finds_the_calls():
    calls = [c for p in SOURCES for c in _calls(p.read_text())]
    assert len(calls) > 50
    assert _bad_conversions("%zd %ld %lld %s %R %S %U %A %V %d %i %u %x %p %c %% %-5d %.3s %5.2zd") == []
    assert _bad_conversions("%g %f %.3e %lf %zg %ls %lu%n") == ["%g", "%f", "%.3e", "%lf", "%zg", "%ls", "%n"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_formats_use_only_cpython_conversions(path):
    problems = []
    for name, line, args in _calls(path.read_text()):
        index = FORMATTERS[name]
        if len(args) <= index:
            continue
        fmt = _literal(args[index])
        if fmt is None:
            continue
        bad = _bad_conversions(fmt)
        if bad:
            problems.append(f"{path.relative_to(ROOT)}:{line}: {name} with {bad}: {fmt!r}")
    assert not problems, "\n".join(problems)


def test_read_bandwidth_refuses_with_the_values():
    """The message of a refused measurement names the values, formatted."""
    with pytest.raises(ValueError, match=r"read_bandwidth.*got 1, 0\.5, 0\.5"):
        raggeddot.runtime.read_bandwidth(threads=1, megabytes=0.5, seconds=0.5)
    with pytest.raises(ValueError, match=r"read_bandwidth.*got 1, 256, inf"):
        raggeddot.runtime.read_bandwidth(threads=1, megabytes=256, seconds=math.inf)


def test_thread_and_cache_settings_refuse_huge_values(restore_runtime):
    """Item 5: huge integers are ValueErrors naming the function and the
    argument (not OverflowError), and the thread limit is in the message."""
    for bad in (2 ** 70, 10 ** 6, 4097):
        with pytest.raises(ValueError, match=r"^set_num_threads: 'n' must be in \[1, 4096\]"):
            runtime.set_num_threads(bad)
    with pytest.raises(ValueError, match=r"^set_num_threads: 'n' must be"):
        runtime.set_num_threads(-(2 ** 70))
    runtime.set_num_threads(4096)
    for fn, name in ((runtime.set_buffer_cache, "set_buffer_cache"),
                     (runtime.set_stream_threshold, "set_stream_threshold")):
        with pytest.raises(ValueError, match=rf"^{name}: 'nbytes'"):
            fn(2 ** 70)
    assert "4096" in runtime.set_num_threads.__doc__

"""The plan table's file: tuned plans kept between processes.

One JSON file per CPU model and build of the extension, ``plans-<digest>.json`` in
``raggeddot._cache.cache_dir()`` ($RAGGEDDOT_CACHE_DIR, else ~/.cache/raggeddot), with
``<digest>`` a checksum of the two. It holds::

    {"format": 1, "cpu": "<model name>", "build": "<build id>",
     "entries": [{"class": [op, ctype, family, k, n, g, bucket, threads],
                  "plan": {"kernel": ..., "mc": ..., ...}}, ...]}

``import raggeddot`` reads it when it exists (unless ``RAGGEDDOT_PLANS=0``) and sets each
entry through ``_core.plan_set``, so the C library validates every value. Nothing in the
file is trusted: a file that is not valid JSON or not of this format, or that names
another CPU or build, is ignored whole; an entry the library refuses is ignored alone;
each case with a RuntimeWarning, never an exception. Writes go to a temporary file in the
same directory, then ``os.replace``: a reader sees the old file or the new one.

Import stays cheap: without a file, it costs reading /proc/cpuinfo's first lines and one
``stat``; json is imported only to read or write a file.
"""
import os
import warnings
import zlib

from . import _core
from ._cache import cache_dir

#: The C library's plan table, which every grouped product consults; this module is the
#: package's one door to it (raggeddot.tune and the CLI go through these names).
plan_record = _core.plan_record          # (True) starts recording classes, (False) stops: their list
plan_set = _core.plan_set                # (cls, plan or None): set or remove an entry
plan_get = _core.plan_get                # (cls) -> plan dict or None
plan_table = _core.plan_table            # () -> [(cls, plan)]
plan_default = _core.plan_default        # (cls) -> the built-in choice
plan_candidates = _core.plan_candidates  # (cls) -> plans worth timing, the default first

FORMAT = 1

#: the keys of a plan that plan_set takes (plans returned by _core also carry mr, nr)
PLAN_KEYS = ("kernel", "mc", "kc", "nc", "tm", "tn", "threads", "split", "team")
#: the fields of a shape class, in order
CLASS_FIELDS = ("op", "ctype", "family", "k", "n", "g", "bucket", "threads")

#: classes tuned in this process, and classes set from the file at import
tuned = set()
loaded = set()


def settable(plan):
    """The keys of ``plan`` (a dict from _core) that plan_set takes."""
    return {key: plan[key] for key in PLAN_KEYS if key in plan}


def cpu_model():
    """The CPU's model name (/proc/cpuinfo's "model name"), else platform's description."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name":
                    return " ".join(value.split())
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown"


def build_id():
    """What identifies the compiled kernels: the package version, the kernel families
    compiled in, and the extension file's size and modification time (a rebuild makes a
    new id, so plans tuned for other kernels are never applied)."""
    from . import __version__

    from .runtime import compiled_kernels

    families = ",".join(compiled_kernels())
    st = os.stat(_core.__file__)
    return f"raggeddot {__version__}; kernels {families}; core {st.st_size}-{st.st_mtime_ns}"


def path():
    """The plans file of this CPU and build."""
    key = f"{cpu_model()}\n{build_id()}".encode()
    digest = f"{zlib.crc32(key):08x}{zlib.adler32(key):08x}"   # a name only: the file's content is checked
    return os.path.join(cache_dir(), f"plans-{digest}.json")


def _warn(message):
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _read(file):
    """The entries of ``file`` if it is a plans file of this CPU and build, else None
    (with a RuntimeWarning saying why, unless the file does not exist)."""
    import json

    try:
        with open(file, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:   # unreadable, not UTF-8, not JSON
        _warn(f"raggeddot: ignoring the plans file {file}: it cannot be read as JSON ({e})")
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), list):
        _warn(f"raggeddot: ignoring the plans file {file}: not a plans file of format {FORMAT}")
        return None
    cpu, build = cpu_model(), build_id()
    if doc.get("cpu") != cpu or doc.get("build") != build:
        _warn(f"raggeddot: ignoring the plans file {file}: it was written for CPU {doc.get('cpu')!r}, "
              f"build {doc.get('build')!r}; this is CPU {cpu!r}, build {build!r}")
        return None
    return doc["entries"]


def _entry(item):
    """(class tuple, plan dict) of a file entry; ValueError when it is not of that shape."""
    if not isinstance(item, dict) or set(item) != {"class", "plan"}:
        raise ValueError("an entry must be an object with the keys 'class' and 'plan'")
    cls, plan = item["class"], item["plan"]
    if not isinstance(cls, list) or len(cls) != len(CLASS_FIELDS):
        raise ValueError(f"'class' must be a list of {len(CLASS_FIELDS)} fields {CLASS_FIELDS}, got {cls!r}")
    if not isinstance(plan, dict):
        raise ValueError(f"'plan' must be an object, got {plan!r}")
    return tuple(cls), plan


def load(file=None):
    """Set the entries of the plans file (default :func:`path`) in the plan table; returns
    how many were set. Classes set are recorded in ``loaded``."""
    file = path() if file is None else file
    entries = _read(file)
    if entries is None:
        return 0
    bad = []
    for i, item in enumerate(entries):
        try:
            cls, plan = _entry(item)
            plan_set(cls, plan)
        except Exception as e:   # whatever the library refuses, the file is not trusted
            bad.append(f"entries[{i}]: {type(e).__name__}: {e}")
            continue
        loaded.add(cls)
    if bad:
        _warn(f"raggeddot: ignored {len(bad)} invalid entr{'y' if len(bad) == 1 else 'ies'} of the plans "
              f"file {file}: " + "; ".join(bad[:3]) + ("; ..." if len(bad) > 3 else ""))
    return len(entries) - len(bad)


def load_at_import():
    """:func:`load`, when RAGGEDDOT_PLANS is not "0" and the file exists; never raises."""
    if os.environ.get("RAGGEDDOT_PLANS", "").strip() == "0":
        return
    try:
        file = path()
        if os.path.exists(file):
            load(file)
    except Exception as e:   # import must not fail over a cache
        _warn(f"raggeddot: the tuned plans were not loaded: {type(e).__name__}: {e}")


def save(classes, file=None):
    """Write the table's entries of ``classes`` into the plans file (default :func:`path`),
    keeping the file's other entries; atomic. Returns the file's path, or None when it could
    not be written (with a RuntimeWarning: the entries stay in this process's table)."""
    import json
    import tempfile

    file = path() if file is None else file
    ours = {}
    for cls in classes:
        plan = plan_get(cls)
        if plan is not None:
            ours[tuple(cls)] = settable(plan)
    kept = []
    with warnings.catch_warnings():      # a foreign or corrupt file is replaced, not merged
        warnings.simplefilter("ignore", RuntimeWarning)
        for item in _read(file) or []:
            try:
                cls, plan = _entry(item)
            except ValueError:
                continue
            if cls not in ours:
                kept.append({"class": list(cls), "plan": plan})
    doc = {"format": FORMAT, "cpu": cpu_model(), "build": build_id(),
           "entries": kept + [{"class": list(c), "plan": p} for c, p in ours.items()]}
    directory = os.path.dirname(file)
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".plans-", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:   # one line an entry
            head = json.dumps({key: doc[key] for key in ("format", "cpu", "build")})[:-1]
            body = ",\n".join("  " + json.dumps(e) for e in doc["entries"])
            f.write(f'{head}, "entries": [\n{body}\n]}}\n' if body else f'{head}, "entries": []}}\n')
        os.replace(tmp, file)
    except OSError as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        _warn(f"raggeddot: the tuned plans were not saved to {file}: {e}")
        return None
    return file

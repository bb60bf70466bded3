"""Where raggeddot keeps files between runs: the compiled XLA FFI handlers of
raggeddot.jax and the tuned plans of raggeddot.tune.

The directory is ``$RAGGEDDOT_CACHE_DIR``, else ``~/.cache/raggeddot``.
"""
import os
import tempfile


def cache_dir():
    """Where raggeddot's cached files are kept: $RAGGEDDOT_CACHE_DIR, else ~/.cache/raggeddot."""
    d = os.environ.get("RAGGEDDOT_CACHE_DIR")
    return d if d else os.path.join(os.path.expanduser("~"), ".cache", "raggeddot")


def writable_dir(d):
    """`d`, created if needed; a private directory under the system's temporary
    one when `d` cannot be written (a read-only home)."""
    try:
        os.makedirs(d, exist_ok=True)
        if os.access(d, os.W_OK | os.X_OK):
            return d
    except OSError:
        pass
    d = os.path.join(tempfile.gettempdir(), f"raggeddot-{os.getuid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d

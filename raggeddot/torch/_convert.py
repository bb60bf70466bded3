"""Torch tensors as the NumPy arrays raggeddot reads, and back, without copies.

A CPU tensor shares its memory with ``t.detach().numpy()`` (any strides).
NumPy has no bfloat16, so a bfloat16 tensor is viewed as int16 (same bits,
no conversion pass) and that array is reinterpreted as ``ml_dtypes.bfloat16``,
the dtype raggeddot's NumPy API takes. Results come back the same way:
either raggeddot writes into a torch tensor through its ``out=`` view, or a
fresh NumPy result is wrapped by ``torch.from_numpy`` (shared memory).

The checks here name the op and the argument: tensors must live on the CPU
(CUDA and meta tensors are refused outside a fake trace, where only shapes
are computed) and hold one of the supported dtypes.
"""
import ml_dtypes
import numpy as np
import torch

__all__ = ["FLOATS", "np_dtype", "torch_dtype", "array", "tensor", "check_tensor", "result_dtype",
           "compute_dtype"]

#: The float dtypes the grouped products read and write.
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
_TO_NP = {torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
          torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
_TO_TORCH = {v: k for k, v in _TO_NP.items()}
# jax.lax's order of float result types: by largest exponent, then mantissa bits
_RANK = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}


def np_dtype(dt):
    """The NumPy dtype of a torch float dtype (None stays None)."""
    return None if dt is None else _TO_NP[dt]


def torch_dtype(dt):
    """The torch dtype of a NumPy float dtype."""
    return _TO_TORCH[np.dtype(dt)]


def _in_fake_trace():
    from torch._guards import detect_fake_mode
    return detect_fake_mode() is not None


def check_tensor(t, name, fn, kinds="float", ndim=None, optional=False):
    """Check one argument of op ``fn``: a CPU tensor (a meta one only inside
    a fake trace) of a float dtype (``kinds="float"``) or an integer one
    (``kinds="int"``), of rank ``ndim`` when given. Returns ``t``."""
    if t is None:
        if optional:
            return None
        raise TypeError(f"raggeddot.torch.{fn}: '{name}' is required, got None")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"raggeddot.torch.{fn}: '{name}' must be a torch.Tensor, got {type(t).__name__}")
    dev = t.device.type
    if dev != "cpu" and not (dev == "meta" and _in_fake_trace()):
        raise ValueError(f"raggeddot.torch.{fn}: '{name}' is a {t.device} tensor; raggeddot computes on "
                         "the CPU (move it with .cpu())")
    if kinds == "float" and t.dtype not in FLOATS:
        raise TypeError(f"raggeddot.torch.{fn}: '{name}' must be float16, bfloat16, float32 or float64, "
                        f"got {t.dtype}")
    if kinds == "int" and t.dtype not in _INTS:
        raise TypeError(f"raggeddot.torch.{fn}: '{name}' must hold integers, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"raggeddot.torch.{fn}: '{name}' must have {ndim} dimensions, got shape "
                         f"{tuple(t.shape)}")
    return t


def array(t):
    """A NumPy view of the CPU tensor ``t`` (no copy; bfloat16 through an
    int16 view read as ``ml_dtypes.bfloat16``). None stays None."""
    if t is None:
        return None
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def tensor(a):
    """A CPU tensor sharing the memory of the NumPy array ``a``."""
    a = np.asarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def empty(shape, dtype):
    """An uninitialised CPU tensor of a float ``dtype`` whose memory comes
    from, and goes back to, raggeddot's cache of result buffers (a tensor of
    torch's own is fresh memory each call: the page faults of a weight
    gradient's [E, out, in] cost twice its product)."""
    from .. import _gateway as gw
    return tensor(gw.empty(tuple(shape), np_dtype(dtype)))


def compute_dtype(*dts):
    """float64 when any of ``dts`` is float64, else float32: the dtype the
    kernels accumulate in (megablox's default output dtype)."""
    return torch.float64 if torch.float64 in dts else torch.float32


def result_dtype(preferred, a, b, fn):
    """The result dtype of a ragged_dot: ``preferred``, else the promoted type
    of the operands as jax.lax promotes them (the wider float wins; float16
    with bfloat16 gives bfloat16, the larger range)."""
    if preferred is not None:
        if preferred not in FLOATS:
            raise TypeError(f"raggeddot.torch.{fn}: 'preferred_element_type' must be a float dtype, "
                            f"got {preferred}")
        return preferred
    return a if _RANK[a] >= _RANK[b] else b

"""Argument conversion shared by the pure-Python layer: NumPy arrays of the
dtypes the C++ core supports, with errors naming the offending argument."""
import numbers
import sys

import numpy as np

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64))


def is_torch_tensor(x):
    torch = sys.modules.get("torch")  # no import: NumPy-only users need no torch
    return torch is not None and isinstance(x, torch.Tensor)


def refuse_torch(x, name, twin=None):
    """A TypeError for a torch tensor given to the NumPy level, which would
    otherwise convert it and answer with NumPy arrays: `twin` names the
    seqpack.torch function that takes it."""
    if is_torch_tensor(x):
        use = f"use {twin}, which takes and returns torch tensors" if twin else \
            "use seqpack.torch for torch tensors"
        raise TypeError(f"{name} is a torch.Tensor, but this seqpack function works on NumPy "
                        f"arrays and returns NumPy arrays: {use} (or pass tensor.numpy())")


def as_array(x, name, float_only=False):
    """A C-contiguous float32/float64/int64 array viewing `x` when it already is one."""
    refuse_torch(x, name)
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as e:
        raise TypeError(f"{name} must be an array, got {type(x).__name__} ({e})") from None
    allowed = SUPPORTED_DTYPES[:2] if float_only else SUPPORTED_DTYPES
    if a.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TypeError(f"{name} has dtype {a.dtype}; seqpack supports {names}")
    return np.ascontiguousarray(a)


def as_optional_array(x, name, float_only=False):
    return None if x is None else as_array(x, name, float_only)


def as_lengths(lengths, name="lengths"):
    """A 1-D int64 array from a list or an integer array (floats and bools rejected)."""
    if isinstance(lengths, (str, bytes)) or lengths is None:
        raise TypeError(f"{name} must be a list or 1-D array of integers, got {lengths!r}")
    a = np.asarray(lengths)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got an array of shape {a.shape}")
    if a.size == 0 and a.dtype == np.float64:  # np.asarray([]) is float64
        a = a.astype(np.int64)
    if a.dtype == np.bool_ or a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype} ({a.tolist()[:8]})")
    return np.ascontiguousarray(a, dtype=np.int64)


INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def as_int(value, name, lo=INT64_MIN, hi=INT64_MAX):
    """An int in [lo, hi] (the C++ core's int64_t by default): a larger one would
    reach pybind11 as a bare "incompatible function arguments" TypeError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} should be of type int, got: {type(value).__name__} ({value!r})")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{name} = {value} is out of range: must be in [{lo}, {hi}]")
    return value


def as_float(value, name):
    """A Python float, with the argument named when `value` is not a number or
    is an integer too large for a double (float(10**400) raises OverflowError)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} should be a number, got: {type(value).__name__} ({value!r})")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} = {value} is too large for a double") from None
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} should be a number, got: {type(value).__name__} ({e})") from None


def as_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} should be of type bool, got: {type(value).__name__} ({value!r})")
    return bool(value)


def as_float_dtype(dtype):
    """numpy float32/float64 from None, a numpy dtype, a name or a torch dtype."""
    if dtype is None:
        return np.dtype(np.float32)
    if str(dtype).startswith("torch."):
        dtype = str(dtype)[len("torch."):]
    try:
        d = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if d not in SUPPORTED_DTYPES[:2]:
        raise TypeError(f"dtype must be float32 or float64, got {d}")
    return d

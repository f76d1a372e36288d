"""Loads libkbit and gives checked access to its C functions.

The library is looked for next to this package, then at $KBIT_LIBRARY, then on the
system's search path; the error names every place tried.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

__all__ = ["KbitError", "lib", "register", "call", "STATUS"]

STATUS = {
    0: "KBIT_SUCCESS",
    1: "KBIT_ERROR_INVALID_ARGUMENT",
    2: "KBIT_ERROR_NULL_POINTER",
    3: "KBIT_ERROR_MISALIGNED",
    4: "KBIT_ERROR_RANGE",
    5: "KBIT_ERROR_NOT_SUPPORTED",
    6: "KBIT_ERROR_NO_DEVICE",
    7: "KBIT_ERROR_CUDA",
    8: "KBIT_ERROR_INVALID_DATA",
    9: "KBIT_ERROR_INTERNAL",
}


class KbitError(RuntimeError):
    """A kbit call failed; `status` is the C status code (None for Python-side checks)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_signatures: dict[str, tuple] = {}


def _load() -> ctypes.CDLL:
    here = os.path.dirname(os.path.abspath(__file__))
    tried = []
    candidates = [os.path.join(here, "libkbit.so")]
    env = os.environ.get("KBIT_LIBRARY")
    if env:
        candidates.append(env)
    for path in candidates:
        if os.path.exists(path):
            try:
                return ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path} ({e})")
        else:
            tried.append(f"{path} (not found)")
    found = ctypes.util.find_library("kbit")
    for name in filter(None, [found, "libkbit.so"]):
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            tried.append(f"system search path: {name} ({e})")
    if not found:
        tried.append("system search path (libkbit not found)")
    raise KbitError("could not load libkbit; looked in: " + "; ".join(tried))


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first use)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                handle = _load()
                handle.kbit_status_string.restype = ctypes.c_char_p
                handle.kbit_status_string.argtypes = [ctypes.c_int]
                handle.kbit_last_error_message.restype = ctypes.c_char_p
                handle.kbit_last_error_message.argtypes = []
                handle.kbit_version.restype = ctypes.c_int
                handle.kbit_version.argtypes = []
                handle.kbit_cuda_available.restype = ctypes.c_int
                handle.kbit_cuda_available.argtypes = []
                _lib = handle
    return _lib


def register(name: str, argtypes: list, restype=ctypes.c_int) -> None:
    """Declares a C function's signature; `call` applies it on first use."""
    _signatures[name] = (argtypes, restype)


def function(name: str):
    """The ctypes function `name` with its registered signature."""
    handle = lib()
    try:
        fn = getattr(handle, name)
    except AttributeError:
        raise KbitError(f"libkbit has no symbol {name!r} (library too old?)") from None
    if name in _signatures and getattr(fn, "_kbit_typed", False) is False:
        fn.argtypes, fn.restype = _signatures[name]
        fn._kbit_typed = True
    return fn


def call(name: str, *args) -> None:
    """Calls a status-returning C function; raises KbitError unless it succeeds."""
    status = function(name)(*args)
    if status != 0:
        handle = lib()
        msg = handle.kbit_last_error_message().decode(errors="replace")
        label = STATUS.get(status, f"status {status}")
        raise KbitError(f"{name}: {label}: {msg}" if msg else f"{name}: {label}", status)


def version() -> tuple[int, int, int]:
    v = lib().kbit_version()
    return v // 10000, (v // 100) % 100, v % 100


def cuda_available() -> bool:
    return bool(lib().kbit_cuda_available())

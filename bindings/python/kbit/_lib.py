"""Loads libkbit and gives checked access to its C functions.

The library is looked for next to this package, then at $KBIT_LIBRARY, then on the
system's search path; the error names every place tried. With KBIT_LIBRARY_FIRST=1,
$KBIT_LIBRARY is tried before the package's copy (`make asan-test` loads its sanitizer
build this way).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

from ._signatures import SIGNATURES

__all__ = ["KbitError", "lib", "function", "call", "size", "status_name", "status_code",
           "version", "cuda_available"]

# Typed as soon as the library loads: the error path and version checks use them.
_INFO = ("kbit_status_string", "kbit_last_error_message", "kbit_version",
         "kbit_cuda_available")


class KbitError(RuntimeError):
    """A kbit call failed; `status` is the C status code (None for Python-side checks)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_status_codes: dict[str, int] = {}


def _load() -> ctypes.CDLL:
    here = os.path.dirname(os.path.abspath(__file__))
    tried = []
    candidates = [os.path.join(here, "libkbit.so")]
    env = os.environ.get("KBIT_LIBRARY")
    if env:
        first = os.environ.get("KBIT_LIBRARY_FIRST", "") not in ("", "0")
        candidates.insert(0 if first else 1, env)
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
                for name in _INFO:
                    _apply(handle, name)
                _lib = handle
    return _lib


def _apply(handle: ctypes.CDLL, name: str):
    fn = getattr(handle, name)
    if getattr(fn, "_kbit_typed", False) is False and name in SIGNATURES:
        fn.argtypes, fn.restype = SIGNATURES[name]
        fn._kbit_typed = True
    return fn


def function(name: str):
    """The ctypes function `name` with its signature from the table (_signatures)."""
    handle = lib()
    try:
        return _apply(handle, name)
    except AttributeError:
        raise KbitError(f"libkbit has no symbol {name!r} (library too old?)") from None


def status_name(status: int) -> str:
    """The library's name for a status code ('KBIT_ERROR_RANGE'), 'status N' if none."""
    name = lib().kbit_status_string(status).decode(errors="replace")
    return name if name.startswith("KBIT_") else f"status {status}"


def status_code(name: str) -> int:
    """The code of the status the library calls `name` (for errors raised in Python)."""
    if not _status_codes:
        # Codes are small and pinned; the library names each one it has.
        found = {status_name(code): code for code in range(64)}
        _status_codes.update((n, c) for n, c in found.items() if n.startswith("KBIT_"))
    return _status_codes[name]


def call(name: str, *args) -> None:
    """Calls a status-returning C function; raises KbitError unless it succeeds."""
    status = function(name)(*args)
    if status != 0:
        handle = lib()
        msg = handle.kbit_last_error_message().decode(errors="replace")
        label = status_name(status)
        raise KbitError(f"{name}: {label}: {msg}" if msg else f"{name}: {label}", status)


def size(name: str, *args) -> int:
    """What a size helper (kbit_packed_words, kbit_nf4_absmax_count, ...) returns for
    args; KbitError where it refuses them (it returns -1)."""
    value = function(name)(*args)
    if value < 0:
        raise KbitError(f"{name}{args}: invalid arguments",
                        status_code("KBIT_ERROR_INVALID_ARGUMENT"))
    return value


def version() -> tuple[int, int, int]:
    v = lib().kbit_version()
    return v // 10000, (v // 100) % 100, v % 100


def cuda_available() -> bool:
    return bool(lib().kbit_cuda_available())

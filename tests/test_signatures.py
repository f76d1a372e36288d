"""The one ctypes signature table (kbit._signatures) against the C header and the built
library: every declared function is in it with the header's argument and return types,
every exported symbol is in it, and a symbol the loaded library lacks fails only when it
is called."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

import kbit
from kbit import _lib
from kbit._signatures import SIGNATURES

from conftest import ROOT

HEADER = os.path.join(ROOT, "include", "kbit.h")
P, I64, INT, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float

# C types of the header -> the ctypes type the table must use for them
C_TYPES = {"int": INT, "kbit_status": INT, "kbit_dtype": INT, "kbit_absmax_format": INT,
           "int64_t": I64, "size_t": ctypes.c_size_t, "float": F32, "uint8_t": ctypes.c_uint8,
           "kbit_stream_t": P, "const char *": ctypes.c_char_p, "int *": ctypes.POINTER(INT),
           "int64_t *": ctypes.POINTER(I64)}


def _ctype(decl: str):
    """The ctypes type of a C type (a parameter's name already removed)."""
    decl = " ".join(decl.replace("*", " * ").split()).replace(" *", " *").strip()
    if decl in C_TYPES:
        return C_TYPES[decl]
    if decl.endswith("*"):  # any other data pointer is an address
        return P
    raise AssertionError(f"no ctypes mapping for C type {decl!r}")


def _expand_macros(text: str) -> str:
    """Expands the header's function-like KBIT_DECLARE_* macros (## pasting included)."""
    text = text.replace("\\\n", " ")
    macros = {}
    for m in re.finditer(r"^#define\s+(KBIT_DECLARE_\w+)\(([^)]*)\)(.*)$", text, re.M):
        macros[m.group(1)] = ([p.strip() for p in m.group(2).split(",")], m.group(3))
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    call = re.compile(r"\b(" + "|".join(macros) + r")\(([^()]*)\)")
    while True:
        def expand(m):
            params, repl = macros[m.group(1)]
            args = [a.strip() for a in m.group(2).split(",")]
            for p, a in zip(params, args):
                repl = re.sub(rf"\b{p}\b", a, repl)
            return repl.replace(" ## ", "").replace("##", "")
        new = call.sub(expand, body)
        if new == body:
            return body
        body = new


def c_signature(ret: str, params: str) -> tuple:
    """(argtypes, restype) of a C declaration's return type and parameter list."""
    args = []
    if params.strip() != "void":
        for p in params.split(","):
            p = re.sub(r"\bconst\b", "", p) if "*" in p and "char" not in p else p
            args.append(_ctype(re.sub(r"\w+\s*$", "", p.strip())))
    return tuple(args), _ctype(ret)


def header_declarations() -> dict:
    """{name: (argtypes, restype)} of every KBIT_API function declared in kbit.h."""
    text = _expand_macros(open(HEADER).read())
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return {m.group(2): c_signature(m.group(1), m.group(3))
            for m in re.finditer(r"KBIT_API\s+([^;(]*?)\s*\b(\w+)\s*\(([^)]*)\)\s*;", text)}


def _same(a, b) -> bool:
    # POINTER(c_int) is cached, so identity holds for the same pointee
    return a is b or (a == b)


def test_header_is_parsed_whole():
    decls = header_declarations()
    # 24 + 24 per-type kbit, 36 NF4/FP4, 30 GGUF, and the rest
    assert sum(n.startswith("cquantize_kbit_") or n.startswith("cdequantize_kbit_")
               for n in decls) == 48
    assert sum(re.match(r"c(de)?quantize_(nf4|fp4)_", n) is not None for n in decls) == 36
    assert sum(re.match(r"cdequantize_q\d_\w+_(fp16|bf16|fp32)", n) is not None
               for n in decls) == 30
    assert "kbit_gguf_block_info" in decls and "kbit_e4m4_decode" in decls


def test_every_header_function_has_the_header_signature():
    decls = header_declarations()
    missing = sorted(set(decls) - set(SIGNATURES))
    assert not missing, missing
    for name, (args, ret) in decls.items():
        targs, tret = SIGNATURES[name]
        assert len(targs) == len(args) and all(map(_same, targs, args)), (name, targs, args)
        assert _same(tret, ret), (name, tret, ret)


def test_table_holds_only_header_functions():
    assert set(SIGNATURES) - set(header_declarations()) == set()


def exported_symbols() -> set:
    """The functions the library next to the package exports (skips without it or nm)."""
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) not installed")
    path = os.path.join(os.path.dirname(kbit.__file__), "libkbit.so")
    if not os.path.exists(path):
        pytest.skip("libkbit.so is not next to the package")
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True,
                         text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert exported, out
    return exported


def test_every_exported_symbol_is_in_the_table():
    exported = exported_symbols()
    assert exported - set(SIGNATURES) == set()
    assert set(SIGNATURES) - exported <= {n for n in SIGNATURES if "_matmul_" in n}


def test_matmul_entries_follow_spec_section_6():
    head = (P, I64, I64, I64, INT)  # x, m, k_in, n_out, dtype
    tail = (P, P)                   # bias, y
    weights = {"kbit": (P, P, INT, F32, P, INT), "nf4": (P, P, INT), "fp4": (P, P, INT),
               "gguf": (INT, P)}
    for fmt, weight in weights.items():
        launch, ret = SIGNATURES[f"kbit_matmul_{fmt}"]
        assert launch == head + weight + tail + (P, ctypes.c_size_t, P) and ret is INT
        # the host twin: the same minus workspace, workspace_bytes and stream
        assert SIGNATURES[f"kbit_matmul_{fmt}_host"] == (launch[:-3], INT)
    assert SIGNATURES["kbit_matmul_workspace_bytes"] == ((I64, I64, I64), I64)


def test_missing_symbol_fails_only_when_called():
    name = "kbit_matmul_workspace_bytes"
    if hasattr(_lib.lib(), name):
        fn = _lib.function(name)
        assert fn.restype is I64 and tuple(fn.argtypes) == (I64, I64, I64)
    else:
        with pytest.raises(kbit.KbitError, match="no symbol 'kbit_matmul_workspace_bytes'"):
            _lib.function(name)


def test_function_applies_the_table():
    for name in ("cquantize_kbit_bf16_k3_host", "kbit_nf4_absmax_count", "kbit_e4m4_decode",
                 "kbit_gguf_dequantize", "kbit_status_string"):
        fn = _lib.function(name)
        assert tuple(fn.argtypes) == SIGNATURES[name][0] and fn.restype is SIGNATURES[name][1]
    assert _lib.function("kbit_e4m4_decode")(0xFF) == 31.0  # float result, uint8 argument
    assert _lib.function("kbit_packed_words")(1 << 40, 5) == (1 << 35) * 5  # int64 result

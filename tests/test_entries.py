"""The one list of exported entries (csrc/core/entries.h) against the public header, the
built library's exported symbols and the Python signature table: every status-returning
row and every value entry is declared in include/kbit.h with the same parameter types,
every declared function is a row, and the library exports exactly the listed names."""
import os
import re
import shutil
import subprocess

import pytest

from kbit._signatures import SIGNATURES

from conftest import ROOT
from test_signatures import _same, c_signature, exported_symbols, header_declarations

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")

# Expands every row as `ENTRY name | return type | parameter list` with the preprocessor.
_DUMP = r'''
#include "core/entries.h"
#define DUMP_ROW(name, PARAMS, TAIL, FN) ENTRY name | kbit_status | PARAMS(KBIT_DECL0_, KBIT_DECL_) TAIL(KBIT_DECL_) ;
#define DUMP_VALUE(ret, name, PARAMS) ENTRY name | ret | PARAMS(KBIT_DECL0_, KBIT_DECL_) ;
KBIT_ALL_ENTRIES(DUMP_ROW, DUMP_ROW)
KBIT_VALUE_ENTRIES(DUMP_VALUE)
'''


def list_entries() -> dict:
    """{name: (argtypes, restype)} of every row of csrc/core/entries.h."""
    out = subprocess.run([CC, "-E", "-P", "-x", "c", "-I", os.path.join(ROOT, "csrc"),
                          "-I", os.path.join(ROOT, "include"), "-"],
                         input=_DUMP, capture_output=True, text=True, check=True).stdout
    rows = {}
    for m in re.finditer(r"ENTRY\s+(\w+)\s*\|\s*([^|]+?)\s*\|\s*([^;]*);", out):
        assert m.group(1) not in rows, f"{m.group(1)} is listed twice"
        rows[m.group(1)] = c_signature(m.group(2), m.group(3))
    return rows


needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler to expand the entry list")


@needs_cc
def test_every_row_is_declared_alike_and_every_declaration_is_a_row():
    rows, decls = list_entries(), header_declarations()
    assert len(rows) > 150, len(rows)
    assert sorted(set(rows) - set(decls)) == [], "rows the header does not declare"
    assert sorted(set(decls) - set(rows)) == [], "declarations that are not rows"
    for name, (args, ret) in rows.items():
        dargs, dret = decls[name]
        assert len(args) == len(dargs) and all(map(_same, args, dargs)), (name, args, dargs)
        assert _same(ret, dret), (name, ret, dret)


@needs_cc
def test_the_python_table_has_every_row_with_its_types():
    for name, (args, ret) in list_entries().items():
        targs, tret = SIGNATURES[name]
        assert len(targs) == len(args) and all(map(_same, targs, args)), (name, targs, args)
        assert _same(tret, ret), (name, tret, ret)


@needs_cc
def test_the_library_exports_exactly_the_rows():
    assert exported_symbols() == set(list_entries())

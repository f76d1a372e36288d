"""Defects found by the sanitizer build and the fuzzers (`make asan-test`, `make fuzz`).

Each test passes on any build; under `make asan-test` (AddressSanitizer and
UndefinedBehaviorSanitizer, which abort on the first report) it fails if the defect
comes back.
"""
import ctypes

import numpy as np
import pytest

from kbit._lib import lib as _kbit_lib

L = ctypes.CDLL(_kbit_lib()._name)
L.kbit_gguf_block_info.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
L.kbit_gguf_block_info.restype = ctypes.c_int

GGML = {2: (32, 18), 8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210)}


@pytest.mark.parametrize("offset", range(8))
@pytest.mark.parametrize("ggml_type", sorted(GGML))
def test_gguf_block_info_writes_unaligned_outputs(ggml_type, offset):
    """kbit_gguf_block_info stored int64_t through possibly misaligned pointers (UBSan:
    'store to misaligned address'); it now copies the bytes."""
    buf = np.full(32, 0xC3, np.uint8)
    elems, nbytes = buf.ctypes.data + offset, buf.ctypes.data + offset + 9
    assert L.kbit_gguf_block_info(ggml_type, elems, nbytes) == 0
    got = (int(buf[offset:offset + 8].view(np.int64)[0]),
           int(buf[offset + 9:offset + 17].view(np.int64)[0]))
    assert got == GGML[ggml_type]
    outside = np.r_[buf[:offset], buf[offset + 8:offset + 9], buf[offset + 17:]]
    assert (outside == 0xC3).all()

"""Built-in codebooks by name (issue 13): the library's tables against the numpy reference,
their shape (ascending, spanning [-1, 1], NF0's exact zero, NF4 at k = 4), quantize /
dequantize with each, the accuracy they are for, and bad arguments."""
import ctypes

import numpy as np
import pytest

import kbit
from kbit import reference as R
from kbit._lib import KbitError, function

KS = (2, 3, 4, 5)
BUILDERS = {"normal": R.create_normal_float_codebook, "nf0": R.create_nf0_codebook,
            "uniform": R.create_uniform_codebook}


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_tables_equal_the_reference(name, k):
    book = kbit.codebook(name, k)
    assert book.dtype == np.float32 and book.shape == (1 << k,)
    assert np.array_equal(book, BUILDERS[name](k)), f"{name} k={k}"
    assert np.all(np.diff(book) > 0), "ascending, distinct"
    assert book[0] == -1.0 and book[-1] == 1.0


@pytest.mark.parametrize("k", KS)
def test_nf0_has_an_exact_zero_and_one_more_positive_entry(k):
    book = kbit.codebook("nf0", k)
    assert np.count_nonzero(book == 0.0) == 1
    assert np.count_nonzero(book > 0) == np.count_nonzero(book < 0) + 1


def test_nf0_at_k4_is_nf4s_table():
    # bitsandbytes rounds its offset (0.9677) where NF0 computes it: within 2e-7
    assert np.abs(kbit.codebook("nf0", 4) - R.nf4.NF4_TABLE).max() < 2e-7


def test_uniform_is_evenly_spaced():
    for k in KS:
        book = kbit.codebook("uniform", k).astype(np.float64)
        assert np.allclose(np.diff(book), 2.0 / ((1 << k) - 1), rtol=0, atol=1e-7)


def test_normal_is_the_default_book():
    for k in KS:
        assert np.array_equal(kbit.codebook("normal", k), kbit.default_codebook(k))
        q = kbit.quantize(np.ones((2, 32), np.float32), k=k, codebook="normal")
        assert q.codebook is None  # the same container as the default


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("name", ["nf0", "uniform"])
def test_quantize_by_name_matches_the_reference(rng, name, k):
    x = rng.standard_normal(32 * 37 + 5).astype(np.float32)
    q = kbit.quantize(x, k=k, codebook=name)
    book = BUILDERS[name](k)
    assert np.array_equal(q.codebook, book)
    ref = R.quantize_kbit(x, k, codebook=book, absmax_format="e4m4",
                          tensor_scale=q.tensor_scale)
    assert np.array_equal(q.packed, ref[0]) and np.array_equal(np.asarray(q.absmax), ref[1])
    y = kbit.dequantize(q)
    want = R.dequantize_kbit(q.packed, q.absmax, k, x.size, book, "e4m4", q.tensor_scale)
    assert np.array_equal(y, want)


def outlier_blocks(rng, n_blocks=4096):
    """Blocks like an outlier-heavy weight's: mostly tiny values and one large one."""
    x = rng.standard_normal((n_blocks, 32)).astype(np.float32) * 0.01
    x[np.arange(n_blocks), rng.integers(0, 32, n_blocks)] = rng.choice([-1.0, 1.0], n_blocks)
    return x.reshape(-1)


def sqnr(x, q):
    return R.sqnr_db(x, kbit.dequantize(q))


def test_nf0_helps_outlier_blocks(rng):
    """The reason for NF0: a block's many near-zero values land on its zero code instead
    of +-(smallest entry). Seeded data; the margins are several dB."""
    x = outlier_blocks(rng)
    for k in (3, 4):
        gain = sqnr(x, kbit.quantize(x, k=k, codebook="nf0")) - sqnr(x, kbit.quantize(x, k=k))
        assert gain > 3.0, f"k={k}: NF0 only {gain:.2f} dB better on outlier blocks"


def test_default_stays_best_on_gaussian_data(rng):
    """...and the default book stays the better one for Gaussian weights at k = 4 (each
    book has its class of tensors, which codebook='auto' will choose between)."""
    x = rng.standard_normal(1 << 16).astype(np.float32)
    assert sqnr(x, kbit.quantize(x, k=4)) > sqnr(x, kbit.quantize(x, k=4, codebook="uniform"))


def test_bad_arguments():
    with pytest.raises(KbitError, match="unknown codebook"):
        kbit.codebook("nf5", 4)
    with pytest.raises(KbitError, match="unknown codebook"):
        kbit.quantize(np.zeros(32, np.float32), k=4, codebook="fancy")
    with pytest.raises(KbitError, match="k must be"):
        kbit.codebook("nf0", 6)
    fn = function("kbit_codebook_host")
    out = np.full(64, 7.0, np.float32)
    for kind, k in ((3, 4), (-1, 4), (1, 1), (1, 6)):
        assert fn(kind, k, out.ctypes.data) == 1  # KBIT_ERROR_INVALID_ARGUMENT
    assert fn(1, 4, None) == 2  # KBIT_ERROR_NULL_POINTER
    assert fn(1, 4, ctypes.c_void_p(out.ctypes.data + 2)) == 3  # KBIT_ERROR_MISALIGNED
    assert np.all(out == 7.0), "nothing written on failure"

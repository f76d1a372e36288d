"""kbit.save / kbit.load: every container and plain tensors round-trip through a
safetensors file bit for bit, the file is plain safetensors to other readers, and
corrupt or inconsistent files raise KbitError."""
import json

import numpy as np
import pytest

import kbit
from kbit import gguf as kg
from kbit._lib import KbitError

from conftest import requires_gpu

safetensors = pytest.importorskip("safetensors", reason="kbit.save/load need safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

INVALID_DATA = 8


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def _containers(rng):
    w = rng.standard_normal((48, 96)).astype(np.float32)
    w16 = w.astype(np.float16)
    gguf_raw = np.frombuffer(rng.bytes(2 * 34), np.uint8).copy()
    gguf_raw[0:2] = gguf_raw[34:36] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return {
        "kbit.k4.e4m4": kbit.quantize(w, k=4),
        "kbit.k2.fp16": kbit.quantize(w16, k=2, absmax="fp16"),
        "kbit.k5.fp32.book": kbit.quantize(w, k=5, absmax="fp32", codebook="nf0"),
        "kbit.k3.fit": kbit.quantize(w, k=3, codebook="fit"),
        "kbit.odd": kbit.quantize(rng.standard_normal(77).astype(np.float32), k=4),
        "kbit.tiled": kbit.tile(kbit.quantize(w16, k=4)),
        "nf4": kbit.quantize_nf4(w, blocksize=64),
        "fp4.nested": kbit.quantize_fp4(w16, blocksize=128, compress_statistics=True),
        "gguf.q8_0": kg.GGUFTensor(gguf_raw, kg.GGML_TYPES["Q8_0"], (2, 32)),
        "bias": rng.standard_normal(96).astype(np.float32),
        "ids": np.arange(12, dtype=np.int32).reshape(3, 4),
        "half": w16[:3],
    }


def _decoded(v):
    if isinstance(v, (kbit.QuantizedTensor,)):
        return kbit.dequantize(v, dtype="float32")
    if isinstance(v, kbit.TiledTensor):
        return kbit.dequantize(kbit.untile(v), dtype="float32")
    if isinstance(v, kbit.Quantized4bit):
        return kbit.dequantize_4bit(v, dtype="float32")
    if isinstance(v, kg.GGUFTensor):
        return kg.dequantize(v, dtype="float32")
    return v


def test_round_trip_every_container(rng, tmp_path):
    tensors = _containers(rng)
    path = tmp_path / "m.safetensors"
    kbit.save(tensors, path, metadata={"source": "test"})
    got = kbit.load(path)
    assert list(got) == list(tensors)
    for name, want in tensors.items():
        assert type(got[name]) is type(want), name
        _same(_decoded(got[name]), _decoded(want))
        if hasattr(want, "packed"):
            _same(got[name].packed, want.packed)
            assert got[name].shape == tuple(want.shape)
    assert got["kbit.k3.fit"].codebook is not None
    _same(got["kbit.k3.fit"].codebook, tensors["kbit.k3.fit"].codebook)
    assert got["kbit.k4.e4m4"].codebook is None
    assert got["fp4.nested"].nested and got["fp4.nested"].quant_type == "fp4"


def test_file_is_plain_safetensors(rng, tmp_path):
    tensors = _containers(rng)
    path = tmp_path / "m.safetensors"
    kbit.save(tensors, path, metadata={"source": "test"})
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
        keys = set(f.keys())
        assert meta["source"] == "test"
        record = json.loads(meta["kbit"])
        assert record["format_version"] == 1
        assert record["tensors"]["kbit.k4.e4m4"] == {
            "format": "kbit", "shape": [48, 96], "dtype": "float32", "k": 4,
            "absmax_format": "e4m4", "tensor_scale": tensors["kbit.k4.e4m4"].tensor_scale}
        _same(f.get_tensor("kbit.k4.e4m4.packed"), tensors["kbit.k4.e4m4"].packed)
        _same(f.get_tensor("bias"), tensors["bias"])
    assert {"kbit.k3.fit.codebook", "fp4.nested.absmax2", "fp4.nested.offset",
            "gguf.q8_0.blocks"} <= keys
    assert "kbit.k4.e4m4.codebook" not in keys and "fp4.nested.code" not in keys  # built-in


def test_plain_safetensors_file_loads(rng, tmp_path):
    path = tmp_path / "plain.safetensors"
    arrays = {"a": rng.standard_normal((3, 5)).astype(np.float32),
              "b": np.arange(4, dtype=np.uint8)}
    save_file(arrays, str(path))
    got = kbit.load(path)
    assert list(got) == ["a", "b"]
    for k in arrays:
        _same(got[k], arrays[k])


def test_bfloat16_tensors(rng, tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.randn(5, 7, dtype=torch.bfloat16)
    path = tmp_path / "bf16.safetensors"
    kbit.save({"t": t, "q": kbit.quantize(t.view(torch.int16).numpy().view(np.uint16), k=4,
                                           dtype="bfloat16")}, path)
    with safe_open(str(path), framework="pt") as f:
        assert torch.equal(f.get_tensor("t"), t)  # stored as BF16, not as integers
    got = kbit.load(path)
    _same(got["t"], t.view(torch.int16).numpy().view(np.uint16))
    assert got["q"].dtype == "bfloat16"


def test_bfloat16_without_torch(rng, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    t = torch.randn(9, dtype=torch.bfloat16)
    path = tmp_path / "bf16.safetensors"
    kbit.save({"t": t}, path)
    import builtins
    real_import = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("no torch here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    got = kbit.load(path)
    _same(got["t"], t.view(torch.int16).numpy().view(np.uint16))


def _tamper(path, out, edit):
    """Rewrites a kbit checkpoint with edit(arrays, record) applied."""
    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata())
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    doc = json.loads(meta["kbit"])
    edit(arrays, doc)
    meta["kbit"] = json.dumps(doc) if not isinstance(doc, str) else doc
    save_file(arrays, str(out), metadata=meta)
    return out


@pytest.mark.parametrize("case", ["short-packed", "wrong-dtype", "bad-k", "bad-format",
                                  "bad-version", "bad-json", "no-arrays", "bad-shape",
                                  "missing-field", "book-size"])
def test_inconsistent_checkpoints(rng, tmp_path, case):
    w = rng.standard_normal((4, 64)).astype(np.float32)
    path = tmp_path / "ok.safetensors"
    kbit.save({"w": kbit.quantize(w, k=3, codebook="fit")}, path)

    def edit(arrays, doc):
        rec = doc["tensors"]["w"]
        if case == "short-packed":
            arrays["w.packed"] = arrays["w.packed"][:-1]
        elif case == "wrong-dtype":
            arrays["w.absmax"] = arrays["w.absmax"].astype(np.int8)
        elif case == "bad-k":
            rec["k"] = 7
        elif case == "bad-format":
            rec["format"] = "zip"
        elif case == "bad-version":
            doc["format_version"] = 99
        elif case == "bad-json":
            doc.clear()
        elif case == "no-arrays":
            doc["tensors"]["ghost"] = dict(rec)
        elif case == "bad-shape":
            rec["shape"] = [-4, 64]
        elif case == "missing-field":
            del rec["dtype"]
        elif case == "book-size":
            arrays["w.codebook"] = arrays["w.codebook"][:4]

    bad = _tamper(path, tmp_path / "bad.safetensors", edit)
    with pytest.raises(KbitError) as e:
        kbit.load(bad)
    assert e.value.status == INVALID_DATA


def test_bad_files_and_arguments(rng, tmp_path):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 64)
    with pytest.raises(KbitError, match="not a safetensors file") as e:
        kbit.load(garbage)
    assert e.value.status == INVALID_DATA
    with pytest.raises(FileNotFoundError):
        kbit.load(tmp_path / "missing.safetensors")
    q = kbit.quantize(rng.standard_normal(64).astype(np.float32), k=4)
    with pytest.raises(KbitError, match="two tensors"):
        kbit.save({"w": q, "w.packed": np.zeros(3, np.float32)}, tmp_path / "x.safetensors")
    with pytest.raises(KbitError, match="kbit's own"):
        kbit.save({"w": q}, tmp_path / "x.safetensors", metadata={"kbit": "1"})
    with pytest.raises(KbitError, match="mapping"):
        kbit.save([q], tmp_path / "x.safetensors")
    with pytest.raises(KbitError, match="non-empty"):
        kbit.save({"": q}, tmp_path / "x.safetensors")
    with pytest.raises(KbitError, match="cannot be stored"):
        kbit.save({"o": np.array([object()])}, tmp_path / "x.safetensors")
    with pytest.raises(KbitError, match="device"):
        kbit.load(garbage, device="tpu")


def _silero_file():
    import importlib.util
    import os
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "data", "silero_vad_16k.safetensors")
    return path if os.path.exists(path) else None


SILERO = _silero_file()
requires_silero = pytest.mark.skipif(SILERO is None, reason="the silero-vad package (its "
                                     "safetensors weights) is not installed: make deps")


@requires_silero
def test_real_model_round_trip(tmp_path):
    """silero-vad's weights: every >= 2-D tensor quantized (kbit K=4 auto and NF4), saved,
    loaded; the loaded tensors dequantize to the same bytes, and K=4 auto is at least as
    accurate as NF4 at blocksize 64 on each tensor."""
    from safetensors.numpy import load_file
    weights = load_file(SILERO)
    out = {}
    for name, w in weights.items():
        if w.ndim >= 2 and w.size >= 256 and w.dtype == np.float32:
            out[name] = kbit.quantize(w, k=4, codebook="auto")
            out[name + ".nf4"] = kbit.quantize_nf4(w, blocksize=64)
        else:
            out[name] = w
    assert sum(isinstance(v, kbit.QuantizedTensor) for v in out.values()) >= 5
    path = tmp_path / "silero.kbit.safetensors"
    kbit.save(out, path)
    got = kbit.load(path)
    for name, v in out.items():
        _same(_decoded(got[name]), _decoded(v))
        if isinstance(v, kbit.QuantizedTensor):
            w = weights[name].reshape(-1).astype(np.float64)
            sq = (w ** 2).sum()
            err_k4 = ((_decoded(got[name]).reshape(-1) - w) ** 2).sum()
            err_nf4 = ((_decoded(got[name + ".nf4"]).reshape(-1) - w) ** 2).sum()
            assert err_k4 <= err_nf4 * 1.0001, (name, 10 * np.log10(sq / err_k4),
                                                10 * np.log10(sq / err_nf4))


@requires_gpu
def test_load_to_gpu(rng, tmp_path):
    import torch
    tensors = _containers(rng)
    path = tmp_path / "m.safetensors"
    kbit.save(tensors, path)
    got = kbit.load(path, device="cuda")
    for name, want in tensors.items():
        g = got[name]
        if hasattr(want, "packed") or hasattr(want, "blocks"):
            assert g.on_device, name
            _same(torch.as_tensor(_decoded(g)).cpu().numpy(), _decoded(want))
        else:
            assert isinstance(g, torch.Tensor) and g.is_cuda
            _same(g.cpu().numpy(), want)
    # and a GPU container saves back to the same file contents
    again = tmp_path / "again.safetensors"
    kbit.save(got, again)
    assert again.read_bytes() == path.read_bytes()

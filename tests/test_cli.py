"""The kbit command line (python -m kbit): quantize / dequantize / inspect / report on
silero-vad's real weights and on small generated files, and its errors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kbit

from conftest import ROOT
from test_checkpoint import SILERO, requires_silero

pytest.importorskip("safetensors", reason="the kbit CLI reads safetensors files")
pytest.importorskip("tqdm", reason="the kbit CLI shows tqdm progress bars")
from safetensors.numpy import load_file, save_file  # noqa: E402


def run(*args, cwd=None):
    path = [os.path.join(ROOT, "bindings", "python")] + \
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    return subprocess.run([sys.executable, "-m", "kbit", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def small(tmp_path, rng):
    path = tmp_path / "small.safetensors"
    save_file({"w1": rng.standard_normal((64, 96)).astype(np.float32),
               "w2": rng.standard_t(3, (32, 64)).astype(np.float16),
               "bias": rng.standard_normal(64).astype(np.float32),
               "steps": np.arange(4, dtype=np.int64)}, str(path), metadata={"m": "x"})
    return path


@pytest.mark.parametrize("fmt,extra", [("kbit", ["--k", "3", "--codebook", "fit"]),
                                       ("kbit", ["--k", "5", "--absmax", "fp16"]),
                                       ("nf4", []), ("fp4", ["--double-quant"])])
def test_quantize_equals_python_api(small, tmp_path, fmt, extra):
    out = tmp_path / "q.safetensors"
    r = run("quantize", small, "-o", out, "--format", fmt, *extra, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "2 of 4 tensors quantized" in r.stdout
    got = kbit.load(out)
    src = load_file(str(small))
    assert sorted(got) == sorted(src)
    for name in ("bias", "steps"):  # not weights: kept as they are
        assert np.array_equal(got[name], src[name]) and got[name].dtype == src[name].dtype
    for name in ("w1", "w2"):
        if fmt == "kbit":
            k = int(extra[1])
            book = extra[3] if extra[2] == "--codebook" else None
            absmax = extra[3] if extra[2] == "--absmax" else "e4m4"
            want = kbit.dequantize(kbit.quantize(src[name], k=k, absmax=absmax, codebook=book))
            have = kbit.dequantize(got[name])
        else:
            want = kbit.dequantize_4bit(kbit.quantize_4bit(
                src[name], quant_type=fmt, compress_statistics="--double-quant" in extra))
            have = kbit.dequantize_4bit(got[name])
        assert have.dtype == src[name].dtype and have.tobytes() == want.tobytes(), name


def test_dequantize_and_inspect(small, tmp_path):
    q, d = tmp_path / "q.safetensors", tmp_path / "d.safetensors"
    assert run("quantize", small, "-o", q, "-q").returncode == 0
    r = run("inspect", q)
    assert r.returncode == 0, r.stderr
    assert "4 tensors (2 quantized by kbit)" in r.stdout
    assert "kbit K=4 e4m4" in r.stdout and "4.250" in r.stdout and "int64" in r.stdout
    r = run("dequantize", q, "-o", d, "--dtype", "float32", "-q")
    assert r.returncode == 0, r.stderr
    plain = load_file(str(d))
    assert plain["w1"].dtype == np.float32 and plain["w1"].shape == (64, 96)
    assert np.array_equal(plain["w1"], kbit.dequantize(kbit.load(q)["w1"], dtype="float32"))


def test_inspect_gguf(tmp_path, rng):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.w", np.ones((4, 32), np.float16))
    w.add_tensor("blk.0.q", rng.integers(0, 256, (2, 34), dtype=np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = run("inspect", path)
    assert r.returncode == 0, r.stderr
    assert "GGUF v3" in r.stdout and "architecture: llama" in r.stdout
    lines = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines() if ln.startswith("blk")}
    assert lines["blk.0.q"][1:4] == ["Q8_0", "2x32", "68"]
    assert lines["blk.0.w"][1:3] == ["F16", "4x32"]


@requires_silero
def test_report_on_real_model(tmp_path):
    png, js = tmp_path / "report.png", tmp_path / "report.json"
    r = run("report", SILERO, "--k", "3", "4", "--plot", png, "--json", js)
    assert r.returncode == 0, r.stderr
    assert "kbit4-auto" in r.stdout and "nf4-bs64" in r.stdout and "median" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    doc = json.loads(js.read_text())
    assert len(doc["tensors"]) == 7  # silero's weight tensors
    for t in doc["tensors"]:  # K=4 auto at least NF4 on every tensor, fewer bits
        f = t["formats"]
        assert f["kbit4-auto"]["sqnr_db"] >= f["nf4-bs64"]["sqnr_db"], t["tensor"]
        assert f["kbit4-auto"]["bits_per_weight"] < f["nf4-bs64"]["bits_per_weight"]
        assert f["kbit4-auto"]["sqnr_db"] > f["kbit3-auto"]["sqnr_db"]


@requires_silero
def test_quantize_load_round_trip_on_real_model(tmp_path):
    out = tmp_path / "silero.kbit.safetensors"
    r = run("quantize", SILERO, "-o", out, "--k", "4", "--codebook", "auto")
    assert r.returncode == 0, r.stderr
    src = load_file(SILERO)
    got = kbit.load(out)
    quantized = [n for n, v in got.items() if isinstance(v, kbit.QuantizedTensor)]
    assert len(quantized) == 7
    for name in quantized:
        want = kbit.dequantize(kbit.quantize(src[name], k=4, codebook="auto"))
        assert kbit.dequantize(got[name]).tobytes() == want.tobytes(), name


def test_errors(tmp_path, small):
    r = run("inspect", tmp_path / "missing.safetensors")
    assert r.returncode == 1 and "no such file" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 100)
    for args in (["inspect", bad], ["quantize", bad, "-o", tmp_path / "o.safetensors"],
                 ["report", bad]):
        r = run(*args)
        assert r.returncode == 1 and "not a safetensors file" in r.stderr, args
        assert "Traceback" not in r.stderr
    r = run("quantize", small, "-o", tmp_path / "o.safetensors", "--k", "9")
    assert r.returncode == 1 and "k must be" in r.stderr.lower() and "Traceback" not in r.stderr
    r = run("report", small, "--min-elements", "10000000")
    assert r.returncode == 1 and "no tensor" in r.stderr
    r = run("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr

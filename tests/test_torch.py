"""kbit.torch: torch tensors in and out (CPU and GPU, float32/float16/bfloat16,
requires_grad), QuantizedLinear for every format against nn.Linear with the
dequantized weight, gradients, quantize_model, and state_dict round trips."""
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="kbit.torch needs PyTorch")

import kbit  # noqa: E402
import kbit.torch as kt  # noqa: E402
from kbit import gguf as kg  # noqa: E402
from kbit._lib import KbitError  # noqa: E402

from conftest import requires_gpu  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FORMATS = [("kbit", {"k": 4}), ("kbit", {"k": 2, "codebook": "fit", "absmax": "fp16"}),
           ("kbit", {"k": 3, "tile": False}), ("nf4", {}), ("nf4", {"tile": True}),
           ("fp4", {"compress_statistics": True, "blocksize": 128})]
DEVICES = ["cpu", pytest.param("cuda", marks=requires_gpu)]


def _seed(rng):
    torch.manual_seed(int(rng.integers(0, 2 ** 31)))


def _close(a, b, dtype, scale=1.0):
    tol = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype] * scale
    err = (a.float() - b.float()).norm() / max(b.float().norm(), 1e-30)
    assert err <= tol, f"relative error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_dequantize_tensors(rng, device, dtype):
    _seed(rng)
    x = torch.randn(40, 96, device=device, dtype=dtype, requires_grad=True)
    q = kt.quantize(x, k=4)
    assert isinstance(q.packed, torch.Tensor) and q.packed.device.type == device
    assert q.dtype == str(dtype).replace("torch.", "")
    y = kt.dequantize(q)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.shape == x.shape
    assert y.device.type == device and not y.requires_grad
    # the same bytes as the numpy API on x's values
    host = x.detach().cpu()
    if dtype == torch.bfloat16:
        ref = kbit.dequantize(kbit.quantize(host.view(torch.int16).numpy().view(np.uint16), k=4,
                                            dtype="bfloat16"))
        assert np.array_equal(y.cpu().view(torch.int16).numpy().view(np.uint16), ref)
    else:
        ref = kbit.dequantize(kbit.quantize(host.numpy(), k=4))
        assert np.array_equal(y.cpu().numpy(), ref)
    q4 = kt.quantize_4bit(x, "nf4")
    assert kt.dequantize(q4, torch.float32).dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,opts", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantized_linear_matches_dequantized_linear(rng, device, fmt, opts, dtype):
    _seed(rng)
    lin = torch.nn.Linear(128, 48, bias=True).to(device=device, dtype=dtype)
    ql = kt.QuantizedLinear.from_linear(lin, format=fmt, **opts)
    assert ql.in_features == 128 and ql.out_features == 48
    tiled = opts.get("tile", fmt == "kbit" or (
        device == "cuda" and torch.cuda.get_device_capability() >= (9, 0)
        and dtype != torch.float32 and not opts.get("compress_statistics")))
    assert isinstance(ql.weight, kbit.TiledTensor) == tiled
    x = torch.randn(3, 5, 128, device=device, dtype=dtype)
    y = ql(x)
    assert y.shape == (3, 5, 48) and y.dtype == dtype and y.device.type == device
    w = ql.dequantize_weight(torch.float32)
    ref = x.float() @ w.T + lin.bias.float()
    _close(y, ref, dtype)
    assert fmt.split("_")[0] in repr(ql) or "kbit" in repr(ql)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_flow_to_x_and_bias_not_weight(rng, device):
    _seed(rng)
    lin = torch.nn.Linear(64, 32).to(device)
    ql = kt.QuantizedLinear.from_linear(lin, k=4)
    ql.bias.requires_grad_(True)
    x = torch.randn(6, 64, device=device, requires_grad=True)
    y = ql(x)
    assert y.requires_grad
    g = torch.randn_like(y)
    y.backward(g)
    w = ql.dequantize_weight(torch.float32)
    _close(x.grad, g @ w, torch.float32)
    _close(ql.bias.grad, g.sum(0), torch.float32)
    assert all(not b.requires_grad for b in ql.buffers())
    with torch.no_grad():  # no graph when nothing asks for one
        assert not ql(x).requires_grad


def _model(device, dtype=torch.float32):
    return torch.nn.Sequential(
        torch.nn.Linear(64, 96), torch.nn.GELU(),
        torch.nn.Sequential(torch.nn.Linear(96, 96), torch.nn.ReLU()),
        torch.nn.Linear(96, 10)).to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_quantize_model_and_state_dict_round_trip(rng, device):
    _seed(rng)
    model = _model(device)
    x = torch.randn(4, 64, device=device)
    ref = model(x)
    kt.quantize_model(model, k=4, codebook="fit", skip=["3"])
    kinds = [type(m).__name__ for m in model.modules()]
    assert kinds.count("QuantizedLinear") == 2 and isinstance(model[3], torch.nn.Linear)
    y = model(x)
    _close(y, ref, torch.float32, scale=15000)  # 4-bit weights of a random MLP: <= 30%
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    # into a model quantized differently (k=2, NF4): the saved weights replace them
    other = kt.quantize_model(_model(device), k=2, skip=["3"])
    other[2][0] = kt.QuantizedLinear.from_linear(torch.nn.Linear(96, 96).to(device), "nf4")
    buf.seek(0)
    other.load_state_dict(torch.load(buf, weights_only=False))
    assert torch.equal(other(x), y)
    assert other[0].weight.k == 4 and other[0].weight.codebook is not None


def test_state_dict_moves_between_devices_and_dtypes(rng):
    _seed(rng)
    lin = torch.nn.Linear(64, 16)
    ql = kt.QuantizedLinear.from_linear(lin, format="nf4", tile=False)
    sd = ql.state_dict()
    assert "_extra_state" in sd and sd["_extra_state"]["format"] == "bnb4"
    again = kt.QuantizedLinear.from_linear(torch.nn.Linear(64, 16), format="nf4", tile=False)
    again.load_state_dict(sd)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    assert torch.equal(again(x), ql(x))
    with pytest.raises(RuntimeError, match="_extra_state"):
        bad = {k: v for k, v in sd.items() if k != "_extra_state"}
        again.load_state_dict(bad)


def test_gguf_weight(rng):
    from test_gguf import _quant_tensor
    raw = _quant_tensor(rng, "Q4_K", (8, 512))  # gguf's own quantizer
    gt = kg.GGUFTensor(torch.from_numpy(raw.reshape(-1).copy()), kg.GGML_TYPES["Q4_K"], (8, 512))
    ql = kt.QuantizedLinear.from_quantized(gt)
    x = torch.randn(3, 512, dtype=torch.float32)  # random K-quant scales overflow fp16
    w = kt.dequantize(gt, torch.float32)
    assert w.shape == (8, 512)
    _close(ql(x), x @ w.T, torch.float32)
    assert "Q4_K" in repr(ql)


def test_gguf_q4_0_weight_tiled(rng):
    """from_quantized(tile=True) on a Q4_0 weight: a tiled kbit layer (kbit.gguf.to_kbit,
    then kbit.tile) whose forward is within the bounds of the Q4_0 values and whose
    state_dict round-trips."""
    from test_gguf import _quant_tensor
    raw = _quant_tensor(rng, "Q4_0", (16, 256))
    gt = kg.GGUFTensor(torch.from_numpy(raw.reshape(-1).copy()), kg.GGML_TYPES["Q4_0"], (16, 256))
    ql = kt.QuantizedLinear.from_quantized(gt, tile=True)
    assert "tiled" in repr(ql) and ql.state_dict()["_extra_state"]["format"] == "kbit_tiled"
    x = torch.randn(3, 256, dtype=torch.float32)
    w = kt.dequantize(gt, torch.float32)
    assert torch.equal(kt.dequantize(ql.weight, torch.float32), w)
    _close(ql(x), x @ w.T, torch.float32)
    again = kt.QuantizedLinear.from_quantized(gt, tile=True)
    again.load_state_dict(ql.state_dict())
    assert torch.equal(again(x), ql(x))


@requires_gpu
def test_gguf_q4_0_tiled_by_default_on_sm90(rng):
    """from_quantized's default on a CUDA Q4_0 weight: tiled on compute capability 9.0 (where
    it was measured faster), the GGUF layout elsewhere; tile=False keeps the GGUF layout;
    both within the bounds of the Q4_0 values."""
    from test_gguf import _quant_tensor
    raw = _quant_tensor(rng, "Q4_0", (64, 512))
    gt = kg.GGUFTensor(torch.from_numpy(raw.reshape(-1).copy()).cuda(), kg.GGML_TYPES["Q4_0"],
                       (64, 512))
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    default = kt.QuantizedLinear.from_quantized(gt)
    kept = kt.QuantizedLinear.from_quantized(gt, tile=False)
    assert ("tiled" in repr(default)) == sm90 and "Q4_0" in repr(kept)
    x = torch.randn(20, 512, device="cuda", dtype=torch.float16)
    w = kt.dequantize(gt, torch.float32)
    for layer in (default, kept):
        _close(layer(x).float(), (x.float() @ w.T), torch.float16)


def test_errors():
    with pytest.raises(KbitError, match="torch.Tensor"):
        kt.quantize(np.zeros(64, np.float32))
    with pytest.raises(KbitError, match="float32, float16 or bfloat16"):
        kt.quantize(torch.zeros(64, dtype=torch.int32))
    with pytest.raises(KbitError, match="nn.Linear"):
        kt.QuantizedLinear.from_linear(torch.nn.Conv1d(3, 3, 1))
    with pytest.raises(KbitError, match="format"):
        kt.QuantizedLinear.from_linear(torch.nn.Linear(32, 4), format="int8")
    ql = kt.QuantizedLinear.from_linear(torch.nn.Linear(32, 4))
    with pytest.raises(KbitError, match="x must have shape"):
        ql(torch.randn(2, 31))
    with pytest.raises(KbitError, match="2-D"):
        kt.QuantizedLinear.from_quantized(kbit.quantize(np.zeros(64, np.float32)))


def test_core_api_takes_torch_cpu_tensors(rng):
    """kbit.quantize / matmul (the numpy-facing API) read PyTorch CPU tensors of any float
    dtype, bfloat16 and requires_grad included (detached, bf16 as its bits); results are
    numpy there, torch tensors through kbit.torch."""
    _seed(rng)
    x = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)
    q = kbit.quantize(x, k=4)
    assert q.dtype == "bfloat16"
    bits = x.detach().view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(kbit.dequantize(q), kbit.dequantize(kbit.quantize(bits, k=4,
                                                                            dtype="bfloat16")))
    a = torch.randn(3, 32, dtype=torch.bfloat16, requires_grad=True)
    y = kbit.matmul(a, q)
    assert y.dtype == np.uint16 and y.shape == (3, 64)
    assert torch.equal(kt.matmul(a, q).view(torch.int16), torch.from_numpy(y.view(np.int16)))

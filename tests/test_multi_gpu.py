"""Two GPUs in one process (issue 16): every call runs on its arrays' own device and that
device's current stream, whatever device is current, gives the bytes of the same call on
cuda:0 and leaves the current device alone; mixed devices are a KbitError; the C contract
(the caller's current device) with its per-device range flag; one layer per GPU from two
threads at once; and the distributed example (NCCL, one process per GPU)."""
import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import kbit
from kbit import gguf as kg
from kbit._lib import KbitError, call

from conftest import GPU_SKIP_REASON, ROOT


def _gpus() -> int:
    if GPU_SKIP_REASON is not None:
        return 0
    import torch
    return torch.cuda.device_count()


pytestmark = pytest.mark.skipif(_gpus() < 2, reason=GPU_SKIP_REASON or
                                "needs two CUDA devices (one is present)")


def _ops(torch, dev):
    """(name, fn(inputs) -> tensors) over inputs made on `dev`."""
    g = torch.Generator(device=dev).manual_seed(11)
    x = torch.randn(70_001, device=dev, generator=g, dtype=torch.bfloat16)
    w = torch.randn(96, 512, device=dev, generator=g, dtype=torch.float16)
    a = torch.randn(3, 512, device=dev, generator=g, dtype=torch.float16)
    big = torch.randn(40, 512, device=dev, generator=g, dtype=torch.float16)
    imp = torch.rand(70_001, device=dev, generator=g)
    q = kbit.quantize(w, k=4, codebook="nf0")
    t = kbit.tile(q)
    n4 = kbit.quantize_nf4(w, blocksize=64, compress_statistics=True)
    raw = np.zeros((96 * 512 // 32, 34), np.uint8)
    raw[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    raw[:, 2:] = np.arange(32, dtype=np.uint8)[None, :]
    gg = kg.GGUFTensor(torch.from_numpy(raw.reshape(-1)).to(dev), kg.GGML_TYPES["Q8_0"], (96, 512))
    return {
        "quantize": lambda: [kbit.quantize(x, k=3).packed, kbit.quantize(x, k=3).absmax],
        "quantize weighted": lambda: [kbit.quantize(x, k=5, importance=imp).absmax],
        "quantize fit": lambda: [kbit.quantize(x, k=4, codebook="fit").packed],
        "dequantize": lambda: [kbit.dequantize(kbit.quantize(x, k=2, absmax="fp16"))],
        "nf4": lambda: [kbit.quantize_nf4(x, compress_statistics=True).absmax,
                        kbit.dequantize_4bit(n4)],
        "gguf": lambda: [kg.dequantize(gg, dtype="float32")],
        "tile": lambda: [kbit.tile(q).packed, kbit.untile(t).packed],
        "matmul": lambda: [kbit.matmul(a, q), kbit.matmul(a, t), kbit.matmul(big, t),
                           kbit.matmul(a, n4), kbit.matmul(big, gg)],
    }


def test_calls_run_on_the_arrays_device():
    import torch
    ref = {name: [r.cpu() for r in fn()] for name, fn in _ops(torch, "cuda:0").items()}
    torch.cuda.set_device(0)
    ops = _ops(torch, "cuda:1")
    for name, fn in ops.items():  # cuda:0 current, the arrays on cuda:1
        got = fn()
        assert torch.cuda.current_device() == 0, name  # kbit left it alone
        for r, want in zip(got, ref[name]):
            assert r.device == torch.device("cuda", 1), name
            assert torch.equal(r.cpu(), want), name
    s1 = torch.cuda.Stream(device=1)
    with torch.cuda.stream(s1):  # (PyTorch makes s1's device current here)
        for name, fn in ops.items():
            for r, want in zip(fn(), ref[name]):
                assert torch.equal(r.cpu(), want), name
    s1.synchronize()


def test_calls_use_the_devices_current_stream():
    """Work queued on cuda:1's current stream before the call is seen by the call (a call
    on another stream would race it)."""
    import torch
    torch.cuda.set_device(0)
    s1 = torch.cuda.Stream(device=1)
    with torch.cuda.stream(s1):
        for _ in range(5):
            x = torch.empty(1 << 22, device="cuda:1")
            x.fill_(3.0)  # queued on s1, not finished when kbit is called
            y = kbit.dequantize(kbit.quantize(x, k=4, absmax="fp32"))
            assert torch.all(y == 3.0)


def test_mixed_devices_are_errors():
    import torch
    w = kbit.quantize(torch.randn(16, 64, device="cuda:1"), k=4)
    with pytest.raises(KbitError, match="cuda:1.*cuda:0|cuda:0.*cuda:1"):
        kbit.matmul(torch.randn(2, 64, device="cuda:0"), w)
    x = torch.randn(64, device="cuda:1")
    with pytest.raises(KbitError, match="cuda"):
        kbit.quantize(x, k=4, importance=torch.ones(64, device="cuda:0"))
    with pytest.raises(KbitError, match="cuda"):
        kbit.quantize(x, k=4, tensor_scale=1.0,
                      range_status=torch.zeros(1, dtype=torch.int32, device="cuda:0"))


def test_c_entries_use_the_current_device_and_its_range_flag():
    import torch
    raised = ctypes.c_int()
    for dev in (0, 1):
        torch.cuda.set_device(dev)
        call("kbit_get_range_flag", ctypes.byref(raised), 1)
    bad = torch.full((4096,), 1e6, device="cuda:1")
    packed = torch.empty(4 * 128, dtype=torch.int32, device="cuda:1")
    absmax = torch.empty(128, dtype=torch.uint8, device="cuda:1")
    torch.cuda.set_device(1)  # the caller makes the pointers' device current
    call("kbit_quantize", bad.data_ptr(), bad.numel(), 0, 4, None, 2, ctypes.c_float(1.0),
         absmax.data_ptr(), packed.data_ptr(), torch.cuda.current_stream(1).cuda_stream)
    call("kbit_get_range_flag", ctypes.byref(raised), 1)
    assert raised.value == 1  # cuda:1's flag
    torch.cuda.set_device(0)
    call("kbit_get_range_flag", ctypes.byref(raised), 1)
    assert raised.value == 0  # cuda:0's was never raised
    assert torch.cuda.current_device() == 0


def test_one_layer_per_gpu_from_two_threads():
    import torch
    weights = [torch.randn(512, 1024, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    serial = []
    for i in range(2):
        with torch.cuda.device(i):
            w = weights[i].to(f"cuda:{i}", torch.float16)
            q = kbit.tile(kbit.quantize(w, k=4))
            serial.append(kbit.matmul(w[:4], q).cpu())
    results, errors = [None, None], []

    def work(i):
        try:
            torch.cuda.set_device(1 - i)  # the other device current: kbit must not care
            w = weights[i].to(f"cuda:{i}", torch.float16)
            for _ in range(10):
                q = kbit.tile(kbit.quantize(w, k=4))
                y = kbit.matmul(w[:4], q)
            results[i] = y.cpu()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(2):
        assert torch.equal(results[i], serial[i])


def test_distributed_example(tmp_path):
    """examples/distributed_quantize.py over two processes (NCCL): the shards together
    hold every tensor once, and each quantized tensor equals the single-GPU result."""
    pytest.importorskip("safetensors")
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(3)
    tensors = {f"layer{i}.weight": torch.randn(64 + 32 * i, 256, generator=g) for i in range(5)}
    tensors["norm.weight"] = torch.ones(256)
    src = tmp_path / "model.safetensors"
    save_file(tensors, str(src))
    out = tmp_path / "out"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "bindings", "python")]
                                        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "distributed_quantize.py"),
                        str(src), str(out), "--k", "3", "--gpus", "2"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    index = json.loads((out / "model.kbit.index.json").read_text())["weight_map"]
    assert sorted(index) == sorted(tensors)
    assert len(set(index.values())) == 2
    for name, shard in index.items():
        got = kbit.load(out / shard)[name]
        if name == "norm.weight":
            assert np.array_equal(got, tensors[name].numpy())
            continue
        want = kbit.quantize(tensors[name].numpy(), k=3)
        assert np.array_equal(got.packed, want.packed) and np.array_equal(got.absmax, want.absmax)

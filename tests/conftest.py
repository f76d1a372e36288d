"""Shared fixtures: the package path, GPU detection with a clear skip reason."""
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

import kbit  # noqa: E402


def _gpu_reason():
    if os.environ.get("KBIT_DISABLE_GPU_TESTS"):
        return "GPU tests disabled by KBIT_DISABLE_GPU_TESTS"
    try:
        if not kbit.cuda_available():
            return "no CUDA device (or libkbit built without CUDA)"
    except kbit.KbitError as e:
        return f"libkbit not loadable: {e}"
    try:
        import torch
    except ImportError:
        return "GPU tests use PyTorch for device arrays; torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


GPU_SKIP_REASON = _gpu_reason()
requires_gpu = pytest.mark.skipif(GPU_SKIP_REASON is not None,
                                  reason=GPU_SKIP_REASON or "")


@pytest.fixture
def rng(request):
    # Fresh data every run, reproducible from the printed seed on failure: KBIT_TEST_SEED
    # replays one.
    seed = int(os.environ.get("KBIT_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def pytest_report_header(config):
    return f"kbit GPU tests: {'ON' if GPU_SKIP_REASON is None else 'skipped: ' + GPU_SKIP_REASON}"

"""PyTorch layers and tensor functions over kbit (imported on its own: `import kbit.torch`).

    >>> import kbit.torch as kt
    >>> model = kt.quantize_model(model, k=4)            # every nn.Linear -> QuantizedLinear
    >>> y = model(x)                                     # kbit.matmul on x's device
    >>> torch.save(model.state_dict(), "q.pt")           # and load_state_dict back

Tensors go in and come out as torch tensors, on the CPU and the GPU, in any dtype a
checkpoint holds (float32, float16, bfloat16). The gradient rule: quantize and
dequantize read `x.detach()` (rounding to a codebook has no useful gradient); matmul and
QuantizedLinear are differentiable with respect to x (dx = dy @ W, with W dequantized
for the backward pass) and never with respect to the frozen quantized weight.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import nn

from . import _arrays
from . import bnb4 as _bnb4
from . import gguf as _gguf
from . import kbit as _kbit
from .matmul import matmul as _kbit_matmul
from . import tiled as _tiled
from ._lib import KbitError
from .checkpoint import _FORMATS, dequantize_any, format_of

__all__ = ["QuantizedLinear", "dequantize", "matmul", "quantize", "quantize_4bit",
           "quantize_model"]

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _kbit_input(x: torch.Tensor):
    """(what kbit's functions take for x, the dtype argument): CUDA tensors as they are;
    CPU tensors as numpy views (bfloat16 as uint16 bits with dtype='bfloat16')."""
    if not isinstance(x, torch.Tensor):
        raise KbitError(f"expected a torch.Tensor, got {type(x).__name__}")
    x = x.detach()
    if x.dtype not in _DTYPES:
        raise KbitError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.is_cuda:
        return x, None
    if x.device.type != "cpu":
        raise KbitError(f"kbit runs on CPU and CUDA tensors, got a {x.device} tensor")
    x = x.contiguous()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    return x.numpy(), None


def _torch_output(a, dtype: str) -> torch.Tensor:
    """kbit's result as a torch tensor (numpy ones wrapped without a copy)."""
    if isinstance(a, torch.Tensor):
        return a
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _as_torch(a):
    """A container field as a torch tensor (None stays None)."""
    if a is None or isinstance(a, torch.Tensor):
        return a
    return torch.as_tensor(np.asarray(a))


def _torch_fields(q):
    """q with every array field a torch tensor."""
    fmt = _format(q)
    for field in _FORMATS[fmt][1]:
        value = getattr(q, field)
        if value is not None and field not in ("codebook", "code"):
            setattr(q, field, _as_torch(value))
    return q


def _format(q) -> str:
    fmt = format_of(q)
    if fmt is None:
        raise KbitError(f"not a kbit container: {type(q).__name__}")
    return fmt


def quantize(x: torch.Tensor, k: int = 4, **kwargs) -> _kbit.QuantizedTensor:
    """kbit.quantize for a torch tensor (CPU or CUDA, any float dtype, x.detach() read);
    the container's arrays are torch tensors on x's device."""
    arr, dtype = _kbit_input(x)
    return _torch_fields(_kbit.quantize(arr, k=k, dtype=dtype, **kwargs))


def quantize_4bit(x: torch.Tensor, quant_type: str = "nf4", **kwargs) -> _bnb4.Quantized4bit:
    """kbit.quantize_4bit (NF4/FP4) for a torch tensor; arrays as torch tensors."""
    arr, dtype = _kbit_input(x)
    return _torch_fields(_bnb4.quantize_4bit(arr, quant_type=quant_type, dtype=dtype, **kwargs))


def dequantize(q, dtype: torch.dtype | str | None = None) -> torch.Tensor:
    """Any kbit container (kbit stored or tiled, NF4/FP4, GGUF) dequantized to a torch
    tensor where q lives (default dtype: the quantized tensor's, float16 for GGUF)."""
    name = _arrays.dtype_name(dtype) if dtype is not None else getattr(q, "dtype", "float16")
    _format(q)
    return _torch_output(dequantize_any(q, name), name).reshape(tuple(q.shape))


class _Matmul(torch.autograd.Function):
    """y = x @ W.T (+ bias) with gradients for x and bias, none for the frozen W."""

    @staticmethod
    def forward(ctx, x, w, bias):
        ctx.w, ctx.has_bias = w, bias is not None
        return _forward(x, w, bias)

    @staticmethod
    def backward(ctx, grad_y):
        grad_x = grad_bias = None
        if ctx.needs_input_grad[0]:
            weight = dequantize(ctx.w, grad_y.dtype)
            grad_x = grad_y @ weight
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_y.reshape(-1, grad_y.shape[-1]).sum(0)
        return grad_x, None, grad_bias


def _forward(x: torch.Tensor, w, bias):
    arr, dtype = _kbit_input(x)
    b = None
    if bias is not None:
        if bias.dtype != x.dtype or bias.device != x.device:
            bias = bias.to(device=x.device, dtype=x.dtype)
        b, _ = _kbit_input(bias)
    y = _kbit_matmul(arr, w, b, dtype=dtype)
    return _torch_output(y, _DTYPES[x.dtype])


def matmul(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """kbit.matmul for torch tensors: y = x @ W.T (+ bias), x (..., k_in) on the CPU or a
    GPU in float32/float16/bfloat16, W any kbit container where x is. Differentiable with
    respect to x and bias when they require grad (see the module doc)."""
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or (bias is not None and bias.requires_grad))
    if needs_grad:
        return _Matmul.apply(x, w, bias)
    return _forward(x, w, bias)


class QuantizedLinear(nn.Module):
    """An nn.Linear whose weight is quantized: forward runs kbit.matmul on the stored
    codes (never a dequantized copy). The weight's arrays are buffers (so .to(), .cuda()
    and state_dict work); its format parameters travel as the module's extra state.
    Build it with from_linear (kbit K, NF4, FP4) or from_quantized (any container,
    e.g. a GGUF tensor from kbit.gguf.load(..., dequantize=False))."""

    def __init__(self, weight, bias: torch.Tensor | None = None):
        super().__init__()
        self._set_weight(weight)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) \
            if bias is not None else None

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_linear(cls, linear: nn.Linear, format: str = "kbit", k: int = 4,
                    codebook=None, absmax: str = "e4m4", blocksize: int = 64,
                    compress_statistics: bool = False,
                    tile: bool | None = None) -> "QuantizedLinear":
        """Quantizes linear.weight where it lives. format: 'kbit' (k bits, absmax scale
        format and codebook as kbit.quantize), 'nf4' or 'fp4' (blocksize,
        compress_statistics as kbit.quantize_4bit). tile: repack the weight for the matmul
        when its in_features is a multiple of 32 (kbit.tile: the same bits for kbit; for
        NF4 / FP4 the kbit K = 4 weight that dequantizes to the same values, with half
        scales where they are exact, else float32 ones). None: kbit weights
        always; NF4 / FP4 ones on a CUDA device of compute capability 9.0 or later where
        the scales come out half (float16 or bfloat16 layers without
        compress_statistics): an H100 measured them 1.1-2.1x faster to 32 rows of x, 2-20%
        slower at 64 to 256 rows (bench/RESULTS.md, session 11). A tiled layer's
        state_dict holds the kbit weight (format 'kbit_tiled'), not bitsandbytes' bytes."""
        if not isinstance(linear, nn.Linear):
            raise KbitError(f"from_linear takes an nn.Linear, got {type(linear).__name__}")
        w = linear.weight
        if format == "kbit":
            q = quantize(w, k=k, absmax=absmax, codebook=codebook)
            tile = True if tile is None else tile
        elif format in ("nf4", "fp4"):
            q = quantize_4bit(w, quant_type=format, blocksize=blocksize,
                              compress_statistics=compress_statistics)
            if tile is None:
                tile = (w.is_cuda and torch.cuda.get_device_capability(w.device) >= (9, 0)
                        and w.dtype in (torch.float16, torch.bfloat16) and not compress_statistics)
        else:
            raise KbitError(f"format must be 'kbit', 'nf4' or 'fp4', got {format!r}")
        if tile and w.shape[1] % 32 == 0:
            q = _torch_fields(_tiled.tile(q))
        return cls(q, linear.bias)

    @classmethod
    def from_quantized(cls, weight, bias: torch.Tensor | None = None,
                       tile: bool | None = None) -> "QuantizedLinear":
        """Wraps a quantized (out_features, in_features) weight of any kbit container.
        tile: repack it for the matmul first (kbit.tile: a kbit or NF4 / FP4 weight, or a
        Q4_0 GGUF one as the kbit K = 4 weight of the same values). None: a Q4_0 weight on
        a CUDA device of compute capability 9.0, where an H100 measured the tiled one at
        0.93-1.14x the GGUF one's speed at 1 to 8 rows of x, 0.96-2.0x at 16 to 32,
        2.1-3.7x at 64 and 4-5x for prefill (bench/RESULTS.md, session 14, runs 11 and 1);
        others as they are."""
        shape = tuple(weight.shape)
        if len(shape) != 2:
            raise KbitError(f"a linear weight is 2-D, got shape {shape}")
        if tile is None:
            blocks = getattr(weight, "blocks", None)
            tile = (isinstance(weight, _gguf.GGUFTensor) and shape[1] % 32 == 0
                    and weight.ggml_type == _gguf.GGML_TYPES["Q4_0"]
                    and isinstance(blocks, torch.Tensor) and blocks.is_cuda
                    and torch.cuda.get_device_capability(blocks.device) == (9, 0))
        if tile:
            weight = _tiled.tile(weight)
        return cls(_torch_fields(weight), bias)

    # -- the weight -----------------------------------------------------------------
    def _set_weight(self, weight) -> None:
        fmt = _format(weight)
        self._fmt = fmt
        self._scalars = {"shape": tuple(int(d) for d in weight.shape)}
        if fmt != "gguf":
            self._scalars["dtype"] = weight.dtype
        for field in _FORMATS[fmt][2]:
            self._scalars[field] = getattr(weight, field)
        self._fields = _FORMATS[fmt][1]
        for field in self._fields:
            value = getattr(weight, field)
            self.register_buffer(f"weight_{field}", _as_torch(value), persistent=True)
        # the kbit calls take the codebook from the host (and keep their own device
        # copy); the buffer is what state_dict saves
        book = getattr(weight, "codebook", None)
        self._host_codebook = None if book is None else \
            np.array(_as_torch(book).detach().cpu().numpy(), dtype=np.float32)

    @property
    def weight(self):
        """The quantized weight as its kbit container, viewing this module's buffers."""
        cls = _FORMATS[self._fmt][0]
        arrays = {f: getattr(self, f"weight_{f}") for f in self._fields}
        if "codebook" in arrays:
            arrays["codebook"] = self._host_codebook
        return cls(**arrays, **self._scalars)

    @property
    def out_features(self) -> int:
        return self._scalars["shape"][0]

    @property
    def in_features(self) -> int:
        return self._scalars["shape"][1]

    def dequantize_weight(self, dtype=None) -> torch.Tensor:
        return dequantize(self.weight, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return matmul(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        w = self.weight
        detail = {"kbit": lambda: f"kbit K={w.k} {w.absmax_format}",
                  "kbit_tiled": lambda: f"kbit K={w.k} {w.absmax_format} tiled",
                  "bnb4": lambda: f"{w.quant_type} blocksize={w.blocksize}",
                  "gguf": lambda: w.type_name}[self._fmt]()
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, {detail}")

    # -- state_dict -----------------------------------------------------------------
    def get_extra_state(self) -> dict:
        return {"format": self._fmt, **self._scalars}

    def set_extra_state(self, state: dict) -> None:
        pass  # applied with the buffers by _load_from_state_dict

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        """Takes the saved weight whole (its format and sizes may differ from this
        module's, e.g. a model quantized to another k before loading)."""
        extra = state_dict.get(prefix + "_extra_state")
        if extra is None:
            missing_keys.append(prefix + "_extra_state")
            return
        fmt = extra.get("format")
        if fmt not in _FORMATS:
            error_msgs.append(f"{prefix}: unknown quantized format {fmt!r}")
            return
        device = next((b.device for b in self.buffers() if b is not None), None)
        arrays = {}
        for field in _FORMATS[fmt][1]:
            key = prefix + f"weight_{field}"
            value = state_dict.get(key)
            arrays[field] = value.to(device) if value is not None and device is not None \
                else value
        for field in self._fields:
            delattr(self, f"weight_{field}")
        scalars = {k: (tuple(v) if k == "shape" else v) for k, v in extra.items()
                   if k != "format"}
        self._set_weight(_FORMATS[fmt][0](**arrays, **scalars))
        bias = state_dict.get(prefix + "bias")
        if bias is not None:
            self.bias = nn.Parameter(bias.detach().clone().to(device), requires_grad=False)
        elif self.bias is not None and strict:
            missing_keys.append(prefix + "bias")
        for key in state_dict:
            if key.startswith(prefix) and "." not in key[len(prefix):]:
                local = key[len(prefix):]
                known = {f"weight_{f}" for f in _FORMATS[fmt][1]} | {"bias", "_extra_state"}
                if local not in known:
                    unexpected_keys.append(key)


def quantize_model(model: nn.Module, k: int = 4, format: str = "kbit",
                   skip: Iterable[str] | Callable[[str, nn.Linear], bool] = (),
                   progress: bool | None = None, **options: Any) -> nn.Module:
    """Replaces every nn.Linear of model (in place; returned too) by a QuantizedLinear
    made with QuantizedLinear.from_linear(linear, format, k, **options). skip: names
    (as in model.named_modules(); a name also skips what is under it) or a predicate
    (name, linear) -> True to keep a layer in full precision. progress: a tqdm bar
    (None: when there are more than 8 layers)."""
    if callable(skip):
        keep = skip
    else:
        names = tuple(skip)
        keep = lambda name, _: any(name == s or name.startswith(s + ".") for s in names)  # noqa: E731
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and not keep(name, mod)]
    items = targets
    if progress or (progress is None and len(targets) > 8):
        try:
            from tqdm.auto import tqdm
            items = tqdm(targets, desc="quantize", unit="layer", leave=False)
        except ImportError:
            pass
    for name, linear in items:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantizedLinear.from_linear(linear, format=format, k=k,
                                                           **options))
    return model

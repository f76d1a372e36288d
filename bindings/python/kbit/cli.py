"""The `kbit` command (also `python -m kbit`): quantize checkpoints, look inside files,
and report the accuracy of each format on a checkpoint's tensors.

    kbit quantize IN.safetensors -o OUT.safetensors --k 4 [--format kbit|nf4|fp4]
                  [--codebook normal|nf0|uniform|fit|auto] [--device cpu|cuda]
    kbit dequantize IN.safetensors -o OUT.safetensors [--dtype float16]
    kbit inspect FILE                      (safetensors, kbit checkpoints or GGUF)
    kbit report IN.safetensors --k 2 3 4 5 [--plot report.png] [--json report.json]

Tensors quantized: floating-point tensors of at least 2 dimensions and --min-elements
elements (weights); the rest (biases, norms, integer buffers) are kept as they are.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Iterator

import numpy as np

from ._lib import KbitError

_FLOAT = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _bar(items, total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(items, total=total, desc=desc, unit="tensor", disable=not enabled,
                leave=False, file=sys.stderr)


# -- reading ----------------------------------------------------------------------------
def _plain_tensors(path) -> Iterator[tuple[str, np.ndarray, str | None]]:
    """(name, host array, float dtype name or None) of each tensor of a safetensors file,
    bfloat16 as uint16 bits with dtype 'bfloat16'."""
    from .checkpoint import _read_raw, open_file
    with open_file(path) as f:
        for name in f.keys():
            st = f.get_slice(name).get_dtype()
            yield name, _read_raw(path, f, name), _FLOAT.get(st)


def _count(path) -> int:
    from .checkpoint import open_file
    with open_file(path) as f:
        return len(list(f.keys()))


def _is_weight(arr: np.ndarray, dtype: str | None, min_elements: int) -> bool:
    return dtype is not None and arr.ndim >= 2 and arr.size >= min_elements


def _as_f64(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


def _to_device(arr: np.ndarray, dtype: str, device: str):
    """A host tensor where the work runs: numpy on the CPU, a PyTorch tensor on a GPU."""
    if device == "cpu":
        return arr
    import torch
    t = torch.from_numpy(np.ascontiguousarray(arr))
    if dtype == "bfloat16":
        t = t.view(torch.bfloat16)
    return t.to(device)


# -- quantize ---------------------------------------------------------------------------
def _quantize_one(x, dtype: str, args):
    import kbit
    host_dtype = "bfloat16" if dtype == "bfloat16" and isinstance(x, np.ndarray) else None
    if args.format == "kbit":
        return kbit.quantize(x, k=args.k, absmax=args.absmax, codebook=args.codebook,
                             dtype=host_dtype)
    return kbit.quantize_4bit(x, quant_type=args.format, blocksize=args.blocksize,
                              compress_statistics=args.double_quant, dtype=host_dtype)


def cmd_quantize(args) -> int:
    import kbit
    out: dict[str, Any] = {}
    before = after = quantized = 0
    total = _count(args.input)
    for name, arr, dtype in _bar(_plain_tensors(args.input), total, "quantize",
                                 not args.quiet):
        before += arr.nbytes
        if not _is_weight(arr, dtype, args.min_elements):
            out[name] = arr if dtype != "bfloat16" else _bf16(arr)
            after += arr.nbytes
            continue
        try:
            q = _quantize_one(_to_device(arr, dtype, args.device), dtype, args)
        except KbitError as e:
            raise KbitError(f"tensor {name!r}: {e}", e.status) from e
        out[name] = q
        after += q.total_nbytes
        quantized += 1
    kbit.save(out, args.output, metadata={"kbit.source": os.path.basename(args.input)},
              progress=not args.quiet and len(out) > 16)
    if not args.quiet:
        print(f"{args.input}: {quantized} of {total} tensors quantized "
              f"({_format_name(args)}); {before / 2**20:.2f} MiB -> {after / 2**20:.2f} MiB; "
              f"wrote {args.output}")
    return 0


def _bf16(bits: np.ndarray):
    """Host bfloat16 bits as a tensor kbit.save stores as BF16 (PyTorch's)."""
    import torch
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)


def _format_name(args) -> str:
    if args.format == "kbit":
        book = args.codebook or "normal"
        return f"kbit K={args.k}, {args.absmax} scales, {book} codebook"
    return f"{args.format.upper()} blocksize {args.blocksize}"


# -- dequantize -------------------------------------------------------------------------
def cmd_dequantize(args) -> int:
    import kbit
    from .checkpoint import dequantize_any, format_of
    tensors = kbit.load(args.input, device=args.device)
    out = {}
    for name, v in _bar(tensors.items(), len(tensors), "dequantize", not args.quiet):
        if format_of(v) is None:
            out[name] = v
            continue
        dtype = args.dtype or getattr(v, "dtype", "float32")
        y = dequantize_any(v, dtype)
        out[name] = _bf16(y) if dtype == "bfloat16" and isinstance(y, np.ndarray) else y
    kbit.save(out, args.output)
    if not args.quiet:
        print(f"wrote {args.output} ({len(out)} tensors)")
    return 0


# -- inspect ----------------------------------------------------------------------------
def _describe(v) -> tuple[str, tuple, int, float | None]:
    """(type text, shape, stored bytes, bits per weight or None) of a loaded value."""
    import kbit
    if isinstance(v, (kbit.QuantizedTensor, kbit.TiledTensor)):
        book = "custom book" if v.codebook is not None else "default book"
        layout = " tiled" if isinstance(v, kbit.TiledTensor) else ""
        return (f"kbit{layout} K={v.k} {v.absmax_format} ({book})", tuple(v.shape),
                v.total_nbytes, v.bits_per_element)
    if isinstance(v, kbit.Quantized4bit):
        nested = " nested" if v.nested else ""
        return (f"{v.quant_type.upper()} bs{v.blocksize}{nested}", tuple(v.shape), v.nbytes,
                v.bits_per_element)
    if isinstance(v, kbit.GGUFTensor):
        return v.type_name, tuple(v.shape), v.nbytes, v.bits_per_element
    arr = np.asarray(v)
    return str(arr.dtype), tuple(arr.shape), arr.nbytes, None


def cmd_inspect(args) -> int:
    path = os.fspath(args.file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    rows = []
    if magic == b"GGUF":
        from . import gguf
        head = gguf.read_header(path)
        print(f"{path}: GGUF v{head.version}, {len(head.metadata)} metadata keys, "
              f"{len(head.tensors)} tensors, alignment {head.alignment}")
        arch = head.metadata.get("general.architecture")
        if arch is not None:
            print(f"  architecture: {arch}")
        for t in head.tensors:
            n = int(np.prod(t.shape, dtype=np.float64))
            rows.append((t.name, t.type_name, t.shape, t.nbytes, t.nbytes * 8 / n if n else None))
    else:
        import kbit
        from .checkpoint import open_file
        tensors = kbit.load(path)
        with open_file(path) as f:
            meta = {k: v for k, v in (f.metadata() or {}).items() if k != "kbit"}
            st_types = {k: f.get_slice(k).get_dtype() for k in f.keys()}
        quantized = sum(_describe(v)[3] is not None for v in tensors.values())
        print(f"{path}: safetensors, {len(tensors)} tensors ({quantized} quantized by kbit)")
        for k, v in meta.items():
            print(f"  {k}: {v if len(v) <= 60 else v[:57] + '...'}")
        for name, v in tensors.items():
            kind, shape, nbytes, bpw = _describe(v)
            if bpw is None and st_types.get(name) == "BF16":
                kind = "bfloat16"
            rows.append((name, kind, shape, nbytes, bpw))
    _print_table(["tensor", "type", "shape", "bytes", "bits/w"],
                 [[name, kind, "x".join(map(str, shape)) or "scalar", f"{nbytes:,}",
                   "" if bpw is None else f"{bpw:.3f}"] for name, kind, shape, nbytes, bpw in rows])
    total = sum(r[3] for r in rows)
    print(f"total: {total:,} bytes in {len(rows)} tensors")
    return 0


def _print_table(header: list, rows: list) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)] if rows else \
        [len(h) for h in header]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(line.format(*header))
    print(line.format(*("-" * w for w in widths)))
    for r in rows:
        print(line.format(*r))


# -- report -----------------------------------------------------------------------------
def _report_formats(args) -> list[tuple[str, dict]]:
    formats = [(f"kbit{k}-{args.codebook}", {"k": k}) for k in args.k]
    for fmt in args.compare:
        formats.append((f"{fmt}-bs{args.blocksize}", {"format": fmt}))
    return formats


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    err = ((ref - got) ** 2).sum()
    sig = (ref ** 2).sum()
    if err == 0:
        return float("inf")
    return float(10 * np.log10(sig / err)) if sig > 0 else float("-inf")


def cmd_report(args) -> int:
    import kbit
    formats = _report_formats(args)
    results = []
    total = _count(args.input)
    for name, arr, dtype in _bar(_plain_tensors(args.input), total, "report", not args.quiet):
        if not _is_weight(arr, dtype, args.min_elements):
            continue
        ref = _as_f64(arr, dtype).reshape(-1)
        x = _to_device(arr, dtype, args.device)
        host_dtype = "bfloat16" if dtype == "bfloat16" and args.device == "cpu" else None
        row = {"tensor": name, "shape": list(arr.shape), "n": int(arr.size), "formats": {}}
        for label, spec in formats:
            if "k" in spec:
                q = kbit.quantize(x, k=spec["k"], absmax=args.absmax, codebook=args.codebook,
                                  dtype=host_dtype)
                y = kbit.dequantize(q, dtype="float32")
                bits = q.total_nbytes * 8 / q.n
            else:
                q = kbit.quantize_4bit(x, quant_type=spec["format"], blocksize=args.blocksize,
                                       dtype=host_dtype)
                y = kbit.dequantize_4bit(q, dtype="float32")
                bits = q.bits_per_element
            y = y.cpu().numpy() if hasattr(y, "cpu") else np.asarray(y)
            row["formats"][label] = {"sqnr_db": _sqnr(ref, y.reshape(-1).astype(np.float64)),
                                     "bits_per_weight": bits}
        results.append(row)
    if not results:
        raise KbitError(f"{args.input}: no tensor has >= 2 dimensions and >= "
                        f"{args.min_elements} floating-point elements")
    labels = [label for label, _ in formats]
    table = [[r["tensor"], "x".join(map(str, r["shape"]))]
             + [f"{r['formats'][lb]['sqnr_db']:.2f}" for lb in labels] for r in results]
    medians = {lb: float(np.median([r["formats"][lb]["sqnr_db"] for r in results]))
               for lb in labels}
    bits = {lb: float(np.mean([r["formats"][lb]["bits_per_weight"] for r in results]))
            for lb in labels}
    table.append(["median", ""] + [f"{medians[lb]:.2f}" for lb in labels])
    table.append(["bits/weight", ""] + [f"{bits[lb]:.3f}" for lb in labels])
    print(f"SQNR in dB of each tensor of {args.input} (higher is better)")
    _print_table(["tensor", "shape"] + labels, table)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"input": os.fspath(args.input), "tensors": results,
                       "median_sqnr_db": medians, "bits_per_weight": bits}, fh, indent=1)
    if args.plot:
        _plot(results, labels, medians, bits, args.plot, os.path.basename(args.input))
        if not args.quiet:
            print(f"wrote {args.plot}")
    return 0


def _plot(results, labels, medians, bits, path, title) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5),
                                      gridspec_kw={"width_ratios": [2, 1]})
    xs = np.arange(len(results))
    width = 0.8 / len(labels)
    for i, lb in enumerate(labels):
        left.bar(xs + (i - (len(labels) - 1) / 2) * width,
                 [r["formats"][lb]["sqnr_db"] for r in results], width, label=lb)
    left.set_xticks(xs, [r["tensor"] for r in results], rotation=45, ha="right",
                    fontsize=8)
    left.set_ylabel("SQNR (dB)")
    left.set_title(f"{title}: SQNR per tensor")
    left.set_ylim(top=left.get_ylim()[1] * 1.15)  # room for the legend above the bars
    left.legend(fontsize=8, ncol=len(labels), loc="upper left")
    left.grid(axis="y", alpha=0.3)
    for lb in labels:
        right.scatter(bits[lb], medians[lb], s=40)
        right.annotate(lb, (bits[lb], medians[lb]), textcoords="offset points",
                       xytext=(5, 3), fontsize=8)
    right.set_xlabel("bits per weight (codes + scales + codebook)")
    right.set_ylabel("median SQNR (dB)")
    right.set_title("accuracy against size")
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- entry ------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kbit", description="k-bit quantization of LLM "
                                 "weights: quantize checkpoints, inspect files, report accuracy.")
    sub = ap.add_subparsers(dest="command", required=True)

    def common(p, device=True):
        p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or summary")
        if device:
            p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")

    def weights(p):
        p.add_argument("--min-elements", type=int, default=256,
                       help="quantize float tensors of >= 2 dimensions with at least this "
                            "many elements (default 256)")
        p.add_argument("--absmax", default="e4m4", choices=["e4m4", "fp16", "fp32"],
                       help="kbit block scale format (default e4m4)")
        p.add_argument("--blocksize", type=int, default=64, help="NF4/FP4 block size")

    q = sub.add_parser("quantize", help="quantize a safetensors checkpoint")
    q.add_argument("input")
    q.add_argument("-o", "--output", required=True)
    q.add_argument("--k", type=int, default=4, help="kbit bits per weight, 2..5 (default 4)")
    q.add_argument("--format", default="kbit", choices=["kbit", "nf4", "fp4"])
    q.add_argument("--codebook", default=None,
                   help="kbit codebook: normal (default), nf0, uniform, fit or auto")
    q.add_argument("--double-quant", action="store_true",
                   help="NF4/FP4: quantize the block scales too (bitsandbytes' nested state)")
    weights(q)
    common(q)
    q.set_defaults(run=cmd_quantize)

    d = sub.add_parser("dequantize", help="a kbit checkpoint back to plain float tensors")
    d.add_argument("input")
    d.add_argument("-o", "--output", required=True)
    d.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                   help="output type (default: each tensor's original type)")
    common(d)
    d.set_defaults(run=cmd_dequantize)

    i = sub.add_parser("inspect", help="tensors, types and sizes of a safetensors or GGUF file")
    i.add_argument("file")
    i.set_defaults(run=cmd_inspect)

    r = sub.add_parser("report", help="SQNR and bits per weight of each format on each tensor")
    r.add_argument("input")
    r.add_argument("--k", type=int, nargs="+", default=[2, 3, 4, 5])
    r.add_argument("--codebook", default="auto",
                   help="kbit codebook for the report (default auto)")
    r.add_argument("--compare", nargs="*", default=["nf4"], choices=["nf4", "fp4"],
                   help="bitsandbytes formats to compare with (default nf4)")
    r.add_argument("--plot", help="write a PNG plot here")
    r.add_argument("--json", help="write the numbers as JSON here")
    weights(r)
    common(r)
    r.set_defaults(run=cmd_report)
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (KbitError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        print(f"kbit {args.command}: error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"kbit {args.command}: error: this command needs {e.name} "
              f"(pip install {e.name})", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `kbit inspect FILE | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

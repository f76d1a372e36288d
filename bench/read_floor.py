#!/usr/bin/env python3
"""The read floor: how long a kernel that does nothing but read a matmul's bytes takes on
this GPU, timed exactly as bench/bench_matmul.py times the matmul, and what that leaves of
the GEMV issue's m = 1 targets.

    python3 bench/read_floor.py [--lib PATH] [--json PATH] [--repeats 30]
        [--flush write|read] [--quick]
    python3 bench/read_floor.py --selftest        # the pure-Python parts, no GPU

Needs PyTorch with a CUDA device and the readers of bench/read_floor.cu built as a shared
library (CMake builds build/bench/libkbit_read_floor.so with CUDA on; --lib names another).

For each case (a format's bytes on a shape of the issue at m = 1: W as stored, x and y,
bench_matmul.case_bytes), every reader configuration reads that many bytes from one
buffer: `ldg` (16-byte loads, 1..8 in flight a thread, grid-stride, with cache hints) and
`bulk` (cp.async.bulk stages into a shared-memory ring, one thread a CTA, stages as even
shares, dealt round-robin or taken from a counter). Also timed: torch.sum over the same
bytes (bench_matmul's `read` column), a device-to-device copy, and cuBLAS fp16
(torch.matmul) on each shape at m = 1. The floor of a case is its fastest reader. The
targets table sets each m = 1 target's time (cuBLAS fp16 / target speedup, same run)
against that floor: `headroom` = target time / floor; below 1 means no kernel that reads
the bytes this way meets the target, however fast its decode.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_matmul import Timer, _fmt, case_bytes, measure_copy, write_json  # noqa: E402
from readers import Readers, ReaderError, config_name, floor_configs, reader_configs  # noqa: E402

# The GEMV issue's m = 1 targets (speedup over cuBLAS fp16) on its large shapes, and the
# one on 4096x4096.
LARGE_SHAPES = [(28672, 8192), (8192, 28672)]
TARGETS = {"kbit2-tiled": 6.0, "kbit3-tiled": 4.5, "kbit4-tiled": 3.5, "kbit5-tiled": 2.85,
           "nf4-tiled": 3.3, "q4_0": 3.3, "q4_k": 3.3, "q5_k": 2.7, "q6_k": 2.25, "q8_0": 1.75}
SMALL_TARGETS = {((4096, 4096), "kbit4-tiled"): 2.5}

def cases(quick: bool = False) -> list[dict]:
    """(format, shape, bytes) of every target, plus dense fp16 on each shape."""
    shapes = LARGE_SHAPES + [(4096, 4096)]
    if quick:
        shapes = shapes[:1] + [(4096, 4096)]
    out = []
    for n_out, k_in in shapes:
        fmts = list(TARGETS) if (n_out, k_in) in LARGE_SHAPES else ["kbit4-tiled"]
        for fmt in fmts + [None]:
            out.append({"format": fmt or "fp16", "shape": f"{n_out}x{k_in}",
                        "bytes": case_bytes(fmt, n_out, k_in, 1, 2)["total"]})
    return out


def target_rows(results: list[dict], cublas: dict) -> list[dict]:
    """Each target's time against its case's floor (same run)."""
    rows = []
    for r in results:
        shape = tuple(int(v) for v in r["shape"].split("x"))
        target = (TARGETS.get(r["format"]) if shape in LARGE_SHAPES
                  else SMALL_TARGETS.get((shape, r["format"])))
        cub = cublas.get(r["shape"])
        if not target or not cub or not r.get("floor_us"):
            continue
        t_us = cub / target
        rows.append({"format": r["format"], "shape": r["shape"], "target": target,
                     "cublas_us": cub, "target_us": t_us, "floor_us": r["floor_us"],
                     "floor_speedup": cub / r["floor_us"], "headroom": t_us / r["floor_us"],
                     "floor_by": r["floor_by"]})
    return rows


def fit_floor(results: list[dict], min_bytes: float = 30e6):
    """Least-squares time = a + bytes / rate over the cases of min_bytes or more:
    (a in us, rate in TB/s), or None."""
    pts = [(r["bytes"], r["floor_us"]) for r in results
           if r.get("floor_us") and r["bytes"] >= min_bytes]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx = sum(b for b, _ in pts) / n
    my = sum(t for _, t in pts) / n
    sxx = sum((b - mx) ** 2 for b, _ in pts)
    if sxx == 0:
        return None
    slope = sum((b - mx) * (t - my) for b, t in pts) / sxx  # us a byte
    return my - slope * mx, 1e-6 / slope if slope > 0 else None


def format_tables(results: list[dict], rows: list[dict], fit) -> str:
    lines = [f"{'case':>24} {'MB':>7} {'floor us':>9} {'TB/s':>5} {'sum us':>8} "
             f"{'floor by':<40}"]
    for r in results:
        tb = r["bytes"] / r["floor_us"] / 1e6 if r.get("floor_us") else None
        lines.append(f"{r['format'] + ' ' + r['shape']:>24} {r['bytes'] / 1e6:7.1f} "
                     f"{_fmt(r.get('floor_us'), '9.1f')} {_fmt(tb, '5.2f')} "
                     f"{_fmt(r.get('sum_us'), '8.1f')} {r.get('floor_by', '-'):<40}")
    if fit:
        lines.append(f"fit over the cases of 30 MB or more: floor = {fit[0]:.1f} us + bytes / "
                     f"{_fmt(fit[1], '.2f')} TB/s")
    lines.append("")
    lines.append(f"{'target':>24} {'x':>5} {'cuBLAS':>7} {'target us':>9} {'floor us':>9} "
                 f"{'floor x':>7} {'headroom':>8}")
    for t in rows:
        lines.append(f"{t['format'] + ' ' + t['shape']:>24} {t['target']:5.2f} "
                     f"{t['cublas_us']:7.1f} {t['target_us']:9.1f} {t['floor_us']:9.1f} "
                     f"{t['floor_speedup']:7.2f} {t['headroom']:8.3f}")
    return "\n".join(lines)


def run(args) -> int:
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("read_floor: PyTorch sees no CUDA device")
    try:
        readers = Readers(torch, args.lib)
    except FileNotFoundError as e:
        raise SystemExit(f"read_floor: {e} or pass --lib")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    sms = readers.sms
    timer = Timer(torch, args.repeats, args.budget, args.flush)
    todo = cases(args.quick)
    biggest = max(c["bytes"] for c in todo)
    biggest += -biggest % 16
    buf = torch.empty(biggest, dtype=torch.uint8, device="cuda")
    buf.random_(0, 255)
    configs = reader_configs(sms, args.quick)

    copy_tbps = measure_copy(torch, timer, args.repeats)["gbps"] / 1e3
    print(f"device: {props.name} ({sms} SMs), copy {copy_tbps:.2f} TB/s (read + write)",
          file=sys.stderr)

    cublas = {}
    for shape in sorted({c["shape"] for c in todo}):
        n_out, k_in = (int(v) for v in shape.split("x"))
        w = torch.randn(n_out, k_in, device="cuda", dtype=torch.float16).mul_(0.02)
        x = torch.randn(1, k_in, device="cuda", dtype=torch.float16)
        cublas[shape] = timer.measure(lambda: torch.matmul(x, w.t()))["median_us"]
        del w, x

    results, measured = [], {}  # measured: the readers' times by byte count
    for c in todo:
        nbytes = c["bytes"] - c["bytes"] % 16
        if nbytes in measured:  # the same bytes on the other large shape
            results.append(dict(c, **measured[nbytes]))
            continue
        f = readers.floor(timer, buf.data_ptr(), nbytes, configs,
                          log=lambda msg: print(msg, file=sys.stderr))
        if "error" in f:
            print(f"read_floor: {c['format']} {c['shape']}: {f['error']}", file=sys.stderr)
            return 1
        r = dict(c, readers=f["readers"])
        fl = buf[:nbytes // 4 * 4].view(torch.float32)
        r["sum_us"] = timer.measure(lambda: fl.sum())["median_us"]
        if f["by"]:
            r["floor_by"], r["floor_us"] = f["by"], f["median_us"]
        results.append(r)
        measured[nbytes] = {k: r[k] for k in ("readers", "sum_us", "floor_by", "floor_us") if k in r}
        print(f"{c['format']} {c['shape']}: floor {r.get('floor_us', 0):.1f} us "
              f"({r.get('floor_by')}), torch.sum {r['sum_us']:.1f}", file=sys.stderr)

    rows = target_rows(results, cublas)
    fit = fit_floor(results)
    print(f"device: {props.name}, {sms} SMs; copy {copy_tbps:.2f} TB/s; flush {args.flush}; "
          f"cuBLAS fp16 m = 1: " + ", ".join(f"{k} {v:.1f} us" for k, v in cublas.items()))
    print(format_tables(results, rows, fit))
    # every reader's median on the largest weight-only case, to see which one wins where
    big = max(results, key=lambda r: r["bytes"] if r["format"] != "fp16" else 0)
    print(f"\nreaders on {big['format']} {big['shape']} ({big['bytes'] / 1e6:.1f} MB):")
    for k, v in sorted(big["readers"].items(), key=lambda kv: kv[1] or 1e30):
        print(f"  {_fmt(v, '8.1f')} us  {k}")
    if args.json:
        write_json(args.json, {
            "device": props.name, "sms": sms, "date": datetime.datetime.now().isoformat(),
            "host": platform.node(), "torch": torch.__version__, "lib": readers.path,
            "flush": args.flush, "repeats": args.repeats, "copy_tbps": copy_tbps,
            "cublas_fp16_m1_us": cublas, "cases": results, "targets": rows,
            "fit": {"fixed_us": fit[0], "tbps": fit[1]} if fit else None,
            "configs": configs})
    return 0


def selftest() -> int:
    cs = cases()
    assert len(cs) == 2 * (len(TARGETS) + 1) + 2, len(cs)
    assert all(c["bytes"] % 2 == 0 for c in cs)
    k4 = next(c for c in cs if c["format"] == "kbit4-tiled" and c["shape"] == "28672x8192")
    assert 124e6 < k4["bytes"] < 126e6, k4  # 4.25 bits a weight, plus x and y
    res = [{"format": "q4_0", "shape": "28672x8192", "bytes": 132e6, "floor_us": 50.0,
            "floor_by": "x"},
           {"format": "fp16", "shape": "28672x8192", "bytes": 470e6, "floor_us": 160.0,
            "floor_by": "x"}]
    rows = target_rows(res, {"28672x8192": 176.0})
    assert len(rows) == 1 and abs(rows[0]["target_us"] - 176.0 / 3.3) < 1e-9
    assert abs(rows[0]["headroom"] - 176.0 / 3.3 / 50.0) < 1e-9
    a, rate = fit_floor(res)
    assert abs(a - (50.0 - 132e6 * 110.0 / 338e6)) < 1e-6 and abs(rate - 338e6 / 110.0 / 1e6) < 1e-9
    names = {config_name(c) for c in reader_configs(132)}
    assert len(names) == len(reader_configs(132)), "config names unique"
    assert {config_name(c) for c in floor_configs(132)} <= names, "bench_matmul's floor readers"
    selftest_floor()
    print(format_tables(res, rows, (a, rate)))
    print("selftest passed")
    return 0


def selftest_floor():
    """Readers.floor without a GPU: a refused reader is None, the fastest timed one is the
    floor, counters left set are an error (and zeroed)."""
    import types
    cfgs = floor_configs(132)
    times = {config_name(c): 50.0 + i for i, c in enumerate(cfgs)}
    times[config_name(cfgs[0])] = None  # refused
    counters = types.SimpleNamespace(left=0)
    counters.sum = lambda: counters.left
    counters.zero_ = lambda: setattr(counters, "left", 0)
    rd = Readers.__new__(Readers)
    rd.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None))
    rd.counters = counters

    def call(c, ptr, nbytes):
        if times[config_name(c)] is None:
            raise ReaderError("refused")
        return config_name(c)
    rd.call = call
    timer = types.SimpleNamespace(measure=lambda name: {"median_us": times[name]})
    refused = []
    f = rd.floor(timer, 0, 1000, cfgs, log=refused.append)
    assert f["by"] == config_name(cfgs[1]) and f["median_us"] == 51.0, f
    assert f["readers"] == times and len(refused) == 1 and "error" not in f
    counters.left = 3
    f = rd.floor(timer, 0, 1000, cfgs)
    assert "error" in f and "by" not in f and counters.left == 0, f


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", help="the readers' shared library (default: BUILD/bench/...)")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds of timing a case")
    ap.add_argument("--flush", choices=("write", "read"), default="write")
    ap.add_argument("--quick", action="store_true", help="fewer cases and readers")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args(argv)
    return selftest() if args.selftest else run(args)


if __name__ == "__main__":
    sys.exit(main())

"""bench/compare_matmul.py and bench/results_table.py: the tables bench/RESULTS.md is
written from, on small runs written here (plain and gzipped JSON)."""
import gzip
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, requires_gpu


def _row(shape, fmt, m, us, speedup, read=None):
    n_out, k_in = map(int, shape.split("x"))
    r = {"n_out": n_out, "k_in": k_in, "shape": shape, "format": fmt, "m": m,
         "kbit": {"median_us": us}, "speedup_cublas": speedup}
    if read is not None:
        r["read"] = {"median_us": read}
    return r


def _write(path, rows):
    text = json.dumps({"rows": rows})
    if path.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        with open(path, "w") as f:
            f.write(text)


def _run_compare(*paths):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "compare_matmul.py"),
                           *paths], capture_output=True, text=True, timeout=60)


def _compare(*paths):
    out = _run_compare(*paths)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_compare_matmul_side_by_side(tmp_path):
    a, b = str(tmp_path / "base-1.json"), str(tmp_path / "new-1.json.gz")
    _write(a, [_row("4096x4096", "kbit4-tiled", 1, 10.64, 2.06, read=12.7),
               _row("8192x28672", "q4_0", 1, 60.44, 2.89, read=60.5),
               _row("8192x28672", "q4_0", 8, 63.0, 2.78)])
    _write(b, [_row("8192x28672", "q4_0", 1, 55.31, 3.16),
               _row("8192x28672", "q4_0", 8, 62.68, 2.80),
               _row("8192x28672", "q4_k", 1, 57.0, 3.06, read=60.4)])
    lines = _compare(a, b)
    assert lines[0] == "shape format m | read | base-1 | new-1"
    # sorted by shape, format, m; the read floor from the first run that has one; "-"
    # where a run lacks the case
    assert lines[1:] == [
        "4096x4096 kbit4-tiled 1 | 12.7 | 10.6 (2.06x) | -",
        "8192x28672 q4_0 1 | 60.5 | 60.4 (2.89x) | 55.3 (3.16x)",
        "8192x28672 q4_0 8 | - | 63.0 (2.78x) | 62.7 (2.80x)",
        "8192x28672 q4_k 1 | 60.4 | - | 57.0 (3.06x)",
    ]


def test_compare_matmul_failed_case_and_missing_file(tmp_path):
    a = str(tmp_path / "run.json")
    row = _row("4096x4096", "q8_0", 1, None, None)  # a case that failed: no time
    _write(a, [row])
    assert _compare(a)[1] == "4096x4096 q8_0 1 | - | -"
    out = _run_compare(str(tmp_path / "absent.json"))
    assert out.returncode != 0 and "absent.json" in out.stderr


def test_results_table_reads_gzipped_runs(tmp_path):
    """results_table.py on a kbit_bench run, plain and gzipped: the same table."""
    cfg = "kbit K=4 fp16 absmax=e4m4"
    rows = [{"family": "kbit", "op": op, "config": cfg, "n": 1 << 20, "pct_copy": pct,
             "time_us": us, "copy_gbps": 2970.4}
            for op, pct, us in (("quantize", 24.7, 835.94), ("dequantize", 96.0, 214.81))]
    rows.append({"family": "gguf", "op": "dequantize", "config": "Q4_K fp16", "n": 1 << 20,
                 "pct_copy": 93.5, "time_us": 12.34, "copy_gbps": 2970.4})
    data = {"device": "a GPU", "rows": rows}
    plain, packed = str(tmp_path / "run.json"), str(tmp_path / "run.json.gz")
    with open(plain, "w") as f:
        json.dump(data, f)
    with gzip.open(packed, "wt") as f:
        json.dump(data, f)
    tool = os.path.join(ROOT, "bench", "results_table.py")
    outs = [subprocess.run([sys.executable, tool, p, "--n", "20"], capture_output=True,
                           text=True, timeout=60) for p in (plain, packed)]
    assert all(o.returncode == 0 for o in outs), [o.stderr for o in outs]
    assert outs[0].stdout == outs[1].stdout
    lines = outs[0].stdout.splitlines()
    assert lines[0] == "Device: a GPU; n = 2^20."
    assert "| fp16 | 4 | e4m4 | 835.9 | 24.7% | 214.8 | 96.0% | 2970 |" in lines
    assert "| gguf | dequantize | Q4_K fp16 | 12.3 | 93.5% |" in lines


def test_bench_host_matmul_runs(tmp_path):
    # the CPU matmul benchmark on a small weight: its table and JSON, one row per case
    path = str(tmp_path / "host.json")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_host_matmul.py"),
                          "--shape", "40x256", "--k", "2,5", "--m", "1,3", "--dtype", "fp16,fp32",
                          "--repeats", "2", "--json", path],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "CPU matmul, 40x256" in out.stdout
    with open(path) as f:
        rows = json.load(f)["rows"]
    assert [(r["k"], r["dtype"], r["m"]) for r in rows] == [
        (k, d, m) for k in (2, 5) for d in ("fp16", "fp32") for m in (1, 3)]
    assert all(r["kbit_ms"] > 0 and r["gbps"] > 0 and r["numpy_fp32_ms"] > 0 for r in rows)


def test_read_floor_selftest():
    # bench/read_floor.py's pure-Python parts: its cases' bytes, the targets against the
    # floor, the floor's fit (the readers themselves run on a GPU only)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "read_floor.py"),
                          "--selftest"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "selftest passed" in out.stdout
    assert "q4_0 28672x8192  3.30   176.0      53.3      50.0    3.52    1.067" in out.stdout


@requires_gpu
def test_gpu_readers(tmp_path):
    # bench/readers.py's read-only kernels on the GPU: every configuration read_floor.py
    # tries runs (none refused on compute capability 9.0, the bulk readers refused
    # elsewhere), the counter walk leaves its counters zeroed, bad sizes are refused with
    # ReaderError, and bench_matmul's %floor column comes from them
    import torch
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from bench_matmul import Timer
    from readers import ReaderError, Readers, config_name, floor_configs, reader_configs
    try:
        readers = Readers(torch)
    except FileNotFoundError as e:
        pytest.skip(f"the read floor's readers are not built: {e}")
    buf = torch.ones((3 << 20) + 56, dtype=torch.uint8, device="cuda")  # not a whole stage
    configs = reader_configs(readers.sms)
    hopper = torch.cuda.get_device_capability()[0] >= 9
    got = readers.floor(Timer(torch, repeats=3, budget_s=0.05), buf.data_ptr(), buf.numel(),
                        configs)
    assert "error" not in got, got
    assert set(got["readers"]) == {config_name(c) for c in configs}
    for c in configs:
        t = got["readers"][config_name(c)]
        if c["kind"] == "bulk" and not hopper:
            assert t is None, c
        else:
            assert t is not None and t > 0, c
    assert got["by"] in got["readers"] and got["median_us"] == got["readers"][got["by"]]
    assert int(readers.counters.sum()) == 0
    for c in floor_configs(readers.sms):
        with pytest.raises(ReaderError, match="invalid value"):
            readers.call(c, buf.data_ptr(), 40)()  # not a multiple of 16
    with pytest.raises(ReaderError, match="invalid value"):
        readers.call({**floor_configs(readers.sms)[0], "ring": 17}, buf.data_ptr(), 4096)()
    torch.cuda.synchronize()

    path = str(tmp_path / "bm.json")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_matmul.py"),
                          "--no-bnb", "--repeats", "3", "--shapes", "256x512", "--m", "1",
                          "--formats", "kbit4", "--readers", readers.path, "--json", path],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    with open(path) as f:
        doc = json.load(f)
    assert doc["readers"] == readers.path
    (row,) = [r for r in doc["rows"] if r["format"] == "kbit4"]
    names = {config_name(c) for c in floor_configs(readers.sms)}
    assert row["floor"]["by"] in names and row["floor"]["median_us"] > 0
    assert row["pct_floor"] == pytest.approx(
        100.0 * row["floor"]["median_us"] / row["kbit"]["median_us"])
    assert row["floor_speedup_cublas"] == pytest.approx(
        row["cublas_us"] / row["floor"]["median_us"])


def _gpu_check(steps, dry=True, *args):
    env = {**os.environ, "GPU_CHECK_STEPS": steps}
    env.pop("SANITIZERS", None)
    if dry:
        env["GPU_CHECK_DRY_RUN"] = "1"
    return subprocess.run(["bash", os.path.join(ROOT, "bench", "gpu_check.sh"),
                           *(args or ("no-build",))],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def test_gpu_check_steps():
    # bench/gpu_check.sh's GPU_CHECK_STEPS: names and patterns choose steps in the check's
    # order (the check split over calls), patterns are not file names (cwd holds bench/),
    # and a word that matches no step is refused before anything runs
    def steps(words):
        out = _gpu_check(words)
        assert out.returncode == 0, out.stderr
        (line,) = [x for x in out.stdout.splitlines() if x.startswith("gpu-check steps:")]
        return line.split(":", 1)[1].split()
    every = steps("")
    assert every[:3] == ["build", "ctest", "pytest"] and every[-1] == "read-floor"
    assert len(every) == len(set(every)) == 14
    assert steps("*") == every
    assert steps("pytest build") == ["build", "pytest"]
    assert steps("build sanitize-*") == ["build"] + [
        f"sanitize-{t}" for t in ("memcheck", "racecheck", "initcheck", "synccheck")]
    assert steps("bench* read-floor") == ["bench", "bench-matmul", "read-floor"]
    for bad in ("build nosuch", "x*", "Pytest"):
        out = _gpu_check(bad, dry=False)  # not a dry run: refused before any step
        assert out.returncode == 2, (bad, out.stdout, out.stderr)
        assert f"no step matches '{bad.split()[-1]}'" in out.stderr
        assert "gpu-check steps" not in out.stdout and "==" not in out.stdout
    assert not os.path.exists(os.path.join(ROOT, "no-build"))


def test_gpu_check_runs_only_its_steps(tmp_path):
    # a real (not dry) run of one step: that step runs, and only it (read_floor.py, on a
    # build with no readers: a failed step, reported as such)
    build, out_dir = str(tmp_path / "build"), str(tmp_path / "out")
    out = _gpu_check("read-floor", False, build, out_dir)
    started = [x.split(":")[0] for x in out.stdout.splitlines() if x.startswith("== ")]
    assert started == ["== read-floor"], out.stdout
    assert out.returncode == 1 and "gpu-check FAILED: read-floor" in out.stdout
    assert sorted(os.listdir(out_dir)) == ["device.txt", "read-floor.log"]

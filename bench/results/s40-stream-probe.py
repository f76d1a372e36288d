#!/usr/bin/env python3
"""Dev probe: what the streamed tiled GEMV's walk (runs of a row tile's stages, dealt
round-robin; W and scales from two regions) and its release protocol (16 consumer warps,
every lane arriving) cost a read-only reader, against the floor's round-robin of single
stages. python3 runs.py LIB"""
import ctypes, json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from bench_matmul import Timer  # noqa: E402

lib = ctypes.CDLL(sys.argv[1])
timer = Timer(torch, 30, 20.0)
sms = torch.cuda.get_device_properties(0).multi_processor_count
sink = torch.zeros(sms, dtype=torch.int32, device="cuda")
out = []
MODES = {0: "producer only", 1: "consumers, every lane releases", 2: "consumers, a lane a warp",
         3: "consumers, a lane a warp polls and releases"}
# (label, W bytes a stage, scale bytes a stage, stages, [(mode, run, ring)]): K = 4 E4M4 on
# the large shapes (16 units of 16 rows x 128 k: 16 KB of W, 1 KB of scales; 7168 stages;
# a row tile 4 stages on 28672x8192, 14 on 8192x28672), K = 2 (8 KB + 1 KB), 4096x4096 K = 4
# (512 stages, 2 a tile)
CASES = [("K4", 16384, 1024, 7168, [(0, 4, 8), (1, 4, 8), (3, 4, 8), (1, 4, 11), (3, 4, 11),
                                      (0, 4, 11)]),
         ("K2", 8192, 1024, 7168, [(0, 4, 12), (1, 4, 12), (3, 4, 12), (1, 4, 16), (3, 4, 16)]),
         ("K4-4096", 16384, 1024, 512, [(0, 2, 8), (1, 2, 8), (3, 2, 8)])]
for label, wb, sb, stages, configs in CASES:
    w = torch.empty(stages * wb, dtype=torch.uint8, device="cuda")
    s = torch.empty(max(stages * sb, 16), dtype=torch.uint8, device="cuda")
    for mode, run, ring in configs * 2:  # twice, alternated
        def fn():
            rc = lib.runs_read(ctypes.c_void_p(w.data_ptr()), ctypes.c_void_p(s.data_ptr()),
                               ctypes.c_int64(stages), wb, sb, run, ring, sms, mode,
                               ctypes.c_void_p(sink.data_ptr()),
                               ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            assert rc == 0, rc
        t = timer.measure(fn)
        mb = stages * (wb + sb) / 1e6
        r = {"case": label, "mode": mode, "run": run, "ring": ring, "MB": mb,
             "us": t["median_us"], "min_us": t["min_us"], "TBps": mb / t["median_us"]}
        out.append(r)
        print(f"{label:12s} mode {mode} run {run:3d} ring {ring:2d} {mb:7.1f} MB "
              f"{t['median_us']:7.2f} us (min {t['min_us']:6.2f}) {r['TBps']:.3f} TB/s  "
              f"{MODES[mode]}", flush=True)
json.dump(out, open(os.environ.get("OUT", "/tmp") + "/runs.json", "w"), indent=1)

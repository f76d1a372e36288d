"""The rooms of csrc/ (ARCHITECTURE.md): core includes nothing above it, formats only core,
host and nogpu never a kernel room, a .cu/.cuh file or the CUDA runtime, and no room
includes a .cu file."""
import os
import re

from conftest import ROOT

CSRC = os.path.join(ROOT, "csrc")
# which rooms a file in each room may include (besides its own room and the public header)
ALLOWED = {"core": set(), "formats": {"core"}, "quant": {"core", "formats"},
           "matmul": {"core", "formats"}, "host": {"core", "formats"},
           "nogpu": {"core", "formats"}}
INCLUDE = re.compile(r'^\s*#\s*include\s+["<]([^">]+)[">]', re.M)


def test_every_include_stays_in_its_room_or_below():
    seen = 0
    for room in os.listdir(CSRC):
        folder = os.path.join(CSRC, room)
        if not os.path.isdir(folder):
            continue
        assert room in ALLOWED, f"csrc/{room} is not a room of ARCHITECTURE.md"
        for name in os.listdir(folder):
            text = open(os.path.join(folder, name), errors="replace").read()
            for inc in INCLUDE.findall(text):
                where = f"csrc/{room}/{name} includes {inc}"
                assert not inc.endswith(".cu"), where
                if room in ("host", "nogpu", "core", "formats") and not name.endswith((".cu", ".cuh")):
                    assert not inc.endswith(".cuh") and "cuda_runtime" not in inc, where
                parts = os.path.normpath(os.path.join(room, inc)).split(os.sep)
                if inc.startswith("../"):
                    target = parts[0]
                    assert target in ALLOWED[room], where
                    seen += 1
    assert seen > 30  # the rule was applied to the real includes


def test_wgmma_wrappers_match_their_generator():
    """csrc/matmul/wgmma.cuh is tools/gen_wgmma.py's output, unedited."""
    import subprocess
    import sys
    gen = os.path.join(ROOT, "tools", "gen_wgmma.py")
    assert subprocess.run([sys.executable, gen, "--check"]).returncode == 0, \
        "csrc/matmul/wgmma.cuh differs from tools/gen_wgmma.py's output: rerun it"

#!/usr/bin/env bash
# The GPU check (make gpu-check): build for sm_90, every test with the GPU on,
# compute-sanitizer on small cases (every tool), the matmul tests on emulated smaller GPUs,
# the demo, then the benchmarks.
# Every step runs even if an earlier one failed; logs go to $OUT; exits non-zero if any
# step failed. Usage: bench/gpu_check.sh BUILD_DIR OUT_DIR BENCH_SIZES
# GPU_CHECK_STEPS: the steps to run, names or shell patterns (default: all), so that the
# check can be split over calls shorter than the whole, e.g. "build ctest pytest", then
# "build memcheck racecheck sanitize-* emulated", then "build demo bench* read-floor" (build first
# in each: on the same machine it finds the build done). GPU_CHECK_DRY_RUN=1 lists the
# steps chosen and runs none.
set -uo pipefail
BUILD=${1:-build} OUT=${2:-$BUILD/gpu-check} SIZES=${3:-20,24,26,28}
PYTHON=${PYTHON:-python3}
SANITIZERS=${SANITIZERS:-memcheck racecheck initcheck synccheck}
ALL=(build ctest pytest memcheck racecheck)
for tool in $SANITIZERS; do ALL+=("sanitize-$tool"); done
ALL+=(emulated demo bench bench-matmul read-floor)
# shellcheck disable=SC2053  # $2 is a pattern on purpose
matches() { [[ $1 == $2 ]]; }
declare -A picked=()
set -f  # the patterns as words, not file names
for pattern in ${GPU_CHECK_STEPS:-*}; do
    matched=0
    for name in "${ALL[@]}"; do
        if matches "$name" "$pattern"; then picked[$name]=1 matched=1; fi
    done
    if [ $matched = 0 ]; then
        echo "gpu-check: GPU_CHECK_STEPS: no step matches '$pattern' (steps: ${ALL[*]})" >&2
        exit 2
    fi
done
set +f
chosen=()  # in the check's order
for name in "${ALL[@]}"; do [ -n "${picked[$name]:-}" ] && chosen+=("$name"); done
echo "gpu-check steps: ${chosen[*]}"
if [ -n "${GPU_CHECK_DRY_RUN:-}" ]; then exit 0; fi
mkdir -p "$OUT"
# A GPU machine without network: take the gguf package from .whl (make device-wheels).
if ! "$PYTHON" -c "import gguf" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --target /tmp/kbit-site .whl/*.whl &&
        export PYTHONPATH=/tmp/kbit-site${PYTHONPATH:+:$PYTHONPATH}
fi
failed=()
step() {  # step NAME COMMAND...: runs COMMAND, logs to $OUT/NAME.log
    local name=$1; shift
    [ -n "${picked[$name]:-}" ] || return 0
    echo "== $name: $*"
    local start=$SECONDS
    if ! "$@" > "$OUT/$name.log" 2>&1; then failed+=("$name"); echo "   FAILED (see $OUT/$name.log)"; fi
    tail -n 3 "$OUT/$name.log"
    echo "   ($((SECONDS - start)) s)"
}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > "$OUT/device.txt" 2>&1
step build make build BUILD="$BUILD" CUDA_ARCHS=90
step ctest ctest --test-dir "$BUILD" --output-on-failure
step pytest "$PYTHON" -m pytest tests -q -rs
step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$BUILD/bench/kbit_bench" --check-only --small
step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$BUILD/bench/kbit_bench" --check-only --small
# Every kernel at odd sizes under memcheck, racecheck, initcheck and synccheck
# (make sanitize: tests/test_sanitize_gpu.py), one log per tool.
for tool in $SANITIZERS; do
    step "sanitize-$tool" make sanitize BUILD="$BUILD" SANITIZERS="$tool"
done
# The launchers' paths of an A100 and of a 99 KB sm_86 / 89 GPU, emulated on this one
step emulated make emulated-check BUILD="$BUILD" CUDA_ARCHS=90
step demo make demo BUILD="$BUILD"
step bench "$BUILD/bench/kbit_bench" --sizes "$SIZES" --json "$OUT/bench.json"
# shellcheck disable=SC2086  # BENCH_MATMUL_ARGS: words
step bench-matmul "$PYTHON" bench/bench_matmul.py --json "$OUT/bench_matmul.json" ${BENCH_MATMUL_ARGS:-}
step read-floor "$PYTHON" bench/read_floor.py --lib "$BUILD/bench/libkbit_read_floor.so" --json "$OUT/read_floor.json"
if [ ${#failed[@]} -ne 0 ]; then echo "gpu-check FAILED: ${failed[*]}"; exit 1; fi
if [ ${#chosen[@]} -lt ${#ALL[@]} ]; then
    echo "gpu-check passed: ${#chosen[@]} of ${#ALL[@]} steps (GPU_CHECK_STEPS=${GPU_CHECK_STEPS:-})"
else
    echo "gpu-check passed"
fi

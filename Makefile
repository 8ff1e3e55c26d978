# The README's commands. Each installs what is missing first.
#   make demo   build, index Fashion-MNIST, start knnd, answer a query, stop
#   make test   build and run the test suite
#   make test-asan / test-tsan / fuzz   the suite under sanitizers, fuzzers
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
DEMO_DIR ?= demo
DEMO_ADDR ?= 127.0.0.1:50051
DEMO_METRICS ?= 127.0.0.1:9090
FASHION := /usr/share/datasets/fashion-mnist

DEBIAN_PACKAGES := cmake g++ make pkg-config git zlib1g-dev \
  libfaiss-dev libopenblas-dev libgrpc++-dev libprotobuf-dev \
  protobuf-compiler protobuf-compiler-grpc libabsl-dev libspdlog-dev \
  prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev \
  python3-faiss python3-grpcio python3-protobuf python3-numpy \
  prometheus dataset-fashion-mnist \
  python3-venv python3-pip python3-setuptools python3-wheel \
  python3-yaml python3-kubernetes patchelf \
  clang-14 libclang-rt-14-dev libomp-14-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps build test demo bench clean test-asan test-tsan fuzz

deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j 1

# The demo index is built once with knnd's own tool and measured once
# (recall table cached in $(DEMO_DIR)/eval.txt); knnd then serves it with the
# nprobe the measurement chose, answers real test images, and stops on SIGTERM.
demo: build
	@mkdir -p $(DEMO_DIR)
	@[ -f $(DEMO_DIR)/fashion-mnist.index ] || { rm -f $(DEMO_DIR)/eval.txt; $(BUILD)/knnctl build \
	  --input $(FASHION)/train-images-idx3-ubyte.gz --output $(DEMO_DIR)/fashion-mnist.index; }
	@[ -f $(DEMO_DIR)/eval.txt ] || { $(BUILD)/knnctl eval --index $(DEMO_DIR)/fashion-mnist.index \
	  --queries $(FASHION)/t10k-images-idx3-ubyte.gz --base $(FASHION)/train-images-idx3-ubyte.gz \
	  --limit 2000 --nprobes 1,2,4,8,16,32,64,128 > $(DEMO_DIR)/eval.txt.tmp && \
	  mv $(DEMO_DIR)/eval.txt.tmp $(DEMO_DIR)/eval.txt; }
	@cat $(DEMO_DIR)/eval.txt
	@nprobe=$$(awk '/^chosen nprobe:/ {print $$3}' $(DEMO_DIR)/eval.txt); \
	  $(BUILD)/knnd --index $(DEMO_DIR)/fashion-mnist.index --listen $(DEMO_ADDR) \
	    --metrics_listen $(DEMO_METRICS) & pid=$$!; \
	  trap "kill -TERM $$pid 2>/dev/null; wait $$pid" EXIT; \
	  for i in $$(seq 300); do $(BUILD)/knnctl health --addr $(DEMO_ADDR) >/dev/null 2>&1 && break; sleep 0.2; done; \
	  $(BUILD)/knnctl info --addr $(DEMO_ADDR) | grep -E '^(metric|ntotal|index_type|factory|source|created):'; \
	  $(BUILD)/knnctl search --addr $(DEMO_ADDR) --k 5 --nprobe $$nprobe --limit 1000 --batch 100 \
	    --queries $(FASHION)/t10k-images-idx3-ubyte.gz

clean:
	rm -rf $(BUILD) $(DEMO_DIR)

# Benchmarks: figures for bench/RESULTS.md (seeded data; see that file).
bench: build
	$(BUILD)/bench/search_bench --n 200000 --d 128 --factory IVF1024,PQ32 \
	  --nprobe 16 --seconds 2 --index /tmp/knnd_bench_200k.index

# ---- Sanitizers and fuzzing (README "Testing") ----
# Each has its own build folder. Debian's FAISS, gRPC, protobuf and libgomp
# are not instrumented: tests/sanitizers holds the suppressions for their
# reports, one comment each; knnd's own code gets none.
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
SAN_DIR := $(CURDIR)/tests/sanitizers
# Under ASan everything runs except the tests of packaging (pip venv, the
# Docker runtime folder, manifests): they run no knnd code path that the
# plain suite does not, and the runtime folder cannot carry libasan.
ASAN_EXCLUDE ?= ^(python_client|deploy_manifests|deploy_runtime)$$
ASAN_ENV := ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0:suppressions=$(SAN_DIR)/asan.supp \
  LSAN_OPTIONS=suppressions=$(SAN_DIR)/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$(SAN_DIR)/ubsan.supp
# The concurrency tests (binaries run directly): gate, batcher (+ worker
# pool), index manager / hot swap, server.
TSAN_TESTS ?= admission_gate_test batcher_test index_manager_test server_test
TSAN_ENV := TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0:suppressions=$(SAN_DIR)/tsan.supp
# TSan needs its fixed memory layout; newer kernels randomise mmap too much.
NO_ASLR := $(shell setarch $$(uname -m) -R true 2>/dev/null && echo "setarch $$(uname -m) -R")

test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DKNND_SANITIZE=address,undefined -DKNND_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && $(ASAN_ENV) ctest --output-on-failure -j 1 -E '$(ASAN_EXCLUDE)'

# abseil's source of the installed libabsl-dev version (Debian's archive,
# deb-src), its options.h replaced by the installed one so that the inline
# namespace and std:: choices match; see CMakeLists.txt.
ABSL_SRC := $(TSAN_BUILD)/absl-src
$(ABSL_SRC)/absl/synchronization/mutex.cc:
	@rm -rf $(ABSL_SRC) $(TSAN_BUILD)/absl-dl && mkdir -p $(TSAN_BUILD)/absl-dl $(ABSL_SRC)
	cd $(TSAN_BUILD)/absl-dl && apt-get source -qq --download-only \
	  abseil=$$(dpkg-query -W -f='$${Version}' libabsl-dev)
	tar xzf $(TSAN_BUILD)/absl-dl/abseil_*.orig.tar.gz -C $(ABSL_SRC) --strip-components=1
	cp /usr/include/absl/base/options.h $(ABSL_SRC)/absl/base/options.h

test-tsan: deps $(ABSL_SRC)/absl/synchronization/mutex.cc
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DKNND_SANITIZE=thread -DKNND_BUILD_BENCH=OFF \
	  -DKNND_TSAN_ABSL_SOURCE_DIR=$(CURDIR)/$(ABSL_SRC) >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TESTS)
	@for t in $(TSAN_TESTS); do echo "tsan: $$t"; \
	  OMP_NUM_THREADS=1 $(TSAN_ENV) $(NO_ASLR) $(TSAN_BUILD)/tests/$$t --gtest_brief=1 || exit 1; \
	done

# Each target runs FUZZ_SECONDS from its seeds (tests/fuzz/corpus/<target>,
# the index seeds generated by gen_seeds.py); new inputs go to a scratch
# corpus, crashes to $(FUZZ_BUILD)/artifacts. Fails on any finding.
FUZZ_TARGETS := search_request_fuzzer index_loader_fuzzer config_fuzzer
fuzz: deps
	@CC=clang-14 CXX=clang++-14 cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DKNND_FUZZ=ON -DKNND_BUILD_TESTS=OFF -DKNND_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(FUZZ_TARGETS)
	@tests/fuzz/run_fuzzers.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

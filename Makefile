# The README's commands. Each installs what is missing first.
#   make demo   build, index Fashion-MNIST, start knnd, answer a query, stop
#   make test   build and run the test suite
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
  python3-yaml python3-kubernetes patchelf libssl-dev openssl

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# FAISS_SIMD=avx2 links FAISS 1.7.3 rebuilt from Debian's source package with
# AVX2+FMA (deploy/docker/build.sh faiss, the Docker image's recipe), built
# once into FAISS_AVX2_PREFIX (10.5 minutes on a busy 2-core machine, then
# cached);
# FAISS_SIMD=generic links Debian's libfaiss. The default is avx2 where the
# CPU has AVX2 and FMA: it measured 2.1x to 2.6x faster (bench/RESULTS.md).
FAISS_SIMD ?= $(shell grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && echo avx2 || echo generic)
FAISS_AVX2_PREFIX ?= $(CURDIR)/.deps/faiss-avx2

.PHONY: deps faiss build test demo bench bench-rerank bench-memory clean

deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Built into PREFIX.tmp and renamed, so an interrupted build is redone.
faiss: deps
ifeq ($(FAISS_SIMD),avx2)
	@[ -f $(FAISS_AVX2_PREFIX)/include/faiss/Index.h ] || { \
	  echo "building FAISS with AVX2 into $(FAISS_AVX2_PREFIX) (once)"; \
	  rm -rf $(FAISS_AVX2_PREFIX).tmp && \
	  JOBS=$(JOBS) deploy/docker/build.sh faiss $(FAISS_AVX2_PREFIX).tmp && \
	  mv $(FAISS_AVX2_PREFIX).tmp $(FAISS_AVX2_PREFIX); }
endif

build: faiss
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DKNND_FAISS_SIMD=$(FAISS_SIMD) -DKNND_FAISS_AVX2_PREFIX=$(FAISS_AVX2_PREFIX) >/dev/null
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

# Benchmarks: every case of bench/RESULTS.md's `make bench` section in one
# run (seeded data under /tmp/knnd_bench, reused; about 30 minutes the first
# time on a busy 2-core machine, 10M vectors included), rewriting that
# section and bench/results.png.
# With FAISS_SIMD=avx2, build-generic (Debian's libfaiss) is built too, to
# measure the SIMD gain on the same benchmark. Needs root for the cold-start
# case (drop_caches).
BENCH_PACKAGES := python3-matplotlib
bench: build bench-rerank bench-memory
	@$(MAKE) --no-print-directory deps DEBIAN_PACKAGES="$(BENCH_PACKAGES)"
ifeq ($(FAISS_SIMD),avx2)
	@cmake -S . -B build-generic -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKNND_FAISS_SIMD=generic \
	  -DKNND_BUILD_TESTS=OFF >/dev/null
	@cmake --build build-generic -j $(JOBS) --target search_bench
	/usr/bin/python3 bench/run_bench.py --build $(BUILD) --generic-build build-generic
else
	/usr/bin/python3 bench/run_bench.py --build $(BUILD)
endif

# Exact re-ranking on Fashion-MNIST (bench/RESULTS.md, "Re-ranking"): knnd
# over gRPC vs python3-faiss IndexRefineFlat, recall, RSS split. The index is
# built once into /tmp/knnd_rerank_bench (about 20 min on 2 busy cores).
bench-rerank: build
	/usr/bin/python3 bench/rerank_bench.py --build $(BUILD) --nq 2000

# Memory benchmarks (bench/RESULTS.md "Memory"): seeded indexes built once
# under /tmp (never committed); PSS of 8 python3-faiss workers vs knnd,
# serving inside a cgroup v1 memory cgroup of half the file (root), anonymous
# RSS vs the heap model at 1M and 10M vectors, then the 1,000,000-search soak
# and a 2-minute overload with the p99 ratio asserted.
MEM_INDEX_1M = /tmp/knnd_bench_mem_1m.index
MEM_INDEX_10M = /tmp/knnd_bench_mem_10m.index
bench-memory: build
	OMP_NUM_THREADS=1 /usr/bin/python3 bench/memory/build_index.py --output $(MEM_INDEX_1M) \
	  --n 1000000 --dim 64 --factory IVF512,PQ64 --train 30000
	/usr/bin/python3 -W ignore bench/memory/memory_bench.py --knnd $(BUILD)/knnd \
	  --source-dir . --index $(MEM_INDEX_1M)
	OMP_NUM_THREADS=1 /usr/bin/python3 bench/memory/build_index.py --output $(MEM_INDEX_10M) \
	  --n 10000000 --dim 64 --factory IVF4096,PQ32 --train 200000
	/usr/bin/python3 -W ignore bench/memory/memory_bench.py --knnd $(BUILD)/knnd \
	  --source-dir . --index $(MEM_INDEX_10M) --cases model,cgroup
	/usr/bin/python3 -W ignore tests/python/memory_test.py --knnd $(BUILD)/knnd \
	  --source-dir . --soak-searches 1000000 --overload-seconds 120 --assert-p99 MemoryTest

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
  python3-yaml python3-kubernetes patchelf

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps build test demo bench bench-memory clean

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
bench: build bench-memory
	$(BUILD)/bench/search_bench --n 200000 --d 128 --factory IVF1024,PQ32 \
	  --nprobe 16 --seconds 2 --index /tmp/knnd_bench_200k.index

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

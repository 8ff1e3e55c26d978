# The README's commands. Each installs what is missing first.
#   make demo   build, index Fashion-MNIST, start knnd, answer a query, stop
#   make test   build and run the test suite
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
DEMO_DIR ?= demo
DEMO_ADDR ?= 127.0.0.1:50051
DEMO_METRICS ?= 127.0.0.1:9090

DEBIAN_PACKAGES := cmake g++ make pkg-config git zlib1g-dev \
  libfaiss-dev libopenblas-dev libgrpc++-dev libprotobuf-dev \
  protobuf-compiler protobuf-compiler-grpc libabsl-dev libspdlog-dev \
  prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev \
  python3-faiss python3-grpcio python3-protobuf python3-numpy \
  dataset-fashion-mnist

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps build test demo clean

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

demo: build
	@mkdir -p $(DEMO_DIR)
	@[ -f $(DEMO_DIR)/fashion-mnist.index ] || /usr/bin/python3 tests/tools/make_index.py \
	  --fashion-mnist --factory IVF256,PQ56 --nprobe 16 --output $(DEMO_DIR)/fashion-mnist.index
	@$(BUILD)/knnd --index $(DEMO_DIR)/fashion-mnist.index --listen $(DEMO_ADDR) & pid=$$!; \
	  trap "kill -TERM $$pid 2>/dev/null; wait $$pid" EXIT; \
	  for i in $$(seq 100); do $(BUILD)/knnctl health --addr $(DEMO_ADDR) >/dev/null 2>&1 && break; sleep 0.2; done; \
	  $(BUILD)/knnctl search --addr $(DEMO_ADDR) --k 5 --limit 1000 --batch 100 \
	    --queries /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz

clean:
	rm -rf $(BUILD) $(DEMO_DIR)

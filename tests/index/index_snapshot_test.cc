#include "knnd/index/index_snapshot.h"
#include "knnd/faiss/faiss_runtime.h"

#include <malloc.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <faiss/index_factory.h>
#include <faiss/index_io.h>
#include <faiss/utils/distances.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::IndexSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::ReferenceSearch;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

std::unique_ptr<IndexSnapshot> MustLoad(const std::string& path,
                                        LoadOptions options = {}) {
  auto loaded = IndexSnapshot::Load(path, options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? std::move(*loaded) : nullptr;
}

struct Results {
  std::vector<float> distances;
  std::vector<int64_t> ids;
};

Results Search(const IndexSnapshot& s, const std::vector<float>& queries, int k,
               int nprobe, std::vector<int64_t> allowed = {}) {
  Results r;
  const int64_t n = static_cast<int64_t>(queries.size()) / s.info().dim;
  r.distances.resize(n * k);
  r.ids.resize(n * k);
  SearchArgs args;
  args.queries = queries.data();
  args.num_queries = n;
  args.k = k;
  args.nprobe = nprobe;
  args.allowed_ids = allowed;
  args.distances = r.distances.data();
  args.ids = r.ids.data();
  absl::Status status = s.Search(args);
  EXPECT_TRUE(status.ok()) << status;
  return r;
}

void ExpectSameAsFaiss(const std::string& path, const IndexSpec& spec) {
  auto snapshot = MustLoad(path);
  ASSERT_NE(snapshot, nullptr);
  for (int nq : {1, 100}) {
    std::vector<float> queries = MakeData(nq, spec.d, 99);
    for (int nprobe : {1, 8}) {
      Results got = Search(*snapshot, queries, 10, nprobe);
      std::vector<float> want_d;
      std::vector<int64_t> want_i;
      ReferenceSearch(path, queries, 10, nprobe, &want_d, &want_i);
      EXPECT_EQ(got.ids, want_i) << "nq=" << nq << " nprobe=" << nprobe;
      EXPECT_THAT(got.distances,
                  ::testing::Pointwise(::testing::FloatNear(1e-3), want_d));
    }
  }
}

TEST(IndexSnapshot, L2ResultsEqualFaissOnTheSameFile) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("l2.index"), spec);
  ExpectSameAsFaiss(tmp.path("l2.index"), spec);
}

TEST(IndexSnapshot, InnerProductBehindOpqEqualsFaiss) {
  TempDir tmp;
  IndexSpec spec;
  spec.factory = "OPQ8,IVF32,PQ8";
  spec.inner_product = true;
  WriteIndex(tmp.path("ip.index"), spec);
  ExpectSameAsFaiss(tmp.path("ip.index"), spec);
  auto snapshot = MustLoad(tmp.path("ip.index"));
  EXPECT_EQ(snapshot->info().metric, Metric::kInnerProduct);
  EXPECT_TRUE(snapshot->info().has_pretransform);
}

TEST(IndexSnapshot, ReportsStructureAndMemory) {
  TempDir tmp;
  IndexSpec spec;
  spec.n = 3000;
  spec.d = 32;
  spec.factory = "IVF16,PQ4";
  spec.nprobe = 5;
  WriteIndex(tmp.path("a.index"), spec);
  auto s = MustLoad(tmp.path("a.index"));
  const IndexInfo& info = s->info();
  EXPECT_EQ(info.dim, 32);
  EXPECT_EQ(info.ntotal, 3000);
  EXPECT_EQ(info.nlist, 16);
  EXPECT_EQ(info.pq_m, 4);
  EXPECT_EQ(info.pq_nbits, 8);
  EXPECT_EQ(info.code_size_bytes, 4);
  EXPECT_EQ(info.stored_nprobe, 5);
  EXPECT_EQ(info.index_type, "IVF16,PQ4");
  EXPECT_EQ(info.mapped_list_bytes, 3000 * (4 + 8));
  // centroids 16*32*4 + codebooks 4*256*8*4 + precomputed 16*4*256*4
  EXPECT_EQ(info.precomputed_table_bytes, 16 * 4 * 256 * 4);
  EXPECT_EQ(info.heap_bytes, 16 * 32 * 4 + 256 * 32 * 4 + 16 * 4 * 256 * 4);
  LoadOptions no_table;
  no_table.use_precomputed_table = false;
  auto lean = MustLoad(tmp.path("a.index"), no_table);
  EXPECT_EQ(lean->info().precomputed_table_bytes, 0);
  // Same answers without the table.
  std::vector<float> q = MakeData(20, 32, 5);
  EXPECT_EQ(Search(*s, q, 5, 4).ids, Search(*lean, q, 5, 4).ids);
}

TEST(IndexSnapshot, AllowListReturnsOnlyAllowedIdsAndPadsTheRest) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("f.index"), spec);
  auto s = MustLoad(tmp.path("f.index"));
  std::vector<int64_t> allowed = {3, 17, 256, 1024, 4095};
  std::vector<float> q = MakeData(10, spec.d, 8);
  Results r = Search(*s, q, 8, static_cast<int>(s->info().nlist), allowed);
  const std::set<int64_t> ok(allowed.begin(), allowed.end());
  for (int i = 0; i < 10; ++i) {
    for (int j = 0; j < 8; ++j) {
      const int64_t id = r.ids[i * 8 + j];
      if (j < 5) {
        EXPECT_TRUE(ok.count(id)) << "query " << i << " got id " << id;
      } else {
        // Only 5 ids exist: the tail is padding.
        EXPECT_EQ(id, -1);
        EXPECT_EQ(r.distances[i * 8 + j], std::numeric_limits<float>::infinity());
      }
    }
  }
}

TEST(IndexSnapshot, MissingFileIsNotFound) {
  auto s = IndexSnapshot::Load("/nonexistent/x.index", {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("/nonexistent/x.index"));
}

TEST(IndexSnapshot, RefusesTypesItCannotServeAndSaysWhy) {
  TempDir tmp;
  struct Case {
    std::string factory;
    std::string why;
  } cases[] = {
      {"IVF32,PQ8x4fs", "FastScan"},
      {"IVF32,Flat", "IVF-PQ indexes only"},
      {"Flat", "not an inverted-file index"},
      {"HNSW8", "not an inverted-file index"},
  };
  for (const Case& c : cases) {
    IndexSpec spec;
    spec.n = 2000;
    spec.factory = c.factory;
    const std::string path = tmp.path("t.index");
    std::vector<float> x = MakeData(spec.n, spec.d, 1);
    std::unique_ptr<faiss::Index> index(
        faiss::index_factory(spec.d, c.factory.c_str()));
    index->train(spec.n, x.data());
    index->add(spec.n, x.data());
    faiss::write_index(index.get(), path.c_str());
    auto s = IndexSnapshot::Load(path, {});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument)
        << c.factory << ": " << s.status();
    EXPECT_THAT(s.status().message(), HasSubstr(c.why)) << c.factory;
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Loads `path` and searches it in a child process, so that a crash shows as
// a signal instead of killing the test. Returns the child's wait status.
int LoadAndSearchInChild(const std::string& path, bool probe) {
  pid_t pid = fork();
  if (pid == 0) {
    LoadOptions options;
    options.probe_in_subprocess = probe;
    auto s = IndexSnapshot::Load(path, options);
    if (s.ok()) {
      std::vector<float> q = MakeData(4, (*s)->info().dim, 3);
      std::vector<float> d(4 * 10);
      std::vector<int64_t> ids(4 * 10);
      SearchArgs args{q.data(), 4, 10, static_cast<int>((*s)->info().nlist),
                      {}, d.data(), ids.data()};
      (void)(*s)->Search(args);
      _exit(0);
    }
    _exit(s.status().message().empty() ? 3 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// While set, a child forked by this process exits at once (status 97).
std::atomic<bool> exit_in_forked_children{false};

// The probe is a new process image, not a fork of the caller: in a forked
// copy of a multi-threaded server, a lock another thread held at the fork
// stays held (the sanitizers' allocators hung CI that way). A fork would run
// the fork handler below; the probe must still answer, and still refuse a
// corrupt file with the reader's message.
TEST(IndexSnapshot, ProbeIsAFreshProcessNotAFork) {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] {
      if (exit_in_forked_children) _exit(97);
    });
    return true;
  }();
  ASSERT_TRUE(registered);
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("good.index"), spec);
  WriteFile(tmp.path("cut.index"),
            ReadFile(tmp.path("good.index")).substr(0, 40));
  LoadOptions options;
  options.probe_in_subprocess = true;
  exit_in_forked_children = true;
  auto good = IndexSnapshot::Load(tmp.path("good.index"), options);
  auto cut = IndexSnapshot::Load(tmp.path("cut.index"), options);
  exit_in_forked_children = false;
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->info().ntotal, spec.n);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
  EXPECT_THAT(cut.status().message(), HasSubstr("cut.index"));
}

// A probe that never answers (as on a filesystem that hangs) is killed once
// probe_timeout has passed, and the load fails with DEADLINE_EXCEEDED
// instead of waiting for ever; the probe is reaped. tests/test_main.cc makes
// the probe hang while KNND_TEST_PROBE_HANGS is set.
TEST(IndexSnapshot, ProbeThatNeverAnswersIsKilledAfterItsTimeout) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("good.index"), spec);
  LoadOptions options;
  options.probe_in_subprocess = true;
  options.probe_timeout = absl::Milliseconds(300);
  ASSERT_EQ(setenv("KNND_TEST_PROBE_HANGS", "1", 1), 0);
  auto hung = IndexSnapshot::Load(tmp.path("good.index"), options);
  ASSERT_EQ(unsetenv("KNND_TEST_PROBE_HANGS"), 0);
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(hung.status().code(), absl::StatusCode::kDeadlineExceeded)
      << hung.status();
  EXPECT_THAT(hung.status().message(), HasSubstr("good.index"));
  EXPECT_THAT(hung.status().message(), HasSubstr("index_probe_timeout_s"));
  // No child left, not even a zombie.
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
  // The same file loads with a probe that answers (a generous limit: a
  // sanitizer build starts slowly).
  options.probe_timeout = absl::Minutes(5);
  auto good = IndexSnapshot::Load(tmp.path("good.index"), options);
  ASSERT_TRUE(good.ok()) << good.status();

  knnd::v1::ServerConfig config = ::knnd::testing::TestConfig("x.index");
  EXPECT_EQ(config.index_probe_timeout_s(), 300u);
  config.set_index_probe_timeout_s(0);
  ::knnd::testing::ExpectConfigRefused(
      config, "index_probe_timeout_s=0 is outside [1, 86400]");
}

// Minor page faults of the calling thread so far.
int64_t ThreadMinorFaults() {
  struct rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// Under knnd's fixed 1 MiB mmap threshold, FAISS's default 16 MiB coarse
// distance block is mapped afresh by every call of >= 20 rows and faulted in
// page by page; sized under the threshold it is reused from the heap.
TEST(IndexSnapshot, CoarseSearchBlockUnderTheMmapThresholdStopsPageFaults) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator ignores mallopt and keeps freed "
                  "memory in quarantine";
#endif
  TempDir tmp;
  IndexSpec spec;
  spec.factory = "IVF128,PQ8";  // 256 rows x 128 centroids: 32 pages a call
  WriteIndex(tmp.path("c.index"), spec);
  auto s = IndexSnapshot::Load(tmp.path("c.index"), {});
  ASSERT_TRUE(s.ok()) << s.status();
  constexpr int kRows = 256, kCalls = 20;
  const std::vector<float> q = MakeData(kRows, spec.d, 5);
  std::vector<float> d(kRows * 10);
  std::vector<int64_t> ids(kRows * 10);
  SearchArgs args{q.data(), kRows, 10, 4, {}, d.data(), ids.data()};
  auto faults_per_call = [&] {
    EXPECT_TRUE((*s)->Search(args).ok());  // warm: the heap grows once
    const int64_t before = ThreadMinorFaults();
    for (int i = 0; i < kCalls; ++i) EXPECT_TRUE((*s)->Search(args).ok());
    return static_cast<double>(ThreadMinorFaults() - before) / kCalls;
  };
  const int faiss_default = faiss::distance_compute_blas_query_bs;
  ASSERT_EQ(mallopt(M_MMAP_THRESHOLD, 1 << 20), 1);
  ASSERT_EQ(mallopt(M_TRIM_THRESHOLD, 1 << 20), 1);
  const double mapped = faults_per_call();
  EXPECT_EQ(SetCoarseBlockRowsUnder(1 << 20), 128);
  const double reused = faults_per_call();
  EXPECT_EQ(SetCoarseBlockRowsUnder(0), 128);  // 0 leaves it
  EXPECT_EQ(SetCoarseBlockRowsUnder(1 << 10), 20);
  EXPECT_EQ(SetCoarseBlockRowsUnder(int64_t{1} << 40), 4096);
  faiss::distance_compute_blas_query_bs = faiss_default;
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
  mallopt(M_TRIM_THRESHOLD, 128 << 10);
  std::printf("page faults per %d-row call: %.1f with FAISS's block, %.1f "
              "with one under the threshold\n", kRows, mapped, reused);
  EXPECT_GE(mapped, 30) << "FAISS's default block";
  EXPECT_LT(reused, 2) << "the block under the threshold";
}

TEST(IndexSnapshot, TruncatedFilesAreRefusedWithoutACrash) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("full.index"), spec);
  const std::string full = ReadFile(tmp.path("full.index"));
  const std::string path = tmp.path("cut.index");
  for (size_t keep : {size_t{0}, size_t{3}, size_t{40}, full.size() / 10,
                      full.size() / 2, full.size() - 100, full.size() - 1}) {
    WriteFile(path, full.substr(0, keep));
    auto s = IndexSnapshot::Load(path, {});
    EXPECT_FALSE(s.ok()) << "kept " << keep << " of " << full.size();
    EXPECT_THAT(s.status().message(), HasSubstr(path));
    // Without the probe, the structural checks alone must hold.
    const int status = LoadAndSearchInChild(path, /*probe=*/false);
    EXPECT_TRUE(WIFEXITED(status)) << "kept " << keep << ": child died of "
                                   << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 1) << "kept " << keep;
  }
}

// A flag byte that is neither 0 nor 1 (found by the index loader fuzzer
// under UBSan: FAISS's reader copies it into a bool as it is) is refused as
// corruption, never read as a bool.
TEST(IndexSnapshot, NonBooleanFlagBytesAreRefused) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("good.index"), spec);
  std::string bytes = ReadFile(tmp.path("good.index"));
  // "IwPQ", then the index header: d (4 bytes), ntotal and two dummies
  // (8 each), is_trained (1).
  constexpr size_t kIsTrained = 4 + 4 + 8 + 8 + 8;
  ASSERT_EQ(bytes.substr(0, 4), "IwPQ");
  ASSERT_EQ(bytes[kIsTrained], 1);
  bytes[kIsTrained] = static_cast<char>(176);
  WriteFile(tmp.path("flag.index"), bytes);
  for (bool probe : {true, false}) {
    LoadOptions options;
    options.probe_in_subprocess = probe;
    auto s = IndexSnapshot::Load(tmp.path("flag.index"), options);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status();
    EXPECT_THAT(s.status().message(), HasSubstr("is_trained=176"));
  }
}

// A metric outside faiss::MetricType's range, in the index's header or in its
// coarse quantizer's, is refused before it is read as the enum (the index
// loader fuzzer, UBSan -fsanitize=enum). FAISS reads one extra float
// (metric_arg) after a metric other than L2 or inner product, so the corrupt
// files below carry one: the rest of the file then parses.
TEST(IndexSnapshot, OutOfRangeMetricsAreRefused) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("good.index"), spec);
  const std::string good = ReadFile(tmp.path("good.index"));
  // "IwPQ" + d (4) + ntotal and two dummies (8 each) + is_trained (1).
  constexpr size_t kIndexMetric = 4 + 4 + 8 + 8 + 8 + 1;
  // Then nlist and nprobe (8 each), the quantizer's "IxF2" and its header.
  constexpr size_t kQuantizerMetric = kIndexMetric + 4 + 8 + 8 + 4 + 4 + 8 +
                                      8 + 8 + 1;
  ASSERT_EQ(good.substr(kQuantizerMetric - 29 - 4, 4), "IxF2");
  struct Case {
    size_t offset;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {kIndexMetric, absl::StatusCode::kInvalidArgument,
       "uses FAISS metric 1000000"},
      {kQuantizerMetric, absl::StatusCode::kDataLoss,
       "coarse quantizer's metric is 1000000"},
  };
  for (const Case& c : cases) {
    std::string bad = good;
    int32_t metric;
    std::memcpy(&metric, bad.data() + c.offset, sizeof(metric));
    ASSERT_EQ(metric, 1) << "expected METRIC_L2 at offset " << c.offset;
    metric = 1000000;
    std::memcpy(bad.data() + c.offset, &metric, sizeof(metric));
    const float metric_arg = 0;
    bad.insert(c.offset + sizeof(metric),
               std::string(reinterpret_cast<const char*>(&metric_arg),
                           sizeof(metric_arg)));
    WriteFile(tmp.path("metric.index"), bad);
    for (bool probe : {true, false}) {
      LoadOptions options;
      options.probe_in_subprocess = probe;
      auto s = IndexSnapshot::Load(tmp.path("metric.index"), options);
      ASSERT_FALSE(s.ok()) << "offset " << c.offset;
      EXPECT_EQ(s.status().code(), c.code) << s.status();
      EXPECT_THAT(s.status().message(), HasSubstr(c.message));
    }
  }
}

TEST(IndexSnapshot, ByteFlippedFilesNeverCrashTheLoader) {
  TempDir tmp;
  IndexSpec spec;
  spec.n = 2000;
  WriteIndex(tmp.path("good.index"), spec);
  const std::string good = ReadFile(tmp.path("good.index"));
  const std::string path = tmp.path("flipped.index");
  std::mt19937 rng(77);
  // Every byte of the header region, then random positions in the rest.
  std::vector<size_t> positions;
  for (size_t i = 0; i < 200 && i < good.size(); ++i) positions.push_back(i);
  std::uniform_int_distribution<size_t> anywhere(0, good.size() - 1);
  for (int i = 0; i < 100; ++i) positions.push_back(anywhere(rng));
  int refused = 0;
  for (size_t pos : positions) {
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ 0xA5);
    WriteFile(path, bad);
    const int status = LoadAndSearchInChild(path, /*probe=*/true);
    ASSERT_TRUE(WIFEXITED(status))
        << "flip at byte " << pos << " killed the loader with signal "
        << WTERMSIG(status);
    if (WEXITSTATUS(status) == 1) ++refused;
  }
  // Flips in the header are caught; flips inside codes or ids are harmless.
  EXPECT_GT(refused, 50);
}

}  // namespace
}  // namespace knnd

// Exact re-ranking from the raw-vectors file: the file format and its
// checks, re-ranked results against exact search, request validation, and
// the whole path over gRPC.
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "knnd/serving/batcher.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/lifecycle/index_source.h"
#include "knnd/index/memory_model.h"
#include "knnd/serving/search_request.h"
#include "knnd/storage/vectors_file.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::FindSample;
using ::knnd::testing::HttpGet;
using ::knnd::testing::MakeData;
using ::knnd::testing::ParseExposition;
using ::knnd::testing::RunningServer;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kRows = 2000;
constexpr int kDim = 16;
constexpr int kNlist = 16;
constexpr int kK = 10;

// The base as the index holds it: L2-normalised for cosine.
std::vector<float> Stored(std::vector<float> x, Metric metric) {
  if (metric != Metric::kCosine) return x;
  for (size_t i = 0; i < x.size(); i += kDim) {
    double norm = 0;
    for (int j = 0; j < kDim; ++j) norm += double{x[i + j]} * x[i + j];
    for (int j = 0; j < kDim; ++j) {
      x[i + j] = static_cast<float>(x[i + j] / std::sqrt(norm));
    }
  }
  return x;
}

absl::Status WriteVectors(const std::string& path, const std::vector<float>& x,
                          int dim, VectorsDtype dtype) {
  auto writer = VectorsFileWriter::Create(path, dim, dtype);
  if (!writer.ok()) return writer.status();
  const int64_t rows = static_cast<int64_t>(x.size()) / dim;
  // Two appends: the CRC runs over the whole payload.
  if (absl::Status s = (*writer)->Append(x.data(), rows / 2); !s.ok()) return s;
  if (absl::Status s = (*writer)->Append(x.data() + rows / 2 * dim,
                                         rows - rows / 2);
      !s.ok()) {
    return s;
  }
  return (*writer)->Finish();
}

// A coarse IVF-PQ index over MakeData(kRows, kDim, 5) (PQ4: 4 bytes per
// vector, so PQ alone ranks poorly) and, unless `dtype` is null, its raw
// vectors beside it. Returns the base as given.
std::vector<float> BuildWithVectors(const std::string& path, Metric metric,
                                    const VectorsDtype* dtype) {
  omp_set_num_threads(1);
  std::vector<float> x = MakeData(kRows, kDim, 5);
  IndexBuilder::Options options;
  options.dim = kDim;
  options.metric = metric;
  options.factory = absl::StrCat("IVF", kNlist, ",PQ4");
  auto builder = IndexBuilder::Create(options);
  EXPECT_TRUE(builder.ok()) << builder.status();
  EXPECT_TRUE((*builder)->Train(x.data(), kRows).ok());
  EXPECT_TRUE((*builder)->Add(x.data(), kRows, nullptr).ok());
  if (dtype != nullptr) {
    absl::Status s =
        WriteVectors(VectorsPath(path), Stored(x, metric), kDim, *dtype);
    EXPECT_TRUE(s.ok()) << s;
  }
  absl::Status written = (*builder)->Write(path, 4, knnd::v1::IndexMetadata());
  EXPECT_TRUE(written.ok()) << written;
  return x;
}

std::unique_ptr<IndexSnapshot> Load(const std::string& path,
                                    VectorsPolicy policy) {
  LoadOptions options;
  options.vectors = policy;
  auto snapshot = IndexSnapshot::Load(path, options);
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  return snapshot.ok() ? std::move(*snapshot) : nullptr;
}

std::vector<int64_t> Search(const IndexSnapshot& snapshot,
                            const std::vector<float>& queries, int nprobe,
                            int refine_factor,
                            std::vector<float>* distances = nullptr) {
  const int64_t nq = static_cast<int64_t>(queries.size()) / kDim;
  std::vector<int64_t> ids(nq * kK);
  std::vector<float> d(nq * kK);
  SearchArgs args;
  args.queries = queries.data();
  args.num_queries = nq;
  args.k = kK;
  args.nprobe = nprobe;
  args.refine_factor = refine_factor;
  args.distances = d.data();
  args.ids = ids.data();
  absl::Status s = snapshot.Search(args);
  EXPECT_TRUE(s.ok()) << s;
  if (distances != nullptr) *distances = d;
  return ids;
}

// Exact distances by a double-precision loop over the stored base.
double Exact(Metric metric, const float* q, const float* v) {
  double dot = 0, l2 = 0, qn = 0;
  for (int j = 0; j < kDim; ++j) {
    dot += double{q[j]} * v[j];
    l2 += (double{q[j]} - v[j]) * (double{q[j]} - v[j]);
    qn += double{q[j]} * q[j];
  }
  if (metric == Metric::kL2) return l2;
  return metric == Metric::kCosine ? dot / std::sqrt(qn) : dot;
}

class RerankMetricTest : public ::testing::TestWithParam<Metric> {};

// With every list probed and refine_factor * k >= ntotal, every vector is a
// candidate, so the re-ranked ids must be exactly those of a flat
// (brute-force) search, with exact distances; PQ alone gets fewer right.
TEST_P(RerankMetricTest, CoveringRefineEqualsExactSearch) {
  const Metric metric = GetParam();
  TempDir tmp;
  const VectorsDtype f32 = VectorsDtype::kFloat32;
  const std::vector<float> base =
      BuildWithVectors(tmp.path("x.index"), metric, &f32);
  auto snapshot = Load(tmp.path("x.index"), VectorsPolicy::kRequired);
  ASSERT_NE(snapshot, nullptr);
  EXPECT_TRUE(snapshot->info().has_vectors);
  EXPECT_EQ(snapshot->info().vectors_dtype, "f32");
  const std::vector<float> q = MakeData(50, kDim, 77);
  const Matrix queries{50, kDim, q};
  const Matrix base_matrix{kRows, kDim, base};
  auto truth = ExactNeighbors(base_matrix, queries, kK, metric);
  ASSERT_TRUE(truth.ok()) << truth.status();

  std::vector<float> distances;
  const std::vector<int64_t> ids =
      Search(*snapshot, q, kNlist, kRows / kK, &distances);
  EXPECT_EQ(ids, *truth);
  const std::vector<float> stored = Stored(base, metric);
  for (int64_t i = 0; i < static_cast<int64_t>(ids.size()); ++i) {
    const double want = Exact(metric, q.data() + (i / kK) * kDim,
                              stored.data() + ids[i] * kDim);
    EXPECT_NEAR(distances[i], want, 1e-3 * (1 + std::abs(want))) << i;
  }
  const std::vector<int64_t> pq = Search(*snapshot, q, kNlist, 0);
  EXPECT_LT(RecallAt(pq, kK, *truth, kK, kK), 0.95);
  EXPECT_EQ(RecallAt(ids, kK, *truth, kK, kK), 1.0);
}

INSTANTIATE_TEST_SUITE_P(Metrics, RerankMetricTest,
                         ::testing::Values(Metric::kL2, Metric::kInnerProduct,
                                           Metric::kCosine),
                         [](const auto& info) {
                           return std::string(MetricName(info.param));
                         });

// Coalescing never merges requests of different refine_factor: queued
// together behind busy workers, each request still gets the results of its
// own refine_factor.
TEST(Rerank, BatcherKeepsRefineFactorsApart) {
  TempDir tmp;
  const VectorsDtype f32 = VectorsDtype::kFloat32;
  BuildWithVectors(tmp.path("x.index"), Metric::kL2, &f32);
  std::shared_ptr<const IndexSnapshot> snapshot =
      Load(tmp.path("x.index"), VectorsPolicy::kRequired);
  ASSERT_NE(snapshot, nullptr);
  auto pool = WorkerPool::Create({1, 1});
  ASSERT_TRUE(pool.ok());
  Batcher::Options options;
  options.coalesce = true;
  auto batcher = Batcher::Create(options, pool->get());
  ASSERT_TRUE(batcher.ok());

  constexpr int kJobs = 8;
  std::vector<std::vector<float>> queries(kJobs);
  std::vector<std::vector<float>> distances(kJobs);
  std::vector<std::vector<int64_t>> ids(kJobs), want(kJobs);
  std::vector<absl::Notification> done(kJobs);
  absl::Notification release;
  (*pool)->Submit([&release] { release.WaitForNotification(); });
  for (int i = 0; i < kJobs; ++i) {
    queries[i] = MakeData(3, kDim, 200 + i);
    const int refine = i % 2 == 0 ? 0 : kRows / kK;
    want[i] = Search(*snapshot, queries[i], 2, refine);
    distances[i].resize(3 * kK);
    ids[i].resize(3 * kK);
    auto job = std::make_unique<SearchJob>();
    job->snapshot = snapshot;
    job->queries = queries[i].data();
    job->num_queries = 3;
    job->k = kK;
    job->nprobe = 2;
    job->refine_factor = refine;
    job->distances = distances[i].data();
    job->ids = ids[i].data();
    job->on_done = [&done, i](const absl::Status& s, const JobTimes&) {
      EXPECT_TRUE(s.ok()) << s;
      done[i].Notify();
    };
    (*batcher)->Submit(std::move(job));
  }
  release.Notify();
  for (int i = 0; i < kJobs; ++i) {
    done[i].WaitForNotification();
    EXPECT_EQ(ids[i], want[i]) << "request " << i;
  }
  EXPECT_NE(want[0], Search(*snapshot, queries[0], 2, kRows / kK));
}

// float16 vectors: half the file, ids still those of exact search but for
// near-ties that the rounding may swap.
TEST(Rerank, Float16FileHalvesTheBytesAndKeepsRecall) {
  TempDir tmp;
  const VectorsDtype f16 = VectorsDtype::kFloat16;
  const std::vector<float> base =
      BuildWithVectors(tmp.path("x.index"), Metric::kL2, &f16);
  auto snapshot = Load(tmp.path("x.index"), VectorsPolicy::kRequired);
  ASSERT_NE(snapshot, nullptr);
  EXPECT_EQ(snapshot->info().vectors_dtype, "f16");
  EXPECT_EQ(snapshot->info().vectors_file_bytes,
            kVectorsHeaderBytes + int64_t{kRows} * kDim * 2);
  const std::vector<float> q = MakeData(50, kDim, 78);
  auto truth = ExactNeighbors(Matrix{kRows, kDim, base}, Matrix{50, kDim, q},
                              kK, Metric::kL2);
  ASSERT_TRUE(truth.ok());
  const std::vector<int64_t> ids = Search(*snapshot, q, kNlist, kRows / kK);
  EXPECT_GE(RecallAt(ids, kK, *truth, kK, kK), 0.99);
}

TEST(Rerank, HalfConversionRoundTrips) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
  EXPECT_NEAR(HalfToFloat(FloatToHalf(0.1f)), 0.1f, 1e-4);
}

// The files a loader must refuse, each with a message naming the file, the
// field, the expected and the actual value.
class BadVectorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const VectorsDtype f32 = VectorsDtype::kFloat32;
    base_ = BuildWithVectors(tmp_.path("x.index"), Metric::kL2, &f32);
    path_ = VectorsPath(tmp_.path("x.index"));
  }
  absl::Status Open() {
    return VectorsFile::Open(path_, kDim, kRows, /*verify_checksum=*/true)
        .status();
  }
  void Poke(int64_t offset, char byte) {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(offset);
    f.put(byte);
  }

  TempDir tmp_;
  std::vector<float> base_;
  std::string path_;
};

TEST_F(BadVectorsFileTest, GoodFileOpens) { EXPECT_TRUE(Open().ok()); }

TEST_F(BadVectorsFileTest, WrongSizeIsRefused) {
  ASSERT_EQ(truncate(path_.c_str(), kVectorsHeaderBytes + 100), 0);
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr(path_), HasSubstr("size 164 bytes"),
                    HasSubstr(absl::StrCat(
                        "= ", kVectorsHeaderBytes + int64_t{kRows} * kDim * 4)),
                    HasSubstr("truncated")));
}

TEST_F(BadVectorsFileTest, WrongDimIsRefused) {
  absl::Status s =
      VectorsFile::Open(path_, kDim * 2, kRows, true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr(path_), HasSubstr("dim=16"),
                    HasSubstr("index has dim=32")));
}

TEST_F(BadVectorsFileTest, WrongCountIsRefused) {
  absl::Status s = VectorsFile::Open(path_, kDim, kRows + 1, true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("count=2000"),
                                 HasSubstr("ntotal=2001")));
}

TEST_F(BadVectorsFileTest, BadMagicIsRefused) {
  Poke(0, 'X');
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("bad magic")));
}

TEST_F(BadVectorsFileTest, ChangedPayloadFailsTheChecksum) {
  Poke(kVectorsHeaderBytes + 7, 0x55);
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("CRC-32")));
  EXPECT_TRUE(VectorsFile::Open(path_, kDim, kRows, false).ok());
}

// Loaded without verify_checksum (checksum_check "background"), a snapshot
// verifies later what Load() skipped: the index file against its sidecar
// and the vectors payload against its header; a cancelled check says so.
TEST_F(BadVectorsFileTest, VerifyChecksumsChecksWhatLoadSkipped) {
  LoadOptions unchecked;
  unchecked.verify_checksum = false;
  auto good = IndexSnapshot::Load(tmp_.path("x.index"), unchecked);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->info().has_metadata);
  EXPECT_TRUE((*good)->info().has_vectors);
  EXPECT_TRUE((*good)->VerifyChecksums().ok());
  std::atomic<bool> cancel{true};
  EXPECT_TRUE(absl::IsCancelled((*good)->VerifyChecksums(&cancel)));

  Poke(kVectorsHeaderBytes + 7, 0x55);
  auto changed = IndexSnapshot::Load(tmp_.path("x.index"), unchecked);
  ASSERT_TRUE(changed.ok()) << changed.status();
  absl::Status s = (*changed)->VerifyChecksums();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("CRC-32")));

  // The index file itself: one byte of its last stored id.
  ASSERT_TRUE(WriteVectors(path_, base_, kDim, VectorsDtype::kFloat32).ok());
  ::knnd::testing::FlipByteFromEnd(tmp_.path("x.index"), 4);
  auto index_changed = IndexSnapshot::Load(tmp_.path("x.index"), unchecked);
  ASSERT_TRUE(index_changed.ok()) << index_changed.status();
  s = (*index_changed)->VerifyChecksums();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("x.index.meta.json"),
                                 HasSubstr("CRC-32")));
}

// A vectors file of another index (other count): refused; kOptional serves
// the index alone and says why, kRequired refuses the index.
TEST_F(BadVectorsFileTest, IndexAloneServesUnlessVectorsAreRequired) {
  ASSERT_TRUE(WriteVectors(path_, MakeData(kRows - 1, kDim, 9), kDim,
                           VectorsDtype::kFloat32)
                  .ok());
  auto alone = Load(tmp_.path("x.index"), VectorsPolicy::kOptional);
  ASSERT_NE(alone, nullptr);
  EXPECT_FALSE(alone->info().has_vectors);
  EXPECT_THAT(alone->info().vectors_error,
              AllOf(HasSubstr("count=1999"), HasSubstr("ntotal=2000")));
  EXPECT_EQ(Search(*alone, MakeData(3, kDim, 1), 4, 0).size(), 3u * kK);

  SearchArgs args;
  std::vector<float> q = MakeData(1, kDim, 1);
  std::vector<float> d(kK);
  std::vector<int64_t> ids(kK);
  args = {q.data(), 1, kK, 4, {}, d.data(), ids.data(), 2};
  EXPECT_EQ(alone->Search(args).code(), absl::StatusCode::kFailedPrecondition);

  LoadOptions required;
  required.vectors = VectorsPolicy::kRequired;
  auto refused = IndexSnapshot::Load(tmp_.path("x.index"), required);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr(path_), HasSubstr("count=1999"),
                    HasSubstr("require_vectors")));

  ASSERT_EQ(unlink(path_.c_str()), 0);
  auto missing = IndexSnapshot::Load(tmp_.path("x.index"), required);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

// knnctl publish copies the vectors file with its index, and refuses one
// that does not match it.
TEST_F(BadVectorsFileTest, PublishCarriesTheVectorsAndChecksThem) {
  auto published = PublishVersion(tmp_.path("versions"), tmp_.path("x.index"));
  ASSERT_TRUE(published.ok()) << published.status();
  auto served = Load(published->path, VectorsPolicy::kRequired);
  ASSERT_NE(served, nullptr);
  EXPECT_TRUE(served->info().has_vectors);

  ASSERT_EQ(truncate(path_.c_str(), 1000), 0);
  auto refused = PublishVersion(tmp_.path("versions"), tmp_.path("x.index"));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("truncated"));
}

IndexInfo InfoWithVectors(bool has_vectors) {
  IndexInfo info;
  info.path = "/data/x.index";
  info.dim = 2;
  info.nlist = 8;
  info.ntotal = 100;
  info.has_vectors = has_vectors;
  return info;
}

knnd::v1::SearchRequest Request() {
  knnd::v1::SearchRequest r;
  r.add_vectors(1);
  r.add_vectors(2);
  r.set_k(5);
  return r;
}

// Parses Request() with refine_factor set, under max_refine_factor 16.
absl::StatusOr<ParsedSearch> ParseWithRefine(const IndexInfo& info,
                                             int refine_factor) {
  LimitsConfig config;
  config.max_refine_factor = 16;
  const SearchLimits limits = ResolveLimits(config, info);
  knnd::v1::SearchRequest r = Request();
  r.set_refine_factor(refine_factor);
  return ParseSearchRequest(r, info, limits);
}

TEST(RerankRequest, RefineFactorOutOfRangeNamesTheLimit) {
  const IndexInfo info = InfoWithVectors(true);
  auto parsed = ParseWithRefine(info, 17);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(),
              AllOf(HasSubstr("refine_factor=17"), HasSubstr("[0, 16]"),
                    HasSubstr("max_refine_factor")));
  parsed = ParseWithRefine(info, 16);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->refine_factor, 16);
}

TEST(RerankRequest, DefaultAppliesOnlyWithVectors) {
  LimitsConfig config;
  config.default_refine_factor = 4;
  config.max_refine_factor = 16;
  const SearchLimits limits = ResolveLimits(config, InfoWithVectors(true));
  auto with = ParseSearchRequest(Request(), InfoWithVectors(true), limits);
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->refine_factor, 4);
  auto without = ParseSearchRequest(Request(), InfoWithVectors(false),
                                    ResolveLimits(config, InfoWithVectors(false)));
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->refine_factor, 0);
  knnd::v1::SearchRequest r = Request();
  r.set_refine_factor(0);  // explicitly off
  with = ParseSearchRequest(r, InfoWithVectors(true), limits);
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->refine_factor, 0);
}

TEST(RerankRequest, RefineWithoutVectorsIsFailedPrecondition) {
  IndexInfo info = InfoWithVectors(false);
  info.vectors_error = "vectors file /data/x.index.vectors has dim=3";
  auto parsed = ParseWithRefine(info, 2);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(parsed.status().message()),
              AllOf(HasSubstr("refine_factor=2"), HasSubstr("--keep_vectors"),
                    HasSubstr("has dim=3")));
}

TEST(RerankMemory, EstimateCountsTheCandidateBuffers) {
  const IndexInfo info = InfoWithVectors(true);
  SearchShape shape{100, 10, 4, 0, 0};
  const int64_t plain = EstimateSearchBytes(info, shape);
  shape.refine_factor = 8;
  EXPECT_EQ(EstimateSearchBytes(info, shape) - plain, 100 * 8 * 10 * 12);
}

// Over gRPC: the response says which refine_factor answered, re-ranked
// results are exact, the re-rank histogram and the vectors residency are
// exported, and GetIndexInfo reports the vectors.
TEST(RerankServer, ResponseReportsRefineFactorAndResultsAreExact) {
  TempDir tmp;
  const VectorsDtype f32 = VectorsDtype::kFloat32;
  const std::vector<float> base =
      BuildWithVectors(tmp.path("x.index"), Metric::kL2, &f32);
  knnd::v1::ServerConfig config = TestConfig(tmp.path("x.index"));
  config.set_default_refine_factor(2);
  config.set_max_refine_factor(kRows / kK);
  config.set_require_vectors(true);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.stub, nullptr);

  const std::vector<float> q = MakeData(20, kDim, 79);
  auto truth = ExactNeighbors(Matrix{kRows, kDim, base}, Matrix{20, kDim, q},
                              kK, Metric::kL2);
  ASSERT_TRUE(truth.ok());
  knnd::v1::SearchRequest request;
  *request.mutable_vectors() = {q.begin(), q.end()};
  request.set_k(kK);
  request.set_nprobe(kNlist);
  {
    grpc::ClientContext context;
    knnd::v1::SearchResponse response;
    ASSERT_TRUE(s.stub->Search(&context, request, &response).ok());
    EXPECT_EQ(response.refine_factor(), 2u);  // the config's default
  }
  request.set_refine_factor(kRows / kK);
  grpc::ClientContext context;
  knnd::v1::SearchResponse response;
  grpc::Status status = s.stub->Search(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.refine_factor(), static_cast<uint32_t>(kRows / kK));
  EXPECT_EQ(std::vector<int64_t>(response.ids().begin(), response.ids().end()),
            *truth);

  request.set_refine_factor(kRows / kK + 1);
  grpc::ClientContext bad_context;
  status = s.stub->Search(&bad_context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("max_refine_factor"));

  grpc::ClientContext info_context;
  knnd::v1::GetIndexInfoResponse info;
  ASSERT_TRUE(s.stub->GetIndexInfo(&info_context, {}, &info).ok());
  EXPECT_TRUE(info.has_vectors());
  EXPECT_EQ(info.vectors_dtype(), "f32");
  EXPECT_EQ(info.default_refine_factor(), 2u);
  EXPECT_EQ(info.max_refine_factor(), static_cast<uint32_t>(kRows / kK));

  absl::StatusOr<std::string> body =
      HttpGet(s.server->metrics_port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  const auto samples = ParseExposition(*body);
  // Warm-up, the default and the covering request re-ranked.
  EXPECT_GE(FindSample(samples, "knnd_search_rerank_duration_seconds_count")
                .value_or(0),
            2);
  // Whole pages of the mapping.
  const double file_bytes = kVectorsHeaderBytes + int64_t{kRows} * kDim * 4;
  const double mapped =
      FindSample(samples, "knnd_vectors_mapped_bytes").value_or(0);
  EXPECT_GE(mapped, file_bytes);
  EXPECT_LT(mapped, file_bytes + 4096);
  EXPECT_TRUE(
      FindSample(samples, "knnd_vectors_page_cache_resident_bytes").has_value());
}

// A server whose vectors file does not match still serves plain searches,
// refuses re-ranked ones with FAILED_PRECONDITION, and uses refine 0 by
// default even though the config asks for more.
TEST(RerankServer, BadVectorsFileServesTheIndexAlone) {
  TempDir tmp;
  BuildWithVectors(tmp.path("x.index"), Metric::kL2, nullptr);
  ASSERT_TRUE(WriteVectors(VectorsPath(tmp.path("x.index")),
                           MakeData(kRows, kDim + 1, 3), kDim + 1,
                           VectorsDtype::kFloat32)
                  .ok());
  knnd::v1::ServerConfig config = TestConfig(tmp.path("x.index"));
  config.set_default_refine_factor(4);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.stub, nullptr);
  const std::vector<float> q = MakeData(2, kDim, 80);
  knnd::v1::SearchRequest request;
  *request.mutable_vectors() = {q.begin(), q.end()};
  request.set_k(kK);
  {
    grpc::ClientContext context;
    knnd::v1::SearchResponse response;
    grpc::Status status = s.stub->Search(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.refine_factor(), 0u);
    EXPECT_EQ(response.ids_size(), 2 * kK);
  }
  request.set_refine_factor(4);
  grpc::ClientContext context;
  knnd::v1::SearchResponse response;
  grpc::Status status = s.stub->Search(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("refine_factor=4"), HasSubstr("dim=17"),
                    HasSubstr("index has dim=16")));
}

}  // namespace
}  // namespace knnd

// The canary check of a new version before it is published (recall against
// the serving version or a ground truth): CheckCanary itself, and through an
// in-process server.
#include "knnd/index/canary.h"

#include <fstream>
#include <functional>
#include <memory>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "knnd/config/config.h"
#include "knnd/index/index_eval.h"
#include "knnd/storage/vector_io.h"
#include "testing/test_util.h"
#include "testing/version_util.h"

namespace knnd {
namespace {

using ::knnd::testing::AdminStub;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::kDim;
using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::MakeData;
using ::knnd::testing::PublishIndex;
using ::knnd::testing::Reloads;
using ::knnd::testing::ReloadRpc;
using ::knnd::testing::RunningServer;
using ::knnd::testing::ServedVersion;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::VersionSpec;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

// Writes `queries` as .fvecs for the canary set.
std::string WriteQueries(const TempDir& tmp, int64_t rows, uint32_t seed) {
  Matrix m;
  m.rows = rows;
  m.dim = kDim;
  m.values = MakeData(rows, kDim, seed);
  const std::string path = tmp.path(absl::StrCat("canary.", seed, ".fvecs"));
  EXPECT_TRUE(WriteVectors(path, m).ok());
  return path;
}

// The canary check against the serving version: the same vectors rebuilt
// pass; the same vectors under other ids (a broken id mapping) are refused
// while the old version serves.
TEST(Canary, RefusesAVersionThatLosesTheServingVersionsNeighbours) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  IndexSpec base = VersionSpec(1);
  base.first_id = 0;
  PublishIndex(tmp, dir, base);
  knnd::v1::ServerConfig config = TestConfig(dir);
  config.set_canary_queries_path(WriteQueries(tmp, 50, 99));
  config.set_canary_min_recall(0.3);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.stub, nullptr);
  auto admin = AdminStub(s);

  IndexSpec rebuilt = base;
  rebuilt.seed = 1;  // same vectors, same ids
  ASSERT_EQ(PublishIndex(tmp, dir, rebuilt), 2);
  knnd::v1::ReloadIndexResponse reloaded;
  grpc::Status status = ReloadRpc(*admin, absl::nullopt, &reloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reloaded.version(), 2);

  IndexSpec shuffled = base;
  shuffled.first_id = 500000;  // same vectors, every id wrong
  ASSERT_EQ(PublishIndex(tmp, dir, shuffled), 3);
  status = ReloadRpc(*admin, absl::nullopt, &reloaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("index version 3"));
  EXPECT_THAT(status.error_message(), HasSubstr("canary recall@10 = 0.0000"));
  EXPECT_THAT(status.error_message(),
              HasSubstr("below canary_min_recall = 0.3000"));
  EXPECT_EQ(ServedVersion(s), 2);
  EXPECT_EQ(Reloads(s, "failed"), 1);
}

// CheckCanary itself, with the defaults (k 10, min_recall 0.5) and the
// candidate searched at nprobe nlist, as exhaustively as the reference: the
// same file loaded again recalls everything; the same vectors under other
// ids recall nothing and are refused, naming both numbers; without a
// reference or with another dim there is nothing to check against.
TEST(Canary, CheckCanaryComparesWithTheServingVersion) {
  TempDir tmp;
  IndexSpec base = VersionSpec(1);
  base.first_id = 0;
  WriteIndex(tmp.path("base.index"), base);
  IndexSpec shuffled = base;
  shuffled.first_id = 500000;
  WriteIndex(tmp.path("shuffled.index"), shuffled);
  std::unique_ptr<IndexSnapshot> serving = LoadSnapshot(tmp.path("base.index"));
  std::unique_ptr<IndexSnapshot> same = LoadSnapshot(tmp.path("base.index"));
  std::unique_ptr<IndexSnapshot> wrong_ids =
      LoadSnapshot(tmp.path("shuffled.index"));
  ASSERT_TRUE(serving && same && wrong_ids);

  CanarySet set;
  set.queries.rows = 50;
  set.queries.dim = kDim;
  set.queries.values = MakeData(50, kDim, 99);
  CanaryOptions options;
  options.nprobe = static_cast<int>(serving->info().nlist);
  const CanaryRunner here = [](std::function<absl::Status()> search) {
    return search();
  };

  absl::StatusOr<double> recall =
      CheckCanary(set, *same, serving.get(), options, here);
  ASSERT_TRUE(recall.ok()) << recall.status();
  EXPECT_DOUBLE_EQ(*recall, 1.0);

  recall = CheckCanary(set, *wrong_ids, serving.get(), options, here);
  EXPECT_TRUE(absl::IsFailedPrecondition(recall.status())) << recall.status();
  EXPECT_THAT(recall.status().message(),
              HasSubstr("canary recall@10 = 0.0000 over 50 queries"));
  EXPECT_THAT(recall.status().message(),
              HasSubstr("below canary_min_recall = 0.5000"));

  recall = CheckCanary(set, *same, nullptr, options, here);
  EXPECT_THAT(recall.status().message(),
              HasSubstr("needs a ground truth or a version serving"));
  set.queries.dim = kDim + 1;
  recall = CheckCanary(set, *same, serving.get(), options, here);
  EXPECT_THAT(recall.status().message(), HasSubstr("canary queries have dim="));
}

// Writes the exact top-k neighbours of `queries` among `base` as .ivecs.
std::string WriteGroundTruth(const TempDir& tmp, const std::string& queries,
                             const std::vector<float>& base, int k) {
  absl::StatusOr<Matrix> q = ReadVectors(queries);
  EXPECT_TRUE(q.ok()) << q.status();
  Matrix b;
  b.rows = static_cast<int64_t>(base.size()) / kDim;
  b.dim = kDim;
  b.values = base;
  absl::StatusOr<std::vector<int64_t>> exact =
      ExactNeighbors(b, *q, k, Metric::kL2);
  EXPECT_TRUE(exact.ok()) << exact.status();
  const std::string path = tmp.path("canary.ivecs");
  std::ofstream out(path, std::ios::binary);
  for (int64_t row = 0; row < q->rows; ++row) {
    const int32_t cols = k;
    out.write(reinterpret_cast<const char*>(&cols), sizeof(cols));
    for (int j = 0; j < k; ++j) {
      const int32_t id = static_cast<int32_t>((*exact)[row * k + j]);
      out.write(reinterpret_cast<const char*>(&id), sizeof(id));
    }
  }
  return path;
}

// With a ground truth the first version is checked too: a bar it cannot
// reach keeps the server from starting, with the recall in the message.
TEST(Canary, GroundTruthChecksTheFirstVersion) {
  TempDir tmp;
  IndexSpec spec = VersionSpec(1);
  spec.first_id = 0;
  const std::string index = tmp.path("index.faiss");
  const std::vector<float> base = WriteIndex(index, spec);
  const std::string queries = WriteQueries(tmp, 40, 77);
  knnd::v1::ServerConfig config = TestConfig(index);
  config.set_canary_queries_path(queries);
  config.set_canary_ground_truth_path(WriteGroundTruth(tmp, queries, base, 10));

  config.set_canary_min_recall(0.2);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.stub, nullptr);
  EXPECT_EQ(ServedVersion(s), 1);

  config.set_canary_min_recall(1.0);  // PQ4x4 codes cannot be exact
  config.set_metrics_listen_address(
      absl::StrCat("127.0.0.1:", knnd::testing::FreePort()));
  absl::StatusOr<std::unique_ptr<Server>> strict = Server::Create(config);
  ASSERT_TRUE(strict.ok()) << strict.status();
  ASSERT_TRUE((*strict)->Start().ok());
  absl::Status loaded = (*strict)->LoadIndex();
  EXPECT_EQ(loaded.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.message(), HasSubstr("against the ground truth"));
  EXPECT_THAT(loaded.message(), HasSubstr("below canary_min_recall = 1.0000"));
}

// A bad canary configuration stops the server at creation, naming it.
TEST(Canary, BadCanarySetIsAConfigurationError) {
  TempDir tmp;
  knnd::v1::ServerConfig config = TestConfig(tmp.path("unused.faiss"));
  config.set_canary_queries_path(tmp.path("missing.fvecs"));
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(config);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("missing.fvecs"));

  config.set_canary_queries_path(WriteQueries(tmp, 5, 1));
  config.set_canary_min_recall(1.5);
  absl::Status invalid = ValidateConfig(config);
  EXPECT_THAT(invalid.message(), HasSubstr("canary_min_recall=1.5"));
}

}  // namespace
}  // namespace knnd

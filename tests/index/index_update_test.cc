#include "knnd/index/index_update.h"

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/index/index_snapshot.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/vectors_file.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::CallSearch;
using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::MakeData;
using ::knnd::testing::MakeSearchRequest;
using ::knnd::testing::SearchSnapshot;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::testing::HasSubstr;

constexpr int kDim = 32;
constexpr int64_t kRows = 3000;
constexpr int kNlist = 16;

// The rows of `x` (kDim wide) at `rows`.
std::vector<float> Rows(const std::vector<float>& x,
                        const std::vector<int64_t>& rows) {
  std::vector<float> out;
  for (int64_t r : rows) {
    out.insert(out.end(), x.begin() + r * kDim, x.begin() + (r + 1) * kDim);
  }
  return out;
}

Matrix AsMatrix(const std::vector<float>& values) {
  Matrix m;
  m.dim = kDim;
  m.rows = static_cast<int64_t>(values.size()) / kDim;
  m.values = values;
  return m;
}

// The base the update tests start from: kRows seeded rows in knnctl
// build's FastScan recipe with their raw vectors.
BuildSpec BaseSpec() {
  BuildSpec spec;
  spec.n = kRows;
  spec.d = kDim;
  spec.factory = absl::StrCat("IVF", kNlist, ",PQ16x4fs");
  spec.vectors = VectorsDtype::kFloat32;
  return spec;
}

// A base of kRows seeded rows (own ids when `own_ids`), updated with 100
// deletions, 50 upserts and 60 additions; every answer of the new version
// is then checked against them.
void UpdateAndCheck(bool own_ids) {
  TempDir dir;
  BuildSpec spec = BaseSpec();
  std::vector<int64_t> base_ids(kRows);
  for (int64_t r = 0; r < kRows; ++r) base_ids[r] = own_ids ? 1000 + 7 * r : r;
  if (own_ids) spec.ids = base_ids;
  const std::string base_path = dir.path("base.index");
  const std::vector<float> x = BuildIndex(base_path, spec);

  std::vector<int64_t> deleted_rows, upserted_rows;
  for (int64_t r = 0; r < kRows; r += 30) deleted_rows.push_back(r);
  for (int64_t r = 5; r < kRows && upserted_rows.size() < 50; r += 30) {
    upserted_rows.push_back(r);
  }
  const std::vector<float> upserts = MakeData(50, kDim, 99);
  const std::vector<float> additions = MakeData(60, kDim, 77);
  UpdateOptions options;
  options.base_path = base_path;
  options.output_path = dir.path("new.index");
  options.input_name = "delta";
  std::vector<float> delta = upserts;
  delta.insert(delta.end(), additions.begin(), additions.end());
  const Matrix input = AsMatrix(delta);
  options.input = &input;
  for (int64_t r : deleted_rows) options.deletions.push_back(base_ids[r]);
  for (int64_t r : upserted_rows) options.input_ids.push_back(base_ids[r]);
  std::vector<int64_t> added_ids;
  for (int i = 0; i < 60; ++i)
    added_ids.push_back(own_ids ? 900000 + i : kRows + i);
  options.input_ids.insert(options.input_ids.end(), added_ids.begin(),
                           added_ids.end());
  options.recall_queries = 50;
  options.built_by = "index_update_test";
  absl::StatusOr<UpdateReport> report = UpdateIndexFile(options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->plan.deleted, 100);
  EXPECT_EQ(report->plan.upserted, 50);
  EXPECT_EQ(report->plan.added, 60);
  EXPECT_EQ(report->ntotal, kRows - 100 + 60);
  EXPECT_TRUE(report->wrote_vectors);
  // Row ids renumber after a deletion, so both get an id table.
  EXPECT_TRUE(report->wrote_id_table);
  EXPECT_GT(report->drift.base_pq_error, 0);
  EXPECT_GT(report->drift.new_pq_error, 0);
  EXPECT_GE(report->drift.recall, 0);

  // The daemon's own load, checksums included.
  auto meta = ReadIndexMetadata(MetadataPath(options.output_path));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->ntotal(), kRows - 100 + 60);
  EXPECT_TRUE(meta->id_table());
  EXPECT_EQ(meta->built_by(), "index_update_test");
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(options.output_path);
  ASSERT_NE(snapshot, nullptr);
  ASSERT_TRUE(snapshot->VerifyChecksums().ok());

  // Deleted ids are never returned, by the index or the re-ranking.
  const std::set<int64_t> deleted(options.deletions.begin(),
                                  options.deletions.end());
  std::vector<float> probes = Rows(x, deleted_rows);
  const std::vector<float> random = MakeData(100, kDim, 5);
  probes.insert(probes.end(), random.begin(), random.end());
  for (int refine : {0, 4}) {
    const auto results = SearchSnapshot(*snapshot, probes, 50, kNlist, refine);
    for (int64_t id : results.ids) {
      EXPECT_EQ(deleted.count(id), 0u) << "deleted id " << id;
    }
  }
  // Upserted ids answer with their new vectors, additions are found.
  auto expect_found = [&](const std::vector<float>& vectors,
                          const std::vector<int64_t>& ids) {
    const auto results = SearchSnapshot(*snapshot, vectors, 1, kNlist, 4);
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(results.ids[i], ids[i]) << i;
      EXPECT_LT(results.distances[i], 1e-3) << i;
    }
  };
  std::vector<int64_t> upserted_ids;
  for (int64_t r : upserted_rows) upserted_ids.push_back(base_ids[r]);
  expect_found(upserts, upserted_ids);
  expect_found(additions, added_ids);
  // An upserted id's old vector is gone: searched for, it is never at
  // distance 0 under that id.
  const auto old =
      SearchSnapshot(*snapshot, Rows(x, upserted_rows), 5, kNlist, 4);
  for (size_t q = 0; q < upserted_rows.size(); ++q) {
    for (int j = 0; j < 5; ++j) {
      if (old.ids[q * 5 + j] == upserted_ids[q]) {
        EXPECT_GT(old.distances[q * 5 + j], 1e-3) << q;
      }
    }
  }
  // Kept rows keep their ids: each base vector still finds its own id.
  const std::vector<int64_t> kept_rows = {1, 2, 1000, 2999};
  std::vector<int64_t> kept_ids;
  for (int64_t r : kept_rows) kept_ids.push_back(base_ids[r]);
  expect_found(Rows(x, kept_rows), kept_ids);

  // knnd serves the new version and answers an addition with its id.
  testing::RunningServer server = StartServer(TestConfig(options.output_path));
  knnd::v1::SearchRequest request = MakeSearchRequest(
      std::vector<float>(additions.begin(), additions.begin() + kDim), 1);
  request.set_nprobe(kNlist);
  request.set_refine_factor(4);
  knnd::v1::SearchResponse response;
  ASSERT_TRUE(CallSearch(*server.stub, request, &response).ok());
  ASSERT_EQ(response.ids_size(), 1);
  EXPECT_EQ(response.ids(0), added_ids[0]);
}

TEST(UpdateIndexFile, OwnIdsDeletedNeverReturnedUpsertsAnsweredNewFound) {
  UpdateAndCheck(/*own_ids=*/true);
}

TEST(UpdateIndexFile, RowIdsKeepTheirIdsThroughDeletions) {
  UpdateAndCheck(/*own_ids=*/false);
}

TEST(UpdateIndexFile, AppendingToARowIdIndexKeepsRowIdsWithoutATable) {
  TempDir dir;
  BuildSpec spec;
  spec.n = 1000;
  spec.d = kDim;
  spec.factory = "IVF8,PQ16x4fs";
  spec.vectors = VectorsDtype::kFloat32;
  BuildIndex(dir.path("base.index"), spec);
  const Matrix input = AsMatrix(MakeData(10, kDim, 3));
  UpdateOptions options;
  options.base_path = dir.path("base.index");
  options.output_path = dir.path("new.index");
  options.input = &input;
  options.input_name = "delta";
  options.recall_queries = 0;
  absl::StatusOr<UpdateReport> report = UpdateIndexFile(options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->plan.row_ids);
  EXPECT_FALSE(report->wrote_id_table);
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(options.output_path);
  ASSERT_NE(snapshot, nullptr);
  EXPECT_FALSE(snapshot->info().has_id_table);
  const auto results = SearchSnapshot(*snapshot, input.values, 1, 8, 4);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(results.ids[i], 1000 + i);
}

// Cosine: the delta is normalised as the build normalised the base, so
// raw vectors (any scale) are found under their ids with cosine 1.
TEST(UpdateIndexFile, CosineDeltaIsNormalisedLikeTheBase) {
  TempDir dir;
  BuildSpec spec;
  spec.n = 1000;
  spec.d = kDim;
  spec.metric = Metric::kCosine;
  spec.factory = "IVF8,PQ16x4fs";
  spec.vectors = VectorsDtype::kFloat32;
  BuildIndex(dir.path("base.index"), spec);
  Matrix input = AsMatrix(MakeData(5, kDim, 4));
  for (float& v : input.values) v *= 7.5f;
  UpdateOptions options;
  options.base_path = dir.path("base.index");
  options.output_path = dir.path("new.index");
  options.input = &input;
  options.input_ids = {0, 1001, 1002, 1003, 1004};  // one upsert
  options.input_name = "delta";
  options.recall_queries = 0;
  ASSERT_TRUE(UpdateIndexFile(options).ok());
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(options.output_path);
  ASSERT_NE(snapshot, nullptr);
  EXPECT_EQ(snapshot->info().metric, Metric::kCosine);
  const auto results = SearchSnapshot(*snapshot, input.values, 1, 8, 4);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(results.ids[i], options.input_ids[i]) << i;
    EXPECT_NEAR(results.distances[i], 1.0f, 1e-4) << i;
  }
}

// A base with payloads: kept rows keep theirs, an upsert takes its new
// line, an addition its own, a deleted id has none; the new version's
// sidecar says it has payloads and knnd's load and checksums accept it.
TEST(UpdateIndexFile, PayloadsFollowTheirRows) {
  TempDir dir;
  BuildSpec spec = BaseSpec();
  for (int64_t r = 0; r < kRows; ++r) {
    spec.ids.push_back(1000 + 7 * r);
    spec.payloads.push_back(absl::StrCat(R"({"n":)", r, "}"));
  }
  const std::string base_path = dir.path("base.index");
  BuildIndex(base_path, spec);
  // Upsert the ids of rows 3 and 4, add one id, delete row 5's.
  const std::vector<float> delta = MakeData(3, kDim, 31);
  const Matrix input = AsMatrix(delta);
  const std::string payloads = dir.path("delta.jsonl");
  std::ofstream(payloads) << R"({"n":"upsert 3"})" << "\n"
                          << R"("upsert 4")" << "\n"
                          << R"({"n":"added"})" << "\n";
  UpdateOptions options;
  options.base_path = base_path;
  options.output_path = dir.path("new.index");
  options.input_name = "delta";
  options.input = &input;
  options.input_ids = {1000 + 7 * 3, 1000 + 7 * 4, 5};
  options.deletions = {1000 + 7 * 5};
  options.input_payloads = payloads;
  options.recall_queries = 0;
  absl::StatusOr<UpdateReport> report = UpdateIndexFile(options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->wrote_payloads);
  auto meta = ReadIndexMetadata(MetadataPath(options.output_path));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(meta->payloads());
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(options.output_path);
  ASSERT_NE(snapshot, nullptr);
  ASSERT_TRUE(snapshot->VerifyChecksums().ok());
  absl::StatusOr<PayloadSelection> all = snapshot->SelectPayloads(true, {});
  ASSERT_TRUE(all.ok()) << all.status();
  const auto payload_of = [&](int64_t id) {
    std::string out;
    snapshot->AppendPayload(id, *all, &out);
    return out;
  };
  EXPECT_EQ(payload_of(1000), R"({"n":0})");
  EXPECT_EQ(payload_of(1000 + 7 * 2999), R"({"n":2999})");
  EXPECT_EQ(payload_of(1000 + 7 * 3), R"({"n":"upsert 3"})");
  EXPECT_EQ(payload_of(1000 + 7 * 4), R"({"text":"upsert 4"})");
  EXPECT_EQ(payload_of(5), R"({"n":"added"})");
  EXPECT_EQ(payload_of(1000 + 7 * 5), "");  // deleted

  // The delta's payloads are required, and must be one line per row.
  options.input_payloads.clear();
  absl::StatusOr<UpdateReport> missing = UpdateIndexFile(options);
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("--payloads"));
  std::ofstream(payloads) << R"({"n":1})" << "\n";
  options.input_payloads = payloads;
  absl::StatusOr<UpdateReport> short_file = UpdateIndexFile(options);
  EXPECT_THAT(short_file.status().message(),
              HasSubstr("holds 1 lines for the input's 3 rows"));
}

TEST(UpdateIndexFile, RefusesWhatItCannotUpdate) {
  TempDir dir;
  BuildSpec spec;
  spec.n = 1000;
  spec.d = kDim;
  spec.factory = "IVF8,PQ16x4fs";
  spec.ids.resize(1000);
  for (int i = 0; i < 1000; ++i) spec.ids[i] = 5000 + i;
  BuildIndex(dir.path("own.index"), spec);
  const Matrix input = AsMatrix(MakeData(2, kDim, 3));
  UpdateOptions options;
  options.base_path = dir.path("own.index");
  options.output_path = dir.path("new.index");
  options.input = &input;
  options.input_name = "delta.npy";
  EXPECT_THAT(UpdateIndexFile(options).status().message(),
              HasSubstr("give the ids of delta.npy"));
  options.output_path = options.base_path;
  EXPECT_THAT(UpdateIndexFile(options).status().message(),
              HasSubstr("cannot overwrite its base"));
  spec.factory = "IVF8,PQ8";
  spec.ids.clear();
  BuildIndex(dir.path("pq8.index"), spec);
  options.base_path = dir.path("pq8.index");
  options.output_path = dir.path("new.index");
  EXPECT_THAT(UpdateIndexFile(options).status().message(),
              HasSubstr("only knnd FastScan indexes"));
}

}  // namespace
}  // namespace knnd

// ShardSetSearch answers a shard set's searches as the unsharded index of
// the same quantizers answers them (with and without re-ranking, own ids
// too), numbers the set's rows as the whole index does, and refuses files
// that are not the shards of one split, by name.
#include "knnd/index/shard_set_search.h"

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_sharding.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/storage/version_manifest.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kShards = 3;
constexpr int kK = 10;

BuildSpec Spec(bool own_ids) {
  BuildSpec spec;
  spec.n = 3000;
  spec.d = 32;
  spec.seed = 5;
  spec.factory = "IVF32,PQ32x4fs";
  spec.vectors = VectorsDtype::kFloat32;
  if (own_ids) {
    std::mt19937_64 rng(9);
    for (int64_t i = 0; i < spec.n; ++i) {
      spec.ids.push_back(static_cast<int64_t>(rng() >> 1));
    }
  }
  return spec;
}

LoadOptions Load() {
  LoadOptions options;
  options.probe_in_subprocess = false;
  return options;
}

struct Answer {
  std::vector<int64_t> ids;
  std::vector<float> distances;
};

Answer Search(const MeasuredIndex& index, const std::vector<float>& queries,
              int nprobe, int refine_factor) {
  Answer answer;
  const int64_t n = static_cast<int64_t>(queries.size()) / index.info().dim;
  answer.ids.resize(static_cast<size_t>(n) * kK);
  answer.distances.resize(answer.ids.size());
  SearchArgs args;
  args.queries = queries.data();
  args.num_queries = n;
  args.k = kK;
  args.nprobe = nprobe;
  args.refine_factor = refine_factor;
  args.ids = answer.ids.data();
  args.distances = answer.distances.data();
  const absl::Status status = index.Search(args);
  EXPECT_TRUE(status.ok()) << status;
  return answer;
}

TEST(ShardSetSearch, AnswersAsTheUnshardedIndexAndNumbersItsRows) {
  for (bool own_ids : {false, true}) {
    SCOPED_TRACE(own_ids ? "own ids" : "row ids");
    TempDir dir;
    const std::string whole = dir.path("x.index");
    BuildIndex(whole, Spec(own_ids));
    ASSERT_TRUE(ShardIndexFile(whole, kShards, whole, "test").ok());
    auto snapshot = IndexSnapshot::Load(whole, Load());
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    auto set = ShardSetSearch::Load(whole, kShards, Load());
    ASSERT_TRUE(set.ok()) << set.status();
    const MeasuredSnapshot one(**snapshot);
    EXPECT_EQ((*set)->info().ntotal, one.info().ntotal);
    EXPECT_EQ((*set)->info().shard_count, kShards);
    EXPECT_TRUE((*set)->info().has_vectors);
    for (int64_t row = 0; row < one.info().ntotal; ++row) {
      ASSERT_EQ((*set)->IdOfRow(row), one.IdOfRow(row)) << "row " << row;
    }

    const std::vector<float> queries = knnd::testing::MakeData(60, 32, 6);
    for (int refine : {0, 3}) {
      for (int nprobe : {2, 32}) {
        SCOPED_TRACE(absl::StrCat("nprobe ", nprobe, " refine ", refine));
        const Answer merged = Search(**set, queries, nprobe, refine);
        const Answer unsharded = Search(one, queries, nprobe, refine);
        EXPECT_EQ(merged.distances, unsharded.distances);
        // Ids alike, but among ties at a row's k-th distance, of which any
        // may be the one returned.
        for (size_t q = 0; q < merged.ids.size() / kK; ++q) {
          const float last = unsharded.distances[q * kK + kK - 1];
          for (int j = 0; j < kK; ++j) {
            if (unsharded.distances[q * kK + j] == last) break;
            EXPECT_EQ(merged.ids[q * kK + j], unsharded.ids[q * kK + j])
                << "query " << q << " rank " << j;
          }
        }
      }
    }
  }
}

TEST(ShardSetSearch, RefusesFilesThatAreNotTheShardsOfOneSplit) {
  TempDir dir;
  const std::string whole = dir.path("x.index");
  BuildIndex(whole, Spec(false));
  ASSERT_TRUE(ShardIndexFile(whole, kShards, whole, "test").ok());
  ASSERT_TRUE(ShardIndexFile(whole, kShards, dir.path("y.index"), "test").ok());

  EXPECT_THAT(ShardSetSearch::Load(whole, 0, Load()).status().message(),
              HasSubstr("--shards=0 is outside [1, 256]"));
  // Asked for 2 shards of a set of 3: the files of a 2-way split are not
  // there.
  EXPECT_FALSE(ShardSetSearch::Load(whole, 2, Load()).ok());

  // Shard 1 of another split (another build id) in place of x's.
  namespace fs = std::filesystem;
  const std::string from = ShardPath(dir.path("y.index"), 1, kShards);
  const std::string to = ShardPath(whole, 1, kShards);
  for (const auto& [a, b] :
       {std::make_pair(from, to),
        std::make_pair(MetadataPath(from), MetadataPath(to)),
        std::make_pair(ManifestPath(from), ManifestPath(to)),
        std::make_pair(VectorsPath(from), VectorsPath(to))}) {
    fs::copy_file(a, b, fs::copy_options::overwrite_existing);
  }
  const absl::Status mixed =
      ShardSetSearch::Load(whole, kShards, Load()).status();
  EXPECT_EQ(mixed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mixed.message(), HasSubstr(absl::StrCat(to, " is of build ")));

  // Shard 2 renamed to be shard 1.
  for (const auto& [a, b] :
       {std::make_pair(ShardPath(whole, 2, kShards), to),
        std::make_pair(MetadataPath(ShardPath(whole, 2, kShards)),
                       MetadataPath(to)),
        std::make_pair(ManifestPath(ShardPath(whole, 2, kShards)),
                       ManifestPath(to)),
        std::make_pair(VectorsPath(ShardPath(whole, 2, kShards)),
                       VectorsPath(to))}) {
    fs::copy_file(a, b, fs::copy_options::overwrite_existing);
  }
  EXPECT_THAT(ShardSetSearch::Load(whole, kShards, Load()).status().message(),
              HasSubstr(absl::StrCat(to,
                                     " is shard 2 of 3 by its sidecar; "
                                     "shard 1 of 3")));

  // Filtered searches are a front's, not a measure of the set.
  auto set = ShardSetSearch::Load(dir.path("y.index"), kShards, Load());
  ASSERT_TRUE(set.ok()) << set.status();
  const std::vector<float> query = knnd::testing::MakeData(1, 32, 6);
  std::vector<int64_t> ids(kK);
  std::vector<float> distances(kK);
  const std::vector<int64_t> allowed = {1, 2, 3};
  SearchArgs args;
  args.queries = query.data();
  args.num_queries = 1;
  args.k = kK;
  args.allowed_ids = allowed;
  args.ids = ids.data();
  args.distances = distances.data();
  EXPECT_EQ((*set)->Search(args).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace knnd

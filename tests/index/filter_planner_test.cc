// The planner of filtered searches: few matching rows are searched exactly
// (the true neighbours among them, recall 1.0); otherwise the IVF scan
// widens nprobe until every query has k matches whenever k rows match, at
// selectivities from 0.1% to 99%, for 8-bit IVF-PQ and FastScan alike; an
// allow-list and a filter together admit only the rows both admit.
#include "knnd/index/filter_planner.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "knnd/index/index_builder.h"
#include "knnd/index/index_sharding.h"
#include "knnd/index/prepared_filter.h"
#include "knnd/serving/search_request.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BruteForceNeighbors;
using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::MakeAttributes;
using ::knnd::testing::MakeData;
using ::knnd::testing::NormalizedRows;
using ::knnd::testing::SearchPrepared;
using ::knnd::testing::SearchResults;
using ::knnd::testing::SearchSnapshot;
using ::knnd::testing::TempDir;

constexpr int64_t kRows = 4000;
constexpr int kDim = 32;
constexpr int kK = 10;

// The plan PrepareRows chooses for a filter admitting `rows` (with
// `lists`, when the filter cache keeps them) on `snapshot`, for k = kK.
FilterPlan PlanOf(const IndexSnapshot& snapshot, const RowBitmap& rows,
                  int nprobe, int refine_factor,
                  std::shared_ptr<const FilteredLists> lists = nullptr) {
  return PrepareRows(snapshot, std::make_shared<const RowBitmap>(rows),
                     std::move(lists), {1, kK, nprobe, refine_factor})
      .plan;
}

// Rows whose "u" lies in [0, 100000 * fraction): about that fraction.
knnd::v1::Filter UBelow(double fraction) {
  knnd::v1::Filter filter;
  knnd::v1::Condition* c = filter.mutable_condition();
  c->set_field("u");
  c->mutable_range()->mutable_lt()->set_int_value(
      static_cast<int64_t>(100000 * fraction));
  return filter;
}

struct Built {
  std::vector<float> base;
  AttributeColumns attributes;
};

Built Build(const std::string& path, const std::string& factory,
            std::vector<int64_t> ids = {}) {
  BuildSpec spec;
  spec.n = kRows;
  spec.d = kDim;
  spec.factory = factory;
  spec.vectors = VectorsDtype::kFloat32;
  spec.ids = std::move(ids);
  spec.attributes = MakeAttributes(kRows, 21);
  Built built;
  built.attributes = *spec.attributes;
  built.base = BuildIndex(path, spec);
  return built;
}

// The exact k nearest rows among those `rows` admits, as row numbers (by
// `metric`: for cosine, `base` holds the normalised rows).
std::vector<int64_t> ExactAmong(const std::vector<float>& base,
                                const RowBitmap& rows,
                                const std::vector<float>& queries,
                                Metric metric = Metric::kL2) {
  const std::vector<int64_t> held = rows.Rows();
  std::vector<float> subset;
  for (int64_t r : held) {
    subset.insert(subset.end(), base.begin() + r * kDim,
                  base.begin() + (r + 1) * kDim);
  }
  std::vector<int64_t> out =
      BruteForceNeighbors(subset, queries, kDim, kK, metric);
  for (int64_t& i : out) i = i < 0 ? -1 : held[i];
  return out;
}

// A FastScan index of 1M rows of 128 dims, M 64, in `nlist` lists.
IndexFacts OneMillionRows(int64_t nlist) {
  IndexFacts facts;
  facts.dim = facts.ivf_dim = 128;
  facts.ntotal = 1000000;
  facts.nlist = nlist;
  facts.pq_m = 64;
  facts.pq_nbits = 4;
  facts.fastscan = true;
  return facts;
}

TEST(FilterPlanner, PlansHaveTheirNames) {
  EXPECT_STREQ(FilterPlanName(FilterPlan::kExact), "exact");
  EXPECT_STREQ(FilterPlanName(FilterPlan::kIvf), "ivf");
  EXPECT_STREQ(FilterPlanName(FilterPlan::kFlat), "flat");
}

TEST(FilterPlanner, ChoosesExactForFewRowsAndOnlyWithVectors) {
  const IndexFacts facts = OneMillionRows(4096);
  FilterPlanInput input;
  input.nprobe = 16;
  input.candidates = 40;
  input.has_vectors = true;
  input.matched_rows = 1000;
  EXPECT_EQ(ChooseFilterPlan(facts, input), FilterPlan::kExact);
  input.matched_rows = 500000;
  EXPECT_EQ(ChooseFilterPlan(facts, input), FilterPlan::kIvf);
  EXPECT_EQ(StartingNprobe(facts, input), 23);  // 16 / sqrt(0.5)
  input.matched_rows = 10000;  // 1%: 16 / sqrt(0.01)
  EXPECT_EQ(StartingNprobe(facts, input), 160);
  input.matched_rows = 200000;  // 20%: 16 / sqrt(0.2) = 36, but
  input.candidates = 4000;      // 4000 matches need 82 lists' worth
  EXPECT_EQ(StartingNprobe(facts, input), 82);
  input.candidates = 40;
  input.matched_rows = 1;
  EXPECT_EQ(StartingNprobe(facts, input), 4096);
  input.has_vectors = false;
  EXPECT_EQ(ChooseFilterPlan(facts, input), FilterPlan::kIvf);
}

// A filter's own lists make the IVF plan read only its matching codes:
// where the whole lists' codes made it dearer than the exact plan, their
// matches alone can make it cheaper (1M rows, 1,024 lists, 2,000 matches:
// 45 lists' look-up tables and 88 codes against 2,000 rows' distances).
TEST(FilterPlanner, FilteredListsMakeTheIvfPlanCheaper) {
  IndexFacts facts = OneMillionRows(1024);
  facts.by_residual = true;
  FilterPlanInput input = PlanInputFor(2000, 2, 10, 6, true);
  EXPECT_EQ(StartingNprobe(facts, input), 45);  // 2 / sqrt(0.002)
  EXPECT_EQ(ChooseFilterPlan(facts, input), FilterPlan::kExact);
  input.filtered_lists = true;
  EXPECT_EQ(StartingNprobe(facts, input), 45);  // the same lists
  EXPECT_EQ(ChooseFilterPlan(facts, input), FilterPlan::kIvf);
  input.matched_rows = 200;  // few enough for the exact plan still
  EXPECT_EQ(ChooseFilterPlan(facts, input), FilterPlan::kExact);
  // Codes that are not residuals (knnd's default recipe): one table per
  // query, so every match's code without the coarse search beats both.
  facts.by_residual = false;
  EXPECT_EQ(ChooseFilterPlan(facts, input), FilterPlan::kFlat);
  input.matched_rows = 2000;
  EXPECT_EQ(ChooseFilterPlan(facts, input), FilterPlan::kFlat);
  input.matched_rows = 200000;  // 20%: the IVF scan of the matches
  EXPECT_EQ(ChooseFilterPlan(facts, input), FilterPlan::kIvf);
  input.filtered_lists = false;  // the flat plan needs the lists
  input.matched_rows = 2000;
  EXPECT_EQ(ChooseFilterPlan(facts, input), FilterPlan::kExact);
}

// A filter is planned once, when it is prepared: IndexSnapshot::Search
// runs the plan the PreparedFilter holds, not one of its own (a plan set by
// hand is the one that runs), and refuses a filter passed in SearchArgs
// unprepared.
TEST(FilterPlanner, SearchRunsThePreparedPlanWithoutPlanningAgain) {
  TempDir tmp;
  const Built built = Build(tmp.path("x.index"), "IVF32,PQ8");
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(tmp.path("x.index"));
  ASSERT_NE(snapshot, nullptr);
  absl::StatusOr<RowBitmap> rows =
      snapshot->CompileFilter(UBelow(0.5), {}, FilterLimits{});
  ASSERT_TRUE(rows.ok()) << rows.status();
  const std::vector<float> queries = MakeData(20, kDim, 97);
  const int64_t n = static_cast<int64_t>(queries.size()) / kDim;
  PreparedFilter prepared =
      PrepareRows(*snapshot, std::make_shared<const RowBitmap>(*rows), nullptr,
                  {n, kK, 2, 0});
  ASSERT_EQ(prepared.plan, FilterPlan::kIvf);
  const std::vector<int64_t> exact = ExactAmong(built.base, *rows, queries);
  // The IVF plan's estimates, not exact.
  EXPECT_NE(SearchPrepared(*snapshot, queries, kK, 2, 0, &prepared).ids, exact);
  prepared.plan = FilterPlan::kExact;
  EXPECT_EQ(SearchPrepared(*snapshot, queries, kK, 2, 0, &prepared).ids, exact);

  std::vector<float> distances(n * kK);
  std::vector<int64_t> ids(n * kK);
  SearchArgs args;
  args.queries = queries.data();
  args.num_queries = n;
  args.k = kK;
  args.nprobe = 2;
  args.distances = distances.data();
  args.ids = ids.data();
  args.allowed_rows = &*rows;
  const absl::Status unprepared = snapshot->Search(args);
  EXPECT_EQ(unprepared.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unprepared.message()),
              ::testing::HasSubstr("comes prepared"));
}

TEST(FilterPlanner, ExactPlanReturnsTheTrueNeighboursAmongMatches) {
  TempDir tmp;
  const Built built = Build(tmp.path("x.index"), "IVF32,PQ8");
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(tmp.path("x.index"));
  ASSERT_NE(snapshot, nullptr);
  ASSERT_TRUE(snapshot->info().has_attributes);
  absl::StatusOr<RowBitmap> rows =
      snapshot->CompileFilter(UBelow(0.01), {}, FilterLimits{});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(PlanOf(*snapshot, *rows, 1, 0), FilterPlan::kExact);
  const std::vector<float> queries = MakeData(20, kDim, 99);
  const std::vector<int64_t> want = ExactAmong(built.base, *rows, queries);
  for (int refine : {0, 4}) {
    const SearchResults got =
        SearchSnapshot(*snapshot, queries, kK, 1, refine, {}, &*rows);
    EXPECT_EQ(got.ids, want) << "refine_factor " << refine;
  }
}

// Few matches are searched exactly, as SearchRequest.filter promises, on
// an index served without re-ranking too (refine_factor 0, an untuned
// index): a kept filter of ~40 rows, whose codes the flat plan could scan
// for less, gets the true neighbours among them, not the order of their
// codes' estimates. With re-ranking the flat plan still serves it.
TEST(FilterPlanner, FewMatchesAreSearchedExactlyWithoutReranking) {
  TempDir tmp;
  const Built built = Build(tmp.path("x.index"), "IVF32,PQ16x4fs");
  LoadOptions options;
  options.probe_in_subprocess = false;
  options.filter_cache_bytes = 1 << 20;
  std::unique_ptr<IndexSnapshot> snapshot =
      LoadSnapshot(tmp.path("x.index"), options);
  ASSERT_NE(snapshot, nullptr);
  ASSERT_FALSE(snapshot->info().by_residual);
  knnd::v1::SearchRequest request;
  *request.mutable_filter() = UBelow(0.01);
  ParsedSearch parsed;
  for (int sighting = 0; sighting < 2; ++sighting) {  // kept on the second
    parsed = ParsedSearch();
    parsed.num_queries = 1;
    parsed.k = kK;
    parsed.nprobe = 2;
    ASSERT_TRUE(ParseFilter(request, *snapshot, SearchLimits{}, parsed).ok());
  }
  ASSERT_TRUE(parsed.filter.has_value());
  ASSERT_NE(parsed.filter->lists, nullptr);
  ASSERT_LT(parsed.filter->matched_rows, 100);
  EXPECT_EQ(parsed.filter->plan, FilterPlan::kExact);
  const std::vector<float> queries = MakeData(20, kDim, 91);
  EXPECT_EQ(SearchPrepared(*snapshot, queries, kK, 2, 0, &*parsed.filter).ids,
            ExactAmong(built.base, *parsed.filter->rows, queries));
  EXPECT_EQ(PlanOf(*snapshot, *parsed.filter->rows, 2, 4, parsed.filter->lists),
            FilterPlan::kFlat);
}

TEST(FilterPlanner, IvfPlanFindsKMatchesWheneverKRowsMatch) {
  TempDir tmp;
  const std::vector<float> queries = MakeData(30, kDim, 98);
  for (const char* factory : {"IVF32,PQ8", "IVF32,PQ16x4fs"}) {
    SCOPED_TRACE(factory);
    const std::string path = tmp.path(absl::StrCat(factory, ".index"));
    Build(path, factory);
    // Without its vectors the index must take the IVF plan.
    LoadOptions options;
    options.vectors = VectorsPolicy::kIgnore;
    std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(path, options);
    ASSERT_NE(snapshot, nullptr);
    for (double fraction : {0.001, 0.01, 0.1, 0.5, 0.99}) {
      SCOPED_TRACE(fraction);
      absl::StatusOr<RowBitmap> rows =
          snapshot->CompileFilter(UBelow(fraction), {}, FilterLimits{});
      ASSERT_TRUE(rows.ok()) << rows.status();
      const int64_t expect = std::min<int64_t>(kK, rows->Count());
      const SearchResults got =
          SearchSnapshot(*snapshot, queries, kK, 1, 0, {}, &*rows);
      for (size_t q = 0; q < queries.size() / kDim; ++q) {
        std::set<int64_t> seen;
        for (int j = 0; j < kK; ++j) {
          const int64_t id = got.ids[q * kK + j];
          if (id < 0) continue;
          EXPECT_TRUE(rows->Test(id)) << "id " << id;
          seen.insert(id);
        }
        ASSERT_EQ(static_cast<int64_t>(seen.size()), expect) << "query " << q;
      }
    }
  }
}

// Filters that follow the vector space, on rows shaped like text
// embeddings: 32 seeded clusters on a 16-dim subspace of R^32, plus a
// little noise (4 lists a cluster here, 16,000 rows). A "topic" is the clusters
// c with c % 8 == t (4 clusters, 12.5% of the rows). Correlated: one topic,
// asked by queries near rows of every topic, most of them far from it.
// Anti-correlated: every topic but the query's own. Either way the first
// lists to hold k matches are not those holding the nearest ones; the IVF
// plan must find them all the same, for FastScan and 8-bit IVF-PQ: its
// recall@10 against the exact answer among the matches, re-ranked, close
// to the unfiltered search's at the same nprobe and refine_factor; without
// re-ranking (and without the vectors, so that the IVF plan is the only
// one), close to the recall of probing every list.
struct ClusteredCase {
  static constexpr int64_t kRows = 16000;
  std::vector<float> base;
  std::vector<int> topic;  // of each row
  std::vector<float> queries;
  std::vector<int> query_topic;
};

ClusteredCase MakeClusteredCase() {
  constexpr int kLatent = 16;
  constexpr int kClusters = 32;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> basis(kLatent * kDim), centres(kClusters * kLatent);
  for (float& v : basis) v = normal(rng) / std::sqrt(float{kLatent});
  for (float& v : centres) v = normal(rng);
  ClusteredCase c;
  std::uniform_int_distribution<int> pick(0, kClusters - 1);
  std::vector<float> z(kLatent);
  for (int64_t r = 0; r < c.kRows; ++r) {
    const int cluster = pick(rng);
    c.topic.push_back(cluster % 8);
    for (int i = 0; i < kLatent; ++i) {
      z[i] = centres[cluster * kLatent + i] + 0.5f * normal(rng);
    }
    for (int j = 0; j < kDim; ++j) {
      float v = 0.05f * normal(rng);
      for (int i = 0; i < kLatent; ++i) v += z[i] * basis[i * kDim + j];
      c.base.push_back(v);
    }
  }
  // Queries near 48 rows spread over the set.
  for (int64_t r = 0; r < c.kRows; r += c.kRows / 48) {
    for (int j = 0; j < kDim; ++j) {
      c.queries.push_back(c.base[r * kDim + j] + 0.1f * normal(rng));
    }
    c.query_topic.push_back(c.topic[r]);
  }
  return c;
}

// The rows of topic t (same) or of every other topic.
RowBitmap TopicRows(const ClusteredCase& c, int t, bool same) {
  RowBitmap rows(c.kRows);
  for (int64_t r = 0; r < c.kRows; ++r) {
    if ((c.topic[r] == t) == same) rows.Set(r);
  }
  return rows;
}

// The share of the exact answer's ids that `got` holds, over all queries.
double Recall(const std::vector<int64_t>& got,
              const std::vector<int64_t>& want) {
  int64_t same = 0, total = 0;
  for (size_t q = 0; q < want.size() / kK; ++q) {
    const std::set<int64_t> truth(want.begin() + q * kK,
                                  want.begin() + (q + 1) * kK);
    for (int j = 0; j < kK; ++j) {
      if (want[q * kK + j] >= 0) ++total;
      const int64_t id = got[q * kK + j];
      if (id >= 0 && truth.count(id) > 0) ++same;
    }
  }
  return total > 0 ? static_cast<double>(same) / total : 1.0;
}

// Recall@10 of `snapshot` at nprobe and refine_factor with each query's
// filter (the correlated one for all, or the anti-correlated one of its
// topic, its queries searched together), by the IVF plan; `base`: the rows
// as the index holds them (normalised for cosine).
double FilteredRecall(const IndexSnapshot& snapshot, const ClusteredCase& c,
                      const std::vector<float>& base, bool correlated,
                      int nprobe, int refine) {
  std::vector<int64_t> got, want;
  for (int t = 0; t < 8; ++t) {
    std::vector<float> queries;
    for (size_t q = 0; q < c.query_topic.size(); ++q) {
      if (correlated || c.query_topic[q] == t) {
        queries.insert(queries.end(), c.queries.begin() + q * kDim,
                       c.queries.begin() + (q + 1) * kDim);
      }
    }
    if (queries.empty()) continue;
    const RowBitmap rows =
        correlated ? TopicRows(c, 3, true) : TopicRows(c, t, false);
    EXPECT_EQ(PlanOf(snapshot, rows, nprobe, refine), FilterPlan::kIvf);
    const std::vector<int64_t> ids =
        SearchSnapshot(snapshot, queries, kK, nprobe, refine, {}, &rows).ids;
    got.insert(got.end(), ids.begin(), ids.end());
    const std::vector<int64_t> exact =
        ExactAmong(base, rows, queries, snapshot.info().metric);
    want.insert(want.end(), exact.begin(), exact.end());
    if (correlated) break;
  }
  return Recall(got, want);
}

TEST(FilterPlanner, IvfPlanKeepsItsRecallWhenTheFilterFollowsTheSpace) {
  TempDir tmp;
  const ClusteredCase c = MakeClusteredCase();
  constexpr int kNprobe = 4;
  constexpr int kNlist = 128;
  struct Case {
    const char* factory;
    Metric metric;
  };
  for (const Case& kind :
       {Case{"IVF128,PQ16x4fs", Metric::kL2}, Case{"IVF128,PQ8", Metric::kL2},
        Case{"IVF128,PQ16x4fs", Metric::kCosine}}) {
    SCOPED_TRACE(absl::StrCat(kind.factory, " ", MetricName(kind.metric)));
    BuildSpec spec;
    spec.n = c.kRows;
    spec.d = kDim;
    spec.rows = c.base;
    spec.factory = kind.factory;
    spec.metric = kind.metric;
    spec.vectors = VectorsDtype::kFloat32;
    const std::string path =
        tmp.path(absl::StrCat(kind.factory, MetricName(kind.metric), ".index"));
    BuildIndex(path, spec);
    std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(path);
    LoadOptions codes_only_options;
    codes_only_options.vectors = VectorsPolicy::kIgnore;
    std::unique_ptr<IndexSnapshot> codes_only =
        LoadSnapshot(path, codes_only_options);
    ASSERT_NE(snapshot, nullptr);
    ASSERT_NE(codes_only, nullptr);
    ASSERT_EQ(snapshot->info().nlist, kNlist);
    const std::vector<float> base =
        kind.metric == Metric::kCosine ? NormalizedRows(c.base, kDim) : c.base;
    const double unfiltered =
        Recall(SearchSnapshot(*snapshot, c.queries, kK, kNprobe, 4).ids,
               BruteForceNeighbors(base, c.queries, kDim, kK, kind.metric));
    for (bool correlated : {true, false}) {
      SCOPED_TRACE(correlated ? "correlated" : "anti-correlated");
      const double reranked =
          FilteredRecall(*snapshot, c, base, correlated, kNprobe, 4);
      const double estimated =
          FilteredRecall(*codes_only, c, base, correlated, kNprobe, 0);
      const double every_list =
          FilteredRecall(*codes_only, c, base, correlated, kNlist, 0);
      EXPECT_GE(reranked, unfiltered - 0.02);
      EXPECT_GE(estimated, every_list - 0.03);
    }
  }
}

TEST(FilterPlanner, AllowListAndFilterAdmitOnlyRowsBothAdmit) {
  TempDir tmp;
  // Own sparse ids: the allow-list speaks them, the filter rows.
  std::vector<int64_t> ids(kRows);
  for (int64_t r = 0; r < kRows; ++r) ids[r] = 7 * r + 3;
  Build(tmp.path("x.index"), "IVF32,PQ16x4fs", ids);
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(tmp.path("x.index"));
  ASSERT_NE(snapshot, nullptr);
  std::vector<int64_t> allowed;
  for (int64_t r = 0; r < kRows; r += 2) allowed.push_back(ids[r]);
  absl::StatusOr<RowBitmap> filter_only =
      snapshot->CompileFilter(UBelow(0.5), {}, FilterLimits{});
  absl::StatusOr<RowBitmap> rows =
      snapshot->CompileFilter(UBelow(0.5), allowed, FilterLimits{});
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (int64_t r = 0; r < kRows; ++r) {
    ASSERT_EQ(rows->Test(r), filter_only->Test(r) && r % 2 == 0) << r;
  }
  const std::vector<float> queries = MakeData(10, kDim, 97);
  const SearchResults got =
      SearchSnapshot(*snapshot, queries, kK, 2, 4, {}, &*rows);
  for (int64_t id : got.ids) {
    ASSERT_GE(id, 0);
    ASSERT_EQ((id - 3) % 7, 0);
    EXPECT_TRUE(rows->Test((id - 3) / 7)) << id;
  }
}

// A filter of one numeric condition searched through its bounds
// (SearchArgs::allowed_range) answers exactly what its bitmap answers, on
// both plans, with and without re-ranking, in a shard whose list ids start
// past 0 (rows without a score never match).
TEST(FilterPlanner, ColumnRangeSearchesLikeItsBitmapInAShard) {
  TempDir tmp;
  const std::string path = tmp.path("x.index");
  Build(path, "IVF32,PQ16x4fs");
  ASSERT_TRUE(ShardIndexFile(path, 3, path, "test").ok());
  std::unique_ptr<IndexSnapshot> shard = LoadSnapshot(ShardPath(path, 1, 3));
  ASSERT_NE(shard, nullptr);
  ASSERT_GT(shard->info().shard_first_id, 0);
  const std::vector<float> queries = MakeData(12, kDim, 96);
  std::vector<knnd::v1::Filter> filters;
  for (double fraction : {0.002, 0.1, 0.5, 0.99}) {
    filters.push_back(UBelow(fraction));
    knnd::v1::Filter score;
    knnd::v1::Condition* c = score.mutable_condition();
    c->set_field("score");
    c->mutable_range()->mutable_gte()->set_float_value(1 - fraction);
    filters.push_back(score);
  }
  bool exact = false;
  bool ivf = false;
  for (const knnd::v1::Filter& filter : filters) {
    SCOPED_TRACE(filter.ShortDebugString());
    absl::StatusOr<RowBitmap> rows = shard->CompileFilter(filter, {}, {});
    ASSERT_TRUE(rows.ok()) << rows.status();
    absl::StatusOr<std::optional<ColumnRange>> range =
        shard->CompileColumnRange(filter, {});
    ASSERT_TRUE(range.ok()) << range.status();
    ASSERT_TRUE(range->has_value());
    ASSERT_EQ((*range)->matched, rows->Count());
    (PlanOf(*shard, *rows, 2, 0) == FilterPlan::kExact ? exact : ivf) = true;
    for (int refine : {0, 4}) {
      const SearchResults want =
          SearchSnapshot(*shard, queries, kK, 2, refine, {}, &*rows);
      const SearchResults got =
          SearchSnapshot(*shard, queries, kK, 2, refine, {}, nullptr, &**range);
      EXPECT_EQ(got.ids, want.ids) << "refine_factor " << refine;
      EXPECT_EQ(got.distances, want.distances) << "refine_factor " << refine;
    }
  }
  EXPECT_TRUE(exact);
  EXPECT_TRUE(ivf);

  // A request keeps the bounds where they cost less than a bitmap: one
  // query at 50%; not 64 queries at 10%, whose scans test more codes than
  // the bitmap sets rows. The matched rows are the bitmap's either way.
  struct Case {
    double fraction;
    int64_t queries;
    bool bounds;
  };
  for (const Case& c : {Case{0.5, 1, true}, Case{0.1, 64, false}}) {
    SCOPED_TRACE(c.fraction);
    knnd::v1::SearchRequest request;
    *request.mutable_filter() = UBelow(c.fraction);
    ParsedSearch parsed;
    parsed.num_queries = c.queries;
    parsed.k = kK;
    parsed.nprobe = 2;
    ASSERT_TRUE(ParseFilter(request, *shard, SearchLimits{}, parsed).ok());
    ASSERT_TRUE(parsed.filter.has_value());
    EXPECT_EQ(parsed.filter->range.has_value(), c.bounds);
    EXPECT_EQ(parsed.filter->rows != nullptr, !c.bounds);
    EXPECT_EQ(parsed.filter->matched_rows,
              shard->CompileFilter(UBelow(c.fraction), {}, {})->Count());
  }
}

// The filter cache (filter_cache.h) through ParseFilter: a filter compiled
// to a bitmap is kept at once and found next time (the same bitmap); one
// searched through its bounds is compiled and kept on its second miss,
// then found, and the search through the kept bitmap answers what the
// bounds answered; the exact plan keeps its bounds and asks no cache; an
// allow-list asks none. The cache's bound is counted with the index's heap.
TEST(FilterPlanner, RepeatedFiltersAreServedFromTheSnapshotsCache) {
  TempDir tmp;
  const std::string path = tmp.path("x.index");
  Build(path, "IVF32,PQ16x4fs");
  LoadOptions options;
  options.probe_in_subprocess = false;
  options.filter_cache_bytes = 1 << 20;
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(path, options);
  ASSERT_NE(snapshot, nullptr);
  ASSERT_NE(snapshot->filter_cache(), nullptr);
  options.filter_cache_bytes = 0;
  std::unique_ptr<IndexSnapshot> uncached = LoadSnapshot(path, options);
  ASSERT_NE(uncached, nullptr);
  EXPECT_EQ(uncached->filter_cache(), nullptr);
  EXPECT_EQ(snapshot->info().filter_cache_bytes, 1 << 20);
  EXPECT_EQ(snapshot->info().heap_bytes - uncached->info().heap_bytes, 1 << 20);

  using Use = PreparedFilter::CacheUse;
  auto parse = [&](const IndexSnapshot& s, const knnd::v1::Filter& filter,
                   int64_t queries, std::vector<int64_t> allowed_ids = {}) {
    knnd::v1::SearchRequest request;
    *request.mutable_filter() = filter;
    ParsedSearch parsed;
    parsed.num_queries = queries;
    parsed.k = kK;
    parsed.nprobe = 2;
    parsed.allowed_ids = std::move(allowed_ids);
    EXPECT_TRUE(ParseFilter(request, s, SearchLimits{}, parsed).ok());
    EXPECT_TRUE(parsed.filter.has_value());
    return parsed.filter.value_or(PreparedFilter());
  };
  const std::vector<float> queries = MakeData(1, kDim, 77);

  // 50% for one query: the bounds first, compiled and kept on the second
  // miss, found on the third; the same answers each time.
  const knnd::v1::Filter half = UBelow(0.5);
  const PreparedFilter first = parse(*snapshot, half, 1);
  EXPECT_EQ(first.cache_use, Use::kMiss);
  ASSERT_TRUE(first.range.has_value());
  const PreparedFilter second = parse(*snapshot, half, 1);
  EXPECT_EQ(second.cache_use, Use::kMiss);
  ASSERT_NE(second.rows, nullptr);
  EXPECT_TRUE(second.cached);
  const PreparedFilter third = parse(*snapshot, half, 1);
  EXPECT_EQ(third.cache_use, Use::kHit);
  EXPECT_EQ(third.rows, second.rows);
  EXPECT_TRUE(third.cached);
  EXPECT_EQ(third.matched_rows, first.matched_rows);
  EXPECT_EQ(third.matched_rows, third.rows->Count());
  const SearchResults bounds =
      SearchSnapshot(*snapshot, queries, kK, 2, 4, {}, nullptr, &*first.range);
  const SearchResults kept =
      SearchSnapshot(*snapshot, queries, kK, 2, 4, {}, third.rows.get());
  EXPECT_EQ(kept.ids, bounds.ids);
  EXPECT_EQ(kept.distances, bounds.distances);

  // A filter compiled anyway (two conditions) is kept at once.
  knnd::v1::Filter both;
  *both.mutable_all_of()->add_filters() = UBelow(0.3);
  *both.mutable_all_of()->add_filters() = UBelow(0.6);
  const PreparedFilter compiled = parse(*snapshot, both, 1);
  EXPECT_EQ(compiled.cache_use, Use::kMiss);
  EXPECT_TRUE(compiled.cached);
  const PreparedFilter found = parse(*snapshot, both, 1);
  EXPECT_EQ(found.cache_use, Use::kHit);
  EXPECT_EQ(found.rows, compiled.rows);

  // The exact plan (0.2% of 4,000 rows) keeps the bounds the first time,
  // and, since the snapshot keeps lists for so few rows (for the flat
  // plan), is compiled and kept the second time.
  const PreparedFilter exact = parse(*snapshot, UBelow(0.002), 1);
  EXPECT_EQ(exact.cache_use, Use::kMiss);
  EXPECT_TRUE(exact.range.has_value());
  const PreparedFilter exact_kept = parse(*snapshot, UBelow(0.002), 1);
  EXPECT_EQ(exact_kept.cache_use, Use::kMiss);
  EXPECT_TRUE(exact_kept.cached);
  EXPECT_NE(exact_kept.lists, nullptr);
  EXPECT_EQ(parse(*snapshot, UBelow(0.002), 1).cache_use, Use::kHit);
  // An allow-list folded into the bitmap: nothing asked, nothing kept.
  const PreparedFilter listed = parse(*snapshot, both, 1, {1, 2, 3, 500});
  EXPECT_EQ(listed.cache_use, Use::kNone);
  ASSERT_NE(listed.rows, nullptr);
  EXPECT_FALSE(listed.cached);
  EXPECT_NE(listed.rows, compiled.rows);
  const FilterCache::Stats stats = snapshot->filter_cache()->stats();
  EXPECT_EQ(stats.entries, 3);
  EXPECT_EQ(stats.hits, 3);
  EXPECT_EQ(stats.misses, 5);

  // Without a cache: compiled per request, as before.
  const PreparedFilter plain = parse(*uncached, both, 1);
  EXPECT_EQ(plain.cache_use, Use::kNone);
  EXPECT_FALSE(plain.cached);
  EXPECT_EQ(*plain.rows, *compiled.rows);
  EXPECT_TRUE(parse(*uncached, half, 1).range.has_value());
  EXPECT_TRUE(parse(*uncached, half, 1).range.has_value());
}

// A kept filter admitting few rows of a FastScan index comes with its own
// lists (one in kFilteredListsRatio rows at most, counted in the cache's
// bytes); a search carrying them answers what the bitmap's search answers:
// by the IVF plan over the matches of the same lists, or, with codes that
// are not residuals (this recipe) and few matches, by the flat plan, every
// match's code, as the bitmap's scan of every list. A dense filter, or an
// 8-bit IVF-PQ index, keeps none.
TEST(FilterPlanner, SparseKeptFiltersKeepTheirLists) {
  TempDir tmp;
  Build(tmp.path("fs.index"), "IVF32,PQ16x4fs");
  Build(tmp.path("pq.index"), "IVF32,PQ8");
  LoadOptions options;
  options.probe_in_subprocess = false;
  options.filter_cache_bytes = 1 << 20;
  std::unique_ptr<IndexSnapshot> fastscan =
      LoadSnapshot(tmp.path("fs.index"), options);
  std::unique_ptr<IndexSnapshot> ivfpq =
      LoadSnapshot(tmp.path("pq.index"), options);
  LoadOptions without_vectors = options;
  without_vectors.vectors = VectorsPolicy::kIgnore;
  std::unique_ptr<IndexSnapshot> codes_only =
      LoadSnapshot(tmp.path("fs.index"), without_vectors);
  ASSERT_NE(fastscan, nullptr);
  ASSERT_NE(ivfpq, nullptr);
  ASSERT_NE(codes_only, nullptr);
  auto parse = [&](const IndexSnapshot& s, const knnd::v1::Filter& filter) {
    knnd::v1::SearchRequest request;
    *request.mutable_filter() = filter;
    ParsedSearch parsed;
    parsed.num_queries = 1;
    parsed.k = kK;
    parsed.nprobe = 2;
    EXPECT_TRUE(ParseFilter(request, s, SearchLimits{}, parsed).ok());
    EXPECT_TRUE(parsed.filter.has_value());
    return parsed.filter.value_or(PreparedFilter());
  };
  const std::vector<float> queries = MakeData(30, kDim, 78);
  for (const double fraction : {0.05, 0.2}) {
    parse(*fastscan, UBelow(fraction));  // bounds or kept: seen once
    const PreparedFilter kept = parse(*fastscan, UBelow(fraction));
    ASSERT_NE(kept.rows, nullptr) << fraction;
    ASSERT_TRUE(kept.cached) << fraction;
    ASSERT_NE(kept.lists, nullptr) << fraction;
    EXPECT_EQ(kept.lists->rows(), kept.matched_rows);
    const PreparedFilter hit = parse(*fastscan, UBelow(fraction));
    EXPECT_EQ(hit.cache_use, PreparedFilter::CacheUse::kHit);
    EXPECT_EQ(hit.lists, kept.lists);
    ASSERT_FALSE(fastscan->info().by_residual);
    // 5%: every match's code beats the coarse search; 20%: the IVF scan
    // of the probed lists' matches.
    const FilterPlan plan = PlanOf(*fastscan, *hit.rows, 2, 0, hit.lists);
    EXPECT_EQ(plan, fraction < 0.1 ? FilterPlan::kFlat : FilterPlan::kIvf);
    for (int refine : {0, 4}) {
      const PreparedFilter prepared = PrepareRows(
          *fastscan, hit.rows, hit.lists,
          {static_cast<int64_t>(queries.size()) / kDim, kK, 2, refine});
      const SearchResults with_lists =
          SearchPrepared(*fastscan, queries, kK, 2, refine, &prepared);
      if (refine == 0) {
        // The IVF scan through the bitmap (no vectors: never the exact
        // plan) of the same lists, or of every list for the flat plan,
        // which sees every match's code: the same answers.
        const SearchResults bitmap = SearchSnapshot(
            *codes_only, queries, kK,
            plan == FilterPlan::kFlat ? fastscan->info().nlist : 2, 0, {},
            hit.rows.get());
        EXPECT_EQ(with_lists.ids, bitmap.ids) << fraction;
        EXPECT_EQ(with_lists.distances, bitmap.distances) << fraction;
        continue;
      }
      // Re-ranked: the exact plan's true neighbours, nearly all.
      const SearchResults exact =
          SearchSnapshot(*fastscan, queries, kK, 2, refine, {}, hit.rows.get());
      const std::set<int64_t> admitted_ids = [&] {
        const std::vector<int64_t> r = hit.rows->Rows();
        return std::set<int64_t>(r.begin(), r.end());
      }();
      int64_t same = 0;
      for (size_t q = 0; q < exact.ids.size() / kK; ++q) {
        const std::set<int64_t> want(exact.ids.begin() + q * kK,
                                     exact.ids.begin() + (q + 1) * kK);
        for (int j = 0; j < kK; ++j) {
          const int64_t id = with_lists.ids[q * kK + j];
          ASSERT_EQ(admitted_ids.count(id), 1u) << id;
          same += static_cast<int64_t>(want.count(id));
        }
      }
      EXPECT_GE(same, static_cast<int64_t>(exact.ids.size()) * 9 / 10)
          << fraction;
    }
  }
  const FilterCache::Stats stats = fastscan->filter_cache()->stats();
  EXPECT_EQ(stats.entries, 2);
  const int64_t bitmaps = 2 * (RowBitmap(kRows).bytes());
  EXPECT_GT(stats.bytes, bitmaps + 1000);  // the lists are counted too

  // 50% of the rows (compiled on its second miss): no lists.
  parse(*fastscan, UBelow(0.5));
  const PreparedFilter dense = parse(*fastscan, UBelow(0.5));
  ASSERT_TRUE(dense.cached);
  EXPECT_EQ(dense.lists, nullptr);
  // 8-bit IVF-PQ: FAISS's scan cannot use lists. (Two conditions:
  // compiled and kept at once.)
  knnd::v1::Filter both;
  *both.mutable_all_of()->add_filters() = UBelow(0.05);
  *both.mutable_all_of()->add_filters() = UBelow(0.5);
  const PreparedFilter pq = parse(*ivfpq, both);
  ASSERT_TRUE(pq.cached);
  EXPECT_EQ(pq.lists, nullptr);
}

}  // namespace
}  // namespace knnd

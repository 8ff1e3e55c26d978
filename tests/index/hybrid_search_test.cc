#include "knnd/index/hybrid_search.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knnd/index/prepared_filter.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using testing::BuildIndex;
using testing::BuildSpec;
using testing::LoadSnapshot;
using testing::TempDir;

constexpr int kRows = 3000;
constexpr int kDim = 16;
constexpr int kQueries = 6;
constexpr int kK = 10;

const char* const kWords[] = {"alpha",  "beta",   "gamma",  "delta",
                              "服务器", "파일",   "config", "network",
                              "print",  "writer", "calc",   "table"};

// Rows of own ids (row * 7 + 3) whose payload text draws 4 to 9 words of
// kWords, skewed so that scores differ.
class HybridSearchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    path_ = new std::string(tmp_->path("hybrid"));
    BuildSpec spec;
    spec.n = kRows;
    spec.d = kDim;
    spec.factory = "IVF16,PQ8";
    spec.vectors = VectorsDtype::kFloat32;
    std::mt19937 rng(11);
    for (int r = 0; r < kRows; ++r) {
      spec.ids.push_back(int64_t{r} * 7 + 3);
      std::string text;
      const int words = 4 + static_cast<int>(rng() % 6);
      for (int w = 0; w < words; ++w) {
        const int i = static_cast<int>(std::min(rng() % 12, rng() % 12));
        text += std::string(kWords[i]) + " ";
      }
      spec.payloads.push_back("{\"text\":\"" + text + "\"}");
    }
    spec.text_field = "text";
    *base_ = BuildIndex(*path_, spec);
  }
  static void TearDownTestSuite() {
    delete tmp_;
    delete path_;
  }
  void SetUp() override {
    snapshot_ = LoadSnapshot(*path_);
    ASSERT_NE(snapshot_, nullptr);
    ASSERT_NE(snapshot_->text(), nullptr);
    queries_.assign(base_->begin(), base_->begin() + kQueries * kDim);
    for (float& v : queries_) v += 0.05f;
    texts_ = {"beta gamma", "服务器 config",       "파일 writer calc",
              "table",      "alpha delta network", "zebra"};
  }

  HybridQuery Query(Fusion fusion, int vector_window, int text_window) const {
    HybridQuery q;
    for (const std::string& t : texts_) {
      q.terms.push_back(snapshot_->text()->QueryTerms(t));
    }
    q.fusion = fusion;
    q.vector_window = vector_window;
    q.text_window = text_window;
    return q;
  }

  struct Answer {
    std::vector<int64_t> ids;
    std::vector<float> scores;
    std::vector<uint32_t> vector_ranks, text_ranks;
    std::vector<float> vector_scores, text_scores;
  };

  Answer Run(const HybridQuery& q, const PreparedFilter* filter = nullptr,
             std::vector<int64_t> allowed = {}) const {
    Answer a;
    const size_t n = static_cast<size_t>(kQueries * kK);
    a.ids.resize(n);
    a.scores.resize(n);
    a.vector_ranks.resize(n);
    a.text_ranks.resize(n);
    a.vector_scores.resize(n);
    a.text_scores.resize(n);
    SearchArgs args;
    args.queries = q.fusion == Fusion::kNone ? nullptr : queries_.data();
    args.num_queries = kQueries;
    args.k = kK;
    args.nprobe = 4;
    args.refine_factor = 2;
    args.allowed_ids = allowed;
    args.ids = a.ids.data();
    args.distances = a.scores.data();
    HybridOutputs out;
    if (q.fusion != Fusion::kNone) {
      out.vector_ranks = a.vector_ranks.data();
      out.vector_scores = a.vector_scores.data();
    }
    out.text_ranks = a.text_ranks.data();
    out.text_scores = a.text_scores.data();
    EXPECT_TRUE(SearchHybrid(*snapshot_, args, filter, q, 0, out).ok());
    return a;
  }

  // The vector retriever alone: `window` results of each query.
  testing::SearchResults Vectors(int window,
                                 const PreparedFilter* filter = nullptr) const {
    testing::SearchResults r;
    r.ids.resize(static_cast<size_t>(kQueries * window));
    r.distances.resize(r.ids.size());
    SearchArgs args;
    args.queries = queries_.data();
    args.num_queries = kQueries;
    args.k = window;
    args.nprobe = 4;
    args.refine_factor = 2;
    args.ids = r.ids.data();
    args.distances = r.distances.data();
    EXPECT_TRUE(snapshot_->Search(args, filter).ok());
    return r;
  }

  // The text retriever alone: query q's `window` best (id, score).
  std::vector<std::pair<int64_t, float>> Text(
      int q, int window,
      const std::function<bool(int64_t)>* admit = nullptr) const {
    std::vector<float> scratch;
    std::vector<TextHit> hits;
    snapshot_->text()->Search(snapshot_->text()->QueryTerms(texts_[q]), admit,
                              window, &scratch, &hits);
    std::vector<std::pair<int64_t, float>> out;
    for (const TextHit& h : hits)
      out.emplace_back(snapshot_->IdOfRow(h.row), h.score);
    return out;
  }

  static TempDir* tmp_;
  static std::string* path_;
  static std::vector<float>* base_;
  std::unique_ptr<IndexSnapshot> snapshot_;
  std::vector<float> queries_;
  std::vector<std::string> texts_;
};
TempDir* HybridSearchTest::tmp_ = nullptr;
std::string* HybridSearchTest::path_ = nullptr;
std::vector<float>* HybridSearchTest::base_ = new std::vector<float>();

TEST_F(HybridSearchTest, TextAloneAnswersBm25RanksAndScores) {
  const Answer a = Run(Query(Fusion::kNone, kK, kK));
  for (int q = 0; q < kQueries; ++q) {
    const auto expected = Text(q, kK);
    for (int i = 0; i < kK; ++i) {
      const size_t e = static_cast<size_t>(q * kK + i);
      if (i < static_cast<int>(expected.size())) {
        EXPECT_EQ(a.ids[e], expected[i].first);
        EXPECT_EQ(a.scores[e], expected[i].second);
        EXPECT_EQ(a.text_ranks[e], static_cast<uint32_t>(i + 1));
        EXPECT_EQ(a.text_scores[e], expected[i].second);
        EXPECT_EQ((a.ids[e] - 3) % 7, 0) << "an own id, not a row";
      } else {
        EXPECT_EQ(a.ids[e], -1);
        EXPECT_EQ(a.scores[e], -INFINITY);
        EXPECT_EQ(a.text_ranks[e], 0u);
      }
    }
  }
  // "zebra": no row holds it.
  EXPECT_EQ(a.ids[5 * kK], -1);
}

// RRF computed here from each retriever's own answer.
TEST_F(HybridSearchTest, RrfFusesTheRetrieversRanks) {
  constexpr int kWindow = 30;
  HybridQuery q = Query(Fusion::kRrf, kWindow, kWindow);
  q.rrf_k = 60;
  const Answer a = Run(q);
  const testing::SearchResults v = Vectors(kWindow);
  for (int qi = 0; qi < kQueries; ++qi) {
    std::map<int64_t, double> fused;
    std::map<int64_t, uint32_t> vrank, trank;
    for (int r = 0; r < kWindow; ++r) {
      const int64_t id = v.ids[static_cast<size_t>(qi * kWindow + r)];
      if (id < 0) break;
      fused[id] += 1.0 / (60 + r + 1);
      vrank[id] = static_cast<uint32_t>(r + 1);
    }
    const auto t = Text(qi, kWindow);
    for (size_t r = 0; r < t.size(); ++r) {
      fused[t[r].first] += 1.0 / (60 + r + 1);
      trank[t[r].first] = static_cast<uint32_t>(r + 1);
    }
    std::vector<std::pair<double, int64_t>> order;
    for (auto [id, s] : fused) order.emplace_back(-s, id);
    std::sort(order.begin(), order.end());
    for (int i = 0; i < kK; ++i) {
      const size_t e = static_cast<size_t>(qi * kK + i);
      ASSERT_LT(static_cast<size_t>(i), order.size());
      EXPECT_EQ(a.ids[e], order[i].second) << "query " << qi << " rank " << i;
      EXPECT_NEAR(a.scores[e], -order[i].first, 1e-7);
      EXPECT_EQ(a.vector_ranks[e], vrank[a.ids[e]]);
      EXPECT_EQ(a.text_ranks[e], trank[a.ids[e]]);
    }
  }
}

// Weighted fusion: min-max normalised scores, L2 turned larger-better.
TEST_F(HybridSearchTest, WeightedFusionNormalisesEachRetrieversWindow) {
  constexpr int kWindow = 20;
  HybridQuery q = Query(Fusion::kWeighted, kWindow, kWindow);
  q.vector_weight = 0.3f;
  q.text_weight = 0.7f;
  const Answer a = Run(q);
  const testing::SearchResults v = Vectors(kWindow);
  for (int qi = 0; qi < 5; ++qi) {  // the fifth has no text hit at all
    std::map<int64_t, double> fused;
    const float* d = v.distances.data() + qi * kWindow;
    const float best = d[0], worst = d[kWindow - 1];
    for (int r = 0; r < kWindow; ++r) {
      fused[v.ids[static_cast<size_t>(qi * kWindow + r)]] +=
          0.3 * (worst - d[r]) / (worst - best);
    }
    const auto t = Text(qi, kWindow);
    for (const auto& [id, s] : t) {
      const double lo = t.back().second, hi = t.front().second;
      fused[id] += 0.7 * (hi == lo ? 1.0 : (s - lo) / (hi - lo));
    }
    std::vector<std::pair<double, int64_t>> order;
    for (auto [id, s] : fused) order.emplace_back(-s, id);
    std::sort(order.begin(), order.end());
    for (int i = 0; i < kK; ++i) {
      const size_t e = static_cast<size_t>(qi * kK + i);
      EXPECT_EQ(a.ids[e], order[i].second) << "query " << qi << " rank " << i;
      EXPECT_NEAR(a.scores[e], -order[i].first, 1e-5);
    }
  }
}

TEST_F(HybridSearchTest, AFilterAppliesToBothRetrieversExactly) {
  auto rows = std::make_shared<RowBitmap>(kRows);
  for (int r = 0; r < kRows; r += 3) rows->Set(r);
  constexpr int kWindow = 20;
  const PreparedFilter filter =
      PrepareRows(*snapshot_, rows, nullptr, {kQueries, kWindow, 4, 2});
  const Answer a = Run(Query(Fusion::kRrf, kWindow, kWindow), &filter);
  const std::function<bool(int64_t)> admit = [&](int64_t row) {
    return rows->Test(row);
  };
  for (int qi = 0; qi < kQueries; ++qi) {
    // Every text hit the filter admits, within the window, is a candidate:
    // the text retriever's window is the admitted rows' best, not the
    // unfiltered best cut down.
    const auto t = Text(qi, kWindow, &admit);
    std::map<int64_t, uint32_t> expected_rank;
    for (size_t r = 0; r < t.size(); ++r) expected_rank[t[r].first] = r + 1;
    for (int i = 0; i < kK; ++i) {
      const size_t e = static_cast<size_t>(qi * kK + i);
      const int64_t id = a.ids[e];
      if (id < 0) continue;
      EXPECT_EQ(((id - 3) / 7) % 3, 0) << "row outside the filter";
      if (a.text_ranks[e] > 0) {
        EXPECT_EQ(a.text_ranks[e], expected_rank[id]);
      }
    }
    if (qi < 5) {
      EXPECT_GE(t.size(), static_cast<size_t>(kK));
    }
  }
}

TEST_F(HybridSearchTest, AnAllowListAppliesToTheTextRetriever) {
  std::vector<int64_t> allowed;
  for (int r = 0; r < kRows; r += 5) allowed.push_back(int64_t{r} * 7 + 3);
  const Answer a = Run(Query(Fusion::kNone, kK, kK), nullptr, allowed);
  int found = 0;
  for (int64_t id : a.ids) {
    if (id < 0) continue;
    ++found;
    EXPECT_TRUE(std::binary_search(allowed.begin(), allowed.end(), id)) << id;
  }
  EXPECT_GE(found, 4 * kK);
}

TEST(HybridSearch, RefusesAnIndexWithoutText) {
  TempDir tmp;
  BuildSpec spec;
  spec.n = 500;
  spec.d = 8;
  spec.factory = "IVF4,PQ4";
  BuildIndex(tmp.path("plain"), spec);
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(tmp.path("plain"));
  ASSERT_NE(snapshot, nullptr);
  std::vector<int64_t> ids(1);
  std::vector<float> scores(1);
  std::vector<uint32_t> ranks(1);
  SearchArgs args;
  args.num_queries = 1;
  args.k = 1;
  args.ids = ids.data();
  args.distances = scores.data();
  HybridQuery q;
  q.terms.emplace_back();
  q.fusion = Fusion::kNone;
  HybridOutputs out;
  out.text_ranks = ranks.data();
  out.text_scores = scores.data();
  EXPECT_EQ(SearchHybrid(*snapshot, args, nullptr, q, 0, out).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace knnd

// FastScanSearcher against FAISS's own IndexIVFPQFastScan::search at the
// same nprobe, with id filters, and from several threads at once.
#include "knnd/faiss/fastscan_search.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/IVFlib.h>
#include <faiss/index_factory.h>
#include <faiss/index_io.h>
#include <gtest/gtest.h>

#include "knnd/faiss/faiss_builder.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/faiss/fastscan_index.h"
#include "knnd/faiss/fastscan_qbs.h"
#include "testing/fastscan_util.h"

namespace knnd {
namespace {

using ::knnd::testing::FaissSearch;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::ReadFaissIndex;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFastScanIndex;

constexpr int kDim = 32;
constexpr int64_t kBase = 5000;
constexpr int64_t kQueries = 200;

struct Config {
  std::string name;
  std::string factory;
  bool inner_product = false;
  // For residual L2 codes: search with the precomputed table (FAISS's
  // default after reading) or with residual tables per query (knnd's
  // use_precomputed_table: false).
  bool table = true;
};

// The ctest entry's name shows the config's name, not its bytes.
void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

std::string ConfigName(const ::testing::TestParamInfo<Config>& info) {
  return info.param.name;
}

// The FAISS index (heap lists, the reference) and the same index mapped
// from knnd's FastScan file, for one config.
struct Built {
  TempDir dir;
  std::unique_ptr<faiss::Index> faiss;
  std::unique_ptr<FastScanIndex> mapped;
  int64_t nlist = 0;
};

const Built& BuildOnce(const Config& c) {
  static std::map<std::string, std::unique_ptr<Built>> built;
  std::unique_ptr<Built>& b = built[c.name];
  if (b != nullptr) return *b;
  b = std::make_unique<Built>();
  IndexSpec spec;
  spec.n = kBase;
  spec.d = kDim;
  spec.factory = c.factory;
  spec.inner_product = c.inner_product;
  WriteFastScanIndex(b->dir.path("faiss.index"), b->dir.path("knnd.index"),
                     spec);
  b->faiss = ReadFaissIndex(b->dir.path("faiss.index"));
  auto& ivf = dynamic_cast<faiss::IndexIVFPQFastScan&>(
      *faiss::ivflib::extract_index_ivf(b->faiss.get()));
  b->nlist = static_cast<int64_t>(ivf.nlist);
  auto mapped = FastScanIndex::Open(b->dir.path("knnd.index"));
  EXPECT_TRUE(mapped.ok()) << mapped.status();
  b->mapped = std::move(*mapped);
  if (c.table) {
    EXPECT_TRUE(b->mapped->BuildPrecomputedTable().ok());
  } else {
    ivf.use_precomputed_table = -1;  // FAISS's "no table"
    ivf.precompute_table();
  }
  return *b;
}

void ExpectNear(float got, float want, const std::string& where) {
  EXPECT_NEAR(got, want, 1e-5f * std::max(1.0f, std::fabs(want))) << where;
}

// Per query: the ids whose distance is better than the k-th one are the
// same set in both results (ties at the k-th distance may differ).
void ExpectSameIdsBelowTheLastDistance(const std::vector<float>& d,
                                       const std::vector<int64_t>& l,
                                       const std::vector<float>& want_d,
                                       const std::vector<int64_t>& want_l,
                                       int k) {
  const size_t nq = l.size() / k;
  for (size_t q = 0; q < nq; ++q) {
    const float last = want_d[q * k + k - 1];
    const float eps = 1e-5f * std::max(1.0f, std::fabs(last));
    auto strictly_better = [&](const std::vector<float>& dist,
                               const std::vector<int64_t>& ids) {
      std::set<int64_t> out;
      for (int j = 0; j < k; ++j) {
        if (ids[q * k + j] >= 0 && std::fabs(dist[q * k + j] - last) > eps) {
          out.insert(ids[q * k + j]);
        }
      }
      return out;
    };
    EXPECT_EQ(strictly_better(d, l), strictly_better(want_d, want_l))
        << "query " << q << " k " << k;
  }
}

class FastScanSearchTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    UseSingleThreadedBlas();
    omp_set_num_threads(1);
    built_ = &BuildOnce(GetParam());
    queries_ = MakeData(kQueries, kDim, 12);
  }

  // Searches rows [q0, q0 + n) of `queries` with `p`'s parameters into the
  // same rows of `d` and `l`.
  absl::Status Search(const std::vector<float>& queries, int64_t q0,
                      int64_t n, SearchArgs p, std::vector<float>& d,
                      std::vector<int64_t>& l) const {
    p.queries = queries.data() + q0 * kDim;
    p.num_queries = n;
    p.distances = d.data() + q0 * p.k;
    p.ids = l.data() + q0 * p.k;
    return built_->mapped->searcher().Search(p);
  }

  const Built* built_ = nullptr;
  std::vector<float> queries_;
};

TEST_P(FastScanSearchTest, EqualsFaissSearch) {
  for (int64_t nprobe : {int64_t{1}, int64_t{4}, built_->nlist}) {
    for (int k : {1, 10, 50}) {
      std::vector<float> want_d;
      std::vector<int64_t> want_l;
      FaissSearch(*built_->faiss, static_cast<int>(nprobe), queries_, k,
                  &want_d, &want_l);
      std::vector<int64_t> first_batch_l;
      for (int64_t batch : {1, 7, 100, 256}) {
        std::vector<float> d(kQueries * k);
        std::vector<int64_t> l(kQueries * k);
        SearchArgs p;
        p.k = k;
        p.nprobe = nprobe;
        for (int64_t q0 = 0; q0 < kQueries; q0 += batch) {
          ASSERT_TRUE(
              Search(queries_, q0, std::min(batch, kQueries - q0), p, d, l)
                  .ok());
        }
        for (size_t i = 0; i < l.size(); ++i) {
          const std::string where =
              "query " + std::to_string(i / k) + " rank " +
              std::to_string(i % k) + " nprobe " + std::to_string(nprobe) +
              " k " + std::to_string(k) + " batch " + std::to_string(batch);
          // k > 20: FAISS collects in a reservoir, knnd too where FAISS is
          // built without asserts and in a heap where it keeps them (see
          // fastscan_search.cc), which orders tied distances differently.
          if (k <= 20) {
            ASSERT_EQ(l[i], want_l[i]) << where;
          }
          if (want_l[i] >= 0) ExpectNear(d[i], want_d[i], where);
        }
        if (k > 20) ExpectSameIdsBelowTheLastDistance(d, l, want_d, want_l, k);
        // Equal distances come in one order whatever the batch: the
        // reservoir's, which each query fills in the same scan order.
        if (first_batch_l.empty()) first_batch_l = l;
        EXPECT_EQ(l, first_batch_l) << "nprobe " << nprobe << " k " << k
                                    << " batch " << batch;
      }
    }
  }
}

TEST_P(FastScanSearchTest, NprobeAboveNlistIsCapped) {
  const int k = 10;
  std::vector<float> d1(kQueries * k), d2(kQueries * k);
  std::vector<int64_t> l1(kQueries * k), l2(kQueries * k);
  SearchArgs p;
  p.k = k;
  p.nprobe = built_->nlist;
  ASSERT_TRUE(Search(queries_, 0, kQueries, p, d1, l1).ok());
  p.nprobe = 10 * built_->nlist;
  ASSERT_TRUE(Search(queries_, 0, kQueries, p, d2, l2).ok());
  EXPECT_EQ(l1, l2);
}

// The reference for a filter: FAISS with k large enough to return every
// vector of the probed lists, filtered, first k.
TEST_P(FastScanSearchTest, FilterGivesTheBestAllowedOfTheProbedLists) {
  std::mt19937_64 rng(5);
  std::vector<int64_t> allowed;
  for (int64_t id = 0; id < kBase; ++id) {
    if (rng() % 10 < 3) allowed.push_back(id);
  }
  const std::set<int64_t> allowed_set(allowed.begin(), allowed.end());
  const int64_t nq = 40;
  const std::vector<float> queries(queries_.begin(),
                                   queries_.begin() + nq * kDim);
  for (int64_t nprobe : {int64_t{1}, int64_t{4}, built_->nlist}) {
    std::vector<float> all_d;
    std::vector<int64_t> all_l;
    FaissSearch(*built_->faiss, static_cast<int>(nprobe), queries, kBase,
                &all_d, &all_l);
    for (int k : {1, 10, 50}) {
      std::vector<float> d(nq * k);
      std::vector<int64_t> l(nq * k);
      SearchArgs p;
      p.k = k;
      p.nprobe = nprobe;
      p.allowed_ids = allowed;
      ASSERT_TRUE(Search(queries, 0, nq, p, d, l).ok());
      for (int64_t q = 0; q < nq; ++q) {
        const std::string where = "query " + std::to_string(q) + " nprobe " +
                                  std::to_string(nprobe) + " k " +
                                  std::to_string(k);
        std::vector<std::pair<float, int64_t>> want;  // FAISS's order
        std::map<int64_t, float> want_d;
        for (int64_t j = 0; j < kBase; ++j) {
          const int64_t id = all_l[q * kBase + j];
          if (id >= 0 && allowed_set.count(id) > 0) {
            want.push_back({all_d[q * kBase + j], id});
            want_d[id] = all_d[q * kBase + j];
          }
        }
        const size_t found = std::min<size_t>(k, want.size());
        for (size_t j = 0; j < static_cast<size_t>(k); ++j) {
          const int64_t id = l[q * k + j];
          if (j >= found) {
            ASSERT_EQ(id, -1) << where << " rank " << j;
            continue;
          }
          ASSERT_EQ(want_d.count(id), 1u)
              << where << " id " << id << " is not allowed or not probed";
          // The same distance at every rank (ties may swap ids), each id's
          // distance its own.
          ExpectNear(d[q * k + j], want[j].first, where);
          ExpectNear(d[q * k + j], want_d[id], where);
        }
      }
    }
  }
}

TEST_P(FastScanSearchTest, AllowAllFilterEqualsUnfiltered) {
  std::vector<int64_t> all(kBase);
  for (int64_t i = 0; i < kBase; ++i) all[i] = i;
  // k 1 and 10: FAISS's heaps; 50: its reservoir (or, where FAISS keeps
  // its asserts, the heap on both sides). The same candidates offered in
  // the same order: the same ids in the same order, ties included.
  for (int k : {1, 10, 50}) {
    std::vector<float> d1(kQueries * k), d2(kQueries * k);
    std::vector<int64_t> l1(kQueries * k), l2(kQueries * k);
    SearchArgs p;
    p.k = k;
    p.nprobe = 4;
    ASSERT_TRUE(Search(queries_, 0, kQueries, p, d1, l1).ok());
    p.allowed_ids = all;
    ASSERT_TRUE(Search(queries_, 0, kQueries, p, d2, l2).ok());
    EXPECT_EQ(l1, l2) << "k " << k;
    for (size_t i = 0; i < d1.size(); ++i) ExpectNear(d2[i], d1[i], "allow-all");
  }
}

// A filter's own lists (filtered_lists.h) hold exactly its rows, and a
// search scanning them returns what the bitmap-filtered scan returns: the
// same ids, in the same order, at the same distances, for any nprobe, k
// and batch; a filter of no rows finds nothing.
TEST_P(FastScanSearchTest, FilteredListsSearchLikeTheirBitmap) {
  constexpr int64_t kFirst = 0;
  for (int64_t every : {int64_t{3}, int64_t{37}, int64_t{400}, kBase + 1}) {
    RowBitmap rows(kBase);
    for (int64_t id = every / 2; id < kBase; id += every) rows.Set(id);
    const std::unique_ptr<const FilteredLists> lists =
        built_->mapped->FilterLists(rows, kFirst);
    ASSERT_NE(lists, nullptr);
    ASSERT_EQ(lists->nlist(), built_->nlist);
    ASSERT_EQ(lists->rows(), rows.Count()) << "every " << every;
    EXPECT_EQ(lists->bytes(),
              FilteredLists::Bytes(
                  built_->nlist,
                  static_cast<size_t>(2 * built_->mapped->facts().code_size_bytes),
                  rows.Count()))
        << "every " << every;
    int64_t next = 0;
    for (int64_t list = 0; list < lists->nlist(); ++list) {
      ASSERT_EQ(lists->begin(list), next);  // lists after each other
      next += static_cast<int64_t>(lists->size(list));
    }
    ASSERT_EQ(next, lists->rows());
    for (int64_t r = 0; r < lists->rows(); ++r) {
      ASSERT_TRUE(rows.Test(lists->ids()[r] - kFirst));
    }
    for (int64_t nprobe : {int64_t{1}, int64_t{6}, built_->nlist}) {
      for (int k : {1, 10, 50}) {
        std::vector<float> want_d(kQueries * k), d(kQueries * k);
        std::vector<int64_t> want_l(kQueries * k), l(kQueries * k);
        SearchArgs p;
        p.k = k;
        p.nprobe = nprobe;
        p.allowed_rows = &rows;
        p.allowed_rows_first = kFirst;
        p.allowed_rows_count = rows.Count();
        SearchArgs with_lists = p;
        with_lists.allowed_lists = lists.get();
        // The same batches: a batch's tables may round differently.
        for (int64_t batch : {int64_t{1}, int64_t{64}, kQueries}) {
          for (int64_t q0 = 0; q0 < kQueries; q0 += batch) {
            const int64_t n = std::min(batch, kQueries - q0);
            ASSERT_TRUE(Search(queries_, q0, n, p, want_d, want_l).ok());
            ASSERT_TRUE(Search(queries_, q0, n, with_lists, d, l).ok());
          }
          const std::string where =
              "every " + std::to_string(every) + " nprobe " +
              std::to_string(nprobe) + " k " + std::to_string(k) +
              " batch " + std::to_string(batch);
          ASSERT_EQ(l, want_l) << where;
          for (size_t i = 0; i < l.size(); ++i) {
            if (l[i] >= 0) {
              ASSERT_EQ(d[i], want_d[i]) << where;
            }
          }
        }
      }
    }
  }
}

// With lists given, the scan reads them and not the bitmap's lists: lists
// of a subset of the bitmap's rows (never what IndexSnapshot passes) give
// only that subset's ids.
TEST_P(FastScanSearchTest, TheScanReadsTheFilteredLists) {
  RowBitmap rows(kBase), subset(kBase);
  for (int64_t id = 0; id < kBase; id += 5) {
    rows.Set(id);
    if (id % 10 == 0) subset.Set(id);
  }
  const std::unique_ptr<const FilteredLists> lists =
      built_->mapped->FilterLists(subset, 0);
  const int k = 10;
  std::vector<float> d(kQueries * k);
  std::vector<int64_t> l(kQueries * k);
  SearchArgs p;
  p.k = k;
  p.nprobe = 4;
  p.allowed_rows = &rows;
  p.allowed_rows_count = rows.Count();
  p.allowed_lists = lists.get();
  ASSERT_TRUE(Search(queries_, 0, kQueries, p, d, l).ok());
  int64_t found = 0;
  for (int64_t id : l) {
    if (id < 0) continue;
    ++found;
    ASSERT_TRUE(subset.Test(id)) << id;
  }
  EXPECT_GT(found, kQueries * k / 2);
}

// The flat plan (codes that are not residuals): every row of the lists,
// no coarse search: what the bitmap's scan of every list returns. Refused
// where codes are residuals (a table per list).
TEST_P(FastScanSearchTest, FlatPlanScansEveryFilteredRow) {
  RowBitmap rows(kBase);
  for (int64_t id = 4; id < kBase; id += 23) rows.Set(id);
  const std::unique_ptr<const FilteredLists> lists =
      built_->mapped->FilterLists(rows, 0);
  const bool residual = built_->mapped->facts().by_residual;
  for (int k : {1, 10, 50}) {
    std::vector<float> want_d(kQueries * k), d(kQueries * k);
    std::vector<int64_t> want_l(kQueries * k), l(kQueries * k);
    SearchArgs p;
    p.k = k;
    p.nprobe = built_->nlist;
    p.allowed_rows = &rows;
    p.allowed_rows_count = rows.Count();
    SearchArgs flat = p;
    flat.nprobe = 1;  // unused
    flat.allowed_lists = lists.get();
    flat.allowed_lists_flat = true;
    for (int64_t batch : {int64_t{1}, kQueries}) {
      for (int64_t q0 = 0; q0 < kQueries; q0 += batch) {
        const int64_t n = std::min(batch, kQueries - q0);
        ASSERT_TRUE(Search(queries_, q0, n, p, want_d, want_l).ok());
        const absl::Status s = Search(queries_, q0, n, flat, d, l);
        if (residual) {
          ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
          return;
        }
        ASSERT_TRUE(s.ok()) << s;
      }
      const std::string where =
          "k " + std::to_string(k) + " batch " + std::to_string(batch);
      ASSERT_EQ(l, want_l) << where;
      for (size_t i = 0; i < l.size(); ++i) {
        if (l[i] >= 0) {
          ExpectNear(d[i], want_d[i], where);
        }
      }
    }
  }
}

TEST_P(FastScanSearchTest, FilteredListsOfAnotherIndexAreRefused) {
  RowBitmap rows(kBase);
  rows.Set(1);
  const std::unique_ptr<const FilteredLists> lists =
      built_->mapped->FilterLists(rows, 0);
  std::vector<float> d(10);
  std::vector<int64_t> l(10);
  SearchArgs p;
  p.k = 10;
  p.nprobe = 2;
  p.allowed_lists = lists.get();  // without allowed_rows
  const absl::Status no_rows = Search(queries_, 0, 1, p, d, l);
  EXPECT_EQ(no_rows.code(), absl::StatusCode::kInvalidArgument) << no_rows;
  EXPECT_NE(no_rows.message().find("without rows"), absl::string_view::npos)
      << no_rows;
}

// An allow-list of ids the index does not hold (as IndexSnapshot passes
// for own ids none of which it holds) finds nothing.
TEST_P(FastScanSearchTest, FilterOfAbsentIdsFindsNothing) {
  const std::vector<int64_t> absent = {-1};
  std::vector<float> d(5 * 10);
  std::vector<int64_t> l(5 * 10);
  SearchArgs p;
  p.k = 10;
  p.nprobe = 8;
  p.allowed_ids = absent;
  ASSERT_TRUE(Search(queries_, 0, 5, p, d, l).ok());
  for (int64_t id : l) EXPECT_EQ(id, -1);
}

TEST_P(FastScanSearchTest, ConcurrentSearchesEqualSerial) {
  const int k = 10;
  const std::vector<int64_t> nprobes = {1, 3, 8, built_->nlist};
  std::vector<int64_t> allowed;
  for (int64_t id = 0; id < kBase; id += 3) allowed.push_back(id);
  auto params = [&](size_t which) {
    SearchArgs p;
    p.k = k;
    p.nprobe = nprobes[which % 4];
    if (which >= 4) p.allowed_ids = allowed;
    return p;
  };
  std::vector<std::vector<int64_t>> serial(8);
  for (size_t which = 0; which < 8; ++which) {
    std::vector<float> d(kQueries * k);
    serial[which].resize(kQueries * k);
    ASSERT_TRUE(
        Search(queries_, 0, kQueries, params(which), d, serial[which]).ok());
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      omp_set_num_threads(1);
      for (int round = 0; round < 6; ++round) {
        const size_t which = (t + round) % 8;
        const int64_t batch = round % 2 == 0 ? 1 : 100;
        std::vector<float> d(kQueries * k);
        std::vector<int64_t> l(kQueries * k);
        for (int64_t q0 = 0; q0 < kQueries; q0 += batch) {
          if (!Search(queries_, q0, std::min(batch, kQueries - q0),
                      params(which), d, l)
                   .ok()) {
            ++mismatches[t];
          }
        }
        if (l != serial[which]) ++mismatches[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

TEST_P(FastScanSearchTest, InvalidArgumentsAreRefused) {
  std::vector<float> d(10);
  std::vector<int64_t> l(10);
  const FastScanSearcher& searcher = built_->mapped->searcher();
  SearchArgs p;
  p.queries = queries_.data();
  p.num_queries = 1;
  p.distances = d.data();
  p.ids = l.data();
  p.k = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(searcher.Search(p)));
  p.k = 10;
  p.nprobe = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(searcher.Search(p)));
  p.nprobe = 1;
  p.num_queries = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(searcher.Search(p)));
  p.num_queries = 1;
  p.queries = nullptr;
  EXPECT_TRUE(absl::IsInvalidArgument(searcher.Search(p)));
  p.num_queries = 0;
  p.distances = nullptr;
  p.ids = nullptr;
  EXPECT_TRUE(searcher.Search(p).ok());
}

// The unfiltered scan's kernel is knnd's AVX-512 one exactly where the
// AVX2 FAISS build runs on a CPU with AVX-512 F and BW, unless
// KNND_FASTSCAN_AVX512=0 (EqualsFaissSearch then compares it with FAISS's
// AVX2 kernel); FAISS's everywhere else.
TEST(FastScanKernel, AVX512KernelRunsWhereTheCpuHasIt) {
  __builtin_cpu_init();
  const bool cpu = __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("avx512bw");
  const bool avx2_faiss =
      FaissCompileOptions().find("AVX2") != std::string::npos;
  const bool uses = fastscan_qbs::UsesAvx512();
  std::printf("CPU with AVX-512 F and BW: %s; FAISS %s; knnd's AVX-512 "
              "kernel: %s\n",
              cpu ? "yes" : "no", FaissCompileOptions().c_str(),
              uses ? "in use" : "not in use");
  const char* env = std::getenv("KNND_FASTSCAN_AVX512");
  const bool off = env != nullptr && std::string(env) == "0";
  EXPECT_EQ(uses, cpu && avx2_faiss && !off);
}

// More than (capacity + k) / 2 candidates tied at quantized distance 0 (here
// 46 copies of the query in one list, between two other vectors) is where
// FAISS 1.7.3's reservoir of k > 20 results takes its fallback, and where
// Debian's libfaiss, built with asserts, aborted knnctl tune. Every k gives
// k distinct ids (under L2 all copies), for L2 and inner product.
TEST(FastScanTies, ManyCopiesOfTheQueryGiveKDistinctCopies) {
  UseSingleThreadedBlas();
  omp_set_num_threads(1);
  constexpr int d = 16;
  constexpr int64_t n = 2000, first_copy = 1, copies = 46;
  std::vector<float> base = MakeData(n, d, 21);
  for (int64_t i = 0; i < n; ++i) {
    float norm = 0;
    for (int j = 0; j < d; ++j) norm += base[i * d + j] * base[i * d + j];
    for (int j = 0; j < d; ++j) base[i * d + j] /= std::sqrt(norm);
  }
  const std::vector<float> v(base.begin() + 1000 * d,
                             base.begin() + 1001 * d);
  for (int64_t c = first_copy; c < first_copy + copies; ++c) {
    std::copy(v.begin(), v.end(), base.begin() + c * d);
  }
  for (const bool ip : {false, true}) {
    const std::string metric = ip ? "IP" : "L2";
    TempDir dir;
    std::unique_ptr<faiss::Index> index(faiss::index_factory(
        d, "IVF1,PQ8x4fs",
        ip ? faiss::METRIC_INNER_PRODUCT : faiss::METRIC_L2));
    index->train(n, base.data());
    index->add(n, base.data());
    faiss::write_index(index.get(), dir.path("faiss.index").c_str());
    ASSERT_TRUE(ConvertFaissFileToFastScan(dir.path("faiss.index"),
                                           dir.path("knnd.index"))
                    .ok());
    auto mapped = FastScanIndex::Open(dir.path("knnd.index"));
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    for (int k : {10, 21, 22, 30, 40}) {
      SearchArgs p;
      p.k = k;
      p.nprobe = 1;
      std::vector<float> dist(k);
      std::vector<int64_t> ids(k);
      p.queries = v.data();
      p.num_queries = 1;
      p.distances = dist.data();
      p.ids = ids.data();
      ASSERT_TRUE((*mapped)->searcher().Search(p).ok());
      const std::set<int64_t> distinct(ids.begin(), ids.end());
      EXPECT_EQ(distinct.size(), static_cast<size_t>(k))
          << metric << " k " << k;
      for (int64_t id : ids) {
        // Under L2 the copies are the nearest (distance 0). Under inner
        // product PQ's estimate can rank other unit vectors above them (a
        // copy's code is its nearest centroids, not its largest products).
        const bool copy =
            id == 1000 || (id >= first_copy && id < first_copy + copies);
        EXPECT_TRUE(ip ? id >= 0 && id < n : copy)
            << metric << " k " << k << " id " << id;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, FastScanSearchTest,
    ::testing::Values(
        Config{"L2", "IVF32,PQ16x4fs"},
        Config{"L2Residual", "IVF32,PQ16x4fsr"},
        Config{"L2ResidualNoTable", "IVF32,PQ16x4fsr", false, false},
        Config{"PCA_L2OddM", "PCA30,IVF16,PQ15x4fs"},
        // 5 and 3 pairs of sub-quantizers: the AVX-512 kernel's 256-bit
        // last pair (fastscan_qbs.cc), against FAISS's kernel. (Fewer
        // sub-quantizers tie so often that FAISS's own reservoir, the
        // reference, aborts where it keeps its asserts: fastscan_search.cc.)
        Config{"PCA_L2OddPairs", "PCA30,IVF16,PQ10x4fs"},
        Config{"PCA_L2ThreePairs", "PCA30,IVF16,PQ6x4fs"},
        Config{"PCA_IPOddPairs", "PCA30,IVF32,PQ6x4fs", true},
        Config{"IP", "IVF32,PQ16x4fs", true},
        Config{"IPResidual", "IVF32,PQ16x4fsr", true},
        Config{"PCA_IP", "PCA16,IVF32,PQ8x4fs", true}),
    ConfigName);

}  // namespace
}  // namespace knnd

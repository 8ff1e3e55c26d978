// knnd's coarse L2 search against faiss::IndexFlatL2::search: the same ids
// and the same distances, bit for bit, below FAISS's BLAS threshold and
// above it.
#include "knnd/faiss/coarse_l2.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <faiss/IndexFlat.h>
#include <faiss/utils/distances.h>
#include <faiss/utils/utils.h>

namespace knnd {
namespace {

// coarse_l2::Search of n queries `x` over `flat` gives flat.search's ids
// and, where an id is found, its distances bit for bit.
void ExpectFaissAnswers(const faiss::IndexFlatL2& flat, size_t n,
                        const std::vector<float>& x, size_t k,
                        const std::string& where) {
  std::vector<float> want_d(n * k), got_d(n * k);
  std::vector<int64_t> want_i(n * k), got_i(n * k);
  flat.search(static_cast<faiss::Index::idx_t>(n), x.data(),
              static_cast<faiss::Index::idx_t>(k), want_d.data(),
              want_i.data());
  // With the centroids' norms computed here or given (CentroidNorms).
  const std::vector<float> norms = coarse_l2::CentroidNorms(flat);
  for (const float* given : {static_cast<const float*>(nullptr),
                             norms.data()}) {
    coarse_l2::Search(flat, n, x.data(), k, got_d.data(), got_i.data(),
                      given);
    for (size_t j = 0; j < n * k; ++j) {
      ASSERT_EQ(got_i[j], want_i[j]) << where << " at " << j;
      if (want_i[j] >= 0) {
        ASSERT_EQ(std::memcmp(&got_d[j], &want_d[j], sizeof(float)), 0)
            << where << " at " << j << ": " << got_d[j] << " vs "
            << want_d[j];
      }
    }
  }
}

TEST(CoarseL2, EqualsFaissFlatSearch) {
  // Bit for bit only against the FAISS it mirrors, the AVX2 build knnd
  // links by default; Debian's generic build (the sanitizer builds) sums
  // in another order.
  if (faiss::get_compile_options().find("AVX2") == std::string::npos) {
    GTEST_SKIP() << "FAISS without AVX2: " << faiss::get_compile_options();
  }
  std::mt19937_64 rng(3);
  std::normal_distribution<float> value(0, 10);
  // Dimensions with every tail of FAISS's fvec_L2sqr (8-lane, 4-lane,
  // masked); centroid counts around the 4-at-a-time grouping; k above the
  // centroid count too (ids -1).
  for (size_t d : {1, 3, 4, 7, 8, 12, 17, 64, 385, 784}) {
    for (size_t nc : {1, 5, 64, 257}) {
      faiss::IndexFlatL2 flat(static_cast<int>(d));
      std::vector<float> centroids(nc * d);
      for (float& v : centroids) v = value(rng);
      flat.add(static_cast<faiss::Index::idx_t>(nc), centroids.data());
      for (size_t k : {1, 4, 16, 300}) {
        const size_t n = 1 + rng() % 19;
        ASSERT_EQ(coarse_l2::Applies(flat, n, k), k < 100) << d;
        if (!coarse_l2::Applies(flat, n, k)) continue;
        std::vector<float> x(n * d);
        for (float& v : x) v = value(rng);
        // Near-ties: a query equal to a centroid, and a duplicated centroid.
        std::memcpy(x.data(), centroids.data() + (nc / 2) * d,
                    sizeof(float) * d);
        ExpectFaissAnswers(flat, n, x, k,
                           "d " + std::to_string(d) + " nc " +
                               std::to_string(nc) + " k " + std::to_string(k));
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CoarseL2, TiesAndInfiniteDistancesAsFaissHeapKeepsThem) {
  if (faiss::get_compile_options().find("AVX2") == std::string::npos) {
    GTEST_SKIP() << "FAISS without AVX2: " << faiss::get_compile_options();
  }
  // Small integer coordinates: many centroids at exactly the same distance
  // (FAISS keeps the lower index of a tie), duplicated centroids, and some
  // so far out that their distance overflows to +inf (never kept: FAISS's
  // heap starts at FLT_MAX). k around the selection's block bound.
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> coordinate(-2, 2);
  for (size_t d : {3, 16, 33}) {
    for (size_t nc : {7, 64, 257, 1024}) {
      faiss::IndexFlatL2 flat(static_cast<int>(d));
      std::vector<float> centroids(nc * d);
      for (float& v : centroids) v = static_cast<float>(coordinate(rng));
      for (size_t c = 3; c < nc; c += 11) {
        std::memcpy(&centroids[c * d], &centroids[(c - 3) * d],
                    sizeof(float) * d);
      }
      for (size_t c = 5; c < nc; c += 13) centroids[c * d] = 1e30f;
      flat.add(static_cast<faiss::Index::idx_t>(nc), centroids.data());
      for (size_t k : {1, 2, 3, 8, 12, 20, 60, 99}) {
        const size_t n = 1 + rng() % 5;
        ASSERT_TRUE(coarse_l2::Applies(flat, n, k));
        std::vector<float> x(n * d);
        for (float& v : x) v = static_cast<float>(coordinate(rng));
        ExpectFaissAnswers(flat, n, x, k,
                           "d " + std::to_string(d) + " nc " +
                               std::to_string(nc) + " k " + std::to_string(k));
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CoarseL2, NoNeighboursAskedWritesNothing) {
  if (faiss::get_compile_options().find("AVX2") == std::string::npos) {
    GTEST_SKIP() << "FAISS without AVX2: " << faiss::get_compile_options();
  }
  faiss::IndexFlatL2 flat(8);
  std::vector<float> centroids(40 * 8, 1.0f);
  flat.add(40, centroids.data());
  const std::vector<float> x(2 * 8, 0.5f);
  coarse_l2::Search(flat, 2, x.data(), 0, nullptr, nullptr);
}

TEST(CoarseL2, ManyQueriesEqualFaissBlasSearch) {
  if (faiss::get_compile_options().find("AVX2") == std::string::npos) {
    GTEST_SKIP() << "FAISS without AVX2: " << faiss::get_compile_options();
  }
  // From the BLAS threshold up, over one BLAS block of centroids (the
  // largest it takes too), past one block of queries, with near-ties,
  // duplicated centroids and centroids whose distance overflows.
  const size_t threshold =
      static_cast<size_t>(faiss::distance_compute_blas_threshold);
  const size_t query_block =
      static_cast<size_t>(faiss::distance_compute_blas_query_bs);
  const size_t most =
      static_cast<size_t>(faiss::distance_compute_blas_database_bs);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> value(0, 10);
  struct Case {
    size_t d, nc, n;
  };
  for (const Case c : {Case{3, 1, threshold}, Case{17, 64, threshold + 1},
                       Case{64, 257, 100}, Case{385, most, 300},
                       Case{8, 100, query_block + 3}}) {
    faiss::IndexFlatL2 flat(static_cast<int>(c.d));
    std::vector<float> centroids(c.nc * c.d);
    for (float& v : centroids) v = value(rng);
    for (size_t j = 3; j < c.nc; j += 11) {
      std::memcpy(&centroids[j * c.d], &centroids[(j - 3) * c.d],
                  sizeof(float) * c.d);
    }
    for (size_t j = 5; j < c.nc; j += 13) centroids[j * c.d] = 1e30f;
    flat.add(static_cast<faiss::Index::idx_t>(c.nc), centroids.data());
    for (size_t k : {2, 6, 16, 99}) {
      ASSERT_TRUE(coarse_l2::Applies(flat, c.n, k));
      std::vector<float> x(c.n * c.d);
      for (float& v : x) v = value(rng);
      std::memcpy(x.data(), centroids.data() + (c.nc / 2) * c.d,
                  sizeof(float) * c.d);
      ExpectFaissAnswers(flat, c.n, x, k,
                         "d " + std::to_string(c.d) + " nc " +
                             std::to_string(c.nc) + " n " +
                             std::to_string(c.n) + " k " + std::to_string(k));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CoarseL2, LeavesMoreCentroidsThanABlasBlockToFaiss) {
  const size_t most =
      static_cast<size_t>(faiss::distance_compute_blas_database_bs);
  const size_t threshold =
      static_cast<size_t>(faiss::distance_compute_blas_threshold);
  // Where FAISS is not the AVX2 build (the sanitizer builds), knnd's
  // search is not compiled in and everything is left to FAISS.
  const bool compiled =
      faiss::get_compile_options().find("AVX2") != std::string::npos;
  faiss::IndexFlatL2 flat(2);
  std::vector<float> centroids(2 * (most + 1), 1.0f);
  flat.add(static_cast<faiss::Index::idx_t>(most), centroids.data());
  EXPECT_EQ(coarse_l2::Applies(flat, threshold, 4), compiled);
  EXPECT_EQ(coarse_l2::CentroidNorms(flat).size(), most);
  flat.add(1, centroids.data());
  EXPECT_FALSE(coarse_l2::Applies(flat, threshold, 4));
  EXPECT_TRUE(coarse_l2::CentroidNorms(flat).empty());
  EXPECT_EQ(coarse_l2::Applies(flat, threshold - 1, 4), compiled);
  // k 1 from the threshold up: FAISS's own arithmetic, left to it.
  EXPECT_FALSE(coarse_l2::Applies(flat, threshold, 1));
  EXPECT_EQ(coarse_l2::Applies(flat, threshold - 1, 1), compiled);
  faiss::IndexFlatIP ip(8);
  EXPECT_FALSE(coarse_l2::Applies(ip, 1, 4));
}

}  // namespace
}  // namespace knnd

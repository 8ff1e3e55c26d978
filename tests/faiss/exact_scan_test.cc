// ExactScan against a brute force in exact arithmetic: small integer
// coordinates make every distance exact in float whatever the BLAS's
// summation order, and frequent, so that ties are ranked by row.
#include "knnd/faiss/exact_scan.h"

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace knnd {
namespace {

std::vector<float> SmallIntegers(int64_t rows, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> value(-2, 2);
  std::vector<float> out(static_cast<size_t>(rows) * dim);
  for (float& v : out) v = static_cast<float>(value(rng));
  return out;
}

// The k nearest rows of every query by (distance, row), -1 past the rows.
std::vector<int64_t> BruteForce(const std::vector<float>& base,
                                const std::vector<float>& queries, int dim,
                                int k, Metric metric) {
  const int64_t rows = static_cast<int64_t>(base.size()) / dim;
  const int64_t nq = static_cast<int64_t>(queries.size()) / dim;
  std::vector<int64_t> out(static_cast<size_t>(nq) * k, -1);
  for (int64_t q = 0; q < nq; ++q) {
    std::vector<std::pair<double, int64_t>> all;
    for (int64_t r = 0; r < rows; ++r) {
      double l2 = 0, ip = 0;
      for (int j = 0; j < dim; ++j) {
        const double a = queries[q * dim + j], b = base[r * dim + j];
        l2 += (a - b) * (a - b);
        ip += a * b;
      }
      // Closest first: the smallest L2, the largest inner product.
      all.emplace_back(metric == Metric::kL2 ? l2 : -ip, r);
    }
    std::sort(all.begin(), all.end());
    for (int j = 0; j < k && j < rows; ++j) out[q * k + j] = all[j].second;
  }
  return out;
}

void ExpectScanEqualsBruteForce(int64_t rows, int64_t nq, int dim, int k,
                                Metric metric,
                                const std::vector<int64_t>& blocks) {
  const std::vector<float> base = SmallIntegers(rows, dim, 3);
  const std::vector<float> queries = SmallIntegers(nq, dim, 4);
  ExactScan scan(queries.data(), nq, dim, k, metric);
  int64_t begin = 0;
  for (size_t b = 0; begin < rows; ++b) {
    const int64_t n =
        std::min(rows - begin, b < blocks.size() ? blocks[b] : rows);
    scan.Add(base.data() + begin * dim, n);
    begin += n;
  }
  EXPECT_EQ(scan.rows(), rows);
  const std::vector<int64_t> expected =
      BruteForce(base, queries, dim, k, metric);
  ASSERT_EQ(scan.ids().size(), expected.size());
  int64_t differ = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (scan.ids()[i] != expected[i]) ++differ;
  }
  EXPECT_EQ(differ, 0) << "rows " << rows << " queries " << nq << " k " << k;
}

TEST(ExactScan, SmallBlocksEqualBruteForceTiesByLowerRow) {
  for (Metric metric : {Metric::kL2, Metric::kInnerProduct}) {
    // Blocks across the 4096-row BLAS blocks, one of a single row.
    ExpectScanEqualsBruteForce(9000, 7, 8, 10, metric, {1, 37, 5000});
  }
}

// Enough work per Add for the queries to be split between threads.
TEST(ExactScan, ParallelSharesEqualBruteForce) {
  ExpectScanEqualsBruteForce(40000, 200, 16, 10, Metric::kL2, {65536});
  ExpectScanEqualsBruteForce(40000, 200, 16, 10, Metric::kInnerProduct,
                             {20000, 20000});
}

TEST(ExactScan, FewerRowsThanKLeaveMinusOne) {
  ExpectScanEqualsBruteForce(3, 2, 4, 5, Metric::kL2, {});
  const float query[] = {0, 0};
  ExactScan empty(query, 1, 2, 3, Metric::kL2);
  EXPECT_EQ(empty.ids(), std::vector<int64_t>({-1, -1, -1}));
}

}  // namespace
}  // namespace knnd

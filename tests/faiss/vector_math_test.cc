// Vector arithmetic over FAISS's kernels against computations by hand and
// in double precision: distances, L2 normalisation, float16 conversion and
// exact k-NN.
#include "knnd/faiss/vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BruteForceNeighbors;
using ::knnd::testing::MakeData;
using ::knnd::testing::ReferenceDistance;

TEST(VectorMath, DistancesEqualAHandComputation) {
  const float a[] = {1, 2, 3};
  const float b[] = {4, 6, 8};
  // (4-1)^2 + (6-2)^2 + (8-3)^2 and 1*4 + 2*6 + 3*8.
  EXPECT_EQ(L2Squared(a, b, 3), 50.0f);
  EXPECT_EQ(InnerProduct(a, b, 3), 40.0f);
  EXPECT_EQ(ExactDistance(Metric::kL2, a, b, 3), 50.0f);
  EXPECT_EQ(ExactDistance(Metric::kInnerProduct, a, b, 3), 40.0f);
  EXPECT_EQ(ExactDistance(Metric::kCosine, a, b, 3), 40.0f);
  EXPECT_EQ(L2Squared(a, a, 3), 0.0f);
}

// Widths around FAISS's SIMD block sizes, so that the kernels' tails count.
TEST(VectorMath, DistancesOfEveryWidthMatchDoublePrecision) {
  for (int dim : {1, 7, 8, 9, 16, 17, 33, 784}) {
    const std::vector<float> x = MakeData(2, dim, 11);
    const float* a = x.data();
    const float* b = x.data() + dim;
    const double l2 = ReferenceDistance(Metric::kL2, a, b, dim);
    const double ip = ReferenceDistance(Metric::kInnerProduct, a, b, dim);
    EXPECT_NEAR(L2Squared(a, b, dim), l2, 1e-4 * (1 + l2)) << dim;
    EXPECT_NEAR(InnerProduct(a, b, dim), ip, 1e-4 * (1 + std::abs(ip)))
        << dim;
  }
}

// ExactDistances of `query` to the first n of `rows` (float32 or float16),
// for each metric and for row counts covering the groups of 8 and 4 and
// the rows left over: out[j] equals want(metric, j) bit for bit, and
// nothing past n is written.
template <typename Row, typename Want>
void ExpectEveryGroupingEquals(const float* query,
                               const std::vector<const Row*>& rows, int dim,
                               Want want) {
  for (Metric metric :
       {Metric::kL2, Metric::kInnerProduct, Metric::kCosine}) {
    for (int n : {0, 1, 3, 4, 7, 8, 9, 12, 13, 16, 21}) {
      ASSERT_LE(static_cast<size_t>(n), rows.size());
      std::vector<float> out(static_cast<size_t>(n) + 1, -7.0f);
      ExactDistances(metric, query, rows.data(), static_cast<size_t>(n),
                     static_cast<size_t>(dim), out.data());
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(out[j], want(metric, j))
            << "dim " << dim << " n " << n << " row " << j << " metric "
            << MetricName(metric);
      }
      EXPECT_EQ(out[n], -7.0f) << "wrote past n " << n;
    }
  }
}

// Re-ranking computes a query's distances to its candidates several rows at
// a time; each must equal the one-row distance bit for bit (the answers'
// distances and their order do not depend on how rows were grouped). Row
// counts cover the groups of 8 and 4 and the rows left over; widths the
// kernels' 32- and 16-float steps and their masked tails; rows start at
// addresses of any float alignment and in any order.
TEST(VectorMath, DistancesOfManyRowsEqualOneRowAtATime) {
  for (int dim : {1, 5, 16, 17, 31, 32, 33, 48, 100, 384, 785}) {
    constexpr int kRows = 21;
    const std::vector<float> data = MakeData(kRows + 1, dim, 17);
    // Rows packed one float apart from their neighbours' ends, so that
    // most start unaligned.
    std::vector<float> packed(static_cast<size_t>(kRows) * (dim + 1) + 1);
    std::vector<const float*> rows;
    for (int r = 0; r < kRows; ++r) {
      float* at = packed.data() + 1 + r * (dim + 1);
      std::copy(data.begin() + (r + 1) * dim, data.begin() + (r + 2) * dim,
                at);
      rows.push_back(at);
    }
    std::swap(rows[0], rows[13]);
    ExpectEveryGroupingEquals(
        data.data(), rows, dim, [&](Metric metric, int j) {
          return ExactDistance(metric, data.data(), rows[j], dim);
        });
  }
}

// Float16 rows (re-ranking over a --vectors_dtype f16 file): each distance
// equals the one to the row decoded by HalvesToFloats, bit for bit, for
// the same row counts, widths and alignments as above.
TEST(VectorMath, DistancesToHalfRowsEqualDistancesToTheDecodedRows) {
  for (int dim : {1, 5, 16, 17, 31, 32, 33, 48, 100, 384, 785}) {
    constexpr int kRows = 21;
    const std::vector<float> data = MakeData(kRows + 1, dim, 23);
    std::vector<uint16_t> packed(static_cast<size_t>(kRows) * (dim + 1) + 1);
    std::vector<const uint16_t*> rows;
    std::vector<std::vector<float>> decoded;
    for (int r = 0; r < kRows; ++r) {
      uint16_t* at = packed.data() + 1 + r * (dim + 1);
      for (int i = 0; i < dim; ++i) {
        at[i] = FloatToHalf(data[(r + 1) * dim + i]);
      }
      rows.push_back(at);
      decoded.emplace_back(dim);
      HalvesToFloats(at, dim, decoded.back().data());
    }
    std::swap(rows[2], rows[17]);
    std::swap(decoded[2], decoded[17]);
    ExpectEveryGroupingEquals(
        data.data(), rows, dim, [&](Metric metric, int j) {
          return ExactDistance(metric, data.data(), decoded[j].data(), dim);
        });
  }
}

TEST(VectorMath, NormalizeRowsGivesUnitNormsAndLeavesAZeroRowZero) {
  constexpr int kDim = 5;
  std::vector<float> x = MakeData(4, kDim, 3);
  for (int j = 0; j < kDim; ++j) x[2 * kDim + j] = 0;  // row 2: all zero
  const std::vector<float> before = x;
  NormalizeRows(x.data(), 4, kDim);
  for (int row = 0; row < 4; ++row) {
    const float* r = x.data() + row * kDim;
    const double norm = std::sqrt(ReferenceDistance(Metric::kInnerProduct, r,
                                                    r, kDim));
    if (row == 2) {
      EXPECT_EQ(norm, 0.0);
      continue;
    }
    EXPECT_NEAR(norm, 1.0, 1e-6) << "row " << row;
    // Same direction: each value scaled by the same positive factor.
    const double scale = x[row * kDim] / before[row * kDim];
    EXPECT_GT(scale, 0);
    for (int j = 1; j < kDim; ++j) {
      EXPECT_NEAR(r[j], before[row * kDim + j] * scale, 1e-6) << row;
    }
  }
  NormalizeRows(x.data(), 0, kDim);  // no rows: nothing to touch
}

// float16 as the raw-vectors file of re-ranking stores values: exact for
// the representable ones, within 1e-4 near 0.1.
TEST(Rerank, HalfConversionRoundTrips) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
  EXPECT_NEAR(HalfToFloat(FloatToHalf(0.1f)), 0.1f, 1e-4);
}

TEST(VectorMath, HalvesToFloatsDecodesEachValue) {
  const uint16_t halves[] = {FloatToHalf(1.0f), FloatToHalf(-2.5f)};
  float floats[2];
  HalvesToFloats(halves, 2, floats);
  EXPECT_EQ(floats[0], 1.0f);
  EXPECT_EQ(floats[1], -2.5f);
}

// Every one of the 65,536 halves decodes as HalfToFloat decodes it (the
// same bits; NaN as NaN of the same sign), from any start and through
// lengths that leave a tail after the eight-at-a-time conversion.
TEST(VectorMath, HalvesToFloatsEqualsHalfToFloatForEveryHalf) {
  std::vector<uint16_t> all(65536 + 7);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  auto same = [](float a, float b) {
    if (std::isnan(a) || std::isnan(b)) {
      return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
    }
    uint32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    return x == y;
  };
  for (size_t start : {size_t{0}, size_t{3}}) {
    for (size_t n : {size_t{65536}, size_t{13}, size_t{7}, size_t{0}}) {
      std::vector<float> out(n + 1, -3.0f);
      HalvesToFloats(all.data() + start, n, out.data());
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = all[start + i];
        ASSERT_TRUE(same(out[i], HalfToFloat(h)))
            << "half 0x" << std::hex << h << ": " << out[i] << " vs "
            << HalfToFloat(h);
      }
      EXPECT_EQ(out[n], -3.0f) << "wrote past n " << n;
    }
  }
}

// ExactKnn (FAISS's flat index) finds the ids of a plain double-precision
// search, closest first, with the same distances.
TEST(VectorMath, ExactKnnEqualsBruteForceOnSeededData) {
  constexpr int kDim = 24, kRows = 600, kQueries = 20, kK = 10;
  const std::vector<float> base = MakeData(kRows, kDim, 21);
  const std::vector<float> queries = MakeData(kQueries, kDim, 22);
  for (Metric metric : {Metric::kL2, Metric::kInnerProduct}) {
    std::vector<float> distances(kQueries * kK);
    std::vector<int64_t> ids(kQueries * kK);
    ASSERT_TRUE(ExactKnn(base.data(), kRows, queries.data(), kQueries, kDim,
                         kK, metric, distances.data(), ids.data())
                    .ok());
    EXPECT_EQ(ids, BruteForceNeighbors(base, queries, kDim, kK, metric))
        << MetricName(metric);
    for (int i = 0; i < kQueries * kK; ++i) {
      const double want =
          ReferenceDistance(metric, queries.data() + (i / kK) * kDim,
                            base.data() + ids[i] * kDim, kDim);
      EXPECT_NEAR(distances[i], want, 1e-3 * (1 + std::abs(want))) << i;
    }
  }
}

}  // namespace
}  // namespace knnd

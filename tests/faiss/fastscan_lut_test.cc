// knnd's quantization of look-up tables against FAISS's
// quantize_LUT_and_bias, and its float tables of 4-dim sub-vectors against
// ProductQuantizer::compute_distance_tables: equal bit for bit on random
// inputs of many shapes.
#include "knnd/faiss/fastscan_lut.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <faiss/impl/ProductQuantizer.h>
#include <faiss/utils/quantize_lut.h>

namespace knnd {
namespace {

struct Quantized {
  std::vector<uint8_t> luts;
  std::vector<uint16_t> biases;
  float a = 0, b = 0;
};

// `nan_probe` >= 0: that probe's tables are all NaN (a probe of no list,
// as fastscan_search.cc fills it).
void Compare(size_t nprobe, size_t m, float spread, int nan_probe,
             uint64_t seed) {
  const size_t m2 = (m + 1) / 2 * 2;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> value(0, spread);
  std::vector<float> luts(nprobe * m * 16), biases(nprobe);
  for (float& v : luts) v = value(rng);
  for (float& v : biases) v = std::abs(value(rng)) * 10;
  if (nan_probe >= 0) {
    std::memset(luts.data() + nan_probe * m * 16, -1, sizeof(float) * m * 16);
  }
  Quantized theirs, ours;
  for (Quantized* q : {&theirs, &ours}) {
    q->luts.assign(nprobe * m2 * 16, 0xAB);
    q->biases.assign(nprobe, 0xABCD);
  }
  faiss::quantize_lut::quantize_LUT_and_bias(
      nprobe, m, 16, /*lut_is_3d=*/true, luts.data(), biases.data(),
      theirs.luts.data(), m2, theirs.biases.data(), &theirs.a, &theirs.b);
  std::vector<float> mins;
  fastscan_lut::QuantizeResidualLuts(nprobe, m, m2, luts.data(),
                                     biases.data(), ours.luts.data(),
                                     ours.biases.data(), &ours.a, &ours.b,
                                     &mins);
  const std::string what = ::testing::PrintToString(
      std::vector<size_t>{nprobe, m, static_cast<size_t>(seed)});
  EXPECT_EQ(ours.a, theirs.a) << what;
  EXPECT_EQ(ours.b, theirs.b) << what;
  for (size_t j = 0; j < nprobe; ++j) {
    if (static_cast<int>(j) == nan_probe) continue;  // never scanned
    EXPECT_EQ(ours.biases[j], theirs.biases[j]) << what << " probe " << j;
    for (size_t e = j * m2 * 16; e < (j + 1) * m2 * 16; ++e) {
      ASSERT_EQ(ours.luts[e], theirs.luts[e]) << what << " entry " << e;
    }
  }
}

TEST(FastScanLut, EqualsFaissOnRandomTables) {
  std::mt19937_64 shapes(5);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const size_t nprobe = 1 + shapes() % 24;
    const size_t m = 1 + shapes() % 200;  // odd m: padded tables
    const float spread = 0.01f * static_cast<float>(1 + shapes() % 100000);
    Compare(nprobe, m, spread, /*nan_probe=*/-1, seed);
  }
}

TEST(FastScanLut, IgnoresAProbeOfNoList) {
  Compare(/*nprobe=*/8, /*m=*/49, /*spread=*/3.0f, /*nan_probe=*/5, 1);
  Compare(/*nprobe=*/3, /*m=*/16, /*spread=*/300.0f, /*nan_probe=*/0, 2);
}

TEST(FastScanLut, QueryTablesEqualFaissOnRandomTables) {
  std::mt19937_64 shapes(6);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const size_t m = 1 + shapes() % 200;
    const size_t m2 = (m + 1) / 2 * 2;
    const float spread = 0.01f * static_cast<float>(1 + shapes() % 100000);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> value(0, spread);
    std::vector<float> luts(m * 16);
    for (float& v : luts) v = value(rng);
    if (seed % 7 == 0) luts[rng() % luts.size()] = NAN;  // a NaN query value
    Quantized theirs, ours;
    for (Quantized* q : {&theirs, &ours}) q->luts.assign(m2 * 16, 0xAB);
    faiss::quantize_lut::quantize_LUT_and_bias(
        /*nprobe=*/5, m, 16, /*lut_is_3d=*/false, luts.data(),
        /*bias=*/nullptr, theirs.luts.data(), m2, /*biasq=*/nullptr,
        &theirs.a, &theirs.b);
    std::vector<float> mins;
    fastscan_lut::QuantizeQueryLuts(m, m2, luts.data(), ours.luts.data(),
                                    &ours.a, &ours.b, &mins);
    EXPECT_EQ(ours.a, theirs.a) << "m " << m << " seed " << seed;
    EXPECT_EQ(ours.b, theirs.b) << "m " << m << " seed " << seed;
    for (size_t e = 0; e < m2 * 16; ++e) {
      ASSERT_EQ(ours.luts[e], theirs.luts[e])
          << "m " << m << " seed " << seed << " entry " << e;
    }
  }
}

// Bitwise: +inf and NaN compared as the same bits.
void ExpectSameBits(const std::vector<float>& ours,
                    const std::vector<float>& theirs, size_t m) {
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t e = 0; e < theirs.size(); ++e) {
    uint32_t a, b;
    std::memcpy(&a, &ours[e], 4);
    std::memcpy(&b, &theirs[e], 4);
    ASSERT_EQ(a, b) << "m " << m << " entry " << e << ": " << ours[e]
                    << " vs " << theirs[e];
  }
}

TEST(FastScanLut, D4DistanceTablesEqualFaissWhereTheyApply) {
  if (!fastscan_lut::D4TablesApply(4, 16)) {
    GTEST_SKIP() << "built without AVX2: FAISS computes the tables";
  }
  EXPECT_FALSE(fastscan_lut::D4TablesApply(2, 16));
  EXPECT_FALSE(fastscan_lut::D4TablesApply(4, 256));
  std::mt19937_64 rng(7);
  for (size_t m : {1, 3, 96, 196}) {
    faiss::ProductQuantizer pq(4 * m, m, 4);
    std::normal_distribution<float> value(0, 1 + static_cast<float>(m));
    for (float& c : pq.centroids) c = value(rng);
    const size_t n = 13;
    std::vector<float> x(n * 4 * m);
    for (float& v : x) v = value(rng);
    x[5] = 1e30f;  // far out: the squares overflow alike
    std::vector<float> theirs(n * m * 16), ours(n * m * 16, -1);
    pq.compute_distance_tables(n, x.data(), theirs.data());
    const std::vector<float> by_dim =
        fastscan_lut::CentroidsByDim(pq.centroids.data(), m);
    fastscan_lut::D4DistanceTables(n, x.data(), m, by_dim.data(), ours.data());
    ExpectSameBits(ours, theirs, m);
  }
}

// 1-dim sub-vectors (the default recipe for 128 dims and fewer): the same
// bits as FAISS's tables on any build, infinities and NaNs included.
TEST(FastScanLut, D1DistanceTablesEqualFaiss) {
  std::mt19937_64 rng(11);
  for (size_t m : {1, 5, 100, 128}) {
    faiss::ProductQuantizer pq(m, m, 4);
    std::normal_distribution<float> value(0, 1 + static_cast<float>(m));
    for (float& c : pq.centroids) c = value(rng);
    const size_t n = 7;
    std::vector<float> x(n * m);
    for (float& v : x) v = value(rng);
    x[0] = 1e30f;  // the square overflows
    if (m > 1) x[1] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> theirs(n * m * 16), ours(n * m * 16, -1);
    pq.compute_distance_tables(n, x.data(), theirs.data());
    fastscan_lut::D1DistanceTables(n, x.data(), m, pq.centroids.data(),
                                   ours.data());
    ExpectSameBits(ours, theirs, m);
  }
}

}  // namespace
}  // namespace knnd

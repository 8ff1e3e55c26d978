// knnd's quantization of residual look-up tables against FAISS's
// quantize_LUT_and_bias: equal bit for bit on random tables of many shapes.
#include "knnd/faiss/fastscan_lut.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace knnd

// Quantization of a FastScan query's float look-up tables to the uint8
// tables and uint16 biases the 4-bit kernels read: knnd's own vectorised
// form of faiss::quantize_lut::quantize_LUT_and_bias for by-residual L2
// indexes (one table per probed list), whose scalar loops took an eighth of
// a batch's search. Internal to src/faiss/ (fastscan_search.cc).
//
// AVX2 when compiled with it (src/faiss/CMakeLists.txt gives this file the
// SIMD flags of an AVX2 FAISS build), a portable loop otherwise; both give
// FAISS's results bit for bit (tests/faiss/fastscan_lut_test.cc).
// Thread-safety: pure functions.
#ifndef KNND_FAISS_FASTSCAN_LUT_H_
#define KNND_FAISS_FASTSCAN_LUT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace knnd {
namespace fastscan_lut {

// One query's tables: `luts` holds nprobe * m tables of 16 floats (probe
// major), `biases` nprobe floats. Writes nprobe * m2 uint8 tables to
// `luts_q` (tables m..m2-1 of each probe zeroed), nprobe uint16 biases to
// `biases_q`, and the affine map back (distance = value / *a + *b).
// NaN entries (a probe of no list) are ignored, as FAISS ignores them.
// `mins` is scratch, resized as needed.
void QuantizeResidualLuts(size_t nprobe, size_t m, size_t m2,
                          const float* luts, const float* biases,
                          uint8_t* luts_q, uint16_t* biases_q, float* a,
                          float* b, std::vector<float>* mins);

}  // namespace fastscan_lut
}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_LUT_H_

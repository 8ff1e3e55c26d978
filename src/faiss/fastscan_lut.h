// A FastScan batch's look-up tables (ComputeQuantizedLuts) and their
// quantization to the uint8 tables and uint16 biases the 4-bit kernels
// read: knnd's own vectorised form of
// faiss::quantize_lut::quantize_LUT_and_bias for by-residual L2 indexes
// (one table per probed list), whose scalar loops took an eighth of a
// batch's search. Internal to src/faiss/ (fastscan_search.cc).
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

#include <faiss/utils/AlignedTable.h>

namespace faiss {
struct IndexIVFPQFastScan;
}  // namespace faiss

namespace knnd {
namespace fastscan_lut {

// Quantized look-up tables of one batch, as IndexIVFFastScan's
// compute_LUT_uint8 builds them, for an nprobe given per call.
struct QuantizedLuts {
  bool is_3d = false;    // one table per (query, probe) instead of per query
  bool has_bias = false;  // per (query, probe) uint16 bias
  // (n [* nprobe]) * 16 * M2, allocated to size (FAISS's AlignedTable
  // rounds up to a power of two: 784 KiB for 256 Fashion-MNIST rows became
  // 1 MiB, mapped afresh and faulted in on every call: fastscan_search.cc,
  // kSliceLutBytes).
  faiss::AlignedTableTightAlloc<uint8_t> tables;
  faiss::AlignedTable<uint16_t> biases;  // n * nprobe when has_bias
  std::vector<float> normalizers;        // per query: a, b (d = v / a + b)
};

// The tables of n queries x (IndexIVFPQFastScan::compute_LUT_uint8, for
// an nprobe given per call): coarse_ids / coarse_dis, n * nprobe, are the
// queries' probed lists and their distances (unused, may be null, where the
// codes are not residuals). `by_dim`: the centroids by dimension
// (CentroidsByDim, where D4TablesApply), or empty.
void ComputeQuantizedLuts(const faiss::IndexIVFPQFastScan& ivf,
                          const std::vector<float>& by_dim, size_t n,
                          const float* x, const int64_t* coarse_ids,
                          const float* coarse_dis, size_t nprobe,
                          QuantizedLuts* out);

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

// The same for a table per query without biases (an index not by
// residual): m tables of 16 floats in `luts`, m2 uint8 tables written to
// `luts_q` (tables m..m2-1 zeroed); FAISS's quantize_LUT_and_bias with no
// bias, bit for bit. `mins` is scratch.
void QuantizeQueryLuts(size_t m, size_t m2, const float* luts,
                       uint8_t* luts_q, float* a, float* b,
                       std::vector<float>* mins);

// Float L2 tables of product quantizers with 4-dim sub-vectors and 16
// centroids each (knnctl build's default recipes: 784 / 196, 384 / 96),
// equal bit for bit to ProductQuantizer::compute_distance_tables in
// FAISS 1.7.3's AVX2 build, whose loop gathers each dimension of 8
// centroids from memory (four gathers per 8 entries, 6% of a single-query
// search in perf); here the centroids are kept by dimension (`by_dim`,
// from CentroidsByDim) and read with plain loads. Only compiled in
// (D4TablesApply true) with AVX2 + FMA, an AVX2 FAISS build's flags.
bool D4TablesApply(size_t dsub, size_t ksub);
// pq's centroids (m sub-quantizers x 16 centroids x 4 floats) as
// m x 4 dimensions x 16 centroids.
std::vector<float> CentroidsByDim(const float* centroids, size_t m);
// out[(i * m + j) * 16 + c] = squared L2 distance of x_i's sub-vector j to
// centroid c of sub-quantizer j, for n queries of d = 4 * m floats.
void D4DistanceTables(size_t n, const float* x, size_t m,
                      const float* by_dim, float* out);

// The same for 1-dim sub-vectors (knnctl build's default below 192 dims;
// centroids as FAISS keeps them, m x 16 floats): the squared
// difference, as FAISS 1.7.3's fvec_L2sqr_ny computes it for d = 1, bit
// for bit, without its call per sub-quantizer and per-entry extraction
// (4% of a single-query search of a 128-dim index in perf).
void D1DistanceTables(size_t n, const float* x, size_t m,
                      const float* centroids, float* out);

}  // namespace fastscan_lut
}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_LUT_H_

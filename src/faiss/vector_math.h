// Vector arithmetic on float rows with FAISS's SIMD kernels: exact
// distances, L2 normalisation, float16 conversion and exact (flat) k-NN.
// One implementation for re-ranking, cosine queries, building and ground
// truth.
//
// Thread-safety: every function is safe to call concurrently; exact k-NN
// uses FAISS's OpenMP threads as the caller's thread settings allow.
#ifndef KNND_FAISS_VECTOR_MATH_H_
#define KNND_FAISS_VECTOR_MATH_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "knnd/base/metric.h"

namespace knnd {

float L2Squared(const float* a, const float* b, size_t dim);
float InnerProduct(const float* a, const float* b, size_t dim);
// Squared L2 for kL2, the inner product otherwise (cosine is the inner
// product of normalised vectors).
inline float ExactDistance(Metric metric, const float* a, const float* b,
                           size_t dim) {
  return metric == Metric::kL2 ? L2Squared(a, b, dim) : InnerProduct(a, b, dim);
}

// ExactDistance(metric, a, rows[j], dim) into out[j] for each of the n
// rows, equal to it bit for bit; where the CPU has AVX-512 eight rows are
// read at a time, so that rows at random places of memory (re-ranking's
// candidates) have their reads in flight together.
void ExactDistances(Metric metric, const float* a, const float* const* rows,
                    size_t n, size_t dim, float* out);

// The same over float16 rows (IEEE half, `dim` each): out[j] equals
// ExactDistance of `a` to rows[j] decoded by HalvesToFloats, bit for bit;
// with AVX-512 the halves are converted in registers, so that only they are
// read.
void ExactDistances(Metric metric, const float* a,
                    const uint16_t* const* rows, size_t n, size_t dim,
                    float* out);

// Scales each of `rows` rows of `dim` floats to unit L2 norm in place
// (a zero row stays zero).
void NormalizeRows(float* values, int64_t rows, int dim);

uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t half);
void HalvesToFloats(const uint16_t* halves, size_t n, float* out);

// Exact k nearest neighbours of `num_queries` queries among `rows` base
// vectors (both row-major, `dim` wide) by `metric` (kCosine: inner product,
// the caller normalises). Writes num_queries * k ids and distances,
// closest first. INTERNAL on a FAISS error.
absl::Status ExactKnn(const float* base, int64_t rows, const float* queries,
                      int64_t num_queries, int dim, int k, Metric metric,
                      float* distances, int64_t* ids);

}  // namespace knnd

#endif  // KNND_FAISS_VECTOR_MATH_H_

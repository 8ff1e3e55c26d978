#include "knnd/faiss/vector_math.h"

#include <memory>

#include <faiss/IndexFlat.h>
#include <faiss/utils/distances.h>
#include <faiss/utils/fp16.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/faiss_types.h"

namespace knnd {

float L2Squared(const float* a, const float* b, size_t dim) {
  return faiss::fvec_L2sqr(a, b, dim);
}

float InnerProduct(const float* a, const float* b, size_t dim) {
  return faiss::fvec_inner_product(a, b, dim);
}

void NormalizeRows(float* values, int64_t rows, int dim) {
  if (rows <= 0 || dim <= 0) return;
  faiss::fvec_renorm_L2(static_cast<size_t>(dim), static_cast<size_t>(rows),
                        values);
}

uint16_t FloatToHalf(float value) { return faiss::encode_fp16(value); }

float HalfToFloat(uint16_t half) { return faiss::decode_fp16(half); }

void HalvesToFloats(const uint16_t* halves, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = faiss::decode_fp16(halves[i]);
}

absl::Status ExactKnn(const float* base, int64_t rows, const float* queries,
                      int64_t num_queries, int dim, int k, Metric metric,
                      float* distances, int64_t* ids) {
  return faiss_types::CatchFaiss(
      absl::StatusCode::kInternal, "exact search failed", [&] {
        std::unique_ptr<faiss::IndexFlat> flat;
        if (metric == Metric::kL2) {
          flat = std::make_unique<faiss::IndexFlatL2>(dim);
        } else {
          flat = std::make_unique<faiss::IndexFlatIP>(dim);
        }
        flat->add(rows, base);
        flat->search(num_queries, queries, k, distances, ids);
      });
}

}  // namespace knnd

#include "knnd/faiss/quantization_error.h"

#include <vector>

#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/IndexPreTransform.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/faiss_types.h"

namespace knnd {
namespace {

double SquaredNorm(const float* a, int64_t dim) {
  double sum = 0;
  for (int64_t j = 0; j < dim; ++j) sum += static_cast<double>(a[j]) * a[j];
  return sum;
}

double SquaredDistance(const float* a, const float* b, int64_t dim) {
  double sum = 0;
  for (int64_t j = 0; j < dim; ++j) {
    const double d = static_cast<double>(a[j]) - b[j];
    sum += d * d;
  }
  return sum;
}

}  // namespace

absl::StatusOr<QuantizationError> MeasureQuantizationError(
    const faiss::Index& root, const float* vectors, int64_t n) {
  QuantizationError error;
  if (n <= 0) return error;
  const auto* pre = dynamic_cast<const faiss::IndexPreTransform*>(&root);
  const faiss::Index* inner = pre != nullptr ? pre->index : &root;
  // FAISS 1.7.3 keeps by_residual in each IVF-PQ class, not in IndexIVF.
  const faiss::IndexIVF* ivf = nullptr;
  const faiss::ProductQuantizer* pq = nullptr;
  bool by_residual = true;
  if (const auto* fs = dynamic_cast<const faiss::IndexIVFPQFastScan*>(inner)) {
    ivf = fs;
    pq = &fs->pq;
    by_residual = fs->by_residual;
  } else if (const auto* ivfpq =
                 dynamic_cast<const faiss::IndexIVFPQ*>(inner)) {
    ivf = ivfpq;
    pq = &ivfpq->pq;
    by_residual = ivfpq->by_residual;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("no quantization error for a ", faiss_types::TypeOf(inner),
                     ": not an IVF-PQ index"));
  }
  absl::Status status = faiss_types::CatchFaiss(
      absl::StatusCode::kInternal, "measuring the quantization error", [&] {
        const float* x =
            pre != nullptr ? pre->apply_chain(n, vectors) : vectors;
        const int64_t d = ivf->d;
        std::vector<faiss::Index::idx_t> list(static_cast<size_t>(n));
        ivf->quantizer->assign(n, x, list.data());
        std::vector<float> residual(d);
        std::vector<float> decoded(d);
        std::vector<uint8_t> code(pq->code_size);
        for (int64_t i = 0; i < n; ++i) {
          const float* xi = x + i * d;
          ivf->quantizer->compute_residual(xi, residual.data(), list[i]);
          error.coarse += SquaredNorm(residual.data(), d);
          const float* target = by_residual ? residual.data() : xi;
          pq->compute_code(target, code.data());
          pq->decode(code.data(), decoded.data());
          error.pq += SquaredDistance(target, decoded.data(), d);
        }
        if (x != vectors) delete[] x;
      });
  if (!status.ok()) return status;
  error.coarse /= static_cast<double>(n);
  error.pq /= static_cast<double>(n);
  return error;
}

}  // namespace knnd

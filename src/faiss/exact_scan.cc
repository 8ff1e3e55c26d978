#include "knnd/faiss/exact_scan.h"

#include <omp.h>

#include <algorithm>
#include <limits>

#include <faiss/utils/distances.h>

// OpenBLAS's Fortran interface, declared as FAISS declares it (FAISS is
// built with 32-bit BLAS integers).
extern "C" int sgemm_(const char* transa, const char* transb, const int* m,
                      const int* n, const int* k, const float* alpha,
                      const float* a, const int* lda, const float* b,
                      const int* ldb, const float* beta, float* c,
                      const int* ldc);

namespace knnd {
namespace {

// Rows per BLAS product: a thread's (queries x kSubRows) block of products
// stays within the L2 cache's reach for a few hundred queries.
constexpr int64_t kSubRows = 4096;
// Below this many multiply-adds per Add() one thread does it all (small
// indexes, tests): an OpenMP region costs more than it saves.
constexpr double kParallelWork = 1e8;

}  // namespace

ExactScan::ExactScan(const float* queries, int64_t num_queries, int dim, int k,
                     Metric metric)
    : queries_(queries, queries + num_queries * dim),
      num_queries_(num_queries),
      dim_(dim),
      k_(k),
      l2_(metric == Metric::kL2),
      ids_(static_cast<size_t>(num_queries) * k, -1),
      distances_(static_cast<size_t>(num_queries) * k,
                 l2_ ? std::numeric_limits<float>::infinity()
                     : -std::numeric_limits<float>::infinity()) {
  if (l2_) {
    query_norms_.resize(static_cast<size_t>(num_queries));
    for (int64_t q = 0; q < num_queries; ++q) {
      query_norms_[q] = faiss::fvec_norm_L2sqr(queries_.data() + q * dim, dim);
    }
  }
}

void ExactScan::Add(const float* rows, int64_t count) {
  if (count <= 0 || num_queries_ <= 0) return;
  // Squared norms as faiss::fvec_norms_L2sqr computes them, row by row.
  std::vector<float> row_norms;
  if (l2_) {
    row_norms.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      row_norms[i] = faiss::fvec_norm_L2sqr(rows + i * dim_, dim_);
    }
  }
  const int64_t first_row = rows_;
  rows_ += count;
  const double work =
      static_cast<double>(num_queries_) * static_cast<double>(count) * dim_;
  const int64_t shares =
      work < kParallelWork
          ? 1
          : std::min<int64_t>(omp_get_max_threads(), num_queries_);
  // Each share of the queries is scanned by one thread over the whole
  // block: no barrier until the block ends.
#pragma omp parallel for schedule(static) if (shares > 1)
  for (int64_t s = 0; s < shares; ++s) {
    ScanQueries(rows, row_norms.data(), count, first_row,
                s * num_queries_ / shares, (s + 1) * num_queries_ / shares);
  }
}

void ExactScan::ScanQueries(const float* rows, const float* row_norms,
                            int64_t count, int64_t first_row, int64_t q0,
                            int64_t q1) {
  const int nq = static_cast<int>(q1 - q0);
  std::vector<float> ip(static_cast<size_t>(nq) *
                        static_cast<size_t>(std::min(kSubRows, count)));
  for (int64_t j0 = 0; j0 < count; j0 += kSubRows) {
    const int n = static_cast<int>(std::min(kSubRows, count - j0));
    // ip[q * n + j] = <row j0 + j, query q0 + q>, the product FAISS's
    // exhaustive search forms (rows transposed times queries).
    const float one = 1;
    const float zero = 0;
    const int d = dim_;
    sgemm_("Transpose", "Not transpose", &n, &nq, &d, &one, rows + j0 * dim_,
           &d, queries_.data() + q0 * dim_, &d, &zero, ip.data(), &n);
    for (int q = 0; q < nq; ++q) {
      const int64_t query = q0 + q;
      float* best = distances_.data() + query * k_;
      int64_t* best_ids = ids_.data() + query * k_;
      const float* line = ip.data() + static_cast<size_t>(q) * n;
      for (int j = 0; j < n; ++j) {
        float dis = line[j];
        if (l2_) {
          // FAISS's formula and its clamp (identical rows round below 0).
          dis = query_norms_[query] + row_norms[j0 + j] - 2 * dis;
          if (dis < 0) dis = 0;
        }
        // Rows come in ascending order, so a tie with the k-th keeps the
        // lower row, and an insertion goes after the equal distances.
        const bool better = l2_ ? dis < best[k_ - 1] : dis > best[k_ - 1];
        if (!better) continue;
        int p = k_ - 1;
        while (p > 0 && (l2_ ? dis < best[p - 1] : dis > best[p - 1])) {
          best[p] = best[p - 1];
          best_ids[p] = best_ids[p - 1];
          --p;
        }
        best[p] = dis;
        best_ids[p] = first_row + j0 + j;
      }
    }
  }
}

}  // namespace knnd

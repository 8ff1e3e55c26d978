#include "knnd/faiss/exact_scan.h"

#include <omp.h>

#include <algorithm>
#include <limits>

#include <faiss/utils/distances.h>

#include "knnd/faiss/sgemm.h"

namespace knnd {
namespace {

// Rows per BLAS product, as FAISS's blocks; fewer for many queries, so
// that a thread's block of products stays near 4 MiB.
constexpr int64_t kMaxBlockRows = 4096;
constexpr int64_t kBlockFloats = int64_t{1} << 20;
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
      block_rows_(
          std::clamp<int64_t>(kBlockFloats / std::max<int64_t>(1, num_queries),
                              64, kMaxBlockRows)) {
  EmptyResults(ids_, distances_);
  if (l2_) {
    query_norms_.resize(static_cast<size_t>(num_queries));
    for (int64_t q = 0; q < num_queries; ++q) {
      query_norms_[q] = faiss::fvec_norm_L2sqr(queries_.data() + q * dim, dim);
    }
  }
}

void ExactScan::EmptyResults(std::vector<int64_t>& ids,
                             std::vector<float>& distances) const {
  const size_t n = static_cast<size_t>(num_queries_) * k_;
  ids.assign(n, -1);
  distances.assign(n, l2_ ? std::numeric_limits<float>::infinity()
                          : -std::numeric_limits<float>::infinity());
}

void ExactScan::Add(const float* rows, int64_t count) {
  if (count <= 0 || num_queries_ <= 0) return;
  const int64_t first_row = rows_;
  rows_ += count;
  const int64_t blocks = (count + block_rows_ - 1) / block_rows_;
  const double work =
      static_cast<double>(num_queries_) * static_cast<double>(count) * dim_;
  const int threads =
      work < kParallelWork
          ? 1
          : static_cast<int>(std::min<int64_t>(omp_get_max_threads(), blocks));
  if (threads <= 1) {
    Scratch scratch;
    for (int64_t b = 0; b < blocks; ++b) {
      ScanBlock(rows, count, first_row, b, ids_.data(), distances_.data(),
                scratch);
    }
    return;
  }
  // Threads take blocks of rows as they come (a thread that waits for a
  // core on a busy machine takes fewer), each into its own k best; those
  // are merged once the region ends, its one barrier.
  std::vector<std::vector<int64_t>> thread_ids(threads);
  std::vector<std::vector<float>> thread_distances(threads);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    EmptyResults(thread_ids[t], thread_distances[t]);
    Scratch scratch;
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < blocks; ++b) {
      ScanBlock(rows, count, first_row, b, thread_ids[t].data(),
                thread_distances[t].data(), scratch);
    }
  }
  for (int t = 0; t < threads; ++t) {
    for (int64_t q = 0; q < num_queries_; ++q) {
      for (int j = 0; j < k_; ++j) {
        const size_t at = static_cast<size_t>(q) * k_ + j;
        if (thread_ids[t][at] < 0) break;
        Insert(q, thread_distances[t][at], thread_ids[t][at], ids_.data(),
               distances_.data());
      }
    }
  }
}

void ExactScan::ScanBlock(const float* rows, int64_t count, int64_t first_row,
                          int64_t block, int64_t* ids, float* distances,
                          Scratch& scratch) const {
  const int64_t j0 = block * block_rows_;
  const int n = static_cast<int>(std::min(block_rows_, count - j0));
  const float* x = rows + j0 * dim_;
  scratch.products.resize(static_cast<size_t>(n) * num_queries_);
  if (l2_) {
    // Squared norms as faiss::fvec_norms_L2sqr computes them.
    scratch.norms.resize(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      scratch.norms[j] = faiss::fvec_norm_L2sqr(x + j * dim_, dim_);
    }
  }
  // products[q * n + j] = <row j0 + j, query q>: the product FAISS's
  // exhaustive search forms (rows transposed times queries).
  const float one = 1;
  const float zero = 0;
  const int d = dim_;
  const int nq = static_cast<int>(num_queries_);
  sgemm_("Transpose", "Not transpose", &n, &nq, &d, &one, x, &d,
         queries_.data(), &d, &zero, scratch.products.data(), &n);
  for (int64_t q = 0; q < num_queries_; ++q) {
    const float* line = scratch.products.data() + q * n;
    for (int j = 0; j < n; ++j) {
      float dis = line[j];
      if (l2_) {
        // FAISS's formula and its clamp (identical rows round below 0).
        dis = query_norms_[q] + scratch.norms[j] - 2 * dis;
        if (dis < 0) dis = 0;
      }
      // Cheap rejection first: most rows are farther than the k-th.
      if (l2_ ? dis > distances[q * k_ + k_ - 1]
              : dis < distances[q * k_ + k_ - 1]) {
        continue;
      }
      Insert(q, dis, first_row + j0 + j, ids, distances);
    }
  }
}

void ExactScan::Insert(int64_t q, float dis, int64_t row, int64_t* ids,
                       float* distances) const {
  float* best = distances + q * k_;
  int64_t* best_ids = ids + q * k_;
  // Closer first; an equal distance goes after the lower rows (and -1,
  // an empty place, after every row).
  auto before = [this](float d, int64_t r, float other_d, int64_t other_r) {
    if (d != other_d) return l2_ ? d < other_d : d > other_d;
    return other_r < 0 || r < other_r;
  };
  if (!before(dis, row, best[k_ - 1], best_ids[k_ - 1])) return;
  int p = k_ - 1;
  while (p > 0 && before(dis, row, best[p - 1], best_ids[p - 1])) {
    best[p] = best[p - 1];
    best_ids[p] = best_ids[p - 1];
    --p;
  }
  best[p] = dis;
  best_ids[p] = row;
}

}  // namespace knnd

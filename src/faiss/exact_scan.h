// Exact k nearest rows of a large row set (a mapped INDEX.vectors) for a
// few hundred queries, the rows fed block by block so that they are never
// copied whole: ground truth for knnctl update's recall estimate.
//
// What faiss::IndexFlat::search answers for >= 20 queries (the same BLAS
// product and the same distance formula, so the same distances), but with
// one OpenMP region per Add() instead of FAISS 1.7.3's two per 1024 rows:
// on a busy two-core machine those regions' barriers (a thread spinning
// while the other waits for a core) made an exact search of 200 queries
// over 1M x 128 rows take 30 s of wall clock for 2 s of work. Each thread
// takes a fixed share of the queries and scans the whole block for them;
// there is no barrier inside a block.
//
// Thread-safety: one thread calls an ExactScan; it uses FAISS's OpenMP
// threads as the caller's thread settings allow.
#ifndef KNND_FAISS_EXACT_SCAN_H_
#define KNND_FAISS_EXACT_SCAN_H_

#include <cstdint>
#include <vector>

#include "knnd/base/metric.h"

namespace knnd {

class ExactScan {
 public:
  // `queries`: num_queries x dim floats, copied. kCosine: inner product
  // (the caller normalises queries and rows). k >= 1.
  ExactScan(const float* queries, int64_t num_queries, int dim, int k,
            Metric metric);

  // The next `count` rows (row-major, dim floats each), numbered on from
  // the rows added before. Blocks of tens of thousands of rows keep the
  // OpenMP regions few.
  void Add(const float* rows, int64_t count);

  // Rows added so far.
  int64_t rows() const { return rows_; }

  // For each query its k nearest rows' numbers and distances (squared L2,
  // or the inner product), closest first and equal distances by lower row
  // number; -1 (and the worst distance) past the rows added.
  const std::vector<int64_t>& ids() const { return ids_; }
  const std::vector<float>& distances() const { return distances_; }

 private:
  // Scans `count` rows (the first numbered first_row, their squared norms
  // in `row_norms` for kL2) for queries [q0, q1).
  void ScanQueries(const float* rows, const float* row_norms, int64_t count,
                   int64_t first_row, int64_t q0, int64_t q1);

  const std::vector<float> queries_;
  const int64_t num_queries_;
  const int dim_;
  const int k_;
  const bool l2_;
  std::vector<float> query_norms_;  // squared, for kL2
  std::vector<int64_t> ids_;        // num_queries x k, sorted per query
  std::vector<float> distances_;
  int64_t rows_ = 0;
};

}  // namespace knnd

#endif  // KNND_FAISS_EXACT_SCAN_H_

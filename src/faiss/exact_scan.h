// Exact k nearest rows of a large row set (a mapped INDEX.vectors) for a
// few hundred queries, the rows fed block by block so that they are never
// copied whole: ground truth for knnctl update's recall estimate.
//
// What faiss::IndexFlat::search answers for >= 20 queries (the same BLAS
// product and the same distance formula, so the same distances; equal
// distances go to the lower row), but with one OpenMP region per Add()
// instead of FAISS 1.7.3's two per 1024 rows: on a busy two-core machine
// those regions' barriers (a thread spinning while the other waits for a
// core) made an exact search of 200 queries over 1M x 128 rows take 25 s
// of wall clock for 2 s of work. Threads take blocks of 4096 rows as they
// come, each into its own k best per query, merged when the region ends.
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
  // the rows added before. Large blocks (a whole mapped file) keep the
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
  struct Scratch {
    std::vector<float> products;  // block rows x queries
    std::vector<float> norms;     // the block's rows', for kL2
  };
  // num_queries x k results, every place empty (-1).
  void EmptyResults(std::vector<int64_t>& ids,
                    std::vector<float>& distances) const;
  // Scans block `block` of `rows` (count rows, the first numbered
  // first_row) into the results `ids` / `distances`.
  void ScanBlock(const float* rows, int64_t count, int64_t first_row,
                 int64_t block, int64_t* ids, float* distances,
                 Scratch& scratch) const;
  // Puts (dis, row) among query q's k best in `ids` / `distances` when it
  // is closer than the k-th, equal distances ordered by row.
  void Insert(int64_t q, float dis, int64_t row, int64_t* ids,
              float* distances) const;

  const std::vector<float> queries_;
  const int64_t num_queries_;
  const int dim_;
  const int k_;
  const bool l2_;
  const int64_t block_rows_;        // rows per BLAS product
  std::vector<float> query_norms_;  // squared, for kL2
  std::vector<int64_t> ids_;        // num_queries x k, sorted per query
  std::vector<float> distances_;
  int64_t rows_ = 0;
};

}  // namespace knnd

#endif  // KNND_FAISS_EXACT_SCAN_H_

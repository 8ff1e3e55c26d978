// Batcher: turns admitted search requests into work units for the
// WorkerPool. A request larger than max_batch_rows is split into units of at
// most that many rows, which run on several workers in parallel; the request
// completes when its last unit does. Before a unit runs, the request's
// deadline and cancellation are checked, so expired or abandoned work is
// never searched.
//
// Ownership: Submit() takes the SearchJob; the job's ticket (its share of
// the AdmissionGate) is released right after its completion callback ran.
// Thread-safety: Submit() is safe from any thread; callbacks run on worker
// threads.
#ifndef KNND_BATCHER_H_
#define KNND_BATCHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "knnd/admission_gate.h"
#include "knnd/index_snapshot.h"
#include "knnd/metrics.h"
#include "knnd/worker_pool.h"

namespace knnd {

// Where a request's time went, for metrics and logs.
struct JobTimes {
  absl::Duration queue;   // submitted -> first unit started
  absl::Duration search;  // first unit started -> last unit finished
  int units = 0;
};

// One admitted Search call. Pointers must stay valid until on_done ran.
struct SearchJob {
  std::shared_ptr<const IndexSnapshot> snapshot;  // pinned for the job's life
  const float* queries = nullptr;  // num_queries * dim, row-major
  std::vector<float> query_storage;  // owns `queries` when it is a copy
  int64_t num_queries = 0;
  int k = 0;
  int nprobe = 1;
  std::vector<int64_t> allowed_ids;  // sorted ascending; empty: no filter
  float* distances = nullptr;        // num_queries * k
  int64_t* ids = nullptr;            // num_queries * k
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> is_cancelled;  // optional
  // Called exactly once, on a worker thread, after the last unit.
  std::function<void(const absl::Status&, const JobTimes&)> on_done;
  AdmissionGate::Ticket ticket;
};

class Batcher {
 public:
  struct Options {
    // Largest number of rows in one FAISS call. Must be > 0.
    int max_batch_rows = 256;
  };

  // `metrics` (optional) is told the rows of every FAISS call that runs.
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(
      const Options& options, WorkerPool* pool, Metrics* metrics = nullptr);

  void Submit(std::unique_ptr<SearchJob> job);

 private:
  struct Running;
  Batcher(const Options& options, WorkerPool* pool, Metrics* metrics)
      : options_(options), pool_(pool), metrics_(metrics) {}
  static void RunUnit(const std::shared_ptr<Running>& running, int64_t begin,
                      int64_t end, Metrics* metrics);

  const Options options_;
  WorkerPool* const pool_;   // not owned
  Metrics* const metrics_;   // not owned; may be null
};

}  // namespace knnd

#endif  // KNND_BATCHER_H_

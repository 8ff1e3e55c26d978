// Batcher: turns admitted search requests into FAISS calls on the
// WorkerPool (Triton's dynamic batcher, TF Serving's batching).
// - Splitting: a request larger than max_batch_rows becomes units of at most
//   that many rows, which run on several workers in parallel; the request
//   completes when its last unit does.
// - Coalescing: queued units of different requests with the same key
//   (pinned snapshot, k, nprobe, refine_factor, allow-list; requests with
//   an attribute filter never share one) are merged into one
//   FAISS call of up to max_batch_rows rows: their query rows are copied into
//   one buffer and the results scattered back. A worker whose batch is short
//   may wait up to max_queue_delay_us for more rows of its key, but only while
//   another batch is running (no load: no wait), and never when a unit it
//   holds has a deadline closer than that. While other workers are idle, a
//   worker takes only its fair share of the queued rows (queued rows / idle
//   workers), so that merging never leaves a core idle beside a queue.
// Before a batch runs, every unit's request is checked for deadline and
// cancellation; expired or abandoned units are dropped from the batch and
// never searched, while their neighbours are.
//
// The Batcher owns the queue of pending units; the WorkerPool stays a plain
// executor: each pool task takes one batch from this queue and runs it.
//
// Ownership: Submit() takes the SearchJob; the job's ticket (its share of
// the AdmissionGate) is released right after its completion callback ran.
// The pool must outlive the Batcher; destroying the Batcher waits until
// every submitted job has completed.
// Thread-safety: Submit() is safe from any thread; callbacks run on worker
// threads, or within Submit() for a request searched inline.
#ifndef KNND_SERVING_BATCHER_H_
#define KNND_SERVING_BATCHER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "knnd/index/hybrid_search.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/prepared_filter.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/serving/admission_gate.h"
#include "knnd/serving/worker_pool.h"

namespace knnd {

// Where a request's time went, for metrics and logs.
struct JobTimes {
  absl::Duration queue;   // submitted -> first batch holding it started
  absl::Duration search;  // that start -> its last unit finished
  int units = 0;          // units it was split into
};

// One admitted Search call. Pointers must stay valid until on_done ran.
struct SearchJob {
  std::shared_ptr<const IndexSnapshot> snapshot;  // pinned for the job's life
  // The whole request's search (search_args.h): its queries, parameters and
  // result buffers of num_queries * ResultWidth(args) entries; the Batcher
  // searches it in units of rows. allowed_ids views `allowed_ids_storage`.
  SearchArgs args;
  std::vector<float> query_storage;  // owns args.queries when it is a copy
  std::vector<int64_t> allowed_ids_storage;  // sorted ascending
  // The request's attribute filter, prepared (index/prepared_filter.h):
  // IndexSnapshot::Search runs its plan.
  std::optional<PreparedFilter> filter;
  // With texts (index/hybrid_search.h): the text side of the request and
  // the answer's per-retriever arrays (num_queries * k entries each), which
  // the Batcher fills for each unit's rows. Such a job never shares a batch.
  std::optional<HybridQuery> hybrid;
  HybridOutputs hybrid_out;
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> is_cancelled;  // optional
  // false: never searched on the submitting thread (Options::
  // inline_max_rows), whose other work would wait meanwhile: the HTTP
  // listener's threads each serve many connections.
  bool may_run_inline = true;
  // Called exactly once, on a worker thread, after the last unit.
  std::function<void(const absl::Status&, const JobTimes&)> on_done;
  AdmissionGate::Ticket ticket;
};

class Batcher {
 public:
  struct Options {
    // Largest number of rows in one FAISS call.
    int max_batch_rows = 128;
    // Merge queued units of different requests with the same key into one
    // FAISS call. Off: every unit is its own call (splitting only).
    bool coalesce = true;
    // With coalescing, how long a worker holding a batch of fewer than
    // max_batch_rows rows may wait for more rows of its key while another
    // batch runs, in microseconds. 0: no waiting, batch only what is
    // already queued.
    int64_t max_queue_delay_us = 0;
    // A request of at most this many rows that finds the queue empty and a
    // worker idle is searched on the submitting thread (gRPC's), which
    // saves the hand-off to the worker (a thread wake-up) at low load. The
    // number of searches running at once, inline or on workers, stays at
    // most the pool's thread count. 0: never inline.
    int inline_max_rows = 8;
  };

  // The one range check of each option (the config check calls it too):
  // max_batch_rows in [1, 1000000], max_queue_delay_us in [0, 1000000],
  // inline_max_rows in [0, max_batch_rows].
  static absl::Status ValidateOptions(const Options& options);

  // `metrics` (optional) is told the rows of every FAISS call that runs;
  // `gate` (optional) the time each took per work unit (rows x nprobe),
  // for its queue-time bound.
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(
      const Options& options, WorkerPool* pool, Metrics* metrics = nullptr,
      AdmissionGate* gate = nullptr);
  ~Batcher();

  void Submit(std::unique_ptr<SearchJob> job);

 private:
  struct Running;
  // Rows [begin, end) of one request.
  struct Unit {
    std::shared_ptr<Running> running;
    int64_t begin = 0;
    int64_t end = 0;
  };
  // A worker waiting for more rows of its batch's key.
  struct Collector {
    const Running* key = nullptr;  // compared with SameKey()
    int64_t rows = 0;  // rows held plus rows of that key queued since
  };

  Batcher(const Options& options, WorkerPool* pool, Metrics* metrics,
          AdmissionGate* gate)
      : options_(options), pool_(pool), metrics_(metrics), gate_(gate) {}

  static bool SameKey(const Running& a, const Running& b);
  // Queues the units of `running` (`rows` rows) and schedules their tasks.
  void Enqueue(const std::shared_ptr<Running>& running, int64_t rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One pool task: takes a batch from the queue (waiting for more rows if
  // allowed), runs it and completes its units.
  void RunBatch();
  // The rows a worker starting a batch that holds `held_rows` may take:
  // while other workers are idle, its share of the queued rows (so that
  // coalescing never leaves a core idle beside a queue), else
  // max_batch_rows.
  int64_t FairShare(int64_t held_rows) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves queued units with `key`'s key into `batch` while the batch stays
  // within `limit` rows; returns the rows moved.
  int64_t TakeMatching(const Running& key, int64_t rows, int64_t limit,
                       std::vector<Unit>* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Collecting(const Running& running) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a one-unit request of `rows` rows may run on the submitting
  // thread now (Options::inline_max_rows).
  bool CanRunInline(int64_t rows) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SchedulePoolTask() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Searches the live units of `batch` in one FAISS call.
  void Search(const std::vector<Unit>& batch);
  static void Complete(const Unit& unit);

  const Options options_;
  WorkerPool* const pool_;  // not owned
  Metrics* const metrics_;  // not owned; may be null
  AdmissionGate* const gate_;  // not owned; may be null

  absl::Mutex mu_;
  std::deque<Unit> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Collector*> collectors_ ABSL_GUARDED_BY(mu_);
  // Pool tasks submitted and not finished; of those, not started yet. A
  // queued unit always has an unstarted task or an open collector of its
  // key that will take it or schedule a task for it.
  int64_t tasks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t unstarted_ ABSL_GUARDED_BY(mu_) = 0;
  // Searches running on submitting threads (counted in running_batches_).
  int64_t inline_batches_ ABSL_GUARDED_BY(mu_) = 0;
  // Batches taken from the queue, or run inline, and not finished
  // (collectors excluded). A short batch waits for more rows only while
  // another one runs: without load nothing would come, so a lone request is
  // never held back, and a worker that turns idle never waits beside an
  // idle core.
  int64_t running_batches_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace knnd

#endif  // KNND_SERVING_BATCHER_H_

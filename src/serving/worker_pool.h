// WorkerPool: the fixed set of threads that run searches. Nothing else in
// knnd calls FAISS on a request's behalf, so the number of CPU-bound threads
// is known: num_threads workers * omp_threads_per_worker OpenMP threads each,
// with OpenBLAS pinned to one thread (FAISS calls BLAS for batches of 20+
// queries, and BLAS threads on top of workers oversubscribe the cores).
//
// Ownership: the pool owns its threads, all started (thread settings
// applied) when Create() returns; destroying it runs every task already
// submitted, then joins. Thread-safety: Submit() is safe from any
// thread. The queue itself is unbounded; the AdmissionGate bounds it.
#ifndef KNND_SERVING_WORKER_POOL_H_
#define KNND_SERVING_WORKER_POOL_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace knnd {

class WorkerPool {
 public:
  struct Options {
    // Threads; 0 means the number of CPU cores available to the process.
    int num_threads = 0;
    // OpenMP threads each worker may use within one task.
    int omp_threads_per_worker = 1;
    // Added to the process's nice value for each worker thread (0 to 19;
    // inherited by the OpenMP threads it starts): the threads that are not
    // workers (gRPC's) then run first when the cores are full.
    int nice_increment = 10;
    // The threads' name (as top -H shows; at most 15 characters).
    const char* thread_name = "knnd-worker";
  };

  // The one range check of each option (the config check calls it too):
  // num_threads in [0, 1024], omp_threads_per_worker in [1, 256],
  // nice_increment in [0, 19]; messages use the config field names.
  static absl::Status ValidateOptions(const Options& options);

  static absl::StatusOr<std::unique_ptr<WorkerPool>> Create(
      const Options& options);
  ~WorkerPool();

  void Submit(std::function<void()> task);

  int num_threads() const { return static_cast<int>(threads_.size()); }
  // Tasks submitted but not started yet.
  size_t queued() const;
  // Threads waiting for a task (a snapshot: it may change at once).
  int idle_threads() const { return idle_.load(std::memory_order_relaxed); }
  // Every thread is waiting for a task: nothing runs on the workers (a
  // snapshot). knnd's gRPC threads poll for the next call only then.
  bool all_idle() const { return idle_threads() == num_threads(); }
  // Gives the calling thread the workers' per-thread settings (OpenMP's
  // thread count is one): each worker calls it when it starts, and so does
  // a caller that runs a search itself (Batcher's inline runs). The nice
  // increment is not one of them: it applies to the workers only.
  void ApplyThreadSettings() const;

 private:
  WorkerPool(int omp_threads, int nice_increment, std::string thread_name)
      : omp_threads_(omp_threads),
        nice_increment_(nice_increment),
        thread_name_(std::move(thread_name)) {}
  void Run();

  const int omp_threads_;
  const int nice_increment_;
  const std::string thread_name_;
  std::vector<std::thread> threads_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int started_ ABSL_GUARDED_BY(mu_) = 0;  // workers past their start-up
  std::atomic<int> idle_{0};
};

// CPU cores this process may run on (sched_getaffinity; cgroup CPU quotas
// are not considered).
int AvailableCores();

}  // namespace knnd

#endif  // KNND_SERVING_WORKER_POOL_H_

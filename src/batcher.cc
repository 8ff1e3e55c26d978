#include "knnd/batcher.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace knnd {

// A job plus the bookkeeping its units share.
struct Batcher::Running {
  explicit Running(std::unique_ptr<SearchJob> j, int units)
      : job(std::move(j)), units_left(units), num_units(units) {}

  void Fail(absl::Status status) {
    absl::MutexLock lock(&mu);
    if (error.ok()) error = std::move(status);
    failed.store(true, std::memory_order_relaxed);
  }

  std::unique_ptr<SearchJob> job;
  const absl::Time submitted = absl::Now();
  std::atomic<int> units_left;
  const int num_units;
  std::atomic<bool> failed{false};
  std::atomic<bool> started{false};
  absl::Time first_start;  // written once, by the unit that sets `started`
  absl::Mutex mu;
  absl::Status error ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<Batcher>> Batcher::Create(
    const Options& options, WorkerPool* pool, Metrics* metrics) {
  if (options.max_batch_rows <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_batch_rows=", options.max_batch_rows, " must be positive"));
  }
  if (pool == nullptr) return absl::InvalidArgumentError("no worker pool");
  return std::unique_ptr<Batcher>(new Batcher(options, pool, metrics));
}

void Batcher::Submit(std::unique_ptr<SearchJob> job) {
  const int64_t rows = job->num_queries;
  const int64_t step = options_.max_batch_rows;
  const int units = static_cast<int>((rows + step - 1) / step);
  auto running = std::make_shared<Running>(std::move(job), units);
  for (int64_t begin = 0; begin < rows; begin += step) {
    const int64_t end = std::min(rows, begin + step);
    pool_->Submit([running, begin, end, metrics = metrics_] {
      RunUnit(running, begin, end, metrics);
    });
  }
}

void Batcher::RunUnit(const std::shared_ptr<Running>& running, int64_t begin,
                      int64_t end, Metrics* metrics) {
  SearchJob& job = *running->job;
  const absl::Time start = absl::Now();
  if (!running->started.exchange(true)) running->first_start = start;
  if (!running->failed.load(std::memory_order_relaxed)) {
    if (start > job.deadline) {
      running->Fail(absl::DeadlineExceededError(absl::StrCat(
          "deadline passed after ",
          absl::FormatDuration(start - running->submitted),
          " in the queue, before the search ran")));
    } else if (job.is_cancelled && job.is_cancelled()) {
      running->Fail(absl::CancelledError("request cancelled by the client"));
    } else {
      const int dim = job.snapshot->info().dim;
      const int64_t offset = begin * job.k;
      SearchArgs args;
      args.queries = job.queries + begin * dim;
      args.num_queries = end - begin;
      args.k = job.k;
      args.nprobe = job.nprobe;
      args.allowed_ids = job.allowed_ids;
      args.distances = job.distances + offset;
      args.ids = job.ids + offset;
      if (absl::Status s = job.snapshot->Search(args); !s.ok()) {
        running->Fail(std::move(s));
      }
      if (metrics != nullptr) metrics->RecordBatchRows(args.num_queries);
    }
  }
  if (running->units_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;

  // Last unit: every other unit has finished writing.
  JobTimes times;
  times.units = running->num_units;
  absl::Time first_start = running->first_start;
  times.queue = first_start - running->submitted;
  times.search = absl::Now() - first_start;
  absl::Status status;
  {
    absl::MutexLock lock(&running->mu);
    status = running->error;
  }
  job.on_done(status, times);
  job.ticket.Release();
}

}  // namespace knnd

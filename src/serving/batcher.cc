#include "knnd/serving/batcher.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "knnd/base/range_check.h"

namespace knnd {

// A job plus the bookkeeping its units share.
struct Batcher::Running {
  explicit Running(std::unique_ptr<SearchJob> j, int units)
      : job(std::move(j)),
        filter_hash(absl::Hash<std::vector<int64_t>>()(job->allowed_ids_storage)),
        units_left(units),
        num_units(units) {}

  void Fail(absl::Status status) {
    absl::MutexLock lock(&mu);
    if (error.ok()) error = std::move(status);
    failed.store(true, std::memory_order_relaxed);
  }

  std::unique_ptr<SearchJob> job;
  // Spares a full allow-list comparison between requests that differ.
  const size_t filter_hash;
  const absl::Time submitted = absl::Now();
  std::atomic<int> units_left;
  const int num_units;
  std::atomic<bool> failed{false};
  std::atomic<bool> started{false};
  absl::Time first_start;  // written once, by the unit that sets `started`
  absl::Mutex mu;
  absl::Status error ABSL_GUARDED_BY(mu);
};

absl::Status Batcher::ValidateOptions(const Options& options) {
  if (absl::Status s =
          CheckInRange("max_batch_rows", options.max_batch_rows, 1, 1000000);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckInRange("max_queue_delay_us",
                                    options.max_queue_delay_us, 0, 1000000);
      !s.ok()) {
    return s;
  }
  return CheckInRange("inline_max_rows", options.inline_max_rows, 0,
                      options.max_batch_rows);
}

absl::StatusOr<std::unique_ptr<Batcher>> Batcher::Create(const Options& options,
                                                         WorkerPool* pool,
                                                         Metrics* metrics,
                                                         AdmissionGate* gate) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  if (pool == nullptr) return absl::InvalidArgumentError("no worker pool");
  return std::unique_ptr<Batcher>(new Batcher(options, pool, metrics, gate));
}

Batcher::~Batcher() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;  // collectors stop waiting
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return tasks_ == 0 && queue_.empty();
  };
  mu_.Await(absl::Condition(&idle));
}

namespace {

// Whether two jobs' filters are one: none, or the same bitmap (the filter
// cache's, shared) with the same lists and plan. Bounds are each job's
// own.
bool SameFilter(const std::optional<PreparedFilter>& a,
                const std::optional<PreparedFilter>& b) {
  if (!a.has_value() || !b.has_value()) return a.has_value() == b.has_value();
  return a->rows != nullptr && a->rows == b->rows && a->lists == b->lists &&
         a->plan == b->plan && a->start_nprobe == b->start_nprobe;
}

}  // namespace

bool Batcher::SameKey(const Running& a, const Running& b) {
  const SearchArgs& x = a.job->args;
  const SearchArgs& y = b.job->args;
  // A hybrid request searches its own rows: its texts travel beside them.
  if (a.job->hybrid.has_value() || b.job->hybrid.has_value()) return false;
  // The same pinned snapshot object: a batch never mixes index versions.
  return a.job->snapshot == b.job->snapshot && x.k == y.k &&
         x.nprobe == y.nprobe && x.refine_factor == y.refine_factor &&
         x.return_candidates == y.return_candidates &&
         a.filter_hash == b.filter_hash &&
         a.job->allowed_ids_storage == b.job->allowed_ids_storage &&
         SameFilter(a.job->filter, b.job->filter);
}

void Batcher::Submit(std::unique_ptr<SearchJob> job) {
  const int64_t rows = job->args.num_queries;
  const int64_t step = options_.max_batch_rows;
  const int units = static_cast<int>((rows + step - 1) / step);
  const bool may_run_inline = job->may_run_inline;
  auto running = std::make_shared<Running>(std::move(job), units);
  {
    absl::MutexLock lock(&mu_);
    if (!may_run_inline || !CanRunInline(rows)) {
      Enqueue(running, rows);
      return;
    }
    ++tasks_;
    ++running_batches_;
    ++inline_batches_;
  }
  pool_->ApplyThreadSettings();
  const std::vector<Unit> batch = {Unit{std::move(running), 0, rows}};
  Search(batch);
  Complete(batch.front());
  absl::MutexLock lock(&mu_);
  --inline_batches_;
  --running_batches_;
  --tasks_;
}

bool Batcher::CanRunInline(int64_t rows) const {
  // An idle worker not already stood for by another inline search, and
  // nothing queued that would be overtaken.
  return rows <= options_.inline_max_rows && rows <= options_.max_batch_rows &&
         queue_.empty() && unstarted_ == 0 && collectors_.empty() &&
         pool_->idle_threads() > inline_batches_ &&
         running_batches_ < pool_->num_threads();
}

void Batcher::Enqueue(const std::shared_ptr<Running>& running, int64_t rows) {
  const int64_t step = options_.max_batch_rows;
  for (int64_t begin = 0; begin < rows; begin += step) {
    const int64_t end = std::min(rows, begin + step);
    queue_.push_back(Unit{running, begin, end});
    for (Collector* c : collectors_) {
      if (SameKey(*c->key, *running)) c->rows += end - begin;
    }
    // One task per unit, so that the pool's queue length still counts the
    // units waiting for a worker; a task whose unit joined another batch
    // finds nothing to do.
    SchedulePoolTask();
  }
}

void Batcher::SchedulePoolTask() {
  ++tasks_;
  ++unstarted_;
  pool_->Submit([this] { RunBatch(); });
}

bool Batcher::Collecting(const Running& running) const {
  for (const Collector* c : collectors_) {
    if (SameKey(*c->key, running)) return true;
  }
  return false;
}

int64_t Batcher::FairShare(int64_t held_rows) const {
  const int64_t idle_workers = pool_->num_threads() - running_batches_ -
                               static_cast<int64_t>(collectors_.size());
  if (idle_workers <= 1) return options_.max_batch_rows;
  int64_t queued_rows = held_rows;
  for (const Unit& unit : queue_) queued_rows += unit.end - unit.begin;
  const int64_t share = (queued_rows + idle_workers - 1) / idle_workers;
  return std::clamp<int64_t>(share, held_rows, options_.max_batch_rows);
}

int64_t Batcher::TakeMatching(const Running& key, int64_t rows, int64_t limit,
                              std::vector<Unit>* batch) {
  int64_t taken = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    const int64_t unit_rows = it->end - it->begin;
    if (rows + taken + unit_rows <= limit && SameKey(key, *it->running)) {
      taken += unit_rows;
      batch->push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

void Batcher::RunBatch() {
  std::vector<Unit> batch;
  {
    absl::MutexLock lock(&mu_);
    // Inline searches may hold every core for a moment: wait for one.
    auto core_free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || running_batches_ < pool_->num_threads();
    };
    mu_.Await(absl::Condition(&core_free));
    --unstarted_;
    // Units whose key a waiting worker collects are left to that worker.
    auto first =
        std::find_if(queue_.begin(), queue_.end(),
                     [this](const Unit& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                       return !Collecting(*u.running);
                     });
    if (first != queue_.end()) {
      batch.push_back(std::move(*first));
      queue_.erase(first);
      const Running& key = *batch.front().running;
      int64_t rows = batch.front().end - batch.front().begin;
      if (options_.coalesce) {
        rows += TakeMatching(key, rows, FairShare(rows), &batch);
        const absl::Time until =
            absl::Now() + absl::Microseconds(options_.max_queue_delay_us);
        const bool urgent =
            std::any_of(batch.begin(), batch.end(), [until](const Unit& u) {
              return u.running->job->deadline < until;
            });
        if (options_.max_queue_delay_us > 0 && rows < options_.max_batch_rows &&
            !urgent && running_batches_ > 0) {
          Collector collector{&key, rows};
          collectors_.push_back(&collector);
          auto full = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return stopping_ || collector.rows >= options_.max_batch_rows ||
                   running_batches_ == 0;
          };
          mu_.AwaitWithDeadline(absl::Condition(&full), until);
          collectors_.erase(
              std::find(collectors_.begin(), collectors_.end(), &collector));
          rows += TakeMatching(key, rows, options_.max_batch_rows, &batch);
        }
      }
      ++running_batches_;
      if (!queue_.empty() && unstarted_ == 0) SchedulePoolTask();
    }
  }
  if (!batch.empty()) {
    Search(batch);
    for (const Unit& unit : batch) Complete(unit);
  }
  absl::MutexLock lock(&mu_);
  if (!batch.empty()) --running_batches_;
  --tasks_;
}

void Batcher::Search(const std::vector<Unit>& batch) {
  const absl::Time start = absl::Now();
  std::vector<const Unit*> live;
  int64_t rows = 0;
  for (const Unit& unit : batch) {
    Running& running = *unit.running;
    const SearchJob& job = *running.job;
    if (!running.started.exchange(true)) running.first_start = start;
    if (running.failed.load(std::memory_order_relaxed)) continue;
    if (start > job.deadline) {
      running.Fail(absl::DeadlineExceededError(
          absl::StrCat("deadline passed after ",
                       absl::FormatDuration(start - running.submitted),
                       " in the queue, before the search ran")));
    } else if (job.is_cancelled && job.is_cancelled()) {
      running.Fail(absl::CancelledError("request cancelled by the client"));
    } else {
      live.push_back(&unit);
      rows += unit.end - unit.begin;
    }
  }
  if (live.empty()) return;

  const SearchJob& first = *live.front()->running->job;
  const int dim = first.snapshot->info().dim;
  const int width = ResultWidth(first.args);
  const bool candidates = width != first.args.k;
  // The first job's search, over this batch's rows.
  SearchArgs args = first.args;
  args.num_queries = rows;
  absl::Duration rerank_time;
  args.rerank_time = &rerank_time;
  // One unit searches in place; several are gathered into one contiguous
  // query matrix and their results scattered back.
  std::vector<float> queries;
  std::vector<float> distances;
  std::vector<float> approx;
  std::vector<int64_t> ids;
  if (live.size() == 1) {
    const int64_t begin = live.front()->begin;
    if (first.args.queries != nullptr) {
      args.queries = first.args.queries + begin * dim;
    }
    args.distances = first.args.distances + begin * width;
    args.ids = first.args.ids + begin * width;
    if (candidates) {
      args.approx_distances = first.args.approx_distances + begin * width;
    }
  } else {
    queries.resize(static_cast<size_t>(rows) * dim);
    distances.resize(static_cast<size_t>(rows) * width);
    ids.resize(static_cast<size_t>(rows) * width);
    if (candidates) approx.resize(static_cast<size_t>(rows) * width);
    float* out = queries.data();
    for (const Unit* unit : live) {
      const SearchJob& job = *unit->running->job;
      out = std::copy(job.args.queries + unit->begin * dim,
                      job.args.queries + unit->end * dim, out);
    }
    args.queries = queries.data();
    args.distances = distances.data();
    args.ids = ids.data();
    if (candidates) args.approx_distances = approx.data();
  }
  const absl::Time search_start = absl::Now();
  const PreparedFilter* filter =
      first.filter.has_value() ? &*first.filter : nullptr;
  absl::Status status;
  absl::Duration vector_time;
  absl::Duration text_time;
  if (first.hybrid.has_value()) {
    // Alone in its batch (SameKey): its rows' slice of the answer arrays.
    const int64_t begin = live.front()->begin;
    const HybridOutputs& all = first.hybrid_out;
    HybridOutputs out;
    const int64_t at = begin * width;
    if (all.vector_ranks != nullptr) {
      out.vector_ranks = all.vector_ranks + at;
      out.vector_scores = all.vector_scores + at;
    }
    out.text_ranks = all.text_ranks + at;
    out.text_scores = all.text_scores + at;
    out.vector_time = &vector_time;
    out.text_time = &text_time;
    status =
        SearchHybrid(*first.snapshot, args, filter, *first.hybrid, begin, out);
  } else {
    status = first.snapshot->Search(args, filter);
  }
  if (gate_ != nullptr && status.ok()) {
    gate_->RecordWork(rows * std::max(first.args.nprobe, 1),
                      absl::Now() - search_start);
  }
  if (metrics_ != nullptr) {
    metrics_->RecordBatchRows(rows);
    if (status.ok() && args.refine_factor > 0) {
      metrics_->RecordRerank(rerank_time);
    }
    if (status.ok() && first.hybrid.has_value()) {
      metrics_->RecordRetrievers(
          first.hybrid->fusion != Fusion::kNone ? &vector_time : nullptr,
          text_time);
    }
  }
  int64_t row = 0;
  for (const Unit* unit : live) {
    Running& running = *unit->running;
    if (!status.ok()) {
      running.Fail(status);
      continue;
    }
    if (live.size() > 1) {
      const SearchJob& job = *running.job;
      const int64_t n = (unit->end - unit->begin) * width;
      std::copy_n(distances.data() + row * width, n,
                  job.args.distances + unit->begin * width);
      std::copy_n(ids.data() + row * width, n,
                  job.args.ids + unit->begin * width);
      if (candidates) {
        std::copy_n(approx.data() + row * width, n,
                    job.args.approx_distances + unit->begin * width);
      }
    }
    row += unit->end - unit->begin;
  }
}

void Batcher::Complete(const Unit& unit) {
  Running& running = *unit.running;
  if (running.units_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;

  // Last unit: every other unit has finished writing.
  SearchJob& job = *running.job;
  JobTimes times;
  times.units = running.num_units;
  const absl::Time first_start = running.first_start;
  times.queue = first_start - running.submitted;
  times.search = absl::Now() - first_start;
  absl::Status status;
  {
    absl::MutexLock lock(&running.mu);
    status = running.error;
  }
  job.on_done(status, times);
  job.ticket.Release();
}

}  // namespace knnd

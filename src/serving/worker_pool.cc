#include "knnd/serving/worker_pool.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "knnd/base/range_check.h"
#include "knnd/faiss/faiss_runtime.h"
#include "spdlog/spdlog.h"

namespace knnd {

int AvailableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

absl::Status WorkerPool::ValidateOptions(const Options& options) {
  if (absl::Status s =
          CheckInRange("num_workers", options.num_threads, 0, 1024);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckInRange("omp_threads_per_worker",
                                    options.omp_threads_per_worker, 1, 256);
      !s.ok()) {
    return s;
  }
  return CheckInRange("worker_nice", options.nice_increment, 0, 19);
}

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Create(
    const Options& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  UseSingleThreadedBlas();
  const int n =
      options.num_threads > 0 ? options.num_threads : AvailableCores();
  std::unique_ptr<WorkerPool> pool(
      new WorkerPool(options.omp_threads_per_worker, options.nice_increment,
                     std::string(options.thread_name).substr(0, 15)));
  pool->threads_.reserve(n);
  for (int i = 0; i < n; ++i) {
    pool->threads_.emplace_back([p = pool.get()] { p->Run(); });
  }
  // Ready when every worker has its settings (nice, name, OpenMP threads):
  // work submitted from here on runs as configured.
  absl::MutexLock lock(&pool->mu_);
  pool->mu_.Await(absl::Condition(
      +[](WorkerPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
        return p->started_ == static_cast<int>(p->threads_.size());
      },
      pool.get()));
  return pool;
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Submit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

size_t WorkerPool::queued() const {
  absl::MutexLock lock(&mu_);
  return tasks_.size();
}

void WorkerPool::ApplyThreadSettings() const {
  SetOpenMpThreadsOfThisThread(omp_threads_);
}

void WorkerPool::Run() {
  // The OpenMP thread count is a per-thread setting: it applies to parallel
  // regions this worker starts inside FAISS.
  ApplyThreadSettings();
  pthread_setname_np(pthread_self(), thread_name_.c_str());
  if (nice_increment_ > 0) {
    // On Linux a nice value belongs to the thread (PRIO_PROCESS with a
    // thread id); raising it needs no privilege.
    const auto tid = static_cast<id_t>(syscall(SYS_gettid));
    errno = 0;
    const int current = getpriority(PRIO_PROCESS, tid);
    if (errno != 0 ||
        setpriority(PRIO_PROCESS, tid,
                    std::min(19, current + nice_increment_)) != 0) {
      spdlog::warn("cannot lower the priority of worker thread {}: {}", tid,
                   std::strerror(errno));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    ++started_;
  }
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !tasks_.empty();
      };
      idle_.fetch_add(1, std::memory_order_relaxed);
      mu_.Await(absl::Condition(&ready));
      idle_.fetch_sub(1, std::memory_order_relaxed);
      if (tasks_.empty()) return;  // stopping, and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace knnd

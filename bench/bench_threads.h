// RunOnThreads: the search threads of the in-process benches (peers_bench,
// frontier_bench, search_bench), each holding FAISS's OpenMP to one thread
// as knnd's workers do (WorkerPool, omp_threads_per_worker 1).
//
// OpenMP's thread count belongs to each thread: omp_set_num_threads() in
// main() does not reach a std::thread started later, which begins at the
// process's default (OMP_NUM_THREADS, else one per core). Run without
// OMP_NUM_THREADS=1, two bench threads whose FAISS calls could each open a
// team of two (and OpenBLAS, unless main() pins it, threads of its own) on
// a 2-core machine measured knnd's 256-row calls at 0.7x-0.8x of what they
// are (bench/RESULTS.md, "The benches' threads and OpenMP").
#ifndef KNND_BENCH_BENCH_THREADS_H_
#define KNND_BENCH_BENCH_THREADS_H_

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "knnd/faiss/faiss_runtime.h"

namespace knnd_bench {

// Runs fn(t) for t in [0, threads) on that many new threads at once (fn
// must be safe to call concurrently), each with one OpenMP thread, and
// joins them. Returns the most OpenMP threads any of them could open
// (omp_get_max_threads() as fn began): 1, which peers_bench prints beside
// its figures.
template <typename Fn>
int RunOnThreads(int threads, Fn fn) {
  std::atomic<int> most_omp_threads{0};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(std::max(threads, 0)));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&fn, &most_omp_threads, t] {
      knnd::SetOpenMpThreadsOfThisThread(1);
      const int omp = omp_get_max_threads();
      int seen = most_omp_threads.load();
      while (seen < omp && !most_omp_threads.compare_exchange_weak(seen, omp)) {
      }
      fn(t);
    });
  }
  for (std::thread& thread : pool) thread.join();
  return most_omp_threads.load();
}

}  // namespace knnd_bench

#endif  // KNND_BENCH_BENCH_THREADS_H_

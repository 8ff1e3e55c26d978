// peers_bench: knnd's IndexSnapshot in process, driven by
// bench/peers_run.py so that its rounds interleave with the peers' (FAISS,
// ScaNN, hnswlib in the same Python process tree) in one run.
//
//   build/bench/peers_bench --index INDEX --queries Q.npy
//
// Loads INDEX (with its INDEX.vectors, for re-ranking) and the queries, prints
// "ready KERNELS" (OpenBLAS's kernels, as knnd chooses them), then answers one
// command per line on stdin until it closes:
//   ROWS THREADS NPROBE REFINE REPS IDS_OUT
// runs every query REPS times in calls of ROWS queries (0: all of them in one
// call) THREADS times over, the calls shared by THREADS threads, k 10, and
// prints one JSON line:
// {"cpu_s": ..., "wall_s": ..., "queries": ..., "omp_threads": 1,
// "blas_threads": 1}: the process's CPU seconds and the wall seconds of
// those calls, the queries answered in all, and the OpenMP threads each
// thread's FAISS calls could open and OpenBLAS's threads per call (one
// each, as in knnd's workers, whatever OMP_NUM_THREADS says). The
// last pass's ids (k per query, row ids) are written to IDS_OUT
// as raw little-endian int64 unless it is "-".
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench_threads.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/vector_io.h"

ABSL_FLAG(std::string, index, "", "Index file (knnctl build's output).");
ABSL_FLAG(std::string, queries, "", "Query vectors (.npy, float32).");

namespace {

constexpr int kK = 10;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "peers_bench: %s\n", message.c_str());
  std::exit(1);
}

double ProcessCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

struct Command {
  int64_t rows = 0;
  int threads = 1;
  int nprobe = 1;
  int refine = 0;
  int reps = 1;
  std::string ids_out;
};

// Runs `command` and prints its JSON line. The THREADS threads take the
// calls (REPS passes over the queries, THREADS times over) from one shared
// counter, as a server's workers take units from one queue: a thread on a
// slower core (a shared host's) takes fewer calls instead of leaving the
// other core idle at the end while it finishes a fixed share.
void Run(const knnd::IndexSnapshot& snapshot, const knnd::Matrix& queries,
         const Command& command) {
  const int64_t nq = queries.rows;
  const int64_t rows = command.rows <= 0 ? nq : std::min(command.rows, nq);
  const int64_t calls_per_pass = (nq + rows - 1) / rows;
  const int64_t total_calls =
      calls_per_pass * command.reps * int64_t{command.threads};
  const int64_t last_pass = total_calls - calls_per_pass;
  // ids: the calls of the last pass, each written by the one thread that
  // took it.
  std::vector<int64_t> ids(static_cast<size_t>(nq) * kK, -1);
  std::atomic<int64_t> next_call{0};
  std::vector<std::string> errors(command.threads);
  const double cpu0 = ProcessCpuSeconds();
  const absl::Time wall0 = absl::Now();
  const int omp_threads = knnd_bench::RunOnThreads(command.threads, [&](int t) {
    std::vector<int64_t> scratch_ids(static_cast<size_t>(rows) * kK);
    std::vector<float> distances(static_cast<size_t>(rows) * kK);
    for (int64_t call = next_call.fetch_add(1); call < total_calls;
         call = next_call.fetch_add(1)) {
      const int64_t q = (call % calls_per_pass) * rows;
      knnd::SearchArgs args;
      args.queries = queries.row(q);
      args.num_queries = std::min(rows, nq - q);
      args.k = kK;
      args.nprobe = command.nprobe;
      args.refine_factor = command.refine;
      args.distances = distances.data();
      args.ids = call >= last_pass ? ids.data() + q * kK : scratch_ids.data();
      if (absl::Status s = snapshot.Search(args); !s.ok()) {
        errors[t] = std::string(s.message());
        return;
      }
    }
  });
  const double wall = absl::ToDoubleSeconds(absl::Now() - wall0);
  const double cpu = ProcessCpuSeconds() - cpu0;
  for (const std::string& e : errors) {
    if (!e.empty()) Die(e);
  }
  if (command.ids_out != "-") {
    FILE* f = std::fopen(command.ids_out.c_str(), "wb");
    if (f == nullptr ||
        std::fwrite(ids.data(), sizeof(int64_t), ids.size(), f) != ids.size() ||
        std::fclose(f) != 0) {
      Die(absl::StrCat("cannot write ", command.ids_out));
    }
  }
  std::printf(
      "{\"cpu_s\": %.6f, \"wall_s\": %.6f, \"queries\": %lld, "
      "\"omp_threads\": %d, \"blas_threads\": %d}\n",
      cpu, wall, static_cast<long long>(nq) * command.reps * command.threads,
      omp_threads, knnd::BlasThreads());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  knnd::UseBlasKernelsForThisCpu();  // as knnd and knnctl do, first thing
  knnd::UseSingleThreadedBlas();     // as knnd's workers: one thread a call
  absl::ParseCommandLine(argc, argv);
  knnd::LoadOptions load;
  load.probe_in_subprocess = false;
  load.verify_checksum = false;
  load.vectors = knnd::VectorsPolicy::kRequired;
  auto snapshot = knnd::IndexSnapshot::Load(absl::GetFlag(FLAGS_index), load);
  if (!snapshot.ok()) Die(std::string(snapshot.status().message()));
  auto queries = knnd::ReadVectors(absl::GetFlag(FLAGS_queries));
  if (!queries.ok()) Die(std::string(queries.status().message()));
  std::printf("ready %s\n", knnd::UseBlasKernelsForThisCpu().in_use.c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    Command c;
    if (!(in >> c.rows >> c.threads >> c.nprobe >> c.refine >> c.reps >>
          c.ids_out) ||
        c.threads < 1 || c.reps < 1) {
      Die(absl::StrCat("bad command '", line,
                       "': want ROWS THREADS NPROBE REFINE REPS IDS_OUT"));
    }
    Run(**snapshot, *queries, c);
  }
  return 0;
}

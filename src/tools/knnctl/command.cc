#include "command.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/vector_io.h"

namespace knnd::knnctl {

int Fail(absl::string_view message) {
  std::fprintf(stderr, "knnctl: %.*s\n", static_cast<int>(message.size()),
               message.data());
  return kExitError;
}

int Fail(const absl::Status& status) { return Fail(status.message()); }

void AddQueryFlags(FlagSet& flags, QueryOptions& options) {
  flags.Add("queries", &options.queries, "FILE",
            "Query vectors: .npy, .fvecs, .bvecs or IDX (.gz allowed).");
  flags.Add("limit", &options.limit, "N",
            "Use at most N rows of --queries; 0 = all.");
  flags.Add("k", &options.k, "N", "Neighbours per query.");
}

void AddThreadsFlag(FlagSet& flags, int* threads) {
  flags.Add("threads", threads, "N",
            "OpenMP threads FAISS may use; 0 = all cores (or "
            "OMP_NUM_THREADS). OpenBLAS is pinned to one thread, as in "
            "knnd.");
}

void UseThreads(int threads) {
  if (threads > 0) SetOpenMpThreadsOfThisThread(threads);
}

absl::StatusOr<std::vector<int64_t>> ReadRowIds(const std::string& path,
                                                int64_t rows) {
  absl::StatusOr<IdMatrix> ids = ReadIds(path);
  if (!ids.ok()) return ids.status();
  if (ids->cols != 1 || ids->rows != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": holds ", ids->rows, " x ", ids->cols,
                     " ids; expected ", rows, " (one per input row)"));
  }
  if (absl::Status s = SortedIdRows(ids->values, path).status(); !s.ok()) {
    return s;
  }
  return std::move(ids->values);
}

// --nprobes, or the powers of two below nlist and nlist itself.
absl::StatusOr<std::vector<int>> NprobeList(const std::string& list,
                                            int64_t nlist) {
  std::vector<int> nprobes;
  if (list.empty()) {
    for (int64_t p = 1; p < nlist; p *= 2)
      nprobes.push_back(static_cast<int>(p));
    nprobes.push_back(static_cast<int>(nlist));
    return nprobes;
  }
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int p;
    if (!absl::SimpleAtoi(part, &p) || p < 1 || p > nlist) {
      return absl::InvalidArgumentError(
          absl::StrCat("--nprobes: '", part,
                       "' is not an nprobe in [1, nlist=", nlist, "]"));
    }
    nprobes.push_back(p);
  }
  return nprobes;
}

// --refine_factors, or 0,1,2,4,8,16 with vectors and 0 without.
absl::StatusOr<std::vector<int>> RefineFactorList(const std::string& list,
                                                  bool has_vectors) {
  if (list.empty()) {
    if (!has_vectors) return std::vector<int>{0};
    return std::vector<int>{0, 1, 2, 4, 8, 16};
  }
  std::vector<int> factors;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int f;
    if (!absl::SimpleAtoi(part, &f) || f < 0 || f > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("--refine_factors: '", part,
                       "' is not a refine_factor in [0, 1024]"));
    }
    if (f > 0 && !has_vectors) {
      return absl::FailedPreconditionError(
          "--refine_factors > 0 needs INDEX.vectors (knnctl build "
          "--keep_vectors)");
    }
    factors.push_back(f);
  }
  return factors;
}

}  // namespace knnd::knnctl

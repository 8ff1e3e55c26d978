#include "knnd/faiss/faiss_runtime.h"

#include <omp.h>

#include <algorithm>

#include <faiss/Index.h>
#include <faiss/utils/distances.h>
#include <faiss/utils/utils.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace knnd {

void UseSingleThreadedBlas() { openblas_set_num_threads(1); }

void SetOpenMpThreadsOfThisThread(int n) { omp_set_num_threads(std::max(1, n)); }

int SetCoarseBlockRowsUnder(int64_t mmap_threshold_bytes) {
  if (mmap_threshold_bytes > 0) {
    // Half the threshold: room for the allocator's header and rounding.
    const int64_t block = mmap_threshold_bytes / 2;
    const int64_t rows =
        block / (int64_t{faiss::distance_compute_blas_database_bs} * 4);
    faiss::distance_compute_blas_query_bs =
        static_cast<int>(std::clamp<int64_t>(rows, 20, 4096));
  }
  return faiss::distance_compute_blas_query_bs;
}

std::string FaissVersion() {
  return absl::StrCat(FAISS_VERSION_MAJOR, ".", FAISS_VERSION_MINOR, ".",
                      FAISS_VERSION_PATCH);
}

std::string FaissCompileOptions() {
  return std::string(absl::StripAsciiWhitespace(faiss::get_compile_options()));
}

}  // namespace knnd

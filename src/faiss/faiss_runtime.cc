#include "knnd/faiss/faiss_runtime.h"

#include <dlfcn.h>
#include <omp.h>
#include <strings.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include <faiss/Index.h>
#include <faiss/utils/distances.h>
#include <faiss/utils/utils.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

extern "C" void openblas_set_num_threads(int num_threads);
extern "C" int openblas_get_num_threads();
extern "C" char* openblas_get_corename();

namespace knnd {

void UseSingleThreadedBlas() { openblas_set_num_threads(1); }

int BlasThreads() { return openblas_get_num_threads(); }

namespace {

// OpenBLAS's names (openblas_get_corename) of the x86-64 cores whose
// kernels use AVX2.
bool HasAvx2Kernels(const std::string& core) {
  static constexpr const char* kAvx2Cores[] = {"haswell",    "zen",
                                               "excavator",  "skylakex",
                                               "cooperlake", "sapphirerapids"};
  return std::any_of(
      std::begin(kAvx2Cores), std::end(kAvx2Cores),
      [&](const char* name) { return strcasecmp(core.c_str(), name) == 0; });
}

// The kernels for this CPU's widest vectors; empty without AVX2 and FMA.
std::string WidestCoreOfThisCpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return "Haswell";
  }
  return "";
}

BlasKernels ChooseBlasKernels() {
  BlasKernels kernels;
  kernels.chosen_at_load = BlasKernelsInUse();
  kernels.in_use = kernels.chosen_at_load;
  const std::string widest = WidestCoreOfThisCpu();
  const std::string target = BlasKernelsToSwitchTo(
      kernels.chosen_at_load, std::getenv("OPENBLAS_CORETYPE"), widest);
  if (target.empty()) return kernels;
  // A DYNAMIC_ARCH build's own entry points: quit forgets the kernel table,
  // init picks one again, from OPENBLAS_CORETYPE when it is set.
  auto* quit = reinterpret_cast<void (*)()>(
      dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto* init = reinterpret_cast<void (*)()>(
      dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr) {
    kernels.note = absl::StrCat(
        "OpenBLAS runs its ", kernels.chosen_at_load, " kernels on a CPU with ",
        widest == "SkylakeX" ? "AVX-512" : "AVX2",
        ", and it is not a DYNAMIC_ARCH build whose kernels can be switched");
    return kernels;
  }
  setenv("OPENBLAS_CORETYPE", target.c_str(), /*overwrite=*/0);
  quit();
  init();
  kernels.in_use = BlasKernelsInUse();
  kernels.note = absl::StrCat(
      "OpenBLAS took this CPU for ", kernels.chosen_at_load, "; using its ",
      kernels.in_use, " kernels (", widest == "SkylakeX" ? "AVX-512" : "AVX2",
      "). OPENBLAS_CORETYPE overrides");
  return kernels;
}

}  // namespace

std::string BlasKernelsToSwitchTo(const std::string& chosen_at_load,
                                  const char* coretype_env,
                                  const std::string& widest) {
  // OPENBLAS_CORETYPE: the user's choice, or the parent process's switch.
  if (coretype_env != nullptr || widest.empty() ||
      HasAvx2Kernels(chosen_at_load)) {
    return "";
  }
  return widest;
}

std::string BlasKernelsInUse() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

const BlasKernels& UseBlasKernelsForThisCpu() {
  static const BlasKernels* kernels = new BlasKernels(ChooseBlasKernels());
  return *kernels;
}

void SetOpenMpThreadsOfThisThread(int n) {
  omp_set_num_threads(std::max(1, n));
}

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

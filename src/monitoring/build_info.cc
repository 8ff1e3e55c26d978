#include "knnd/monitoring/build_info.h"

#include "absl/strings/str_cat.h"
#include "knnd/build_version.h"  // generated: KNND_VERSION, KNND_GIT_COMMIT
#include "knnd/faiss/faiss_runtime.h"

namespace knnd {

const BuildInfo& GetBuildInfo() {
  static const BuildInfo* info = [] {
    auto* b = new BuildInfo;
    b->version = KNND_VERSION;
    b->git_commit = KNND_GIT_COMMIT;
    b->faiss_version = FaissVersion();
    b->faiss_compile_options = FaissCompileOptions();
    b->blas_kernels = BlasKernelsInUse();
    return b;
  }();
  return *info;
}

std::string BuildInfoLine() {
  const BuildInfo& b = GetBuildInfo();
  return absl::StrCat("knnd ", b.version, " (git ", b.git_commit, ") faiss ",
                      b.faiss_version, " [", b.faiss_compile_options, "]");
}

}  // namespace knnd

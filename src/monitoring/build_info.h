// What this binary is: knnd's version and git commit, and the FAISS library
// it is linked with (version and compile options, e.g. "OPTIMIZE GENERIC" for
// Debian's portable build or "AVX2" for the SIMD one).
#ifndef KNND_MONITORING_BUILD_INFO_H_
#define KNND_MONITORING_BUILD_INFO_H_

#include <string>

namespace knnd {

struct BuildInfo {
  std::string version;          // knnd's own, e.g. "0.1.0"
  std::string git_commit;       // short hash, or "unknown" outside git
  std::string faiss_version;    // e.g. "1.7.3"
  std::string faiss_compile_options;  // FAISS's get_compile_options()
  // OpenBLAS's kernels when the info was first asked for, e.g. "SkylakeX"
  // (knnd and knnctl choose them first thing: UseBlasKernelsForThisCpu).
  std::string blas_kernels;
};

const BuildInfo& GetBuildInfo();

// One line for --version and logs.
std::string BuildInfoLine();

}  // namespace knnd

#endif  // KNND_MONITORING_BUILD_INFO_H_

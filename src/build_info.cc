#include "knnd/build_info.h"

#include <faiss/Index.h>
#include <faiss/utils/utils.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "knnd/build_version.h"  // generated: KNND_VERSION, KNND_GIT_COMMIT


namespace knnd {

const BuildInfo& GetBuildInfo() {
  static const BuildInfo* info = [] {
    auto* b = new BuildInfo;
    b->version = KNND_VERSION;
    b->git_commit = KNND_GIT_COMMIT;
    b->faiss_version = absl::StrCat(FAISS_VERSION_MAJOR, ".",
                                    FAISS_VERSION_MINOR, ".",
                                    FAISS_VERSION_PATCH);
    b->faiss_compile_options = std::string(
        absl::StripAsciiWhitespace(faiss::get_compile_options()));
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

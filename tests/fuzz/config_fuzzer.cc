// Fuzzes the daemon's text inputs other than requests: the first byte picks
// the text-format config parser (+ validation) or the index metadata sidecar
// reader (JSON from a file); the rest is the text. Either must return a
// status, never crash.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "knnd/config/config.h"
#include "knnd/storage/index_metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    absl::StatusOr<knnd::v1::ServerConfig> config =
        knnd::ParseConfig(text, "fuzz.textproto");
    if (config.ok()) knnd::ValidateConfig(*config).IgnoreError();
  } else {
    static const std::string path =
        knnd::fuzz::ScratchDir() + "/input.index.meta.json";
    knnd::fuzz::WriteFileOrDie(path, data + 1, size - 1);
    knnd::ReadIndexMetadata(path).status().IgnoreError();
  }
  return 0;
}

// Fuzzes the daemon's text inputs other than requests: the first byte picks
// the text-format config parser (+ validation), the index metadata sidecar
// reader (JSON from a file) or the JSON parser of knnctl build's JSON Lines
// inputs (json_value.h); the rest is the text. Each must return a status,
// never crash; a JSON value it accepts must read back equal from what it
// writes.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_util.h"
#include "knnd/config/config.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/json_value.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 3 == 0) {
    absl::StatusOr<knnd::v1::ServerConfig> config =
        knnd::ParseConfig(text, "fuzz.textproto");
    if (config.ok()) knnd::ValidateConfig(*config).IgnoreError();
  } else if (data[0] % 3 == 2) {
    absl::StatusOr<knnd::JsonValue> value = knnd::ParseJson(text);
    if (value.ok()) {
      absl::StatusOr<knnd::JsonValue> back =
          knnd::ParseJson(value->ToString());
      if (!back.ok() || *back != *value) std::abort();
    }
  } else {
    static const std::string path =
        knnd::fuzz::ScratchDir() + "/input.index.meta.json";
    knnd::fuzz::WriteFileOrDie(path, data + 1, size - 1);
    knnd::ReadIndexMetadata(path).status().IgnoreError();
  }
  return 0;
}

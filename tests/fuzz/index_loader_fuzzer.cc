// Fuzzes the index loader: the input is written to a file and loaded with
// IndexSnapshot::Load exactly as the daemon does (subprocess probe on,
// structure and list-bounds checks), then searched once when it loads. A
// crash of the probe process (this fuzzer's own binary, see
// LLVMFuzzerInitialize) is an expected rejection; a crash or sanitizer
// report in this process is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "knnd/index/index_probe.h"
#include "knnd/index/index_snapshot.h"

// libFuzzer calls this before it parses its flags or installs its crash
// handlers: the probe process answers here and exits.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  knnd::RunIndexProbeIfAsked(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = knnd::fuzz::ScratchDir() + "/input.index";
  knnd::fuzz::WriteFileOrDie(path, data, size);
  knnd::LoadOptions options;  // the daemon's defaults: probe in a subprocess
  absl::StatusOr<std::unique_ptr<knnd::IndexSnapshot>> snapshot =
      knnd::IndexSnapshot::Load(path, options);
  if (!snapshot.ok()) return 0;
  const knnd::IndexInfo& info = (*snapshot)->info();
  if (info.dim <= 0 || info.dim > (1 << 16) || info.nlist <= 0) std::abort();
  std::vector<float> query(static_cast<size_t>(info.dim), 0.5f);
  float distance[2];
  int64_t ids[2];
  knnd::SearchArgs args;
  args.queries = query.data();
  args.num_queries = 1;
  args.k = 2;
  args.nprobe = static_cast<int>(std::min<int64_t>(info.nlist, 4));
  args.distances = distance;
  args.ids = ids;
  // The ids are the file's own data (any int64 a corrupt file holds comes
  // back as it is); what matters is that the search returns.
  (*snapshot)->Search(args).IgnoreError();
  return 0;
}

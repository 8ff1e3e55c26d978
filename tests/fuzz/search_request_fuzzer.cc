// Fuzzes the Search request path as the server runs it: raw bytes read as
// a knnd.v1.SearchRequest as the server reads them (search_request_codec.h:
// a filter nested too deep is walked without recursion), validated by
// ParseSearchRequest against a tiny IVF-PQ index (built once at start-up),
// then searched when valid. Any crash, sanitizer report or out-of-range
// result id is a finding.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "knnd/index/index_probe.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/rpc/search_request_codec.h"
#include "knnd/serving/search_request.h"
#include "knnd/v1/knn_service.pb.h"
#include "testing/test_util.h"

namespace {

struct Target {
  std::unique_ptr<knnd::IndexSnapshot> snapshot;
  knnd::SearchLimits limits;
};

const Target* target = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  knnd::RunIndexProbeIfAsked(*argc, *argv);
  knnd::testing::IndexSpec spec;
  spec.n = 2000;
  spec.d = 8;
  spec.factory = "IVF16,PQ4";
  spec.nprobe = 2;
  const std::string path = knnd::fuzz::ScratchDir() + "/tiny.index";
  knnd::testing::WriteIndex(path, spec);
  auto* t = new Target;
  absl::StatusOr<std::unique_ptr<knnd::IndexSnapshot>> snapshot =
      knnd::IndexSnapshot::Load(path, knnd::LoadOptions());
  if (!snapshot.ok()) std::abort();
  t->snapshot = std::move(*snapshot);
  // The server's resolution of its limits, with small maxima so that one
  // input stays cheap (the defaults allow 4096 queries of k=1024).
  knnd::LimitsConfig config;
  config.max_k = 64;
  config.max_queries_per_request = 32;
  config.max_filter_ids = 256;
  t->limits = knnd::ResolveLimits(config, t->snapshot->info());
  target = t;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  knnd::v1::SearchRequest request;
  if (!knnd::ReadSearchRequest(
          std::string(reinterpret_cast<const char*>(data), size), &request)) {
    return 0;
  }
  // A request read without a filter nested too deep is refused.
  if (!knnd::CheckFilterParsed(request, 16).ok()) {
    if (request.has_filter()) std::abort();
    return 0;
  }
  const knnd::IndexInfo& info = target->snapshot->info();
  absl::StatusOr<knnd::ParsedSearch> parsed =
      knnd::ParseSearchRequest(request, info, target->limits);
  if (!parsed.ok()) return 0;
  const size_t results = static_cast<size_t>(parsed->num_queries * parsed->k);
  std::vector<float> distances(results);
  std::vector<int64_t> ids(results);
  knnd::SearchArgs args;
  args.queries = parsed->queries;
  args.num_queries = parsed->num_queries;
  args.k = parsed->k;
  args.nprobe = parsed->nprobe;
  args.allowed_ids = parsed->allowed_ids;
  args.distances = distances.data();
  args.ids = ids.data();
  if (!target->snapshot->Search(args).ok()) std::abort();
  for (int64_t id : ids) {
    if (id < -1 || id >= info.ntotal) std::abort();
  }
  return 0;
}

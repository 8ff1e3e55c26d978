// Fuzzes what a front of shards does with values from the network: the
// shards' GetIndexInfo answers judged by CheckShardSet (the poller's
// readiness), and their Search answers checked by CheckShardAnswers and
// merged by MergeShardAnswers. Every field, shard ids and distances
// included, comes from the input. Findings: a crash or sanitizer report,
// a set judged ready whose shard ids are not exactly 0..n-1, or a merged
// answer of the wrong size or with an id no shard sent for that query.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "knnd/rpc/result_fields.h"
#include "knnd/rpc/shard_merge.h"
#include "knnd/rpc/shard_set.h"
#include "knnd/v1/knn_service.pb.h"
#include "testing/test_util.h"

namespace {

using knnd::v1::GetIndexInfoResponse;
using knnd::v1::SearchResponse;

// Any 32-bit pattern as a float: NaNs and infinities included.
float AnyFloat(FuzzedDataProvider& in) {
  const uint32_t bits = in.ConsumeIntegral<uint32_t>();
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Small values most of the time, so that sets and answers often agree
// enough to reach the merge; any value otherwise.
uint32_t SmallOrAny(FuzzedDataProvider& in, uint32_t small) {
  return in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, small)
                          : in.ConsumeIntegral<uint32_t>();
}

void CheckSet(FuzzedDataProvider& in, size_t n) {
  std::vector<GetIndexInfoResponse> infos(n);
  std::vector<absl::Status> polls(n);
  std::vector<knnd::PolledShard> shards;
  for (size_t i = 0; i < n; ++i) {
    GetIndexInfoResponse& info = infos[i];
    if (!in.ConsumeBool()) polls[i] = absl::UnavailableError("down");
    info.set_dim(in.ConsumeIntegralInRange<uint32_t>(1, 3));
    info.set_version(in.ConsumeIntegralInRange<int64_t>(-1, 3));
    if (in.ConsumeBool()) info.add_retained_versions(in.ConsumeIntegral<int64_t>());
    info.mutable_shard()->set_shard_id(SmallOrAny(in, 8));
    info.mutable_shard()->set_shard_count(SmallOrAny(in, 8));
    info.mutable_shard()->set_build_id(in.ConsumeBool() ? "a" : "b");
    shards.push_back({"t" + std::to_string(i), &polls[i], &infos[i]});
  }
  if (!knnd::CheckShardSet(shards).ok()) return;
  std::set<uint32_t> ids;
  for (const GetIndexInfoResponse& info : infos) {
    if (info.shard().shard_id() >= n) std::abort();
    ids.insert(info.shard().shard_id());
  }
  if (ids.size() != n) std::abort();
}

void MergeAnswers(FuzzedDataProvider& in, size_t n) {
  const int k = in.ConsumeIntegralInRange<int>(1, 6);
  const uint32_t num_queries = in.ConsumeIntegralInRange<uint32_t>(0, 3);
  const uint32_t refine = in.ConsumeIntegralInRange<uint32_t>(0, 2);
  std::vector<SearchResponse> responses(in.ConsumeIntegralInRange<size_t>(1, n));
  std::vector<knnd::ShardAnswer> answers;
  for (size_t i = 0; i < responses.size(); ++i) {
    SearchResponse& r = responses[i];
    r.mutable_shard()->set_shard_id(SmallOrAny(in, 8));
    r.mutable_shard()->set_shard_count(in.ConsumeBool() ? n : SmallOrAny(in, 8));
    r.set_metric(in.ConsumeBool() ? knnd::v1::METRIC_L2
                                  : knnd::v1::METRIC_INNER_PRODUCT);
    r.set_num_queries(in.ConsumeBool() ? num_queries : SmallOrAny(in, 3));
    r.set_refine_factor(refine);
    const int width = refine > 0 ? static_cast<int>(refine) * k : k;
    r.set_k(in.ConsumeBool() ? width : SmallOrAny(in, 12));
    // As many as the answer's shape says (at most 64: the shape may be
    // any value), or any count up to 40.
    const int64_t entries =
        in.ConsumeBool()
            ? std::min<int64_t>(int64_t{r.num_queries()} * width, 64)
            : in.ConsumeIntegralInRange<int64_t>(0, 40);
    for (int64_t j = 0; j < entries; ++j) {
      r.add_ids(in.ConsumeIntegralInRange<int64_t>(-2, 30));
      r.add_distances(AnyFloat(in));
      if (refine > 0) r.add_approx_distances(AnyFloat(in));
    }
    if (in.ConsumeBool()) knnd::testing::MoveResultsToBytes(r);
    answers.push_back({&r, "t" + std::to_string(i)});
  }
  if (!knnd::CheckShardAnswers(answers, static_cast<int>(n), k).ok()) return;
  SearchResponse merged;
  if (!knnd::MergeShardAnswers(answers, k, in.ConsumeBool(),
                               /*max_answer_bytes=*/0, &merged)
           .ok()) {
    std::abort();  // without a limit the merge always succeeds
  }
  const int64_t q_count = responses.front().num_queries();
  const knnd::ResultColumns out = knnd::ReadResults(merged);
  if (out.ids.size() != q_count * k || out.distances.size() != q_count * k) {
    std::abort();
  }
  for (int64_t q = 0; q < q_count; ++q) {
    for (int j = 0; j < k; ++j) {
      const int64_t id = out.ids[q * k + j];
      if (id == -1) continue;
      bool sent = false;
      for (const SearchResponse& r : responses) {
        const knnd::ResultColumns sent_ids = knnd::ReadResults(r);
        for (int32_t c = 0; c < r.k(); ++c) {
          sent |= sent_ids.ids[q * r.k() + c] == id;
        }
      }
      if (!sent) std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const size_t n = in.ConsumeIntegralInRange<size_t>(1, 6);
  CheckSet(in, n);
  MergeAnswers(in, n);
  return 0;
}

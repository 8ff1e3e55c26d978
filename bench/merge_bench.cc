// merge_bench: what the front of a sharded index (docs/sharding.md) spends
// merging, per request: knnd::CheckShardAnswers + knnd::MergeShardAnswers
// (src/rpc/shard_merge.h) over synthetic shard answers, timed in a plain
// loop, no gRPC.
//
//   build/bench/merge_bench [--shards 2,4,8] [--queries 1,100] [--k 10]
//                           [--refine 0,3] [--batches 101] [--batch_ms 2]
//
// Each shard answer is what a shard sends the front: num_queries rows of
// k entries without re-ranking, or of refine * k candidates (best PQ
// estimate first, estimates in approx_distances, exact distances in
// distances; return_candidates) with it, plus its ShardInfo. Every
// iteration checks the answers and merges them into a fresh SearchResponse,
// as the front does for each call. A case is timed in --batches batches of
// enough iterations to last about --batch_ms each; the table gives the
// median batch's microseconds per request (and the 10th and 90th
// percentile batches'), so one descheduled batch on a shared machine does
// not move it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "knnd/monitoring/build_info.h"
#include "knnd/rpc/shard_merge.h"
#include "knnd/v1/knn_service.pb.h"

ABSL_FLAG(std::string, shards, "2,4,8", "Shard counts.");
ABSL_FLAG(std::string, queries, "1,100", "Queries per request.");
ABSL_FLAG(int, k, 10, "Neighbours per query.");
ABSL_FLAG(std::string, refine, "0,3", "refine_factor values (0: none).");
ABSL_FLAG(int, batches, 101, "Timed batches per case (the median is shown).");
ABSL_FLAG(double, batch_ms, 2.0, "Approximate duration of one batch.");

namespace {

using knnd::v1::SearchResponse;
using Clock = std::chrono::steady_clock;

std::vector<int> Ints(const std::string& list) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

// Shard `s` of `shards`: ids [s * 1,000,000, ...); per query `width`
// entries, best first by the distance the shard sorts on (the PQ estimate
// with re-ranking candidates, else the distance it returns).
SearchResponse ShardAnswer(int s, int shards, int nq, int k, int refine,
                           std::mt19937* rng) {
  SearchResponse r;
  const int width = refine > 0 ? refine * k : k;
  r.set_num_queries(nq);
  r.set_k(width);
  r.set_index_version(7);
  r.set_serving_version(7);
  r.set_metric(knnd::v1::METRIC_L2);
  r.set_nprobe(8);
  r.set_refine_factor(refine);
  auto* info = r.mutable_shard();
  info->set_shard_id(s);
  info->set_shard_count(shards);
  info->set_build_id("merge-bench");
  info->set_first_id(int64_t{s} * 1000000);
  info->set_end_id(int64_t{s + 1} * 1000000);
  std::uniform_real_distribution<float> dist(0.f, 100.f);
  std::uniform_real_distribution<float> noise(-5.f, 5.f);
  std::vector<float> sorted(width);
  for (int q = 0; q < nq; ++q) {
    for (float& d : sorted) d = dist(*rng);
    std::sort(sorted.begin(), sorted.end());
    for (int j = 0; j < width; ++j) {
      r.add_ids(int64_t{s} * 1000000 + q * width + j);
      if (refine > 0) {
        r.add_approx_distances(sorted[j]);
        r.add_distances(std::max(0.f, sorted[j] + noise(*rng)));
      } else {
        r.add_distances(sorted[j]);
      }
    }
  }
  return r;
}

struct Timing {
  double p10_us, median_us, p90_us;
  int64_t iterations;
};

Timing TimeCase(const std::vector<knnd::ShardAnswer>& answers, int shards,
                int k) {
  auto once = [&]() {
    if (!knnd::CheckShardAnswers(answers, shards, k).ok()) {
      std::fprintf(stderr, "merge_bench: CheckShardAnswers refused the set\n");
      std::exit(1);
    }
    SearchResponse merged;
    if (!knnd::MergeShardAnswers(answers, k, /*as_bytes=*/false,
                                 /*max_answer_bytes=*/0, &merged)
             .ok()) {
      std::fprintf(stderr, "merge_bench: MergeShardAnswers refused the set\n");
      std::exit(1);
    }
    if (merged.ids_size() != static_cast<int>(merged.num_queries()) * k) {
      std::fprintf(stderr, "merge_bench: wrong merged size\n");
      std::exit(1);
    }
  };
  // Calibrate: iterations per batch of about --batch_ms.
  for (int i = 0; i < 20; ++i) once();  // warm-up
  int64_t per_batch = 1;
  const double batch_s = absl::GetFlag(FLAGS_batch_ms) / 1000;
  while (true) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < per_batch; ++i) once();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s >= batch_s || per_batch >= (int64_t{1} << 24)) break;
    per_batch *= 2;
  }
  std::vector<double> us;
  for (int b = 0; b < absl::GetFlag(FLAGS_batches); ++b) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < per_batch; ++i) once();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0)
                     .count() /
                 per_batch);
  }
  std::sort(us.begin(), us.end());
  auto at = [&](double p) { return us[static_cast<size_t>(p * (us.size() - 1))]; };
  return {at(0.1), at(0.5), at(0.9), per_batch * absl::GetFlag(FLAGS_batches)};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int k = absl::GetFlag(FLAGS_k);
  std::printf("# merge_bench  %s\n", knnd::BuildInfoLine().c_str());
  std::printf("# CheckShardAnswers + MergeShardAnswers into a fresh "
              "SearchResponse per request, L2, k %d; median of %d batches of "
              "~%.1f ms\n\n",
              k, absl::GetFlag(FLAGS_batches), absl::GetFlag(FLAGS_batch_ms));
  std::printf("| shards | queries/request | refine_factor | entries merged/request "
              "| us/request (median) | p10 | p90 | us/query |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(1);
  for (int refine : Ints(absl::GetFlag(FLAGS_refine))) {
    for (int nq : Ints(absl::GetFlag(FLAGS_queries))) {
      for (int shards : Ints(absl::GetFlag(FLAGS_shards))) {
        std::vector<SearchResponse> responses;
        for (int s = 0; s < shards; ++s) {
          responses.push_back(ShardAnswer(s, shards, nq, k, refine, &rng));
        }
        std::vector<knnd::ShardAnswer> answers;
        for (int s = 0; s < shards; ++s) {
          answers.push_back({&responses[s], "shard-" + std::to_string(s)});
        }
        const Timing t = TimeCase(answers, shards, k);
        const int64_t entries =
            int64_t{shards} * nq * (refine > 0 ? refine * k : k);
        std::printf("| %d | %d | %d | %lld | %.2f | %.2f | %.2f | %.3f |\n",
                    shards, nq, refine, static_cast<long long>(entries),
                    t.median_us, t.p10_us, t.p90_us, t.median_us / nq);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

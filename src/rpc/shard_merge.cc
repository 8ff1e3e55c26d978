#include "knnd/rpc/shard_merge.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "knnd/base/saturating.h"
#include "knnd/index/shard_merge_order.h"
#include "knnd/rpc/result_fields.h"
#include "knnd/rpc/search_payloads.h"

namespace knnd {
namespace {

using knnd::v1::SearchResponse;

// "shard 1 (10.0.0.2:50051)".
std::string Name(const ShardAnswer& a) {
  return absl::StrCat("shard ", a.response->shard().shard_id(), " (",
                      a.target, ")");
}

// The targets and values of a field that differs between answers, and
// `fix` (empty or a sentence) after them.
template <typename Get>
absl::Status Disagree(const std::vector<ShardAnswer>& answers,
                      const char* field, Get get, absl::string_view fix = "") {
  std::vector<std::string> parts;
  for (const ShardAnswer& a : answers) {
    parts.push_back(absl::StrCat(Name(a), ": ", get(*a.response)));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the shards' answers disagree on ", field, ", so they cannot be merged: ",
      absl::StrJoin(parts, "; "), fix.empty() ? "" : ". ", fix));
}

// Shards answer one request with different nprobe or refine_factor only
// when it left them unset and each took its own default.
constexpr absl::string_view kDefaultsFix =
    "A request that leaves nprobe or refine_factor unset gets each shard's "
    "default (its config's default_nprobe / default_refine_factor, else its "
    "sidecar's tuned ones): tune the set as one (knnctl tune --index OUT "
    "--shards N records one decision in every shard's sidecar), or give "
    "every shard the same defaults in its config, or set both in the "
    "request";

// One candidate of one query: (PQ estimate, exact distance, id); without
// re-ranking both distances are the answer's.
struct Entry {
  float approx;
  float exact;
  int64_t id;
  const std::string* payload;  // null without payloads
};

// Rule 4's part every merge checks: every answer is a shard of one set of
// `shard_count`, each once, of one version, metric, num_queries, nprobe and
// refine_factor.
absl::Status CheckOneSet(const std::vector<ShardAnswer>& answers,
                         int shard_count) {
  if (answers.empty()) {
    return absl::FailedPreconditionError("no shard answered");
  }
  for (const ShardAnswer& a : answers) {
    if (!a.response->has_shard() || a.response->shard().shard_count() == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "target ", a.target,
          " serves a whole index, not a shard (its sidecar has no "
          "shard_count); give knnd --shard_targets the shards of one split "
          "(knnctl build --shards, knnctl shard)"));
    }
  }
  const SearchResponse& first = *answers.front().response;
  auto differ = [&](auto get) {
    return std::any_of(answers.begin(), answers.end(),
                       [&](const ShardAnswer& a) {
                         return get(*a.response) != get(first);
                       });
  };
  auto build = [](const SearchResponse& r) { return r.shard().build_id(); };
  if (differ(build)) return Disagree(answers, "build_id", build);
  auto count = [](const SearchResponse& r) { return r.shard().shard_count(); };
  if (differ(count) || first.shard().shard_count() !=
                           static_cast<uint32_t>(shard_count)) {
    return Disagree(answers,
                    absl::StrCat("shard_count (", shard_count,
                                 " targets are configured)")
                        .c_str(),
                    count);
  }
  std::vector<bool> seen(static_cast<size_t>(shard_count), false);
  for (const ShardAnswer& a : answers) {
    const uint32_t id = a.response->shard().shard_id();
    if (id >= static_cast<uint32_t>(shard_count) || seen[id]) {
      return Disagree(answers, "shard_id (each shard must appear once)",
                      [](const SearchResponse& r) {
                        return r.shard().shard_id();
                      });
    }
    seen[id] = true;
  }
  auto version = [](const SearchResponse& r) { return r.index_version(); };
  if (differ(version)) return Disagree(answers, "index_version", version);
  auto metric = [](const SearchResponse& r) {
    return knnd::v1::Metric_Name(r.metric());
  };
  if (differ(metric)) return Disagree(answers, "metric", metric);
  auto queries = [](const SearchResponse& r) { return r.num_queries(); };
  if (differ(queries)) return Disagree(answers, "num_queries", queries);
  auto nprobe = [](const SearchResponse& r) { return r.nprobe(); };
  if (differ(nprobe)) {
    return Disagree(answers, "nprobe", nprobe, kDefaultsFix);
  }
  auto refine_of = [](const SearchResponse& r) { return r.refine_factor(); };
  if (differ(refine_of)) {
    return Disagree(answers, "refine_factor", refine_of, kDefaultsFix);
  }
  return absl::OkStatus();
}

// Each kept result's payload (null for a pad) into merged->payloads, once
// the answer with them is known to fit in `max_answer_bytes` (0: no
// limit); RESOURCE_EXHAUSTED naming both sizes otherwise.
absl::Status AttachPayloads(const std::vector<const std::string*>& kept,
                            int64_t max_answer_bytes, SearchResponse* merged) {
  int64_t payload_bytes = 0;
  int64_t answer_bytes = static_cast<int64_t>(merged->ByteSizeLong());
  for (const std::string* payload : kept) {
    const int64_t size =
        payload == nullptr ? 0 : static_cast<int64_t>(payload->size());
    payload_bytes += size;
    answer_bytes += PayloadFieldBytes(size);
  }
  if (max_answer_bytes > 0 && answer_bytes > max_answer_bytes) {
    return AnswerTooLarge(answer_bytes, payload_bytes, max_answer_bytes);
  }
  auto* out_payloads = merged->mutable_payloads();
  out_payloads->Reserve(static_cast<int>(kept.size()));
  for (const std::string* payload : kept) {
    if (payload == nullptr) {
      out_payloads->Add();
    } else {
      *out_payloads->Add() = *payload;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckShardAnswers(const std::vector<ShardAnswer>& answers,
                               int shard_count, int k) {
  if (absl::Status s = CheckOneSet(answers, shard_count); !s.ok()) return s;
  const SearchResponse& first = *answers.front().response;
  // From the network: in 64 bits, saturating, so that no refine_factor
  // wraps into a width that matches (refine_factor * k must equal an
  // answer's 32-bit k).
  const int64_t refine = first.refine_factor();
  const int64_t candidates_width = refine > 0 ? SatMul(refine, k) : k;
  for (const ShardAnswer& a : answers) {
    const SearchResponse& r = *a.response;
    // A filtered answer holds the shard's k best exact distances
    // (AnswersWithCandidates in search_request.h); a shard older than that
    // sends its candidates with their estimates, which merge as well.
    const bool filtered =
        r.filter_plan() != knnd::v1::FILTER_PLAN_UNSPECIFIED;
    const int64_t width = filtered && r.k() == k ? k : candidates_width;
    const ResultColumns columns = ReadResults(r);
    if (columns.ids.size() < 0 || columns.distances.size() < 0 ||
        columns.approx_distances.size() < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          Name(a), " answered a bytes result field (ids_i64le, "
          "distances_f32le or approx_distances_f32le) that does not hold a "
          "whole number of values"));
    }
    const int64_t n = SatMul(r.num_queries(), width);
    const bool sizes = r.k() == width && columns.ids.size() == n &&
                       columns.distances.size() == n &&
                       (columns.approx_distances.size() ==
                            (refine > 0 && width == candidates_width ? n : 0) ||
                        (filtered && columns.approx_distances.size() == 0));
    if (!sizes) {
      return absl::FailedPreconditionError(absl::StrCat(
          Name(a), " answered ", columns.ids.size(), " ids, ",
          columns.distances.size(), " distances and ",
          columns.approx_distances.size(), " estimates of width ", r.k(),
          " for ", r.num_queries(), " queries; a shard answers ", width,
          " per query", refine > 0 ? " with their estimates" : "",
          " (k ", k, ", refine_factor ", refine, ")"));
    }
  }
  const bool payloads =
      std::any_of(answers.begin(), answers.end(), [](const ShardAnswer& a) {
        return a.response->payloads_size() > 0;
      });
  for (const ShardAnswer& a : answers) {
    const SearchResponse& r = *a.response;
    const int64_t n = static_cast<int64_t>(r.num_queries()) * r.k();
    if (payloads && r.payloads_size() != n) {
      return absl::FailedPreconditionError(absl::StrCat(
          Name(a), " answered ", r.payloads_size(), " payloads for ", n,
          " results; a shard asked for payloads answers one per result"));
    }
  }
  return absl::OkStatus();
}

absl::Status MergeShardAnswers(const std::vector<ShardAnswer>& answers, int k,
                               bool as_bytes, int64_t max_answer_bytes,
                               SearchResponse* merged) {
  const SearchResponse& first = *answers.front().response;
  const bool ascending = first.metric() == knnd::v1::METRIC_L2;
  const float pad = ascending ? std::numeric_limits<float>::infinity()
                              : -std::numeric_limits<float>::infinity();
  const int64_t refine = first.refine_factor();
  // With re-ranking every shard sent its refine * k candidates with both
  // distances (CheckShardAnswers made sure). Unfiltered, the merge keeps
  // the candidates the unsharded index would have re-ranked (the refine * k
  // best estimates over all shards), so that answers do not change with
  // the shard count. Filtered, there is no such index to imitate: each
  // shard planned alone (FILTER_PLAN_EXACT sends the matching rows' exact
  // distances as its estimates, FILTER_PLAN_IVF the PQ estimates of a
  // widened scan), and estimates of the two kinds do not compare. The k
  // best exact distances over every shard's candidates are then the exact
  // merge of what the shards found: a row is never displaced by one
  // farther from the query, and when every shard planned exact the answer
  // is the exact filtered k nearest.
  const bool filtered =
      std::any_of(answers.begin(), answers.end(), [](const ShardAnswer& a) {
        return a.response->filter_plan() != knnd::v1::FILTER_PLAN_UNSPECIFIED;
      });
  const bool candidates = refine > 0 && !filtered;
  const int64_t num_queries = first.num_queries();
  merged->set_num_queries(first.num_queries());
  merged->set_k(k);
  merged->set_index_version(first.index_version());
  int64_t serving = first.serving_version();
  for (const ShardAnswer& a : answers) {
    serving = std::min(serving, a.response->serving_version());
  }
  merged->set_serving_version(serving);
  merged->set_metric(first.metric());
  merged->set_nprobe(first.nprobe());
  merged->set_refine_factor(first.refine_factor());
  // A filter's matches are the sum of every shard's; the plan theirs when
  // they agree.
  uint64_t matched = 0;
  knnd::v1::FilterPlan plan = first.filter_plan();
  for (const ShardAnswer& a : answers) {
    matched += a.response->filter_matched_rows();
    if (a.response->filter_plan() != plan) plan = knnd::v1::FILTER_PLAN_MIXED;
  }
  merged->set_filter_matched_rows(matched);
  merged->set_filter_plan(plan);
  const ResultBuffers out = ResizeResults(num_queries * k, /*candidates=*/false,
                                         as_bytes, pad, merged);
  std::vector<ResultColumns> columns;
  columns.reserve(answers.size());
  for (const ShardAnswer& a : answers) columns.push_back(ReadResults(*a.response));
  const bool payloads = first.payloads_size() > 0;
  // Each kept result's payload (null for a pad), copied once the answer
  // with them is known to fit.
  std::vector<const std::string*> kept_payloads;
  if (payloads) kept_payloads.resize(static_cast<size_t>(num_queries * k));

  std::vector<Entry> entries;
  for (int64_t q = 0; q < num_queries; ++q) {
    entries.clear();
    for (size_t s = 0; s < answers.size(); ++s) {
      const ResultColumns& c = columns[s];
      const int width = answers[s].response->k();
      for (int j = 0; j < width; ++j) {
        const int64_t at = q * width + j;
        const int64_t id = c.ids[at];
        const float exact = c.distances[at];
        const float approx = candidates ? c.approx_distances[at] : exact;
        // A NaN orders nothing (the sorts below need a strict order), and
        // no shard sends one for a found neighbour: a missing one.
        if (id < 0 || std::isnan(exact) || std::isnan(approx)) continue;
        entries.push_back(Entry{
            approx, exact, id,
            payloads ? &answers[s].response->payloads(static_cast<int>(at))
                     : nullptr});
      }
    }
    // With candidates, the unsharded index's candidates, then its
    // re-ranking.
    const size_t keep =
        MergeOrder(entries, k, candidates ? refine : 0, ascending);
    for (size_t j = 0; j < keep; ++j) {
      out.ids[q * k + j] = entries[j].id;
      out.distances[q * k + j] = entries[j].exact;
      if (payloads) kept_payloads[q * k + j] = entries[j].payload;
    }
  }
  if (!payloads) return absl::OkStatus();
  return AttachPayloads(kept_payloads, max_answer_bytes, merged);
}

HybridMerge HybridMergeOf(const knnd::v1::SearchRequest& request) {
  HybridMerge merge;
  merge.k = request.k();
  const bool vectors =
      request.vectors_size() > 0 || !request.vectors_f32le().empty() ||
      !request.vectors_f16le().empty() || !request.vectors_bf16le().empty();
  merge.fusion.fusion = !vectors ? Fusion::kNone
                        : request.fusion() == knnd::v1::FUSION_WEIGHTED
                            ? Fusion::kWeighted
                            : Fusion::kRrf;
  if (request.has_rrf_k()) {
    merge.fusion.rrf_k =
        static_cast<int>(std::min<uint32_t>(request.rrf_k(), kMaxRrfK));
  }
  if (request.has_vector_weight()) {
    merge.fusion.vector_weight = request.vector_weight();
  }
  if (request.has_text_weight())
    merge.fusion.text_weight = request.text_weight();
  merge.vector_window = !vectors                      ? 0
                        : request.has_vector_window() ? request.vector_window()
                                                      : merge.k;
  merge.text_window =
      request.has_text_window() ? request.text_window() : merge.k;
  return merge;
}

absl::Status CheckHybridAnswers(const std::vector<ShardAnswer>& answers,
                                int shard_count, const HybridMerge& merge) {
  if (absl::Status s = CheckOneSet(answers, shard_count); !s.ok()) return s;
  const int64_t width = SatAdd(merge.vector_window, merge.text_window);
  const bool payloads = std::any_of(
      answers.begin(), answers.end(),
      [](const ShardAnswer& a) { return a.response->payloads_size() > 0; });
  for (const ShardAnswer& a : answers) {
    const SearchResponse& r = *a.response;
    const ResultColumns columns = ReadResults(r);
    const int64_t n = SatMul(r.num_queries(), width);
    const bool sizes =
        r.k() == width && columns.ids.size() == n &&
        columns.distances.size() == n && r.text_ranks_size() == n &&
        r.text_scores_size() == n &&
        r.vector_ranks_size() == (merge.vector_window > 0 ? n : 0) &&
        (!payloads || r.payloads_size() == n);
    if (!sizes) {
      return absl::FailedPreconditionError(absl::StrCat(
          Name(a), " answered ", columns.ids.size(), " ids, ",
          r.text_ranks_size(), " text ranks and ", r.payloads_size(),
          " payloads of width ", r.k(), " for ", r.num_queries(),
          " queries; a shard asked for the windows of a hybrid search "
          "answers vector_window + text_window = ",
          width, " per query"));
    }
  }
  return absl::OkStatus();
}

absl::Status MergeHybridAnswers(const std::vector<ShardAnswer>& answers,
                                const HybridMerge& merge, bool as_bytes,
                                int64_t max_answer_bytes,
                                SearchResponse* merged) {
  const SearchResponse& first = *answers.front().response;
  const bool ascending = first.metric() == knnd::v1::METRIC_L2;
  // CheckHybridAnswers saw every answer this wide: within the shards'
  // max_k twice.
  const int vw = static_cast<int>(merge.vector_window);
  const int width = vw + static_cast<int>(merge.text_window);
  const int k = static_cast<int>(merge.k);
  const int64_t num_queries = first.num_queries();
  merged->set_num_queries(first.num_queries());
  merged->set_k(k);
  merged->set_index_version(first.index_version());
  int64_t serving = first.serving_version();
  uint64_t matched = 0;
  knnd::v1::FilterPlan plan = first.filter_plan();
  for (const ShardAnswer& a : answers) {
    serving = std::min(serving, a.response->serving_version());
    matched += a.response->filter_matched_rows();
    if (a.response->filter_plan() != plan) plan = knnd::v1::FILTER_PLAN_MIXED;
  }
  merged->set_serving_version(serving);
  merged->set_metric(first.metric());
  merged->set_nprobe(first.nprobe());
  merged->set_refine_factor(first.refine_factor());
  merged->set_filter_matched_rows(matched);
  merged->set_filter_plan(plan);
  merged->set_fusion(FusionMethodOf(merge.fusion.fusion));
  const int64_t results = num_queries * k;
  const ResultBuffers out =
      ResizeResults(results, /*candidates=*/false, as_bytes,
                    -std::numeric_limits<float>::infinity(), merged);
  if (vw > 0) {
    merged->mutable_vector_ranks()->Resize(static_cast<int>(results), 0);
    merged->mutable_vector_scores()->Resize(static_cast<int>(results), 0.0f);
  }
  merged->mutable_text_ranks()->Resize(static_cast<int>(results), 0);
  merged->mutable_text_scores()->Resize(static_cast<int>(results), 0.0f);
  std::vector<ResultColumns> columns;
  columns.reserve(answers.size());
  for (const ShardAnswer& a : answers)
    columns.push_back(ReadResults(*a.response));
  const bool payloads = first.payloads_size() > 0;
  std::vector<const std::string*> kept_payloads;
  if (payloads) kept_payloads.resize(static_cast<size_t>(results));

  struct Windowed {
    RetrievedHit hit;
    const std::string* payload;
  };
  std::vector<Windowed> vector_entries;
  std::vector<Windowed> text_entries;
  std::vector<RetrievedHit> vector_list;
  std::vector<RetrievedHit> text_list;
  absl::flat_hash_map<int64_t, const std::string*> payload_of;
  for (int64_t q = 0; q < num_queries; ++q) {
    vector_entries.clear();
    text_entries.clear();
    payload_of.clear();
    for (size_t s = 0; s < answers.size(); ++s) {
      const ResultColumns& c = columns[s];
      for (int j = 0; j < width; ++j) {
        const int64_t at = q * width + j;
        const int64_t id = c.ids[at];
        const float score = c.distances[at];
        if (id < 0 || std::isnan(score)) continue;
        const std::string* payload =
            payloads ? &answers[s].response->payloads(static_cast<int>(at))
                     : nullptr;
        (j < vw ? vector_entries : text_entries)
            .push_back({{id, score}, payload});
      }
    }
    // Each retriever's window over the set, as one index ranks it.
    auto by_distance = [ascending](const Windowed& a, const Windowed& b) {
      if (a.hit.score != b.hit.score) {
        return ascending ? a.hit.score < b.hit.score
                         : a.hit.score > b.hit.score;
      }
      return a.hit.id < b.hit.id;
    };
    auto by_score = [](const Windowed& a, const Windowed& b) {
      return a.hit.score != b.hit.score ? a.hit.score > b.hit.score
                                        : a.hit.id < b.hit.id;
    };
    std::sort(vector_entries.begin(), vector_entries.end(), by_distance);
    std::sort(text_entries.begin(), text_entries.end(), by_score);
    vector_entries.resize(
        std::min(vector_entries.size(), static_cast<size_t>(vw)));
    text_entries.resize(
        std::min(text_entries.size(), static_cast<size_t>(merge.text_window)));
    vector_list.clear();
    text_list.clear();
    for (const Windowed& e : vector_entries) {
      vector_list.push_back(e.hit);
      payload_of.emplace(e.hit.id, e.payload);
    }
    for (const Windowed& e : text_entries) {
      text_list.push_back(e.hit);
      payload_of.emplace(e.hit.id, e.payload);
    }
    const std::vector<FusedHit> fused =
        FuseResults(vector_list, !ascending, text_list, merge.fusion);
    const size_t keep = std::min(fused.size(), static_cast<size_t>(k));
    for (size_t j = 0; j < keep; ++j) {
      const FusedHit& h = fused[j];
      const int64_t e = q * k + static_cast<int64_t>(j);
      out.ids[e] = h.id;
      out.distances[e] = static_cast<float>(h.fused);
      if (vw > 0) {
        merged->set_vector_ranks(static_cast<int>(e), h.vector_rank);
        merged->set_vector_scores(static_cast<int>(e), h.vector_score);
      }
      merged->set_text_ranks(static_cast<int>(e), h.text_rank);
      merged->set_text_scores(static_cast<int>(e), h.text_score);
      if (payloads) kept_payloads[static_cast<size_t>(e)] = payload_of[h.id];
    }
  }
  if (!payloads) return absl::OkStatus();
  return AttachPayloads(kept_payloads, max_answer_bytes, merged);
}

}  // namespace knnd

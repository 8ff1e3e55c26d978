#include "eval_relevance.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "knnd/index/hybrid_search.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/relevance_eval.h"
#include "knnd/storage/json_value.h"
#include "knnd/storage/vector_io.h"
#include "knnd/text/text_index.h"

namespace knnd::knnctl {
namespace {

// The lines of `path`, at most `limit` (0: all).
absl::StatusOr<std::vector<std::string>> ReadLines(const std::string& flag,
                                                   const std::string& path,
                                                   int64_t limit) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read --", flag, " ", path));
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (limit > 0 && static_cast<int64_t>(lines.size()) == limit) break;
    lines.push_back(std::move(line));
  }
  return lines;
}

// A label as labels and answers are compared: a JSON string's text, any
// other value as compact JSON (an id 42 and "42" are one label).
std::string LabelOf(const JsonValue& value) {
  return value.type() == JsonValue::Type::kString ? value.string_value()
                                                  : value.ToString();
}

// --labels: line q is a JSON array of query q's relevant labels.
absl::StatusOr<std::vector<std::vector<std::string>>> ReadLabels(
    const std::string& path, int64_t queries) {
  absl::StatusOr<std::vector<std::string>> lines =
      ReadLines("labels", path, queries);
  if (!lines.ok()) return lines.status();
  if (static_cast<int64_t>(lines->size()) < queries) {
    return absl::InvalidArgumentError(absl::StrCat("--labels ", path, " has ",
                                                   lines->size(), " lines for ",
                                                   queries, " queries"));
  }
  std::vector<std::vector<std::string>> labels(lines->size());
  for (size_t q = 0; q < lines->size(); ++q) {
    absl::StatusOr<JsonValue> line = ParseJson((*lines)[q]);
    if (!line.ok() || line->type() != JsonValue::Type::kArray) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--labels ", path, " line ", q + 1,
          ": expected a JSON array of the query's relevant labels (ids, or "
          "--label_field values)",
          line.ok() ? "" : absl::StrCat(": ", line.status().message())));
    }
    for (const JsonValue& item : line->items()) {
      labels[q].push_back(LabelOf(item));
    }
  }
  return labels;
}

// What each answer id counts as: its id, or its payload's --label_field.
class AnswerLabels {
 public:
  static absl::StatusOr<AnswerLabels> Make(const IndexSnapshot& snapshot,
                                           const std::string& field) {
    AnswerLabels labels(snapshot, field);
    if (field.empty()) return labels;
    if (!snapshot.info().has_payloads) {
      return absl::InvalidArgumentError(
          absl::StrCat("--label_field ", field, ": the index has no payloads"));
    }
    absl::StatusOr<PayloadSelection> selection =
        snapshot.SelectPayloads(/*all_fields=*/false, {field});
    if (!selection.ok()) return selection.status();
    labels.selection_ = *selection;
    return labels;
  }

  // "" for a missing answer (-1) or one without the field.
  const std::string& Of(int64_t id) {
    auto [at, added] = cache_.try_emplace(id);
    if (!added || id < 0) return at->second;
    if (field_.empty()) {
      at->second = absl::StrCat(id);
      return at->second;
    }
    std::string json;
    snapshot_->AppendPayload(id, selection_, &json);
    absl::StatusOr<JsonValue> payload = ParseJson(json);
    const JsonValue* value = payload.ok() ? payload->Find(field_) : nullptr;
    if (value != nullptr && !value->is_null()) at->second = LabelOf(*value);
    return at->second;
  }

 private:
  AnswerLabels(const IndexSnapshot& snapshot, std::string field)
      : snapshot_(&snapshot), field_(std::move(field)) {}

  const IndexSnapshot* snapshot_;
  std::string field_;
  PayloadSelection selection_;
  absl::flat_hash_map<int64_t, std::string> cache_;
};

// One retriever (or fusion) to score.
struct Retriever {
  std::string name;
  bool vectors = false;  // searches the query vectors
  bool text = false;     // searches the query texts
  FusionParams fusion;   // with both
};

// The searches of every query: `window` answer ids each.
struct Answers {
  std::vector<int64_t> ids;
  double seconds = 0;
};

struct Inputs {
  const IndexSnapshot* snapshot = nullptr;
  const Matrix* vectors = nullptr;           // rows >= queries, or null
  std::vector<std::vector<uint32_t>> terms;  // per query, with texts
  int64_t queries = 0;
  int window = 0;
  int nprobe = 1;
  int refine_factor = 0;
  int64_t batch = 256;
};

absl::StatusOr<Answers> Search(const Inputs& in, const Retriever& r) {
  Answers answers;
  const size_t width = static_cast<size_t>(in.window);
  answers.ids.assign(static_cast<size_t>(in.queries) * width, -1);
  std::vector<float> scores(answers.ids.size());
  std::vector<uint32_t> ranks(2 * answers.ids.size());
  std::vector<float> retriever_scores(2 * answers.ids.size());
  HybridQuery query;
  static_cast<FusionParams&>(query) = r.fusion;
  if (!r.vectors) query.fusion = Fusion::kNone;
  query.terms = in.terms;
  query.vector_window = in.window;
  query.text_window = in.window;
  const absl::Time start = absl::Now();
  for (int64_t first = 0; first < in.queries; first += in.batch) {
    const int64_t n = std::min(in.batch, in.queries - first);
    const size_t at = static_cast<size_t>(first) * width;
    SearchArgs args;
    args.queries = r.vectors ? in.vectors->row(first) : nullptr;
    args.num_queries = n;
    args.k = in.window;
    args.nprobe = in.nprobe;
    args.refine_factor = in.refine_factor;
    args.ids = answers.ids.data() + at;
    args.distances = scores.data() + at;
    absl::Status status;
    if (!r.text) {
      status = in.snapshot->Search(args);
    } else {
      HybridOutputs out;
      out.text_ranks = ranks.data() + at;
      out.text_scores = retriever_scores.data() + at;
      if (r.vectors) {
        out.vector_ranks = ranks.data() + answers.ids.size() + at;
        out.vector_scores = retriever_scores.data() + answers.ids.size() + at;
      }
      status = SearchHybrid(*in.snapshot, args, nullptr, query, first, out);
    }
    if (!status.ok()) return status;
  }
  answers.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return answers;
}

// --fusions: the fusions to score with both inputs.
absl::StatusOr<std::vector<Retriever>> Fusions(const RelevanceOptions& o) {
  std::vector<Retriever> fusions;
  for (absl::string_view name :
       absl::StrSplit(o.fusions, ',', absl::SkipWhitespace())) {
    Retriever r{std::string(name), true, true, {}};
    r.fusion.rrf_k = o.rrf_k;
    r.fusion.vector_weight = static_cast<float>(o.vector_weight);
    r.fusion.text_weight = static_cast<float>(o.text_weight);
    if (name == "rrf") {
      r.fusion.fusion = Fusion::kRrf;
      r.name = absl::StrCat("rrf k=", o.rrf_k);
    } else if (name == "weighted") {
      r.fusion.fusion = Fusion::kWeighted;
      r.name = absl::StrCat("weighted ", o.vector_weight, "/", o.text_weight);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--fusions: \"", name, "\" is not rrf or weighted"));
    }
    fusions.push_back(std::move(r));
  }
  if (o.rrf_k < 1 || o.rrf_k > kMaxRrfK) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rrf_k=", o.rrf_k, " must be in [1, ", kMaxRrfK, "]"));
  }
  if (o.vector_weight < 0 || o.text_weight < 0 ||
      o.vector_weight + o.text_weight <= 0) {
    return absl::InvalidArgumentError(
        "--vector_weight and --text_weight must be >= 0, not both 0");
  }
  return fusions;
}

// One value of --nprobes or --refine_factors, or `fallback` when empty.
absl::StatusOr<int> OneSetting(const char* flag, const std::string& value,
                               int fallback, int low, int high) {
  if (value.empty()) return fallback;
  int v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < low || v > high) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", value, ": with --labels, one value in [",
                     low, ", ", high, "]"));
  }
  return v;
}

}  // namespace

void AddRelevanceFlags(FlagSet& flags, RelevanceOptions& options) {
  flags.Add("labels", &options.labels, "FILE.jsonl",
            "Relevance mode (instead of recall against nearest neighbours): "
            "line q is a JSON array of query q's relevant labels, answer ids "
            "or --label_field values; scores nDCG@k, Recall@k and MRR@k of "
            "BM25 (--texts), dense (--queries) and their fusions.");
  flags.Add("texts", &options.texts, "FILE",
            "With --labels: one text query per line (BM25 over the index's "
            "text index, INDEX.text).");
  flags.Add("label_field", &options.label_field, "FIELD",
            "With --labels: an answer counts as its payload's FIELD (e.g. "
            "the page a chunk came from); each label counts once, at its "
            "best rank. Default: the answer's id.");
  flags.Add("window", &options.window, "N",
            "With --labels: answers each retriever searches per query (and "
            "each fusion's windows); the first --k distinct labels score.");
  flags.Add("fusions", &options.fusions, "LIST",
            "With --labels, --texts and --queries: the fusions to score, "
            "rrf and/or weighted.");
  flags.Add("rrf_k", &options.rrf_k, "N", "With --labels: RRF's k.");
  flags.Add("vector_weight", &options.vector_weight, "W",
            "With --labels: the weighted fusion's vector weight.");
  flags.Add("text_weight", &options.text_weight, "W",
            "With --labels: the weighted fusion's text weight.");
}

int EvalRelevance(const std::string& index, const QueryOptions& query,
                  const RelevanceOptions& options, const std::string& nprobe,
                  const std::string& refine_factor, int64_t batch) {
  if (options.texts.empty() && query.queries.empty()) {
    return Fail("eval --labels needs --texts FILE, --queries FILE, or both");
  }
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> snapshot =
      IndexSnapshot::Load(index, {});
  if (!snapshot.ok()) return Fail(snapshot.status());
  const IndexInfo& info = (*snapshot)->info();
  if (!options.texts.empty() && (*snapshot)->text() == nullptr) {
    return Fail(absl::StrCat("--texts: ", index,
                             " has no text index (build it with --text)"));
  }
  Inputs in;
  in.snapshot = snapshot->get();
  in.batch = std::max<int64_t>(1, batch);
  std::vector<std::string> texts;
  Matrix vectors;
  if (!options.texts.empty()) {
    absl::StatusOr<std::vector<std::string>> read =
        ReadLines("texts", options.texts, query.limit);
    if (!read.ok()) return Fail(read.status());
    texts = std::move(*read);
    in.queries = static_cast<int64_t>(texts.size());
  }
  if (!query.queries.empty()) {
    absl::StatusOr<Matrix> read = ReadVectors(query.queries, query.limit);
    if (!read.ok()) return Fail(read.status());
    vectors = std::move(*read);
    if (!texts.empty() && vectors.rows != in.queries) {
      return Fail(absl::StrCat("--queries has ", vectors.rows,
                               " rows, --texts ", in.queries,
                               " lines: one of each per query"));
    }
    in.queries = vectors.rows;
    in.vectors = &vectors;
  }
  absl::StatusOr<std::vector<std::vector<std::string>>> relevant =
      ReadLabels(options.labels, in.queries);
  if (!relevant.ok()) return Fail(relevant.status());
  relevant->resize(static_cast<size_t>(in.queries));
  const int k = query.k;
  if (k < 1 || options.window < k || options.window > info.ntotal) {
    return Fail(
        absl::StrCat("--k=", k, " and --window=", options.window,
                     " must satisfy 1 <= k <= window <= ntotal=", info.ntotal));
  }
  in.window = options.window;
  const bool tuned = info.tuned_nprobe > 0;
  absl::StatusOr<int> probes = OneSetting(
      "nprobes", nprobe, tuned ? info.tuned_nprobe : info.stored_nprobe, 1,
      static_cast<int>(std::max<int64_t>(1, info.nlist)));
  if (!probes.ok()) return Fail(probes.status());
  absl::StatusOr<int> refine = OneSetting("refine_factors", refine_factor,
                                          tuned ? info.tuned_refine_factor : 0,
                                          0, info.has_vectors ? 1024 : 0);
  if (!refine.ok()) return Fail(refine.status());
  in.nprobe = std::max(1, *probes);
  in.refine_factor = *refine;
  for (const std::string& text : texts) {
    in.terms.push_back((*snapshot)->text()->QueryTerms(text));
  }
  absl::StatusOr<AnswerLabels> labels =
      AnswerLabels::Make(**snapshot, options.label_field);
  if (!labels.ok()) return Fail(labels.status());

  std::vector<Retriever> retrievers;
  if (!texts.empty()) retrievers.push_back({"bm25", false, true, {}});
  if (in.vectors != nullptr) retrievers.push_back({"dense", true, false, {}});
  if (!texts.empty() && in.vectors != nullptr) {
    absl::StatusOr<std::vector<Retriever>> fusions = Fusions(options);
    if (!fusions.ok()) return Fail(fusions.status());
    for (Retriever& r : *fusions) retrievers.push_back(std::move(r));
  }

  int64_t scored = 0;
  for (const auto& set : *relevant) scored += set.empty() ? 0 : 1;
  std::printf("index:    %s: %lld rows%s\n", index.c_str(),
              static_cast<long long>(info.ntotal),
              (*snapshot)->text() != nullptr ? ", with a text index" : "");
  std::printf(
      "queries:  %lld (%lld with labels, scored); labels: %s\n",
      static_cast<long long>(in.queries), static_cast<long long>(scored),
      options.label_field.empty()
          ? "answer ids"
          : absl::StrCat("payload field ", options.label_field).c_str());
  std::printf(
      "searched: %d answers per retriever and query, nprobe %d, "
      "refine_factor %d; the first %d distinct labels score\n\n",
      in.window, in.nprobe, in.refine_factor, k);
  std::printf("%-22s  %9s  %9s  %9s  %10s\n", "retriever",
              absl::StrCat("nDCG@", k).c_str(),
              absl::StrCat("Recall@", k).c_str(),
              absl::StrCat("MRR@", k).c_str(), "queries/s");
  for (const Retriever& r : retrievers) {
    absl::StatusOr<Answers> answers = Search(in, r);
    if (!answers.ok()) return Fail(answers.status());
    std::vector<std::vector<std::string>> ranked(
        static_cast<size_t>(in.queries));
    std::vector<std::string> row(static_cast<size_t>(in.window));
    for (size_t q = 0; q < ranked.size(); ++q) {
      for (size_t i = 0; i < row.size(); ++i) {
        row[i] = labels->Of(answers->ids[q * row.size() + i]);
      }
      ranked[q] = FirstDistinct(row, k);
    }
    const RelevanceScores s = ScoreRankings(ranked, *relevant, k);
    std::printf("%-22s  %9.4f  %9.4f  %9.4f  %10.0f\n", r.name.c_str(), s.ndcg,
                s.recall, s.mrr,
                answers->seconds > 0
                    ? static_cast<double>(in.queries) / answers->seconds
                    : 0.0);
    std::fflush(stdout);
  }
  return kExitOk;
}

}  // namespace knnd::knnctl

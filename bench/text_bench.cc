// text_bench: knnd's BM25 in process, one thread, for the hybrid
// benchmark (bench/hybrid/, `make bench-hybrid`): the text index of an
// index built with `knnctl build --text`, and one text query per line of
// --queries. Prints, per query, its top --k rows as one JSON line
// ({"ids": [...], "scores": [...]}, ids as answers carry them) when
// --results is given, and on stdout one JSON line of timings: queries per
// second over --rounds rounds of every query (analysis and search), the
// median round's, and the analysis's share.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "knnd/index/index_snapshot.h"

ABSL_FLAG(std::string, index, "", "index built with knnctl build --text");
ABSL_FLAG(std::string, queries, "", "one text query per line");
ABSL_FLAG(int, k, 10, "results per query");
ABSL_FLAG(int, rounds, 5, "rounds over every query");
ABSL_FLAG(std::string, results, "", "write each query's top k here");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  knnd::LoadOptions load;
  load.use_precomputed_table = false;
  load.probe_in_subprocess = false;
  absl::StatusOr<std::unique_ptr<knnd::IndexSnapshot>> snapshot =
      knnd::IndexSnapshot::Load(absl::GetFlag(FLAGS_index), load);
  if (!snapshot.ok()) {
    std::fprintf(stderr, "%s\n", snapshot.status().ToString().c_str());
    return 2;
  }
  const knnd::TextIndex* text = (*snapshot)->text();
  if (text == nullptr) {
    std::fprintf(stderr, "the index has no text index\n");
    return 2;
  }
  std::vector<std::string> queries;
  std::ifstream in(absl::GetFlag(FLAGS_queries));
  for (std::string line; std::getline(in, line);) queries.push_back(line);
  if (queries.empty()) {
    std::fprintf(stderr, "no queries in --queries\n");
    return 2;
  }
  const int k = absl::GetFlag(FLAGS_k);
  std::vector<float> scratch;
  std::vector<knnd::TextHit> hits;
  if (const std::string path = absl::GetFlag(FLAGS_results); !path.empty()) {
    FILE* out = std::fopen(path.c_str(), "w");
    if (out == nullptr) return 2;
    for (const std::string& q : queries) {
      text->Search(text->QueryTerms(q), nullptr, k, &scratch, &hits);
      std::fprintf(out, "{\"ids\": [");
      for (size_t i = 0; i < hits.size(); ++i) {
        std::fprintf(out, "%s%lld", i ? ", " : "",
                     static_cast<long long>((*snapshot)->IdOfRow(hits[i].row)));
      }
      std::fprintf(out, "], \"scores\": [");
      for (size_t i = 0; i < hits.size(); ++i) {
        std::fprintf(out, "%s%.9g", i ? ", " : "", hits[i].score);
      }
      std::fprintf(out, "]}\n");
    }
    std::fclose(out);
  }
  std::vector<double> rates;
  double analysis = 0;
  double total = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const absl::Time start = absl::Now();
    absl::Duration analyzing;
    for (const std::string& q : queries) {
      const absl::Time a = absl::Now();
      const std::vector<uint32_t> terms = text->QueryTerms(q);
      analyzing += absl::Now() - a;
      text->Search(terms, nullptr, k, &scratch, &hits);
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    rates.push_back(static_cast<double>(queries.size()) / seconds);
    analysis += absl::ToDoubleSeconds(analyzing);
    total += seconds;
  }
  std::sort(rates.begin(), rates.end());
  std::printf(
      "{\"queries\": %zu, \"rounds\": %zu, \"qps_median\": %.1f, "
      "\"qps_best\": %.1f, \"analysis_share\": %.3f}\n",
      queries.size(), rates.size(), rates[rates.size() / 2], rates.back(),
      total > 0 ? analysis / total : 0.0);
  return 0;
}

// knnctl analyze: the terms a text index holds for each line of text, as
// knnd's analyzer cuts them (text/analyzer.h): to see what a text query
// will match, and to hand other BM25 implementations the same terms.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "command.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/json_value.h"
#include "knnd/text/analyzer.h"

namespace knnd::knnctl {
namespace {

struct AnalyzeOptions {
  std::string input;
  std::string index;
  std::string stemmer;
  bool list_stemmers = false;
};

int Analyze(const AnalyzeOptions& options) {
  if (options.list_stemmers) {
    for (const std::string& language : StemmerLanguages()) {
      std::printf("%s\n", language.c_str());
    }
    return kExitOk;
  }
  AnalyzerOptions analyzer_options;
  analyzer_options.stemmer = options.stemmer;
  if (!options.index.empty()) {
    if (!options.stemmer.empty()) {
      return Fail(
          "give --index or --stemmer, not both: an index's text "
          "index says its own stemmer");
    }
    LoadOptions load;
    load.use_precomputed_table = false;
    load.probe_in_subprocess = false;
    load.verify_checksum = false;
    absl::StatusOr<std::unique_ptr<IndexSnapshot>> snapshot =
        IndexSnapshot::Load(options.index, load);
    if (!snapshot.ok()) return Fail(snapshot.status());
    if ((*snapshot)->text() == nullptr) {
      return Fail(absl::StrCat(options.index,
                               " has no text index (knnctl build --text)"));
    }
    analyzer_options.stemmer = (*snapshot)->text()->stats().stemmer;
  }
  absl::StatusOr<std::unique_ptr<Analyzer>> analyzer =
      Analyzer::Create(analyzer_options);
  if (!analyzer.ok()) return Fail(analyzer.status());
  std::ifstream file;
  if (!options.input.empty()) {
    file.open(options.input);
    if (!file) return Fail(absl::StrCat("cannot read --input ", options.input));
  }
  std::istream& in = options.input.empty() ? std::cin : file;
  std::string line;
  std::string out;
  std::vector<std::string> terms;
  while (std::getline(in, line)) {
    terms.clear();
    (*analyzer)->Tokenize(line, &terms);
    out.assign("[");
    for (size_t i = 0; i < terms.size(); ++i) {
      if (i > 0) out.push_back(',');
      AppendJsonString(terms[i], &out);
    }
    out.append("]\n");
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return std::fflush(stdout) == 0 ? kExitOk : kExitError;
}

}  // namespace

std::function<int()> DefineAnalyze(FlagSet& flags) {
  auto options = std::make_shared<AnalyzeOptions>();
  flags.Add("input", &options->input, "FILE",
            "UTF-8 text, one text per line. Default: standard input.");
  flags.Add("index", &options->index, "INDEX",
            "Analyze as this index's text index does (its stemmer).");
  flags.Add("stemmer", &options->stemmer, "LANG",
            "Stem words with libstemmer's Snowball stemmer of LANG, as "
            "knnctl build --text_stemmer does. Default: none.");
  flags.AddSwitch("list_stemmers", &options->list_stemmers,
                  "Print the stemmer languages libstemmer knows, one a line, "
                  "and exit.");
  return [options] { return Analyze(*options); };
}

}  // namespace knnd::knnctl

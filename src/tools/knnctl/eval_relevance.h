// knnctl eval --labels: BM25, dense and hybrid retrieval of one index
// scored against relevance labels (nDCG@k, Recall@k, MRR@k;
// index/relevance_eval.h), searched in process through the daemon's own
// path (IndexSnapshot::Search and SearchHybrid), one line per retriever.
//
// Thread-safety: runs on knnctl's main thread.
#ifndef KNND_TOOLS_KNNCTL_EVAL_RELEVANCE_H_
#define KNND_TOOLS_KNNCTL_EVAL_RELEVANCE_H_

#include <cstdint>
#include <string>

#include "command.h"
#include "flag_set.h"

namespace knnd::knnctl {

struct RelevanceOptions {
  std::string texts;        // one query text per line
  std::string labels;       // JSON Lines: per query an array of labels
  std::string label_field;  // empty: labels are answer ids
  std::string fusions = "rrf,weighted";
  int window = 100;
  int rrf_k = 60;
  double vector_weight = 0.5;
  double text_weight = 0.5;
};

// --texts, --labels, --label_field, --window, --fusions, --rrf_k,
// --vector_weight and --text_weight.
void AddRelevanceFlags(FlagSet& flags, RelevanceOptions& options);

// Scores every retriever the inputs allow: BM25 with --texts, dense with
// --queries, and each of --fusions with both. `nprobe` and
// `refine_factor` are eval's --nprobes and --refine_factors, here at most
// one value each (empty: the index's tuned setting, else its stored
// nprobe and no re-ranking).
int EvalRelevance(const std::string& index, const QueryOptions& query,
                  const RelevanceOptions& options, const std::string& nprobe,
                  const std::string& refine_factor, int64_t batch);

}  // namespace knnd::knnctl

#endif  // KNND_TOOLS_KNNCTL_EVAL_RELEVANCE_H_

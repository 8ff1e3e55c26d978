// Writing text indexes (text_index.h): `knnctl build --text FIELD` reads
// the field from every row's payload (storage/payload_file.h), analyzes it
// (analyzer.h) into one TextCorpus, and writes the file of the whole index
// or of each shard from it with the whole corpus's statistics; `knnctl
// update` and `knnctl shard` do the same from the new version's payloads,
// so a text index always matches its version's payloads row for row.
//
// Memory: the corpus is held whole while the files are written: per
// distinct term its bytes and per (term, row) pair 8 bytes, plus 4 bytes a
// row (a corpus of 1M chunks of 200 distinct terms: about 1.6 GB).
//
// Thread-safety: a TextCorpus is used by one thread.
#ifndef KNND_TEXT_TEXT_INDEX_WRITER_H_
#define KNND_TEXT_TEXT_INDEX_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "knnd/storage/payload_file.h"
#include "knnd/text/analyzer.h"
#include "knnd/text/text_index.h"

namespace knnd {

struct TextIndexOptions {
  std::string field;  // the payload field holding each row's text
  AnalyzerOptions analyzer;
  double k1 = kDefaultBm25K1;  // >= 0
  double b = kDefaultBm25B;    // in [0, 1]
};

// INVALID_ARGUMENT naming a bad k1 or b, an empty field or an unknown
// stemmer.
absl::Status ValidateTextIndexOptions(const TextIndexOptions& options);

class TextCorpus {
 public:
  static absl::StatusOr<std::unique_ptr<TextCorpus>> Create(
      const TextIndexOptions& options);

  // Appends the next row, with text `text`.
  void AddRow(absl::string_view text);
  int64_t rows() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t terms() const { return static_cast<int64_t>(terms_.size()); }
  double average_length() const;
  const TextIndexOptions& options() const { return options_; }

  // Writes rows [first, end) of the corpus to `path` (through a temporary
  // file and a rename) with the whole corpus's statistics.
  absl::Status Write(const std::string& path, int64_t first, int64_t end) const;

 private:
  TextCorpus(TextIndexOptions options, std::unique_ptr<Analyzer> analyzer)
      : options_(std::move(options)), analyzer_(std::move(analyzer)) {}

  const TextIndexOptions options_;
  const std::unique_ptr<Analyzer> analyzer_;
  absl::flat_hash_map<std::string, uint32_t> term_numbers_;
  std::vector<std::string> terms_;  // by term number, first seen first
  // By term number: (row, term frequency), rows ascending.
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> postings_;
  std::vector<uint32_t> lengths_;  // terms per row
  int64_t total_length_ = 0;
};

// The text of `options.field` in every row of `payloads` (consecutive row
// ranges, in order) analyzed into a corpus: a string field as it is, an
// array of strings joined by newlines, a row without the field empty.
// INVALID_ARGUMENT naming the row and field when a value is of another
// type, or when no payload file has the field at all.
absl::StatusOr<std::unique_ptr<TextCorpus>> ReadTextCorpus(
    absl::Span<const PayloadFile* const> payloads,
    const TextIndexOptions& options);

// The options a text index was built with, to build the next version's.
TextIndexOptions OptionsOf(const TextIndexStats& stats);

// One output of WriteTextIndexes: the rows after the previous part's, up
// to `end_row` (exclusive), go to `path`.
struct TextIndexPart {
  std::string path;
  int64_t end_row = 0;
};

// What WriteTextIndexes read, for the line a tool prints.
struct TextCorpusSummary {
  int64_t rows = 0;
  int64_t terms = 0;
  double average_length = 0;
};

// ReadTextCorpus() over `payloads`, then one text index per part of
// `parts` (consecutive, the last ending at the corpus's rows), each with
// the whole corpus's statistics: the whole index's, or its shards'.
absl::StatusOr<TextCorpusSummary> WriteTextIndexes(
    absl::Span<const PayloadFile* const> payloads,
    const TextIndexOptions& options, absl::Span<const TextIndexPart> parts);

}  // namespace knnd

#endif  // KNND_TEXT_TEXT_INDEX_WRITER_H_

// The text index of a version (INDEX + ".text", written by `knnctl build
// --text FIELD`, text_index_writer.h): for every term the analyzer
// (analyzer.h) found in the rows' text, the rows holding it with their
// BM25 impact precomputed (idf * tf / (tf + k1 * (1 - b + b * len / avglen)),
// Lucene's BM25, as bm25s scores eagerly), so that a query's score for a
// row is the sum of its terms' impacts: one pass over a few postings, no
// per-query statistics. The statistics (rows, document frequencies,
// average length) are the whole corpus's, also in one shard of a set
// (each shard's file records the set's), so that a sharded index scores
// as one index does. knnd maps the file read-only: page cache, not heap.
//
// Layout (little-endian; each section starts on a 64-byte boundary; the
// first 32 bytes are laid out as the payload file's and the attribute
// store's: magic, version, header bytes, rows at 16, CRC-32 at 28, which
// is all a version manifest reads to bind it, storage/version_manifest.h):
//   offset 0   char[8]  magic "KNNDTEXT"
//          8   uint32   format version (1)
//         12   uint32   header bytes (128)
//         16   uint64   rows (of this file: the index's or the shard's)
//         24   uint32   field name bytes
//         28   uint32   CRC-32 (zlib) of every byte after the header
//         32   uint64   terms
//         40   uint64   postings
//         48   double   k1
//         56   double   b
//         64   uint64   corpus rows (the whole corpus's, sharded or not)
//         72   double   corpus average length, in terms
//         80   uint32   stemmer bytes
//         84   uint32   zero
//         88   uint64   rows with no term
//         96   uint64   term bytes
//        104   ...      zero up to 128
//   128        field name, stemmer (UTF-8), padded
//              uint64 term_offset[terms + 1] into the term bytes
//              term bytes: the terms, sorted bytewise, concatenated
//              uint64 posting_offset[terms + 1] into the postings
//              uint32 document_frequency[terms] (the corpus's)
//              uint32 posting_row[postings] (ascending within a term)
//              float  posting_impact[postings]
// The file size must be exactly the end of the impacts.
//
// Thread-safety: a TextIndex is immutable once opened; Search() is const
// and safe from any number of threads. Ownership: it owns its mapping.
#ifndef KNND_TEXT_TEXT_INDEX_H_
#define KNND_TEXT_TEXT_INDEX_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "knnd/faiss/mapped_file.h"
#include "knnd/text/analyzer.h"

namespace knnd {

inline constexpr uint32_t kTextIndexFormatVersion = 1;
inline constexpr int64_t kTextIndexHeaderBytes = 128;
inline constexpr double kDefaultBm25K1 = 1.2;
inline constexpr double kDefaultBm25B = 0.75;

// index_path + ".text".
std::string TextIndexPath(const std::string& index_path);

// What a text index was built with and over, as its header says.
struct TextIndexStats {
  std::string field;    // the payload field its text came from
  std::string stemmer;  // empty: none
  double k1 = kDefaultBm25K1;
  double b = kDefaultBm25B;
  int64_t rows = 0;         // of this file
  int64_t terms = 0;        // distinct, in this file
  int64_t postings = 0;     // (term, row) pairs in this file
  int64_t empty_rows = 0;   // rows of this file without a term
  int64_t corpus_rows = 0;  // of the whole corpus
  double corpus_average_length = 0;
};

// One row's BM25 score for a query.
struct TextHit {
  int64_t row = 0;
  float score = 0;
};

class TextIndex {
 public:
  // Maps `path` read-only and checks its header and sections against the
  // file size and the index it belongs to (`expect_rows`); with
  // `verify_checksum` also reads the file once to check its CRC-32.
  // NOT_FOUND (no file), DATA_LOSS (bad magic, size, section, offsets,
  // checksum), INVALID_ARGUMENT (rows of another index, unknown version,
  // a stemmer libstemmer does not know), each naming the file.
  static absl::StatusOr<std::unique_ptr<TextIndex>> Open(
      const std::string& path, int64_t expect_rows, bool verify_checksum);

  const std::string& path() const { return file_->path(); }
  int64_t file_bytes() const { return static_cast<int64_t>(file_->size()); }
  uint32_t content_crc32() const { return crc32_; }
  const TextIndexStats& stats() const { return stats_; }
  // The analyzer queries go through: the one the rows went through.
  const Analyzer& analyzer() const { return *analyzer_; }

  // The term number of `term`, or -1 when no row holds it.
  int64_t FindTerm(absl::string_view term) const;
  // The terms of `text` that some row holds, as term numbers, in text
  // order (a term given twice counts twice, as in Lucene's query of its
  // terms); the others dropped.
  std::vector<uint32_t> QueryTerms(absl::string_view text) const;

  // The `window` rows of highest BM25 score for `terms` (QueryTerms())
  // among those `admit` accepts (every row when null), best first, equal
  // scores by row; rows of score 0 (no term) never. `scores` is a scratch
  // buffer of rows() floats the caller may reuse between calls (zeroed on
  // return).
  void Search(absl::Span<const uint32_t> terms,
              const std::function<bool(int64_t row)>* admit, int window,
              std::vector<float>* scores, std::vector<TextHit>* hits) const;

  // Reads the file once and checks its CRC-32 against the header's.
  absl::Status VerifyChecksum(const std::atomic<bool>* cancel = nullptr) const;

 private:
  TextIndex(std::unique_ptr<MappedFile> file, uint32_t crc32,
            TextIndexStats stats, std::unique_ptr<Analyzer> analyzer);

  std::unique_ptr<MappedFile> file_;
  uint32_t crc32_;
  TextIndexStats stats_;
  std::unique_ptr<Analyzer> analyzer_;
  const uint64_t* term_offsets_ = nullptr;
  const char* term_bytes_ = nullptr;
  const uint64_t* posting_offsets_ = nullptr;
  const uint32_t* document_frequency_ = nullptr;
  const uint32_t* posting_rows_ = nullptr;
  const float* posting_impacts_ = nullptr;
};

// The layout's section offsets for a file of these counts and strings,
// shared by the writer and the reader.
struct TextIndexLayout {
  int64_t strings = 0;
  int64_t term_offsets = 0;
  int64_t term_bytes = 0;
  int64_t posting_offsets = 0;
  int64_t document_frequency = 0;
  int64_t posting_rows = 0;
  int64_t posting_impacts = 0;
  int64_t end = 0;
};
TextIndexLayout LayoutTextIndex(int64_t field_bytes, int64_t stemmer_bytes,
                                int64_t terms, int64_t term_bytes,
                                int64_t postings);

// The header as stored.
struct TextIndexHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t header_bytes;
  uint64_t rows;
  uint32_t field_bytes;
  uint32_t crc32;
  uint64_t terms;
  uint64_t postings;
  double k1;
  double b;
  uint64_t corpus_rows;
  double corpus_average_length;
  uint32_t stemmer_bytes;
  uint32_t zero;
  uint64_t empty_rows;
  uint64_t term_bytes;
  char pad[24];
};
static_assert(sizeof(TextIndexHeader) == kTextIndexHeaderBytes);
inline constexpr char kTextIndexMagic[8] = {'K', 'N', 'N', 'D',
                                            'T', 'E', 'X', 'T'};

}  // namespace knnd

#endif  // KNND_TEXT_TEXT_INDEX_H_

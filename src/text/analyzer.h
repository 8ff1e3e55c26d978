// Analyzer: text to the terms a BM25 text index holds (text_index.h), the
// same for the rows at build and for the queries at search, so that a
// query's words meet the rows' words.
//
// Steps, each from a well-kept library, none from hand-written Unicode
// tables:
//   1. NFKC with case folding (ICU's nfkc_cf): full-width and half-width
//      forms, compatibility ideographs, ligatures and case fold together
//      ("ＡＢＣ", "abc" and "ABC" are one term).
//   2. Word boundaries by ICU's word break iterator (UAX #29 with its
//      dictionaries); segments without letters, digits, kana or ideographs
//      (spaces, punctuation) are dropped.
//   3. Runs of CJK characters (Han, Hiragana, Katakana, Hangul: adjacent
//      segments with nothing between them) become overlapping unigrams and
//      bigrams ("服务器" -> 服, 服务, 务, 务器, 器), as Lucene's CJKAnalyzer,
//      Elasticsearch's cjk_bigram with unigrams and Xapian's CJK n-grams
//      do: no dictionary to ship, and a query finds a row whatever way a
//      segmenter would have cut either.
//   4. Other words, optionally stemmed by a Snowball stemmer (libstemmer)
//      of the language asked for ("english", "german" ...).
// Terms longer than kMaxTermBytes are dropped (a base64 blob is no word).
//
// Thread-safety: an Analyzer is immutable once created; Tokenize() is
// const and safe from any number of threads (each call clones ICU's break
// iterator and opens its own stemmer).
#ifndef KNND_TEXT_ANALYZER_H_
#define KNND_TEXT_ANALYZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace knnd {

inline constexpr int kMaxTermBytes = 255;

struct AnalyzerOptions {
  // A Snowball stemmer's language (StemmerLanguages()); empty: none.
  std::string stemmer;
};

class Analyzer {
 public:
  // INVALID_ARGUMENT naming an unknown stemmer language and the known
  // ones; INTERNAL when ICU cannot open its data.
  static absl::StatusOr<std::unique_ptr<Analyzer>> Create(
      const AnalyzerOptions& options);
  ~Analyzer();
  Analyzer(const Analyzer&) = delete;
  Analyzer& operator=(const Analyzer&) = delete;

  // Appends the terms of `utf8` (invalid UTF-8 sequences read as U+FFFD,
  // which no term holds) to `terms`, in text order.
  void Tokenize(absl::string_view utf8, std::vector<std::string>* terms) const;
  std::vector<std::string> Tokenize(absl::string_view utf8) const;

  const AnalyzerOptions& options() const { return options_; }
  // What the analyzer does, for GetIndexInfo and `knnctl info`:
  // "icu-nfkc_cf words, cjk 1+2-grams" plus ", snowball english".
  std::string Describe() const;

 private:
  struct Icu;  // ICU's objects, kept out of this header
  Analyzer(AnalyzerOptions options, std::unique_ptr<const Icu> icu);

  const AnalyzerOptions options_;
  const std::unique_ptr<const Icu> icu_;
};

// The languages libstemmer knows ("english", "french" ...).
std::vector<std::string> StemmerLanguages();

}  // namespace knnd

#endif  // KNND_TEXT_ANALYZER_H_

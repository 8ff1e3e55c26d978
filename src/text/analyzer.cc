#include "knnd/text/analyzer.h"

#include <libstemmer.h>
#include <unicode/brkiter.h>
#include <unicode/normalizer2.h>
#include <unicode/ubrk.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/uscript.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace knnd {

struct Analyzer::Icu {
  const icu::Normalizer2* normalizer = nullptr;  // ICU's, never freed
  std::unique_ptr<icu::BreakIterator> words;     // cloned per call
};

namespace {

bool IsCjk(UChar32 c) {
  UErrorCode error = U_ZERO_ERROR;
  switch (uscript_getScript(c, &error)) {
    case USCRIPT_HAN:
    case USCRIPT_HIRAGANA:
    case USCRIPT_KATAKANA:
    case USCRIPT_HANGUL:
      return true;
    default:
      return false;
  }
}

// A stemmer of one Tokenize() call (libstemmer's are not thread-safe).
class Stemmer {
 public:
  explicit Stemmer(const std::string& language)
      : stemmer_(language.empty() ? nullptr
                                  : sb_stemmer_new(language.c_str(), "UTF_8")) {
  }
  ~Stemmer() {
    if (stemmer_ != nullptr) sb_stemmer_delete(stemmer_);
  }
  Stemmer(const Stemmer&) = delete;
  Stemmer& operator=(const Stemmer&) = delete;

  // `word` stemmed in place; unchanged without a stemmer.
  void Stem(std::string* word) const {
    if (stemmer_ == nullptr) return;
    const sb_symbol* out = sb_stemmer_stem(
        stemmer_, reinterpret_cast<const sb_symbol*>(word->data()),
        static_cast<int>(word->size()));
    if (out == nullptr) return;  // out of memory: the word unstemmed
    word->assign(reinterpret_cast<const char*>(out),
                 static_cast<size_t>(sb_stemmer_length(stemmer_)));
  }

 private:
  sb_stemmer* const stemmer_;
};

// Collects the terms of one text: words as they come, CJK characters into
// the current run, which becomes unigrams and bigrams when something else
// follows or the text ends.
class TermSink {
 public:
  TermSink(const Stemmer& stemmer, std::vector<std::string>* terms)
      : stemmer_(stemmer), terms_(terms) {}

  void Word(const icu::UnicodeString& text, int32_t begin, int32_t end,
            bool letters) {
    FlushRun();
    std::string word;
    text.tempSubStringBetween(begin, end).toUTF8String(word);
    if (letters) stemmer_.Stem(&word);
    Emit(std::move(word));
  }

  // CJK characters [begin, end) of `text`, continuing the run when it
  // ended at `begin`.
  void Cjk(const icu::UnicodeString& text, int32_t begin, int32_t end) {
    if (begin != run_end_) FlushRun();
    for (int32_t i = begin; i < end;) {
      const UChar32 c = text.char32At(i);
      run_.push_back(c);
      i += U16_LENGTH(c);
    }
    run_end_ = end;
  }

  void FlushRun() {
    for (size_t i = 0; i < run_.size(); ++i) {
      std::string unigram;
      icu::UnicodeString(run_[i]).toUTF8String(unigram);
      if (i + 1 < run_.size()) {
        std::string bigram = unigram;
        icu::UnicodeString(run_[i + 1]).toUTF8String(bigram);
        Emit(std::move(unigram));
        Emit(std::move(bigram));
      } else {
        Emit(std::move(unigram));
      }
    }
    run_.clear();
    run_end_ = -1;
  }

 private:
  void Emit(std::string term) {
    if (!term.empty() && term.size() <= kMaxTermBytes) {
      terms_->push_back(std::move(term));
    }
  }

  const Stemmer& stemmer_;
  std::vector<std::string>* const terms_;
  std::vector<UChar32> run_;
  int32_t run_end_ = -1;
};

}  // namespace

Analyzer::Analyzer(AnalyzerOptions options, std::unique_ptr<const Icu> icu)
    : options_(std::move(options)), icu_(std::move(icu)) {}

Analyzer::~Analyzer() = default;

absl::StatusOr<std::unique_ptr<Analyzer>> Analyzer::Create(
    const AnalyzerOptions& options) {
  if (!options.stemmer.empty()) {
    sb_stemmer* probe = sb_stemmer_new(options.stemmer.c_str(), "UTF_8");
    if (probe == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stemmer \"", options.stemmer, "\" is not one libstemmer knows: ",
          absl::StrJoin(StemmerLanguages(), ", ")));
    }
    sb_stemmer_delete(probe);
  }
  auto icu = std::make_unique<Icu>();
  UErrorCode error = U_ZERO_ERROR;
  icu->normalizer = icu::Normalizer2::getNFKCCasefoldInstance(error);
  if (U_FAILURE(error)) {
    return absl::InternalError(absl::StrCat(
        "ICU cannot open its NFKC case-folding data: ", u_errorName(error)));
  }
  icu->words.reset(
      icu::BreakIterator::createWordInstance(icu::Locale::getRoot(), error));
  if (U_FAILURE(error) || icu->words == nullptr) {
    return absl::InternalError(absl::StrCat(
        "ICU cannot open its word break rules: ", u_errorName(error)));
  }
  return std::unique_ptr<Analyzer>(new Analyzer(options, std::move(icu)));
}

void Analyzer::Tokenize(absl::string_view utf8,
                        std::vector<std::string>* terms) const {
  UErrorCode error = U_ZERO_ERROR;
  const icu::UnicodeString text = icu_->normalizer->normalize(
      icu::UnicodeString::fromUTF8(
          icu::StringPiece(utf8.data(), static_cast<int32_t>(utf8.size()))),
      error);
  if (U_FAILURE(error)) return;
  std::unique_ptr<icu::BreakIterator> words(icu_->words->clone());
  words->setText(text);
  const Stemmer stemmer(options_.stemmer);
  TermSink sink(stemmer, terms);
  int32_t begin = words->first();
  for (int32_t end = words->next(); end != icu::BreakIterator::DONE;
       begin = end, end = words->next()) {
    const int32_t status = words->getRuleStatus();
    if (status < UBRK_WORD_NONE_LIMIT) continue;  // spaces, punctuation
    // A segment may mix CJK and other characters; cut it where it turns.
    int32_t piece = begin;
    bool piece_cjk = IsCjk(text.char32At(begin));
    for (int32_t i = begin; i <= end;) {
      const bool at_end = i == end;
      const UChar32 c = at_end ? 0 : text.char32At(i);
      const bool cjk = !at_end && IsCjk(c);
      if (at_end || cjk != piece_cjk) {
        if (piece < i) {
          if (piece_cjk) {
            sink.Cjk(text, piece, i);
          } else {
            sink.Word(
                text, piece, i,
                status >= UBRK_WORD_LETTER && status < UBRK_WORD_LETTER_LIMIT);
          }
        }
        piece = i;
        piece_cjk = cjk;
      }
      if (at_end) break;
      i += U16_LENGTH(c);
    }
  }
  sink.FlushRun();
}

std::vector<std::string> Analyzer::Tokenize(absl::string_view utf8) const {
  std::vector<std::string> terms;
  Tokenize(utf8, &terms);
  return terms;
}

std::string Analyzer::Describe() const {
  std::string out = "icu nfkc_cf words, cjk 1+2-grams";
  if (!options_.stemmer.empty()) {
    absl::StrAppend(&out, ", snowball ", options_.stemmer);
  }
  return out;
}

std::vector<std::string> StemmerLanguages() {
  std::vector<std::string> languages;
  for (const char** name = sb_stemmer_list(); *name != nullptr; ++name) {
    languages.emplace_back(*name);
  }
  return languages;
}

}  // namespace knnd

#include "knnd/text/text_index_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/json_value.h"
#include "knnd/storage/payload_crc32.h"

namespace knnd {
namespace {

// Writes the sections of one file in order, padding each to 64 bytes,
// with the CRC-32 of everything after the header.
class SectionWriter {
 public:
  SectionWriter(FILE* file) : file_(file), crc_(InitialCrc32()) {}

  bool Write(const void* data, size_t bytes) {
    if (bytes == 0) return true;
    crc_ = *ExtendCrc32(crc_, data, bytes);
    written_ += static_cast<int64_t>(bytes);
    return std::fwrite(data, 1, bytes, file_) == bytes;
  }
  bool PadTo(int64_t offset) {
    static const char kZeros[64] = {};
    while (written_ < offset) {
      const size_t n =
          static_cast<size_t>(std::min<int64_t>(64, offset - written_));
      if (!Write(kZeros, n)) return false;
    }
    return true;
  }
  int64_t written() const { return written_; }
  uint32_t crc32() const { return static_cast<uint32_t>(crc_); }

 private:
  FILE* const file_;
  unsigned long crc_;
  int64_t written_ = kTextIndexHeaderBytes;
};

}  // namespace

absl::Status ValidateTextIndexOptions(const TextIndexOptions& options) {
  if (options.field.empty()) {
    return absl::InvalidArgumentError("--text needs a payload field name");
  }
  if (!(options.k1 >= 0) || !std::isfinite(options.k1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bm25_k1=", options.k1, " must be >= 0"));
  }
  if (!(options.b >= 0 && options.b <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bm25_b=", options.b, " must be in [0, 1]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TextCorpus>> TextCorpus::Create(
    const TextIndexOptions& options) {
  if (absl::Status s = ValidateTextIndexOptions(options); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Analyzer>> analyzer =
      Analyzer::Create(options.analyzer);
  if (!analyzer.ok()) return analyzer.status();
  return std::unique_ptr<TextCorpus>(
      new TextCorpus(options, std::move(*analyzer)));
}

void TextCorpus::AddRow(absl::string_view text) {
  const uint32_t row = static_cast<uint32_t>(lengths_.size());
  const std::vector<std::string> terms = analyzer_->Tokenize(text);
  lengths_.push_back(static_cast<uint32_t>(terms.size()));
  total_length_ += static_cast<int64_t>(terms.size());
  for (const std::string& term : terms) {
    auto [it, added] =
        term_numbers_.try_emplace(term, static_cast<uint32_t>(terms_.size()));
    if (added) {
      terms_.push_back(term);
      postings_.emplace_back();
    }
    std::vector<std::pair<uint32_t, uint32_t>>& list = postings_[it->second];
    if (list.empty() || list.back().first != row) {
      list.emplace_back(row, 1);
    } else {
      ++list.back().second;
    }
  }
}

double TextCorpus::average_length() const {
  return lengths_.empty() ? 0
                          : static_cast<double>(total_length_) /
                                static_cast<double>(lengths_.size());
}

absl::Status TextCorpus::Write(const std::string& path, int64_t first,
                               int64_t end) const {
  if (first < 0 || end < first || end > rows()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows [", first, ", ", end, ") are not rows of a corpus of ", rows()));
  }
  if (end - first > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a text index holds at most 2^32 - 1 rows; shard the index"));
  }
  // The terms with a posting in the range, sorted bytewise, and the
  // postings of each in it.
  struct Range {
    uint32_t term;
    size_t begin, end;  // into postings_[term]
  };
  std::vector<Range> held;
  for (uint32_t t = 0; t < terms_.size(); ++t) {
    const auto& list = postings_[t];
    const auto lo =
        std::lower_bound(list.begin(), list.end(), static_cast<uint32_t>(first),
                         [](const std::pair<uint32_t, uint32_t>& p,
                            uint32_t r) { return p.first < r; });
    const auto hi =
        std::lower_bound(lo, list.end(),
                         static_cast<uint32_t>(std::min<int64_t>(
                             end, std::numeric_limits<uint32_t>::max())),
                         [](const std::pair<uint32_t, uint32_t>& p,
                            uint32_t r) { return p.first < r; });
    if (lo != hi) {
      held.push_back({t, static_cast<size_t>(lo - list.begin()),
                      static_cast<size_t>(hi - list.begin())});
    }
  }
  std::sort(held.begin(), held.end(), [this](const Range& a, const Range& b) {
    return terms_[a.term] < terms_[b.term];
  });
  int64_t term_bytes = 0;
  int64_t postings = 0;
  for (const Range& r : held) {
    term_bytes += static_cast<int64_t>(terms_[r.term].size());
    postings += static_cast<int64_t>(r.end - r.begin);
  }
  int64_t empty_rows = 0;
  for (int64_t row = first; row < end; ++row) empty_rows += lengths_[row] == 0;

  TextIndexHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kTextIndexMagic, sizeof(h.magic));
  h.format_version = kTextIndexFormatVersion;
  h.header_bytes = kTextIndexHeaderBytes;
  h.rows = static_cast<uint64_t>(end - first);
  h.terms = held.size();
  h.postings = static_cast<uint64_t>(postings);
  h.k1 = options_.k1;
  h.b = options_.b;
  h.corpus_rows = static_cast<uint64_t>(rows());
  h.corpus_average_length = average_length();
  h.field_bytes = static_cast<uint32_t>(options_.field.size());
  h.stemmer_bytes = static_cast<uint32_t>(options_.analyzer.stemmer.size());
  h.empty_rows = static_cast<uint64_t>(empty_rows);
  h.term_bytes = static_cast<uint64_t>(term_bytes);
  const TextIndexLayout l =
      LayoutTextIndex(h.field_bytes, h.stemmer_bytes,
                      static_cast<int64_t>(held.size()), term_bytes, postings);

  const std::string temp = TempPathFor(path);
  FILE* file = std::fopen(temp.c_str(), "wb");
  if (file == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", temp, ": ", std::strerror(errno)));
  }
  bool ok = std::fwrite(&h, sizeof(h), 1, file) == 1;
  SectionWriter w(file);
  ok = ok && w.Write(options_.field.data(), options_.field.size()) &&
       w.Write(options_.analyzer.stemmer.data(),
               options_.analyzer.stemmer.size()) &&
       w.PadTo(l.term_offsets);
  uint64_t offset = 0;
  ok = ok && w.Write(&offset, 8);
  for (const Range& r : held) {
    offset += terms_[r.term].size();
    ok = ok && w.Write(&offset, 8);
  }
  ok = ok && w.PadTo(l.term_bytes);
  for (const Range& r : held) {
    ok = ok && w.Write(terms_[r.term].data(), terms_[r.term].size());
  }
  ok = ok && w.PadTo(l.posting_offsets);
  offset = 0;
  ok = ok && w.Write(&offset, 8);
  for (const Range& r : held) {
    offset += r.end - r.begin;
    ok = ok && w.Write(&offset, 8);
  }
  ok = ok && w.PadTo(l.document_frequency);
  for (const Range& r : held) {
    const uint32_t df = static_cast<uint32_t>(postings_[r.term].size());
    ok = ok && w.Write(&df, 4);
  }
  ok = ok && w.PadTo(l.posting_rows);
  for (const Range& r : held) {
    const auto& list = postings_[r.term];
    for (size_t i = r.begin; i < r.end && ok; ++i) {
      const uint32_t row = list[i].first - static_cast<uint32_t>(first);
      ok = w.Write(&row, 4);
    }
  }
  ok = ok && w.PadTo(l.posting_impacts);
  // Lucene's BM25 (no (k1 + 1) factor, which orders nothing): what
  // bm25s's "lucene" method computes, so scores compare one for one.
  const double n = static_cast<double>(rows());
  const double average = average_length();
  for (const Range& r : held) {
    const auto& list = postings_[r.term];
    const double df = static_cast<double>(list.size());
    const double idf = std::log(1.0 + (n - df + 0.5) / (df + 0.5));
    for (size_t i = r.begin; i < r.end && ok; ++i) {
      const double tf = list[i].second;
      const double length = lengths_[list[i].first];
      const double norm =
          options_.k1 * (1.0 - options_.b +
                         (average > 0 ? options_.b * length / average : 0.0));
      const float impact = static_cast<float>(idf * tf / (tf + norm));
      ok = w.Write(&impact, 4);
    }
  }
  if (ok) {
    h.crc32 = w.crc32();
    ok = std::fseek(file, 0, SEEK_SET) == 0 &&
         std::fwrite(&h, sizeof(h), 1, file) == 1;
  }
  ok = std::fclose(file) == 0 && ok;
  if (!ok || w.written() != l.end) {
    std::remove(temp.c_str());
    return absl::DataLossError(
        absl::StrCat("cannot write ", temp, ": ", std::strerror(errno)));
  }
  return CommitTempFile(temp, path);
}

absl::StatusOr<std::unique_ptr<TextCorpus>> ReadTextCorpus(
    absl::Span<const PayloadFile* const> payloads,
    const TextIndexOptions& options) {
  absl::StatusOr<std::unique_ptr<TextCorpus>> corpus =
      TextCorpus::Create(options);
  if (!corpus.ok()) return corpus.status();
  bool field_seen = false;
  std::vector<std::string> fields_seen;
  int64_t row = 0;
  std::string text;
  for (const PayloadFile* file : payloads) {
    const std::vector<std::string>& names = file->field_names();
    if (std::find(names.begin(), names.end(), options.field) != names.end()) {
      field_seen = true;
    }
    for (const std::string& name : names) {
      if (std::find(fields_seen.begin(), fields_seen.end(), name) ==
          fields_seen.end()) {
        fields_seen.push_back(name);
      }
    }
    for (int64_t r = 0; r < file->count(); ++r, ++row) {
      text.clear();
      for (const PayloadField& field : file->Fields(r)) {
        if (field.first != options.field) continue;
        absl::StatusOr<JsonValue> value = ParseJson(field.second);
        if (!value.ok()) return value.status();
        if (value->type() == JsonValue::Type::kString) {
          text = value->string_value();
        } else if (value->type() == JsonValue::Type::kArray) {
          for (const JsonValue& item : value->items()) {
            if (item.type() != JsonValue::Type::kString) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "row ", row, "'s payload field \"", options.field,
                  "\" is an array holding a non-string; --text takes a "
                  "string or an array of strings"));
            }
            if (!text.empty()) text.push_back('\n');
            text += item.string_value();
          }
        } else if (!value->is_null()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "row ", row, "'s payload field \"", options.field, "\" is ",
              field.second.substr(0, 40),
              ", not text; --text takes a string or an array of strings"));
        }
      }
      (*corpus)->AddRow(text);
    }
  }
  if (!field_seen) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--text ", options.field, ": no payload has that field (fields: ",
        absl::StrJoin(fields_seen, ", "), ")"));
  }
  return corpus;
}

TextIndexOptions OptionsOf(const TextIndexStats& stats) {
  TextIndexOptions options;
  options.field = stats.field;
  options.analyzer.stemmer = stats.stemmer;
  options.k1 = stats.k1;
  options.b = stats.b;
  return options;
}

absl::StatusOr<TextCorpusSummary> WriteTextIndexes(
    absl::Span<const PayloadFile* const> payloads,
    const TextIndexOptions& options, absl::Span<const TextIndexPart> parts) {
  absl::StatusOr<std::unique_ptr<TextCorpus>> corpus =
      ReadTextCorpus(payloads, options);
  if (!corpus.ok()) return corpus.status();
  const TextCorpus& c = **corpus;
  if (parts.empty() || parts.back().end_row != c.rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the text index parts end at row ",
                     parts.empty() ? 0 : parts.back().end_row,
                     " but the payloads hold ", c.rows(), " rows"));
  }
  int64_t first = 0;
  for (const TextIndexPart& part : parts) {
    if (absl::Status s = c.Write(part.path, first, part.end_row); !s.ok()) {
      return s;
    }
    first = part.end_row;
  }
  return TextCorpusSummary{c.rows(), c.terms(), c.average_length()};
}

}  // namespace knnd

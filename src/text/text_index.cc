#include "knnd/text/text_index.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "knnd/storage/payload_crc32.h"

namespace knnd {
namespace {

int64_t Pad64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

absl::Status Damaged(const std::string& path, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("text index ", path, " is damaged: ", what));
}

}  // namespace

std::string TextIndexPath(const std::string& index_path) {
  return index_path + ".text";
}

TextIndexLayout LayoutTextIndex(int64_t field_bytes, int64_t stemmer_bytes,
                                int64_t terms, int64_t term_bytes,
                                int64_t postings) {
  TextIndexLayout l;
  l.strings = kTextIndexHeaderBytes;
  l.term_offsets = l.strings + Pad64(field_bytes + stemmer_bytes);
  l.term_bytes = l.term_offsets + Pad64(8 * (terms + 1));
  l.posting_offsets = l.term_bytes + Pad64(term_bytes);
  l.document_frequency = l.posting_offsets + Pad64(8 * (terms + 1));
  l.posting_rows = l.document_frequency + Pad64(4 * terms);
  l.posting_impacts = l.posting_rows + Pad64(4 * postings);
  l.end = l.posting_impacts + 4 * postings;
  return l;
}

TextIndex::TextIndex(std::unique_ptr<MappedFile> file, uint32_t crc32,
                     TextIndexStats stats, std::unique_ptr<Analyzer> analyzer)
    : file_(std::move(file)),
      crc32_(crc32),
      stats_(std::move(stats)),
      analyzer_(std::move(analyzer)) {}

absl::StatusOr<std::unique_ptr<TextIndex>> TextIndex::Open(
    const std::string& path, int64_t expect_rows, bool verify_checksum) {
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  const int64_t size = static_cast<int64_t>((*file)->size());
  if (size < kTextIndexHeaderBytes) {
    return Damaged(path, absl::StrCat(size, " bytes, fewer than its header"));
  }
  TextIndexHeader h;
  std::memcpy(&h, (*file)->data(), sizeof(h));
  if (std::memcmp(h.magic, kTextIndexMagic, sizeof(h.magic)) != 0) {
    return Damaged(path, "not a knnd text index (bad magic)");
  }
  if (h.format_version != kTextIndexFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text index ", path, " has format version ", h.format_version,
        "; this build reads ", kTextIndexFormatVersion));
  }
  if (h.header_bytes != kTextIndexHeaderBytes) {
    return Damaged(path, absl::StrCat("header of ", h.header_bytes, " bytes"));
  }
  if (static_cast<int64_t>(h.rows) != expect_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text index ", path, " holds ", h.rows, " rows but the index has ",
        expect_rows, ": the files are not of one version"));
  }
  // Counts bounded by the file size before any layout arithmetic.
  if (h.terms > static_cast<uint64_t>(size) ||
      h.postings > static_cast<uint64_t>(size) ||
      h.term_bytes > static_cast<uint64_t>(size) || h.field_bytes > size ||
      h.stemmer_bytes > size || h.empty_rows > h.rows ||
      h.corpus_rows < h.rows || !(h.k1 >= 0) || !(h.b >= 0 && h.b <= 1) ||
      !(h.corpus_average_length >= 0)) {
    return Damaged(path, "header values out of range");
  }
  const TextIndexLayout l = LayoutTextIndex(
      h.field_bytes, h.stemmer_bytes, static_cast<int64_t>(h.terms),
      static_cast<int64_t>(h.term_bytes), static_cast<int64_t>(h.postings));
  if (l.end != size) {
    return Damaged(path,
                   absl::StrCat(size, " bytes where its header makes ", l.end));
  }
  const uint8_t* base = (*file)->data();
  TextIndexStats stats;
  const char* strings = reinterpret_cast<const char*>(base + l.strings);
  stats.field.assign(strings, h.field_bytes);
  stats.stemmer.assign(strings + h.field_bytes, h.stemmer_bytes);
  stats.k1 = h.k1;
  stats.b = h.b;
  stats.rows = static_cast<int64_t>(h.rows);
  stats.terms = static_cast<int64_t>(h.terms);
  stats.postings = static_cast<int64_t>(h.postings);
  stats.empty_rows = static_cast<int64_t>(h.empty_rows);
  stats.corpus_rows = static_cast<int64_t>(h.corpus_rows);
  stats.corpus_average_length = h.corpus_average_length;
  if (verify_checksum) {
    if (absl::Status s = VerifyPayloadCrc32(
            absl::StrCat("text index ", path), base + kTextIndexHeaderBytes,
            static_cast<size_t>(size - kTextIndexHeaderBytes), h.crc32);
        !s.ok()) {
      return s;
    }
  }
  AnalyzerOptions analyzer_options;
  analyzer_options.stemmer = stats.stemmer;
  absl::StatusOr<std::unique_ptr<Analyzer>> analyzer =
      Analyzer::Create(analyzer_options);
  if (!analyzer.ok()) {
    return absl::Status(
        analyzer.status().code(),
        absl::StrCat("text index ", path, ": ", analyzer.status().message()));
  }
  std::unique_ptr<TextIndex> index(new TextIndex(
      std::move(*file), h.crc32, std::move(stats), std::move(*analyzer)));
  index->term_offsets_ =
      reinterpret_cast<const uint64_t*>(base + l.term_offsets);
  index->term_bytes_ = reinterpret_cast<const char*>(base + l.term_bytes);
  index->posting_offsets_ =
      reinterpret_cast<const uint64_t*>(base + l.posting_offsets);
  index->document_frequency_ =
      reinterpret_cast<const uint32_t*>(base + l.document_frequency);
  index->posting_rows_ =
      reinterpret_cast<const uint32_t*>(base + l.posting_rows);
  index->posting_impacts_ =
      reinterpret_cast<const float*>(base + l.posting_impacts);
  // Offsets ascend within their sections: every term and posting list
  // read later stays inside the mapping.
  const int64_t terms = index->stats_.terms;
  for (int64_t t = 0; t < terms; ++t) {
    if (index->term_offsets_[t] > index->term_offsets_[t + 1] ||
        index->posting_offsets_[t] > index->posting_offsets_[t + 1]) {
      return Damaged(path, absl::StrCat("offsets of term ", t, " descend"));
    }
  }
  if (index->term_offsets_[0] != 0 || index->posting_offsets_[0] != 0 ||
      index->term_offsets_[terms] != h.term_bytes ||
      index->posting_offsets_[terms] != h.postings) {
    return Damaged(path, "offsets do not span their sections");
  }
  return index;
}

int64_t TextIndex::FindTerm(absl::string_view term) const {
  auto at = [this](int64_t t) {
    return absl::string_view(term_bytes_ + term_offsets_[t],
                             term_offsets_[t + 1] - term_offsets_[t]);
  };
  int64_t lo = 0;
  int64_t hi = stats_.terms;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (at(mid) < term) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < stats_.terms && at(lo) == term ? lo : -1;
}

std::vector<uint32_t> TextIndex::QueryTerms(absl::string_view text) const {
  std::vector<uint32_t> terms;
  for (const std::string& term : analyzer_->Tokenize(text)) {
    const int64_t t = FindTerm(term);
    if (t >= 0) terms.push_back(static_cast<uint32_t>(t));
  }
  return terms;
}

void TextIndex::Search(absl::Span<const uint32_t> terms,
                       const std::function<bool(int64_t row)>* admit,
                       int window, std::vector<float>* scores,
                       std::vector<TextHit>* hits) const {
  hits->clear();
  const int64_t rows = stats_.rows;
  if (static_cast<int64_t>(scores->size()) != rows) {
    scores->assign(static_cast<size_t>(rows), 0.0f);
  }
  float* score = scores->data();
  std::vector<uint32_t> touched;
  for (uint32_t t : terms) {
    if (t >= static_cast<uint64_t>(stats_.terms)) continue;
    const uint64_t end = posting_offsets_[t + 1];
    for (uint64_t p = posting_offsets_[t]; p < end; ++p) {
      const uint32_t row = posting_rows_[p];
      if (row >= rows) continue;  // a file damaged after it was opened
      if (score[row] == 0.0f) touched.push_back(row);
      score[row] += posting_impacts_[p];
    }
  }
  hits->reserve(touched.size());
  for (uint32_t row : touched) {
    if (score[row] > 0.0f && (admit == nullptr || (*admit)(row))) {
      hits->push_back({row, score[row]});
    }
    score[row] = 0.0f;
  }
  auto better = [](const TextHit& a, const TextHit& b) {
    return a.score != b.score ? a.score > b.score : a.row < b.row;
  };
  if (window < static_cast<int>(hits->size())) {
    std::nth_element(hits->begin(), hits->begin() + window, hits->end(),
                     better);
    hits->resize(static_cast<size_t>(window));
  }
  std::sort(hits->begin(), hits->end(), better);
}

absl::Status TextIndex::VerifyChecksum(const std::atomic<bool>* cancel) const {
  return VerifyPayloadCrc32(
      absl::StrCat("text index ", path()),
      file_->data() + kTextIndexHeaderBytes,
      file_->size() - static_cast<size_t>(kTextIndexHeaderBytes), crc32_,
      cancel);
}

}  // namespace knnd

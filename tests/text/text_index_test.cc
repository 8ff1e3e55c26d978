#include "knnd/text/text_index.h"

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knnd/storage/payload_file.h"
#include "knnd/text/text_index_writer.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using testing::FlipByteFromEnd;
using ::testing::HasSubstr;
using testing::PokeByte;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

const std::vector<std::string>& Rows() {
  static const auto* rows = new std::vector<std::string>{
      "the quick brown fox",
      "the lazy dog sleeps",
      "quick quick fox jumps over the dog",
      "",
      "服务器配置 server configuration",
      "파일을 열기 open a file",
      "brown dog",
      "fox",
  };
  return *rows;
}

std::unique_ptr<TextCorpus> Corpus(double k1 = kDefaultBm25K1,
                                   double b = kDefaultBm25B) {
  TextIndexOptions options;
  options.field = "text";
  options.k1 = k1;
  options.b = b;
  absl::StatusOr<std::unique_ptr<TextCorpus>> corpus =
      TextCorpus::Create(options);
  EXPECT_TRUE(corpus.ok()) << corpus.status();
  for (const std::string& row : Rows()) (*corpus)->AddRow(row);
  return std::move(*corpus);
}

std::unique_ptr<TextIndex> WriteAndOpen(const TextCorpus& corpus,
                                        const std::string& path, int64_t first,
                                        int64_t end) {
  EXPECT_TRUE(corpus.Write(path, first, end).ok());
  absl::StatusOr<std::unique_ptr<TextIndex>> index =
      TextIndex::Open(path, end - first, /*verify_checksum=*/true);
  EXPECT_TRUE(index.ok()) << index.status();
  return std::move(*index);
}

// Lucene's BM25 of `query`'s terms for every row, from the rows' terms,
// computed here the long way.
std::vector<double> ReferenceScores(const std::vector<std::string>& query,
                                    double k1, double b) {
  absl::StatusOr<std::unique_ptr<Analyzer>> analyzer =
      Analyzer::Create(AnalyzerOptions());
  std::vector<std::vector<std::string>> docs;
  double total = 0;
  for (const std::string& row : Rows()) {
    docs.push_back((*analyzer)->Tokenize(row));
    total += static_cast<double>(docs.back().size());
  }
  const double n = static_cast<double>(docs.size());
  const double average = total / n;
  std::vector<double> scores(docs.size(), 0.0);
  for (const std::string& term : query) {
    double df = 0;
    for (const auto& doc : docs) {
      df += std::count(doc.begin(), doc.end(), term) > 0 ? 1 : 0;
    }
    if (df == 0) continue;
    const double idf = std::log(1 + (n - df + 0.5) / (df + 0.5));
    for (size_t d = 0; d < docs.size(); ++d) {
      const double tf =
          static_cast<double>(std::count(docs[d].begin(), docs[d].end(), term));
      if (tf == 0) continue;
      const double length = static_cast<double>(docs[d].size());
      scores[d] += idf * tf / (tf + k1 * (1 - b + b * length / average));
    }
  }
  return scores;
}

std::vector<TextHit> Search(
    const TextIndex& index, absl::string_view text, int window,
    const std::function<bool(int64_t)>* admit = nullptr) {
  std::vector<float> scratch;
  std::vector<TextHit> hits;
  index.Search(index.QueryTerms(text), admit, window, &scratch, &hits);
  for (float s : scratch) EXPECT_EQ(s, 0.0f);  // handed back zeroed
  return hits;
}

TEST(TextIndex, ScoresAreLuceneBm25OfTheCorpus) {
  TempDir tmp;
  for (auto [k1, b] : {std::pair{1.2, 0.75}, std::pair{2.0, 0.3}}) {
    std::unique_ptr<TextCorpus> corpus = Corpus(k1, b);
    std::unique_ptr<TextIndex> index =
        WriteAndOpen(*corpus, tmp.path("i.text"), 0, corpus->rows());
    EXPECT_EQ(index->stats().k1, k1);
    EXPECT_EQ(index->stats().b, b);
    const std::vector<std::string> query = {"quick", "fox", "dog", "dog"};
    const std::vector<double> expected = ReferenceScores(query, k1, b);
    const std::vector<TextHit> hits = Search(*index, "Quick FOX dog dog", 10);
    std::map<int64_t, float> got;
    for (const TextHit& hit : hits) got[hit.row] = hit.score;
    for (size_t row = 0; row < expected.size(); ++row) {
      if (expected[row] == 0) {
        EXPECT_EQ(got.count(row), 0u) << row;
      } else {
        ASSERT_EQ(got.count(row), 1u) << row;
        EXPECT_NEAR(got[row], expected[row], 1e-5) << row;
      }
    }
    for (size_t i = 1; i < hits.size(); ++i) {
      EXPECT_GE(hits[i - 1].score, hits[i].score);
    }
  }
}

TEST(TextIndex, FindsCjkTextByAnyPartOfItsRun) {
  TempDir tmp;
  std::unique_ptr<TextCorpus> corpus = Corpus();
  std::unique_ptr<TextIndex> index =
      WriteAndOpen(*corpus, tmp.path("i.text"), 0, corpus->rows());
  for (const char* query : {"配置", "服务器", "파일", "열기", "파일을 열기"}) {
    const std::vector<TextHit> hits = Search(*index, query, 3);
    ASSERT_FALSE(hits.empty()) << query;
    EXPECT_EQ(hits[0].row, query[0] == '\xe6' || query[0] == '\xe9' ? 4 : 5)
        << query;
  }
  EXPECT_TRUE(Search(*index, "zebra", 3).empty());
  EXPECT_TRUE(Search(*index, "", 3).empty());
}

TEST(TextIndex, AdmitsOnlyWhatTheFilterAdmitsAndKeepsTheWindow) {
  TempDir tmp;
  std::unique_ptr<TextCorpus> corpus = Corpus();
  std::unique_ptr<TextIndex> index =
      WriteAndOpen(*corpus, tmp.path("i.text"), 0, corpus->rows());
  const std::vector<TextHit> all = Search(*index, "fox dog brown", 10);
  ASSERT_EQ(all.size(), 5u);  // rows 0, 1, 2, 6 and 7
  const std::function<bool(int64_t)> odd = [](int64_t row) {
    return row % 2 == 1;
  };
  const std::vector<TextHit> filtered =
      Search(*index, "fox dog brown", 10, &odd);
  std::vector<TextHit> expected;
  for (const TextHit& hit : all) {
    if (hit.row % 2 == 1) expected.push_back(hit);
  }
  ASSERT_EQ(filtered.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(filtered[i].row, expected[i].row);
    EXPECT_EQ(filtered[i].score, expected[i].score);
  }
  const std::vector<TextHit> two = Search(*index, "fox dog brown", 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].row, all[0].row);
  EXPECT_EQ(two[1].row, all[1].row);
}

TEST(TextIndex, AShardScoresItsRowsWithTheWholeCorpusStatistics) {
  TempDir tmp;
  std::unique_ptr<TextCorpus> corpus = Corpus();
  std::unique_ptr<TextIndex> whole =
      WriteAndOpen(*corpus, tmp.path("whole.text"), 0, corpus->rows());
  std::unique_ptr<TextIndex> first =
      WriteAndOpen(*corpus, tmp.path("s0.text"), 0, 4);
  std::unique_ptr<TextIndex> second =
      WriteAndOpen(*corpus, tmp.path("s1.text"), 4, corpus->rows());
  EXPECT_EQ(second->stats().rows, corpus->rows() - 4);
  EXPECT_EQ(second->stats().corpus_rows, corpus->rows());
  EXPECT_EQ(second->stats().corpus_average_length,
            whole->stats().corpus_average_length);
  std::map<int64_t, float> merged;
  for (const TextHit& hit : Search(*first, "fox dog brown file", 10)) {
    merged[hit.row] = hit.score;
  }
  for (const TextHit& hit : Search(*second, "fox dog brown file", 10)) {
    merged[hit.row + 4] = hit.score;
  }
  const std::vector<TextHit> all = Search(*whole, "fox dog brown file", 10);
  ASSERT_EQ(merged.size(), all.size());
  for (const TextHit& hit : all) EXPECT_EQ(merged[hit.row], hit.score);
}

TEST(TextIndex, RefusesDamagedFilesAndFilesOfAnotherIndex) {
  TempDir tmp;
  std::unique_ptr<TextCorpus> corpus = Corpus();
  const std::string path = tmp.path("i.text");
  ASSERT_TRUE(corpus->Write(path, 0, corpus->rows()).ok());
  absl::StatusOr<std::unique_ptr<TextIndex>> other =
      TextIndex::Open(path, corpus->rows() + 1, true);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(), HasSubstr("not of one version"));

  FlipByteFromEnd(path, 3);  // an impact
  absl::StatusOr<std::unique_ptr<TextIndex>> flipped =
      TextIndex::Open(path, corpus->rows(), true);
  ASSERT_FALSE(flipped.ok());
  EXPECT_EQ(flipped.status().code(), absl::StatusCode::kDataLoss);
  // Unverified, it opens; VerifyChecksum() finds it.
  absl::StatusOr<std::unique_ptr<TextIndex>> unverified =
      TextIndex::Open(path, corpus->rows(), false);
  ASSERT_TRUE(unverified.ok());
  EXPECT_EQ((*unverified)->VerifyChecksum().code(),
            absl::StatusCode::kDataLoss);

  const std::string contents = ReadFile(path);
  WriteFile(path, contents.substr(0, contents.size() - 4));
  absl::StatusOr<std::unique_ptr<TextIndex>> truncated =
      TextIndex::Open(path, corpus->rows(), false);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  PokeByte(path, 0, 'X');
  EXPECT_EQ(TextIndex::Open(path, corpus->rows(), false).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(TextIndex, QueriesGoThroughTheStemmerTheRowsWentThrough) {
  TempDir tmp;
  TextIndexOptions options;
  options.field = "text";
  options.analyzer.stemmer = "english";
  absl::StatusOr<std::unique_ptr<TextCorpus>> corpus =
      TextCorpus::Create(options);
  ASSERT_TRUE(corpus.ok());
  (*corpus)->AddRow("the printers were running");
  (*corpus)->AddRow("a printed page");
  (*corpus)->AddRow("nothing here");
  std::unique_ptr<TextIndex> index =
      WriteAndOpen(**corpus, tmp.path("s.text"), 0, 3);
  EXPECT_EQ(index->stats().stemmer, "english");
  EXPECT_EQ(index->analyzer().Describe(),
            "icu nfkc_cf words, cjk 1+2-grams, snowball english");
  // "runs" and "running" both stem to "run"; "printing" and "printed" to
  // "print" (and "printers" to "printer").
  const std::vector<TextHit> runs = Search(*index, "runs", 3);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].row, 0);
  const std::vector<TextHit> printing = Search(*index, "printing", 3);
  ASSERT_EQ(printing.size(), 1u);
  EXPECT_EQ(printing[0].row, 1);
}

TEST(TextIndex, OptionsOutOfRangeAreRefusedNamingTheFlag) {
  TextIndexOptions options;
  options.field = "text";
  options.b = 1.5;
  EXPECT_THAT(TextCorpus::Create(options).status().message(),
              HasSubstr("--bm25_b=1.5"));
  options.b = 0.75;
  options.k1 = -1;
  EXPECT_THAT(TextCorpus::Create(options).status().message(),
              HasSubstr("--bm25_k1=-1"));
  options.k1 = 1.2;
  options.field = "";
  EXPECT_FALSE(TextCorpus::Create(options).ok());
}

std::unique_ptr<PayloadFile> Payloads(const TempDir& tmp,
                                      const std::vector<std::string>& lines) {
  const std::string path = tmp.path("p.payloads");
  absl::StatusOr<std::unique_ptr<PayloadFileWriter>> writer =
      PayloadFileWriter::Create(path);
  EXPECT_TRUE(writer.ok());
  for (const std::string& line : lines) {
    EXPECT_TRUE((*writer)->AppendJsonLine(line).ok()) << line;
  }
  EXPECT_TRUE((*writer)->Finish().ok());
  absl::StatusOr<std::unique_ptr<PayloadFile>> file =
      PayloadFile::Open(path, static_cast<int64_t>(lines.size()), true);
  EXPECT_TRUE(file.ok());
  return std::move(*file);
}

TEST(ReadTextCorpus, ReadsStringsArraysAndMissingFields) {
  TempDir tmp;
  std::unique_ptr<PayloadFile> payloads =
      Payloads(tmp, {R"({"body":"red apple","n":1})", R"({"n":2})",
                     R"({"body":["green","apple pie"]})", R"({"body":null})"});
  TextIndexOptions options;
  options.field = "body";
  const PayloadFile* files[] = {payloads.get()};
  absl::StatusOr<std::unique_ptr<TextCorpus>> corpus =
      ReadTextCorpus(files, options);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ((*corpus)->rows(), 4);
  ASSERT_TRUE((*corpus)->Write(tmp.path("t"), 0, 4).ok());
  absl::StatusOr<std::unique_ptr<TextIndex>> index =
      TextIndex::Open(tmp.path("t"), 4, true);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ((*index)->stats().empty_rows, 2);
  EXPECT_EQ((*index)->stats().field, "body");
  std::vector<TextHit> hits = Search(**index, "apple", 10);
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(hits[0].row + hits[1].row, 2);  // rows 0 and 2
}

TEST(ReadTextCorpus, RefusesNonTextValuesAndAnUnknownField) {
  TempDir tmp;
  std::unique_ptr<PayloadFile> payloads =
      Payloads(tmp, {R"({"body":"a"})", R"({"body":42})"});
  const PayloadFile* files[] = {payloads.get()};
  TextIndexOptions options;
  options.field = "body";
  absl::StatusOr<std::unique_ptr<TextCorpus>> number =
      ReadTextCorpus(files, options);
  ASSERT_FALSE(number.ok());
  EXPECT_THAT(number.status().message(), HasSubstr("row 1"));
  EXPECT_THAT(number.status().message(), HasSubstr("42"));
  options.field = "title";
  absl::StatusOr<std::unique_ptr<TextCorpus>> unknown =
      ReadTextCorpus(files, options);
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("fields: body"));
}

}  // namespace
}  // namespace knnd

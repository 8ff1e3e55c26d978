// knnctl update as a user runs it (src/tools/knnctl/update.cc): the
// daily workflow of build, update, publish and shard; what the report
// names (the ids to delete the base did not hold); the ids it refuses;
// the texts of the rows it adds or upserts (--text_file).
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/vector_io.h"
#include "knnd/storage/version_manifest.h"
#include "testing/knnctl_run.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::CommandResult;
using ::knnd::testing::Knnctl;
using ::knnd::testing::MakeData;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::knnd::testing::WriteIdsNpy;
using ::testing::HasSubstr;
using ::testing::Not;

void WriteData(const std::string& path, int64_t rows, int dim, uint32_t seed) {
  Matrix m;
  m.rows = rows;
  m.dim = dim;
  m.values = MakeData(rows, dim, seed);
  ASSERT_TRUE(WriteVectors(path, m).ok());
}

// The daily workflow: build, update with deletions and additions, publish
// the new version (publish loads and checks it with its id table and
// vectors) and split it into shards; the report names what it did and
// whether a retrain is due.
TEST(KnnctlUpdate, PublishesAndShardsLikeABuild) {
  TempDir dir;
  WriteData(dir.path("base.npy"), 3000, 32, 51);
  WriteData(dir.path("delta.npy"), 30, 32, 52);
  ASSERT_EQ(Knnctl(absl::StrCat("build --input ", dir.path("base.npy"),
                                " --output ", dir.path("v1.index")))
                .exit_code,
            0);
  WriteIdsNpy(dir.path("delete.npy"), {0, 7, 2999, 123456});
  CommandResult update = Knnctl(absl::StrCat(
      "update --base ", dir.path("v1.index"), " --output ",
      dir.path("v2.index"), " --input ", dir.path("delta.npy"), " --delete ",
      dir.path("delete.npy"), " --recall_queries 20"));
  ASSERT_EQ(update.exit_code, 0) << update.output;
  EXPECT_THAT(update.output,
              HasSubstr("2997 kept, 0 upserted (replaced in place), 30 "
                        "added, 3 deleted\nabsent:   1 ids to delete were "
                        "not in the base: 123456\n"));
  EXPECT_THAT(update.output, HasSubstr("v2.index.ids"));
  EXPECT_THAT(update.output, HasSubstr("drift:    PQ error"));
  EXPECT_THAT(update.output, HasSubstr("recall@10"));
  EXPECT_THAT(update.output, HasSubstr("retrain:"));
  // The build recorded its trained reference; the update compared with it
  // and carried it on (update_drift_test.cc has the rules).
  EXPECT_THAT(update.output,
              HasSubstr("drift:    PQ error (trained -> delta)"));
  EXPECT_THAT(update.output,
              HasSubstr("since training: 30 rows added, 3 deleted"));
  CommandResult published =
      Knnctl(absl::StrCat("publish --index ", dir.path("v2.index"), " --dir ",
                          dir.path("versions")));
  EXPECT_EQ(published.exit_code, 0) << published.output;
  auto meta = ReadIndexMetadata(MetadataPath(dir.path("v2.index")));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->ntotal(), 3027);
  EXPECT_TRUE(meta->id_table());
  EXPECT_THAT(meta->built_by(), HasSubstr("knnctl update"));
  auto built = ReadIndexMetadata(MetadataPath(dir.path("v1.index")));
  ASSERT_TRUE(built.ok()) << built.status();
  ASSERT_TRUE(built->has_trained());
  EXPECT_EQ(built->trained().ntotal(), 3000);
  EXPECT_GT(built->trained().pq_error(), 0);
  EXPECT_EQ(meta->trained().SerializeAsString(),
            built->trained().SerializeAsString());
  EXPECT_EQ(meta->rows_added_since_training(), 30);
  EXPECT_EQ(meta->rows_deleted_since_training(), 3);
  CommandResult shard = Knnctl(
      absl::StrCat("shard --index ", dir.path("v2.index"), " --shards 2"));
  EXPECT_EQ(shard.exit_code, 0) << shard.output;
  EXPECT_THAT(shard.output, HasSubstr("with its .ids"));
  // A shard is not updated; the whole index is, then split again.
  CommandResult of_shard = Knnctl(absl::StrCat(
      "update --base ", dir.path("v2.index.shard-0-of-2"), " --output ",
      dir.path("v3.index"), " --delete ", dir.path("delete.npy")));
  EXPECT_EQ(of_shard.exit_code, 2);
  EXPECT_THAT(of_shard.output, HasSubstr("update the whole index"));
}

// update --attributes: the input's rows take the file's attributes, the
// base's keep theirs, a column the base lacks is named in the report; a
// base with attributes needs the flag with --input, and the flag --input.
TEST(KnnctlUpdate, CarriesAttributes) {
  TempDir dir;
  WriteData(dir.path("base.npy"), 3000, 32, 53);
  WriteData(dir.path("delta.npy"), 2, 32, 54);
  std::string lines;
  for (int row = 0; row < 3000; ++row) {
    lines += absl::StrCat("{\"genre\": \"", row % 2 ? "a" : "b", "\"}\n");
  }
  WriteFile(dir.path("attrs.jsonl"), lines);
  const std::string v1 = dir.path("v1.index");
  const std::string v2 = dir.path("v2.index");
  ASSERT_EQ(Knnctl(absl::StrCat("build --input ", dir.path("base.npy"),
                                " --attributes ", dir.path("attrs.jsonl"),
                                " --output ", v1))
                .exit_code,
            0);
  WriteFile(dir.path("delta.jsonl"),
            "{\"genre\": \"c\", \"color\": \"red\"}\n{}\n");
  WriteIdsNpy(dir.path("delete.npy"), {0});
  const std::string update =
      absl::StrCat("update --base ", v1, " --output ", v2, " --delete ",
                   dir.path("delete.npy"), " --recall_queries 0");
  CommandResult missing =
      Knnctl(absl::StrCat(update, " --input ", dir.path("delta.npy")));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.output, HasSubstr("rows with --attributes"));
  CommandResult no_input =
      Knnctl(absl::StrCat(update, " --attributes ", dir.path("delta.jsonl")));
  EXPECT_EQ(no_input.exit_code, 2);
  EXPECT_THAT(no_input.output, HasSubstr("give --input too"));
  CommandResult done =
      Knnctl(absl::StrCat(update, " --input ", dir.path("delta.npy"),
                          " --attributes ", dir.path("delta.jsonl")));
  ASSERT_EQ(done.exit_code, 0) << done.output;
  EXPECT_THAT(done.output, HasSubstr(v2 + ".attrs (2 attribute columns"));
  EXPECT_THAT(done.output, HasSubstr("attribute: \"color\" is new"));
  CommandResult info = Knnctl("info --index " + v2);
  EXPECT_THAT(info.output, HasSubstr("genre          keyword, 3 distinct"));
}

// DIR/v1.index: 2,000 x 16 seeded rows with row ids 0..1999.
std::string BuildBase(const TempDir& dir, uint32_t seed) {
  WriteData(dir.path("base.npy"), 2000, 16, seed);
  const std::string v1 = dir.path("v1.index");
  const CommandResult built = Knnctl(absl::StrCat(
      "build --input ", dir.path("base.npy"), " --nlist 16 --output ", v1));
  EXPECT_EQ(built.exit_code, 0) << built.output;
  return v1;
}

// An id below 0 in --delete or --ids is refused before anything is
// written, naming the flag's file, the row and the id, as build refuses
// one in its --ids (one check: CheckIdsNonNegative).
TEST(KnnctlUpdate, RefusesNegativeIdsNamingTheFileTheRowAndTheId) {
  TempDir dir;
  const std::string v1 = BuildBase(dir, 61);
  WriteData(dir.path("delta.npy"), 3, 16, 62);
  const std::string update =
      absl::StrCat("update --base ", v1, " --output ", dir.path("v2.index"),
                   " --recall_queries 0");
  WriteIdsNpy(dir.path("delete.npy"), {4, 9, -7, 12});
  CommandResult deletion =
      Knnctl(absl::StrCat(update, " --delete ", dir.path("delete.npy")));
  EXPECT_EQ(deletion.exit_code, 2);
  EXPECT_THAT(deletion.output, HasSubstr(absl::StrCat(
                                   "knnctl: --delete ", dir.path("delete.npy"),
                                   ": row 2 holds id -7, which is negative; "
                                   "ids must be >= 0")));
  WriteIdsNpy(dir.path("ids.npy"), {5000, -1, 5002});
  CommandResult input =
      Knnctl(absl::StrCat(update, " --input ", dir.path("delta.npy"), " --ids ",
                          dir.path("ids.npy")));
  EXPECT_EQ(input.exit_code, 2);
  EXPECT_THAT(input.output, HasSubstr(absl::StrCat(
                                dir.path("ids.npy"),
                                ": row 1 holds id -1, which is negative")));
  for (const CommandResult& refused : {deletion, input}) {
    EXPECT_THAT(refused.output, Not(HasSubstr("wrote:")));
  }
  EXPECT_THAT(VersionFilesPresent(dir.path("v2.index")), ::testing::IsEmpty());
  EXPECT_NE(access(dir.path("v2.index").c_str(), F_OK), 0);
}

// The ids to delete that the base does not hold are named on one line:
// the first 20, ascending, then how many more; none, no line.
TEST(KnnctlUpdate, NamesTheIdsToDeleteTheBaseDidNotHold) {
  TempDir dir;
  const std::string v1 = BuildBase(dir, 63);
  // 25 absent ids (5000..5024, given in descending order) and two present.
  std::vector<int64_t> deletions = {17, 1999};
  for (int64_t id = 5024; id >= 5000; --id) deletions.push_back(id);
  WriteIdsNpy(dir.path("delete.npy"), deletions);
  CommandResult update = Knnctl(absl::StrCat(
      "update --base ", v1, " --output ", dir.path("v2.index"), " --delete ",
      dir.path("delete.npy"), " --recall_queries 0"));
  ASSERT_EQ(update.exit_code, 0) << update.output;
  EXPECT_THAT(update.output, HasSubstr("1998 kept, 0 upserted (replaced in "
                                       "place), 0 added, 2 deleted\n"));
  std::string named;
  for (int64_t id = 5000; id < 5020; ++id) {
    absl::StrAppend(&named, named.empty() ? "" : ", ", id);
  }
  EXPECT_THAT(update.output,
              HasSubstr(absl::StrCat("absent:   25 ids to delete were not in "
                                     "the base: ",
                                     named, " and 5 more\n")));
  WriteIdsNpy(dir.path("present.npy"), {3});
  CommandResult present = Knnctl(absl::StrCat(
      "update --base ", v1, " --output ", dir.path("v3.index"), " --delete ",
      dir.path("present.npy"), " --recall_queries 0"));
  ASSERT_EQ(present.exit_code, 0) << present.output;
  EXPECT_THAT(present.output, Not(HasSubstr("absent:")));
}

// update --text_file: line i is the text of --input's row i, joined to its
// payload as the base's text field, so that BM25 finds the added rows'
// texts and the upserted row's new text, and no longer its old one; the
// kept rows keep theirs. Refused, naming the file, with a base without a
// text index, a line count other than the rows', a payload already
// holding the field, another --text field, or no --input.
TEST(KnnctlUpdate, TextFileGivesTheTextsOfTheRowsItAddsOrUpserts) {
  TempDir dir;
  const int rows = 300;
  WriteData(dir.path("base.npy"), rows, 8, 65);
  std::string texts;
  for (int i = 0; i < rows; ++i)
    absl::StrAppend(&texts, "word", i, " common\n");
  WriteFile(dir.path("t.txt"), texts);
  const std::string v1 = dir.path("v1.index");
  const std::string build = absl::StrCat("build --input ", dir.path("base.npy"),
                                         " --nlist 4 --output ");
  const CommandResult built = Knnctl(
      absl::StrCat(build, v1, " --text body --text_file ", dir.path("t.txt")));
  ASSERT_EQ(built.exit_code, 0) << built.output;
  // Row 5 is upserted, 1000 and 1001 added.
  WriteData(dir.path("delta.npy"), 3, 8, 66);
  WriteIdsNpy(dir.path("ids.npy"), {5, 1000, 1001});
  WriteFile(dir.path("delta.txt"),
            "replaced zeppelin\nzeppelin alpha\nzeppelin beta\n");
  WriteFile(dir.path("delta.jsonl"), "{\"page\":1}\n{\"page\":2}\n{}\n");
  const std::string v2 = dir.path("v2.index");
  const std::string update = absl::StrCat(
      "update --base ", v1, " --output ", v2, " --recall_queries 0 --input ",
      dir.path("delta.npy"), " --ids ", dir.path("ids.npy"), " --payloads ",
      dir.path("delta.jsonl"), " ");
  const CommandResult done = Knnctl(
      absl::StrCat(update, "--text body --text_file ", dir.path("delta.txt")));
  ASSERT_EQ(done.exit_code, 0) << done.output;
  EXPECT_THAT(done.output,
              HasSubstr("1 upserted (replaced in place), 2 added"));
  EXPECT_THAT(done.output,
              HasSubstr(absl::StrCat("--text_file ", dir.path("delta.txt"),
                                     "'s lines as field \"body\"")));
  EXPECT_THAT(done.output,
              HasSubstr(absl::StrCat("wrote:    ", v2,
                                     ".text (BM25 postings of payload field "
                                     "\"body\"")));

  // Each query's one label: the id whose text holds its word.
  const auto score = [&](const std::string& name,
                         const std::vector<std::pair<std::string, int>>& qs) {
    std::string queries, labels;
    for (const auto& [text, id] : qs) {
      absl::StrAppend(&queries, text, "\n");
      absl::StrAppend(&labels, "[", id, "]\n");
    }
    WriteFile(dir.path(name + ".txt"), queries);
    WriteFile(dir.path(name + ".jsonl"), labels);
    const CommandResult eval = Knnctl(
        absl::StrCat("eval --index ", v2, " --texts ", dir.path(name + ".txt"),
                     " --window 10 --labels ", dir.path(name + ".jsonl")));
    EXPECT_EQ(eval.exit_code, 0) << eval.output;
    return eval.output;
  };
  EXPECT_THAT(score("found", {{"alpha", 1000},
                              {"beta", 1001},
                              {"replaced", 5},
                              {"word6", 6},
                              {"word299", 299}}),
              ::testing::ContainsRegex("bm25 +1\\.0000 +1\\.0000 +1\\.0000"));
  EXPECT_THAT(score("gone", {{"word5", 5}}),
              ::testing::ContainsRegex("bm25 +0\\.0000 +0\\.0000 +0\\.0000"));
  // Nothing of the joined payloads is left beside the versions.
  for (const auto& entry : std::filesystem::directory_iterator(dir.dir())) {
    EXPECT_THAT(entry.path().string(), Not(HasSubstr("text-input")));
  }

  const std::string v3 = dir.path("v3.index");
  const std::string refused_update = absl::StrCat(
      "update --base ", v1, " --output ", v3, " --recall_queries 0 --input ",
      dir.path("delta.npy"), " --ids ", dir.path("ids.npy"), " ");
  WriteFile(dir.path("short.txt"), "one\ntwo\n");
  WriteFile(dir.path("holds.jsonl"), "{}\n{\"body\":\"x\"}\n{}\n");
  const std::string plain = dir.path("plain.index");
  ASSERT_EQ(Knnctl(build + plain).exit_code, 0);
  WriteIdsNpy(dir.path("delete.npy"), {1});
  const std::vector<std::pair<std::string, std::string>> refusals = {
      {absl::StrCat("update --base ", plain, " --output ", v3,
                    " --recall_queries 0 --input ", dir.path("delta.npy"),
                    " --text_file ", dir.path("delta.txt")),
       absl::StrCat("--text_file ", dir.path("delta.txt"), ": the base ", plain,
                    " has no text index")},
      {absl::StrCat(refused_update, "--text_file ", dir.path("short.txt")),
       absl::StrCat("--text_file ", dir.path("short.txt"),
                    " has 2 lines for 3 rows")},
      {absl::StrCat(refused_update, "--payloads ", dir.path("holds.jsonl"),
                    " --text_file ", dir.path("delta.txt")),
       absl::StrCat("--payloads ", dir.path("holds.jsonl"),
                    " line 2 already holds \"body\"")},
      {absl::StrCat(refused_update, "--text page --text_file ",
                    dir.path("delta.txt")),
       absl::StrCat("--text page: the text index of the base ", v1,
                    " is of payload field \"body\"")},
      {absl::StrCat(refused_update, "--text body"),
       "--text body names the field of --text_file's lines"},
      {absl::StrCat("update --base ", v1, " --output ", v3, " --delete ",
                    dir.path("delete.npy"), " --text_file ",
                    dir.path("delta.txt")),
       absl::StrCat("--text_file ", dir.path("delta.txt"),
                    " holds the texts of --input's rows; give --input too")},
  };
  for (const auto& [command, message] : refusals) {
    const CommandResult refused = Knnctl(command);
    EXPECT_EQ(refused.exit_code, 2) << command << "\n" << refused.output;
    EXPECT_THAT(refused.output, HasSubstr(message)) << command;
  }
  EXPECT_THAT(VersionFilesPresent(v3), ::testing::IsEmpty());
  for (const auto& entry : std::filesystem::directory_iterator(dir.dir())) {
    EXPECT_THAT(entry.path().string(), Not(HasSubstr("text-input")));
  }
}

}  // namespace
}  // namespace knnd

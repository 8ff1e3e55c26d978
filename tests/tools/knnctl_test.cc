// knnctl as a user runs it: the binary, its output and its exit codes.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/vector_io.h"
#include "testing/knnctl_run.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::CommandResult;
using ::knnd::testing::FreePort;
using ::knnd::testing::Knnctl;
using ::knnd::testing::MakeData;
using ::knnd::testing::ReadFile;
using ::knnd::testing::ReferenceSearch;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::knnd::testing::WriteIdsNpy;
using ::testing::HasSubstr;
using ::testing::Not;

Matrix WriteData(const std::string& path, int64_t rows, int dim,
                 uint32_t seed) {
  Matrix m;
  m.rows = rows;
  m.dim = dim;
  m.values = MakeData(rows, dim, seed);
  EXPECT_TRUE(WriteVectors(path, m).ok());
  return m;
}

TEST(Knnctl, ExitCodes) {
  TempDir dir;
  WriteData(dir.path("x.npy"), 2000, 16, 3);
  EXPECT_EQ(Knnctl("").exit_code, 2);
  EXPECT_EQ(Knnctl("frobnicate").exit_code, 2);

  CommandResult no_output = Knnctl(absl::StrCat("build --input ", dir.path("x.npy")));
  EXPECT_EQ(no_output.exit_code, 2);
  EXPECT_THAT(no_output.output, HasSubstr("--output"));

  CommandResult fast_scan = Knnctl(absl::StrCat("build --input ", dir.path("x.npy"),
                                      " --output ", dir.path("x.index"),
                                      " --factory IVF16,PQ4x4fs_64"));
  EXPECT_EQ(fast_scan.exit_code, 2);
  EXPECT_THAT(fast_scan.output, HasSubstr("32-vector blocks"));
  EXPECT_FALSE(std::ifstream(dir.path("x.index")).good());

  CommandResult bad_m = Knnctl(absl::StrCat("build --input ", dir.path("x.npy"),
                                  " --output ", dir.path("x.index"), " --m 5"));
  EXPECT_EQ(bad_m.exit_code, 2);
  EXPECT_THAT(bad_m.output, HasSubstr("--m=5 does not divide dim=16"));

  CommandResult bad_recipe = Knnctl(absl::StrCat(
      "build --input ", dir.path("x.npy"), " --output ", dir.path("x.index"),
      " --recipe pq4"));
  EXPECT_EQ(bad_recipe.exit_code, 2);
  EXPECT_THAT(bad_recipe.output,
              HasSubstr("--recipe=pq4 is not fastscan or pq8"));
  CommandResult both = Knnctl(absl::StrCat(
      "build --input ", dir.path("x.npy"), " --output ", dir.path("x.index"),
      " --recipe pq8 --factory IVF16,PQ4"));
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.output, HasSubstr("either --factory or --recipe"));
  EXPECT_FALSE(std::ifstream(dir.path("x.index")).good());

  CommandResult missing = Knnctl(absl::StrCat("build --input ", dir.path("none.npy"),
                                    " --output ", dir.path("x.index")));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.output, HasSubstr("none.npy"));

  // --nlist and --m apply to the recipe: 4-bit FastScan by default, 8-bit
  // PQ with --recipe pq8.
  CommandResult built = Knnctl(absl::StrCat("build --input ", dir.path("x.npy"),
                                  " --output ", dir.path("x.index"),
                                  " --nlist 16 --m 4"));
  EXPECT_EQ(built.exit_code, 0) << built.output;
  CommandResult info = Knnctl(absl::StrCat("info --index ", dir.path("x.index")));
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_THAT(info.output, HasSubstr("IVF16,PQ4x4fs"));
  CommandResult pq8 = Knnctl(absl::StrCat("build --input ", dir.path("x.npy"),
                                          " --output ", dir.path("x.index"),
                                          " --recipe pq8 --nlist 16 --m 4"));
  EXPECT_EQ(pq8.exit_code, 0) << pq8.output;
  EXPECT_THAT(pq8.output, HasSubstr("factory:  IVF16,PQ4 (recipe pq8"));
  EXPECT_THAT(Knnctl(absl::StrCat("info --index ", dir.path("x.index"))).output,
              Not(HasSubstr("x4fs")));

  CommandResult no_truth = Knnctl(absl::StrCat("eval --index ", dir.path("x.index"),
                                     " --queries ", dir.path("x.npy")));
  EXPECT_EQ(no_truth.exit_code, 2);
  EXPECT_THAT(no_truth.output, HasSubstr("--base"));

  // Nothing listens there: not serving.
  EXPECT_EQ(Knnctl(absl::StrCat("health --timeout_ms 500 --addr 127.0.0.1:",
                                FreePort()))
                .exit_code,
            1);
}

// knnctl health --wait asks again until knnd serves: started before
// anything listens on the port, it exits 0 once a server there has loaded
// its index; against nothing it gives up once the wait is over (exit 1);
// a wait out of range is refused (exit 2). What the README's step 3 pastes.
// build --text_file: each line becomes its row's payload field, beside
// --payloads' own, and is indexed; eval --labels then scores BM25 on
// labels (answer ids, or a payload field) with what each query must find.
TEST(Knnctl, BuildTextFromATextFileAndEvalAgainstLabels) {
  TempDir dir;
  const int rows = 300;
  WriteData(dir.path("x.npy"), rows, 8, 5);
  std::string texts, payloads;
  for (int i = 0; i < rows; ++i) {
    texts += absl::StrCat("word", i, " common ", i % 2 ? "odd" : "even", "\n");
    payloads += absl::StrCat("{\"page\":", i / 3, "}\n");
  }
  testing::WriteFile(dir.path("t.txt"), texts);
  testing::WriteFile(dir.path("short.txt"), "one line\n");
  testing::WriteFile(dir.path("p.jsonl"), payloads);
  const std::string build = absl::StrCat(
      "build --input ", dir.path("x.npy"), " --output ", dir.path("t.index"),
      " --nlist 4 --payloads ", dir.path("p.jsonl"), " ");
  CommandResult no_field = Knnctl(build + "--text_file " + dir.path("t.txt"));
  EXPECT_EQ(no_field.exit_code, 2);
  EXPECT_THAT(no_field.output, HasSubstr("needs --text FIELD"));
  CommandResult short_file =
      Knnctl(build + "--text body --text_file " + dir.path("short.txt"));
  EXPECT_EQ(short_file.exit_code, 2);
  EXPECT_THAT(short_file.output, HasSubstr("has 1 lines for 300 rows"));
  CommandResult taken =
      Knnctl(build + "--text page --text_file " + dir.path("t.txt"));
  EXPECT_EQ(taken.exit_code, 2);
  EXPECT_THAT(taken.output, HasSubstr("line 1 already holds \"page\""));
  CommandResult built =
      Knnctl(build + "--text body --text_file " + dir.path("t.txt"));
  ASSERT_EQ(built.exit_code, 0) << built.output;
  EXPECT_THAT(built.output, HasSubstr("(--text_file "));
  // Nothing of the joined payloads is left beside the index.
  for (const auto& entry : std::filesystem::directory_iterator(dir.dir())) {
    EXPECT_THAT(entry.path().string(), Not(HasSubstr("text-input")));
  }

  // Query i: "wordI", which only row i holds; labelled with row i, then
  // with a row it does not hold (and a page it does).
  std::string queries, right, wrong, pages;
  for (int i = 0; i < 20; ++i) {
    queries += absl::StrCat("word", i * 7, "\n");
    right += absl::StrCat("[", i * 7, "]\n");
    wrong += absl::StrCat("[", i * 7 + 1, "]\n");
    pages += absl::StrCat("[", i * 7 / 3, "]\n");
  }
  testing::WriteFile(dir.path("q.txt"), queries);
  testing::WriteFile(dir.path("right.jsonl"), right);
  testing::WriteFile(dir.path("wrong.jsonl"), wrong);
  testing::WriteFile(dir.path("pages.jsonl"), pages);
  const std::string eval =
      absl::StrCat("eval --index ", dir.path("t.index"), " --texts ",
                   dir.path("q.txt"), " --window 10 --labels ");
  CommandResult perfect = Knnctl(eval + dir.path("right.jsonl"));
  ASSERT_EQ(perfect.exit_code, 0) << perfect.output;
  EXPECT_THAT(perfect.output,
              ::testing::ContainsRegex("bm25 +1\\.0000 +1\\.0000 +1\\.0000"));
  CommandResult none = Knnctl(eval + dir.path("wrong.jsonl"));
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_THAT(none.output,
              ::testing::ContainsRegex("bm25 +0\\.0000 +0\\.0000 +0\\.0000"));
  CommandResult by_page =
      Knnctl(eval + dir.path("pages.jsonl") + " --label_field page");
  ASSERT_EQ(by_page.exit_code, 0) << by_page.output;
  EXPECT_THAT(by_page.output, HasSubstr("labels: payload field page"));
  EXPECT_THAT(by_page.output,
              ::testing::ContainsRegex("bm25 +1\\.0000 +1\\.0000 +1\\.0000"));
  CommandResult both =
      Knnctl(eval + dir.path("right.jsonl") + " --base " + dir.path("x.npy"));
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.output, HasSubstr("give one or the other"));
  CommandResult bad_labels = Knnctl(eval + dir.path("q.txt"));
  EXPECT_EQ(bad_labels.exit_code, 2);
  EXPECT_THAT(bad_labels.output, HasSubstr("line 1: expected a JSON array"));
}

TEST(Knnctl, BuildTextRefusesBadInputBeforeTrainingAndAnalyzePrintsTerms) {
  TempDir dir;
  WriteData(dir.path("x.npy"), 600, 8, 3);
  std::string lines;
  for (int i = 0; i < 600; ++i) {
    lines += i % 5 == 0 ? "{\"n\":1}\n"
                        : absl::StrCat("{\"body\":\"row ", i, " 服务器\"}\n");
  }
  testing::WriteFile(dir.path("p.jsonl"), lines);
  const std::string build =
      absl::StrCat("build --input ", dir.path("x.npy"), " --output ",
                   dir.path("t.index"), " --nlist 4 ");
  CommandResult no_payloads = Knnctl(build + "--text body");
  EXPECT_EQ(no_payloads.exit_code, 2);
  EXPECT_THAT(no_payloads.output, HasSubstr("give --payloads or --text_file"));
  const std::string with_payloads =
      build + "--payloads " + dir.path("p.jsonl") + " ";
  CommandResult stemmer =
      Knnctl(with_payloads + "--text body --text_stemmer klingon");
  EXPECT_EQ(stemmer.exit_code, 2);
  EXPECT_THAT(stemmer.output, HasSubstr("klingon"));
  CommandResult b = Knnctl(with_payloads + "--text body --bm25_b 2");
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_THAT(b.output, HasSubstr("--bm25_b=2"));
  CommandResult field = Knnctl(with_payloads + "--text title");
  EXPECT_EQ(field.exit_code, 2);
  EXPECT_THAT(field.output, HasSubstr("fields: n, body"));
  EXPECT_FALSE(testing::ReadFile(dir.path("t.index")).size());
  CommandResult built = Knnctl(with_payloads + "--text body");
  ASSERT_EQ(built.exit_code, 0) << built.output;
  EXPECT_THAT(built.output, HasSubstr("t.index.text"));
  EXPECT_THAT(testing::ReadFile(dir.path("t.index.manifest.json")),
              HasSubstr("\"text\""));
  testing::WriteFile(dir.path("q.txt"), "Row 12 服务器\n\n");
  CommandResult analyzed = Knnctl(absl::StrCat(
      "analyze --index ", dir.path("t.index"), " --input ", dir.path("q.txt")));
  ASSERT_EQ(analyzed.exit_code, 0) << analyzed.output;
  EXPECT_EQ(analyzed.output,
            "[\"row\",\"12\",\"服\",\"服务\",\"务\",\"务器\",\"器\"]\n[]\n");
  EXPECT_THAT(Knnctl("analyze --list_stemmers").output, HasSubstr("english\n"));
}

TEST(Knnctl, HealthWaitPollsUntilKnndServes) {
  TempDir dir;
  knnd::testing::BuildSpec spec;
  spec.n = 2000;
  spec.d = 16;
  knnd::testing::BuildIndex(dir.path("x.index"), spec);
  const int port = FreePort();
  CommandResult waited;
  const absl::Time asked = absl::Now();
  std::thread health([&] {
    waited =
        Knnctl(absl::StrCat("health --wait 60 --timeout_ms 500 --addr "
                            "127.0.0.1:",
                            port));
  });
  absl::SleepFor(absl::Milliseconds(700));  // polled, refused, polled again
  knnd::v1::ServerConfig config =
      knnd::testing::TestConfig(dir.path("x.index"));
  config.set_listen_address(absl::StrCat("127.0.0.1:", port));
  knnd::testing::RunningServer server = knnd::testing::StartServer(config);
  health.join();
  ASSERT_NE(server.stub, nullptr);
  EXPECT_EQ(waited.exit_code, 0) << waited.output;
  EXPECT_THAT(waited.output, HasSubstr("SERVING"));
  EXPECT_GE(absl::Now() - asked, absl::Milliseconds(700));

  const absl::Time start = absl::Now();
  CommandResult nothing = Knnctl(absl::StrCat(
      "health --wait 1 --timeout_ms 500 --addr 127.0.0.1:", FreePort()));
  EXPECT_EQ(nothing.exit_code, 1) << nothing.output;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(800));
  CommandResult bad = Knnctl("health --wait -1 --addr 127.0.0.1:1");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output, HasSubstr("--wait=-1"));
}

constexpr const char* kCommands[] = {
    "build",  "convert", "shard",  "update", "analyze", "eval",   "tune",
    "search", "info",    "health", "get",    "publish", "reload", "versions"};

TEST(Knnctl, HelpListsEveryCommandAndExitsZero) {
  for (const char* help : {"--help", "help", "-h"}) {
    CommandResult usage = Knnctl(help);
    EXPECT_EQ(usage.exit_code, 0) << help << ": " << usage.output;
    for (const char* command : kCommands) {
      EXPECT_THAT(usage.output, HasSubstr(absl::StrCat("\n  ", command, " ")))
          << help;
    }
  }
  // Without a command the list goes to stderr and the exit code says the
  // call was wrong.
  CommandResult none = Knnctl("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.output, HasSubstr("  versions "));
  CommandResult version = Knnctl("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_THAT(version.output, HasSubstr("faiss 1.7.3"));
}

TEST(Knnctl, CommandHelpShowsOnlyThatCommandsFlagsAndExitsZero) {
  CommandResult build = Knnctl("build --help");
  EXPECT_EQ(build.exit_code, 0) << build.output;
  EXPECT_THAT(build.output,
              HasSubstr("usage: knnctl build --input FILE --output INDEX"));
  for (const char* flag : {"--input FILE", "--stored_nprobe N",
                           "--keep_vectors", "--threads N"}) {
    EXPECT_THAT(build.output, HasSubstr(flag));
  }
  for (const char* flag : {"--nprobes", "--refine_factors", "--ground_truth",
                           "--target_recall", "--addr", "--nprobe "}) {
    EXPECT_THAT(build.output, Not(HasSubstr(flag)));
  }
  // --help wins over the other arguments, whatever they are.
  EXPECT_EQ(Knnctl("build --input x --no_such_flag --help").output,
            build.output);
  EXPECT_EQ(Knnctl("help build").output, build.output);

  CommandResult eval = Knnctl("eval --help");
  EXPECT_EQ(eval.exit_code, 0);
  EXPECT_THAT(eval.output, HasSubstr("--nprobes LIST"));
  EXPECT_THAT(eval.output, Not(HasSubstr("--keep_vectors")));
  CommandResult search = Knnctl("search --help");
  EXPECT_EQ(search.exit_code, 0);
  EXPECT_THAT(search.output, HasSubstr("--nprobe N"));
  EXPECT_THAT(search.output, HasSubstr("(default localhost:50051)"));
  EXPECT_THAT(Knnctl("reload --help").output,
              HasSubstr("(default localhost:50052)"));
  for (const char* command : kCommands) {
    EXPECT_EQ(Knnctl(absl::StrCat(command, " --help")).exit_code, 0)
        << command;
  }
}

TEST(Knnctl, UnknownFlagsAndBadValuesExitTwoNamingTheFlagAndCommand) {
  // eval's sweep list and search's per-request nprobe are not build's.
  CommandResult nprobes = Knnctl("build --input x.npy --output x.index "
                                 "--nprobes 1,2");
  EXPECT_EQ(nprobes.exit_code, 2);
  EXPECT_THAT(nprobes.output,
              HasSubstr("knnctl build: unknown flag --nprobes"));
  EXPECT_THAT(nprobes.output, HasSubstr("knnctl build --help"));
  CommandResult keep = Knnctl("search --keep_vectors");
  EXPECT_EQ(keep.exit_code, 2);
  EXPECT_THAT(keep.output, HasSubstr("knnctl search: unknown flag --keep_vectors"));
  CommandResult value = Knnctl("build --input x.npy --output x.index "
                               "--nlist many");
  EXPECT_EQ(value.exit_code, 2);
  EXPECT_THAT(value.output, HasSubstr("--nlist=many is not"));
  CommandResult missing = Knnctl("eval --index");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.output, HasSubstr("--index needs a value"));
  CommandResult stray = Knnctl("versions localhost:50052");
  EXPECT_EQ(stray.exit_code, 2);
  EXPECT_THAT(stray.output, HasSubstr("'localhost:50052'"));
  CommandResult unknown = Knnctl("frobnicate");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.output, HasSubstr("unknown command 'frobnicate'"));
}

// docs/knnctl.md shows the --help output of knnctl and of every command,
// block by block (a block: text between blank lines), so the manual's
// flag lists are the binary's.
TEST(Knnctl, DocsShowEveryCommandsHelp) {
  std::ifstream in(absl::StrCat(KNND_SOURCE_DIR, "/docs/knnctl.md"));
  ASSERT_TRUE(in.good());
  const std::string docs(std::istreambuf_iterator<char>(in), {});
  std::vector<std::string> helps = {"--help"};
  for (const char* command : kCommands) {
    helps.push_back(absl::StrCat(command, " --help"));
  }
  for (const std::string& help : helps) {
    const std::string output = Knnctl(help).output;
    for (absl::string_view block : absl::StrSplit(output, "\n\n")) {
      block = absl::StripSuffix(block, "\n");
      EXPECT_TRUE(absl::StrContains(docs, block))
          << "docs/knnctl.md lacks this block of `knnctl " << help
          << "`:\n" << block;
    }
  }
}

// Parses eval's table: nprobe -> the recall@10 column.
std::map<int, double> Recall10Column(const std::string& output) {
  std::map<int, double> recall;
  int column = -1;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    std::vector<absl::string_view> cells =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!cells.empty() && cells[0] == "nprobe") {
      for (size_t i = 0; i < cells.size(); ++i) {
        if (cells[i] == "recall@10") column = static_cast<int>(i);
      }
      continue;
    }
    int nprobe;
    double value;
    if (column > 0 && cells.size() > static_cast<size_t>(column) &&
        absl::SimpleAtoi(cells[0], &nprobe) &&
        absl::SimpleAtod(cells[column], &value)) {
      recall[nprobe] = value;
    }
  }
  return recall;
}

TEST(Knnctl, EvalRecallEqualsAnIndependentComputation) {
  TempDir dir;
  const Matrix base = WriteData(dir.path("base.npy"), 3000, 16, 11);
  const Matrix queries = WriteData(dir.path("q.npy"), 200, 16, 12);
  // 8-bit PQ, which FAISS's own reader below reads; PQ order only.
  ASSERT_EQ(Knnctl(absl::StrCat("build --input ", dir.path("base.npy"),
                                " --output ", dir.path("x.index"),
                                " --recipe pq8 --nlist 32 --m 4"
                                " --keep_vectors=false"))
                .exit_code,
            0);
  CommandResult eval = Knnctl(absl::StrCat("eval --index ", dir.path("x.index"),
                                 " --queries ", dir.path("q.npy"), " --base ",
                                 dir.path("base.npy"),
                                 " --nprobes 1,4,32 --k 10"));
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  const std::map<int, double> printed = Recall10Column(eval.output);
  ASSERT_EQ(printed.size(), 3u) << eval.output;

  // Exact neighbours by a double-precision loop, approximate ones from
  // FAISS reading the file itself.
  std::vector<std::set<int64_t>> truth(queries.rows);
  for (int64_t q = 0; q < queries.rows; ++q) {
    std::vector<std::pair<double, int64_t>> all;
    for (int64_t b = 0; b < base.rows; ++b) {
      double d = 0;
      for (int j = 0; j < base.dim; ++j) {
        const double diff = queries.row(q)[j] - base.row(b)[j];
        d += diff * diff;
      }
      all.emplace_back(d, b);
    }
    std::partial_sort(all.begin(), all.begin() + 10, all.end());
    for (int j = 0; j < 10; ++j) truth[q].insert(all[j].second);
  }
  for (const auto& [nprobe, recall] : printed) {
    std::vector<float> distances;
    std::vector<int64_t> ids;
    ReferenceSearch(dir.path("x.index"), queries.values, 10, nprobe,
                    &distances, &ids);
    int64_t hits = 0;
    for (int64_t q = 0; q < queries.rows; ++q) {
      for (int j = 0; j < 10; ++j) hits += truth[q].count(ids[q * 10 + j]);
    }
    // The table prints 4 decimals; one neighbour of 2,000 is 0.0005.
    EXPECT_NEAR(recall, hits / 2000.0, 0.00051) << "nprobe " << nprobe;
  }
  EXPECT_LT(printed.at(1), printed.at(32));
  EXPECT_THAT(eval.output, HasSubstr("chosen nprobe:"));
}

// A build keeps INDEX.vectors by default, which knnd loads; eval sweeps
// refine_factor with nprobe and re-ranking lifts recall past what PQ alone
// reaches; a build with --keep_vectors=false removes a stale vectors file.
TEST(Knnctl, KeepVectorsAndEvalSweepsRefineFactors) {
  TempDir dir;
  WriteData(dir.path("base.npy"), 3000, 16, 11);
  WriteData(dir.path("q.npy"), 200, 16, 12);
  const std::string index = dir.path("x.index");
  const std::string build = absl::StrCat(
      "build --input ", dir.path("base.npy"), " --output ", index,
      " --recipe pq8 --nlist 32 --m 2");
  CommandResult built = Knnctl(build + " --vectors_dtype f16");
  ASSERT_EQ(built.exit_code, 0) << built.output;
  EXPECT_THAT(built.output, HasSubstr("x.index.vectors (f16"));
  struct stat st;
  ASSERT_EQ(stat((index + ".vectors").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 64 + 3000 * 16 * 2);

  CommandResult eval = Knnctl(absl::StrCat(
      "eval --index ", index, " --queries ", dir.path("q.npy"), " --base ",
      dir.path("base.npy"), " --nprobes 32 --refine_factors 0,16 --k 10",
      " --target_recall 0.99"));
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_THAT(eval.output, HasSubstr("refine"));
  // Rows: "32 0 r@1 r@10 ..." and "32 16 ...".
  std::map<int, double> recall10;
  int column = -1;
  for (absl::string_view line : absl::StrSplit(eval.output, '\n')) {
    std::vector<absl::string_view> cells =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!cells.empty() && cells[0] == "nprobe") {
      for (size_t i = 0; i < cells.size(); ++i) {
        if (cells[i] == "recall@10") column = static_cast<int>(i);
      }
      continue;
    }
    int nprobe, refine;
    double value;
    if (column > 0 && cells.size() > static_cast<size_t>(column) &&
        absl::SimpleAtoi(cells[0], &nprobe) &&
        absl::SimpleAtoi(cells[1], &refine) &&
        absl::SimpleAtod(cells[column], &value)) {
      recall10[refine] = value;
    }
  }
  ASSERT_EQ(recall10.size(), 2u) << eval.output;
  EXPECT_LT(recall10.at(0), 0.9) << eval.output;  // 2-byte PQ codes
  EXPECT_GT(recall10.at(16), recall10.at(0) + 0.2) << eval.output;
  EXPECT_THAT(eval.output, HasSubstr("chosen nprobe: 32 refine_factor: 16"));

  CommandResult info = Knnctl(absl::StrCat("info --index ", index));
  EXPECT_THAT(info.output, HasSubstr("raw vectors:     " + index +
                                     ".vectors (f16"));
  {
    knnd::testing::RunningServer server =
        knnd::testing::StartServer(knnd::testing::TestConfig(index));
    ASSERT_NE(server.stub, nullptr);
    CommandResult search = Knnctl(absl::StrCat(
        "search --addr ", server.address, " --random 3 --refine_factor 4"));
    EXPECT_EQ(search.exit_code, 0) << search.output;
    EXPECT_THAT(search.output, HasSubstr("refine_factor 4"));
  }

  CommandResult rebuilt = Knnctl(build + " --keep_vectors=false");
  ASSERT_EQ(rebuilt.exit_code, 0) << rebuilt.output;
  EXPECT_THAT(rebuilt.output, HasSubstr("removed:"));
  EXPECT_NE(stat((index + ".vectors").c_str(), &st), 0);
  CommandResult refused = Knnctl(absl::StrCat(
      "eval --index ", index, " --queries ", dir.path("q.npy"), " --base ",
      dir.path("base.npy"), " --refine_factors 4"));
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.output, HasSubstr("--keep_vectors"));
}

// With no recipe flags, build writes the default recipe: 4-bit FastScan
// (IVF<~sqrt N>,PQ<M>x4fs) with INDEX.vectors kept, and tuning it on held-out
// queries of the same clustered distribution finds a setting whose recall,
// measured here independently (IndexSnapshot and a brute-force loop),
// reaches 0.95. With --ids no vectors are kept (re-ranking needs row = id),
// and asking for them too is refused.
// `build --shards` and `build` followed by `shard` train the same
// quantizers from the same seed, so they write the same shard files: the
// index and vectors bytes are equal, and each sidecar names its part.
TEST(Knnctl, BuildShardsAndShardWriteTheSameShards) {
  TempDir dir;
  WriteData(dir.path("base.npy"), 3000, 32, 31);
  const std::string built = dir.path("built.index");
  const std::string whole = dir.path("whole.index");
  const std::string split = dir.path("split");
  CommandResult a = Knnctl(absl::StrCat("build --input ", dir.path("base.npy"),
                                        " --output ", built, " --shards 2"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_THAT(a.output, HasSubstr("(shard 1 of 2: ids [1500, 3000)"));
  CommandResult b = Knnctl(absl::StrCat("build --input ", dir.path("base.npy"),
                                        " --output ", whole));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  CommandResult c = Knnctl(
      absl::StrCat("shard --index ", whole, " --shards 2 --output ", split));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_THAT(c.output, HasSubstr("with its .vectors"));
  std::string build_id;
  for (int s = 0; s < 2; ++s) {
    const std::string x = absl::StrCat(built, ".shard-", s, "-of-2");
    const std::string y = absl::StrCat(split, ".shard-", s, "-of-2");
    EXPECT_EQ(ReadFile(x), ReadFile(y)) << s;
    EXPECT_EQ(ReadFile(x + ".vectors"),
              ReadFile(y + ".vectors")) << s;
    EXPECT_FALSE(ReadFile(x + ".vectors").empty());
    auto meta = ReadIndexMetadata(MetadataPath(x));
    ASSERT_TRUE(meta.ok()) << meta.status();
    EXPECT_EQ(meta->shard_id(), static_cast<uint32_t>(s));
    EXPECT_EQ(meta->shard_count(), 2u);
    EXPECT_EQ(meta->shard_first_id(), s * 1500);
    EXPECT_EQ(meta->shard_end_id(), (s + 1) * 1500);
    EXPECT_EQ(meta->ntotal(), 1500);
    if (s == 0) build_id = meta->build_id();
    EXPECT_EQ(meta->build_id(), build_id);
    auto split_meta = ReadIndexMetadata(MetadataPath(y));
    ASSERT_TRUE(split_meta.ok()) << split_meta.status();
    EXPECT_NE(split_meta->build_id(), build_id);  // another split
    EXPECT_THAT(split_meta->built_by(), HasSubstr("knnctl shard"));
  }
  // A shard is not split again; an 8-bit IVF-PQ index is not split.
  CommandResult again = Knnctl(
      absl::StrCat("shard --index ", built, ".shard-0-of-2 --shards 2"));
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_THAT(again.output, HasSubstr("is already shard 0 of 2"));
  CommandResult pq8 = Knnctl(absl::StrCat("build --input ",
                                          dir.path("base.npy"), " --output ",
                                          built, " --recipe pq8 --shards 2"));
  EXPECT_EQ(pq8.exit_code, 2);
  EXPECT_THAT(pq8.output, HasSubstr("--shards needs the fastscan recipe"));
  CommandResult many = Knnctl(
      absl::StrCat("shard --index ", whole, " --shards 3001"));
  EXPECT_EQ(many.exit_code, 2);
  EXPECT_THAT(many.output, HasSubstr("--shards=3001 is outside [1, 256]"));
}

// knnctl build streams its input (a mapped .npy, a .fvecs read in
// batches): the index it writes is the one an IndexBuilder fed the whole
// matrix in memory writes, byte for byte, and it reports its memory.
TEST(Knnctl, StreamedBuildEqualsTheInMemoryBuild) {
  TempDir dir;
  const Matrix x = WriteData(dir.path("base.npy"), 3000, 32, 41);
  ASSERT_TRUE(WriteVectors(dir.path("base.fvecs"), x).ok());
  const std::string flags =
      " --factory IVF32,PQ16x4fs --train_size 2000 --add_batch 700";
  for (const char* input : {"base.npy", "base.fvecs"}) {
    CommandResult run = Knnctl(absl::StrCat(
        "build --input ", dir.path(input), " --output ",
        dir.path(absl::StrCat(input, ".index")), flags));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr("peak RSS"));
    EXPECT_THAT(run.output, HasSubstr("model"));
  }
  // Against the in-memory build: trained on every row (so that both train
  // on the same rows without knnctl's sampler) and fed the same batches.
  CommandResult all = Knnctl(absl::StrCat(
      "build --input ", dir.path("base.npy"), " --output ",
      dir.path("all.index"),
      " --factory IVF32,PQ16x4fs --train_size 3000 --add_batch 700"));
  ASSERT_EQ(all.exit_code, 0) << all.output;
  IndexBuilder::Options options;
  options.dim = 32;
  options.factory = "IVF32,PQ16x4fs";
  auto builder = IndexBuilder::Create(options);
  ASSERT_TRUE(builder.ok()) << builder.status();
  ASSERT_TRUE((*builder)->Train(x.values.data(), x.rows).ok());
  for (int64_t begin = 0; begin < x.rows; begin += 700) {
    ASSERT_TRUE((*builder)
                    ->Add(x.row(begin), std::min<int64_t>(700, x.rows - begin),
                          nullptr)
                    .ok());
  }
  ASSERT_TRUE((*builder)
                  ->Write(dir.path("memory.index"), DefaultNprobe(32), {})
                  .ok());
  EXPECT_EQ(ReadFile(dir.path("all.index")), ReadFile(dir.path("memory.index")));
  EXPECT_EQ(ReadFile(dir.path("base.npy.index")),
            ReadFile(dir.path("base.fvecs.index")));
  EXPECT_EQ(ReadFile(dir.path("base.npy.index.vectors")),
            ReadFile(dir.path("base.fvecs.index.vectors")));
  EXPECT_FALSE(ReadFile(dir.path("base.npy.index.vectors")).empty());
}

TEST(Knnctl, DefaultBuildIsFastScanWithVectorsAndTunesToGoodRecall) {
  TempDir dir;
  constexpr int64_t kBase = 4000;
  constexpr int64_t kQueries = 200;
  constexpr int kDim = 64;
  const std::vector<float> all = MakeData(kBase + kQueries, kDim, 21);
  Matrix base;
  base.rows = kBase;
  base.dim = kDim;
  base.values.assign(all.begin(), all.begin() + kBase * kDim);
  Matrix queries;
  queries.rows = kQueries;
  queries.dim = kDim;
  queries.values.assign(all.begin() + kBase * kDim, all.end());
  ASSERT_TRUE(WriteVectors(dir.path("base.npy"), base).ok());
  ASSERT_TRUE(WriteVectors(dir.path("q.npy"), queries).ok());
  const std::string index = dir.path("x.index");

  CommandResult built = Knnctl(absl::StrCat(
      "build --input ", dir.path("base.npy"), " --output ", index));
  ASSERT_EQ(built.exit_code, 0) << built.output;
  // sqrt(4000) = 63 -> 64 lists; 64 dims -> 64 sub-vectors of 1 dim.
  EXPECT_THAT(built.output,
              HasSubstr("factory:  IVF64,PQ64x4fs (recipe fastscan"));
  EXPECT_THAT(built.output, HasSubstr("32 bytes per vector"));
  struct stat st;
  ASSERT_EQ(stat((index + ".vectors").c_str(), &st), 0) << built.output;
  EXPECT_EQ(st.st_size, 64 + kBase * kDim * 4);  // f32 rows and the header

  CommandResult tuned = Knnctl(absl::StrCat("tune --index ", index,
                                            " --queries ", dir.path("q.npy"),
                                            " --target_recall 0.95"));
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  auto meta = ReadIndexMetadata(MetadataPath(index));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->factory(), "IVF64,PQ64x4fs");
  ASSERT_GE(meta->tuned_nprobe(), 1u) << tuned.output;

  LoadOptions load;
  load.probe_in_subprocess = false;
  load.vectors = VectorsPolicy::kRequired;
  auto snapshot = IndexSnapshot::Load(index, load);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_THAT((*snapshot)->info().index_type, HasSubstr("x4fs"));
  EXPECT_TRUE((*snapshot)->info().has_vectors);
  std::vector<float> distances(kQueries * 10);
  std::vector<int64_t> ids(kQueries * 10);
  SearchArgs args;
  args.queries = queries.values.data();
  args.num_queries = kQueries;
  args.k = 10;
  args.nprobe = static_cast<int>(meta->tuned_nprobe());
  args.refine_factor = static_cast<int>(meta->tuned_refine_factor());
  args.distances = distances.data();
  args.ids = ids.data();
  ASSERT_TRUE((*snapshot)->Search(args).ok());
  const std::vector<int64_t> truth = knnd::testing::BruteForceNeighbors(
      base.values, queries.values, kDim, 10, Metric::kL2);
  int64_t hits = 0;
  for (int64_t q = 0; q < kQueries; ++q) {
    const std::set<int64_t> expected(truth.begin() + q * 10,
                                     truth.begin() + (q + 1) * 10);
    for (int j = 0; j < 10; ++j) hits += expected.count(ids[q * 10 + j]);
  }
  EXPECT_GE(hits / (kQueries * 10.0), 0.95)
      << "nprobe " << args.nprobe << " refine_factor " << args.refine_factor
      << "\n" << tuned.output;

}

// The recall@10 of every (nprobe, refine) row a tune prints.
std::map<std::pair<int, int>, double> TuneRows(const std::string& out) {
  std::map<std::pair<int, int>, double> rows;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    std::vector<std::string> cols =
        absl::StrSplit(line, ' ', absl::SkipWhitespace());
    int nprobe, refine;
    double recall;
    // nprobe, refine_factor, recall, its confidence bound, queries/s.
    if (cols.size() == 5 && absl::SimpleAtoi(cols[0], &nprobe) &&
        absl::SimpleAtoi(cols[1], &refine) &&
        absl::SimpleAtod(cols[2], &recall)) {
      rows[{nprobe, refine}] = recall;
    }
  }
  return rows;
}

// Own ids (7 * row + 3, and seeded 63-bit hashes in no order): the build
// writes INDEX.ids and keeps INDEX.vectors, knnd answers with the ids, and
// eval and tune measure exactly what they measure on the same build with
// row ids; bad ids are refused naming the file, the row and the id.
TEST(Knnctl, OwnIdsBuildEvalAndTuneLikeRowIds) {
  TempDir dir;
  constexpr int64_t kBase = 3000;
  WriteData(dir.path("base.npy"), kBase, 16, 11);
  WriteData(dir.path("q.npy"), 100, 16, 12);
  std::vector<int64_t> affine(kBase), hashes(kBase);
  std::mt19937_64 rng(5);
  for (int64_t row = 0; row < kBase; ++row) {
    affine[row] = 7 * row + 3;
    hashes[row] = static_cast<int64_t>(rng() >> 1);
  }
  WriteIdsNpy(dir.path("affine.npy"), affine);
  WriteIdsNpy(dir.path("hashes.npy"), hashes);
  const std::string build = absl::StrCat(
      "build --input ", dir.path("base.npy"), " --nlist 32 --m 16 --output ");
  const std::string rows = dir.path("rows.index");
  ASSERT_EQ(Knnctl(build + rows).exit_code, 0);
  std::string row_eval, row_tune;
  for (const auto& [name, ids] :
       {std::make_pair(std::string("affine"), &affine),
        std::make_pair(std::string("hashes"), &hashes)}) {
    const std::string index = dir.path(name + ".index");
    CommandResult built = Knnctl(absl::StrCat(
        build, index, " --ids ", dir.path(name + ".npy")));
    ASSERT_EQ(built.exit_code, 0) << built.output;
    EXPECT_THAT(built.output, HasSubstr(index + ".ids"));
    struct stat st;
    ASSERT_EQ(stat((index + ".vectors").c_str(), &st), 0) << built.output;
    ASSERT_EQ(stat((index + ".ids").c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 64 + 24 * kBase);
    auto meta = ReadIndexMetadata(MetadataPath(index));
    ASSERT_TRUE(meta.ok());
    EXPECT_TRUE(meta->id_table());
    // The same lists as the row-id build: row numbers.
    EXPECT_EQ(ReadFile(index), ReadFile(rows));

    const std::string sweep = absl::StrCat(
        " --queries ", dir.path("q.npy"), " --nprobes 1,4,32");
    CommandResult eval = Knnctl(absl::StrCat(
        "eval --index ", index, sweep, " --base ", dir.path("base.npy"),
        " --refine_factors 0,2"));
    ASSERT_EQ(eval.exit_code, 0) << eval.output;
    EXPECT_THAT(eval.output, HasSubstr("translated by the id table"));
    CommandResult tune = Knnctl(absl::StrCat(
        "tune --index ", index, sweep, " --refine_factors 0,2,4 "
        "--target_recall 0.99 --dry_run"));
    ASSERT_EQ(tune.exit_code, 0) << tune.output;
    if (row_eval.empty()) {
      CommandResult e = Knnctl(absl::StrCat(
          "eval --index ", rows, sweep, " --base ", dir.path("base.npy"),
          " --refine_factors 0,2"));
      CommandResult t = Knnctl(absl::StrCat(
          "tune --index ", rows, sweep, " --refine_factors 0,2,4 "
          "--target_recall 0.99 --dry_run"));
      row_eval = e.output;
      row_tune = t.output;
    }
    // Same recall at every setting: the lists are the same; only equal PQ
    // estimates at the edge of the candidates may be cut by id instead of
    // by row (one neighbour of 1,000 is 0.001).
    const std::map<std::pair<int, int>, double> own = TuneRows(tune.output);
    const std::map<std::pair<int, int>, double> by_row = TuneRows(row_tune);
    ASSERT_EQ(own.size(), by_row.size()) << tune.output << row_tune;
    ASSERT_GE(own.size(), 3u) << tune.output;
    EXPECT_GT(own.rbegin()->second, 0.9) << tune.output;  // nprobe 32
    for (const auto& [setting, recall] : own) {
      ASSERT_EQ(by_row.count(setting), 1u) << tune.output << row_tune;
      EXPECT_NEAR(recall, by_row.at(setting), 0.0051)
          << "nprobe " << setting.first << " refine " << setting.second;
    }
    const std::map<int, double> own_eval = Recall10Column(eval.output);
    const std::map<int, double> row_eval_recall = Recall10Column(row_eval);
    ASSERT_EQ(own_eval.size(), 3u) << eval.output;
    for (const auto& [nprobe, recall] : own_eval) {
      EXPECT_NEAR(recall, row_eval_recall.at(nprobe), 0.0051) << nprobe;
    }
    EXPECT_GT(own_eval.at(32), 0.9) << eval.output;
  }

  // Negative or repeated ids: refused naming the file, the row and the id.
  std::vector<int64_t> bad = affine;
  bad[17] = -4;
  WriteIdsNpy(dir.path("negative.npy"), bad);
  CommandResult negative = Knnctl(absl::StrCat(
      build, dir.path("bad.index"), " --ids ", dir.path("negative.npy")));
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_THAT(negative.output,
              HasSubstr(absl::StrCat(dir.path("negative.npy"),
                                     ": row 17 holds id -4")));
  bad[17] = affine[5];
  WriteIdsNpy(dir.path("repeated.npy"), bad);
  CommandResult repeated = Knnctl(absl::StrCat(
      build, dir.path("bad.index"), " --ids ", dir.path("repeated.npy")));
  EXPECT_EQ(repeated.exit_code, 2);
  EXPECT_THAT(repeated.output,
              HasSubstr(absl::StrCat(": row 17 holds id ", affine[5],
                                     ", which row 5 holds too")));

  // A later row-id build over the same path removes the stale id table.
  const std::string index = dir.path("affine.index");
  CommandResult rebuilt = Knnctl(build + index);
  ASSERT_EQ(rebuilt.exit_code, 0) << rebuilt.output;
  EXPECT_THAT(rebuilt.output, HasSubstr("removed:  " + index + ".ids"));
}

// build --shards and shard with own ids split rows, each shard with its
// slice of the id table, and write the same shards.
TEST(Knnctl, OwnIdsShardsCarryTheirSliceOfTheIdTable) {
  TempDir dir;
  WriteData(dir.path("base.npy"), 3000, 32, 31);
  std::vector<int64_t> ids(3000);
  for (int64_t row = 0; row < 3000; ++row) ids[row] = (2999 - row) * 1000;
  WriteIdsNpy(dir.path("ids.npy"), ids);
  const std::string common = absl::StrCat(
      "build --input ", dir.path("base.npy"), " --ids ", dir.path("ids.npy"));
  const std::string built = dir.path("built.index");
  const std::string whole = dir.path("whole.index");
  CommandResult a = Knnctl(absl::StrCat(common, " --output ", built,
                                        " --shards 2"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_THAT(a.output, HasSubstr("(shard 1 of 2: rows [1500, 3000)"));
  EXPECT_THAT(a.output, HasSubstr("with its .ids"));
  ASSERT_EQ(Knnctl(absl::StrCat(common, " --output ", whole)).exit_code, 0);
  CommandResult c = Knnctl(absl::StrCat("shard --index ", whole,
                                        " --shards 2 --output ",
                                        dir.path("split")));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  for (int s = 0; s < 2; ++s) {
    const std::string x = absl::StrCat(built, ".shard-", s, "-of-2");
    const std::string y = absl::StrCat(dir.path("split"), ".shard-", s, "-of-2");
    EXPECT_EQ(ReadFile(x + ".ids"), ReadFile(y + ".ids")) << s;
    EXPECT_EQ(ReadFile(x), ReadFile(y)) << s;
    LoadOptions load;
    load.probe_in_subprocess = false;
    auto shard = IndexSnapshot::Load(x, load);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_TRUE((*shard)->info().has_id_table);
    EXPECT_EQ((*shard)->info().shard_first_id, s * 1500);
    EXPECT_EQ((*shard)->IdOfRow(0), ids[s * 1500]);
    EXPECT_EQ((*shard)->IdOfRow(1499), ids[s * 1500 + 1499]);
  }
}

// --payloads: JSON Lines (objects and plain strings) become INDEX.payloads,
// served by the snapshot by id; shards get their rows' payloads, the same
// from build --shards as from shard; a bad line fails the build naming
// the file and line, before training.
TEST(Knnctl, PayloadsBuildAndShardWithTheirRows) {
  TempDir dir;
  WriteData(dir.path("base.npy"), 3000, 32, 33);
  std::string lines;
  for (int64_t row = 0; row < 3000; ++row) {
    absl::StrAppend(&lines, row % 3 == 0
                                ? absl::StrCat("\"text of ", row, "\"\n")
                                : absl::StrCat("{\"row\": ", row, "}\n"));
  }
  WriteFile(dir.path("payloads.jsonl"), lines);
  const std::string common =
      absl::StrCat("build --input ", dir.path("base.npy"), " --payloads ",
                   dir.path("payloads.jsonl"));
  const std::string whole = dir.path("whole.index");
  CommandResult a = Knnctl(absl::StrCat(common, " --output ", whole));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_THAT(a.output, HasSubstr("payloads: "));
  LoadOptions load;
  load.probe_in_subprocess = false;
  auto snapshot = IndexSnapshot::Load(whole, load);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE((*snapshot)->info().has_payloads);
  EXPECT_EQ((*snapshot)->info().payload_fields,
            (std::vector<std::string>{"text", "row"}));
  auto all = (*snapshot)->SelectPayloads(true, {});
  ASSERT_TRUE(all.ok());
  std::string json;
  (*snapshot)->AppendPayload(3, *all, &json);
  EXPECT_EQ(json, "{\"text\":\"text of 3\"}");
  json.clear();
  (*snapshot)->AppendPayload(2999, *all, &json);
  EXPECT_EQ(json, "{\"row\":2999}");

  const std::string built = dir.path("built.index");
  CommandResult b = Knnctl(absl::StrCat(common, " --output ", built,
                                        " --shards 2"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_THAT(b.output, HasSubstr("with its .payloads"));
  CommandResult c = Knnctl(absl::StrCat("shard --index ", whole,
                                        " --shards 2 --output ",
                                        dir.path("split")));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  for (int s = 0; s < 2; ++s) {
    const std::string x = absl::StrCat(built, ".shard-", s, "-of-2");
    const std::string y =
        absl::StrCat(dir.path("split"), ".shard-", s, "-of-2");
    EXPECT_EQ(ReadFile(x + ".payloads"), ReadFile(y + ".payloads")) << s;
    auto shard = IndexSnapshot::Load(x, load);
    ASSERT_TRUE(shard.ok()) << shard.status();
    auto fields = (*shard)->SelectPayloads(true, {});
    ASSERT_TRUE(fields.ok());
    json.clear();
    (*shard)->AppendPayload(s * 1500 + 1, *fields, &json);  // ids are rows
    EXPECT_EQ(json, absl::StrCat("{\"row\":", s * 1500 + 1, "}"));
  }

  // A rebuild without --payloads removes the old payloads.
  CommandResult d =
      Knnctl(absl::StrCat("build --input ", dir.path("base.npy"),
                          " --output ", whole));
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_THAT(d.output, HasSubstr("removed:  " + whole + ".payloads"));

  WriteFile(dir.path("bad.jsonl"), "{}\n[1, 2]\n");
  CommandResult e = Knnctl(absl::StrCat(
      "build --input ", dir.path("base.npy"), " --output ",
      dir.path("bad.index"), " --payloads ", dir.path("bad.jsonl")));
  EXPECT_EQ(e.exit_code, 2) << e.output;  // an invalid input
  EXPECT_THAT(e.output, HasSubstr(dir.path("bad.jsonl") + ":2: a payload is"));
  EXPECT_THAT(e.output, Not(HasSubstr("training")));
}

// --attributes: the columns are listed, written beside the index and
// sliced for shards (build --shards and shard write the same stores);
// mistakes stop the build naming the file, the line and the field.
TEST(Knnctl, AttributesBuildShardAndRefuseMistakes) {
  TempDir dir;
  WriteData(dir.path("base.npy"), 3000, 32, 31);
  std::string lines;
  for (int row = 0; row < 3000; ++row) {
    lines += absl::StrCat("{\"year\": ", 2000 + row % 25,
                          row % 3 == 0 ? "" : ", \"genre\": \"news\"",
                          ", \"tags\": [\"t", row % 7, "\"]}\n");
  }
  WriteFile(dir.path("attrs.jsonl"), lines);
  const std::string common =
      absl::StrCat("build --input ", dir.path("base.npy"), " --attributes ",
                   dir.path("attrs.jsonl"));
  const std::string built = dir.path("built.index");
  const std::string whole = dir.path("whole.index");
  CommandResult a =
      Knnctl(absl::StrCat(common, " --output ", built, " --shards 2"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_THAT(a.output, HasSubstr("attribute: year (integer)"));
  EXPECT_THAT(a.output, HasSubstr("attribute: tags (keyword_list)"));
  CommandResult b = Knnctl(absl::StrCat(common, " --output ", whole));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_THAT(b.output, HasSubstr(whole + ".attrs (3 attribute columns"));
  // Written and freed before training: a phase of the memory model.
  EXPECT_THAT(b.output, HasSubstr("max(attributes "));
  EXPECT_LT(b.output.find("attributes: "), b.output.find("training:"));
  CommandResult info = Knnctl("info --index " + whole);
  EXPECT_THAT(info.output, HasSubstr("genre          keyword, 1 distinct"));
  ASSERT_EQ(Knnctl(absl::StrCat("shard --index ", whole, " --shards 2 "
                                "--output ", dir.path("split")))
                .exit_code,
            0);
  for (int s = 0; s < 2; ++s) {
    const std::string x = absl::StrCat(built, ".shard-", s, "-of-2.attrs");
    const std::string y =
        absl::StrCat(dir.path("split"), ".shard-", s, "-of-2.attrs");
    EXPECT_FALSE(ReadFile(x).empty()) << x;
    EXPECT_EQ(ReadFile(x), ReadFile(y)) << s;
  }

  std::string mixed = "{\"year\": 2001}\n{\"year\": \"2002\"}\n";
  for (int row = 2; row < 3000; ++row) mixed += "{}\n";
  WriteFile(dir.path("mixed.jsonl"), mixed);
  CommandResult c = Knnctl(absl::StrCat("build --input ", dir.path("base.npy"),
                                        " --output ", dir.path("bad.index"),
                                        " --attributes ",
                                        dir.path("mixed.jsonl")));
  EXPECT_EQ(c.exit_code, 2);
  EXPECT_THAT(c.output, HasSubstr(absl::StrCat(
                            dir.path("mixed.jsonl"),
                            ": line 2: field \"year\" is a string")));
  EXPECT_THAT(c.output, Not(HasSubstr("training")));  // failed at once
  WriteFile(dir.path("short.jsonl"), "{}\n{}\n");
  c = Knnctl(absl::StrCat("build --input ", dir.path("base.npy"), " --output ",
                          dir.path("bad.index"), " --attributes ",
                          dir.path("short.jsonl")));
  EXPECT_EQ(c.exit_code, 2);
  EXPECT_THAT(c.output, HasSubstr("has 2 lines but the input has 3000"));
}

// tune measures settings on a sample of the indexed vectors (no queries
// given), records the fastest reaching the target in the sidecar, and the
// served index then takes its defaults from there.
TEST(Knnctl, TuneRecordsTheFastestSettingReachingTheTarget) {
  TempDir dir;
  WriteData(dir.path("base.npy"), 3000, 16, 11);
  const std::string index = dir.path("t.index");
  CommandResult built = Knnctl(absl::StrCat(
      "build --input ", dir.path("base.npy"), " --output ", index,
      " --nlist 32 --m 2"));
  ASSERT_EQ(built.exit_code, 0) << built.output;
  EXPECT_THAT(built.output, HasSubstr("IVF32,PQ2x4fs"));
  CommandResult tuned = Knnctl(absl::StrCat(
      "tune --index ", index, " --sample 200 --target_recall 0.9"));
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_THAT(tuned.output, HasSubstr("200 sampled base vectors"));
  EXPECT_THAT(tuned.output, HasSubstr("tuned (recall@10 >= 0.9)"));
  auto meta = ReadIndexMetadata(MetadataPath(index));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_GE(meta->tuned_nprobe(), 1u);
  EXPECT_LE(meta->tuned_nprobe(), 32u);
  EXPECT_GE(meta->tuned_recall(), 0.9);
  EXPECT_EQ(meta->tuned_k(), 10u);
  // 4-bit PQ with 1 byte per vector cannot reach 0.9 alone: re-ranking is
  // chosen.
  EXPECT_GT(meta->tuned_refine_factor(), 0u) << tuned.output;
  LoadOptions load;
  load.probe_in_subprocess = false;
  auto snapshot = IndexSnapshot::Load(index, load);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ((*snapshot)->info().tuned_nprobe,
            static_cast<int>(meta->tuned_nprobe()));

  // --dry_run leaves the sidecar alone; an unreachable target exits 2.
  CommandResult dry = Knnctl(absl::StrCat(
      "tune --index ", index, " --sample 50 --nprobes 1 --refine_factors 0 "
      "--target_recall 1.0 --dry_run"));
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_THAT(dry.output, HasSubstr("not reached"));
  auto again = ReadIndexMetadata(MetadataPath(index));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tuned_nprobe(), meta->tuned_nprobe());
}

// Seeded clustered vectors split into base rows and query rows of the
// same clusters, written to `base_path` and `queries_path`.
std::pair<Matrix, Matrix> WriteBaseAndQueries(const std::string& base_path,
                                              const std::string& queries_path,
                                              int64_t rows, int64_t queries,
                                              int dim, uint32_t seed) {
  const std::vector<float> all = MakeData(rows + queries, dim, seed);
  Matrix base, query;
  base.rows = rows;
  query.rows = queries;
  base.dim = query.dim = dim;
  base.values.assign(all.begin(), all.begin() + rows * dim);
  query.values.assign(all.begin() + rows * dim, all.end());
  EXPECT_TRUE(WriteVectors(base_path, base).ok());
  EXPECT_TRUE(WriteVectors(queries_path, query).ok());
  return {base, query};
}

// recall@k of `response` (a search of every row of `queries`) against a
// brute-force search of `base`.
double ServedRecall(const knnd::v1::SearchResponse& response,
                    const Matrix& base, const Matrix& queries, int k) {
  const std::vector<int64_t> truth = knnd::testing::BruteForceNeighbors(
      base.values, queries.values, base.dim, k, Metric::kL2);
  int64_t hits = 0;
  for (int64_t q = 0; q < queries.rows; ++q) {
    const std::set<int64_t> expected(truth.begin() + q * k,
                                     truth.begin() + (q + 1) * k);
    for (int j = 0; j < k; ++j) hits += expected.count(response.ids(q * k + j));
  }
  return static_cast<double>(hits) / static_cast<double>(queries.rows * k);
}

// A front's (or one knnd's) GetIndexInfo answers once it serves.
bool WaitServing(const knnd::testing::RunningServer& server) {
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (absl::Now() < end) {
    grpc::ClientContext context;
    knnd::v1::GetIndexInfoResponse info;
    if (server.stub->GetIndexInfo(&context, {}, &info).ok()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// eval's chosen setting, served as its line says (default_nprobe and
// default_refine_factor in knnd's config, and requests of --k neighbours
// that set neither), answers the recall@k eval printed for it: eval
// searches at --k, where re-ranking takes refine_factor x k candidates, as
// a request does.
TEST(Knnctl, EvalsChosenSettingServesTheRecallItPrints) {
  TempDir dir;
  const auto [base, queries] = WriteBaseAndQueries(
      dir.path("base.npy"), dir.path("q.npy"), 4000, 200, 32, 21);
  const std::string index = dir.path("x.index");
  // 4-bit codes of 8 sub-quantizers: PQ alone stays far below the target,
  // so the chosen setting re-ranks.
  CommandResult built = Knnctl(absl::StrCat(
      "build --input ", dir.path("base.npy"), " --output ", index,
      " --nlist 32 --m 8"));
  ASSERT_EQ(built.exit_code, 0) << built.output;
  CommandResult eval = Knnctl(absl::StrCat(
      "eval --index ", index, " --queries ", dir.path("q.npy"), " --base ",
      dir.path("base.npy"), " --k 10 --nprobes 4,8,32 "
      "--refine_factors 0,1,2,4,8 --target_recall 0.9"));
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  int nprobe = 0, refine = 0;
  double printed = 0;
  const size_t at = eval.output.find("chosen nprobe: ");
  ASSERT_NE(at, std::string::npos) << eval.output;
  ASSERT_EQ(std::sscanf(eval.output.c_str() + at,
                        "chosen nprobe: %d refine_factor: %d (recall@10 %lf",
                        &nprobe, &refine, &printed),
            3)
      << eval.output;
  ASSERT_GT(refine, 0) << eval.output;

  knnd::v1::ServerConfig config = knnd::testing::TestConfig(index);
  config.set_default_nprobe(static_cast<uint32_t>(nprobe));
  config.set_default_refine_factor(static_cast<uint32_t>(refine));
  knnd::testing::RunningServer server = knnd::testing::StartServer(config);
  ASSERT_NE(server.stub, nullptr);
  knnd::v1::SearchResponse response;
  ASSERT_TRUE(knnd::testing::CallSearch(
                  *server.stub,
                  knnd::testing::MakeSearchRequest(queries.values, 10),
                  &response)
                  .ok());
  EXPECT_EQ(response.nprobe(), static_cast<uint32_t>(nprobe));
  EXPECT_EQ(response.refine_factor(), static_cast<uint32_t>(refine));
  // 4 decimals printed; one neighbour of 2,000 is 0.0005.
  EXPECT_NEAR(ServedRecall(response, base, queries, 10), printed, 0.00051)
      << eval.output;
}

// A shard set is tuned as one: `tune --index OUT --shards N` measures the
// merged answer of every shard (the unsharded index's: the shards share
// their quantizers), records one decision in every shard's sidecar, and a
// front over the shards then answers requests that set no nprobe or
// refine_factor with it, at the recall tune recorded. A shard alone is
// refused, naming the command that tunes its set.
TEST(Knnctl, AShardSetIsTunedAsOneAndItsFrontServesTheTunedDefaults) {
  TempDir dir;
  const auto [base, queries] = WriteBaseAndQueries(
      dir.path("base.npy"), dir.path("q.npy"), 6000, 200, 32, 23);
  const std::string set = dir.path("set.index");
  const std::string build = absl::StrCat(
      "build --input ", dir.path("base.npy"), " --nlist 32 --m 16 --output ");
  CommandResult built = Knnctl(absl::StrCat(build, set, " --shards 2"));
  ASSERT_EQ(built.exit_code, 0) << built.output;
  EXPECT_THAT(built.output, HasSubstr(absl::StrCat(
                                "knnctl tune --index ", set, " --shards 2")));

  CommandResult alone = Knnctl(absl::StrCat("tune --index ", set,
                                            ".shard-1-of-2 --sample 50"));
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  EXPECT_THAT(alone.output, HasSubstr("is shard 1 of 2"));
  EXPECT_THAT(alone.output,
              HasSubstr(absl::StrCat("knnctl tune --index ", set,
                                     " --shards 2")));

  const std::string sweep = absl::StrCat(
      " --queries ", dir.path("q.npy"), " --target_recall 0.9");
  CommandResult tuned =
      Knnctl(absl::StrCat("tune --index ", set, " --shards 2", sweep));
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  std::vector<knnd::v1::IndexMetadata> metas;
  for (int s = 0; s < 2; ++s) {
    auto meta = ReadIndexMetadata(
        MetadataPath(absl::StrCat(set, ".shard-", s, "-of-2")));
    ASSERT_TRUE(meta.ok()) << meta.status();
    metas.push_back(*meta);
  }
  ASSERT_GE(metas[0].tuned_nprobe(), 1u) << tuned.output;
  EXPECT_GT(metas[0].tuned_refine_factor(), 0u) << tuned.output;
  EXPECT_EQ(metas[0].tuned_k(), 10u);
  for (auto field : {&knnd::v1::IndexMetadata::tuned_nprobe,
                     &knnd::v1::IndexMetadata::tuned_refine_factor,
                     &knnd::v1::IndexMetadata::tuned_k}) {
    EXPECT_EQ((metas[1].*field)(), (metas[0].*field)());
  }
  EXPECT_EQ(metas[1].tuned_recall(), metas[0].tuned_recall());
  EXPECT_EQ(metas[1].tuned_on(), metas[0].tuned_on());
  EXPECT_THAT(metas[0].tuned_on(), HasSubstr("2 shards"));

  // The set measures what the unsharded index of the same quantizers
  // measures, setting by setting.
  const std::string whole = dir.path("whole.index");
  ASSERT_EQ(Knnctl(build + whole).exit_code, 0);
  CommandResult whole_tune =
      Knnctl(absl::StrCat("tune --index ", whole, sweep, " --dry_run"));
  ASSERT_EQ(whole_tune.exit_code, 0) << whole_tune.output;
  const std::map<std::pair<int, int>, double> set_rows = TuneRows(tuned.output);
  const std::map<std::pair<int, int>, double> whole_rows =
      TuneRows(whole_tune.output);
  ASSERT_GE(set_rows.size(), 3u) << tuned.output;
  for (const auto& [setting, recall] : set_rows) {
    if (whole_rows.count(setting) == 0) continue;  // the sweeps stop apart
    EXPECT_NEAR(recall, whole_rows.at(setting), 0.0011)
        << "nprobe " << setting.first << " refine " << setting.second;
  }

  std::vector<knnd::testing::RunningServer> shards;
  std::vector<std::string> targets;
  for (int s = 0; s < 2; ++s) {
    shards.push_back(knnd::testing::StartServer(knnd::testing::TestConfig(
        absl::StrCat(set, ".shard-", s, "-of-2"))));
    ASSERT_NE(shards.back().stub, nullptr);
    targets.push_back(shards.back().address);
  }
  knnd::testing::RunningServer front =
      knnd::testing::StartServer(knnd::testing::FrontConfig(targets));
  ASSERT_TRUE(WaitServing(front));
  knnd::v1::SearchResponse response;
  const grpc::Status status = knnd::testing::CallSearch(
      *front.stub, knnd::testing::MakeSearchRequest(queries.values, 10),
      &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.nprobe(), metas[0].tuned_nprobe());
  EXPECT_EQ(response.refine_factor(), metas[0].tuned_refine_factor());
  EXPECT_NEAR(ServedRecall(response, base, queries, 10),
              metas[0].tuned_recall(), 1e-9)
      << tuned.output;
}

// convert turns a FastScan index that FAISS wrote into knnd's mappable
// layout with a sidecar; knnd loads the result and refused the original.
TEST(Knnctl, ConvertMakesAFaissFastScanFileServable) {
  TempDir dir;
  ::knnd::testing::IndexSpec spec;
  spec.n = 3000;
  spec.d = 16;
  spec.factory = "IVF16,PQ8x4fs";
  ::knnd::testing::WriteIndex(dir.path("faiss.index"), spec);
  LoadOptions load;
  load.probe_in_subprocess = false;
  auto refused = IndexSnapshot::Load(dir.path("faiss.index"), load);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("knnctl convert"));

  const std::string out = dir.path("knnd.index");
  CommandResult converted = Knnctl(absl::StrCat(
      "convert --input ", dir.path("faiss.index"), " --output ", out));
  ASSERT_EQ(converted.exit_code, 0) << converted.output;
  auto snapshot = IndexSnapshot::Load(out, load);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE((*snapshot)->info().has_metadata);
  EXPECT_EQ((*snapshot)->info().ntotal, 3000);
  EXPECT_THAT((*snapshot)->info().index_type, HasSubstr("x4fs"));
  auto meta = ReadIndexMetadata(MetadataPath(out));
  ASSERT_TRUE(meta.ok());
  EXPECT_THAT(meta->built_by(), HasSubstr("knnctl convert"));

  // An 8-bit IVF-PQ file is no FastScan index to convert.
  spec.factory = "IVF16,PQ4";
  ::knnd::testing::WriteIndex(dir.path("plain.index"), spec);
  CommandResult wrong = Knnctl(absl::StrCat(
      "convert --input ", dir.path("plain.index"), " --output ",
      dir.path("x.index")));
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_THAT(wrong.output, HasSubstr("plain.index"));
}

TEST(Knnctl, KilledBuildLeavesTheOldIndexIntact) {
  TempDir dir;
  WriteData(dir.path("small.npy"), 2000, 16, 1);
  WriteData(dir.path("big.npy"), 200000, 16, 2);
  const std::string index = dir.path("x.index");
  ASSERT_EQ(Knnctl(absl::StrCat("build --input ", dir.path("small.npy"),
                                " --output ", index, " --nlist 16 --m 4"))
                .exit_code,
            0);
  absl::StatusOr<std::string> crc = FileCrc32(index);
  ASSERT_TRUE(crc.ok());

  // Kill the second build once it reports training done, i.e. while it
  // adds rows in small batches, long before it writes.
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    const std::string input = dir.path("big.npy");
    execl(KNNCTL_BINARY, KNNCTL_BINARY, "build", "--input", input.c_str(),
          "--output", index.c_str(), "--nlist", "16", "--m", "4",
          "--add_batch", "100", "--threads", "1", nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string seen;
  char buf[256];
  ssize_t n;
  while (seen.find("trained in") == std::string::npos &&
         (n = read(out[0], buf, sizeof buf)) > 0) {
    seen.append(buf, static_cast<size_t>(n));
  }
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  close(out[0]);
  ASSERT_THAT(seen, HasSubstr("trained in"));
  ASSERT_TRUE(WIFSIGNALED(status));

  EXPECT_EQ(*FileCrc32(index), *crc);
  EXPECT_TRUE(IndexSnapshot::Load(index, {}).ok());
}

// publish takes one destination: a versions directory or a bucket
// (--remote, which tests/python/bucket_sync_test.py drives against an S3
// server); --shards is for a bucket; a remote is rclone's REMOTE:path.
TEST(Knnctl, PublishRefusesConflictingDestinations) {
  CommandResult both = Knnctl("publish --index x --dir d --remote r:b/p");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.output, HasSubstr("one of --dir DIR and --remote"));
  CommandResult neither = Knnctl("publish --index x");
  EXPECT_EQ(neither.exit_code, 2);
  EXPECT_THAT(neither.output, HasSubstr("one of --dir DIR and --remote"));
  CommandResult shards = Knnctl("publish --index x --dir d --shards 2");
  EXPECT_EQ(shards.exit_code, 2);
  EXPECT_THAT(shards.output, HasSubstr("--shards publishes a set to --remote"));
  CommandResult negative = Knnctl("publish --index x --remote r:b --shards -1");
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_THAT(negative.output, HasSubstr("--shards -1 is negative"));
  CommandResult local = Knnctl("publish --index x --remote /tmp/bucket");
  EXPECT_EQ(local.exit_code, 2);
  EXPECT_THAT(local.output,
              HasSubstr("--remote /tmp/bucket is not an rclone remote path"));
}

// publish copies a built index and its sidecar into the next numbered
// version of a directory; a broken file is refused and publishes nothing.
TEST(Knnctl, PublishWritesNumberedVersions) {
  TempDir dir;
  WriteData(dir.path("x.npy"), 2000, 16, 3);
  CommandResult built = Knnctl(absl::StrCat("build --input ", dir.path("x.npy"),
                                            " --output ", dir.path("x.index"),
                                            " --nlist 16 --m 4"));
  ASSERT_EQ(built.exit_code, 0) << built.output;
  for (int version : {1, 2}) {
    CommandResult published =
        Knnctl(absl::StrCat("publish --index ", dir.path("x.index"), " --dir ",
                            dir.path("versions")));
    EXPECT_EQ(published.exit_code, 0) << published.output;
    EXPECT_THAT(published.output,
                HasSubstr(absl::StrCat("as version ", version)));
    const std::string index =
        absl::StrCat(dir.path("versions"), "/", version, "/index.faiss");
    EXPECT_TRUE(std::ifstream(MetadataPath(index)).good()) << index;
  }
  CommandResult missing = Knnctl(absl::StrCat(
      "publish --index ", dir.path("none.index"), " --dir ", dir.path("versions")));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.output, HasSubstr("none.index"));
  EXPECT_FALSE(std::ifstream(dir.path("versions") + "/3/index.faiss").good());
  EXPECT_EQ(Knnctl("publish --index x").exit_code, 2);

  // knnd serves the directory; knnctl reload and versions drive its admin
  // API.
  knnd::testing::RunningServer s =
      knnd::testing::StartServer(knnd::testing::TestConfig(dir.path("versions")));
  ASSERT_NE(s.stub, nullptr);
  const std::string admin =
      absl::StrCat(" --addr 127.0.0.1:", s.server->admin_port());
  ASSERT_EQ(Knnctl(absl::StrCat("publish --index ", dir.path("x.index"),
                                " --dir ", dir.path("versions")))
                .exit_code,
            0);
  CommandResult reloaded = Knnctl("reload" + admin);
  EXPECT_EQ(reloaded.exit_code, 0) << reloaded.output;
  EXPECT_THAT(reloaded.output, HasSubstr("serving:  version 3"));
  EXPECT_THAT(reloaded.output, HasSubstr("before:   version 2"));
  EXPECT_THAT(reloaded.output, HasSubstr("loaded:   yes"));
  CommandResult pinned = Knnctl("reload --pin 1" + admin);
  EXPECT_EQ(pinned.exit_code, 0) << pinned.output;
  EXPECT_THAT(pinned.output, HasSubstr("serving:  version 1"));
  EXPECT_THAT(pinned.output, HasSubstr("pinned:   version 1"));
  CommandResult versions = Knnctl("versions" + admin);
  EXPECT_EQ(versions.exit_code, 0) << versions.output;
  EXPECT_THAT(versions.output, ::testing::ContainsRegex("1  serving "));
  EXPECT_THAT(versions.output, ::testing::ContainsRegex("3  -  "));
  EXPECT_THAT(versions.output, HasSubstr("pinned:  version 1"));
  CommandResult absent = Knnctl("reload --pin 9" + admin);
  EXPECT_EQ(absent.exit_code, 2);
  EXPECT_THAT(absent.output, HasSubstr("NOT_FOUND"));
  // The search port does not serve the admin API.
  CommandResult wrong_port =
      Knnctl(absl::StrCat("reload --addr 127.0.0.1:", s.server->port()));
  EXPECT_EQ(wrong_port.exit_code, 2);
  EXPECT_THAT(wrong_port.output, HasSubstr("UNIMPLEMENTED"));
}

}  // namespace
}  // namespace knnd

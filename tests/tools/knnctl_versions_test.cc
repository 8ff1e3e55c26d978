// knnctl build, update and publish killed at points spread over their
// run, as a kill -9 or an OOM kill stops them: whatever is left at the
// output loads as one whole version (every row's id, payload and
// attributes of one build) or is refused; never a mix, never row numbers
// served as ids (issue: 6 of 6 killed updates served row numbers, killed
// rebuilds served other rows' payloads). And a build that fails leaves the
// version that was there.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/vector_io.h"
#include "knnd/storage/version_manifest.h"
#include "testing/knnctl_run.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::Knnctl;
using ::knnd::testing::MakeData;
using ::knnd::testing::ReadFile;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::knnd::testing::WriteIdsNpy;
using ::testing::HasSubstr;

constexpr int kDim = 16;

// The inputs of one build: row i has id ids[i], the payload
// {"doc": "TAG-<id>"} and the keyword "genre" g<id % 5>, so that any row
// of any build says by itself whether its files belong together.
struct Rows {
  std::vector<int64_t> ids;
  std::vector<float> vectors;
};

void WriteInputs(const TempDir& dir, const std::string& name, const Rows& rows,
                 const std::string& tag) {
  Matrix m;
  m.rows = static_cast<int64_t>(rows.ids.size());
  m.dim = kDim;
  m.values = rows.vectors;
  ASSERT_TRUE(WriteVectors(dir.path(name + ".npy"), m).ok());
  WriteIdsNpy(dir.path(name + ".ids.npy"), rows.ids);
  std::string payloads;
  std::string attributes;
  for (int64_t id : rows.ids) {
    absl::StrAppend(&payloads, "{\"doc\": \"", tag, "-", id, "\"}\n");
    absl::StrAppend(&attributes, "{\"genre\": \"g", id % 5, "\"}\n");
  }
  WriteFile(dir.path(name + ".payloads.jsonl"), payloads);
  WriteFile(dir.path(name + ".attrs.jsonl"), attributes);
}

std::string BuildArgs(const TempDir& dir, const std::string& name,
                      const std::string& output) {
  return absl::StrCat("build --input ", dir.path(name + ".npy"), " --ids ",
                      dir.path(name + ".ids.npy"), " --payloads ",
                      dir.path(name + ".payloads.jsonl"), " --attributes ",
                      dir.path(name + ".attrs.jsonl"), " --nlist 16",
                      " --output ", output);
}

Rows MakeRows(int64_t n, uint32_t seed, int64_t first_id) {
  Rows rows;
  rows.vectors = MakeData(n, kDim, seed);
  for (int64_t i = 0; i < n; ++i) rows.ids.push_back(first_id + 7919 * i);
  return rows;
}

Rows Reversed(const Rows& rows) {
  Rows out;
  const int64_t n = static_cast<int64_t>(rows.ids.size());
  for (int64_t i = n - 1; i >= 0; --i) {
    out.ids.push_back(rows.ids[i]);
    out.vectors.insert(out.vectors.end(), rows.vectors.begin() + i * kDim,
                       rows.vectors.begin() + (i + 1) * kDim);
  }
  return out;
}

// What the output holds after a run: refused, or the tag of the one build
// whose rows it serves (a test failure when rows of two builds mix, a row's
// id, payload and attributes disagree, or ids are row numbers).
struct Served {
  bool loaded = false;
  std::string tag;
  int64_t rows = 0;
  std::string refusal;
};

Served Inspect(const std::string& index) {
  Served served;
  LoadOptions options;
  options.probe_in_subprocess = false;
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> loaded =
      IndexSnapshot::Load(index, options);
  if (!loaded.ok()) {
    served.refusal = loaded.status().ToString();
    return served;
  }
  const IndexSnapshot& s = **loaded;
  served.loaded = true;
  served.rows = s.info().ntotal;
  EXPECT_TRUE(s.info().has_id_table) << index << ": ids would be row numbers";
  EXPECT_TRUE(s.info().has_payloads) << index;
  EXPECT_NE(s.attributes(), nullptr) << index;
  if (!s.info().has_payloads || s.attributes() == nullptr) return served;
  absl::StatusOr<PayloadSelection> all = s.SelectPayloads(true, {});
  EXPECT_TRUE(all.ok());
  knnd::v1::Filter g3;
  g3.mutable_condition()->set_field("genre");
  g3.mutable_condition()->mutable_eq()->set_keyword("g3");
  absl::StatusOr<RowBitmap> g3_rows = s.CompileFilter(g3, {}, FilterLimits{});
  EXPECT_TRUE(g3_rows.ok()) << g3_rows.status();
  if (!all.ok() || !g3_rows.ok()) return served;
  std::set<std::string> tags;
  for (int64_t row = 0; row < served.rows; ++row) {
    const int64_t id = s.IdOfRow(row);
    std::string payload;
    s.AppendPayload(id, *all, &payload);
    // {"doc":"TAG-ID"}
    const size_t tag = payload.find(":\"") + 2;
    const size_t dash = payload.find('-', tag);
    EXPECT_TRUE(tag > 1 && dash != std::string::npos &&
                absl::EndsWith(payload, absl::StrCat("-", id, "\"}")))
        << index << ": row " << row << " id " << id << " has payload "
        << payload;
    if (tag > 1 && dash != std::string::npos) {
      tags.insert(payload.substr(tag, dash - tag));
    }
    EXPECT_EQ(g3_rows->Test(row), id % 5 == 3)
        << index << ": row " << row << " id " << id << " genre filter";
  }
  EXPECT_EQ(tags.size(), 1u) << index << " mixes builds";
  if (!tags.empty()) served.tag = *tags.begin();
  return served;
}

// Starts knnctl ARGS in the background; its pid.
pid_t Start(const std::string& args) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string command =
        absl::StrCat("exec env OMP_NUM_THREADS=1 ", KNNCTL_BINARY, " ", args,
                     " >/dev/null 2>&1");
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Runs knnctl ARGS and kills it with SIGKILL after `delay` (or lets it
// finish first); true when it was killed.
bool RunAndKill(const std::string& args, absl::Duration delay) {
  const pid_t pid = Start(args);
  const absl::Time deadline = absl::Now() + delay;
  int status = 0;
  while (absl::Now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return false;
    absl::SleepFor(absl::Microseconds(500));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status);
}

absl::Duration TimeOf(const std::string& args) {
  const absl::Time start = absl::Now();
  EXPECT_EQ(Knnctl(args).exit_code, 0) << args;
  return absl::Now() - start;
}

// The delays of `tries` kills spread over a run of `whole`, seeded.
std::vector<absl::Duration> KillPoints(absl::Duration whole, int tries,
                                       uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> jitter(0.0, 1.0);
  std::vector<absl::Duration> points;
  for (int i = 0; i < tries; ++i) {
    points.push_back(whole * ((i + jitter(rng)) / tries) * 1.1);
  }
  return points;
}

std::vector<std::string> TemporariesIn(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp") != std::string::npos) found.push_back(name);
  }
  return found;
}

TEST(KnnctlVersions, KilledRebuildLeavesOneWholeVersion) {
  TempDir dir;
  const Rows a = MakeRows(3000, 11, 1000003);
  WriteInputs(dir, "a", a, "A");
  WriteInputs(dir, "b", Reversed(a), "B");
  const std::string index = dir.path("o.index");
  // How long a rebuild runs here, to spread the kills over it.
  const absl::Duration whole = TimeOf(BuildArgs(dir, "b", dir.path("t.index")));
  ASSERT_EQ(Knnctl(BuildArgs(dir, "a", index)).exit_code, 0);
  ASSERT_EQ(Inspect(index).tag, "A");
  int killed = 0;
  std::string outcomes;
  for (absl::Duration at : KillPoints(whole, 8, 3)) {
    killed += RunAndKill(BuildArgs(dir, "b", index), at) ? 1 : 0;
    const Served served = Inspect(index);
    absl::StrAppend(&outcomes, " ", absl::FormatDuration(at), ":",
                    served.loaded ? served.tag : "refused");
    if (!served.loaded) {
      // Only a kill inside the commit's renames, which leaves no manifest.
      EXPECT_THAT(served.refusal, HasSubstr("manifest")) << served.refusal;
      continue;
    }
    EXPECT_EQ(served.rows, 3000);
    // publish takes exactly what loads, as a whole.
    const testing::CommandResult published = Knnctl(absl::StrCat(
        "publish --index ", index, " --dir ", dir.path("versions")));
    ASSERT_EQ(published.exit_code, 0) << published.output;
    // "published: INDEX as version N (DIR/N/index.faiss)"
    const size_t open = published.output.find('(') + 1;
    const std::string version =
        published.output.substr(open, published.output.find(')') - open);
    EXPECT_EQ(Inspect(version).tag, served.tag) << version;
  }
  EXPECT_GT(killed, 0);
  std::printf("rebuild of %s killed at%s\n",
              absl::FormatDuration(whole).c_str(), outcomes.c_str());
  // The next run removes what the killed ones left, and commits.
  ASSERT_EQ(Knnctl(BuildArgs(dir, "b", index)).exit_code, 0);
  EXPECT_EQ(Inspect(index).tag, "B");
  EXPECT_THAT(TemporariesIn(dir.dir()), ::testing::IsEmpty());
}

TEST(KnnctlVersions, KilledUpdateNeverServesRowNumbers) {
  TempDir dir;
  const Rows a = MakeRows(3000, 12, 5000011);
  WriteInputs(dir, "a", a, "A");
  // The delta: 200 new rows and 200 upserts of the base's, tagged A too
  // (an update keeps the base's payloads for the rows it keeps).
  Rows delta = MakeRows(200, 13, 9000001);
  const Rows upserts = MakeRows(200, 14, 0);
  for (int64_t i = 0; i < 200; ++i) delta.ids.push_back(a.ids[i * 3]);
  delta.vectors.insert(delta.vectors.end(), upserts.vectors.begin(),
                       upserts.vectors.end());
  WriteInputs(dir, "d", delta, "A");
  const std::string base = dir.path("v1.index");
  const std::string out = dir.path("v2.index");
  ASSERT_EQ(Knnctl(BuildArgs(dir, "a", base)).exit_code, 0);
  const std::string update_args = absl::StrCat(
      "update --base ", base, " --output ", out, " --input ", dir.path("d.npy"),
      " --ids ", dir.path("d.ids.npy"), " --payloads ",
      dir.path("d.payloads.jsonl"), " --attributes ", dir.path("d.attrs.jsonl"),
      " --recall_queries 0");
  const absl::Duration whole = TimeOf(update_args);
  ASSERT_EQ(Inspect(out).rows, 3200);
  RemoveStagedVersion(out);  // every file of v2.index, to start afresh
  int killed = 0;
  for (absl::Duration at : KillPoints(whole, 8, 4)) {
    killed += RunAndKill(update_args, at) ? 1 : 0;
    const Served served = Inspect(out);
    if (!served.loaded) {
      const testing::CommandResult published = Knnctl(absl::StrCat(
          "publish --index ", out, " --dir ", dir.path("versions")));
      EXPECT_NE(published.exit_code, 0) << published.output;
      continue;
    }
    EXPECT_EQ(served.rows, 3200);
    EXPECT_EQ(served.tag, "A");
  }
  EXPECT_GT(killed, 0);
  EXPECT_EQ(Inspect(base).tag, "A");
  ASSERT_EQ(Knnctl(update_args).exit_code, 0);
  EXPECT_EQ(Inspect(out).rows, 3200);
  EXPECT_THAT(TemporariesIn(dir.dir()), ::testing::IsEmpty());
}

// The files a run killed by SIGKILL left (its staging files and their
// temporaries, up to the input's size) are removed by the next build
// beside its --output and the next update beside its --base, each named
// in the output; a live run's files, other indexes' and files that are
// not temporaries stay.
TEST(KnnctlVersions, NextRunsRemoveWhatKilledRunsLeftAndNothingElse) {
  TempDir dir;
  WriteInputs(dir, "a", MakeRows(20000, 17, 3), "A");
  const std::string index = dir.path("o.index");
  // A build killed once its first staged file is there.
  const pid_t killed = Start(BuildArgs(dir, "a", index));
  const std::string marker = absl::StrCat("o.index.tmp.", killed);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  auto left = [&] {
    std::vector<std::string> files;
    for (const std::string& name : TemporariesIn(dir.dir())) {
      if (absl::StrContains(name, absl::StrCat(".tmp.", killed))) {
        files.push_back(dir.path(name));
      }
    }
    return files;
  };
  while (left().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Microseconds(200));
  }
  kill(killed, SIGKILL);
  int status = 0;
  waitpid(killed, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the build ended before it was killed";
  std::vector<std::string> dead = left();
  ASSERT_FALSE(dead.empty()) << marker;
  // A live run's files (a sleeping child's pid), another index's and
  // names that only look like temporaries.
  const pid_t live = fork();
  if (live == 0) {
    pause();
    _exit(0);
  }
  const std::vector<std::string> kept = {
      absl::StrCat(index, ".tmp.", live, ".vectors"),
      absl::StrCat(index, ".vectors.tmp.", live),
      absl::StrCat(dir.path("other.index.tmp."), killed),
      absl::StrCat(index, ".tmpx.", killed),
      absl::StrCat(index, ".tmp.", killed, "x"),
      index + ".notes"};
  for (const std::string& path : kept) WriteFile(path, "x");
  auto expect_removed_exactly = [&](const testing::CommandResult& run,
                                    const std::vector<std::string>& removed) {
    for (const std::string& path : removed) {
      EXPECT_THAT(run.output,
                  HasSubstr(absl::StrCat("removed:  ", path,
                                         " (left by a run that was killed)")));
      EXPECT_NE(access(path.c_str(), F_OK), 0) << path;
    }
    size_t lines = 0;
    for (size_t at = run.output.find("(left by a run that was killed)");
         at != std::string::npos;
         at = run.output.find("(left by a run that was killed)", at + 1)) {
      ++lines;
    }
    EXPECT_EQ(lines, removed.size()) << run.output;
    for (const std::string& path : kept) {
      EXPECT_EQ(access(path.c_str(), F_OK), 0) << path;
    }
  };
  const testing::CommandResult built = Knnctl(BuildArgs(dir, "a", index));
  ASSERT_EQ(built.exit_code, 0) << built.output;
  expect_removed_exactly(built, dead);
  EXPECT_EQ(Inspect(index).tag, "A");

  // Beside the base of an update that writes elsewhere: what a killed
  // build of the base left, as the issue found it (INDEX.vectors.tmp.PID).
  dead = {absl::StrCat(index, ".vectors.tmp.", killed),
          absl::StrCat(index, ".tmp.", killed, ".ids.tmp.", killed)};
  for (const std::string& path : dead) WriteFile(path, "x");
  TempDir out;
  WriteIdsNpy(dir.path("delete.npy"), {3, 7919 * 5 + 3});
  const testing::CommandResult updated = Knnctl(absl::StrCat(
      "update --base ", index, " --output ", out.path("v2.index"), " --delete ",
      dir.path("delete.npy"), " --recall_queries 0"));
  ASSERT_EQ(updated.exit_code, 0) << updated.output;
  expect_removed_exactly(updated, dead);
  kill(live, SIGKILL);
  waitpid(live, &status, 0);
}

TEST(KnnctlVersions, FailedBuildLeavesTheVersionThatWasThere) {
  TempDir dir;
  const Rows a = MakeRows(1000, 15, 77);
  WriteInputs(dir, "a", a, "A");
  WriteInputs(dir, "b", Reversed(a), "B");
  const std::string index = dir.path("o.index");
  ASSERT_EQ(Knnctl(BuildArgs(dir, "a", index)).exit_code, 0);
  const std::string payloads = ReadFile(PayloadPath(index));
  // Bad attribute files, each refused after the payloads were written.
  std::string lines = ReadFile(dir.path("b.attrs.jsonl"));
  const std::vector<std::string> bad = {
      lines.substr(0, lines.rfind('{')),                        // a line short
      lines + "{\"genre\": \"g1\"}\n",                          // a line extra
      "not json\n" + lines.substr(lines.find('\n') + 1),        // not JSON
      "{\"genre\": 3}\n" + lines.substr(lines.find('\n') + 1),  // mixed type
      "{\"genre\": true}\n" + lines.substr(lines.find('\n') + 1)};
  for (const std::string& attributes : bad) {
    WriteFile(dir.path("b.attrs.jsonl"), attributes);
    const testing::CommandResult failed = Knnctl(BuildArgs(dir, "b", index));
    EXPECT_EQ(failed.exit_code, 2) << failed.output;
    EXPECT_EQ(ReadFile(PayloadPath(index)), payloads);
    EXPECT_EQ(Inspect(index).tag, "A");
    // Nothing at a fresh output either.
    const std::string fresh = dir.path("fresh.index");
    EXPECT_EQ(Knnctl(BuildArgs(dir, "b", fresh)).exit_code, 2);
    EXPECT_THAT(VersionFilesPresent(fresh), ::testing::IsEmpty());
    EXPECT_THAT(TemporariesIn(dir.dir()), ::testing::IsEmpty());
  }
}

TEST(KnnctlVersions, SealBindsTheFilesOfAnOlderKnnctl) {
  TempDir dir;
  const Rows a = MakeRows(1000, 16, 5);
  WriteInputs(dir, "a", a, "A");
  const std::string index = dir.path("o.index");
  ASSERT_EQ(Knnctl(BuildArgs(dir, "a", index)).exit_code, 0);
  // As an older knnctl wrote it: no manifest, which knnd refuses.
  ASSERT_EQ(std::remove(ManifestPath(index).c_str()), 0);
  EXPECT_THAT(Inspect(index).refusal, HasSubstr("knnctl seal"));
  const testing::CommandResult sealed =
      Knnctl(absl::StrCat("seal --index ", index));
  ASSERT_EQ(sealed.exit_code, 0) << sealed.output;
  EXPECT_THAT(sealed.output,
              HasSubstr("index, sidecar, ids, payloads, attributes"));
  EXPECT_EQ(Inspect(index).tag, "A");
  EXPECT_NE(Knnctl(absl::StrCat("seal --index ", index)).exit_code, 0);
  // What a killed update of an older knnctl left (no sidecar) is not a
  // version: refused, and no manifest is written.
  ASSERT_EQ(std::remove(ManifestPath(index).c_str()), 0);
  ASSERT_EQ(std::remove(MetadataPath(index).c_str()), 0);
  const testing::CommandResult remnant =
      Knnctl(absl::StrCat("seal --index ", index));
  EXPECT_NE(remnant.exit_code, 0);
  EXPECT_THAT(remnant.output, HasSubstr("o.index.meta.json"));
  EXPECT_FALSE(access(ManifestPath(index).c_str(), F_OK) == 0);
}

}  // namespace
}  // namespace knnd

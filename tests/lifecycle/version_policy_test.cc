// The version policy, one table row per rule and edge case: no threads, no
// files, no server.
#include "knnd/lifecycle/version_policy.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace knnd {
namespace {

using Action = VersionDecision::Action;

const IndexVersion kNone;

// Version n of the versions directory /versions.
IndexVersion V(int64_t n) {
  return {n, absl::StrCat("/versions/", n, "/index.faiss")};
}

// What the reload of version n returned when it was refused.
absl::Status Refusal(int64_t n) {
  return absl::FailedPreconditionError(absl::StrCat(
      "index version ", n, " (", V(n).path,
      ") refused: its dim=8 differs from dim=16"));
}

// IndexSource::Latest() of an empty directory, Find(n) of a missing one.
absl::Status NoCompleteVersion() {
  return absl::NotFoundError("versions directory /versions holds no complete "
                             "version");
}
absl::Status NotComplete(int64_t n) {
  return absl::NotFoundError(absl::StrCat(
      "version ", n, " is not a complete version of /versions (complete: 1, "
      "2)"));
}

// `serving` serves, `pinned` is pinned, `refused` (0: none) was refused with
// Refusal(refused).
VersionRecord Record(const IndexVersion& serving, int64_t pinned = 0,
                     int64_t refused = 0) {
  VersionRecord record;
  record.serving = serving;
  record.pinned_version = pinned;
  record.refused_version = refused;
  if (refused != 0) record.refused_status = Refusal(refused);
  return record;
}

const VersionRequest kReload = VersionRequest::Reload();
const VersionRequest kUnpin = VersionRequest::Unpin();
VersionRequest Pin(int64_t n) { return VersionRequest::Pin(n); }

void ExpectRecord(const VersionRecord& got, const VersionRecord& want) {
  EXPECT_TRUE(SameVersion(got.serving, want.serving))
      << "serving " << got.serving.version << " " << got.serving.path
      << ", want " << want.serving.version << " " << want.serving.path;
  EXPECT_EQ(got.pinned_version, want.pinned_version);
  EXPECT_EQ(got.refused_version, want.refused_version);
  EXPECT_EQ(got.refused_status, want.refused_status);
}

TEST(VersionPolicy, WantedVersion) {
  struct Row {
    const char* name;
    int64_t pinned;
    VersionRequest request;
    int64_t wanted;
  };
  const Row rows[] = {
      {"nothing pinned: the latest", 0, kReload, 0},
      {"the pin holds", 3, kReload, 3},
      {"unpin: the latest", 3, kUnpin, 0},
      {"pin", 0, Pin(2), 2},
      {"a new pin replaces the old", 3, Pin(2), 2},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(WantedVersion(Record(kNone, row.pinned), row.request),
              row.wanted);
  }
}

TEST(VersionPolicy, DecideVersion) {
  struct Row {
    const char* name;
    VersionRecord record;
    std::vector<IndexVersion> retained;
    VersionRequest request;
    // The source's answer for the wanted version.
    absl::StatusOr<IndexVersion> found;
    Action action;
    IndexVersion target;
    absl::Status status;
  };
  const IndexVersion old_file{1, "/old/1/index.faiss"};
  const IndexVersion other_file{1, "/other/1/index.faiss"};
  const Row rows[] = {
      // The source names no target.
      {"no versions on disk", Record(kNone), {}, kReload,
       NoCompleteVersion(), Action::kNoTarget, kNone, NoCompleteVersion()},
      {"directory cannot be listed", Record(V(1)), {}, kReload,
       absl::UnavailableError("cannot list versions directory /versions"),
       Action::kNoTarget, kNone,
       absl::UnavailableError("cannot list versions directory /versions")},
      {"pinned version missing from disk, none retained", Record(V(2)), {},
       Pin(9), NotComplete(9), Action::kNoTarget, kNone, NotComplete(9)},
      {"rollback with no retained version and its files gone", Record(V(2)),
       {}, Pin(1), NotComplete(1), Action::kNoTarget, kNone, NotComplete(1)},
      {"the pinned version serving lost its files", Record(V(1), 1), {},
       kReload, NotComplete(1), Action::kNoTarget, kNone, NotComplete(1)},
      {"a retained version does not stand in for a missing latest",
       Record(V(1)), {V(2)}, kReload, NoCompleteVersion(), Action::kNoTarget,
       kNone, NoCompleteVersion()},
      // Kept as is.
      {"the latest already serves", Record(V(2)), {}, kReload, V(2),
       Action::kKeep, V(2), absl::OkStatus()},
      {"pinning the version serving", Record(V(2)), {}, Pin(2), V(2),
       Action::kKeep, V(2), absl::OkStatus()},
      {"the pin holds against a newer version", Record(V(1), 1), {}, kReload,
       V(1), Action::kKeep, V(1), absl::OkStatus()},
      {"serving is checked before the refusal", Record(V(2), 0, 2), {},
       kReload, V(2), Action::kKeep, V(2), absl::OkStatus()},
      {"serving is checked before the retained versions", Record(V(2)),
       {V(2)}, kReload, V(2), Action::kKeep, V(2), absl::OkStatus()},
      // Republished from the retained versions.
      {"rollback to a retained version whose files are gone", Record(V(2)),
       {V(1)}, Pin(1), NotComplete(1), Action::kRepublish, V(1),
       absl::OkStatus()},
      {"a pinned retained version is taken by number, with its own file",
       Record(V(2)), {old_file}, Pin(1), V(1), Action::kRepublish, old_file,
       absl::OkStatus()},
      {"the most recently retained of one number", Record(V(2)),
       {old_file, other_file}, Pin(1), NotComplete(1), Action::kRepublish,
       old_file, absl::OkStatus()},
      {"unpin back to a retained latest", Record(V(1), 1), {V(2)}, kUnpin,
       V(2), Action::kRepublish, V(2), absl::OkStatus()},
      {"a retained version is republished even if refused since",
       Record(V(1), 0, 2), {V(2)}, kReload, V(2), Action::kRepublish, V(2),
       absl::OkStatus()},
      // Refused before: a plain reload does not load it again.
      {"the latest was refused", Record(V(1), 0, 2), {}, kReload, V(2),
       Action::kStillRefused, V(2), Refusal(2)},
      {"only a refused version, none serving", Record(kNone, 0, 1), {},
       kReload, V(1), Action::kStillRefused, V(1), Refusal(1)},
      {"the pinned version was refused", Record(V(1), 2, 2), {}, kReload,
       V(2), Action::kStillRefused, V(2), Refusal(2)},
      // Loaded.
      {"the first version", Record(kNone), {}, kReload, V(1), Action::kLoad,
       V(1), absl::OkStatus()},
      {"a newer version", Record(V(1)), {}, kReload, V(2), Action::kLoad,
       V(2), absl::OkStatus()},
      {"the same number in another file", Record(other_file), {}, kReload,
       V(1), Action::kLoad, V(1), absl::OkStatus()},
      {"a retained latest of another file", Record(V(2)), {other_file},
       kUnpin, V(1), Action::kLoad, V(1), absl::OkStatus()},
      {"rollback to a version on disk, none retained", Record(V(3)), {},
       Pin(1), V(1), Action::kLoad, V(1), absl::OkStatus()},
      {"pinning a refused version tries it again", Record(V(1), 0, 2), {},
       Pin(2), V(2), Action::kLoad, V(2), absl::OkStatus()},
      {"unpinning tries a refused latest again", Record(V(1), 1, 2), {},
       kUnpin, V(2), Action::kLoad, V(2), absl::OkStatus()},
      {"a refusal of another version does not stop the latest",
       Record(V(1), 0, 2), {}, kReload, V(3), Action::kLoad, V(3),
       absl::OkStatus()},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const VersionDecision decision = DecideVersion(
        {row.record, row.retained, row.request, row.found});
    EXPECT_EQ(decision.action, row.action);
    EXPECT_TRUE(SameVersion(decision.target, row.target))
        << decision.target.version << " " << decision.target.path;
    EXPECT_EQ(decision.status, row.status);
  }
}

TEST(VersionPolicy, LoadRefusalNamesTheVersionAndWhatStillServes) {
  const absl::Status why =
      absl::DataLossError("CRC-32 of /versions/2/index.faiss differs");
  EXPECT_EQ(LoadRefusal(V(2), why, 1),
            absl::DataLossError(
                "index version 2 (/versions/2/index.faiss) refused: CRC-32 of "
                "/versions/2/index.faiss differs; still serving version 1"));
  EXPECT_EQ(LoadRefusal(V(2), why, 0),
            absl::DataLossError(
                "index version 2 (/versions/2/index.faiss) refused: CRC-32 of "
                "/versions/2/index.faiss differs"));
}

TEST(VersionPolicy, RecordAfter) {
  struct Row {
    const char* name;
    VersionRecord before;
    VersionRequest request;
    Action action;
    IndexVersion target;
    absl::Status result;
    VersionRecord after;
  };
  const absl::Status ok = absl::OkStatus();
  const Row rows[] = {
      {"a loaded version serves", Record(V(1)), kReload, Action::kLoad, V(2),
       ok, Record(V(2))},
      {"a loaded version is no longer refused, and the pin holds",
       Record(V(1), 0, 2), Pin(2), Action::kLoad, V(2), ok,
       Record(V(2), 2)},
      {"unpinned", Record(V(1), 1), kUnpin, Action::kLoad, V(3), ok,
       Record(V(3))},
      {"a republished version serves, no longer refused", Record(V(2), 0, 1),
       Pin(1), Action::kRepublish, V(1), ok, Record(V(1), 1)},
      {"a refusal of another version stays", Record(V(1), 0, 3), kReload,
       Action::kLoad, V(2), ok, Record(V(2), 0, 3)},
      {"kept: only the pin changes", Record(V(2), 0, 3), Pin(2),
       Action::kKeep, V(2), ok, Record(V(2), 2, 3)},
      {"kept on a plain reload: nothing changes", Record(V(2), 2), kReload,
       Action::kKeep, V(2), ok, Record(V(2), 2)},
      {"a failed load is refused; the pin does not move", Record(V(1)),
       Pin(2), Action::kLoad, V(2), Refusal(2), Record(V(1), 0, 2)},
      {"a second refusal keeps the first reason", Record(V(1), 0, 2), Pin(2),
       Action::kLoad, V(2),
       absl::DataLossError("index version 2 refused: CRC-32"),
       Record(V(1), 0, 2)},
      {"a refusal replaces the one of another version", Record(V(1), 0, 2),
       kReload, Action::kLoad, V(3), Refusal(3), Record(V(1), 0, 3)},
      {"still refused: nothing changes", Record(V(1), 0, 2), kReload,
       Action::kStillRefused, V(2), Refusal(2), Record(V(1), 0, 2)},
      {"no target: nothing changes", Record(V(1), 1), Pin(9),
       Action::kNoTarget, kNone, NotComplete(9), Record(V(1), 1)},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    VersionDecision decision;
    decision.action = row.action;
    decision.target = row.target;
    ExpectRecord(RecordAfter(row.before, row.request, decision, row.result),
                 row.after);
  }
}

TEST(VersionPolicy, WithdrawalRefusesTheVersionAndServesNone) {
  const absl::Status why = absl::DataLossError(
      "index version 1 (/versions/1/index.faiss) withdrawn: CRC-32");
  VersionRecord after =
      RecordAfterWithdrawal(Record(V(1), 1, 3), /*version=*/1, why);
  VersionRecord want = Record(kNone, 1);
  want.refused_version = 1;
  want.refused_status = why;
  ExpectRecord(after, want);
}

}  // namespace
}  // namespace knnd

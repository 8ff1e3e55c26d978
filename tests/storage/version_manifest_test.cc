// The version manifest: what it binds, how a staged version is committed,
// what killed runs leave and how the next run removes it, and the loader
// serving only what a manifest binds (issue: killed builds and updates
// served row numbers as ids and other rows' payloads).
#include "knnd/storage/version_manifest.h"

#include <unistd.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/vectors_file.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::DeadPid;
using ::knnd::testing::MakeAttributes;
using ::knnd::testing::ReadFile;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr int64_t kRows = 600;

// A version as knnctl build --ids --payloads --attributes writes one, its
// payloads naming each row's id with `tag` (so that two builds differ).
BuildSpec OwnIdsSpec(const std::string& tag, bool vectors = false) {
  BuildSpec spec;
  spec.n = kRows;
  spec.d = 16;
  spec.factory = "IVF8,PQ4x4fs";
  for (int64_t i = 0; i < kRows; ++i) {
    const int64_t id = 1000003 + 7 * i;
    spec.ids.push_back(id);
    spec.payloads.push_back(absl::StrCat("{\"doc\": \"", tag, "-", id, "\"}"));
  }
  spec.attributes = MakeAttributes(kRows, 5);
  if (vectors) spec.vectors = VectorsDtype::kFloat32;
  return spec;
}

std::vector<std::string> Roles(const knnd::v1::VersionManifest& manifest) {
  std::vector<std::string> roles;
  for (const auto& file : manifest.files()) roles.push_back(file.role());
  return roles;
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

TEST(VersionManifest, BindsEveryFileTheSidecarDeclares) {
  TempDir dir;
  const std::string index = dir.path("x.index");
  BuildIndex(index, OwnIdsSpec("a", /*vectors=*/true));
  absl::StatusOr<knnd::v1::VersionManifest> manifest =
      ReadVersionManifest(index);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_THAT(Roles(*manifest),
              UnorderedElementsAre("index", "sidecar", "ids", "payloads",
                                   "attributes", "vectors"));
  EXPECT_EQ(manifest->format_version(), kVersionManifestFormatVersion);
  EXPECT_EQ(manifest->version_id().size(), 16u);
  const absl::StatusOr<knnd::v1::IndexMetadata> sidecar =
      ReadIndexMetadata(MetadataPath(index));
  ASSERT_TRUE(sidecar.ok());
  EXPECT_EQ(BoundFile(*manifest, kRoleIndex)->crc32(), sidecar->crc32());
  EXPECT_EQ(BoundFile(*manifest, kRoleIndex)->bytes(), sidecar->file_bytes());
  auto ids = IdTable::Open(IdTablePath(index), kRows, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(BoundFile(*manifest, kRoleIds)->bytes(), (*ids)->file_bytes());
  EXPECT_TRUE(CheckIndexAndSidecar(index, *manifest).ok());
  EXPECT_TRUE(CheckBoundCompanion(index, *manifest, kRoleIds,
                                  (*ids)->file_bytes(), (*ids)->content_crc32())
                  .ok());
}

TEST(VersionManifest, LoaderRefusesCompanionsNoManifestBinds) {
  // What a killed `knnctl update` left: the index and its companions, no
  // sidecar and no manifest. Served, it answered row numbers as ids.
  TempDir dir;
  const std::string index = dir.path("x.index");
  BuildIndex(index, OwnIdsSpec("a"));
  ASSERT_EQ(std::remove(ManifestPath(index).c_str()), 0);
  ASSERT_EQ(std::remove(MetadataPath(index).c_str()), 0);
  LoadOptions options;
  options.probe_in_subprocess = false;
  auto loaded = IndexSnapshot::Load(index, options);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      loaded.status().message(),
      AllOf(HasSubstr("x.index.ids"), HasSubstr("x.index.payloads"),
            HasSubstr("x.index.attrs"), HasSubstr("x.index.manifest.json")));
}

TEST(VersionManifest, LoaderRefusesACompanionOfAnotherBuild) {
  // A valid payloads file and attribute store of another build of the same
  // rows, put beside the index: each refused by name.
  TempDir dir;
  const std::string index = dir.path("x.index");
  const std::string other = dir.path("y.index");
  BuildIndex(index, OwnIdsSpec("a"));
  BuildSpec reordered = OwnIdsSpec("b");
  reordered.attributes = MakeAttributes(kRows, 6);
  BuildIndex(other, reordered);
  LoadOptions options;
  options.probe_in_subprocess = false;
  ASSERT_TRUE(IndexSnapshot::Load(index, options).ok());
  const std::string kept = ReadFile(PayloadPath(index));
  WriteFile(PayloadPath(index), ReadFile(PayloadPath(other)));
  auto loaded = IndexSnapshot::Load(index, options);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(),
              AllOf(HasSubstr("x.index.payloads"), HasSubstr("another build")));
  WriteFile(PayloadPath(index), kept);
  WriteFile(AttributeStorePath(index), ReadFile(AttributeStorePath(other)));
  loaded = IndexSnapshot::Load(index, options);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("x.index.attrs"));
}

TEST(VersionManifest, LoaderIgnoresAVectorsFileNoManifestBinds) {
  TempDir dir;
  const std::string index = dir.path("x.index");
  const std::string other = dir.path("y.index");
  BuildIndex(index, OwnIdsSpec("a"));
  BuildIndex(other, OwnIdsSpec("a", /*vectors=*/true));
  WriteFile(VectorsPath(index), ReadFile(VectorsPath(other)));
  LoadOptions options;
  options.probe_in_subprocess = false;
  auto loaded = IndexSnapshot::Load(index, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE((*loaded)->info().has_vectors);
  options.vectors = VectorsPolicy::kRequired;
  EXPECT_FALSE(IndexSnapshot::Load(index, options).ok());
}

TEST(VersionManifest, ASidecarChangedAfterSealingIsRefused) {
  TempDir dir;
  const std::string index = dir.path("x.index");
  BuildIndex(index, OwnIdsSpec("a"));
  absl::StatusOr<knnd::v1::IndexMetadata> sidecar =
      ReadIndexMetadata(MetadataPath(index));
  ASSERT_TRUE(sidecar.ok());
  sidecar->set_payloads(false);
  ASSERT_TRUE(WriteIndexMetadata(MetadataPath(index), *sidecar).ok());
  LoadOptions options;
  options.probe_in_subprocess = false;
  auto loaded = IndexSnapshot::Load(index, options);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), HasSubstr("x.index.meta.json"));
  // RewriteSidecar (knnctl tune) refuses to re-seal what is not whole.
  EXPECT_FALSE(RewriteSidecar(index, *sidecar, "test").ok());
}

TEST(VersionManifest, RewriteSidecarSealsTheVersionAgain) {
  TempDir dir;
  const std::string index = dir.path("x.index");
  BuildIndex(index, OwnIdsSpec("a"));
  absl::StatusOr<knnd::v1::IndexMetadata> sidecar =
      ReadIndexMetadata(MetadataPath(index));
  ASSERT_TRUE(sidecar.ok());
  sidecar->set_tuned_nprobe(3);
  ASSERT_TRUE(RewriteSidecar(index, *sidecar, "test").ok());
  LoadOptions options;
  options.probe_in_subprocess = false;
  auto loaded = IndexSnapshot::Load(index, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->info().tuned_nprobe, 3);
}

TEST(VersionManifest, BareFaissFileLoadsWithoutManifest) {
  TempDir dir;
  const std::string index = dir.path("x.faiss");
  ::knnd::testing::WriteIndex(index, ::knnd::testing::IndexSpec{});
  LoadOptions options;
  options.probe_in_subprocess = false;
  EXPECT_TRUE(IndexSnapshot::Load(index, options).ok());
}

TEST(VersionManifest, CommitReplacesTheVersionAndRemovesRolesItLacks) {
  TempDir dir;
  const std::string index = dir.path("x.index");
  BuildIndex(index, OwnIdsSpec("a", /*vectors=*/true));
  const std::string staged = StagingPathFor(index);
  BuildSpec plain;
  plain.n = kRows;
  plain.d = 16;
  plain.factory = "IVF8,PQ4x4fs";
  BuildIndex(staged, plain);
  std::vector<std::string> removed;
  ASSERT_TRUE(CommitStagedVersion(staged, index, &removed).ok());
  EXPECT_THAT(removed, UnorderedElementsAre(
                           IdTablePath(index), PayloadPath(index),
                           AttributeStorePath(index), VectorsPath(index)));
  EXPECT_FALSE(Exists(staged));
  EXPECT_FALSE(Exists(ManifestPath(staged)));
  LoadOptions options;
  options.probe_in_subprocess = false;
  auto loaded = IndexSnapshot::Load(index, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE((*loaded)->info().has_id_table);
  EXPECT_EQ((*loaded)->IdOfRow(5), 5);
}

TEST(VersionManifest, CommitOfAnUnsealedStagingLeavesTheVersion) {
  TempDir dir;
  const std::string index = dir.path("x.index");
  BuildIndex(index, OwnIdsSpec("a"));
  const std::string staged = StagingPathFor(index);
  BuildIndex(staged, OwnIdsSpec("b"));
  ASSERT_EQ(std::remove(ManifestPath(staged).c_str()), 0);
  const absl::Status s = CommitStagedVersion(staged, index);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  LoadOptions options;
  options.probe_in_subprocess = false;
  auto loaded = IndexSnapshot::Load(index, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto selection = (*loaded)->SelectPayloads(true, {});
  ASSERT_TRUE(selection.ok());
  std::string payload;
  (*loaded)->AppendPayload(1000003, *selection, &payload);
  EXPECT_THAT(payload, HasSubstr("a-1000003"));
  RemoveStagedVersion(staged);
  EXPECT_FALSE(Exists(staged));
  EXPECT_FALSE(Exists(PayloadPath(staged)));
  EXPECT_TRUE(Exists(PayloadPath(index)));
}

TEST(VersionManifest, StaleTemporariesOfDeadRunsAreRemoved) {
  TempDir dir;
  const std::string index = dir.path("x.index");
  const std::string dead = absl::StrCat(DeadPid());
  const std::vector<std::string> stale = {
      index + ".tmp." + dead, index + ".tmp." + dead + ".payloads",
      index + ".tmp." + dead + ".ids.tmp." + dead, index + ".ids.tmp." + dead,
      index + ".tmp." + dead + ".shard-0-of-2.attrs"};
  // Live processes' files (this test's, init's) and another index's stay.
  const std::vector<std::string> kept = {
      index + ".tmp." + absl::StrCat(getpid()), index + ".tmp.1.payloads",
      dir.path("y.index.tmp.") + dead, index + ".payloads",
      index + ".tmpfoo." + dead};
  for (const std::string& path : stale) WriteFile(path, "x");
  for (const std::string& path : kept) WriteFile(path, "x");
  EXPECT_THAT(
      RemoveStaleTemporaries(index),
      UnorderedElementsAre(stale[0], stale[1], stale[2], stale[3], stale[4]));
  for (const std::string& path : stale) EXPECT_FALSE(Exists(path)) << path;
  for (const std::string& path : kept) EXPECT_TRUE(Exists(path)) << path;
}

TEST(VersionManifest, ReadRefusesAMalformedBinding) {
  TempDir dir;
  const std::string index = dir.path("x.index");
  BuildIndex(index, OwnIdsSpec("a"));
  std::string json = ReadFile(ManifestPath(index));
  const size_t at = json.find("\"ids\"");
  ASSERT_NE(at, std::string::npos);
  json.replace(at, 5, "\"payloads\"");
  WriteFile(ManifestPath(index), json);
  absl::StatusOr<knnd::v1::VersionManifest> read = ReadVersionManifest(index);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace knnd

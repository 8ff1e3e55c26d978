#include "knnd/storage/version_manifest.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/vectors_file.h"

namespace knnd {
namespace {

namespace fs = std::filesystem;
using knnd::v1::VersionManifest;

std::string Hex(uint32_t crc) { return absl::StrFormat("%08x", crc); }

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

absl::StatusOr<int64_t> FileBytes(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  return static_cast<int64_t>(st.st_size);
}

const char* SuffixOf(absl::string_view role) {
  for (const VersionRole& r : VersionRoles()) {
    if (role == r.role) return r.suffix;
  }
  return nullptr;
}

// The bound entry of a companion opened with the sidecar's row count.
template <typename T>
absl::StatusOr<VersionManifest::File> CompanionEntry(
    absl::StatusOr<std::unique_ptr<T>> opened, const char* role) {
  if (!opened.ok()) return opened.status();
  VersionManifest::File file;
  file.set_role(role);
  file.set_suffix(SuffixOf(role));
  file.set_bytes((*opened)->file_bytes());
  file.set_crc32(Hex((*opened)->content_crc32()));
  return file;
}

// The entry of a companion whose header holds its rows at byte 16 and its
// content CRC-32 at byte 28 after `magic` (the text index, which a layer
// above this one reads): bound by its header, as the others are.
absl::StatusOr<VersionManifest::File> HeaderCompanionEntry(
    const std::string& path, const char (&magic)[9], int64_t rows,
    const char* role) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path));
  }
  char header[32] = {};
  in.read(header, sizeof(header));
  if (!in || std::memcmp(header, magic, 8) != 0) {
    return absl::DataLossError(
        absl::StrCat(path, " is not a ", role, " file (bad header)"));
  }
  uint64_t file_rows = 0;
  uint32_t crc = 0;
  std::memcpy(&file_rows, header + 16, 8);
  std::memcpy(&crc, header + 28, 4);
  if (static_cast<int64_t>(file_rows) != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " holds ", file_rows, " rows but the index has ", rows));
  }
  absl::StatusOr<int64_t> bytes = FileBytes(path);
  if (!bytes.ok()) return bytes.status();
  VersionManifest::File file;
  file.set_role(role);
  file.set_suffix(SuffixOf(role));
  file.set_bytes(*bytes);
  file.set_crc32(Hex(crc));
  return file;
}

// True when `pid` names no running process on this host.
bool ProcessGone(int64_t pid) {
  if (pid <= 0 || pid > INT32_MAX) return false;
  return kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

// The pid of a temporary name of `base`: BASE[.anything].tmp.PID[.rest],
// or 0 when `name` is not one.
int64_t TemporaryPid(absl::string_view name, absl::string_view base) {
  if (!absl::StartsWith(name, absl::StrCat(base, "."))) return 0;
  size_t at = name.find(".tmp.", base.size());
  while (at != absl::string_view::npos) {
    const size_t digits = at + 5;
    size_t end = digits;
    while (end < name.size() && absl::ascii_isdigit(name[end])) ++end;
    int64_t pid = 0;
    if (end > digits && (end == name.size() || name[end] == '.') &&
        absl::SimpleAtoi(name.substr(digits, end - digits), &pid)) {
      return pid;
    }
    at = name.find(".tmp.", at + 1);
  }
  return 0;
}

}  // namespace

const std::vector<VersionRole>& VersionRoles() {
  static const std::vector<VersionRole> roles = {{kRoleIndex, ""},
                                                 {kRoleSidecar, ".meta.json"},
                                                 {kRoleIds, ".ids"},
                                                 {kRolePayloads, ".payloads"},
                                                 {kRoleAttributes, ".attrs"},
                                                 {kRoleVectors, ".vectors"},
                                                 {kRoleText, ".text"}};
  return roles;
}

std::string ManifestPath(const std::string& index_path) {
  return index_path + ".manifest.json";
}

std::string NewVersionId() {
  std::random_device device;
  const uint64_t random =
      (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
  const uint64_t clock = static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  return absl::StrFormat("%016x", random ^ (clock * 0x9e3779b97f4a7c15ULL));
}

absl::StatusOr<VersionManifest> ReadVersionManifest(
    const std::string& index_path) {
  const std::string path = ManifestPath(index_path);
  VersionManifest manifest;
  if (absl::Status s = ReadJsonFile(path, "version manifest", &manifest);
      !s.ok()) {
    return s;
  }
  if (manifest.format_version() > kVersionManifestFormatVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("version manifest ", path, " has format_version ",
                     manifest.format_version(), "; this knnd reads up to ",
                     kVersionManifestFormatVersion));
  }
  for (int i = 0; i < manifest.files_size(); ++i) {
    const VersionManifest::File& file = manifest.files(i);
    const char* suffix = SuffixOf(file.role());
    if (suffix == nullptr || file.suffix() != suffix) {
      return absl::InvalidArgumentError(
          absl::StrCat("version manifest ", path, " binds a file of role \"",
                       file.role(), "\" with suffix \"", file.suffix(),
                       "\", which this knnd does not know"));
    }
    for (int j = 0; j < i; ++j) {
      if (manifest.files(j).role() == file.role()) {
        return absl::InvalidArgumentError(
            absl::StrCat("version manifest ", path, " binds two files of role ",
                         file.role()));
      }
    }
  }
  if (BoundFile(manifest, kRoleIndex) == nullptr ||
      BoundFile(manifest, kRoleSidecar) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "version manifest ", path, " binds no index file or no sidecar"));
  }
  return manifest;
}

const VersionManifest::File* BoundFile(const VersionManifest& manifest,
                                       absl::string_view role) {
  for (const VersionManifest::File& file : manifest.files()) {
    if (file.role() == role) return &file;
  }
  return nullptr;
}

absl::Status SealVersion(const std::string& index_path,
                         absl::string_view written_by) {
  const std::string sidecar_path = MetadataPath(index_path);
  absl::StatusOr<knnd::v1::IndexMetadata> sidecar =
      ReadIndexMetadata(sidecar_path);
  if (!sidecar.ok()) return sidecar.status();
  absl::StatusOr<int64_t> index_bytes = FileBytes(index_path);
  if (!index_bytes.ok()) return index_bytes.status();
  if (*index_bytes != sidecar->file_bytes()) {
    return absl::DataLossError(absl::StrCat(
        "index file ", index_path, " has ", *index_bytes, " bytes but ",
        sidecar_path, " records ", sidecar->file_bytes(),
        "; not sealing a version whose files disagree"));
  }
  VersionManifest manifest;
  manifest.set_format_version(kVersionManifestFormatVersion);
  manifest.set_version_id(NewVersionId());
  manifest.set_build_id(sidecar->build_id());
  manifest.set_written_by(std::string(written_by));
  manifest.set_created(
      absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()));
  VersionManifest::File* index = manifest.add_files();
  index->set_role(kRoleIndex);
  index->set_suffix("");
  index->set_bytes(*index_bytes);
  index->set_crc32(sidecar->crc32());
  absl::StatusOr<int64_t> sidecar_bytes = FileBytes(sidecar_path);
  if (!sidecar_bytes.ok()) return sidecar_bytes.status();
  absl::StatusOr<std::string> sidecar_crc = FileCrc32(sidecar_path);
  if (!sidecar_crc.ok()) return sidecar_crc.status();
  VersionManifest::File* meta = manifest.add_files();
  meta->set_role(kRoleSidecar);
  meta->set_suffix(SuffixOf(kRoleSidecar));
  meta->set_bytes(*sidecar_bytes);
  meta->set_crc32(*sidecar_crc);

  const int64_t rows = sidecar->ntotal();
  std::vector<absl::StatusOr<VersionManifest::File>> companions;
  if (sidecar->id_table()) {
    companions.push_back(CompanionEntry(
        IdTable::Open(IdTablePath(index_path), rows, false), kRoleIds));
  }
  if (sidecar->payloads()) {
    companions.push_back(
        CompanionEntry(PayloadFile::Open(PayloadPath(index_path), rows, false),
                       kRolePayloads));
  }
  if (sidecar->attributes()) {
    companions.push_back(CompanionEntry(
        AttributeStore::Open(AttributeStorePath(index_path), rows, false),
        kRoleAttributes));
  }
  if (!sidecar->text_field().empty()) {
    companions.push_back(HeaderCompanionEntry(index_path + SuffixOf(kRoleText),
                                              "KNNDTEXT", rows, kRoleText));
  }
  if (Exists(VectorsPath(index_path))) {
    companions.push_back(CompanionEntry(
        VectorsFile::Open(VectorsPath(index_path),
                          static_cast<int>(sidecar->dim()), rows, false),
        kRoleVectors));
  }
  for (absl::StatusOr<VersionManifest::File>& entry : companions) {
    if (!entry.ok()) {
      return absl::Status(
          entry.status().code(),
          absl::StrCat("cannot seal the version at ", index_path, ": ",
                       entry.status().message()));
    }
    *manifest.add_files() = std::move(*entry);
  }
  return WriteJsonFile(ManifestPath(index_path), manifest, "version manifest");
}

absl::Status RewriteSidecar(const std::string& index_path,
                            const knnd::v1::IndexMetadata& metadata,
                            absl::string_view written_by) {
  absl::StatusOr<VersionManifest> manifest = ReadVersionManifest(index_path);
  if (!manifest.ok()) return manifest.status();
  if (absl::Status s = CheckIndexAndSidecar(index_path, *manifest); !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteIndexMetadata(MetadataPath(index_path), metadata);
      !s.ok()) {
    return s;
  }
  return SealVersion(index_path, written_by);
}

absl::Status CheckIndexAndSidecar(const std::string& index_path,
                                  const VersionManifest& manifest) {
  const std::string manifest_path = ManifestPath(index_path);
  const VersionManifest::File* index = BoundFile(manifest, kRoleIndex);
  const VersionManifest::File* sidecar = BoundFile(manifest, kRoleSidecar);
  absl::StatusOr<int64_t> index_bytes = FileBytes(index_path);
  if (!index_bytes.ok()) return index_bytes.status();
  if (*index_bytes != index->bytes()) {
    return absl::DataLossError(
        absl::StrCat("index file ", index_path, " has ", *index_bytes,
                     " bytes but ", manifest_path, " binds one of ",
                     index->bytes(), ": the file is not this version's"));
  }
  const std::string sidecar_path = MetadataPath(index_path);
  absl::StatusOr<int64_t> sidecar_bytes = FileBytes(sidecar_path);
  if (!sidecar_bytes.ok()) {
    return absl::DataLossError(absl::StrCat(
        manifest_path, " binds sidecar ", sidecar_path, ", which is missing"));
  }
  absl::StatusOr<std::string> sidecar_crc = FileCrc32(sidecar_path);
  if (!sidecar_crc.ok()) return sidecar_crc.status();
  if (*sidecar_bytes != sidecar->bytes() || *sidecar_crc != sidecar->crc32()) {
    return absl::DataLossError(absl::StrCat(
        "sidecar ", sidecar_path, " (", *sidecar_bytes, " bytes, CRC-32 ",
        *sidecar_crc, ") is not the one ", manifest_path, " binds (",
        sidecar->bytes(), " bytes, CRC-32 ", sidecar->crc32(),
        "): the file is not this version's"));
  }
  absl::StatusOr<knnd::v1::IndexMetadata> meta =
      ReadIndexMetadata(sidecar_path);
  if (!meta.ok()) return meta.status();
  if (meta->crc32() != index->crc32() || meta->file_bytes() != index->bytes()) {
    return absl::DataLossError(absl::StrCat(
        sidecar_path, " records index ", meta->file_bytes(), " bytes, CRC-32 ",
        meta->crc32(), " but ", manifest_path, " binds ", index->bytes(),
        " bytes, CRC-32 ", index->crc32()));
  }
  return absl::OkStatus();
}

absl::Status CheckBoundCompanion(const std::string& index_path,
                                 const VersionManifest& manifest,
                                 absl::string_view role, int64_t bytes,
                                 uint32_t content_crc32) {
  const VersionManifest::File* bound = BoundFile(manifest, role);
  const std::string path = index_path + SuffixOf(role);
  if (bound == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(ManifestPath(index_path),
                                                      " binds no ", role,
                                                      " file, but the "
                                                      "version needs ",
                                                      path));
  }
  if (bytes != bound->bytes() || Hex(content_crc32) != bound->crc32()) {
    return absl::DataLossError(absl::StrCat(
        role, " file ", path, " (", bytes, " bytes, content CRC-32 ",
        Hex(content_crc32), ") is not the one ", ManifestPath(index_path),
        " binds (", bound->bytes(), " bytes, CRC-32 ", bound->crc32(),
        "): a file of another build"));
  }
  return absl::OkStatus();
}

std::vector<std::string> VersionFilesPresent(const std::string& index_path) {
  std::vector<std::string> present;
  for (const VersionRole& role : VersionRoles()) {
    if (role.suffix[0] == '\0') continue;
    const std::string path = index_path + role.suffix;
    if (Exists(path)) present.push_back(path);
  }
  return present;
}

std::string StagingPathFor(const std::string& index_path) {
  return TempPathFor(index_path);
}

absl::Status CommitStagedVersion(const std::string& staged,
                                 const std::string& index_path,
                                 std::vector<std::string>* removed) {
  absl::StatusOr<VersionManifest> manifest = ReadVersionManifest(staged);
  if (!manifest.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot commit ", staged, " as ", index_path, ": ",
                     manifest.status().message()));
  }
  // From here until the new manifest is in place, index_path is no
  // version: the loader refuses it rather than mixing two.
  if (std::remove(ManifestPath(index_path).c_str()) == 0) {
    SyncDirectoryOf(index_path);
  }
  for (const VersionRole& role : VersionRoles()) {
    const std::string target = index_path + role.suffix;
    if (BoundFile(*manifest, role.role) == nullptr) {
      if (std::remove(target.c_str()) == 0 && removed != nullptr) {
        removed->push_back(target);
      }
      continue;
    }
    const std::string source = staged + role.suffix;
    if (std::rename(source.c_str(), target.c_str()) != 0) {
      return absl::UnavailableError(absl::StrCat(
          "cannot rename ", source, " to ", target, ": ", std::strerror(errno),
          " (", index_path, " has no manifest now; run again)"));
    }
  }
  SyncDirectoryOf(index_path);
  const std::string manifest_source = ManifestPath(staged);
  const std::string manifest_target = ManifestPath(index_path);
  if (std::rename(manifest_source.c_str(), manifest_target.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", manifest_source, " to ", manifest_target,
                     ": ", std::strerror(errno)));
  }
  SyncDirectoryOf(index_path);
  return absl::OkStatus();
}

void RemoveStagedVersion(const std::string& staged) {
  const size_t slash = staged.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : staged.substr(0, slash);
  const std::string base =
      slash == std::string::npos ? staged : staged.substr(slash + 1);
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == base || absl::StartsWith(name, base + ".")) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
  }
}

std::vector<std::string> RemoveStaleTemporaries(const std::string& index_path) {
  const size_t slash = index_path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : index_path.substr(0, slash);
  const std::string base =
      slash == std::string::npos ? index_path : index_path.substr(slash + 1);
  std::vector<std::string> stale;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t pid = TemporaryPid(name, base);
    if (pid == 0 || pid == getpid() || !ProcessGone(pid)) continue;
    std::error_code ignored;
    if (fs::remove_all(it->path(), ignored) > 0) {
      stale.push_back(it->path().string());
    }
  }
  return stale;
}

}  // namespace knnd

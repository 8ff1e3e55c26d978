// knnctl publish, seal, reload and versions: numbered index versions in a
// directory, the manifest that makes a version of an index's files, and
// knnd's admin API that loads, pins and lists them.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "command.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/lifecycle/index_source.h"
#include "knnd/storage/version_manifest.h"
#include "knnd/v1/admin_service.grpc.pb.h"
#include "knnd_client.h"

namespace knnd::knnctl {
namespace {

using knnd::v1::AdminService;

struct PublishOptions {
  std::string index;
  std::string dir;
};

struct ReloadOptions {
  KnndClient::Options client;
  absl::optional<int64_t> pin;
};

// `none` for version 0 (nothing pinned), else "version N".
std::string PinnedText(int64_t version, const char* none) {
  return version == 0 ? none : absl::StrCat("version ", version);
}

int Publish(const PublishOptions& options) {
  if (options.index.empty() || options.dir.empty()) {
    return Fail("publish needs --index FILE and --dir DIR");
  }
  absl::StatusOr<IndexVersion> published =
      PublishVersion(options.dir, options.index);
  if (!published.ok()) return Fail(published.status());
  std::printf("published: %s as version %lld (%s)\n", options.index.c_str(),
              static_cast<long long>(published->version),
              published->path.c_str());
  std::printf(
      "next:      knnctl reload (admin API), kill -HUP $(pidof "
      "knnd), or set index_poll_interval_ms\n");
  return kExitOk;
}

// Seals the files beside an index written before manifests existed (or by
// hand) into one version, once they load together with every checksum
// read: the upgrade path for versions an older knnctl wrote.
int Seal(const std::string& index) {
  if (index.empty()) return Fail("seal needs --index FILE");
  absl::StatusOr<knnd::v1::VersionManifest> existing =
      ReadVersionManifest(index);
  if (existing.ok()) {
    return Fail(
        absl::StrCat(index, " is sealed already (", ManifestPath(index), ")"));
  }
  if (!absl::IsNotFound(existing.status())) return Fail(existing.status());
  if (absl::Status s = SealVersion(index, "knnctl seal"); !s.ok()) {
    return Fail(s);
  }
  LoadOptions options;
  options.use_precomputed_table = false;
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> loaded =
      IndexSnapshot::Load(index, options);
  if (!loaded.ok()) {
    std::remove(ManifestPath(index).c_str());
    return Fail(absl::StrCat("not sealed: ", loaded.status().message()));
  }
  absl::StatusOr<knnd::v1::VersionManifest> manifest =
      ReadVersionManifest(index);
  if (!manifest.ok()) return Fail(manifest.status());
  std::vector<std::string> roles;
  for (const auto& file : manifest->files()) roles.push_back(file.role());
  std::printf("sealed:   %s (%s)\n", ManifestPath(index).c_str(),
              absl::StrJoin(roles, ", ").c_str());
  return kExitOk;
}

// Loads (or pins) a version through knnd's admin API and says what serves.
int Reload(const ReloadOptions& options) {
  absl::StatusOr<std::unique_ptr<KnndClient>> client =
      KnndClient::Create(options.client);
  if (!client.ok()) return Fail(client.status());
  auto stub = AdminService::NewStub((*client)->channel());
  knnd::v1::ReloadIndexRequest request;
  if (options.pin.has_value()) request.set_version(*options.pin);
  knnd::v1::ReloadIndexResponse response;
  grpc::ClientContext context;
  (*client)->Prepare(context);
  grpc::Status s = stub->ReloadIndex(&context, request, &response);
  if (!s.ok()) return FailRpc("reload", s);
  std::printf("serving:  version %lld (%s)\n",
              static_cast<long long>(response.version()),
              response.path().c_str());
  std::printf("before:   version %lld\n",
              static_cast<long long>(response.previous_version()));
  std::printf("loaded:   %s\n",
              response.loaded() ? "yes" : "no (already serving, or retained)");
  std::printf("pinned:   %s\n", PinnedText(response.pinned_version(),
                                           "no (follows the latest version)")
                                    .c_str());
  std::printf("took:     %.1f ms\n", response.duration_ms());
  return kExitOk;
}

int Versions(const KnndClient::Options& options) {
  absl::StatusOr<std::unique_ptr<KnndClient>> client =
      KnndClient::Create(options);
  if (!client.ok()) return Fail(client.status());
  auto stub = AdminService::NewStub((*client)->channel());
  knnd::v1::ListVersionsResponse response;
  grpc::ClientContext context;
  (*client)->Prepare(context);
  grpc::Status s =
      stub->ListVersions(&context, knnd::v1::ListVersionsRequest(), &response);
  if (!s.ok()) return FailRpc("versions", s);
  std::printf("%8s  %-8s  %s\n", "version", "state", "path");
  for (const knnd::v1::IndexVersionInfo& v : response.versions()) {
    const char* state = v.serving()    ? "serving"
                        : v.retained() ? "retained"
                        : v.refused()  ? "refused"
                                       : "-";
    std::printf("%8lld  %-8s  %s%s\n", static_cast<long long>(v.version()),
                state, v.path().c_str(),
                v.refused()
                    ? absl::StrCat("\n          ", v.refused_reason()).c_str()
                    : "");
  }
  std::printf("pinned:  %s\n",
              PinnedText(response.pinned_version(), "no").c_str());
  return kExitOk;
}

}  // namespace

std::function<int()> DefinePublish(FlagSet& flags) {
  auto options = std::make_shared<PublishOptions>();
  flags.Add("index", &options->index, "FILE",
            "Index file to publish, with the files its manifest "
            "INDEX.manifest.json binds (written by knnctl build and "
            "update); the copy is loaded and every file checked.");
  flags.Add("dir", &options->dir, "DIR",
            "Versions directory knnd serves (knnd --index DIR): the file "
            "becomes DIR/<next N>/index.faiss.");
  return [options] { return Publish(*options); };
}

std::function<int()> DefineSeal(FlagSet& flags) {
  auto index = std::make_shared<std::string>();
  flags.Add("index", index.get(), "FILE",
            "Index file whose sidecar and companions (.ids, .payloads, "
            ".attrs, .vectors) to bind; they must load together, every "
            "checksum read. Only for files you know belong together: a "
            "build or update that did not finish is run again instead.");
  return [index] { return Seal(*index); };
}

std::function<int()> DefineReload(FlagSet& flags) {
  auto options = std::make_shared<ReloadOptions>();
  flags.Add("pin", &options->pin, "N",
            "Pin version N and serve it (rollback); 0 unpins and serves the "
            "latest. Unset: serve the latest (or pinned) version.");
  KnndClient::AddFlags(KnndClient::Api::kAdmin, flags, options->client);
  return [options] { return Reload(*options); };
}

std::function<int()> DefineVersions(FlagSet& flags) {
  auto options = std::make_shared<KnndClient::Options>();
  KnndClient::AddFlags(KnndClient::Api::kAdmin, flags, *options);
  return [options] { return Versions(*options); };
}

}  // namespace knnd::knnctl

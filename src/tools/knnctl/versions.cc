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
#include "remote_publish.h"

namespace knnd::knnctl {
namespace {

using knnd::v1::AdminService;

struct PublishOptions {
  std::string index;
  std::string dir;
  std::string remote;
  int shards = 0;
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
  if (options.index.empty() || options.dir.empty() == options.remote.empty()) {
    return Fail(
        "publish needs --index FILE and one of --dir DIR and --remote "
        "REMOTE:bucket/prefix");
  }
  if (options.shards < 0) {
    return Fail(absl::StrCat("--shards ", options.shards, " is negative"));
  }
  if (!options.remote.empty()) {
    return PublishToRemote({options.index, options.remote, options.shards});
  }
  if (options.shards > 0) {
    return Fail(
        "--shards publishes a set to --remote; with --dir, publish each "
        "shard INDEX.shard-S-of-N into shard S's versions directory");
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
            "update); the copy is loaded and every file checked. With "
            "--shards N: the OUT of the set OUT.shard-S-of-N.");
  flags.Add("dir", &options->dir, "DIR",
            "Versions directory knnd serves (knnd --index DIR): the file "
            "becomes DIR/<next N>/index.faiss.");
  flags.Add("remote", &options->remote, "REMOTE:bucket/prefix",
            "Instead of --dir: upload the version, checked and loaded "
            "first, to object storage as PREFIX/<next N>/ (index.faiss and "
            "its files; a set's shard S under shard-S/), then "
            "PREFIX/<N>/bucket-manifest.json (every file's size and "
            "SHA-256) last, which pods' knnd_bucket_sync wait for. Runs "
            "rclone, which must be on PATH (Debian package rclone). The "
            "remote is rclone's: e.g. s3store:bucket/knnd with "
            "RCLONE_CONFIG_S3STORE_TYPE=s3, _PROVIDER, _ENDPOINT, "
            "_ENV_AUTH=true or _ACCESS_KEY_ID and _SECRET_ACCESS_KEY in the "
            "environment (docs/deployment.md); other rclone flags as "
            "variables too (RCLONE_TRANSFERS, RCLONE_BWLIMIT). Roll back "
            "by publishing an older build again: it gets a new N.");
  flags.Add("shards", &options->shards, "N",
            "With --remote: publish the sharded set INDEX.shard-0-of-N .. "
            "INDEX.shard-<N-1>-of-N as one version.");
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

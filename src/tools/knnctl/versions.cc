// knnctl publish, reload and versions: numbered index versions in a
// directory, and knnd's admin API that loads, pins and lists them.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "command.h"
#include "knnd/lifecycle/index_source.h"
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
            "Index file to publish (with its sidecar, vectors file and id "
            "table); it is loaded and checked first.");
  flags.Add("dir", &options->dir, "DIR",
            "Versions directory knnd serves (knnd --index DIR): the file "
            "becomes DIR/<next N>/index.faiss.");
  return [options] { return Publish(*options); };
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

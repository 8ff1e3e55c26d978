#include "testing/version_util.h"

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "knnd/lifecycle/index_source.h"

namespace knnd::testing {

RunningServer ServeVersionOne(const TempDir& tmp, const std::string& dir) {
  PublishIndex(tmp, dir, VersionSpec(1));
  return StartServer(TestConfig(dir));
}

std::vector<Sample> Samples(RunningServer& s) {
  absl::StatusOr<std::string> body =
      HttpGet(s.server->metrics_port(), "/metrics");
  EXPECT_TRUE(body.ok()) << body.status();
  if (!body.ok()) return {};
  return ParseExposition(*body);
}

double Scrape(RunningServer& s, const std::string& name,
              const std::map<std::string, std::string>& labels) {
  return FindSample(Samples(s), name, labels).value_or(-1);
}

double Reloads(RunningServer& s, const std::string& result) {
  return Scrape(s, "knnd_index_reloads_total", {{"result", result}});
}

std::string ChecksumState(RunningServer& s) {
  const std::vector<Sample> samples = Samples(s);
  std::string state;
  for (const char* name : {"unchecked", "pending", "verified", "failed"}) {
    const double v =
        FindSample(samples, "knnd_index_checksum", {{"state", name}})
            .value_or(-1);
    if (v == 1) {
      if (!state.empty()) return "";
      state = name;
    } else if (v != 0) {
      return "";
    }
  }
  return state;
}

knnd::v1::SearchRequest Request(uint32_t seed) {
  std::vector<float> q = MakeData(2, kDim, seed);
  knnd::v1::SearchRequest r;
  *r.mutable_vectors() = {q.begin(), q.end()};
  r.set_k(5);
  return r;
}

std::unique_ptr<knnd::v1::AdminService::Stub> AdminStub(RunningServer& s) {
  EXPECT_NE(s.server->admin_port(), 0);
  return knnd::v1::AdminService::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", s.server->admin_port()),
      grpc::InsecureChannelCredentials()));
}

grpc::Status ReloadRpc(knnd::v1::AdminService::Stub& admin,
                       absl::optional<int64_t> version,
                       knnd::v1::ReloadIndexResponse* response) {
  knnd::v1::ReloadIndexRequest request;
  if (version.has_value()) request.set_version(*version);
  grpc::ClientContext context;
  return admin.ReloadIndex(&context, request, response);
}

int64_t ServedVersion(RunningServer& s) {
  knnd::v1::SearchResponse response;
  grpc::ClientContext context;
  grpc::Status status = s.stub->Search(&context, Request(7), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.index_version();
}

}  // namespace knnd::testing

// Test helpers for index versions served by an in-process server: seeded
// versions whose ids name them, publishing into a versions directory, the
// admin API's ReloadIndex, and the metrics a reload moves.
#ifndef KNND_TESTS_VERSION_UTIL_H_
#define KNND_TESTS_VERSION_UTIL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/types/optional.h"
#include "knnd/v1/admin_service.grpc.pb.h"
#include "knnd/v1/knn_service.pb.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd::testing {

inline constexpr int kDim = 16;
inline constexpr int64_t kRows = 1000;
// The size of test_util's VersionSpec(): kRows x kDim vectors per version,
// whose ids start at version * kVersionIdStride.

// Publishes version 1 in `dir` and serves it with the test configuration.
RunningServer ServeVersionOne(const TempDir& tmp, const std::string& dir);

// Every sample on s's /metrics (none when the scrape fails).
std::vector<Sample> Samples(RunningServer& s);

// The value of one series on s's /metrics; -1 when it is missing.
double Scrape(RunningServer& s, const std::string& name,
              const std::map<std::string, std::string>& labels = {});

// knnd_index_reloads_total{result=`result`} ("ok" or "failed").
double Reloads(RunningServer& s, const std::string& result);

// The state whose knnd_index_checksum series is 1 ("" unless exactly one),
// from one scrape.
std::string ChecksumState(RunningServer& s);

// Two kDim queries seeded with `seed`, k = 5.
knnd::v1::SearchRequest Request(uint32_t seed);

// A stub of s's admin API, on its own port.
std::unique_ptr<knnd::v1::AdminService::Stub> AdminStub(RunningServer& s);

// ReloadIndex with `version` (absent: the latest or pinned one).
grpc::Status ReloadRpc(knnd::v1::AdminService::Stub& admin,
                       absl::optional<int64_t> version,
                       knnd::v1::ReloadIndexResponse* response);

// The version that answers a search on s.
int64_t ServedVersion(RunningServer& s);

}  // namespace knnd::testing

#endif  // KNND_TESTS_VERSION_UTIL_H_

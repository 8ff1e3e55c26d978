// Conversion from absl::Status (used inside knnd) to grpc::Status (on the
// wire). The two share canonical code numbers. Thread-safety: pure.
#ifndef KNND_RPC_STATUS_UTIL_H_
#define KNND_RPC_STATUS_UTIL_H_

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace knnd {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace knnd

#endif  // KNND_RPC_STATUS_UTIL_H_

// KnndClient: knnctl's connection to one of knnd's gRPC APIs (the search
// API or the admin API), as the client flags of a command describe it: the
// channel (TLS when --tls_ca is given), the bearer token of --token_file and
// the deadline of every call.
//
// Ownership: owns the channel; stubs made from channel() share it.
// Thread-safety: immutable after Create(); knnctl uses it from one thread.
#ifndef KNND_TOOLS_KNNCTL_KNND_CLIENT_H_
#define KNND_TOOLS_KNNCTL_KNND_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "flag_set.h"

namespace knnd::knnctl {

class KnndClient {
 public:
  enum class Api { kSearch, kAdmin };

  struct Options {
    std::string addr;  // HOST:PORT; AddFlags() sets the API's default
    std::string token_file;
    std::string tls_ca;
    std::string tls_cert;
    std::string tls_key;
    int timeout_ms = 10000;
  };

  // Adds --addr (default localhost:50051 for the search API, localhost:50052
  // for the admin API), then a section "connection flags" of --timeout_ms,
  // --token_file and the TLS flags, all bound to `options`.
  static void AddFlags(Api api, FlagSet& flags, Options& options);

  // Reads the TLS and token files. INVALID_ARGUMENT naming the flag and the
  // file when one cannot be read or holds no token.
  static absl::StatusOr<std::unique_ptr<KnndClient>> Create(
      const Options& options);

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  // Sets the deadline of one call (--timeout_ms from now) and its
  // "authorization: Bearer" metadata when there is a token.
  void Prepare(grpc::ClientContext& context) const;

 private:
  KnndClient(std::shared_ptr<grpc::Channel> channel, std::string token,
             int timeout_ms)
      : channel_(std::move(channel)),
        token_(std::move(token)),
        timeout_ms_(timeout_ms) {}

  const std::shared_ptr<grpc::Channel> channel_;
  const std::string token_;  // empty: no --token_file
  const int timeout_ms_;
};

// Prints "knnctl: <what> failed: <CODE>: <message>" on stderr and returns
// kExitError.
int FailRpc(const char* what, const grpc::Status& status);

}  // namespace knnd::knnctl

#endif  // KNND_TOOLS_KNNCTL_KNND_CLIENT_H_

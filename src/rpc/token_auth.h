// TokenAuthenticator: checks the "authorization: Bearer <token>" metadata of
// a call against two sets of tokens read from files, one for the search API
// and one for the admin API (an admin token is accepted for both).
//
// Only SHA-256 digests of the tokens are kept, and a presented token is
// compared with every digest of a set in constant time, so neither the
// memory nor the timing of a check gives a token away; no token text is
// ever logged or put into a status message.
//
// Ownership: owns the digests; the files are read by Create() and Reload().
// Thread-safety: Check() may run on any number of threads while Reload()
// swaps the sets (SIGHUP).
#ifndef KNND_RPC_TOKEN_AUTH_H_
#define KNND_RPC_TOKEN_AUTH_H_

#include <array>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server_context.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"

namespace knnd {

class TokenAuthenticator {
 public:
  struct Options {
    // Files of tokens, one per line; empty: that API needs no token.
    std::string search_token_file;
    std::string admin_token_file;
  };

  // Reads both files; an unreadable file, one without tokens or with a
  // malformed line is INVALID_ARGUMENT naming the file and line.
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> Create(
      const Options& options);

  // Re-reads both files. On error the previous sets stay in force.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);

  // The decision for a call of `method` (its full path,
  // "/package.Service/Method") carrying `authorization` (the metadata
  // value, absent when the call has none):
  //   grpc.health.v1 methods, or no tokens configured for the method's API:
  //     OK;
  //   missing, malformed or unknown token: UNAUTHENTICATED;
  //   a search token on a /knnd.v1.AdminService/ method: PERMISSION_DENIED.
  absl::Status Check(absl::string_view method,
                     absl::optional<absl::string_view> authorization) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Check() with the authorization metadata of the call `context` (more
  // than one authorization entry is malformed).
  absl::Status CheckCall(const grpc::ServerContextBase& context,
                         absl::string_view method) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The longest token accepted in a file and in a call.
  static constexpr size_t kMaxTokenBytes = 4096;
  static constexpr size_t kMinTokenBytes = 16;

 private:
  using Digest = std::array<unsigned char, 32>;
  struct TokenSets {
    absl::optional<std::vector<Digest>> search;  // nullopt: API open
    absl::optional<std::vector<Digest>> admin;
  };

  explicit TokenAuthenticator(const Options& options) : options_(options) {}
  static absl::StatusOr<TokenSets> ReadSets(const Options& options);

  const Options options_;
  mutable absl::Mutex mu_;
  TokenSets sets_ ABSL_GUARDED_BY(mu_);
};

// The first token of a token file (the format above), for a client that
// sends it: knnd's front sends it to its shards (shard_token_file).
// INVALID_ARGUMENT naming the file (never the text) when it cannot be read
// or holds no valid token.
absl::StatusOr<std::string> ReadFirstToken(const std::string& path);

}  // namespace knnd

#endif  // KNND_RPC_TOKEN_AUTH_H_

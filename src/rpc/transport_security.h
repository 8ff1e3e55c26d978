// Transport security of knnd's gRPC listeners: plaintext, TLS or mutual TLS
// from the tls_* fields of the configuration.
// Thread-safety: pure functions; the credentials they return poll their
// files on gRPC's own thread.
#ifndef KNND_RPC_TRANSPORT_SECURITY_H_
#define KNND_RPC_TRANSPORT_SECURITY_H_

#include <memory>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "knnd/v1/config.pb.h"

namespace knnd {

// Whether `config` asks for TLS on listen_address.
bool UsesTls(const knnd::v1::ServerConfig& config);

// Insecure credentials without TLS; otherwise TLS credentials that re-read
// the certificate, key and client CA files every tls_reload_interval_s
// (rotation without restart) and, with a client CA, verify client
// certificates (required unless require_client_cert is false). The files
// are checked first: unreadable ones, PEM that does not parse or a key that
// does not match the certificate are FAILED_PRECONDITION naming the file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const knnd::v1::ServerConfig& config);

// The credentials knnd's front connects to its shards with: TLS checked
// against shard_tls_ca_file, with shard_tls_cert_file / shard_tls_key_file
// as its client certificate when set (files re-read every
// tls_reload_interval_s); plaintext when shard_tls_ca_file is empty. The
// files are parsed now: FAILED_PRECONDITION naming the field and file for
// an unreadable file or a key that does not match its certificate.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeShardChannelCredentials(const knnd::v1::ServerConfig& config);

}  // namespace knnd

#endif  // KNND_RPC_TRANSPORT_SECURITY_H_

#include "knnd_client.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "command.h"

namespace knnd::knnctl {
namespace {

// The whole of the file `path` given as --`flag`.
absl::StatusOr<std::string> ReadFlagFile(const char* flag,
                                         const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " ", path, ": cannot read: ", std::strerror(errno)));
  }
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The first token line of --token_file (blank lines and # comments
// skipped); "" without the flag.
absl::StatusOr<std::string> ReadToken(const std::string& path) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> text = ReadFlagFile("token_file", path);
  if (!text.ok()) return text.status();
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty() && line[0] != '#') return std::string(line);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--token_file ", path, " holds no token"));
}

}  // namespace

void KnndClient::AddFlags(Api api, FlagSet& flags, Options& options) {
  options.addr = api == Api::kSearch ? "localhost:50051" : "localhost:50052";
  flags.Add("addr", &options.addr, "HOST:PORT",
            api == Api::kSearch
                ? "knnd's search API (its listen_address)."
                : "knnd's admin API (its admin_listen_address; the search "
                  "port does not serve it).");
  flags.StartSection("connection flags");
  flags.Add("timeout_ms", &options.timeout_ms, "MS",
            "Deadline of each call, in milliseconds.");
  flags.Add("token_file", &options.token_file, "FILE",
            "File whose first token line (blank lines and # comments "
            "skipped) is sent as 'authorization: Bearer <token>' on every "
            "call: knnd's search_token_file / admin_token_file. Never a flag "
            "value, so the token stays out of the process list.");
  flags.Add("tls_ca", &options.tls_ca, "PEM",
            "CA bundle that signed knnd's certificate: connect with TLS.");
  flags.Add("tls_cert", &options.tls_cert, "PEM",
            "With --tls_ca: client certificate chain (mutual TLS).");
  flags.Add("tls_key", &options.tls_key, "PEM",
            "With --tls_cert: its private key.");
}

absl::StatusOr<std::unique_ptr<KnndClient>> KnndClient::Create(
    const Options& options) {
  absl::StatusOr<std::string> token = ReadToken(options.token_file);
  if (!token.ok()) return token.status();
  std::shared_ptr<grpc::Channel> channel;
  if (options.tls_ca.empty()) {
    channel =
        grpc::CreateChannel(options.addr, grpc::InsecureChannelCredentials());
  } else {
    grpc::SslCredentialsOptions tls;
    absl::StatusOr<std::string> ca = ReadFlagFile("tls_ca", options.tls_ca);
    if (!ca.ok()) return ca.status();
    tls.pem_root_certs = std::move(*ca);
    if (!options.tls_cert.empty()) {
      absl::StatusOr<std::string> cert =
          ReadFlagFile("tls_cert", options.tls_cert);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key =
          ReadFlagFile("tls_key", options.tls_key);
      if (!key.ok()) return key.status();
      tls.pem_cert_chain = std::move(*cert);
      tls.pem_private_key = std::move(*key);
    }
    channel = grpc::CreateChannel(options.addr, grpc::SslCredentials(tls));
  }
  return std::unique_ptr<KnndClient>(new KnndClient(
      std::move(channel), std::move(*token), options.timeout_ms));
}

void KnndClient::Prepare(grpc::ClientContext& context) const {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(timeout_ms_));
  if (!token_.empty()) {
    context.AddMetadata("authorization", "Bearer " + token_);
  }
}

int FailRpc(const char* what, const grpc::Status& status) {
  return Fail(
      absl::StrCat(what, " failed: ",
                   absl::StatusCodeToString(
                       static_cast<absl::StatusCode>(status.error_code())),
                   ": ", status.error_message()));
}

}  // namespace knnd::knnctl

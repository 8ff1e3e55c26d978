#include "knnd/rpc/transport_security.h"

#include <cstdio>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/str_cat.h"

namespace knnd {
namespace {

// Frees what OpenSSL's PEM readers return.
struct OpenSslFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
  void operator()(X509* cert) const { X509_free(cert); }
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

// The first PEM object of the file `path` (config field `field`), read by
// `read` (one of OpenSSL's PEM_read_bio_* functions).
template <typename T>
absl::StatusOr<std::unique_ptr<T, OpenSslFree>> ReadPem(
    const char* field, const std::string& path, const char* what,
    T* (*read)(BIO*, T**, pem_password_cb*, void*)) {
  std::unique_ptr<BIO, OpenSslFree> bio(BIO_new_file(path.c_str(), "r"));
  if (bio == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, " ", path, " cannot be read"));
  }
  std::unique_ptr<T, OpenSslFree> object(
      read(bio.get(), nullptr, nullptr, nullptr));
  if (object == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, " ", path, " holds no PEM ", what));
  }
  return object;
}

// A certificate and its key (fields `cert_field`, `key_field`) that parse
// and match.
absl::Status CheckPair(const char* cert_field, const std::string& cert_path,
                       const char* key_field, const std::string& key_path) {
  auto cert =
      ReadPem(cert_field, cert_path, "certificate", PEM_read_bio_X509);
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(key_field, key_path, "private key", PEM_read_bio_PrivateKey);
  if (!key.ok()) return key.status();
  if (X509_check_private_key(cert->get(), key->get()) != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        key_field, " ", key_path, " does not match ", cert_field, " ",
        cert_path));
  }
  return absl::OkStatus();
}

// Parses the files now, so that a wrong path or a mismatched pair stops
// knnd at start instead of failing every handshake later.
absl::Status CheckFiles(const knnd::v1::ServerConfig& config) {
  if (absl::Status s = CheckPair("tls_cert_file", config.tls_cert_file(),
                                 "tls_key_file", config.tls_key_file());
      !s.ok()) {
    return s;
  }
  if (config.tls_client_ca_file().empty()) return absl::OkStatus();
  return ReadPem("tls_client_ca_file", config.tls_client_ca_file(),
                 "certificate", PEM_read_bio_X509)
      .status();
}

}  // namespace

bool UsesTls(const knnd::v1::ServerConfig& config) {
  return !config.tls_cert_file().empty();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const knnd::v1::ServerConfig& config) {
  if (!UsesTls(config)) return grpc::InsecureServerCredentials();
  if (absl::Status s = CheckFiles(config); !s.ok()) return s;
  auto provider =
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          config.tls_key_file(), config.tls_cert_file(),
          config.tls_client_ca_file(), config.tls_reload_interval_s());
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (config.tls_client_ca_file().empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(
        config.require_client_cert()
            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeShardChannelCredentials(const knnd::v1::ServerConfig& config) {
  if (config.shard_tls_ca_file().empty()) {
    return grpc::InsecureChannelCredentials();
  }
  if (absl::Status s = ReadPem("shard_tls_ca_file", config.shard_tls_ca_file(),
                               "certificate", PEM_read_bio_X509)
                           .status();
      !s.ok()) {
    return s;
  }
  const bool client_cert = !config.shard_tls_cert_file().empty();
  std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> provider;
  if (client_cert) {
    if (absl::Status s =
            CheckPair("shard_tls_cert_file", config.shard_tls_cert_file(),
                      "shard_tls_key_file", config.shard_tls_key_file());
        !s.ok()) {
      return s;
    }
    provider =
        std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
            config.shard_tls_key_file(), config.shard_tls_cert_file(),
            config.shard_tls_ca_file(), config.tls_reload_interval_s());
  } else {
    provider =
        std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
            config.shard_tls_ca_file(), config.tls_reload_interval_s());
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (client_cert) options.watch_identity_key_cert_pairs();
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace knnd

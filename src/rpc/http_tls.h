// HttpTls: the HTTP listener's TLS material from the files gRPC's listener
// uses (tls_cert_file, tls_key_file, tls_client_ca_file), through GnuTLS
// (libmicrohttpd's TLS library; this file's .cc is the only one that loads
// certificates with it). As gRPC's FileWatcherCertificateProvider does, the
// files are re-read every reload interval and a changed, valid set is used
// for new handshakes; a set that does not load leaves the previous one in
// force (logged).
//
// Client certificates (mutual TLS) are verified here, against the client CA
// bundle in force, rather than by the handshake: libmicrohttpd asks clients
// for a certificate but lets the handshake end without one, so the HTTP
// layer refuses the request instead (401; /healthz stays open, as
// grpc.health does, for Kubernetes' probes, which have no certificate).
//
// Ownership: owns the GnuTLS objects; an identity handed to a handshake is
// kept until the HttpTls is destroyed (GnuTLS may refer to it for the
// session's life), a few KiB per rotation.
// Thread-safety: every method is safe to call concurrently.
#ifndef KNND_RPC_HTTP_TLS_H_
#define KNND_RPC_HTTP_TLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace knnd {

class HttpTls {
 public:
  struct Files {
    std::string cert_file;
    std::string key_file;
    std::string client_ca_file;  // empty: no client certificates
    bool require_client_cert = true;
    absl::Duration reload_interval = absl::Seconds(60);
  };

  // Loads the files: FAILED_PRECONDITION naming the field and file when one
  // cannot be read or parsed, or the key does not match the certificate.
  static absl::StatusOr<std::unique_ptr<HttpTls>> Create(const Files& files);
  ~HttpTls();

  // The client CA bundle as first read ("" without one): given to
  // libmicrohttpd, whose handshake then asks clients for a certificate.
  const std::string& first_client_ca_pem() const { return first_ca_pem_; }
  bool wants_client_cert() const { return !files_.client_ca_file.empty(); }
  bool requires_client_cert() const {
    return wants_client_cert() && files_.require_client_cert;
  }

  // The identity in force for a handshake, as GnuTLS's certificate
  // retrieval wants it: `pcerts` (gnutls_pcert_st*), `count` and `key`
  // (gnutls_privkey_t).
  void CurrentIdentity(void** pcerts, unsigned* count, void** key) const;

  // The client certificate of the TLS session `session` (gnutls_session_t)
  // verified against the client CA bundle in force: OK, or
  // UNAUTHENTICATED saying why (none presented, or GnuTLS's verdict).
  absl::Status VerifyClient(void* session) const;

  // Re-reads the files if the reload interval has passed since the last
  // read (the HTTP listener's watchdog calls it).
  void MaybeReload(absl::Time now);

 private:
  struct Identity;
  struct Trust;
  explicit HttpTls(const Files& files) : files_(files) {}
  // Reads the files; a set that differs from the one in force replaces it.
  absl::Status Load();

  const Files files_;
  std::string first_ca_pem_;
  mutable absl::Mutex mu_;
  absl::Time last_read_ ABSL_GUARDED_BY(mu_);
  std::string pem_read_ ABSL_GUARDED_BY(mu_);  // the files' contents in force
  std::shared_ptr<const Identity> identity_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const Identity>> retired_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Trust> trust_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knnd

#endif  // KNND_RPC_HTTP_TLS_H_

#include "knnd/rpc/http_tls.h"

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

// The most certificates of a chain loaded (leaf and intermediates).
constexpr unsigned kMaxChain = 16;

absl::StatusOr<std::string> ReadFile(const char* field,
                                     const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (!in || !(text << in.rdbuf())) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, " ", path, " cannot be read"));
  }
  return text.str();
}

gnutls_datum_t Datum(const std::string& s) {
  return gnutls_datum_t{
      reinterpret_cast<unsigned char*>(const_cast<char*>(s.data())),
      static_cast<unsigned>(s.size())};
}

// The DER form of a public key, to compare a certificate's with a key's.
std::string PublicKeyDer(gnutls_pubkey_t key) {
  gnutls_datum_t out{};
  if (gnutls_pubkey_export2(key, GNUTLS_X509_FMT_DER, &out) < 0) return "";
  std::string der(reinterpret_cast<const char*>(out.data), out.size);
  gnutls_free(out.data);
  return der;
}

}  // namespace

// A certificate chain and its key, as a handshake hands them out.
struct HttpTls::Identity {
  Identity() = default;
  Identity(const Identity&) = delete;
  Identity& operator=(const Identity&) = delete;
  ~Identity() {
    for (unsigned i = 0; i < count; ++i) gnutls_pcert_deinit(&pcerts[i]);
    if (key != nullptr) gnutls_privkey_deinit(key);
  }
  gnutls_pcert_st pcerts[kMaxChain] = {};
  unsigned count = 0;
  gnutls_privkey_t key = nullptr;
};

// The client CA bundle that client certificates are verified against.
struct HttpTls::Trust {
  Trust() = default;
  Trust(const Trust&) = delete;
  Trust& operator=(const Trust&) = delete;
  ~Trust() {
    if (list != nullptr) gnutls_x509_trust_list_deinit(list, 1);
  }
  gnutls_x509_trust_list_t list = nullptr;
};

absl::StatusOr<std::unique_ptr<HttpTls>> HttpTls::Create(const Files& files) {
  std::unique_ptr<HttpTls> tls(new HttpTls(files));
  if (absl::Status s = tls->Load(); !s.ok()) return s;
  if (!files.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        ReadFile("tls_client_ca_file", files.client_ca_file);
    if (!ca.ok()) return ca.status();
    tls->first_ca_pem_ = std::move(*ca);
  }
  return tls;
}

HttpTls::~HttpTls() = default;

absl::Status HttpTls::Load() {
  absl::StatusOr<std::string> cert =
      ReadFile("tls_cert_file", files_.cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile("tls_key_file", files_.key_file);
  if (!key.ok()) return key.status();
  std::string ca;
  if (!files_.client_ca_file.empty()) {
    absl::StatusOr<std::string> read =
        ReadFile("tls_client_ca_file", files_.client_ca_file);
    if (!read.ok()) return read.status();
    ca = std::move(*read);
  }
  const std::string pem = absl::StrCat(*cert, "\n", *key, "\n", ca);
  {
    absl::MutexLock lock(&mu_);
    last_read_ = absl::Now();
    if (pem == pem_read_) return absl::OkStatus();
  }
  auto identity = std::make_shared<Identity>();
  identity->count = kMaxChain;
  const gnutls_datum_t cert_pem = Datum(*cert);
  if (gnutls_pcert_list_import_x509_raw(identity->pcerts, &identity->count,
                                        &cert_pem, GNUTLS_X509_FMT_PEM,
                                        0) < 0 ||
      identity->count == 0) {
    identity->count = 0;
    return absl::FailedPreconditionError(
        absl::StrCat("tls_cert_file ", files_.cert_file,
                     " holds no PEM certificate chain (at most ", kMaxChain,
                     " certificates)"));
  }
  const gnutls_datum_t key_pem = Datum(*key);
  gnutls_privkey_init(&identity->key);
  if (gnutls_privkey_import_x509_raw(identity->key, &key_pem,
                                     GNUTLS_X509_FMT_PEM, nullptr, 0) < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tls_key_file ", files_.key_file, " holds no PEM private key"));
  }
  gnutls_pubkey_t public_key = nullptr;
  gnutls_pubkey_init(&public_key);
  const bool pair =
      gnutls_pubkey_import_privkey(public_key, identity->key, 0, 0) >= 0 &&
      PublicKeyDer(public_key) == PublicKeyDer(identity->pcerts[0].pubkey);
  gnutls_pubkey_deinit(public_key);
  if (!pair) {
    return absl::FailedPreconditionError(
        absl::StrCat("tls_key_file ", files_.key_file, " does not match ",
                     "tls_cert_file ", files_.cert_file));
  }
  std::shared_ptr<Trust> trust;
  if (!ca.empty()) {
    trust = std::make_shared<Trust>();
    gnutls_x509_trust_list_init(&trust->list, 0);
    const gnutls_datum_t ca_pem = Datum(ca);
    if (gnutls_x509_trust_list_add_trust_mem(trust->list, &ca_pem, nullptr,
                                             GNUTLS_X509_FMT_PEM, 0, 0) <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("tls_client_ca_file ", files_.client_ca_file,
                       " holds no PEM certificate"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (identity_ != nullptr) retired_.push_back(std::move(identity_));
  identity_ = std::move(identity);
  trust_ = std::move(trust);
  pem_read_ = pem;
  return absl::OkStatus();
}

void HttpTls::CurrentIdentity(void** pcerts, unsigned* count,
                              void** key) const {
  absl::MutexLock lock(&mu_);
  // The identity stays (identity_ or retired_) until this is destroyed.
  *pcerts = const_cast<gnutls_pcert_st*>(identity_->pcerts);
  *count = identity_->count;
  *key = identity_->key;
}

absl::Status HttpTls::VerifyClient(void* session_ptr) const {
  auto session = static_cast<gnutls_session_t>(session_ptr);
  std::shared_ptr<const Trust> trust;
  {
    absl::MutexLock lock(&mu_);
    trust = trust_;
  }
  unsigned n = 0;
  const gnutls_datum_t* chain = gnutls_certificate_get_peers(session, &n);
  if (chain == nullptr || n == 0) {
    return absl::UnauthenticatedError(
        "a client certificate signed by a CA of tls_client_ca_file is "
        "required (mutual TLS); the client presented none");
  }
  if (trust == nullptr) return absl::OkStatus();
  n = std::min(n, kMaxChain);
  gnutls_x509_crt_t certs[kMaxChain] = {};
  unsigned imported = 0;
  for (; imported < n; ++imported) {
    if (gnutls_x509_crt_init(&certs[imported]) < 0) break;
    if (gnutls_x509_crt_import(certs[imported], &chain[imported],
                               GNUTLS_X509_FMT_DER) < 0) {
      ++imported;
      break;
    }
  }
  gnutls_typed_vdata_st purpose{};
  purpose.type = GNUTLS_DT_KEY_PURPOSE_OID;
  purpose.data = reinterpret_cast<unsigned char*>(
      const_cast<char*>(GNUTLS_KP_TLS_WWW_CLIENT));
  unsigned verdict = 0;
  const int rc = imported == n ? gnutls_x509_trust_list_verify_crt2(
                                     trust->list, certs, n, &purpose, 1, 0,
                                     &verdict, nullptr)
                               : GNUTLS_E_CERTIFICATE_ERROR;
  for (unsigned i = 0; i < imported; ++i) gnutls_x509_crt_deinit(certs[i]);
  if (rc < 0) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the client certificate could not be verified: ", gnutls_strerror(rc)));
  }
  if (verdict != 0) {
    gnutls_datum_t out{};
    gnutls_certificate_verification_status_print(verdict, GNUTLS_CRT_X509, &out,
                                                 0);
    std::string why(reinterpret_cast<const char*>(out.data), out.size);
    gnutls_free(out.data);
    return absl::UnauthenticatedError(absl::StrCat(
        "the client certificate is not accepted by tls_client_ca_file: ", why));
  }
  return absl::OkStatus();
}

void HttpTls::MaybeReload(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (now - last_read_ < files_.reload_interval) return;
  }
  if (absl::Status s = Load(); !s.ok()) {
    spdlog::warn("HTTP listener keeps its TLS files in force: {}",
                 s.ToString());
  }
}

}  // namespace knnd

#include "knnd/rpc/token_auth.h"

#include <sys/stat.h>

#include <fstream>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

constexpr absl::string_view kAdminPrefix = "/knnd.v1.AdminService/";
constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";
constexpr absl::string_view kBearer = "bearer ";

bool IsTokenText(absl::string_view token) {
  if (token.size() < TokenAuthenticator::kMinTokenBytes ||
      token.size() > TokenAuthenticator::kMaxTokenBytes) {
    return false;
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

std::array<unsigned char, 32> Sha256(absl::string_view text) {
  std::array<unsigned char, 32> digest{};
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), digest.data(), &size, EVP_sha256(),
             nullptr);
  return digest;
}

// Whether `digest` equals any of `set`, in time that depends only on the
// size of the set: every entry is compared, with no early exit.
bool MatchesAny(const std::array<unsigned char, 32>& digest,
                const absl::optional<std::vector<std::array<unsigned char, 32>>>&
                    set) {
  if (!set.has_value()) return false;
  int matches = 0;
  for (const auto& entry : *set) {
    matches |= CRYPTO_memcmp(entry.data(), digest.data(), digest.size()) == 0;
  }
  return matches != 0;
}

// The tokens of one token file, in order. Errors name the file and the
// line, never the line's text.
absl::StatusOr<std::vector<std::string>> ReadTokens(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read token file ", path));
  }
  std::vector<std::string> tokens;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view token = absl::StripAsciiWhitespace(line);
    if (token.empty() || token[0] == '#') continue;
    if (!IsTokenText(token)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file ", path, " line ", number, ": a token must be ",
          TokenAuthenticator::kMinTokenBytes, "-",
          TokenAuthenticator::kMaxTokenBytes,
          " printable ASCII characters without spaces"));
    }
    tokens.emplace_back(token);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, " holds no token"));
  }
  return tokens;
}

// Reads one token file: digests of its tokens.
absl::StatusOr<std::vector<std::array<unsigned char, 32>>> ReadTokenFile(
    const std::string& path) {
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(path);
  if (!tokens.ok()) return tokens.status();
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0) {
    spdlog::warn("token file {} is readable by every user (mode {:o})", path,
                 st.st_mode & 0777);
  }
  std::vector<std::array<unsigned char, 32>> digests;
  for (const std::string& token : *tokens) digests.push_back(Sha256(token));
  return digests;
}

}  // namespace

absl::StatusOr<std::string> ReadFirstToken(const std::string& path) {
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(path);
  if (!tokens.ok()) return tokens.status();
  return tokens->front();
}

absl::StatusOr<TokenAuthenticator::TokenSets> TokenAuthenticator::ReadSets(
    const Options& options) {
  TokenSets sets;
  if (!options.search_token_file.empty()) {
    absl::StatusOr<std::vector<Digest>> search =
        ReadTokenFile(options.search_token_file);
    if (!search.ok()) return search.status();
    sets.search = std::move(*search);
  }
  if (!options.admin_token_file.empty()) {
    absl::StatusOr<std::vector<Digest>> admin =
        ReadTokenFile(options.admin_token_file);
    if (!admin.ok()) return admin.status();
    sets.admin = std::move(*admin);
  }
  return sets;
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::Create(
    const Options& options) {
  std::unique_ptr<TokenAuthenticator> auth(new TokenAuthenticator(options));
  if (absl::Status s = auth->Reload(); !s.ok()) return s;
  return auth;
}

absl::Status TokenAuthenticator::Reload() {
  absl::StatusOr<TokenSets> sets = ReadSets(options_);
  if (!sets.ok()) return sets.status();
  auto describe = [](const absl::optional<std::vector<Digest>>& set,
                     const std::string& file) {
    return set ? absl::StrCat(set->size(), " token(s) from ", file)
               : std::string("open");
  };
  spdlog::info("bearer tokens: search {}, admin {}",
               describe(sets->search, options_.search_token_file),
               describe(sets->admin, options_.admin_token_file));
  absl::MutexLock lock(&mu_);
  sets_ = std::move(*sets);
  return absl::OkStatus();
}

absl::Status TokenAuthenticator::Check(
    absl::string_view method,
    absl::optional<absl::string_view> authorization) const {
  if (absl::StartsWith(method, kHealthPrefix)) return absl::OkStatus();
  const bool admin_method = absl::StartsWith(method, kAdminPrefix);
  absl::ReaderMutexLock lock(&mu_);
  const bool open = admin_method ? !sets_.admin.has_value()
                                 : !sets_.search.has_value();
  if (open) return absl::OkStatus();
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, " needs metadata 'authorization: Bearer <token>'"));
  }
  const absl::string_view value = *authorization;
  if (value.size() <= kBearer.size() ||
      !absl::StartsWithIgnoreCase(value, kBearer) ||
      !IsTokenText(value.substr(kBearer.size()))) {
    return absl::UnauthenticatedError(
        "malformed authorization metadata: expected 'Bearer <token>'");
  }
  const Digest digest = Sha256(value.substr(kBearer.size()));
  const bool is_admin = MatchesAny(digest, sets_.admin);
  const bool is_search = MatchesAny(digest, sets_.search);
  if (is_admin) return absl::OkStatus();
  if (is_search) {
    if (!admin_method) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "a search token may not call ", method, ": it needs an admin token"));
  }
  return absl::UnauthenticatedError("unknown bearer token");
}

}  // namespace knnd

namespace knnd {

absl::Status TokenAuthenticator::CheckCall(
    const grpc::ServerContextBase& context, absl::string_view method) const {
  const auto& metadata = context.client_metadata();
  const auto range = metadata.equal_range("authorization");
  absl::optional<absl::string_view> authorization;
  for (auto it = range.first; it != range.second; ++it) {
    if (authorization.has_value()) {
      return absl::UnauthenticatedError(
          "malformed authorization metadata: more than one entry");
    }
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  return Check(method, authorization);
}

}  // namespace knnd

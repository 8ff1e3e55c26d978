// Transport security, bearer tokens and connection limits, end to end
// through gRPC against an in-process server. Certificates are made at test
// time with the openssl command: two CAs, a server certificate for
// localhost/127.0.0.1 and a client certificate from each CA.
#include <grpc/support/log.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "knnd/config/config.h"
#include "knnd/index/index_builder.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/v1/admin_service.grpc.pb.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::CheckHealth;
using ::knnd::testing::FreePort;
using ::knnd::testing::FreshChannel;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::ReadFile;
using ::knnd::testing::RunCommand;
using ::knnd::testing::RunningServer;
using ::knnd::testing::StartServer;
using ::knnd::testing::TempDir;
using ::knnd::testing::TestConfig;
using ::knnd::testing::WriteFile;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSearchToken1[] = "search-token-one-4f1c9a7e2b";
constexpr char kSearchToken2[] = "search-token-two-8d3e6b0a5c";
constexpr char kAdminToken[] = "admin-token-77a2c4e9f013";
constexpr char kWrongToken[] = "wrong-token-e5b81d2f6c94";

void Run(const std::string& command) {
  std::string output;
  ASSERT_EQ(RunCommand(command, &output), 0) << command << "\n" << output;
}

// Writes <name>.key and <name>.pem in `dir`: a certificate signed by `ca`
// (or self-signed, a CA, when `ca` is empty) with extensions `ext`.
void MakeCert(const std::string& dir, const std::string& name,
              const std::string& ca, const std::string& ext) {
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                          "-nodes -days 2 -subj /CN=knnd-test-" + name;
  if (ca.empty()) {
    Run(absl::StrCat("cd ", dir, " && openssl req -x509 ", key, " -keyout ",
                     name, ".key -out ", name, ".pem 2>/dev/null"));
    return;
  }
  WriteFile(absl::StrCat(dir, "/", name, ".ext"), ext);
  Run(absl::StrCat("cd ", dir, " && openssl req ", key, " -keyout ", name,
                   ".key -out ", name, ".csr 2>/dev/null && openssl x509 -req -in ",
                   name, ".csr -CA ", ca, ".pem -CAkey ", ca,
                   ".key -CAcreateserial -days 2 -extfile ", name,
                   ".ext -out ", name, ".pem 2>/dev/null"));
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    IndexSpec spec;
    spec.n = 2000;
    spec.d = 16;
    spec.factory = "IVF16,PQ4";
    WriteIndex(tmp_->path("s.index"), spec);
    const std::string dir = tmp_->dir();
    const std::string server_ext =
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n";
    const std::string client_ext =
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n";
    MakeCert(dir, "ca1", "", "");
    MakeCert(dir, "ca2", "", "");
    MakeCert(dir, "server1", "ca1", server_ext);
    MakeCert(dir, "server2", "ca2", server_ext);
    MakeCert(dir, "client1", "ca1", client_ext);
    MakeCert(dir, "client2", "ca2", client_ext);
    WriteFile(tmp_->path("search.tokens"),
              absl::StrCat("# current and next\n", kSearchToken1, "\n\n",
                           kSearchToken2, "\n"));
    WriteFile(tmp_->path("admin.tokens"), absl::StrCat(kAdminToken, "\n"));
  }
  static void TearDownTestSuite() { delete tmp_; }

  static std::string Path(const std::string& name) { return tmp_->path(name); }
  static std::string Pem(const std::string& name) {
    return ReadFile(Path(name + ".pem"));
  }

  // A config with TLS from server1 (signed by ca1).
  static knnd::v1::ServerConfig TlsConfig() {
    knnd::v1::ServerConfig config = TestConfig(Path("s.index"));
    config.set_tls_cert_file(Path("server1.pem"));
    config.set_tls_key_file(Path("server1.key"));
    return config;
  }

  // A fresh channel (no shared subchannel that remembers an earlier
  // failure) trusting `root_ca`, with the client certificate `client` if
  // not empty.
  static std::shared_ptr<grpc::Channel> TlsChannel(const RunningServer& s,
                                                   const std::string& root_ca,
                                                   const std::string& client) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = Pem(root_ca);
    if (!client.empty()) {
      options.pem_private_key = ReadFile(Path(client + ".key"));
      options.pem_cert_chain = Pem(client);
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetSslTargetNameOverride("localhost");
    return grpc::CreateCustomChannel(s.address, grpc::SslCredentials(options),
                                     args);
  }

  // GetIndexInfo over `channel`, with "authorization: <authorization>"
  // unless it is empty.
  static grpc::Status Info(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& authorization = "") {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(20));
    if (!authorization.empty()) {
      context.AddMetadata("authorization", authorization);
    }
    knnd::v1::GetIndexInfoResponse response;
    return knnd::v1::KnnService::NewStub(channel)->GetIndexInfo(
        &context, knnd::v1::GetIndexInfoRequest(), &response);
  }

  // One query through Search.
  static grpc::Status Search(const std::shared_ptr<grpc::Channel>& channel,
                             const std::string& authorization) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", authorization);
    knnd::v1::SearchRequest request;
    request.mutable_vectors()->Resize(16, 0.5f);
    request.set_k(5);
    knnd::v1::SearchResponse response;
    return knnd::v1::KnnService::NewStub(channel)->Search(&context, request,
                                                          &response);
  }

  static TempDir* tmp_;
};

TempDir* SecurityTest::tmp_ = nullptr;

// Mutual TLS: a client without a certificate, with one from another CA, or
// in plaintext is refused at the handshake; one with a certificate from
// the client CA is served.
TEST_F(SecurityTest, MutualTlsServesOnlyClientsWithCertificateFromClientCa) {
  knnd::v1::ServerConfig config = TlsConfig();
  config.set_tls_client_ca_file(Path("ca1.pem"));
  RunningServer s = StartServer(config);
  ASSERT_NE(s.server, nullptr);
  EXPECT_EQ(Info(TlsChannel(s, "ca1", "")).error_code(), grpc::UNAVAILABLE);
  EXPECT_EQ(Info(TlsChannel(s, "ca1", "client2")).error_code(),
            grpc::UNAVAILABLE);
  EXPECT_EQ(Info(FreshChannel(s.address)).error_code(), grpc::UNAVAILABLE);
  grpc::Status served = Info(TlsChannel(s, "ca1", "client1"));
  EXPECT_TRUE(served.ok()) << served.error_message();
}

// Plain TLS: any TLS client that trusts the server's CA is served; a
// plaintext client or one trusting another CA is refused.
TEST_F(SecurityTest, TlsRefusesPlaintextClient) {
  RunningServer s = StartServer(TlsConfig());
  ASSERT_NE(s.server, nullptr);
  EXPECT_EQ(Info(FreshChannel(s.address)).error_code(), grpc::UNAVAILABLE);
  EXPECT_EQ(Info(TlsChannel(s, "ca2", "")).error_code(), grpc::UNAVAILABLE);
  grpc::Status served = Info(TlsChannel(s, "ca1", ""));
  EXPECT_TRUE(served.ok()) << served.error_message();
}

// The certificate files renamed over with a new pair are served to new
// connections without a restart.
TEST_F(SecurityTest, RotatedCertificateServedWithoutRestart) {
  TempDir live;
  std::filesystem::copy_file(Path("server1.pem"), live.path("cert.pem"));
  std::filesystem::copy_file(Path("server1.key"), live.path("key.pem"));
  knnd::v1::ServerConfig config = TestConfig(Path("s.index"));
  config.set_tls_cert_file(live.path("cert.pem"));
  config.set_tls_key_file(live.path("key.pem"));
  config.set_tls_reload_interval_s(1);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.server, nullptr);
  ASSERT_TRUE(Info(TlsChannel(s, "ca1", "")).ok());
  ASSERT_EQ(Info(TlsChannel(s, "ca2", "")).error_code(), grpc::UNAVAILABLE);

  std::filesystem::copy_file(Path("server2.pem"), live.path("cert.new"));
  std::filesystem::copy_file(Path("server2.key"), live.path("key.new"));
  std::filesystem::rename(live.path("key.new"), live.path("key.pem"));
  std::filesystem::rename(live.path("cert.new"), live.path("cert.pem"));
  bool rotated = false;
  for (int attempt = 0; attempt < 300 && !rotated; ++attempt) {
    rotated = Info(TlsChannel(s, "ca2", "")).ok();
    if (!rotated) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(rotated);
  EXPECT_EQ(Info(TlsChannel(s, "ca1", "")).error_code(), grpc::UNAVAILABLE);
}

// With TLS on the main port, health_listen_address answers plaintext
// grpc.health.v1 checks with the main port's status, and nothing else.
TEST_F(SecurityTest, PlaintextHealthPortServesOnlyHealth) {
  knnd::v1::ServerConfig config = TlsConfig();
  config.set_health_listen_address(absl::StrCat("127.0.0.1:", FreePort()));
  RunningServer s = StartServer(config);
  ASSERT_NE(s.server, nullptr);
  ASSERT_NE(s.server->health_port(), 0);
  const std::string health_address =
      absl::StrCat("127.0.0.1:", s.server->health_port());
  const auto health = FreshChannel(health_address);
  EXPECT_EQ(CheckHealth(health, ""),
            grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(health, "knnd.v1.KnnService"),
            grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(Info(FreshChannel(health_address)).error_code(),
            grpc::UNIMPLEMENTED);
  s.server->Drain({});
}

// Captures spdlog's and gRPC's log lines while alive. gRPC's log function
// stays installed afterwards (gRPC cannot give back its default one) and
// writes to stderr then.
class LogCapture {
 public:
  LogCapture()
      : previous_(spdlog::default_logger()),
        sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(spdlog_)) {
    auto logger = std::make_shared<spdlog::logger>("capture", sink_);
    logger->set_level(spdlog::level::trace);
    spdlog::set_default_logger(logger);
    absl::MutexLock lock(&mu_);
    grpc_lines_ = &grpc_;
    gpr_set_log_verbosity(GPR_LOG_SEVERITY_DEBUG);
    gpr_set_log_function(&LogCapture::OnGrpcLog);
  }
  ~LogCapture() {
    gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
    absl::MutexLock lock(&mu_);
    grpc_lines_ = nullptr;
    spdlog::set_default_logger(previous_);
  }
  std::string Text() {
    sink_->flush();
    absl::MutexLock lock(&mu_);
    return spdlog_.str() + grpc_;
  }

 private:
  static void OnGrpcLog(gpr_log_func_args* args) {
    absl::MutexLock lock(&mu_);
    if (grpc_lines_ != nullptr) {
      absl::StrAppend(grpc_lines_, args->message, "\n");
    } else {
      std::fprintf(stderr, "%s\n", args->message);
    }
  }

  static absl::Mutex mu_;
  static std::string* grpc_lines_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream spdlog_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::string grpc_;
};

absl::Mutex LogCapture::mu_;
std::string* LogCapture::grpc_lines_ = nullptr;

// Missing, malformed and unknown tokens are UNAUTHENTICATED; each token of
// the search file (rotation) and the admin token are served; a search token
// on the admin API is PERMISSION_DENIED, the admin token is served there;
// health needs none; and no log line, knnd's or gRPC's at debug level,
// holds any part of a token.
TEST_F(SecurityTest, TokensCheckedOnSearchAndAdminAndNeverLogged) {
  LogCapture logs;
  {
    knnd::v1::ServerConfig config = TestConfig(Path("s.index"));
    config.set_search_token_file(Path("search.tokens"));
    config.set_admin_token_file(Path("admin.tokens"));
    config.set_admin_listen_address("127.0.0.1:0");
    RunningServer s = StartServer(config);
    ASSERT_NE(s.server, nullptr);
    const auto channel = s.channel;
    EXPECT_EQ(Info(channel).error_code(), grpc::UNAUTHENTICATED);
    EXPECT_EQ(Info(channel, absl::StrCat("Bearer ", kWrongToken)).error_code(),
              grpc::UNAUTHENTICATED);
    EXPECT_EQ(Info(channel, absl::StrCat("Basic ", kSearchToken1)).error_code(),
              grpc::UNAUTHENTICATED);
    EXPECT_EQ(Info(channel, kSearchToken1).error_code(), grpc::UNAUTHENTICATED);
    EXPECT_EQ(Search(channel, absl::StrCat("Bearer ", kWrongToken)).error_code(),
              grpc::UNAUTHENTICATED);
    for (const char* token : {kSearchToken1, kSearchToken2, kAdminToken}) {
      grpc::Status info = Info(channel, absl::StrCat("Bearer ", token));
      EXPECT_TRUE(info.ok()) << info.error_message();
      grpc::Status search = Search(channel, absl::StrCat("Bearer ", token));
      EXPECT_TRUE(search.ok()) << search.error_message();
    }
    ASSERT_NE(s.server->admin_port(), 0);
    auto admin = knnd::v1::AdminService::NewStub(
        FreshChannel(absl::StrCat("127.0.0.1:", s.server->admin_port())));
    auto list_versions = [&](const std::string& authorization) {
      grpc::ClientContext context;
      if (!authorization.empty()) {
        context.AddMetadata("authorization", authorization);
      }
      knnd::v1::ListVersionsResponse response;
      return admin->ListVersions(&context, {}, &response).error_code();
    };
    EXPECT_EQ(list_versions(""), grpc::UNAUTHENTICATED);
    EXPECT_EQ(list_versions(absl::StrCat("Bearer ", kWrongToken)),
              grpc::UNAUTHENTICATED);
    EXPECT_EQ(list_versions(absl::StrCat("Bearer ", kSearchToken1)),
              grpc::PERMISSION_DENIED);
    EXPECT_EQ(list_versions(absl::StrCat("Bearer ", kAdminToken)), grpc::OK);

    grpc::ClientContext context;
    grpc::health::v1::HealthCheckResponse health;
    EXPECT_TRUE(grpc::health::v1::Health::NewStub(channel)
                    ->Check(&context, {}, &health)
                    .ok());
  }
  const std::string text = logs.Text();
  EXPECT_THAT(text, HasSubstr("UNAUTHENTICATED"));  // the refusals were logged
  for (const std::string token :
       {kSearchToken1, kSearchToken2, kAdminToken, kWrongToken}) {
    for (size_t i = 0; i + 8 <= token.size(); ++i) {
      ASSERT_THAT(text, Not(HasSubstr(token.substr(i, 8))))
          << "a log line holds part of a token";
    }
  }
}

// The token check by method: admin methods need an admin token (a search
// token is PERMISSION_DENIED), health is open, and an API without a token
// file is open.
TEST_F(SecurityTest, AdminMethodsNeedAdminToken) {
  TokenAuthenticator::Options options;
  options.search_token_file = Path("search.tokens");
  options.admin_token_file = Path("admin.tokens");
  absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
      TokenAuthenticator::Create(options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  const std::string admin = "/knnd.v1.AdminService/Reload";
  const std::string bearer_search = absl::StrCat("Bearer ", kSearchToken1);
  const std::string bearer_admin = absl::StrCat("Bearer ", kAdminToken);
  EXPECT_TRUE(absl::IsUnauthenticated((*auth)->Check(admin, absl::nullopt)));
  EXPECT_TRUE(absl::IsUnauthenticated(
      (*auth)->Check(admin, absl::StrCat("Bearer ", kWrongToken))));
  EXPECT_TRUE(
      absl::IsPermissionDenied((*auth)->Check(admin, bearer_search)));
  EXPECT_TRUE((*auth)->Check(admin, bearer_admin).ok());
  EXPECT_TRUE((*auth)->Check("/grpc.health.v1.Health/Check", absl::nullopt).ok());

  options.admin_token_file.clear();
  auth = TokenAuthenticator::Create(options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_TRUE((*auth)->Check(admin, absl::nullopt).ok());
  EXPECT_TRUE(absl::IsUnauthenticated(
      (*auth)->Check("/knnd.v1.KnnService/Search", absl::nullopt)));
}

// SIGHUP's reload: a rewritten file replaces the set (the removed token is
// refused, the added one served); a file that no longer reads keeps the
// previous set, and the error names the line but not its text.
TEST_F(SecurityTest, ReloadReplacesTokensAndKeepsThemOnError) {
  TempDir dir;
  const std::string file = dir.path("tokens");
  WriteFile(file, absl::StrCat(kSearchToken1, "\n"));
  TokenAuthenticator::Options options;
  options.search_token_file = file;
  absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
      TokenAuthenticator::Create(options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  const std::string search = "/knnd.v1.KnnService/Search";
  WriteFile(file, absl::StrCat(kSearchToken2, "\n"));
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_TRUE(absl::IsUnauthenticated(
      (*auth)->Check(search, absl::StrCat("Bearer ", kSearchToken1))));
  EXPECT_TRUE(
      (*auth)->Check(search, absl::StrCat("Bearer ", kSearchToken2)).ok());

  WriteFile(file, absl::StrCat(kSearchToken1, "\nshort token\n"));
  absl::Status bad = (*auth)->Reload();
  EXPECT_TRUE(absl::IsInvalidArgument(bad));
  EXPECT_THAT(bad.message(), HasSubstr("line 2"));
  EXPECT_THAT(bad.message(), Not(HasSubstr("short")));
  EXPECT_TRUE(
      (*auth)->Check(search, absl::StrCat("Bearer ", kSearchToken2)).ok());

  WriteFile(file, "# nothing\n");
  EXPECT_THAT((*auth)->Reload().message(), HasSubstr("holds no token"));
}

// TLS settings that cannot work are refused by ValidateConfig or at Start
// with the field named.
TEST_F(SecurityTest, InconsistentTlsConfigRefused) {
  knnd::v1::ServerConfig config = TestConfig(Path("s.index"));
  config.set_tls_cert_file(Path("server1.pem"));
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("tls_key_file"));
  config.clear_tls_cert_file();
  config.set_tls_client_ca_file(Path("ca1.pem"));
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("tls_client_ca_file"));

  config = TlsConfig();
  config.set_tls_key_file(Path("client1.key"));  // not server1's key
  ASSERT_TRUE(ValidateConfig(config).ok());
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(config);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::Status started = (*server)->Start();
  EXPECT_TRUE(absl::IsFailedPrecondition(started)) << started;
  EXPECT_THAT(started.message(), HasSubstr("does not match"));
}

// A client that pings more often than keepalive_min_ping_interval_ms gets
// GOAWAY ENHANCE_YOUR_CALM ("too_many_pings") while other clients are
// still served.
TEST_F(SecurityTest, PingFloodGetsGoawayOthersServed) {
  knnd::v1::ServerConfig config = TestConfig(Path("s.index"));
  RunningServer s = StartServer(config);
  ASSERT_NE(s.server, nullptr);
  LogCapture logs;
  grpc::ChannelArguments flood;
  flood.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20);
  flood.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  flood.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  flood.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  flood.SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS, 20);
  auto flooder = FreshChannel(s.address, flood);
  ASSERT_TRUE(Info(flooder).ok());
  bool goaway = false;
  for (int attempt = 0; attempt < 300 && !goaway; ++attempt) {
    absl::SleepFor(absl::Milliseconds(100));
    goaway = logs.Text().find("too_many_pings") != std::string::npos;
  }
  EXPECT_TRUE(goaway) << logs.Text();
  EXPECT_THAT(logs.Text(), HasSubstr("ENHANCE_YOUR_CALM"));
  grpc::Status other = Info(FreshChannel(s.address));
  EXPECT_TRUE(other.ok()) << other.error_message();
}

// Request metadata above max_metadata_bytes is refused; the server goes on
// serving.
TEST_F(SecurityTest, OversizedMetadataRefused) {
  knnd::v1::ServerConfig config = TestConfig(Path("s.index"));
  config.set_max_metadata_bytes(4096);
  RunningServer s = StartServer(config);
  ASSERT_NE(s.server, nullptr);
  grpc::ClientContext context;
  context.AddMetadata("x-padding", std::string(8192, 'p'));
  knnd::v1::GetIndexInfoResponse response;
  grpc::Status big =
      s.stub->GetIndexInfo(&context, knnd::v1::GetIndexInfoRequest(), &response);
  EXPECT_FALSE(big.ok());
  EXPECT_EQ(big.error_code(), grpc::RESOURCE_EXHAUSTED) << big.error_message();
  // A fresh connection: the refused call may have closed this one.
  grpc::Status normal = Info(FreshChannel(s.address));
  EXPECT_TRUE(normal.ok()) << normal.error_message();
}

// knnctl reaches a secured knnd: TLS with the server's CA and a token from
// a file; the wrong token is refused with the server's status.
TEST_F(SecurityTest, KnnctlSpeaksTlsAndTokens) {
  knnd::v1::ServerConfig config = TlsConfig();
  config.set_search_token_file(Path("search.tokens"));
  config.set_admin_token_file(Path("admin.tokens"));
  RunningServer s = StartServer(config);
  ASSERT_NE(s.server, nullptr);
  WriteFile(Path("knnctl.search.token"), absl::StrCat(kSearchToken2, "\n"));
  WriteFile(Path("knnctl.admin.token"),
            absl::StrCat("# admin\n\n", kAdminToken, "\n"));
  auto knnctl = [&](const std::string& args, std::string* output) {
    return RunCommand(absl::StrCat(KNNCTL_BINARY, " ", args, " 2>&1"), output);
  };
  const std::string tls = absl::StrCat(" --addr ", s.address, " --tls_ca ",
                                       Path("ca1.pem"));
  std::string out;
  EXPECT_EQ(knnctl(absl::StrCat("info", tls, " --token_file ",
                                Path("knnctl.search.token")),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("ntotal"));
  out.clear();
  EXPECT_EQ(knnctl(absl::StrCat("info", tls), &out), 2);
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));
  out.clear();
  EXPECT_EQ(knnctl(absl::StrCat("info --addr ", s.address, " --token_file ",
                                Path("knnctl.search.token")),
                   &out),
            2)
      << "plaintext to a TLS port";
  const std::string admin =
      absl::StrCat(" --addr 127.0.0.1:", s.server->admin_port());
  out.clear();
  EXPECT_EQ(knnctl(absl::StrCat("versions", admin, " --token_file ",
                                Path("knnctl.admin.token")),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("serving"));
  out.clear();
  EXPECT_EQ(knnctl(absl::StrCat("versions", admin, " --token_file ",
                                Path("knnctl.search.token")),
                   &out),
            2);
  EXPECT_THAT(out, HasSubstr("PERMISSION_DENIED"));
  for (const char* token : {kSearchToken2, kAdminToken}) {
    EXPECT_THAT(out, Not(HasSubstr(token)));
  }
}

// A front of shards reaches shards that require mutual TLS and a token
// with its shard_tls_* files and shard_token_file; with a CA that did not
// sign the shards' certificates it never connects, and says which target.
TEST_F(SecurityTest, FrontReachesShardsOverMutualTlsWithAToken) {
  const std::string index = Path("fs.index");
  knnd::testing::BuildSpec spec;
  spec.n = 2000;
  spec.d = 16;
  spec.factory = "IVF16,PQ16x4fs";
  knnd::testing::BuildIndex(index, spec);
  ASSERT_TRUE(ShardIndexFile(index, 2, index, "test").ok());
  std::vector<RunningServer> shards;
  std::vector<std::string> targets;
  for (int s = 0; s < 2; ++s) {
    knnd::v1::ServerConfig config = TestConfig(ShardPath(index, s, 2));
    config.set_tls_cert_file(Path("server1.pem"));
    config.set_tls_key_file(Path("server1.key"));
    config.set_tls_client_ca_file(Path("ca1.pem"));
    config.set_search_token_file(Path("search.tokens"));
    shards.push_back(StartServer(config));
    targets.push_back(shards.back().address);  // 127.0.0.1: the IP SAN
  }
  WriteFile(Path("shard.token"), absl::StrCat(kSearchToken2, "\n"));
  auto front_config = [&](const std::string& ca) {
    knnd::v1::ServerConfig config = TestConfig("");
    config.clear_index_path();
    config.set_admin_listen_address("");
    for (const std::string& t : targets) config.add_shard_targets(t);
    config.set_shard_poll_interval_ms(100);
    config.set_shard_tls_ca_file(Path(ca + ".pem"));
    config.set_shard_tls_cert_file(Path("client1.pem"));
    config.set_shard_tls_key_file(Path("client1.key"));
    config.set_shard_token_file(Path("shard.token"));
    return config;
  };
  RunningServer front = StartServer(front_config("ca1"));
  const absl::Time end = absl::Now() + absl::Seconds(20);
  grpc::Status info;
  do {
    info = Info(front.channel);
    if (info.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < end);
  ASSERT_TRUE(info.ok()) << info.error_message();
  // The front's own port is plaintext and open; the shards see its token.
  EXPECT_TRUE(Search(front.channel, "").ok());

  RunningServer wrong_ca = StartServer(front_config("ca2"));
  absl::SleepFor(absl::Milliseconds(500));
  grpc::Status refused = Info(wrong_ca.channel);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr(targets[0]));

  knnd::v1::ServerConfig half = front_config("ca1");
  half.clear_shard_tls_key_file();
  knnd::testing::ExpectConfigRefused(half, "go together");
}

}  // namespace
}  // namespace knnd

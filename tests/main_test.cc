// knnd (src/main.cc) as a process: start-up and health, SIGTERM's drain,
// SIGHUP's reloads of versions and token files, exit codes, --version.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "knnd/v1/admin_service.grpc.pb.h"
#include "testing/scrape_util.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::CallSearch;
using ::knnd::testing::CheckHealth;
using ::knnd::testing::FreePort;
using ::knnd::testing::FreshChannel;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::kVersionIdStride;
using ::knnd::testing::MakeData;
using ::knnd::testing::MakeSearchRequest;
using ::knnd::testing::PublishIndex;
using ::knnd::testing::ReadFile;
using ::knnd::testing::TempDir;
using ::knnd::testing::VersionSpec;
using ::knnd::testing::WriteFile;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;
using Health = grpc::health::v1::HealthCheckResponse;

extern "C" char** environ;

// A knnd child process with stderr captured to a file.
class Daemon {
 public:
  Daemon(const std::vector<std::string>& args, const std::string& log_path)
      : log_path_(log_path) {
    std::vector<std::string> argv = {KNND_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    // Tests run beside other knnd processes: no fixed admin port.
    if (std::none_of(args.begin(), args.end(), [](const std::string& a) {
          return a.rfind("--admin_listen", 0) == 0;
        })) {
      argv.push_back("--admin_listen=127.0.0.1:0");
    }
    std::vector<char*> c_argv;
    for (auto& a : argv) c_argv.push_back(a.data());
    c_argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 2, 1);
    EXPECT_EQ(posix_spawn(&pid_, KNND_BINARY, &actions, nullptr, c_argv.data(),
                          environ),
              0);
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      Wait();
    }
  }
  void Signal(int signal) { kill(pid_, signal); }
  // Returns the wait status.
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  std::string Log() const { return ReadFile(log_path_); }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

// Health of `address` over a new connection, as Kubernetes' gRPC probe
// does; UNKNOWN while it cannot be reached. A long-lived channel is no good
// here: after its first attempt is refused (knnd not listening yet) gRPC's
// reconnect backoff can outlast the whole NOT_SERVING phase.
Health::ServingStatus ProbeHealth(const std::string& address) {
  return CheckHealth(FreshChannel(address), "", absl::Milliseconds(500));
}

TEST(Daemon, HealthFollowsLoadAndSigtermWhileALongBatchFinishesAndExitsZero) {
  TempDir tmp;
  IndexSpec spec;
  spec.n = 60000;
  spec.d = 64;
  spec.factory = "IVF128,PQ16";
  WriteIndex(tmp.path("big.index"), spec);
  const int port = FreePort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  {
    std::ofstream config(tmp.path("knnd.textproto"));
    config << "index_path: \"" << tmp.path("big.index") << "\"\n"
           << "listen_address: \"" << address << "\"\n"
           << "metrics_listen_address: \"127.0.0.1:" << FreePort() << "\"\n"
           << "num_workers: 2\n"
           << "warmup_queries: 3000\n"      // keeps NOT_SERVING observable
           << "warmup_nprobe: 0\n"          // ... at default_nprobe
           << "default_nprobe: 128\n"
           << "max_batch_rows: 512\n"
           << "drain_grace_period_ms: 60000\n";
  }
  Daemon daemon({"--config", tmp.path("knnd.textproto")}, tmp.path("knnd.log"));
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());

  // NOT_SERVING first (server up, index loading / warming), then SERVING.
  bool saw_not_serving = false;
  std::string seen;  // the sequence of answers, for the failure message
  Health::ServingStatus status = Health::UNKNOWN;
  const absl::Time give_up = absl::Now() + absl::Seconds(120);
  while (status != Health::SERVING && absl::Now() < give_up) {
    Health::ServingStatus now = ProbeHealth(address);
    if (seen.empty() || now != status) {
      absl::StrAppend(&seen, Health::ServingStatus_Name(now), " ");
    }
    status = now;
    saw_not_serving |= status == Health::NOT_SERVING;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(status, Health::SERVING) << seen << "\n" << daemon.Log();
  EXPECT_TRUE(saw_not_serving) << seen << "\n" << daemon.Log();

  // A long batch: 4096 queries visiting every list.
  auto stub = knnd::v1::KnnService::NewStub(channel);
  const std::vector<float> queries = MakeData(4096, spec.d, 5);
  knnd::v1::SearchRequest long_request = MakeSearchRequest(queries, 10);
  long_request.set_nprobe(128);
  grpc::Status long_status;
  knnd::v1::SearchResponse long_response;
  std::thread long_call([&] {
    long_status = CallSearch(*stub, long_request, &long_response);
  });
  absl::SleepFor(absl::Milliseconds(400));  // let it be admitted
  daemon.Signal(SIGTERM);

  // While it drains, health turns NOT_SERVING and new work is refused.
  bool saw_draining = false;
  for (int i = 0; i < 400 && !saw_draining; ++i) {
    saw_draining = ProbeHealth(address) == Health::NOT_SERVING;
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(saw_draining);
  long_call.join();
  ASSERT_TRUE(long_status.ok()) << long_status.error_message() << "\n"
                                << daemon.Log();
  ASSERT_EQ(long_response.ids_size(), 4096 * 10);
  for (int64_t id : long_response.ids()) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, spec.n);
  }
  const int exit_status = daemon.Wait();
  EXPECT_TRUE(WIFEXITED(exit_status)) << daemon.Log();
  EXPECT_EQ(WEXITSTATUS(exit_status), 0) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("draining"));
}

// SIGHUP and AdminService.ReloadIndex drive the same reload path in the
// real binary: both swap in new versions, both see the same refusal, and
// a SIGHUP racing an RPC loads the version once.
TEST(Daemon, SighupAndAdminRpcReloadThroughOnePath) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(1)), 1);
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const std::string admin_address = absl::StrCat("127.0.0.1:", FreePort());
  const int metrics_port = FreePort();
  Daemon daemon({"--index", dir, "--listen", address, "--admin_listen",
                 admin_address, "--workers", "2",
                 absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)},
                tmp.path("knnd.log"));
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (ProbeHealth(address) != Health::SERVING && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(ProbeHealth(address), Health::SERVING) << daemon.Log();
  auto stub = knnd::v1::KnnService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto admin = knnd::v1::AdminService::NewStub(
      grpc::CreateChannel(admin_address, grpc::InsecureChannelCredentials()));
  auto served = [&] {
    knnd::v1::SearchResponse response;
    grpc::Status status =
        CallSearch(*stub, MakeSearchRequest(MakeData(1, 16, 3), 3), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    for (int64_t id : response.ids()) {
      EXPECT_EQ(id / kVersionIdStride, response.index_version()) << id;
    }
    return response.index_version();
  };
  auto reload = [&](knnd::v1::ReloadIndexResponse* response) {
    grpc::ClientContext context;
    return admin->ReloadIndex(&context, {}, response);
  };
  auto wait_for_log = [&](const std::string& text) {
    const absl::Time until = absl::Now() + absl::Seconds(60);
    while (daemon.Log().find(text) == std::string::npos && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return daemon.Log().find(text) != std::string::npos;
  };
  EXPECT_EQ(served(), 1);

  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(2)), 2);
  daemon.Signal(SIGHUP);
  ASSERT_TRUE(wait_for_log("versions/2/index.faiss (version 2)")) << daemon.Log();
  EXPECT_EQ(served(), 2);

  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(3)), 3);
  knnd::v1::ReloadIndexResponse reloaded;
  grpc::Status status = reload(&reloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reloaded.version(), 3);
  EXPECT_EQ(reloaded.previous_version(), 2);
  EXPECT_TRUE(reloaded.loaded());
  EXPECT_EQ(served(), 3);

  // A broken version: SIGHUP logs the refusal, the RPC returns it.
  IndexSpec broken = VersionSpec(4);
  broken.d = 8;  // knnd serves dim=16
  ASSERT_EQ(PublishIndex(tmp, dir, broken), 4);
  daemon.Signal(SIGHUP);
  ASSERT_TRUE(wait_for_log("index version 4")) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("dim=8 differs from dim=16"));
  status = reload(&reloaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("dim=8 differs from dim=16"));
  EXPECT_THAT(status.error_message(), HasSubstr("still serving version 3"));
  EXPECT_EQ(served(), 3);

  // SIGHUP and the RPC at once: version 5 is loaded once.
  ASSERT_EQ(PublishIndex(tmp, dir, VersionSpec(5)), 5);
  daemon.Signal(SIGHUP);
  status = reload(&reloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reloaded.version(), 5);
  EXPECT_EQ(served(), 5);
  const auto samples = knnd::testing::Scrape(metrics_port);
  EXPECT_EQ(knnd::testing::FindSample(samples, "knnd_index_reloads_total",
                                      {{"result", "ok"}}),
            4.0);  // versions 1, 2, 3 and 5
  EXPECT_EQ(knnd::testing::FindSample(samples, "knnd_index_reloads_total",
                                      {{"result", "failed"}}),
            1.0);
  daemon.Signal(SIGTERM);
  EXPECT_EQ(WEXITSTATUS(daemon.Wait()), 0);
}

TEST(Daemon, BadIndexFilesExitNonZeroWithAMessage) {
  TempDir tmp;
  IndexSpec spec;
  WriteIndex(tmp.path("good.index"), spec);
  const std::string good = ReadFile(tmp.path("good.index"));
  struct Case {
    std::string name;
    std::string bytes;
    std::string message;
  } cases[] = {
      {"truncated.index", good.substr(0, good.size() * 2 / 3), "is corrupt"},
      {"empty.index", "", "cannot read index file"},
      {"text.index", "this is not a FAISS index at all\n", "cannot read index"},
  };
  for (const Case& c : cases) {
    WriteFile(tmp.path(c.name), c.bytes);
    Daemon daemon({"--index", tmp.path(c.name), "--listen", "127.0.0.1:0"},
                  tmp.path("log"));
    const int status = daemon.Wait();
    ASSERT_TRUE(WIFEXITED(status)) << c.name << " killed knnd: " << daemon.Log();
    EXPECT_EQ(WEXITSTATUS(status), 1) << c.name;
    EXPECT_THAT(daemon.Log(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(daemon.Log(), HasSubstr(tmp.path(c.name)));
  }
  Daemon missing({"--index", tmp.path("absent.index"), "--listen", "127.0.0.1:0"},
                 tmp.path("log"));
  const int status = missing.Wait();
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(missing.Log(), HasSubstr("does not exist"));
}

TEST(Daemon, UsageErrorsExitTwo) {
  TempDir tmp;
  Daemon no_index({"--listen", "127.0.0.1:0"}, tmp.path("log"));
  int status = no_index.Wait();
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_THAT(no_index.Log(), HasSubstr("no index to serve"));
  {
    std::ofstream config(tmp.path("bad.textproto"));
    config << "max_k: 10\nno_such_field: 3\n";
  }
  Daemon bad_config({"--config", tmp.path("bad.textproto")}, tmp.path("log"));
  status = bad_config.Wait();
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_THAT(bad_config.Log(), HasSubstr("no_such_field"));
  // An empty value is a value: `--listen=` is refused, not the default.
  Daemon empty_listen({"--index", tmp.path("none.index"), "--listen="},
                      tmp.path("log"));
  status = empty_listen.Wait();
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_THAT(empty_listen.Log(), HasSubstr("listen_address is empty"));
}

// `--admin_listen=` turns the admin API off, over an address the config
// file gives: knnd serves searches, says the admin API is off, and nothing
// answers on the config's admin port. (absl reads `--flag=` of an optional
// flag as not given; knnd once fell back to the config's or the default
// 127.0.0.1:50052 and failed to start when another process held it.)
TEST(Daemon, EmptyAdminListenFlagTurnsTheAdminApiOff) {
  TempDir tmp;
  const IndexSpec spec;
  WriteIndex(tmp.path("s.index"), spec);
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const std::string admin_address = absl::StrCat("127.0.0.1:", FreePort());
  WriteFile(tmp.path("knnd.textproto"),
            absl::StrCat("admin_listen_address: \"", admin_address, "\"\n"));
  Daemon daemon({"--config", tmp.path("knnd.textproto"), "--index",
                 tmp.path("s.index"), "--listen", address, "--admin_listen=",
                 absl::StrCat("--metrics_listen=127.0.0.1:", FreePort())},
                tmp.path("knnd.log"));
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (ProbeHealth(address) != Health::SERVING && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(ProbeHealth(address), Health::SERVING) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("admin API off"));
  auto admin = knnd::v1::AdminService::NewStub(FreshChannel(admin_address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  knnd::v1::ListVersionsResponse versions;
  EXPECT_EQ(admin->ListVersions(&context, {}, &versions).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  daemon.Signal(SIGTERM);
  EXPECT_EQ(WEXITSTATUS(daemon.Wait()), 0);
}

// Bearer tokens in the process: a search needs a token of the file; after
// the file is rewritten and SIGHUP the new token is served and the old one
// refused; no log line (at debug level) holds any part of a token. A TLS
// file that cannot be read stops knnd with exit code 1.
TEST(Daemon, SighupReloadsTokenFileAndNoTokenIsLogged) {
  TempDir tmp;
  const IndexSpec spec;
  WriteIndex(tmp.path("s.index"), spec);
  const std::string old_token = "daemon-old-token-5e1f0c7a";
  const std::string new_token = "daemon-new-token-b93d24e8";
  std::ofstream(tmp.path("tokens")) << old_token << "\n";
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  {
    std::ofstream config(tmp.path("knnd.textproto"));
    config << "index_path: \"" << tmp.path("s.index") << "\"\n"
           << "listen_address: \"" << address << "\"\n"
           << "metrics_listen_address: \"127.0.0.1:" << FreePort() << "\"\n"
           << "num_workers: 1\n"
           << "log_level: \"debug\"\n"
           << "search_token_file: \"" << tmp.path("tokens") << "\"\n";
  }
  Daemon daemon({"--config", tmp.path("knnd.textproto")}, tmp.path("knnd.log"));
  for (int i = 0; i < 1200 && ProbeHealth(address) != Health::SERVING; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(ProbeHealth(address), Health::SERVING) << daemon.Log();
  auto search = [&](const std::string& token) {
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    knnd::v1::SearchRequest request;
    request.mutable_vectors()->Resize(spec.d, 0.5f);
    request.set_k(3);
    return CallSearch(*knnd::v1::KnnService::NewStub(grpc::CreateChannel(
                          address, grpc::InsecureChannelCredentials())),
                      request, nullptr, &context)
        .error_code();
  };
  EXPECT_EQ(search(old_token), grpc::OK);
  EXPECT_EQ(search(""), grpc::UNAUTHENTICATED);
  EXPECT_EQ(search(new_token), grpc::UNAUTHENTICATED);

  std::ofstream(tmp.path("tokens")) << new_token << "\n";
  daemon.Signal(SIGHUP);
  for (int i = 0; i < 300 && search(new_token) != grpc::OK; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(search(new_token), grpc::OK) << daemon.Log();
  EXPECT_EQ(search(old_token), grpc::UNAUTHENTICATED);
  daemon.Signal(SIGTERM);
  EXPECT_EQ(WEXITSTATUS(daemon.Wait()), 0);
  const std::string log = daemon.Log();
  EXPECT_THAT(log, HasSubstr("UNAUTHENTICATED"));  // refusals are logged
  for (const std::string& token : {old_token, new_token}) {
    for (size_t i = 0; i + 8 <= token.size(); ++i) {
      ASSERT_THAT(log, ::testing::Not(HasSubstr(token.substr(i, 8))))
          << "a log line holds part of a token";
    }
  }

  Daemon tls({"--index", tmp.path("s.index"), "--listen", "127.0.0.1:0",
              "--metrics_listen", "127.0.0.1:0", "--tls_cert",
              tmp.path("absent.pem"), "--tls_key", tmp.path("absent.key")},
             tmp.path("tls.log"));
  EXPECT_EQ(WEXITSTATUS(tls.Wait()), 1) << tls.Log();
  EXPECT_THAT(tls.Log(), HasSubstr("tls_cert_file"));
}

// --help is an answer, not an error: usage and knnd's own flags on
// stdout, exit 0, nothing served.
TEST(Daemon, HelpListsFlagsAndExitsZero) {
  TempDir tmp;
  Daemon help({"--help"}, tmp.path("log"));
  const int status = help.Wait();
  ASSERT_TRUE(WIFEXITED(status)) << help.Log();
  EXPECT_EQ(WEXITSTATUS(status), 0) << help.Log();
  EXPECT_THAT(help.Log(), HasSubstr("serves batched k-NN search"));
  for (const char* flag :
       {"--config", "--index", "--listen", "--workers", "--tls_client_ca",
        "--shard_targets", "--http_listen"}) {
    EXPECT_THAT(help.Log(), HasSubstr(absl::StrCat("\n  ", flag, "\n")));
  }
}

TEST(Daemon, VersionNamesFaissBuild) {
  TempDir tmp;
  Daemon version({"--version"}, tmp.path("log"));
  EXPECT_EQ(WEXITSTATUS(version.Wait()), 0);
  EXPECT_THAT(version.Log(), HasSubstr("faiss 1.7.3"));
}

}  // namespace
}  // namespace knnd

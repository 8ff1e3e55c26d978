// knnd: serves k-NN search over one memory-mapped FAISS IVF-PQ index.
#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "knnd/config/config.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/index/index_probe.h"
#include "knnd/monitoring/build_info.h"
#include "knnd/server.h"
#include "spdlog/cfg/helpers.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "",
          "Path of a text-format knnd.v1.ServerConfig file (see "
          "config/knnd.textproto). Flags below override its fields.");
// Unset optional flags leave the config file's value (or its default) alone.
ABSL_FLAG(absl::optional<std::string>, index, absl::nullopt,
          "FAISS IVF-PQ index file to serve, or a directory of numbered "
          "versions DIR/<N>/index.faiss (the highest complete one is served; "
          "SIGHUP reloads).");
ABSL_FLAG(absl::optional<std::string>, shard_targets, absl::nullopt,
          "Comma-separated gRPC targets of the shards of one index (one per "
          "shard): serve as their front, merging every Search over all of "
          "them, instead of serving an index (docs/sharding.md).");
ABSL_FLAG(absl::optional<std::string>, listen, absl::nullopt,
          "host:port of the gRPC search API (default 0.0.0.0:50051).");
ABSL_FLAG(absl::optional<std::string>, admin_listen, absl::nullopt,
          "host:port of the admin API (ReloadIndex, ListVersions; default "
          "127.0.0.1:50052, localhost only); empty turns it off.");
ABSL_FLAG(absl::optional<std::string>, http_listen, absl::nullopt,
          "host:port of the HTTP/1.1 JSON API (POST /v1/search, GET "
          "/v1/index_info, /healthz/live, /healthz/ready; docs/api.md); off "
          "by default, 0.0.0.0:8080 is the documented port.");
ABSL_FLAG(absl::optional<std::string>, metrics_listen, absl::nullopt,
          "host:port of the Prometheus /metrics endpoint (default "
          "0.0.0.0:9090).");
ABSL_FLAG(absl::optional<int>, workers, absl::nullopt,
          "Search threads; 0 = one per CPU core (the default).");
ABSL_FLAG(absl::optional<std::string>, log_level, absl::nullopt,
          "trace, debug, info (default), warn, error, critical or off.");
ABSL_FLAG(absl::optional<bool>, reflection, absl::nullopt,
          "Serve gRPC server reflection (default true).");
// Bearer tokens have no flag on purpose: a command line is visible to every
// user of the machine (ps, /proc). They come from search_token_file and
// admin_token_file in --config.
ABSL_FLAG(absl::optional<std::string>, tls_cert, absl::nullopt,
          "PEM certificate chain of the search port; with --tls_key turns "
          "TLS on (re-read every tls_reload_interval_s).");
ABSL_FLAG(absl::optional<std::string>, tls_key, absl::nullopt,
          "PEM private key of --tls_cert.");
ABSL_FLAG(absl::optional<std::string>, tls_client_ca, absl::nullopt,
          "PEM CA bundle: clients must present a certificate signed by one "
          "of these (mutual TLS).");

namespace {

// The flags given an empty value on the command line (`--name=`,
// `-name=`, or `--name ""`), up to a `--`. absl parses an empty value of an
// optional flag into nullopt, the same as a flag not given, and this
// abseil's CommandLineFlag cannot say whether a flag was given.
std::vector<std::string> EmptyFlags(int argc, char** argv) {
  std::vector<std::string> empty;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--")) {
      if (!absl::ConsumePrefix(&arg, "-")) continue;
    }
    if (absl::ConsumeSuffix(&arg, "=")) {
      if (arg.find('=') == absl::string_view::npos) empty.emplace_back(arg);
    } else if (arg.find('=') == absl::string_view::npos && i + 1 < argc &&
               argv[i + 1][0] == '\0') {
      empty.emplace_back(arg);
    }
  }
  return empty;
}

// A string flag's value: an empty value given on the command line is the
// empty string, not "not given", so that `--admin_listen=` turns the admin
// API off as its help says, and `--listen=` is refused as an empty address
// instead of falling back to the default.
absl::optional<std::string> StringFlag(
    const absl::Flag<absl::optional<std::string>>& flag,
    const std::vector<std::string>& empty_flags) {
  if (absl::optional<std::string> v = absl::GetFlag(flag)) return v;
  const absl::string_view name = absl::GetFlagReflectionHandle(flag).Name();
  if (std::find(empty_flags.begin(), empty_flags.end(), name) !=
      empty_flags.end()) {
    return std::string();
  }
  return absl::nullopt;
}

absl::StatusOr<knnd::v1::ServerConfig> BuildConfig(
    const std::vector<std::string>& empty_flags) {
  auto text = [&](const absl::Flag<absl::optional<std::string>>& flag) {
    return StringFlag(flag, empty_flags);
  };
  knnd::v1::ServerConfig config;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    absl::StatusOr<knnd::v1::ServerConfig> loaded =
        knnd::LoadConfigFile(absl::GetFlag(FLAGS_config));
    if (!loaded.ok()) return loaded.status();
    config = std::move(*loaded);
  }
  if (auto v = text(FLAGS_index)) config.set_index_path(*v);
  if (auto v = text(FLAGS_listen)) config.set_listen_address(*v);
  if (auto v = text(FLAGS_admin_listen)) {
    config.set_admin_listen_address(*v);
  }
  if (auto v = text(FLAGS_http_listen)) config.set_http_listen_address(*v);
  if (auto v = text(FLAGS_metrics_listen)) {
    config.set_metrics_listen_address(*v);
  }
  if (auto v = absl::GetFlag(FLAGS_workers)) {
    if (*v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--workers=", *v, " must be >= 0"));
    }
    config.set_num_workers(static_cast<uint32_t>(*v));
  }
  if (auto v = text(FLAGS_log_level)) config.set_log_level(*v);
  if (auto v = absl::GetFlag(FLAGS_reflection)) config.set_enable_reflection(*v);
  if (auto v = text(FLAGS_tls_cert)) config.set_tls_cert_file(*v);
  if (auto v = text(FLAGS_tls_key)) config.set_tls_key_file(*v);
  if (auto v = text(FLAGS_tls_client_ca)) {
    config.set_tls_client_ca_file(*v);
  }
  if (auto v = text(FLAGS_shard_targets)) {
    config.clear_shard_targets();
    for (absl::string_view target : absl::StrSplit(*v, ',', absl::SkipEmpty())) {
      config.add_shard_targets(std::string(target));
    }
  }
  if (config.index_path().empty() && config.shard_targets_size() == 0) {
    return absl::InvalidArgumentError(
        "no index to serve: give --index PATH or index_path in --config (or "
        "--shard_targets to serve as the front of a sharded index)");
  }
  if (absl::Status s = knnd::ValidateConfig(config); !s.ok()) return s;
  return config;
}

// The flags knnd's --help lists: those of this file, not those of the
// libraries it links.
bool IsKnndFlagFile(absl::string_view file) {
  return absl::EndsWith(file, "src/main.cc");
}

// absl::ParseCommandLine() answers --help with exit code 1, which reads as
// a failure to scripts and health checks; knnd answers --help (and -help)
// itself, before parsing. absl's other help flags (--helpfull ...) stay
// absl's.
bool HelpAsked(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-help") return true;
  }
  return false;
}

// The usage message and every flag of this file with its help, on stdout.
void PrintHelp() {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsKnndFlagFile(flag->Filename())) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  std::printf("knnd: %s\n\nflags:\n",
              std::string(absl::ProgramUsageMessage()).c_str());
  for (const absl::CommandLineFlag* flag : flags) {
    std::printf("  --%s\n      %s\n", std::string(flag->Name()).c_str(),
                flag->Help().c_str());
  }
}

absl::Status SetUpLogging(const std::string& level_name) {
  const spdlog::level::level_enum level = spdlog::level::from_str(level_name);
  if (level == spdlog::level::off && level_name != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "log_level=", level_name,
        " is not one of trace, debug, info, warn, error, critical, off"));
  }
  auto logger = spdlog::stderr_color_mt("knnd");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%L%$ %v");
  logger->set_level(level);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  // Before any other thread or BLAS call (the index probe's child inherits
  // the choice through OPENBLAS_CORETYPE).
  const knnd::BlasKernels& blas = knnd::UseBlasKernelsForThisCpu();
  knnd::RunIndexProbeIfAsked(argc, argv);
  // Debian's abseil is built with absl::Mutex deadlock detection on: a
  // lock-order graph updated on every lock, a few percent of knnd's CPU
  // under single-query load. The tests and sanitizer builds keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::FlagsUsageConfig usage;
  usage.version_string = [] { return knnd::BuildInfoLine() + "\n"; };
  usage.contains_help_flags = IsKnndFlagFile;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "serves batched k-NN search over gRPC (and HTTP/JSON) from one "
      "memory-mapped FAISS "
      "IVF-PQ index.\n  knnd --index INDEX [--config FILE] [--listen "
      "HOST:PORT] [--http_listen HOST:PORT] [--metrics_listen HOST:PORT]"
      "\n  [--workers N] [--log_level LEVEL]"
      "\n  [--tls_cert PEM --tls_key PEM [--tls_client_ca PEM]]"
      "\n  knnd --shard_targets A,B,... [flags]  (a front of shards: "
      "docs/sharding.md)");
  if (HelpAsked(argc, argv)) {
    PrintHelp();
    return 0;
  }
  const std::vector<std::string> empty_flags = EmptyFlags(argc, argv);
  absl::ParseCommandLine(argc, argv);

  absl::StatusOr<knnd::v1::ServerConfig> config = BuildConfig(empty_flags);
  if (!config.ok()) {
    std::fprintf(stderr, "knnd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (absl::Status s = SetUpLogging(config->log_level()); !s.ok()) {
    std::fprintf(stderr, "knnd: %s\n", std::string(s.message()).c_str());
    return 2;
  }

  // Signals are taken synchronously by this thread (sigwait below); every
  // thread started from here on inherits the blocked mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  spdlog::info("{}", knnd::BuildInfoLine());
  if (!blas.note.empty()) spdlog::info("{}", blas.note);
  absl::StatusOr<std::unique_ptr<knnd::Server>> server =
      knnd::Server::Create(*config);
  if (!server.ok()) {
    spdlog::critical("{}", server.status().ToString());
    return 1;
  }
  if (absl::Status s = (*server)->Start(); !s.ok()) {
    spdlog::critical("{}", s.ToString());
    return 1;
  }
  if (absl::Status s = (*server)->LoadIndex(); !s.ok()) {
    spdlog::critical("cannot serve: {}", s.ToString());
    (*server)->Drain({});
    return 1;
  }
  for (;;) {
    int signal = 0;
    if (sigwait(&signals, &signal) != 0) continue;
    if (signal == SIGHUP) {
      // Loading a version can take long; the manager's thread does it so
      // that this loop still answers SIGTERM meanwhile.
      spdlog::info("SIGHUP: reloading the index and the token files");
      (*server)->RequestReload();
      if (absl::Status s = (*server)->ReloadTokens(); !s.ok()) {
        spdlog::error("keeping the previous tokens: {}", s.ToString());
      }
      continue;
    }
    spdlog::info("{}: shutting down", strsignal(signal));
    break;
  }
  knnd::Server::DrainPlan plan;
  plan.delay = absl::Milliseconds(config->shutdown_delay_ms());
  plan.refuse_during_delay = config->shutdown_delay_refuses_searches();
  plan.grace = absl::Milliseconds(config->drain_grace_period_ms());
  // The drain runs on its own thread; this one keeps taking signals: a
  // second SIGTERM or SIGINT ends the shutdown delay at once (an operator's
  // second Ctrl-C), SIGHUP is ignored from now on.
  absl::Notification drained;
  std::thread drainer([&] {
    (*server)->Drain(plan);
    drained.Notify();
  });
  const timespec poll = {0, 50 * 1000 * 1000};
  while (!drained.HasBeenNotified()) {
    const int signal = sigtimedwait(&signals, nullptr, &poll);
    if (signal == SIGTERM || signal == SIGINT) {
      spdlog::info("{} again: ending the shutdown delay", strsignal(signal));
      (*server)->EndShutdownDelay();
    }
  }
  drainer.join();
  return 0;
}

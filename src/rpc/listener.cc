#include "knnd/rpc/listener.h"

#include <algorithm>
#include <climits>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace knnd {
namespace {

// A config duration in ms where 0 means "never" as a gRPC channel argument,
// for which INT_MAX means "never". ValidateConfig() bounds it to INT_MAX.
int MillisOrInfinite(uint32_t ms) {
  return ms == 0 ? INT_MAX : static_cast<int>(ms);
}

// Gives this server reflection or takes it away. Linking gRPC's reflection
// library registers its plugin for every server at static initialisation,
// so turning reflection off means removing the plugin, and turning it on
// must not add it twice.
class ReflectionOption : public grpc::ServerBuilderOption {
 public:
  explicit ReflectionOption(bool enabled) : enabled_(enabled) {}
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*
                         plugins) override {
    auto reflection =
        std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>();
    const std::string name = reflection->name();
    plugins->erase(
        std::remove_if(plugins->begin(), plugins->end(),
                       [&](const auto& p) { return p->name() == name; }),
        plugins->end());
    if (enabled_) plugins->push_back(std::move(reflection));
  }

 private:
  const bool enabled_;
};

void AddConnectionLimits(const ConnectionLimits& limits,
                         grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(
      static_cast<int>(limits.max_receive_message_bytes));
  builder->SetMaxSendMessageSize(
      static_cast<int>(limits.max_send_message_bytes));
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                              MillisOrInfinite(limits.max_connection_age_ms));
  builder->AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
      MillisOrInfinite(limits.max_connection_age_grace_ms));
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              limits.max_concurrent_streams);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      limits.keepalive_min_ping_interval_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                              limits.keepalive_permit_without_calls ? 1 : 0);
  builder->AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE,
                              limits.max_metadata_bytes);
  if (limits.memory_quota_bytes > 0) {
    grpc::ResourceQuota quota("knnd");
    quota.Resize(static_cast<size_t>(limits.memory_quota_bytes));
    builder->SetResourceQuota(quota);
  }
}

}  // namespace

absl::StatusOr<Listener> BuildListener(const ListenerSpec& spec) {
  Listener listener;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(spec.address, spec.credentials, &listener.port);
  AddConnectionLimits(spec.limits, &builder);
  builder.SetOption(std::make_unique<ReflectionOption>(spec.reflection));
  for (AsyncService* service : spec.services) {
    builder.RegisterService(service->grpc_service());
  }
  for (grpc::Service* service : spec.callback_services) {
    builder.RegisterService(service);
  }
  auto queues = std::make_unique<CompletionQueueThreads>();
  for (int i = 0; i < std::max(1, spec.queues); ++i) {
    queues->Add(builder.AddCompletionQueue());
  }
  listener.server = builder.BuildAndStart();
  if (listener.server == nullptr || listener.port == 0) {
    listener.server.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", spec.role,
                                               " ", spec.address,
                                               " (address in use or invalid)"));
  }
  for (size_t i = 0; i < queues->size(); ++i) {
    for (AsyncService* service : spec.services) {
      service->Listen(queues->queue(i));
    }
  }
  queues->Start(spec.thread_name, spec.threads_per_queue, spec.poll_us,
                spec.may_poll);
  listener.queues = std::move(queues);
  return listener;
}

void Listener::Close(absl::Time deadline) {
  if (server != nullptr) {
    server->Shutdown(absl::ToChronoTime(std::max(deadline, absl::Now())));
    server->Wait();
  }
  // The queues after the server: it needs them drained until it is down.
  if (queues != nullptr) queues->Shutdown();
  server.reset();
  queues.reset();
}

}  // namespace knnd

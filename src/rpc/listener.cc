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
  // A call whose message knnd has not asked for yet (ReadOnMatchMethod)
  // holds what its HTTP/2 stream window let the client send: gRPC's
  // initial 64 KiB without BDP probing, which would raise the window every
  // stream starts with to the connection's bandwidth-delay product
  // (megabytes). A message being read still gets a window of its size.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // Near the quota gRPC frees memory by sending GOAWAY on idle connections
  // and then by cancelling calls picked at random (RST_STREAM
  // ENHANCE_YOUR_CALM), admitted ones included; RequestReads keeps the
  // messages being read within it.
  if (limits.memory_quota_bytes > 0) {
    grpc::ResourceQuota quota("knnd");
    quota.Resize(static_cast<size_t>(limits.memory_quota_bytes));
    builder->SetResourceQuota(quota);
  }
}

}  // namespace

int RequestReads(const ConnectionLimits& limits) {
  if (limits.memory_quota_bytes <= 0) return kMaxRequestReads;
  const int64_t reads = limits.memory_quota_bytes /
                        std::max<int64_t>(1, limits.max_receive_message_bytes);
  return static_cast<int>(std::clamp<int64_t>(reads, 1, kMaxRequestReads));
}

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
    ServingQueue queue = queues->queue(i);
    queue.request_reads = RequestReads(spec.limits);
    for (AsyncService* service : spec.services) service->Listen(queue);
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

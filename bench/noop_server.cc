// noop_server: knnd.v1.KnnService that answers Search without searching: the
// transport floor of the benchmark. Same API and thread model as knnd
// (knnd's own listener: gRPC's asynchronous API, one completion queue
// drained by a thread per core, rpc/async_call.h; the same message sizes), and an answer
// of the same size (num_queries x k ids and distances), so that what a
// load_gen run measures against it is what gRPC, protobuf and the loopback
// cost a knnd request before and after FAISS. make bench sets knnd beside
// it: knnd's p50 minus this one's and minus FAISS's is what knnd itself
// adds.
//
//   noop_server --port 50099    # prints "serving" once it listens
//   noop_server --callback      # gRPC's callback API instead (comparison)
//
// Stops on SIGTERM or SIGINT.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "grpcpp/grpcpp.h"
#include "knnd/rpc/async_call.h"
#include "knnd/rpc/listener.h"
#include "knnd/serving/worker_pool.h"
#include "knnd/v1/knn_service.grpc.pb.h"

ABSL_FLAG(int, port, 50099, "Port on 127.0.0.1.");
ABSL_FLAG(int, queues, 1, "Completion queues (knnd's: 1).");
ABSL_FLAG(int, threads_per_queue, 0,
          "Threads draining each queue; 0: one per core, as knnd.");
ABSL_FLAG(int, poll_us, 100,
          "Microseconds a thread polls its queue after each event before it "
          "sleeps, as knnd's grpc_poll_us (knnd's default: 100); 0: none.");
ABSL_FLAG(int64_t, memory_quota_bytes, 0,
          "gRPC's ResourceQuota on the port, as knnd's grpc_memory_quota_bytes "
          "(knnd's default: half of memory_headroom_bytes); 0: none.");
ABSL_FLAG(bool, callback, false,
          "Serve on gRPC's callback API (knnd before its listeners moved to "
          "the asynchronous API) instead of knnd's listener.");

namespace {

// The answer: num_queries x k ids and distances, as knnd's.
void Answer(const knnd::v1::SearchRequest& request,
            knnd::v1::SearchResponse* response) {
  const int64_t values =
      request.vectors_size() > 0
          ? request.vectors_size()
          : static_cast<int64_t>(request.vectors_f32le().size() / 4);
  const int64_t rows = request.dim() > 0 ? values / request.dim() : 0;
  const int k = std::max(0, request.k());
  response->set_num_queries(static_cast<uint32_t>(rows));
  response->set_k(k);
  response->mutable_ids()->Resize(static_cast<int>(rows * k), -1);
  response->mutable_distances()->Resize(static_cast<int>(rows * k), 0.0f);
}

class CallbackNoop final : public knnd::v1::KnnService::CallbackService {
 public:
  grpc::ServerUnaryReactor* Search(
      grpc::CallbackServerContext* context,
      const knnd::v1::SearchRequest* request,
      knnd::v1::SearchResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    Answer(*request, response);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

class AsyncNoop final : public knnd::AsyncService {
 public:
  using Async = knnd::v1::KnnService::AsyncService;
  AsyncNoop()
      : search_(&service_, &Async::RequestSearch,
                [](knnd::UnaryCall<knnd::v1::SearchRequest,
                                   knnd::v1::SearchResponse>* call) {
                  Answer(call->request(), call->response());
                  call->Finish(grpc::Status::OK);
                }) {}
  grpc::Service* grpc_service() override { return &service_; }
  void Listen(const knnd::ServingQueue& queue) override {
    search_.Listen(queue, 4);  // as knnd's Search
  }

 private:
  Async service_;
  knnd::UnaryMethod<Async, knnd::v1::SearchRequest, knnd::v1::SearchResponse>
      search_;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Blocked before gRPC starts its threads, so that sigwait takes them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  CallbackNoop callback_service;
  AsyncNoop async_service;
  knnd::ListenerSpec spec;
  spec.address = "127.0.0.1:" + std::to_string(absl::GetFlag(FLAGS_port));
  spec.credentials = grpc::InsecureServerCredentials();
  spec.limits.max_receive_message_bytes = 64 << 20;
  spec.limits.memory_quota_bytes = absl::GetFlag(FLAGS_memory_quota_bytes);
  spec.queues = absl::GetFlag(FLAGS_queues);
  spec.threads_per_queue = absl::GetFlag(FLAGS_threads_per_queue) > 0
                               ? absl::GetFlag(FLAGS_threads_per_queue)
                               : knnd::AvailableCores();
  spec.poll_us = absl::GetFlag(FLAGS_poll_us);
  spec.thread_name = "noop-grpc";
  if (absl::GetFlag(FLAGS_callback)) {
    spec.callback_services.push_back(&callback_service);
  } else {
    spec.services.push_back(&async_service);
  }
  absl::StatusOr<knnd::Listener> listener = knnd::BuildListener(spec);
  if (!listener.ok()) {
    std::fprintf(stderr, "noop_server: %s\n",
                 std::string(listener.status().message()).c_str());
    return 1;
  }
  std::printf("serving\n");
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop, &signal_number);
  listener->Close(absl::Now() + absl::Seconds(1));
  return 0;
}

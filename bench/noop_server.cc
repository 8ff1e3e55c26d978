// noop_server: knnd.v1.KnnService that answers Search without searching: the
// transport floor of the benchmark. Same API and thread model as knnd
// (knnd's own listener: gRPC's asynchronous API, one completion queue
// drained by a thread per core, rpc/async_call.h; the same message sizes), and
// an answer of the same size (num_queries x k ids and distances), so that what
// a load_gen run measures against it is what gRPC, protobuf and the loopback
// cost a knnd request before and after FAISS. make bench sets knnd beside
// it: knnd's p50 minus this one's and minus FAISS's is what knnd itself
// adds.
//
// With --index it is the bare FAISS server instead: the same listener, and
// each Search runs the index's search inline on the completion-queue thread
// that took the call (knnd's IndexSnapshot, lists memory-mapped, as knnd
// serves them; the request's nprobe, k and refine_factor, re-ranked from
// INDEX.vectors, by knnd's default refine_factor where the request sets
// none; OpenBLAS's kernels chosen as knnd chooses them), with none of knnd's
// gate, workers, limits, metrics or logging. What knnd's p50 is above this
// one's is knnd's own cost, with whatever a search costs inside any gRPC
// server (caches shared with the network path, the core waking between
// requests) on both sides.
//
//   noop_server --port 50099    # prints "serving" once it listens
//   noop_server --callback      # gRPC's callback API instead (comparison)
//   noop_server --index x.index --nprobe 16   # the bare FAISS server
//
// Stops on SIGTERM or SIGINT.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "grpcpp/grpcpp.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/index/index_probe.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/rpc/async_call.h"
#include "knnd/rpc/listener.h"
#include "knnd/serving/search_limits.h"
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
ABSL_FLAG(std::string, index, "",
          "Serve this index: search it inline on the gRPC thread (the bare "
          "FAISS server); empty: answer without searching.");
ABSL_FLAG(int, nprobe, 16, "nprobe where a request names none (--index).");

namespace {

// The floats a request carries, in either of its two forms.
int64_t QueryValues(const knnd::v1::SearchRequest& request) {
  return request.vectors_size() > 0
             ? request.vectors_size()
             : static_cast<int64_t>(request.vectors_f32le().size() / 4);
}

// The answer: num_queries x k ids and distances, as knnd's.
void Answer(const knnd::v1::SearchRequest& request,
            knnd::v1::SearchResponse* response) {
  const int64_t values = QueryValues(request);
  const int64_t rows = request.dim() > 0 ? values / request.dim() : 0;
  const int k = std::max(0, request.k());
  response->set_num_queries(static_cast<uint32_t>(rows));
  response->set_k(k);
  response->mutable_ids()->Resize(static_cast<int>(rows * k), -1);
  response->mutable_distances()->Resize(static_cast<int>(rows * k), 0.0f);
}

// The bare FAISS server's answer: the index's k nearest neighbours of each
// row, searched on the calling thread. Bad input is answered with
// INVALID_ARGUMENT (load_gen sends none).
const knnd::IndexSnapshot* g_index = nullptr;
// The refine_factor knnd with its default configuration gives a request
// that sets none (the sidecar's tuned one, 0 without raw vectors), so that
// the floor re-ranks when knnd does.
int g_default_refine_factor = 0;

grpc::Status SearchIndex(const knnd::v1::SearchRequest& request,
                         knnd::v1::SearchResponse* response) {
  const int64_t dim = g_index->info().dim;
  const int64_t values = QueryValues(request);
  const int k = request.k();
  if ((request.dim() != 0 && request.dim() != dim) || values == 0 ||
      values % dim != 0 || k <= 0 || k > 1024) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        "dim must be the index's, vectors whole rows, k 1-1024");
  }
  const int64_t rows = values / dim;
  // One OpenMP thread per search, as knnd's omp_threads_per_worker.
  thread_local const bool one_thread =
      (knnd::SetOpenMpThreadsOfThisThread(1), true);
  (void)one_thread;
  const float* queries = request.vectors().data();
  thread_local std::vector<float> aligned;
  if (request.vectors_size() == 0) {
    aligned.resize(values);
    std::memcpy(aligned.data(), request.vectors_f32le().data(), values * 4);
    queries = aligned.data();
  }
  response->mutable_ids()->Resize(static_cast<int>(rows * k), -1);
  response->mutable_distances()->Resize(static_cast<int>(rows * k), 0.0f);
  knnd::SearchArgs args;
  args.queries = queries;
  args.num_queries = rows;
  args.k = k;
  args.nprobe = request.nprobe() > 0 ? static_cast<int>(request.nprobe())
                                     : absl::GetFlag(FLAGS_nprobe);
  args.refine_factor = request.has_refine_factor()
                            ? static_cast<int>(request.refine_factor())
                            : g_default_refine_factor;
  args.distances = response->mutable_distances()->mutable_data();
  args.ids = response->mutable_ids()->mutable_data();
  absl::Status status = g_index->Search(args);
  if (!status.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        std::string(status.message()));
  }
  response->set_num_queries(static_cast<uint32_t>(rows));
  response->set_k(k);
  response->set_nprobe(static_cast<uint32_t>(args.nprobe));
  return grpc::Status::OK;
}

grpc::Status Respond(const knnd::v1::SearchRequest& request,
                     knnd::v1::SearchResponse* response) {
  if (g_index != nullptr) return SearchIndex(request, response);
  Answer(request, response);
  return grpc::Status::OK;
}

class CallbackNoop final : public knnd::v1::KnnService::CallbackService {
 public:
  grpc::ServerUnaryReactor* Search(
      grpc::CallbackServerContext* context,
      const knnd::v1::SearchRequest* request,
      knnd::v1::SearchResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(Respond(*request, response));
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
                  call->Finish(Respond(call->request(), call->response()));
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
  knnd::RunIndexProbeIfAsked(argc, argv);
  knnd::UseBlasKernelsForThisCpu();  // as knnd does, first thing
  knnd::UseSingleThreadedBlas();  // as knnd's workers: one thread a call
  absl::ParseCommandLine(argc, argv);
  // Blocked before gRPC starts its threads, so that sigwait takes them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  std::unique_ptr<knnd::IndexSnapshot> snapshot;
  if (!absl::GetFlag(FLAGS_index).empty()) {
    auto loaded = knnd::IndexSnapshot::Load(absl::GetFlag(FLAGS_index), {});
    if (!loaded.ok()) {
      std::fprintf(stderr, "noop_server: %s\n",
                   loaded.status().ToString().c_str());
      return 1;
    }
    snapshot = std::move(*loaded);
    g_index = snapshot.get();
    g_default_refine_factor =
        knnd::ResolveLimits(knnd::LimitsConfig(), g_index->info())
            .default_refine_factor;
  }
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

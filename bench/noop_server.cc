// noop_server: knnd.v1.KnnService that answers Search without searching: the
// transport floor of the benchmark. Same API and thread model as knnd
// (gRPC's callback API, the same message sizes), and an answer of the same
// size (num_queries x k ids and distances), so that what a load_gen run
// measures against it is what gRPC, protobuf and the loopback cost a knnd
// request before and after FAISS. make bench sets knnd beside it: knnd's p50
// minus this one's and minus FAISS's is what knnd itself adds.
//
//   noop_server --port 50099    # prints "serving" once it listens
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
#include "knnd/v1/knn_service.grpc.pb.h"

ABSL_FLAG(int, port, 50099, "Port on 127.0.0.1.");

namespace {

class NoopService final : public knnd::v1::KnnService::CallbackService {
 public:
  grpc::ServerUnaryReactor* Search(
      grpc::CallbackServerContext* context,
      const knnd::v1::SearchRequest* request,
      knnd::v1::SearchResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    const int64_t values = request->vectors_size() > 0
                               ? request->vectors_size()
                               : static_cast<int64_t>(
                                     request->vectors_f32le().size() / 4);
    const int64_t rows = request->dim() > 0 ? values / request->dim() : 0;
    const int k = std::max(0, request->k());
    response->set_num_queries(static_cast<uint32_t>(rows));
    response->set_k(k);
    response->mutable_ids()->Resize(static_cast<int>(rows * k), -1);
    response->mutable_distances()->Resize(static_cast<int>(rows * k), 0.0f);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
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

  NoopService service;
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string address =
      "127.0.0.1:" + std::to_string(absl::GetFlag(FLAGS_port));
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "noop_server: cannot listen on port %d\n",
                 absl::GetFlag(FLAGS_port));
    return 1;
  }
  std::printf("serving\n");
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop, &signal_number);
  server->Shutdown();
  return 0;
}

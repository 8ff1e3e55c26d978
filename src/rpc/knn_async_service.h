// KnnAsyncService: knnd.v1.KnnService on gRPC's asynchronous API with
// Search registered as a stream and served by ReadOnMatchMethod
// (async_call.h): gRPC matches a Search call without reading its request
// message, and knnd reads it once it has a read to spare, so that a flood
// of large requests waits in gRPC's queue of calls instead of being
// received all at once. On the wire Search stays a unary method.
// GetIndexInfo and Get are ordinary asynchronous unary methods.
//
// Thread-safety: as the generated AsyncService (RequestSearch from any
// thread once the server has started).
#ifndef KNND_RPC_KNN_ASYNC_SERVICE_H_
#define KNND_RPC_KNN_ASYNC_SERVICE_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/async_stream.h>

#include "knnd/rpc/search_request_codec.h"  // before the service is used
#include "knnd/v1/knn_service.grpc.pb.h"

namespace knnd {

class KnnAsyncService final
    : public knnd::v1::KnnService::WithAsyncMethod_Get<
          knnd::v1::KnnService::WithAsyncMethod_GetIndexInfo<
              knnd::v1::KnnService::WithStreamedUnaryMethod_Search<
                  knnd::v1::KnnService::Service>>> {
 public:
  using SearchReader = grpc::ServerAsyncReader<knnd::v1::SearchResponse,
                                               knnd::v1::SearchRequest>;

  // The streamed registration (its base) gives the server a method whose
  // message it does not read; marking it asynchronous drops the
  // synchronous handler that registration installed.
  KnnAsyncService() { MarkMethodAsync(kSearch); }

  void RequestSearch(grpc::ServerContext* context, SearchReader* reader,
                     grpc::CompletionQueue* new_call_cq,
                     grpc::ServerCompletionQueue* notification_cq, void* tag) {
    RequestAsyncClientStreaming(kSearch, context, reader, new_call_cq,
                                notification_cq, tag);
  }

  // Never called: the method is asynchronous (RequestSearch).
  grpc::Status StreamedSearch(
      grpc::ServerContext* /*context*/,
      grpc::ServerUnaryStreamer<knnd::v1::SearchRequest,
                                knnd::v1::SearchResponse>* /*streamer*/)
      override {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "");
  }

 private:
  // Search's index among the service's methods (its order in the proto).
  static constexpr int kSearch = 0;
};

}  // namespace knnd

#endif  // KNND_RPC_KNN_ASYNC_SERVICE_H_

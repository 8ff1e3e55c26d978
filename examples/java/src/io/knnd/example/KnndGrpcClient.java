package io.knnd.example;

import com.google.protobuf.ByteString;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.MetadataUtils;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import knnd.v1.KnnServiceGrpc;
import knnd.v1.KnnServiceOuterClass.FusionMethod;
import knnd.v1.KnnServiceOuterClass.PayloadRequest;
import knnd.v1.KnnServiceOuterClass.SearchRequest;
import knnd.v1.KnnServiceOuterClass.SearchResponse;

/**
 * knnd over gRPC, through the stubs protoc generates from
 * proto/knnd/v1/knn_service.proto. One channel serves every call from any
 * thread (it multiplexes them over one HTTP/2 connection): make one client
 * per process, e.g. a Spring bean, and close it at shutdown.
 */
public final class KnndGrpcClient implements KnndClient {
  private final ManagedChannel channel;
  private final KnnServiceGrpc.KnnServiceBlockingStub stub;
  private final long timeoutMs;

  /**
   * @param target host:port of knnd's gRPC listener (plaintext here; TLS:
   *     NettyChannelBuilder's sslContext with the same files knnd uses)
   * @param token the bearer token when knnd asks for one, else null
   * @param timeoutMs each call's deadline
   */
  public KnndGrpcClient(String target, String token, long timeoutMs) {
    this.channel = NettyChannelBuilder.forTarget(target)
                       .usePlaintext()
                       .maxInboundMessageSize(64 << 20)
                       .build();
    KnnServiceGrpc.KnnServiceBlockingStub s = KnnServiceGrpc.newBlockingStub(channel);
    if (token != null) {
      Metadata headers = new Metadata();
      headers.put(
          Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + token);
      s = s.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers));
    }
    this.stub = s;
    this.timeoutMs = timeoutMs;
  }

  @Override
  public List<List<Hit>> search(float[][] queries, int k, SearchOptions options) {
    SearchRequest.Builder request = SearchRequest.newBuilder().setK(k);
    if (queries.length > 0) {
      int dim = queries[0].length;
      // The vectors as one little-endian float32 block: no per-float
      // encoding on either side.
      ByteBuffer block =
          ByteBuffer.allocate(queries.length * dim * 4).order(ByteOrder.LITTLE_ENDIAN);
      for (float[] query : queries) {
        if (query.length != dim) {
          throw new IllegalArgumentException("every query must have " + dim + " values");
        }
        for (float v : query) block.putFloat(v);
      }
      block.flip();
      request.setDim(dim).setVectorsF32Le(ByteString.copyFrom(block));
    }
    if (options.nprobe() != null)
      request.setNprobe(options.nprobe());
    if (options.refineFactor() != null)
      request.setRefineFactor(options.refineFactor());
    if (options.payloads())
      request.setPayloads(PayloadRequest.newBuilder().setAllFields_(true));
    if (options.texts() != null && !options.texts().isEmpty()) {
      request.addAllTexts(options.texts());
      if (options.fusion() != null) {
        request.setFusion("weighted".equals(options.fusion()) ? FusionMethod.FUSION_WEIGHTED
                                                              : FusionMethod.FUSION_RRF);
      }
    }
    SearchResponse response;
    try {
      response = stub.withDeadlineAfter(timeoutMs, TimeUnit.MILLISECONDS).search(request.build());
    } catch (StatusRuntimeException e) {
      throw new KnndException(
          e.getStatus().getCode().name(), String.valueOf(e.getStatus().getDescription()), e);
    }
    return hitsOf(response);
  }

  /** The response's ids, distances, payloads and ranks, per query; id -1 pads. */
  static List<List<Hit>> hitsOf(SearchResponse r) {
    List<List<Hit>> out = new ArrayList<>();
    int k = r.getK();
    for (int q = 0; q < r.getNumQueries(); q++) {
      List<Hit> hits = new ArrayList<>();
      for (int j = q * k; j < (q + 1) * k; j++) {
        long id = r.getIds(j);
        if (id < 0)
          continue;
        hits.add(new Hit(id, r.getDistances(j),
            r.getPayloadsCount() > j ? r.getPayloads(j).toStringUtf8() : null,
            r.getVectorRanksCount() > j ? r.getVectorRanks(j) : 0,
            r.getTextRanksCount() > j ? r.getTextRanks(j) : 0));
      }
      out.add(hits);
    }
    return out;
  }

  @Override
  public void close() {
    channel.shutdown();
    try {
      channel.awaitTermination(5, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}

package io.knnd.example;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;

/**
 * knnd over HTTP/JSON (docs/api.md, "HTTP/JSON"): POST /v1/search with the
 * SearchRequest in the proto's JSON mapping, through the JDK's
 * java.net.http.HttpClient (one per process: it pools its connections
 * and keeps them alive) and Jackson. The query vectors travel as the
 * base64 of their little-endian float32 bytes (vectors_f32le); ids come
 * back as JSON strings (64-bit integers), distances as numbers read as
 * exact decimals and rounded once to float32, payloads as the stored JSON
 * objects.
 */
public final class KnndHttpClient implements KnndClient {
  private final HttpClient http;
  private final URI search;
  private final String token;
  private final long timeoutMs;
  private final ObjectMapper json =
      new ObjectMapper().enable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS);

  /**
   * @param baseUrl knnd's HTTP listener, e.g. http://127.0.0.1:8080
   * @param token the bearer token when knnd asks for one, else null
   * @param timeoutMs each call's deadline, sent as X-Knnd-Timeout-Ms too
   */
  public KnndHttpClient(String baseUrl, String token, long timeoutMs) {
    this.http = HttpClient.newBuilder().connectTimeout(Duration.ofMillis(timeoutMs)).build();
    this.search = URI.create(baseUrl.replaceAll("/+$", "") + "/v1/search");
    this.token = token;
    this.timeoutMs = timeoutMs;
  }

  @Override
  public List<List<Hit>> search(float[][] queries, int k, SearchOptions options) {
    ObjectNode body = json.createObjectNode().put("k", k);
    if (queries.length > 0) {
      int dim = queries[0].length;
      ByteBuffer block =
          ByteBuffer.allocate(queries.length * dim * 4).order(ByteOrder.LITTLE_ENDIAN);
      for (float[] query : queries) {
        if (query.length != dim) {
          throw new IllegalArgumentException("every query must have " + dim + " values");
        }
        for (float v : query) block.putFloat(v);
      }
      body.put("dim", dim).put("vectors_f32le", Base64.getEncoder().encodeToString(block.array()));
    }
    if (options.nprobe() != null)
      body.put("nprobe", options.nprobe());
    if (options.refineFactor() != null)
      body.put("refine_factor", options.refineFactor());
    if (options.payloads())
      body.putObject("payloads").put("all_fields", true);
    if (options.texts() != null && !options.texts().isEmpty()) {
      ArrayNode texts = body.putArray("texts");
      options.texts().forEach(texts::add);
      if (options.fusion() != null) {
        body.put("fusion", "weighted".equals(options.fusion()) ? "FUSION_WEIGHTED" : "FUSION_RRF");
      }
    }
    HttpRequest.Builder request = HttpRequest.newBuilder(search)
                                      .timeout(Duration.ofMillis(timeoutMs))
                                      .header("Content-Type", "application/json")
                                      .header("X-Knnd-Timeout-Ms", Long.toString(timeoutMs))
                                      .POST(HttpRequest.BodyPublishers.ofString(body.toString()));
    if (token != null)
      request.header("Authorization", "Bearer " + token);
    JsonNode answer;
    int status;
    try {
      HttpResponse<byte[]> response =
          http.send(request.build(), HttpResponse.BodyHandlers.ofByteArray());
      status = response.statusCode();
      answer = json.readTree(response.body());
    } catch (IOException e) {
      throw new KnndException("UNAVAILABLE", e.toString(), e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new KnndException("CANCELLED", "interrupted", e);
    }
    if (status != 200) {
      // {"code": "INVALID_ARGUMENT", "message": "..."}
      throw new KnndException(
          answer.path("code").asText("HTTP " + status), answer.path("message").asText(), null);
    }
    return hitsOf(answer);
  }

  /** The answer's ids, distances, payloads and ranks, per query; id -1 pads. */
  List<List<Hit>> hitsOf(JsonNode r) throws KnndException {
    List<List<Hit>> out = new ArrayList<>();
    int k = r.path("k").asInt();
    JsonNode ids = r.path("ids");
    JsonNode distances = r.path("distances");
    JsonNode payloads = r.path("payloads");
    JsonNode vectorRanks = r.path("vector_ranks");
    JsonNode textRanks = r.path("text_ranks");
    for (int q = 0; q < r.path("num_queries").asInt(); q++) {
      List<Hit> hits = new ArrayList<>();
      for (int j = q * k; j < (q + 1) * k; j++) {
        long id = Long.parseLong(ids.get(j).asText());
        if (id < 0)
          continue;
        JsonNode payload = payloads.get(j);
        hits.add(new Hit(id,
            // The decimal as sent, rounded once: it reads back to the
            // float32 knnd computed ("Infinity" strings too).
            Float.parseFloat(distances.get(j).asText()),
            payload == null || payload.isNull() ? null : payload.toString(),
            vectorRanks.has(j) ? vectorRanks.get(j).asInt() : 0,
            textRanks.has(j) ? textRanks.get(j).asInt() : 0));
      }
      out.add(hits);
    }
    return out;
  }

  @Override
  public void close() {
    // HttpClient holds no resource to release before Java 21.
  }
}

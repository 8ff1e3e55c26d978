package io.knnd.example;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Searches knnd from Java and prints one JSON line per query: its hits'
 * ids, distances (and their float32 bits, to compare exactly), payloads
 * and hybrid ranks.
 *
 * <pre>
 * java -cp "$(cat OUT/classpath)" io.knnd.example.KnndExample \
 *     (--grpc 127.0.0.1:50051 | --http http://127.0.0.1:8080)
 *     --queries q.f32 --dim 48 --k 10 [--payloads]
 *     [--texts texts.txt [--fusion rrf|weighted]] [--nprobe N]
 *     [--refine_factor N] [--token T] [--timeout_ms 10000]
 * </pre>
 *
 * --queries holds little-endian float32 rows of --dim values (numpy's
 * {@code x.astype("<f4").tofile(path)}); --texts one text query per line.
 */
public final class KnndExample {
  private KnndExample() {}

  public static void main(String[] args) throws IOException {
    Map<String, String> flags = new HashMap<>();
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (a.equals("--help")) {
        System.out.println(
            "usage: KnndExample (--grpc HOST:PORT | --http URL) (--queries FILE.f32 --dim D |"
            + " --texts FILE) [--k N] [--payloads] [--fusion rrf|weighted]"
            + " [--nprobe N] [--refine_factor N] [--token T] [--timeout_ms MS]");
        return;
      }
      if (!a.startsWith("--"))
        throw new IllegalArgumentException("unexpected argument " + a);
      if (a.equals("--payloads")) {
        flags.put("payloads", "true");
      } else if (i + 1 < args.length) {
        flags.put(a.substring(2), args[++i]);
      } else {
        throw new IllegalArgumentException(a + " needs a value");
      }
    }
    float[][] queries = new float[0][];
    if (flags.containsKey("queries")) {
      queries = readQueries(Path.of(flags.get("queries")), Integer.parseInt(flags.get("dim")));
    }
    SearchOptions options = SearchOptions.defaults().withSettings(
        intOrNull(flags.get("nprobe")), intOrNull(flags.get("refine_factor")));
    if (flags.containsKey("payloads"))
      options = options.withPayloads();
    if (flags.containsKey("texts")) {
      List<String> texts = Files.readAllLines(Path.of(flags.get("texts")), StandardCharsets.UTF_8);
      options = options.withTexts(texts, flags.get("fusion"));
    }
    int k = Integer.parseInt(flags.getOrDefault("k", "10"));
    long timeoutMs = Long.parseLong(flags.getOrDefault("timeout_ms", "10000"));
    String target = flags.get("grpc");
    String url = flags.get("http");
    if ((target == null) == (url == null)) {
      throw new IllegalArgumentException("give --grpc HOST:PORT or --http URL");
    }
    List<List<Hit>> results;
    try (KnndClient client = target != null
            ? new KnndGrpcClient(target, flags.get("token"), timeoutMs)
            : new KnndHttpClient(url, flags.get("token"), timeoutMs)) {
      results = client.search(queries, k, options);
    } catch (KnndException e) {
      System.err.println("knnd answered " + e.getMessage());
      System.exit(2);
      return;
    }
    ObjectMapper json = new ObjectMapper();
    for (List<Hit> hits : results) {
      ObjectNode line = json.createObjectNode();
      ArrayNode ids = line.putArray("ids");
      ArrayNode distances = line.putArray("distances");
      ArrayNode bits = line.putArray("distance_bits");
      ArrayNode payloads = line.putArray("payloads");
      ArrayNode vectorRanks = line.putArray("vector_ranks");
      ArrayNode textRanks = line.putArray("text_ranks");
      for (Hit h : hits) {
        ids.add(h.id());
        distances.add(h.distance());
        bits.add(Float.floatToRawIntBits(h.distance()));
        payloads.add(h.payload() == null ? null : json.readTree(h.payload()));
        vectorRanks.add(h.vectorRank());
        textRanks.add(h.textRank());
      }
      System.out.println(json.writeValueAsString(line));
    }
  }

  static Integer intOrNull(String value) {
    return value == null ? null : Integer.valueOf(value);
  }

  /** Little-endian float32 rows of {@code dim} values. */
  static float[][] readQueries(Path path, int dim) throws IOException {
    ByteBuffer bytes = ByteBuffer.wrap(Files.readAllBytes(path)).order(ByteOrder.LITTLE_ENDIAN);
    if (bytes.remaining() % (4 * dim) != 0) {
      throw new IllegalArgumentException(path + " is not whole rows of " + dim + " float32 values");
    }
    List<float[]> rows = new ArrayList<>();
    while (bytes.hasRemaining()) {
      float[] row = new float[dim];
      for (int i = 0; i < dim; i++) row[i] = bytes.getFloat();
      rows.add(row);
    }
    return rows.toArray(new float[0][]);
  }
}

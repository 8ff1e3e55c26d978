package io.knnd.example;

import java.util.List;

/** What both clients of this example offer: one search call. */
public interface KnndClient extends AutoCloseable {
  /**
   * Searches each row of {@code queries} (all of the index's dimension;
   * none for a text search alone, then {@code options.texts()} holds the
   * queries) for its {@code k} best hits, best first; a query with fewer
   * hits has a shorter list.
   */
  List<List<Hit>> search(float[][] queries, int k, SearchOptions options);

  @Override void close();
}

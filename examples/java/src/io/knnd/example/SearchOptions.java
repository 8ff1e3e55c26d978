package io.knnd.example;

import java.util.List;

/**
 * What a search asks beside its queries, as SearchRequest's fields of the
 * same names (docs/api.md): null or empty leaves knnd's default.
 *
 * @param nprobe inverted lists scanned per query
 * @param refineFactor candidates re-ranked exactly, as a multiple of k
 * @param payloads return each hit's payload (all its fields)
 * @param texts one text query per query vector (hybrid), or alone (BM25)
 * @param fusion "rrf" or "weighted" with vectors and texts
 */
public record SearchOptions(
    Integer nprobe, Integer refineFactor, boolean payloads, List<String> texts, String fusion) {
  public static SearchOptions defaults() {
    return new SearchOptions(null, null, false, List.of(), null);
  }

  public SearchOptions withPayloads() {
    return new SearchOptions(nprobe, refineFactor, true, texts, fusion);
  }

  public SearchOptions withTexts(List<String> queryTexts, String fusionMethod) {
    return new SearchOptions(nprobe, refineFactor, payloads, queryTexts, fusionMethod);
  }

  public SearchOptions withSettings(Integer probes, Integer refine) {
    return new SearchOptions(probes, refine, payloads, texts, fusion);
  }
}

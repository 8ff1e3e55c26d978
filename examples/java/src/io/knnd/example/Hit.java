package io.knnd.example;

/**
 * One result of one query: the id (the index's own id, or its row number),
 * its distance (or, for text and hybrid searches, its BM25 or fused score,
 * larger better), its payload as the JSON text knnd stores (null when the
 * request asked for none), and its rank in each retriever of a hybrid
 * search (from 1; 0: not in that retriever's window, or not hybrid).
 */
public record Hit(long id, float distance, String payload, int vectorRank, int textRank) {}

#!/usr/bin/env python3
"""Hybrid retrieval on labelled text (issue 54, item 5): dense, BM25 and
their fusion, per language, on the LibreOffice help corpus
(bench/hybrid/corpus.py) with the embeddings of bench/hybrid/embed.py.
Run by the venv's python (it sees Debian's numpy, faiss, xapian and icu):

  VENV/bin/python bench/hybrid/hybrid_bench.py --work WORK [--build build]
      [--langs en-US,zh-CN,ko] [--window 100] [--qps_queries 1000]
      [--json OUT.json]

WORK holds corpus/<lang>/ (corpus.py), embeddings/ (embed.py's cache) and
what this script builds (Xapian databases, knnd indexes). One thread
throughout (OMP_NUM_THREADS=1, bm25s n_threads=1, one knnd worker).

Per language and query, each retriever returns a window of --window chunks
(100); chunk hits map to pages in rank order, a page keeping its first rank;
the first 10 pages are scored against the query's pages: nDCG@10 (binary
gains), Recall@10 and MRR@10, averaged over queries. Retrievers:

  dense        exact inner product over the L2-normalized e5 vectors
               (faiss IndexFlatIP)
  bm25s icu    bm25s, method "lucene", k1 1.2, b 0.75, over the tokens of
               analyzers.IcuAnalyzer (knnd's specified analyzer: ICU words,
               NFKC case folding, CJK unigrams + bigrams)
  bm25s ws     the same over white-space tokens (the CJK collapse)
  xapian       python3-xapian: TermGenerator and QueryParser with
               FLAG_CJK_NGRAM, no stemmer, BM25Weight(k1 1.2, k2 0, k3 1,
               b 0.75, min_normlen 0) (k2 0: no extra length correction; k3
               1 with no repeated query terms' boost beyond Lucene's)
  rrf          reciprocal rank fusion of dense and bm25s icu, each window
               100: sum over retrievers of 1 / (60 + rank), rank 1-based
  weighted     0.5 * min-max(dense score) + 0.5 * min-max(BM25 score), each
               normalized over its own window; a chunk absent from a
               window gets 0 there. Ties in either fusion: lower row first.

The two fusions are the reference knnd's FUSION_RRF and FUSION_WEIGHTED
must reproduce from the same two windows (bench/hybrid/README.md).

Then q/s of BM25 alone, one query per call, one thread, k 10, on the
first --qps_queries queries: bm25s over pre-tokenized queries (its best
case) and Xapian including its query parsing; the median of --rounds
rounds, the two taking turns; and bm25s with every query in one call
(its batch shape, for reference).

knnd (when this tree's build has `knnctl analyze` and the hybrid Search;
until then "knnd: not available"): bm25s again over knnd's own tokens
("bm25s knnd"), the index built by `knnctl build --input VECTORS.npy
--payloads chunks.jsonl --text text --metric cosine`, served by knnd with
one worker, and searched through gRPC (vectors with every IVF list and
refine_factor 10 unless --knnd_nprobe / --knnd_refine_factor say
otherwise): text alone, vectors alone, both
with FUSION_RRF and FUSION_WEIGHTED; its BM25 top-10 sets against bm25s
knnd's (the target: equal on >= 99% of queries; ties at the 10th score
count as equal) and the largest score difference; its dense top 10
against the exact one (recall@10: knnd's index is IVF-PQ); its fusions against
the Python fusion of its own two windows; BM25 q/s against bm25s and
Xapian; a hybrid request's latency against a dense request's (one query,
k 10).
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SOURCE, "tests", "python"))
import analyzers  # noqa: E402
import embed  # noqa: E402

K = 10
RRF_K = 60
WEIGHTS = (0.5, 0.5)  # (vector, text)
BM25_K1, BM25_B = 1.2, 0.75


# ---------------------------------------------------------------- metrics

def pages_of(rows, chunk_page, k=K):
    """Chunk rows in rank order -> the first k distinct pages."""
    out, seen = [], set()
    for r in rows:
        if r < 0:
            continue
        p = chunk_page[r]
        if p not in seen:
            seen.add(p)
            out.append(p)
            if len(out) == k:
                break
    return out


def page_metrics(ranked_rows, queries, chunk_page):
    """Mean nDCG@10, Recall@10 and MRR@10 over the queries."""
    ndcg = recall = mrr = 0.0
    for rows, q in zip(ranked_rows, queries):
        relevant = set(q["pages"])
        got = pages_of(rows, chunk_page)
        gains = [1.0 if p in relevant else 0.0 for p in got]
        dcg = sum(g / np.log2(i + 2) for i, g in enumerate(gains))
        ideal = sum(1.0 / np.log2(i + 2) for i in range(min(len(relevant), K)))
        ndcg += dcg / ideal
        recall += sum(gains) / len(relevant)
        mrr += next((1.0 / (i + 1) for i, g in enumerate(gains) if g), 0.0)
    n = len(queries)
    return {"ndcg@10": ndcg / n, "recall@10": recall / n, "mrr@10": mrr / n}


# ---------------------------------------------------------------- fusion

def rrf(windows, k=RRF_K):
    """Rows by sum of 1 / (k + rank) over the windows (lists of rows)."""
    score = {}
    for rows in windows:
        for rank, r in enumerate(rows, 1):
            if r >= 0:
                score[r] = score.get(r, 0.0) + 1.0 / (k + rank)
    return sorted(score, key=lambda r: (-score[r], r))


def minmax(rows, scores):
    valid = [(r, s) for r, s in zip(rows, scores) if r >= 0]
    if not valid:
        return {}
    lo = min(s for _, s in valid)
    hi = max(s for _, s in valid)
    span = hi - lo
    return {r: (s - lo) / span if span > 0 else 1.0 for r, s in valid}


def weighted(windows, weights=WEIGHTS):
    """Rows by sum of weight * min-max normalized score; windows are
    (rows, scores) pairs, higher scores better."""
    score = {}
    for (rows, scores), w in zip(windows, weights):
        for r, s in minmax(rows, scores).items():
            score[r] = score.get(r, 0.0) + w * s
    return sorted(score, key=lambda r: (-score[r], r))


# ---------------------------------------------------------------- retrievers

class Bm25s:
    """bm25s over given token lists (lucene, k1 1.2, b 0.75)."""

    def __init__(self, doc_tokens):
        import bm25s
        self.model = bm25s.BM25(method="lucene", k1=BM25_K1, b=BM25_B)
        self.model.index(doc_tokens, show_progress=False)

    def search(self, query_tokens, k):
        """(rows, scores) arrays of shape (nq, k); rows -1 past the hits."""
        rows, scores = self.model.retrieve(query_tokens, k=k, n_threads=1,
                                           show_progress=False)
        rows = np.asarray(rows)
        scores = np.asarray(scores, dtype=np.float32)
        rows[scores <= 0] = -1  # no query term in the chunk
        return rows, scores

    def one(self, tokens, k):
        return self.model.retrieve([tokens], k=k, n_threads=1, show_progress=False)


class Xapian:
    FLAGS_NAME = "FLAG_CJK_NGRAM"

    def __init__(self, path, texts):
        import xapian
        self.xapian = xapian
        stamp = os.path.join(path, ".complete")
        if not os.path.exists(stamp):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            db = xapian.WritableDatabase(path, xapian.DB_CREATE_OR_OVERWRITE)
            tg = xapian.TermGenerator()
            tg.set_flags(xapian.TermGenerator.FLAG_CJK_NGRAM)
            for text in texts:
                doc = xapian.Document()
                tg.set_document(doc)
                tg.index_text_without_positions(text)
                db.add_document(doc)  # docid = row + 1
            db.commit()
            db.close()
            open(stamp, "w").close()
        self.db = xapian.Database(path)
        self.parse_fallbacks = 0
        self.qp = xapian.QueryParser()
        self.qp.set_database(self.db)
        self.qp.set_default_op(xapian.Query.OP_OR)
        self.enquire = xapian.Enquire(self.db)
        self.enquire.set_weighting_scheme(
            xapian.BM25Weight(BM25_K1, 0.0, 1.0, BM25_B, 0.0))

    def parse(self, text):
        # No boolean, phrase or +/- operators: entries like "Insert - Sheet"
        # are plain words, as they are to bm25s.
        xapian = self.xapian
        flags = xapian.QueryParser.FLAG_CJK_NGRAM
        try:
            return self.qp.parse_query(text, flags)
        except xapian.QueryParserError:
            # Xapian 1.4.22 fails to parse a Latin word between CJK words
            # ("从 Calc 复制"), the CJK query-parser bug fixed after 1.4.22;
            # its pieces parsed one by one and OR-ed are the same query.
            self.parse_fallbacks += 1
            return xapian.Query(xapian.Query.OP_OR,
                                [self.qp.parse_query(p, flags) for p in text.split()])

    def one(self, text, k):
        query = self.parse(text)
        self.enquire.set_query(query)
        mset = self.enquire.get_mset(0, k)
        return [m.docid - 1 for m in mset], [m.weight for m in mset]

    def search(self, texts, k):
        rows = np.full((len(texts), k), -1, np.int64)
        scores = np.zeros((len(texts), k), np.float32)
        for i, t in enumerate(texts):
            r, s = self.one(t, k)
            rows[i, :len(r)] = r
            scores[i, :len(s)] = s
        return rows, scores


def dense_search(passages, queries, k):
    import faiss
    faiss.omp_set_num_threads(1)
    index = faiss.IndexFlatIP(passages.shape[1])
    index.add(passages)
    scores, rows = index.search(queries, k)
    return rows, scores


def qps(fn, items):
    t = time.perf_counter()
    for x in items:
        fn(x)
    return len(items) / (time.perf_counter() - t)


def interleaved_qps(engines, rounds):
    """Median q/s of each engine over `rounds` rounds, the engines taking
    turns within a round, so that other load on the machine slows each
    alike. engines: name -> (one-query function, queries)."""
    got = {name: [] for name in engines}
    for _ in range(rounds):
        for name, (fn, items) in engines.items():
            got[name].append(qps(fn, items))
    return {name: float(np.median(v)) for name, v in got.items()}


def top_sets_equal(rows_a, scores_a, rows_b, scores_b, k=K, rel=1e-4):
    """Share of queries whose top-k row sets are equal, where rows that
    differ only at a score tied with the k-th (relative `rel`) count as
    equal; and the largest relative score difference over rows in both."""
    equal, worst = 0, 0.0
    for ra, sa, rb, sb in zip(rows_a, scores_a, rows_b, scores_b):
        a = {r: s for r, s in zip(ra[:k], sa[:k]) if r >= 0}
        b = {r: s for r, s in zip(rb[:k], sb[:k]) if r >= 0}
        for r in a.keys() & b.keys():
            worst = max(worst, abs(a[r] - b[r]) / max(abs(b[r]), 1e-9))
        if a.keys() == b.keys():
            equal += 1
            continue
        kth = min(b.values()) if b else 0.0
        diff = a.keys() ^ b.keys()
        score = {**b, **a}
        if len(a) == len(b) and all(abs(score[r] - kth) <= rel * max(abs(kth), 1e-9)
                                    for r in diff):
            equal += 1
    return equal / max(len(rows_a), 1), worst


# ---------------------------------------------------------------- knnd

def knnd_status(build):
    """None when knnd's hybrid path is there, else why not."""
    knnctl = os.path.join(build, "knnctl")
    knnd = os.path.join(build, "knnd")
    if not (os.path.exists(knnctl) and os.path.exists(knnd)):
        return f"no {knnctl} / {knnd}"
    if not analyzers.KnndAnalyzer.available(knnctl):
        return "knnctl analyze missing"
    proto = open(os.path.join(SOURCE, "proto/knnd/v1/knn_service.proto")).read()
    for field in ("texts", "fusion", "text_ranks"):
        if f" {field} = " not in proto:
            return f"SearchRequest/SearchResponse without `{field}`"
    return None


class Knnd:
    """knnd serving one language's index with a text field, and the
    requests the bench sends it. Owns the daemon; stop() ends it."""

    def __init__(self, build, work, vectors, chunks_path, stubs_dir, nprobe,
                 refine_factor):
        from knnd_harness import Daemon, generate_stubs
        if not os.path.exists(os.path.join(stubs_dir, "knnd")):
            generate_stubs(SOURCE, stubs_dir)
        else:
            sys.path.insert(0, stubs_dir)
        from knnd.v1 import knn_service_pb2 as pb
        self.pb = pb
        knnctl = os.path.join(build, "knnctl")
        index = os.path.join(work, "knnd.index")
        vecs = os.path.join(work, "vectors.npy")
        if not os.path.exists(index + ".built"):
            np.save(vecs, vectors)
            subprocess.run([knnctl, "build", "--input", vecs, "--output", index,
                            "--payloads", chunks_path, "--text", "text",
                            "--metric", "cosine"],
                           check=True, stdout=subprocess.DEVNULL)
            open(index + ".built", "w").close()
        config = os.path.join(work, "knnd.textproto")
        with open(config, "w") as f:
            f.write(f'index_path: "{index}"\n'
                    "num_workers: 1\nomp_threads_per_worker: 1\n"
                    "warmup_queries: 0\nslow_request_ms: 0\n")
        self.index = index
        self.daemon = Daemon(os.path.join(build, "knnd"), ["--config", config],
                             log_path=os.path.join(work, "knnd.log"),
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
        if not self.daemon.wait_serving(240):
            raise RuntimeError(f"knnd did not start: {self.daemon.read_log()}")
        self.stub = self.daemon.stub()
        # Every list, and exact re-ranking, unless told otherwise: the
        # fusion is compared with the exact dense search's, so knnd's
        # vector retriever should be as close to it as the index allows.
        with open(index + ".meta.json") as f:
            factory = json.load(f)["factory"]
        nlist = int(factory.split(",")[0][3:]) if factory.startswith("IVF") else 1
        self.nprobe = nprobe or nlist
        self.refine_factor = refine_factor

    def request(self, k, vector=None, text=None, fusion=None, window=None):
        pb = self.pb
        req = pb.SearchRequest(k=k)
        if vector is not None:
            req.vectors_f32le = np.ascontiguousarray(vector, "<f4").tobytes()
            req.nprobe = self.nprobe
            req.refine_factor = self.refine_factor
        if text is not None:
            req.texts.append(text)
        if fusion == "weighted":
            req.fusion = pb.FUSION_WEIGHTED
            req.vector_weight, req.text_weight = WEIGHTS
        elif fusion == "rrf":
            req.fusion = pb.FUSION_RRF
            req.rrf_k = RRF_K
        if window and vector is not None and text is not None:
            req.vector_window = window
            req.text_window = window
        return req

    def search(self, **kw):
        r = self.stub.Search(self.request(**kw), timeout=60)
        ids = (np.frombuffer(r.ids_i64le, "<i8") if r.ids_i64le
               else np.asarray(r.ids, np.int64))
        scores = (np.frombuffer(r.distances_f32le, "<f4") if r.distances_f32le
                  else np.asarray(r.distances, np.float32))
        return {"ids": ids, "scores": scores,
                "vector_ranks": list(r.vector_ranks),
                "vector_scores": list(r.vector_scores),
                "text_ranks": list(r.text_ranks),
                "text_scores": list(r.text_scores)}

    def stop(self):
        self.daemon.stop(60)


def paired_latency_us(fn_a, fn_b, items):
    """Each item timed with fn_a and fn_b, in alternating order; the mean,
    median and p99 of each, in microseconds."""
    times = ([], [])
    for n, x in enumerate(items):
        order = ((0, fn_a), (1, fn_b)) if n % 2 == 0 else ((1, fn_b), (0, fn_a))
        for which, fn in order:
            t = time.perf_counter()
            fn(x)
            times[which].append(time.perf_counter() - t)
    out = []
    for t in times:
        t = np.asarray(t) * 1e6
        out.append({"mean_us": float(t.mean()), "p50_us": float(np.median(t)),
                    "p99_us": float(np.percentile(t, 99))})
    return out


def run_knnd(args, work, chunks_path, passages, qvecs, queries, chunk_page,
             ref, qps_engines, stubs_dir):
    """knnd's figures for one language (see the module's doc); its BM25
    q/s taken in turns with qps_engines' (returned as "qps")."""
    n = len(queries)
    out = {}
    knnd = Knnd(args.build, work, passages, chunks_path, stubs_dir,
                args.knnd_nprobe, args.knnd_refine_factor)
    try:
        w = args.window
        text = [knnd.search(k=w, text=q["query"]) for q in queries]
        dense = [knnd.search(k=w, vector=qvecs[i]) for i in range(n)]
        fused = {f: [knnd.search(k=w, vector=qvecs[i], text=queries[i]["query"],
                                 fusion=f, window=w) for i in range(n)]
                 for f in ("rrf", "weighted")}
        t_rows = [r["ids"] for r in text]
        t_scores = [r["scores"] for r in text]
        for name, res in (("knnd bm25", text), ("knnd dense", dense),
                          ("knnd rrf", fused["rrf"]),
                          ("knnd weighted", fused["weighted"])):
            out[name] = page_metrics([r["ids"] for r in res], queries, chunk_page)
        exact = ref["dense"][0]
        out["dense_recall@10_vs_exact"] = float(np.mean(
            [len(set(dense[i]["ids"][:K]) & set(exact[i][:K])) / K for i in range(n)]))
        eq, worst = top_sets_equal(t_rows, t_scores, *ref["bm25s knnd"])
        out["bm25_top10_equal_to_bm25s"] = eq
        out["bm25_max_rel_score_diff"] = worst
        # Its fusions against the Python fusion of its own two windows.
        for f, fuse in (("rrf", lambda i: rrf([dense[i]["ids"], t_rows[i]])),
                        ("weighted", lambda i: weighted(
                            [(dense[i]["ids"], dense[i]["scores"]),
                             (t_rows[i], t_scores[i])]))):
            same = sum(list(fused[f][i]["ids"][:K]) == fuse(i)[:K] for i in range(n))
            out[f"{f}_top10_equal_to_reference"] = same / n
        qn = min(args.qps_queries, n)
        out["qps"] = interleaved_qps(dict(qps_engines, knnd=(
            lambda q: knnd.search(k=K, text=q["query"]), queries[:qn])), args.rounds)
        # A hybrid request against the dense request it adds BM25 and the
        # fusion to: the same k and windows of k (the defaults), and with
        # windows of --window against a dense request of k = --window.
        dense_us, rrf_us = paired_latency_us(
            lambda i: knnd.search(k=K, vector=qvecs[i]),
            lambda i: knnd.search(k=K, vector=qvecs[i], text=queries[i]["query"],
                                  fusion="rrf"), range(qn))
        out["dense_latency"], out["rrf_latency"] = dense_us, rrf_us
        out["hybrid_over_dense_latency"] = rrf_us["mean_us"] / dense_us["mean_us"]
        wide_dense_us, wide_rrf_us = paired_latency_us(
            lambda i: knnd.search(k=w, vector=qvecs[i]),
            lambda i: knnd.search(k=K, vector=qvecs[i], text=queries[i]["query"],
                                  fusion="rrf", window=w), range(qn))
        out["dense_window_latency"] = wide_dense_us
        out["rrf_window_latency"] = wide_rrf_us
        out["hybrid_over_dense_window_latency"] = (
            wide_rrf_us["mean_us"] / wide_dense_us["mean_us"])
        # knnd's BM25 in process, one thread (bench/text_bench.cc), as the
        # peers run: analysis and search of each query, no RPC.
        text_bench = os.path.join(args.build, "bench", "text_bench")
        if os.path.exists(text_bench):
            qfile = os.path.join(work, "queries.txt")
            with open(qfile, "w", encoding="utf-8") as f:
                for q in queries[:qn]:
                    f.write(q["query"].replace("\n", " ") + "\n")
            run = subprocess.run(
                [text_bench, "--index", knnd.index, "--queries", qfile,
                 "--rounds", str(args.rounds)], capture_output=True, text=True,
                env=dict(os.environ, OMP_NUM_THREADS="1"), check=True)
            out["in_process_qps"] = json.loads(run.stdout)["qps_median"]
    finally:
        knnd.stop()
    return out


# ---------------------------------------------------------------- driver

def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def cached_embeddings(corpus_dir, cache):
    """(passages, queries) from embed.py's cache, or None."""
    try:
        model = embed.model_identity()
    except ImportError:
        return None
    d = os.path.join(cache, embed.cache_key(corpus_dir, model))
    files = [os.path.join(d, n) for n in ("passages.npy", "queries.npy")]
    if not all(os.path.exists(f) for f in files):
        return None
    return tuple(np.load(f) for f in files)


def run_language(args, lang, knnd_why, stubs_dir):
    corpus_dir = os.path.join(args.work, "corpus", lang)
    chunks_path = os.path.join(corpus_dir, "chunks.jsonl")
    chunks = load_jsonl(chunks_path)
    queries = load_jsonl(os.path.join(corpus_dir, "queries.jsonl"))
    chunk_page = [c["page"] for c in chunks]
    texts = [c["text"] for c in chunks]
    qtexts = [q["query"] for q in queries]
    w = args.window
    res = {"chunks": len(chunks), "queries": len(queries), "metrics": {},
           "qps": {}, "notes": []}
    windows = {}  # retriever -> (rows, scores), each (nq, window)

    analyzer_list = [analyzers.IcuAnalyzer(), analyzers.WhitespaceAnalyzer()]
    if knnd_why is None:
        analyzer_list.append(analyzers.KnndAnalyzer(os.path.join(args.build, "knnctl")))
    tokens = {}
    for a in analyzer_list:
        t = time.time()
        tokens[a.name] = (a(texts), a(qtexts))
        print(f"[{lang}] {a.name} tokens in {time.time() - t:.1f} s",
              file=sys.stderr, flush=True)
        engine = Bm25s(tokens[a.name][0])
        windows[f"bm25s {a.name}"] = engine.search(tokens[a.name][1], w)
        if a.name == "icu":
            bm25s_icu = engine
    # Keyed by the chunks file, so a changed corpus is indexed anew.
    chunks_key = embed.file_hash(chunks_path).hexdigest()[:16]
    xap = Xapian(os.path.join(args.work, "xapian", f"{lang}-{chunks_key}"), texts)
    windows["xapian"] = xap.search(qtexts, w)
    res["xapian_parse_fallbacks"] = xap.parse_fallbacks

    emb = cached_embeddings(corpus_dir, os.path.join(args.work, "embeddings"))
    if emb is None:
        res["notes"].append("dense: embeddings not cached (run embed.py)")
    else:
        passages, qvecs = emb
        windows["dense"] = dense_search(passages, qvecs, w)
        text_key = "bm25s knnd" if "bm25s knnd" in windows else "bm25s icu"
        d, t = windows["dense"], windows[text_key]
        windows["rrf"] = ([rrf([d[0][i], t[0][i]])[:w]
                           for i in range(len(queries))], None)
        windows["weighted"] = ([weighted([(d[0][i], d[1][i]), (t[0][i], t[1][i])])[:w]
                                for i in range(len(queries))], None)
        res["fusion_text_retriever"] = text_key

    for name, (rows, _) in windows.items():
        res["metrics"][name] = page_metrics(rows, queries, chunk_page)

    eq, worst = top_sets_equal(*windows["xapian"], *windows["bm25s icu"])
    res["xapian_top10_equal_to_bm25s_icu"] = eq

    qn = min(args.qps_queries, len(queries))
    engines = {
        "bm25s (pre-tokenized)": (lambda t: bm25s_icu.one(t, K), tokens["icu"][1][:qn]),
        "xapian": (lambda q: xap.one(q, K), qtexts[:qn])}
    # bm25s's own best shape: every query in one call (still one thread).
    t = time.perf_counter()
    bm25s_icu.model.retrieve(tokens["icu"][1][:qn], k=K, n_threads=1, show_progress=False)
    batch_qps = qn / (time.perf_counter() - t)
    if knnd_why is None and emb is not None:
        work = os.path.join(args.work, "knnd", f"{lang}-{chunks_key}")
        os.makedirs(work, exist_ok=True)
        res["knnd"] = run_knnd(args, work, chunks_path, passages, qvecs, queries,
                               chunk_page, windows, engines, stubs_dir)
        res["qps"] = res["knnd"].pop("qps")
    else:
        res["qps"] = interleaved_qps(engines, args.rounds)
        res["knnd"] = f"not available ({knnd_why or 'no embeddings'})"
    res["qps"]["bm25s (pre-tokenized, one call for all)"] = batch_qps
    return res


def machine():
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in cpu.splitlines()
                  if l.startswith("Model name")), platform.processor())
    flags = open("/proc/cpuinfo").read()
    simd = next((s for s in ("avx512f", "avx2", "sse4_2") if f" {s}" in flags), "?")
    return {"cpu": model, "simd": simd, "cores": os.cpu_count()}


def print_table(results):
    names = ["dense", "bm25s icu", "bm25s knnd", "bm25s whitespace", "xapian",
             "rrf", "weighted", "knnd dense", "knnd bm25", "knnd rrf",
             "knnd weighted"]
    langs = list(results)
    print("| retriever | " + " | ".join(
        f"{l} nDCG@10 | {l} R@10 | {l} MRR@10" for l in langs) + " |")
    print("|---|" + "---|" * (3 * len(langs)))
    for n in names:
        cells = []
        for l in langs:
            m = results[l]["metrics"].get(n)
            if m is None and isinstance(results[l].get("knnd"), dict):
                m = results[l]["knnd"].get(n)
            cells += ([f"{m['ndcg@10']:.3f}", f"{m['recall@10']:.3f}",
                       f"{m['mrr@10']:.3f}"] if m else ["-"] * 3)
        if any(c != "-" for c in cells):
            print(f"| {n} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"))
    ap.add_argument("--langs", default="en-US,zh-CN,ko")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--qps_queries", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5,
                    help="q/s rounds (median reported)")
    ap.add_argument("--knnd_nprobe", type=int, default=0,
                    help="knnd's nprobe for vectors; 0: every list")
    ap.add_argument("--knnd_refine_factor", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    knnd_why = knnd_status(args.build)
    print(f"knnd: {'available' if knnd_why is None else 'not available (' + knnd_why + ')'}",
          file=sys.stderr)
    results = {}
    with tempfile.TemporaryDirectory() as stubs_dir:
        for lang in args.langs.split(","):
            results[lang] = run_language(args, lang, knnd_why, stubs_dir)
    summary = {"date": datetime.date.today().isoformat(), "machine": machine(),
               "window": args.window, "rrf_k": RRF_K, "weights": WEIGHTS,
               "results": results}
    print_table(results)
    for lang, r in results.items():
        print(f"{lang}: chunks {r['chunks']}, queries {r['queries']}, "
              f"q/s {json.dumps({k: round(v) for k, v in r['qps'].items()})}, "
              f"xapian top-10 = bm25s icu on {r['xapian_top10_equal_to_bm25s_icu']:.3f}, "
              f"knnd: {r['knnd'] if isinstance(r['knnd'], str) else json.dumps(r['knnd'], default=float)}"
              + (f", notes: {r['notes']}" if r["notes"] else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=float)


if __name__ == "__main__":
    main()

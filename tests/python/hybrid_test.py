"""Hybrid retrieval end to end, as a service uses it: `knnctl build --text
text --payloads --attributes --ids` over a seeded corpus in English,
Chinese and Korean, knnd serving it, searched through the generated gRPC
stubs:
  - texts alone: BM25's answer, scores equal to Lucene's BM25 computed here
    from `knnctl analyze`'s terms (the formula, not knnd's code);
  - the same build in 2 shards: each shard's scores are the whole corpus's
    (its statistics), so the shards' answers merged by score are the whole
    index's;
  - texts with vectors, fused by RRF, computed here from each retriever's
    own answer; a filter applied to both (every result admitted, and the
    text ranks those of the admitted rows);
  - knnctl update: the new version's text index holds the added rows'
    words and none of the deleted rows'; with --text_file, the added and
    upserted rows' texts from a text file, and not the upserted row's old
    one;
  - knnd's front of shards fuses the shards' windows into the whole
    index's answer; the per-retriever time is in the metrics, GetIndexInfo
    describes the text index.

Run by ctest (python_hybrid); by hand:
  /usr/bin/python3 tests/python/hybrid_test.py --knnd build/knnd \\
      --knnctl build/knnctl --source-dir .
"""
import json
import math
import os
import subprocess
import tempfile
import unittest

import grpc
import numpy as np

from knnd_harness import Daemon, generate_stubs, stop_all, unittest_main

ARGS = None
ROWS = 2400
DIM = 16
K = 10

EN = ["printer", "network", "server", "spreadsheet", "chart", "macro",
      "font", "table", "formula", "document", "slide", "export"]
ZH = ["打印机", "网络", "服务器", "电子表格", "图表", "宏", "字体", "表格"]
KO = ["프린터", "네트워크", "서버", "스프레드시트", "차트", "매크로", "글꼴"]


def corpus():
    rng = np.random.default_rng(7)
    rows = []
    for r in range(ROWS):
        lang = ("en", "zh", "ko")[r % 3]
        words = {"en": EN, "zh": ZH, "ko": KO}[lang]
        n = int(rng.integers(3, 12))
        # Skewed draws: early words are common, late ones rare.
        picks = [words[min(int(rng.integers(0, len(words))),
                           int(rng.integers(0, len(words))))] for _ in range(n)]
        sep = "" if lang == "zh" else " "
        rows.append({"text": sep.join(picks), "lang": lang, "n": r})
    return rows


def bm25(doc_terms, query_terms, k1=1.2, b=0.75):
    """Lucene's BM25 of every document for the query's terms (each
    occurrence counted), from the documents' terms."""
    n = len(doc_terms)
    avg = sum(len(d) for d in doc_terms) / n
    df = {}
    for d in doc_terms:
        for t in set(d):
            df[t] = df.get(t, 0) + 1
    scores = np.zeros(n)
    for t in query_terms:
        if t not in df:
            continue
        idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
        for i, d in enumerate(doc_terms):
            tf = d.count(t)
            if tf:
                scores[i] += idf * tf / (tf + k1 * (1 - b + b * len(d) / avg))
    return scores


class HybridTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.source_dir, os.path.join(cls.tmp.name, "stubs"))
        from knnd.v1 import knn_service_pb2
        cls.pb = knn_service_pb2
        cls.rows = corpus()
        rng = np.random.default_rng(8)
        cls.xb = rng.standard_normal((ROWS, DIM)).astype("float32")
        cls.ids = np.arange(ROWS, dtype=np.int64) * 5 + 11
        files = {name: os.path.join(cls.tmp.name, name) for name in
                 ("x.npy", "ids.npy", "p.jsonl", "a.jsonl")}
        np.save(files["x.npy"], cls.xb)
        np.save(files["ids.npy"], cls.ids)
        with open(files["p.jsonl"], "w", encoding="utf-8") as out:
            for row in cls.rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        with open(files["a.jsonl"], "w") as out:
            for row in cls.rows:
                out.write(json.dumps({"lang": row["lang"]}) + "\n")
        cls.files = files

        def build(name, *extra):
            path = os.path.join(cls.tmp.name, name)
            subprocess.run(
                [ARGS.knnctl, "build", "--input", files["x.npy"], "--output",
                 path, "--nlist", "16", "--ids", files["ids.npy"],
                 "--payloads", files["p.jsonl"], "--attributes",
                 files["a.jsonl"], "--text", "text", *extra],
                check=True, capture_output=True)
            return path
        cls.whole = build("whole.index")
        split = build("split.index", "--shards", "2")
        cls.daemons = {}
        for name, args in [("whole", ["--index", cls.whole]),
                           ("shard0", ["--index", split + ".shard-0-of-2"]),
                           ("shard1", ["--index", split + ".shard-1-of-2"])]:
            cls.start(name, args)
        cls.start("front", ["--shard_targets",
                            cls.daemons["shard0"].address + "," +
                            cls.daemons["shard1"].address])
        # Every row's terms, as knnd's analyzer makes them.
        cls.doc_terms = cls.analyze([row["text"] for row in cls.rows])

    @classmethod
    def start(cls, name, args):
        daemon = Daemon(ARGS.knnd, args,
                        log_path=os.path.join(cls.tmp.name, name + ".log"),
                        knnctl=ARGS.knnctl)
        cls.daemons[name] = daemon
        if not daemon.wait_serving(60):
            cls.tearDownClass()
            raise RuntimeError(f"knnd ({name}) did not start: "
                               + daemon.read_log())

    @classmethod
    def tearDownClass(cls):
        stop_all(cls.daemons.values(), 30)
        cls.tmp.cleanup()

    @classmethod
    def analyze(cls, texts):
        out = subprocess.run([ARGS.knnctl, "analyze"], input="\n".join(texts),
                             capture_output=True, text=True, check=True).stdout
        return [json.loads(line) for line in out.splitlines()]

    def search(self, name, **fields):
        return self.daemons[name].stub().Search(
            self.pb.SearchRequest(**fields), timeout=30)

    def update(self, name, base=None, **files):
        """knnctl update of `base` (default: the whole index) into
        TMP/NAME.index, each flag of `files` naming a file in TMP; serves
        it as daemon NAME."""
        output = os.path.join(self.tmp.name, name + ".index")
        command = [ARGS.knnctl, "update", "--base", base or self.whole,
                   "--output", output, "--recall_queries", "0"]
        for flag, file in files.items():
            command += ["--" + flag, os.path.join(self.tmp.name, file)]
        done = subprocess.run(command, capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.start(name, ["--index", output])

    QUERIES = ["printer network", "服务器 字体", "서버 차트", "macro",
               "电子表格图表", "프린터", "formula table export"]

    def test_texts_alone_score_as_lucene_bm25(self):
        r = self.search("whole", texts=self.QUERIES, k=K)
        self.assertEqual(r.fusion, self.pb.FUSION_UNSPECIFIED)
        for q, terms in enumerate(self.analyze(self.QUERIES)):
            want = bm25(self.doc_terms, terms)
            ids = list(r.ids[q * K:(q + 1) * K])
            scores = list(r.distances[q * K:(q + 1) * K])
            self.assertEqual(list(r.text_ranks[q * K:(q + 1) * K]),
                             list(range(1, K + 1)))
            for i, s in zip(ids, scores):
                row = (i - 11) // 5
                self.assertAlmostEqual(s, want[row], places=4)
            # The K-th score bounds every row left out.
            left_out = np.delete(want, [(i - 11) // 5 for i in ids])
            self.assertLessEqual(left_out.max(), scores[-1] + 1e-5)

    def test_shards_score_with_the_whole_corpus_statistics(self):
        whole = self.search("whole", texts=self.QUERIES, k=K)
        parts = [self.search(s, texts=self.QUERIES, k=K)
                 for s in ("shard0", "shard1")]
        for q in range(len(self.QUERIES)):
            merged = sorted(
                ((-p.distances[j], p.ids[j]) for p in parts
                 for j in range(q * K, (q + 1) * K) if p.ids[j] >= 0))[:K]
            self.assertEqual([i for _, i in merged],
                             list(whole.ids[q * K:(q + 1) * K]))
            np.testing.assert_array_equal(
                [-d for d, _ in merged], whole.distances[q * K:(q + 1) * K])

    def test_vectors_and_texts_fuse_by_rrf(self):
        xq = self.xb[:len(self.QUERIES)] + 0.01
        window = 30
        r = self.search("whole", vectors_f32le=xq.tobytes(),
                        texts=self.QUERIES, k=K, vector_window=window,
                        text_window=window, refine_factor=4)
        self.assertEqual(r.fusion, self.pb.FUSION_RRF)
        dense = self.search("whole", vectors_f32le=xq.tobytes(), k=window,
                            refine_factor=4)
        text = self.search("whole", texts=self.QUERIES, k=window)
        for q in range(len(self.QUERIES)):
            fused = {}
            for answer in (dense, text):
                for rank, i in enumerate(answer.ids[q * window:(q + 1) * window]):
                    if i >= 0:
                        fused[i] = fused.get(i, 0) + 1 / (60 + rank + 1)
            want = sorted(fused.items(), key=lambda e: (-e[1], e[0]))[:K]
            self.assertEqual(list(r.ids[q * K:(q + 1) * K]), [i for i, _ in want])
            np.testing.assert_allclose(r.distances[q * K:(q + 1) * K],
                                       [s for _, s in want], rtol=1e-6)
        # Each hit's rank in each retriever is reported: the query vectors
        # are rows' own plus noise, so each query's row is the vector
        # retriever's first.
        for q in range(len(self.QUERIES)):
            j = list(r.ids[q * K:(q + 1) * K]).index(int(self.ids[q]))
            self.assertEqual(r.vector_ranks[q * K + j], 1)

    def test_a_filter_applies_to_both_retrievers(self):
        xq = self.xb[:3] + 0.01
        texts = self.QUERIES[:3]
        f = self.pb.Filter(condition=self.pb.Condition(
            field="lang", eq=self.pb.AttributeValue(keyword="zh")))
        r = self.search("whole", vectors_f32le=xq.tobytes(), texts=texts, k=K,
                        filter=f, text_window=20, vector_window=20,
                        payloads=self.pb.PayloadRequest(fields=["lang"]))
        for p, i in zip(r.payloads, r.ids):
            if i >= 0:
                self.assertEqual(json.loads(p), {"lang": "zh"})
        zh = np.array([row["lang"] == "zh" for row in self.rows])
        for q, terms in enumerate(self.analyze(texts)):
            want = bm25(self.doc_terms, terms) * zh
            order = [int(x) for x in np.argsort(-want, kind="stable")[:20]
                     if want[x] > 0]
            for j in range(q * K, (q + 1) * K):
                if r.text_ranks[j] > 0:
                    row = (r.ids[j] - 11) // 5
                    self.assertAlmostEqual(r.text_scores[j], want[row], places=4)
                    self.assertIn(row, order)

    def test_eval_scores_what_knnd_answers(self):
        """knnctl eval --labels: its nDCG@10, Recall@10 and MRR@10 of BM25,
        dense and both fusions are those computed here from knnd's own
        answers to the same requests, answers mapped to the payload field
        "n" (and, for BM25, to answer ids)."""
        tmp = self.tmp.name
        n = len(self.QUERIES)
        xq = self.xb[:n] + 0.01
        window, probes, refine = 30, 16, 4
        # Relevant: the query's own row and the rows BM25 ranks 3rd to 5th
        # here, so that each retriever finds some and misses some.
        labels = []
        for q, terms in enumerate(self.analyze(self.QUERIES)):
            order = np.argsort(-bm25(self.doc_terms, terms), kind="stable")
            labels.append([q] + [int(r) for r in order[2:5]])
        texts_path = os.path.join(tmp, "eval_texts.txt")
        with open(texts_path, "w", encoding="utf-8") as out:
            out.write("\n".join(self.QUERIES) + "\n")
        np.save(os.path.join(tmp, "eval_q.npy"), xq)

        def evaluate(label_lines, *extra):
            path = os.path.join(tmp, "eval_labels.jsonl")
            with open(path, "w") as out:
                out.write("".join(json.dumps(l) + "\n" for l in label_lines))
            out = subprocess.run(
                [ARGS.knnctl, "eval", "--index", self.whole, "--texts",
                 texts_path, "--labels", path, "--window", str(window),
                 "--nprobes", str(probes), "--refine_factors", str(refine),
                 *extra], check=True, capture_output=True, text=True).stdout
            rows = {}
            for line in out.splitlines():
                parts = line.rsplit(None, 4)
                if len(parts) == 5 and parts[0] in (
                        "bm25", "dense", "rrf k=60", "weighted 0.5/0.5"):
                    rows[parts[0]] = [float(x) for x in parts[1:4]]
            return rows

        def score(answer, label_of, relevant):
            ndcg = recall = mrr = 0.0
            for q in range(n):
                got = []
                for i in answer.ids[q * window:(q + 1) * window]:
                    label = label_of(i) if i >= 0 else None
                    if label is not None and label not in got:
                        got.append(label)
                got = got[:K]
                rel = set(relevant[q])
                gains = [1.0 if x in rel else 0.0 for x in got]
                ndcg += sum(g / math.log2(i + 2) for i, g in enumerate(gains)) / \
                    sum(1 / math.log2(i + 2) for i in range(min(len(rel), K)))
                recall += sum(gains) / len(rel)
                mrr += next((1 / (i + 1) for i, g in enumerate(gains) if g), 0)
            return [ndcg / n, recall / n, mrr / n]

        row_n = lambda i: self.rows[(i - 11) // 5]["n"]
        got = evaluate(labels, "--queries", os.path.join(tmp, "eval_q.npy"),
                       "--label_field", "n")
        common = dict(k=window, nprobe=probes, refine_factor=refine)
        answers = {
            "bm25": self.search("whole", texts=self.QUERIES, **common),
            "dense": self.search("whole", vectors_f32le=xq.tobytes(),
                                 **common),
        }
        for name, fusion in (("rrf k=60", self.pb.FUSION_RRF),
                             ("weighted 0.5/0.5", self.pb.FUSION_WEIGHTED)):
            answers[name] = self.search(
                "whole", vectors_f32le=xq.tobytes(), texts=self.QUERIES,
                fusion=fusion, vector_window=window, text_window=window,
                **common)
        self.assertEqual(sorted(got), sorted(answers))
        for name, answer in answers.items():
            np.testing.assert_allclose(got[name], score(answer, row_n, labels),
                                       atol=6e-5, err_msg=name)
        # The same labels as answer ids, BM25 alone.
        id_labels = [[int(self.ids[r]) for r in l] for l in labels]
        got = evaluate(id_labels)
        self.assertEqual(sorted(got), ["bm25"])
        np.testing.assert_allclose(
            got["bm25"], score(answers["bm25"], int, id_labels), atol=6e-5)
        self.assertGreater(got["bm25"][0], 0)

    def test_an_update_rebuilds_the_text_index(self):
        tmp = self.tmp.name
        new_rows = [{"text": "zeppelin printer", "lang": "en", "n": -1},
                    {"text": "飞艇 打印机", "lang": "zh", "n": -2}]
        np.save(os.path.join(tmp, "dx.npy"),
                np.random.default_rng(9).standard_normal((2, DIM)).astype("float32"))
        np.save(os.path.join(tmp, "dids.npy"), np.array([3, 4], dtype=np.int64))
        with open(os.path.join(tmp, "dp.jsonl"), "w", encoding="utf-8") as out:
            for row in new_rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        with open(os.path.join(tmp, "da.jsonl"), "w") as out:
            for row in new_rows:
                out.write(json.dumps({"lang": row["lang"]}) + "\n")
        # Delete every row holding "macro".
        macro = [int(self.ids[r]) for r, row in enumerate(self.rows)
                 if "macro" in row["text"]]
        np.save(os.path.join(tmp, "del.npy"), np.array(macro, dtype=np.int64))
        self.update("updated", input="dx.npy", ids="dids.npy",
                    payloads="dp.jsonl", attributes="da.jsonl",
                    delete="del.npy")
        r = self.search("updated", texts=["zeppelin", "飞艇", "macro"], k=K)
        self.assertEqual(r.ids[0], 3)
        self.assertEqual(r.ids[K], 4)
        self.assertEqual(r.ids[2 * K], -1)
        info = self.daemons["updated"].stub().GetIndexInfo(
            self.pb.GetIndexInfoRequest())
        self.assertEqual(info.text.corpus_rows, ROWS + 2 - len(macro))

    def test_an_update_takes_the_new_rows_texts_from_a_text_file(self):
        """knnctl update --text_file: line i is the text of --input's row i,
        joined to its --payloads line as the base's text field ("text");
        knnd's BM25 finds the upserted row by its new text and no longer by
        its old one, and the added row by its text."""
        tmp = self.tmp.name
        upserted, added = int(self.ids[0]), 7
        old_text = self.rows[0]["text"]
        # The base answers the old text with the row, allowed alone.
        before = self.search("whole", texts=[old_text], k=K,
                             allowed_ids=[upserted])
        self.assertEqual(before.ids[0], upserted)
        np.save(os.path.join(tmp, "tx.npy"),
                np.random.default_rng(10).standard_normal((2, DIM)).astype("float32"))
        np.save(os.path.join(tmp, "tids.npy"),
                np.array([upserted, added], dtype=np.int64))
        with open(os.path.join(tmp, "t.txt"), "w", encoding="utf-8") as out:
            out.write("비행선 정비\n飞艇维修\n")
        with open(os.path.join(tmp, "tp.jsonl"), "w") as out:
            out.write('{"lang": "ko", "n": -3}\n{"lang": "zh", "n": -4}\n')
        with open(os.path.join(tmp, "ta.jsonl"), "w") as out:
            out.write('{"lang": "ko"}\n{"lang": "zh"}\n')
        self.update("texts", input="tx.npy", ids="tids.npy",
                    payloads="tp.jsonl", attributes="ta.jsonl",
                    text_file="t.txt")
        r = self.search("texts", texts=["비행선", "维修"], k=K,
                        payloads=self.pb.PayloadRequest(all_fields=True))
        self.assertEqual(r.ids[0], upserted)
        self.assertEqual(r.ids[K], added)
        self.assertEqual(json.loads(r.payloads[K]),
                         {"lang": "zh", "n": -4, "text": "飞艇维修"})
        after = self.search("texts", texts=[old_text], k=K,
                            allowed_ids=[upserted])
        self.assertEqual(after.ids[0], -1)
        info = self.daemons["texts"].stub().GetIndexInfo(
            self.pb.GetIndexInfoRequest())
        self.assertEqual(info.text.corpus_rows, ROWS + 1)

    def test_attributes_declared_from_payload_fields(self):
        """--attribute_fields lang: the attributes are the payloads' lang
        field (no second file); filters answer as with --attributes, and
        knnctl update reads the delta's attributes from its payloads."""
        tmp = self.tmp.name
        derived = os.path.join(tmp, "derived.index")
        out = subprocess.run(
            [ARGS.knnctl, "build", "--input", self.files["x.npy"], "--output",
             derived, "--nlist", "16", "--ids", self.files["ids.npy"],
             "--payloads", self.files["p.jsonl"], "--attribute_fields", "lang",
             "--text", "text"], check=True, capture_output=True, text=True)
        self.assertIn("attribute: lang (keyword)", out.stdout)
        f = self.pb.Filter(condition=self.pb.Condition(
            field="lang", eq=self.pb.AttributeValue(keyword="ko")))
        self.start("derived", ["--index", derived])
        want = self.search("whole", texts=self.QUERIES, k=K, filter=f)
        got = self.search("derived", texts=self.QUERIES, k=K, filter=f)
        self.assertEqual(list(got.ids), list(want.ids))
        self.assertEqual(got.filter_matched_rows, ROWS // 3)
        np.save(os.path.join(tmp, "fx.npy"), self.xb[:1])
        np.save(os.path.join(tmp, "fids.npy"), np.array([1], dtype=np.int64))
        with open(os.path.join(tmp, "fp.jsonl"), "w") as out_file:
            out_file.write(json.dumps({"text": "quokka", "lang": "ko"}) + "\n")
        self.update("derived2", base=derived, input="fx.npy", ids="fids.npy",
                    payloads="fp.jsonl")
        r = self.search("derived2", texts=["quokka"], k=K, filter=f)
        self.assertEqual(r.ids[0], 1)
        self.assertEqual(r.filter_matched_rows, ROWS // 3 + 1)

    def test_a_front_of_shards_answers_as_the_whole_index(self):
        """The front asks each shard for its windows and fuses the set's:
        texts alone (filtered too), RRF and weighted, with payloads, equal
        to the whole index's answer. Without re-ranking and filters on the
        vector side: with them each shard re-ranks or plans its own
        candidates, as every filtered or re-ranked merge does
        (docs/sharding.md), and a filtered hybrid answer is checked to
        hold only admitted rows."""
        xq = self.xb[:len(self.QUERIES)] + 0.01
        f = self.pb.Filter(condition=self.pb.Condition(
            field="lang", eq=self.pb.AttributeValue(keyword="en")))
        for fields in [
                dict(texts=self.QUERIES, k=K),
                dict(texts=self.QUERIES, k=K, vectors_f32le=xq.tobytes(),
                     refine_factor=0, vector_window=25, text_window=40),
                dict(texts=self.QUERIES, k=K, vectors_f32le=xq.tobytes(),
                     refine_factor=0, fusion=self.pb.FUSION_WEIGHTED,
                     vector_weight=0.25, text_weight=0.75, vector_window=20,
                     text_window=20),
                dict(texts=self.QUERIES, k=K, filter=f, text_window=30,
                     payloads=self.pb.PayloadRequest(fields=["lang", "n"]))]:
            whole = self.search("whole", **fields)
            front = self.search("front", **fields)
            what = str({key: v for key, v in fields.items()
                        if key != "vectors_f32le"})
            self.assertEqual(list(front.ids), list(whole.ids), what)
            np.testing.assert_allclose(front.distances, whole.distances,
                                       rtol=1e-6, err_msg=what)
            self.assertEqual(list(front.text_ranks), list(whole.text_ranks))
            self.assertEqual(list(front.vector_ranks),
                             list(whole.vector_ranks))
            self.assertEqual(list(front.payloads), list(whole.payloads))
            self.assertEqual(front.fusion, whole.fusion)
            self.assertEqual(front.filter_matched_rows,
                             whole.filter_matched_rows)
        front = self.search("front", texts=self.QUERIES, k=K,
                            vectors_f32le=xq.tobytes(), filter=f,
                            payloads=self.pb.PayloadRequest(fields=["lang"]))
        self.assertEqual(front.filter_matched_rows, ROWS // 3)
        for i, p in zip(front.ids, front.payloads):
            if i >= 0:
                self.assertEqual(json.loads(p), {"lang": "en"})

    def test_info_and_metrics_describe_the_text_index(self):
        info = self.daemons["whole"].stub().GetIndexInfo(
            self.pb.GetIndexInfoRequest())
        self.assertEqual(info.text.field, "text")
        self.assertEqual(info.text.corpus_rows, ROWS)
        self.assertAlmostEqual(info.text.average_length,
                               np.mean([len(d) for d in self.doc_terms]), 6)
        self.assertEqual((info.text.k1, info.text.b), (1.2, 0.75))
        self.assertIn("cjk 1+2-grams", info.text.analyzer)
        self.assertGreater(info.max_text_bytes, 0)
        shard = self.daemons["shard1"].stub().GetIndexInfo(
            self.pb.GetIndexInfoRequest())
        self.assertEqual(shard.text.corpus_rows, ROWS)
        front = self.daemons["front"].stub().GetIndexInfo(
            self.pb.GetIndexInfoRequest())
        self.assertEqual(front.text.corpus_rows, ROWS)
        self.assertEqual(front.text.postings, info.text.postings)
        self.assertEqual(front.text.empty_rows, info.text.empty_rows)
        self.search("whole", texts=["printer"], k=K,
                    vectors_f32le=self.xb[:1].tobytes())
        daemon = self.daemons["whole"]
        self.assertGreater(daemon.metric(
            'knnd_search_retriever_duration_seconds_count{retriever="text"}'), 0)
        self.assertGreater(daemon.metric(
            'knnd_search_retriever_duration_seconds_count{retriever="vector"}'), 0)

    def test_knnctl_search_sends_texts(self):
        texts = os.path.join(self.tmp.name, "texts.txt")
        with open(texts, "w", encoding="utf-8") as out:
            out.write("printer network\n서버 차트\n")
        run = subprocess.run(
            [ARGS.knnctl, "search", "--addr", self.daemons["whole"].address,
             "--texts", texts, "--k", "3", "--show", "2"],
            capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        want = self.search("whole", texts=["printer network", "서버 차트"], k=3)
        first = run.stdout.splitlines()[0]
        self.assertTrue(first.startswith(f"query 0: {want.ids[0]}("), first)
        self.assertIn("[v0 t1]", first)
        self.assertIn("2 queries in 1 requests", run.stdout)

    def test_bad_input_is_named(self):
        for fields, message in [
                (dict(k=K), "no queries"),
                (dict(texts=["a"], k=K, fusion=7), "fusion=7"),
                (dict(texts=["a", "b"], k=K,
                      vectors_f32le=self.xb[:1].tobytes()), "texts holds 2"),
                (dict(texts=["x" * 70000], k=K), "max_text_bytes=65536")]:
            with self.assertRaises(grpc.RpcError) as raised:
                self.search("whole", **fields)
            self.assertEqual(raised.exception.code(),
                             grpc.StatusCode.INVALID_ARGUMENT, message)
            self.assertIn(message, raised.exception.details())


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True)

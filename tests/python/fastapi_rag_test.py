#!/usr/bin/python3
"""examples/fastapi_rag end to end, as its README runs it: a venv from PyPI
(FastAPI, uvicorn workers, gunicorn, and knnd-client built from
clients/python with the system protoc), build_corpus.py over /usr/share/common-licenses (knnctl
build --payloads --text text --attribute_fields source + publish), knnd
serving the published versions directory, gunicorn with two preloaded
uvicorn workers in front. Checked over HTTP: /search (hybrid: the
embedding and the words in one knnd call) returns the chunk a query was
cut from (its text, source and ordinal from knnd's payloads: no chunk
store), ranked by both retrievers; by vector alone, the best match of a
brute-force search, with scores knnd computed exactly (cosine,
re-ranked); source=... filters in knnd, in every mode, and an unknown
parameter is refused, not ignored; both
workers answer, each through its own AsyncKnnClient created after the
fork; knnd counts one Search per request; /search keeps answering while
knnd swaps in a newly published version; a version made by `knnctl update
--payloads` (README, "Rebuild with updates") answers the edited and added
chunks and never the removed one; bad queries are 422.
Skipped, with the reason, only when PyPI cannot be reached.

  fastapi_rag_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl --source-dir .
"""
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

from knnd_harness import Daemon, free_port, unittest_main

ARGS = None
SEARCH_OK = ('grpc_server_handled_total{grpc_code="OK",grpc_method="Search",'
             'grpc_service="knnd.v1.KnnService",grpc_type="unary",'
             'protocol="grpc"}')


def run(command, **kwargs):
    start = time.monotonic()
    result = subprocess.run(command, **kwargs)
    print(f"[{time.monotonic() - start:5.1f} s] {' '.join(command[:4])} ...",
          file=sys.stderr, flush=True)
    return result


class FastApiRagTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="fastapi-rag-test-")
        try:
            cls.start()
        except BaseException:  # unittest skips tearDownClass then: stop what ran
            cls.tearDownClass()
            raise

    @classmethod
    def start(cls):
        tmp = cls.tmp.name
        # Copies, so that no build output lands in the source tree.
        for part in ("proto", os.path.join("clients", "python"),
                     os.path.join("examples", "fastapi_rag")):
            shutil.copytree(os.path.join(ARGS.source_dir, part),
                            os.path.join(tmp, "src", part),
                            ignore=shutil.ignore_patterns(
                                "build", "*.egg-info", "__pycache__"))
        cls.example = os.path.join(tmp, "src", "examples", "fastapi_rag")
        venv = os.path.join(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        cls.python = os.path.join(venv, "bin", "python")
        pip = [cls.python, "-m", "pip"]
        probe = run(pip + ["index", "versions", "fastapi", "--timeout", "15",
                           "--retries", "1"], capture_output=True, text=True)
        if probe.returncode != 0:
            raise unittest.SkipTest(
                "PyPI is unreachable (`pip index versions fastapi` failed: "
                f"{probe.stderr.strip()[-300:]})")
        # The client's isolated build is client_test's; here it is built
        # with the venv's setuptools and the system protoc (no grpcio-tools
        # to fetch, faster), so its protoc-3.21 stubs run on PyPI's newest
        # grpcio and protobuf. (setuptools 66 of a Python 3.11 venv builds
        # wheels only with `wheel` installed.)
        run(pip + ["install", "--quiet", "wheel"], check=True)
        run(pip + ["install", "--quiet", "--no-build-isolation",
                   os.path.join(tmp, "src", "clients", "python"),
                   "-r", os.path.join(cls.example, "requirements.txt")], check=True)
        cls.work = os.path.join(tmp, "rag")
        run([cls.python, os.path.join(cls.example, "build_corpus.py"),
             "--knnctl", ARGS.knnctl, "--out", cls.work], check=True,
            capture_output=True)
        cls.knnd = Daemon(ARGS.knnd, ["--index", os.path.join(cls.work, "versions")],
                          log_path=os.path.join(tmp, "knnd.log"), knnctl=ARGS.knnctl)
        if not cls.knnd.wait_serving(60):
            raise RuntimeError("knnd did not start: " + cls.knnd.read_log())
        cls.http = f"127.0.0.1:{free_port()}"
        env = dict(os.environ, KNND_TARGET=f"dns:///{cls.knnd.address}",
                   BIND=cls.http, WORKERS="2")
        cls.gunicorn_log = open(os.path.join(tmp, "gunicorn.log"), "w")
        cls.gunicorn = subprocess.Popen(
            [os.path.join(venv, "bin", "gunicorn"), "-c", "gunicorn.conf.py", "app:app"],
            cwd=cls.example, env=env, stdout=cls.gunicorn_log,
            stderr=subprocess.STDOUT)
        # Ready when /healthz answers and both workers have run their
        # startup: one answering is not both booted (CI once saw the second
        # worker still unborn 17 s after the first answered). A worker stuck
        # before its startup is killed and replaced by gunicorn after its
        # 30 s timeout, hence the longer deadline.
        deadline = time.monotonic() + 90
        while True:
            try:
                if (cls.get("/healthz")[0] == 200 and
                        cls.log(whole=True).count("Application startup complete") >= 2):
                    break
            except OSError:
                pass
            if cls.gunicorn.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("gunicorn did not start two workers: " + cls.log())
            time.sleep(0.1)
        with open(os.path.join(cls.work, "chunks.jsonl"), encoding="utf-8") as f:
            cls.chunks = [json.loads(line) for line in f]
        cls.vectors = np.load(os.path.join(cls.work, "vectors.npy"))

    @classmethod
    def tearDownClass(cls):
        if hasattr(cls, "gunicorn"):
            cls.gunicorn.send_signal(signal.SIGTERM)
            try:
                cls.gunicorn.wait(30)
            except subprocess.TimeoutExpired:
                cls.gunicorn.kill()
                cls.gunicorn.wait()
            cls.gunicorn_log.close()
        if hasattr(cls, "knnd"):
            cls.knnd.stop(30)
        cls.tmp.cleanup()

    @classmethod
    def log(cls, whole=False):
        """gunicorn's log: its last 4,000 characters, or all of it."""
        with open(os.path.join(cls.tmp.name, "gunicorn.log")) as f:
            text = f.read()
        return text if whole else text[-4000:]

    @classmethod
    def get(cls, path):
        """(HTTP status, decoded JSON body) of GET `path`."""
        try:
            with urllib.request.urlopen(f"http://{cls.http}{path}", timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def search(self, q, k=5, **params):
        status, body = self.get("/search?" + urllib.parse.urlencode(
            {"q": q, "k": k, **params}, doseq=True))
        self.assertEqual(status, 200, body)
        return body

    def test_search_returns_the_chunk_a_query_was_cut_from(self):
        sys.path.insert(0, self.example)
        try:
            from embedder import embed
        finally:
            sys.path.remove(self.example)
        rows = [(i, c["source"], c["text"]) for i, c in enumerate(self.chunks)
                if i % 97 == 5]
        self.assertGreater(len(rows), 4)
        for vector_id, source, text in rows:
            with self.subTest(id=vector_id, source=source):
                words = text.split()
                query = " ".join(words[25:45])  # inside this chunk only
                # Hybrid (the default): one knnd call with the embedding
                # and the words; the chunk is among the first by both.
                hybrid = self.search(query, k=5)
                self.assertEqual(hybrid["mode"], "hybrid")
                hybrid_ids = [r["id"] for r in hybrid["results"]]
                self.assertIn(vector_id, hybrid_ids[:2])
                found = hybrid["results"][hybrid_ids.index(vector_id)]
                self.assertGreater(found["vector_rank"], 0)
                self.assertGreater(found["text_rank"], 0)
                self.assertEqual(found["source"], source)
                body = self.search(query, k=5, mode="vector")
                ids = [r["id"] for r in body["results"]]
                scores = [r["score"] for r in body["results"]]
                # The chunk it was cut from is among the first (the best
                # may be a near copy: the LGPL-2 and 2.1, GFDL-1.2 and 1.3,
                # GPL-1 and 2 share paragraphs).
                self.assertIn(vector_id, ids[:2])
                found = body["results"][ids.index(vector_id)]
                self.assertIn(query, found["text"])
                self.assertEqual(found, dict(self.chunks[vector_id], id=vector_id,
                                             score=found["score"]))
                # Exact re-ranking: each score is the true cosine of its
                # chunk, closest first, and the best is a brute-force
                # search's best over the same vectors.
                cosines = self.vectors @ embed(query)
                np.testing.assert_allclose(scores, cosines[ids], atol=1e-4)
                self.assertEqual(scores, sorted(scores, reverse=True))
                self.assertAlmostEqual(scores[0], float(cosines.max()), places=4)

    def test_both_workers_answer_and_knnd_counts_every_search(self):
        before = self.knnd.scrape().get(SEARCH_OK, 0)
        queries = [f"license {w}" for w in ("patent", "copyright", "warranty",
                                            "distribute", "modify", "source")] * 8

        def one(q):
            return self.search(q, k=2)
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            bodies = list(pool.map(one, queries))
        self.assertEqual(len(bodies), len(queries))
        pids = {b["worker_pid"] for b in bodies}
        self.assertEqual(len(pids), 2, f"only workers {pids} answered: " + self.log())
        self.assertEqual(self.knnd.scrape().get(SEARCH_OK, 0) - before, len(queries))

    def test_search_answers_while_knnd_swaps_in_a_new_version(self):
        # The corpus republished as version 2 (what a rebuild publishes)
        # and knnd told with SIGHUP, while two threads keep searching.
        reloads = 'knnd_index_reloads_total{result="ok"}'
        self.assertEqual(self.knnd.scrape().get(reloads), 1)
        expected = [r["id"] for r in self.search("license patent", k=3)["results"]]
        stop = threading.Event()
        answers = []

        def keep_searching():
            while not stop.is_set():
                status, body = self.get("/search?q=license+patent&k=3")
                answers.append((time.monotonic(), status, body))
        threads = [threading.Thread(target=keep_searching) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.5)
            run([ARGS.knnctl, "publish", "--index", os.path.join(self.work, "chunks.index"),
                 "--dir", os.path.join(self.work, "versions")], check=True,
                capture_output=True)
            self.knnd.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 60
            while self.knnd.scrape().get(reloads) != 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            swapped = time.monotonic()
            time.sleep(0.5)
        finally:
            stop.set()
            for t in threads:
                t.join()
        self.assertEqual(self.knnd.scrape().get(reloads), 2, self.knnd.read_log())
        self.assertIn("version 2", self.knnd.read_log())
        bad = [(status, body) for _, status, body in answers if status != 200]
        self.assertEqual(bad, [], self.log())
        after = [body for t, _, body in answers if t > swapped]
        self.assertTrue(after, "no search answered after the swap")
        for body in after:
            self.assertEqual([r["id"] for r in body["results"]], expected)

    def test_updates_publish_edited_added_and_removed_chunks(self):
        # The README's "Rebuild with updates": one chunk edited (its id
        # keeps naming it), one added, one removed, through knnctl update
        # with the payloads of the new rows, then publish and SIGHUP.
        sys.path.insert(0, self.example)
        try:
            from embedder import embed_many
        finally:
            sys.path.remove(self.example)
        edited_id, removed_id, added_id = 5, 200, len(self.chunks)
        edited = ("glacier saxophone turmeric lighthouse meridian "
                  "cobblestone")
        added = "zebra harmonica quantum orchard velvet tundra"
        work = os.path.join(self.work, "update")
        os.makedirs(work, exist_ok=True)
        np.save(os.path.join(work, "new.npy"), embed_many([edited, added]))
        np.save(os.path.join(work, "new_ids.npy"),
                np.array([edited_id, added_id], np.int64))
        np.save(os.path.join(work, "gone.npy"), np.array([removed_id], np.int64))
        with open(os.path.join(work, "new.jsonl"), "w", encoding="utf-8") as f:
            for text, ordinal in ((edited, 0), (added, 0)):
                f.write(json.dumps({"text": text, "source": "update",
                                    "ordinal": ordinal}) + "\n")
        reloads = 'knnd_index_reloads_total{result="ok"}'
        before = self.knnd.scrape().get(reloads)
        updated = os.path.join(work, "chunks2.index")
        run([ARGS.knnctl, "update", "--base", os.path.join(self.work, "chunks.index"),
             "--output", updated, "--input", os.path.join(work, "new.npy"),
             "--ids", os.path.join(work, "new_ids.npy"),
             "--payloads", os.path.join(work, "new.jsonl"),
             "--delete", os.path.join(work, "gone.npy")],
            check=True, capture_output=True)
        run([ARGS.knnctl, "publish", "--index", updated,
             "--dir", os.path.join(self.work, "versions")], check=True,
            capture_output=True)
        self.knnd.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while self.knnd.scrape().get(reloads) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.knnd.scrape().get(reloads), before + 1,
                         self.knnd.read_log())
        for text, vector_id in ((edited, edited_id), (added, added_id)):
            best = self.search(text, k=3)["results"][0]
            self.assertEqual((best["id"], best["text"], best["source"]),
                             (vector_id, text, "update"))
        removed_words = self.chunks[removed_id]["text"].split()
        ids = [r["id"] for r in self.search(" ".join(removed_words[25:45]),
                                            k=10)["results"]]
        self.assertNotIn(removed_id, ids)

    def test_the_metadata_filter_reaches_knnd(self):
        """source=... filters in knnd (an attribute from each chunk's
        payload, both retrievers): every result is from the files named,
        in every mode; the best chunk of a file is found even where other
        files hold better matches; a file that does not exist matches
        nothing."""
        sources = sorted({c["source"] for c in self.chunks})
        self.assertIn("Apache-2.0", sources)
        query = "grant of patent license"
        unfiltered = {r["source"] for r in self.search(query, k=20)["results"]}
        self.assertGreater(len(unfiltered), 1)
        for mode in ("hybrid", "vector", "text"):
            for wanted in (["Apache-2.0"], ["GPL-2", "GPL-3"]):
                with self.subTest(mode=mode, source=wanted):
                    body = self.search(query, k=10, mode=mode, source=wanted)
                    got = [r["source"] for r in body["results"]]
                    self.assertEqual(len(got), 10)
                    self.assertLessEqual(set(got), set(wanted))
        # The text retriever's answer within Apache-2.0 is BM25's over that
        # file's chunks: its "patent license" chunk comes first.
        best = self.search("patent license", k=1, mode="text",
                           source="Apache-2.0")["results"][0]
        self.assertEqual(best["source"], "Apache-2.0")
        self.assertIn("patent license", best["text"].lower())
        self.assertEqual(self.search(query, source="No-Such-License")["results"], [])

    def test_bad_queries_are_refused(self):
        for query, why in (({"q": "  ,;  "}, "no words"), ({"q": "x", "k": 0}, None),
                           ({"q": ""}, None), ({"q": "x", "k": 51}, None),
                           ({"q": "x", "lang": "en"}, "unknown query parameter 'lang'"),
                           ({"q": "x", "mode": "sparse"}, None)):
            with self.subTest(query=query):
                status, body = self.get("/search?" + urllib.parse.urlencode(query))
                self.assertEqual(status, 422, body)
                if why:
                    self.assertIn(why, body["detail"])


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True)

#!/usr/bin/python3
"""knnd-client's LangChain vector store (knnd_client/langchain.py) and
retriever over a live knnd, and over two shards through the sharded
clients, with a deterministic fake embedding, by vector and hybrid
(hybrid=True: the query's embedding and text in one search, filtered); in
the pypi route's venv only (the system route has no langchain-core;
client_testing.py).

  client_langchain_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl \
      --source-dir . --venvs BUILD/tests/python_client_venvs [unittest args]
"""
import asyncio
import json
import os
import subprocess
import tempfile
import unittest

import grpc
import numpy as np

import client_testing
from client_testing import ROUTE_ENV
from knnd_harness import Daemon, stop_all

ARGS = None


@unittest.skipUnless(os.environ.get(ROUTE_ENV) == "pypi",
                     "LangChain is installed in the pypi route only")
class LangChainTest(unittest.TestCase):
    """knnd_client.langchain.KnndVectorStore over a live knnd serving the
    deterministic fake embeddings of 1,500 texts (cosine index, raw vectors
    kept for exact re-ranking), the docstore a dict keyed by vector id; and
    over the same vectors split into two shards, each served by its knnd,
    through the sharded clients."""

    DIM = 32

    @classmethod
    def setUpClass(cls):
        from langchain_core.documents import Document
        from langchain_core.embeddings import DeterministicFakeEmbedding
        cls.tmp = tempfile.TemporaryDirectory()
        words = ["index", "vector", "shard", "replica", "token", "probe",
                 "cluster", "memory", "latency", "batch", "queue", "worker"]
        cls.texts = [f"chunk {i}: {words[i % 12]} {words[(i // 12) % 12]} "
                     f"{words[(i // 144) % 12]}" for i in range(1500)]
        cls.embedding = DeterministicFakeEmbedding(size=cls.DIM)
        vectors = np.array(cls.embedding.embed_documents(cls.texts), np.float32)
        # --keep_vectors (exact re-ranking) stores row i as vector id i, so
        # the ids are row numbers here; the docstore is keyed by them.
        cls.docstore = {i: Document(page_content=t, metadata={"row": i})
                        for i, t in enumerate(cls.texts)}
        base = os.path.join(cls.tmp.name, "chunks")
        np.save(base + ".npy", vectors)
        subprocess.run([ARGS.knnctl, "build", "--input", base + ".npy",
                        "--output", base + ".index", "--metric", "cosine",
                        "--factory", "IVF16,PQ8", "--keep_vectors"],
                       check=True, capture_output=True)
        cls.daemon = Daemon(ARGS.knnd, ["--index", base + ".index"],
                            log_path=os.path.join(cls.tmp.name, "knnd.log"),
                            knnctl=ARGS.knnctl)
        if not cls.daemon.wait_serving(60):
            cls.daemon.stop()
            raise RuntimeError("knnd did not start: " + cls.daemon.read_log())
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        cls.unit = unit
        # The same vectors as a FastScan index split into 2 shards, a knnd
        # per shard, for the sharded clients.
        subprocess.run([ARGS.knnctl, "build", "--input", base + ".npy",
                        "--output", base + "_fs.index", "--metric", "cosine",
                        "--factory", "IVF16,PQ16x4fs", "--keep_vectors"],
                       check=True, capture_output=True)
        subprocess.run([ARGS.knnctl, "shard", "--index", base + "_fs.index",
                        "--shards", "2"], check=True, capture_output=True)
        # The same vectors with own ids and payloads (the text, its row),
        # the text indexed for hybrid search and the row an attribute,
        # whole and in 2 shards: documents from knnd, no docstore.
        cls.own_ids = [5 + 3 * i for i in range(len(cls.texts))]
        np.save(base + "_ids.npy", np.array(cls.own_ids, np.int64))
        with open(base + ".jsonl", "w", encoding="utf-8") as out:
            for i, t in enumerate(cls.texts):
                out.write(json.dumps({"text": t, "row": i}) + "\n")
        subprocess.run([ARGS.knnctl, "build", "--input", base + ".npy",
                        "--output", base + "_p.index", "--metric", "cosine",
                        "--factory", "IVF16,PQ16x4fs", "--keep_vectors",
                        "--ids", base + "_ids.npy", "--payloads",
                        base + ".jsonl", "--text", "text",
                        "--attribute_fields", "row"],
                       check=True, capture_output=True)
        subprocess.run([ARGS.knnctl, "shard", "--index", base + "_p.index",
                        "--shards", "2"], check=True, capture_output=True)
        cls.shards = []
        cls.payload_daemons = []
        for path in [base + "_p.index", base + "_p.index.shard-0-of-2",
                     base + "_p.index.shard-1-of-2"]:
            daemon = Daemon(ARGS.knnd, ["--index", path],
                            log_path=path + ".log", knnctl=ARGS.knnctl)
            cls.payload_daemons.append(daemon)
            if not daemon.wait_serving(60):
                cls.tearDownClass()
                raise RuntimeError("knnd did not start: " + daemon.read_log())
        for i in range(2):
            shard = Daemon(ARGS.knnd,
                           ["--index", f"{base}_fs.index.shard-{i}-of-2"],
                           log_path=os.path.join(cls.tmp.name, f"shard{i}.log"),
                           knnctl=ARGS.knnctl)
            cls.shards.append(shard)
            if not shard.wait_serving(60):
                cls.tearDownClass()
                raise RuntimeError("shard knnd did not start: " + shard.read_log())

    @classmethod
    def tearDownClass(cls):
        stop_all(getattr(cls, "shards", []) + getattr(cls, "payload_daemons", [])
                 + [cls.daemon], 30)
        cls.tmp.cleanup()

    def store(self, docstore=None, **kwargs):
        from knnd_client import KnnClient
        from knnd_client.langchain import KnndVectorStore
        client = KnnClient(self.daemon.address, timeout_s=10)
        self.addCleanup(client.close)
        return KnndVectorStore(client, self.embedding,
                              self.docstore if docstore is None else docstore,
                              nprobe=16, refine_factor=16, **kwargs)

    def exact(self, row, k):
        """Exact cosine top-k of text `row` (numpy), as (vector ids, cosines)."""
        cosines = self.unit @ self.unit[row]
        top = np.argsort(-cosines, kind="stable")[:k]
        return top.tolist(), cosines[top]

    def test_similarity_search_returns_the_docstore_documents(self):
        store = self.store()
        for row in (7, 400, 1499):
            with self.subTest(row=row):
                docs = store.similarity_search(self.texts[row], k=4)
                want_ids, want_cosines = self.exact(row, 4)
                self.assertEqual(docs, [self.docstore[i] for i in want_ids])
                scored = store.similarity_search_with_score(self.texts[row], k=4)
                self.assertEqual([d for d, _ in scored], docs)
                np.testing.assert_allclose([s for _, s in scored], want_cosines,
                                           atol=1e-4)
                by_vector = store.similarity_search_by_vector(
                    self.embedding.embed_query(self.texts[row]), k=4)
                self.assertEqual(by_vector, docs)
        # The search kwargs reach knnd: only allowed ids come back.
        docs = store.similarity_search(self.texts[7], k=3, allowed_ids=[10, 11])
        self.assertEqual(sorted(d.metadata["row"] for d in docs), [10, 11])

    def test_relevance_scores_and_retrievers(self):
        store = self.store()
        scored = store.similarity_search_with_relevance_scores(self.texts[5], k=5)
        self.assertAlmostEqual(scored[0][1], 1.0, places=4)  # itself: cosine 1
        self.assertTrue(all(0.0 <= s <= 1.0 for _, s in scored), scored)
        retriever = store.as_retriever(search_kwargs={"k": 3})
        docs = retriever.invoke(self.texts[5])
        self.assertEqual(docs, [self.docstore[i] for i in self.exact(5, 3)[0]])
        strict = store.as_retriever(search_type="similarity_score_threshold",
                                    search_kwargs={"k": 5, "score_threshold": 0.999})
        self.assertEqual(strict.invoke(self.texts[5]),
                         [self.docstore[5]])
        # LangChain runs a sync store's a* methods in a thread.
        self.assertEqual(asyncio.run(retriever.ainvoke(self.texts[5])), docs)

    def test_async_client_store(self):
        from knnd_client import AsyncKnnClient
        from knnd_client.langchain import KnndVectorStore
        sync_store = self.store()
        want = sync_store.similarity_search_with_score(self.texts[9], k=4)

        async def main():
            async with AsyncKnnClient(self.daemon.address) as client:
                store = KnndVectorStore(client, self.embedding, self.docstore,
                                       nprobe=16, refine_factor=16)
                with self.assertRaisesRegex(TypeError, "await the a\\* methods"):
                    store.similarity_search(self.texts[9])
                scored = await store.asimilarity_search_with_score(self.texts[9], k=4)
                docs = await store.as_retriever(search_kwargs={"k": 4}).ainvoke(
                    self.texts[9])
                relevance = await store.asimilarity_search_with_relevance_scores(
                    self.texts[9], k=4)
                return scored, docs, relevance
        scored, docs, relevance = asyncio.run(main())
        self.assertEqual([d for d, _ in scored], [d for d, _ in want])
        np.testing.assert_allclose([s for _, s in scored], [s for _, s in want],
                                   atol=1e-6)
        self.assertEqual(docs, [d for d, _ in want])
        self.assertAlmostEqual(relevance[0][1], 1.0, places=4)

    def test_sharded_clients_store(self):
        """The store over the two shards, sync and asyncio: the documents
        of the exact top-k (every list probed, 64 candidates re-ranked
        exactly), cosine scores, and relevance from the shards' metric."""
        from knnd_client import AsyncShardedKnnClient, ShardedKnnClient
        from knnd_client.langchain import KnndVectorStore
        targets = [shard.address for shard in self.shards]
        client = ShardedKnnClient(targets, timeout_s=10)
        self.addCleanup(client.close)
        store = KnndVectorStore(client, self.embedding, self.docstore,
                                nprobe=16, refine_factor=16)
        for row in (7, 400, 1499):
            with self.subTest(row=row):
                want_ids, want_cosines = self.exact(row, 4)
                scored = store.similarity_search_with_score(self.texts[row], k=4)
                self.assertEqual([d for d, _ in scored],
                                 [self.docstore[i] for i in want_ids])
                np.testing.assert_allclose([s for _, s in scored], want_cosines,
                                           atol=1e-4)
        relevance = store.similarity_search_with_relevance_scores(self.texts[5], k=2)
        self.assertAlmostEqual(relevance[0][1], 1.0, places=4)
        docs = store.similarity_search(self.texts[7], k=3, allowed_ids=[10, 1400])
        self.assertEqual(sorted(d.metadata["row"] for d in docs), [10, 1400])

        async def main():
            async with AsyncShardedKnnClient(targets) as aclient:
                astore = KnndVectorStore(aclient, self.embedding, self.docstore,
                                         nprobe=16, refine_factor=16)
                with self.assertRaisesRegex(TypeError, "AsyncShardedKnnClient: "
                                            "await the a\\* methods"):
                    astore.similarity_search(self.texts[9])
                docs = await astore.as_retriever(search_kwargs={"k": 4}).ainvoke(
                    self.texts[9])
                relevance = await astore.asimilarity_search_with_relevance_scores(
                    self.texts[9], k=1)
                return docs, relevance
        docs, relevance = asyncio.run(main())
        self.assertEqual(docs, [self.docstore[i] for i in self.exact(9, 4)[0]])
        self.assertAlmostEqual(relevance[0][1], 1.0, places=4)

    def test_documents_from_payloads_carry_their_ids(self):
        """Without a docstore the documents come from knnd's payloads:
        page_content the text, metadata the other fields, id the vector's
        own id; the same through the sharded clients and asyncio."""
        from langchain_core.documents import Document
        from knnd_client import (AsyncKnnClient, KnnClient,
                                 ShardedKnnClient)
        from knnd_client.langchain import KnndVectorStore

        def want(row, k):
            return [Document(page_content=self.texts[i],
                             metadata={"row": i}, id=str(self.own_ids[i]))
                    for i in self.exact(row, k)[0]]
        whole = KnnClient(self.payload_daemons[0].address, timeout_s=10)
        sharded = ShardedKnnClient([d.address for d in self.payload_daemons[1:]],
                                   timeout_s=10)
        self.addCleanup(whole.close)
        self.addCleanup(sharded.close)
        for client in (whole, sharded):
            store = KnndVectorStore(client, self.embedding, nprobe=16,
                                    refine_factor=16)
            for row in (7, 400, 1499):
                with self.subTest(client=type(client).__name__, row=row):
                    docs = store.similarity_search(self.texts[row], k=4)
                    self.assertEqual(docs, want(row, 4))
                    self.assertEqual([d.id for d in docs],
                                     [str(self.own_ids[i])
                                      for i in self.exact(row, 4)[0]])
        renamed = KnndVectorStore(whole, self.embedding, text_field="row",
                                  nprobe=16, refine_factor=16)
        doc = renamed.similarity_search(self.texts[3], k=1)[0]
        self.assertEqual((doc.page_content, doc.metadata), ("3", {"text": self.texts[3]}))
        # get_by_ids without a docstore: knnd's Get, the documents in the
        # ids' order, ids the index does not hold (and non-ids) left out;
        # whole and sharded.
        for client in (whole, sharded):
            store = KnndVectorStore(client, self.embedding)
            got = store.get_by_ids([str(self.own_ids[8]), "7", "x",
                                    str(self.own_ids[1499]),
                                    str(self.own_ids[8])])
            self.assertEqual(got, [Document(page_content=self.texts[i],
                                            metadata={"row": i},
                                            id=str(self.own_ids[i]))
                                   for i in (8, 1499)],
                             type(client).__name__)
            self.assertEqual(store.get_by_ids([]), [])
        self.assertEqual(
            [d.page_content for d in renamed.get_by_ids([str(self.own_ids[8])])],
            ["8"])

        async def aget():
            async with AsyncKnnClient(self.payload_daemons[0].address) as client:
                return await KnndVectorStore(client, self.embedding).aget_by_ids(
                    [str(self.own_ids[3]), "1"])
        self.assertEqual([d.id for d in asyncio.run(aget())],
                         [str(self.own_ids[3])])

        async def main():
            async with AsyncKnnClient(self.payload_daemons[0].address) as client:
                store = KnndVectorStore(client, self.embedding, nprobe=16,
                                        refine_factor=16)
                return await store.as_retriever(
                    search_kwargs={"k": 3}).ainvoke(self.texts[9])
        self.assertEqual(asyncio.run(main()), want(9, 3))
        # An index without payloads is refused by knnd, naming it.
        import grpc
        plain = KnnClient(self.daemon.address, timeout_s=10)
        self.addCleanup(plain.close)
        with self.assertRaises(grpc.RpcError) as raised:
            KnndVectorStore(plain, self.embedding).similarity_search(
                self.texts[1], k=1)
        self.assertEqual(raised.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("has no payloads", raised.exception.details())

    def test_hybrid_search_sends_the_embedding_and_the_text_in_one_call(self):
        """hybrid=True (a search's kwargs or a retriever's search_kwargs):
        one knnd search with the query's embedding and its text, filter=
        reaching knnd; the documents of that search, scored by the fused
        score; whole, sharded and asyncio."""
        from langchain_core.documents import Document
        from knnd_client import (AsyncKnnClient, KnnClient,
                                 ShardedKnnClient)
        from knnd_client.langchain import KnndVectorStore
        whole = KnnClient(self.payload_daemons[0].address, timeout_s=10)
        sharded = ShardedKnnClient([d.address for d in self.payload_daemons[1:]],
                                   timeout_s=10)
        self.addCleanup(whole.close)
        self.addCleanup(sharded.close)
        row_filter = {"row": {"$lt": 700}}
        search_ok = client_testing.SEARCH_OK

        def want(client, query, k, **kwargs):
            result = client.search(
                np.array([self.embedding.embed_query(query)], np.float32), k,
                16, refine_factor=16, payloads=True, text=query, **kwargs)
            return [(Document(page_content=h.payload["text"],
                              metadata={"row": h.payload["row"]},
                              id=str(h.id)), h.distance)
                    for h in result.hits(0)]
        for client in (whole, sharded):
            store = KnndVectorStore(client, self.embedding, nprobe=16,
                                    refine_factor=16)
            for row in (7, 400, 1200):
                query = self.texts[row]
                with self.subTest(client=type(client).__name__, row=row):
                    before = self.payload_daemons[0].scrape().get(search_ok, 0)
                    scored = store.similarity_search_with_score(
                        query, k=5, hybrid=True, filter=row_filter)
                    if client is whole:  # one knnd call
                        self.assertEqual(self.payload_daemons[0].scrape().get(
                            search_ok, 0) - before, 1)
                    self.assertEqual(scored, want(client, query, 5,
                                                  filter=row_filter))
                    self.assertTrue(all(d.metadata["row"] < 700
                                        for d, _ in scored))
                    weighted = store.similarity_search(
                        query, k=3, hybrid=True, fusion="weighted",
                        text_weight=0.9, vector_weight=0.1)
                    self.assertEqual(weighted, [d for d, _ in want(
                        client, query, 3, fusion="weighted",
                        text_weight=0.9, vector_weight=0.1)])
            retriever = store.as_retriever(search_kwargs={
                "k": 4, "hybrid": True, "filter": {"row": {"$gte": 1000}}})
            docs = retriever.invoke(self.texts[1200])
            self.assertEqual(docs, [d for d, _ in want(
                client, self.texts[1200], 4, filter={"row": {"$gte": 1000}})])
            # The row's own chunk: first by both retrievers.
            self.assertEqual(docs[0].metadata["row"], 1200)
        with self.assertRaisesRegex(ValueError, "a search by vector has no text"):
            store.similarity_search_by_vector(
                self.embedding.embed_query("x"), hybrid=True)
        with self.assertRaisesRegex(ValueError, "relevance scores"):
            store.similarity_search_with_relevance_scores("x", hybrid=True)
        with self.assertRaisesRegex(ValueError, "fusion is set without text"):
            store.similarity_search("x", fusion="rrf")

        async def main():
            async with AsyncKnnClient(self.payload_daemons[0].address) as client:
                store = KnndVectorStore(client, self.embedding, nprobe=16,
                                        refine_factor=16)
                return await store.as_retriever(search_kwargs={
                    "k": 3, "hybrid": True, "filter": row_filter}).ainvoke(
                        self.texts[9])
        self.assertEqual(asyncio.run(main()), [d for d, _ in want(
            whole, self.texts[9], 3, filter=row_filter)])

    def test_docstores_lookup_and_missing_ids(self):
        from langchain_core.stores import InMemoryStore
        by_string = InMemoryStore()
        by_string.mset([(str(i), d) for i, d in self.docstore.items()])
        store = self.store(docstore=by_string)
        self.assertEqual(store.similarity_search(self.texts[3], k=2),
                         self.store().similarity_search(self.texts[3], k=2))
        self.assertEqual(store.get_by_ids(["3", "999999"]), [self.docstore[3]])
        partial = dict(self.docstore)
        del partial[3]
        with self.assertRaisesRegex(LookupError, "vector id 3, which the docstore"):
            self.store(docstore=partial).similarity_search(self.texts[3], k=2)

    def test_read_only_and_argument_errors(self):
        from langchain_core.documents import Document
        from knnd_client.langchain import KnndVectorStore
        store = self.store()
        for call in (lambda: store.add_texts(["new"]),
                     lambda: store.add_documents([Document(page_content="new")]),
                     lambda: store.delete(["1000"]),
                     lambda: KnndVectorStore.from_texts(["new"], self.embedding),
                     lambda: KnndVectorStore.from_documents(
                         [Document(page_content="new")], self.embedding),
                     lambda: asyncio.run(store.aadd_texts(["new"]))):
            with self.assertRaises(NotImplementedError) as err:
                call()
            self.assertIn("knnctl build", str(err.exception))
            self.assertIn("knnctl publish", str(err.exception))
        # filter= goes to knnd, which names the attribute this index lacks;
        # a malformed dict is refused before any call.
        with self.assertRaisesRegex(grpc.RpcError, "no attributes"):
            store.similarity_search("x", filter={"row": 1})
        with self.assertRaisesRegex(ValueError, r"filter\['row'\]\['\$bogus'\]"):
            store.similarity_search("x", filter={"row": {"$bogus": 1}})
        with self.assertRaisesRegex(TypeError, "got fetch_k"):
            store.similarity_search("x", fetch_k=20)
        with self.assertRaisesRegex(TypeError, "docstore must be None"):
            KnndVectorStore(store._client, self.embedding, [Document(page_content="x")])



if __name__ == "__main__":
    client_testing.main(__doc__)

"""Get by ids end to end (KnnService.Get, docs/api.md "Get"): an index
built with own 63-bit ids, payloads, attributes of every type and its raw
vectors, knnd serving it over gRPC and HTTP (a bearer token, max_get_ids
64), and the knnd-client's get(): each found id's payload, attributes and
vector as stored, ids given twice answered once, unknown ids missing (not
an error); negative ids, too many ids, vectors or attributes asked of an
index without them, and a call without the token refused by name; the
HTTP answer equal to gRPC's; the same records from AsyncKnnClient, from
ShardedKnnClient and AsyncShardedKnnClient over the build split in 2
shards and from knnd's own front of those shards, over gRPC and HTTP;
knnctl get's JSON lines.

Run by ctest (python_get); by hand:
  /usr/bin/python3 tests/python/get_test.py --knnd build/knnd \\
      --knnctl build/knnctl --source-dir .
"""
import asyncio
import http.client
import json
import os
import struct
import subprocess
import tempfile
import unittest

import grpc
import numpy as np

from knnd_harness import (free_port, install_client, start_serving,
                          stop_all, unittest_main)

ARGS = None
ROWS = 1500
DIM = 8
TOKEN = "get-test-token-0123456789abcdef"
MAX_GET_IDS = 64
GENRES = ["news", "sport", "caf\u00e9 \"q\""]


def post(address, path, body, token=TOKEN):
    """(status, parsed JSON) of an HTTP POST of `body` (a dict) to knnd."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request("POST", path, json.dumps(body), headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


class GetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        install_client(ARGS.source_dir, cls.tmp.name)
        rng = np.random.default_rng(17)
        cls.xb = rng.standard_normal((ROWS, DIM)).astype("float32")
        cls.ids = rng.integers(0, 2**63 - 1, ROWS, dtype=np.int64)
        cls.payloads = [{"text": f"chunk {r}", "page": r}
                        if r % 4 else f"plain {r}" for r in range(ROWS)]
        cls.attributes = []
        for r in range(ROWS):
            a = {"genre": GENRES[r % 3], "year": 2000 + r % 25,
                 "score": r / 8, "tags": [f"t{r % 5}", f"u{r % 2}"],
                 "when": f"2024-01-{1 + r % 28:02d}T12:00:00Z"}
            if r % 6 == 0:
                del a["year"]  # a row without a value of a column
            if r % 10 == 0:
                a["tags"] = []
            cls.attributes.append(a)
        files = {}
        for name, rows in (("payloads", cls.payloads),
                           ("attributes", cls.attributes)):
            files[name] = os.path.join(cls.tmp.name, name + ".jsonl")
            with open(files[name], "w", encoding="utf-8") as out:
                for row in rows:
                    out.write(json.dumps(row) + "\n")
        base = os.path.join(cls.tmp.name, "base.npy")
        ids = os.path.join(cls.tmp.name, "ids.npy")
        np.save(base, cls.xb)
        np.save(ids, cls.ids)

        def build(name, *extra):
            path = os.path.join(cls.tmp.name, name)
            subprocess.run([ARGS.knnctl, "build", "--input", base, "--output",
                            path, "--nlist", "16", "--ids", ids, *extra],
                           check=True, capture_output=True)
            return path
        full = ("--payloads", files["payloads"], "--attributes",
                files["attributes"])
        whole = build("whole.index", *full)
        bare = build("bare.index", "--keep_vectors=false")
        split = build("split.index", *full, "--shards", "2")
        tokens = os.path.join(cls.tmp.name, "tokens")
        with open(tokens, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(tokens, 0o600)
        cls.tokens = tokens
        config = os.path.join(cls.tmp.name, "knnd.textproto")
        with open(config, "w") as f:
            f.write(f"max_get_ids: {MAX_GET_IDS}\n"
                    f'search_token_file: "{tokens}"\n')
        cls.daemons = {}
        cls.start("whole", ["--index", whole, "--config", config])
        cls.start("bare", ["--index", bare])
        cls.start("shard0", ["--index", split + ".shard-0-of-2"])
        cls.start("shard1", ["--index", split + ".shard-1-of-2"])
        cls.start("front", ["--shard_targets",
                            cls.daemons["shard0"].address + "," +
                            cls.daemons["shard1"].address])

    @classmethod
    def start(cls, name, args):
        http_address = f"127.0.0.1:{free_port()}"
        try:
            start_serving(cls.daemons, name, ARGS.knnd,
                          [*args, "--http_listen", http_address],
                          cls.tmp.name, ARGS.knnctl).http = http_address
        except RuntimeError:
            cls.tmp.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        stop_all(cls.daemons.values(), 30)
        cls.tmp.cleanup()

    def client(self, name, token=TOKEN):
        from knnd_client import KnnClient
        client = KnnClient(self.daemons[name].address, timeout_s=30,
                           bearer_token=token)
        self.addCleanup(client.close)
        return client

    def row_of(self, vector_id):
        return int(np.flatnonzero(self.ids == vector_id)[0])

    def payload(self, vector_id):
        p = self.payloads[self.row_of(vector_id)]
        return {"text": p} if isinstance(p, str) else p

    def stored_attributes(self, vector_id):
        """The row's attributes as knnd answers them: a column without a
        value (an empty tag list) left out."""
        a = dict(self.attributes[self.row_of(vector_id)])
        if a["tags"]:
            a["tags"] = sorted(a["tags"])  # in the dictionary's order
        else:
            del a["tags"]
        return a

    def asked(self):
        """Ids as a caller sends them: found ones, one twice, and ids the
        index does not hold; (ids, found in first-mention order, missing)."""
        found = [int(i) for i in self.ids[[5, 0, 1499, 6, 12]]]
        unknown = [3, 2**62 + 1]
        ids = [found[0], unknown[0], found[1], found[2], found[0], found[3],
               unknown[1], found[4], unknown[0]]
        return ids, found, unknown

    def check_records(self, result, found, unknown, what):
        self.assertEqual([r.id for r in result.records], found, what)
        self.assertEqual(list(result.missing), unknown, what)
        for r in result.records:
            self.assertEqual(r.payload, self.payload(r.id), what)
            self.assertEqual(r.attributes, self.stored_attributes(r.id), what)
            np.testing.assert_array_equal(r.vector,
                                          self.xb[self.row_of(r.id)], what)
            self.assertEqual(r.vector.dtype, np.float32, what)

    def test_records_of_found_ids_and_missing_ones(self):
        ids, found, unknown = self.asked()
        whole = self.client("whole")
        result = whole.get(ids, payloads=True, attributes=True, vectors=True)
        self.check_records(result, found, unknown, "whole")
        self.assertEqual(result.index_version, whole.info().version)
        self.assertEqual(whole.info().max_get_ids, MAX_GET_IDS)
        # Only what is asked for; named payload fields.
        bare = whole.get(ids)
        self.assertEqual([r.id for r in bare.records], found)
        for r in bare.records:
            self.assertEqual((r.payload, r.attributes, r.vector),
                             (None, None, None))
        pages = whole.get(found, payloads=["page"]).by_id()
        for i in found:
            self.assertEqual(pages[i].payload,
                             {k: v for k, v in self.payload(i).items()
                              if k == "page"})
        # Every id unknown: no records, every id missing, no error.
        nothing = whole.get([1, 2, 1])
        self.assertEqual((nothing.records, nothing.missing), ((), (1, 2)))

    def test_bad_requests_are_refused_by_name(self):
        from knnd_client import FailedPrecondition, InvalidArgument
        whole = self.client("whole")
        with self.assertRaisesRegex(ValueError, r"ids\[1\]=-3 is negative"):
            whole.get([1, -3])
        with self.assertRaisesRegex(ValueError, "ids is empty"):
            whole.get([])
        with self.assertRaises(InvalidArgument) as raised:
            whole.get(list(range(MAX_GET_IDS + 1)))
        self.assertIn(f"ids holds {MAX_GET_IDS + 1} ids, more than "
                      f"max_get_ids={MAX_GET_IDS}", raised.exception.details())
        # The server's own check of a negative id (a client that sends it).
        status, body = post(self.daemons["whole"].http, "/v1/get",
                            {"ids": ["4", -2]})
        self.assertEqual((status, body["code"]), (400, "INVALID_ARGUMENT"))
        self.assertIn("ids[1]=-2 is negative", body["message"])
        bare = self.client("bare")
        for kwargs, needs in (({"vectors": True}, "--keep_vectors"),
                              ({"attributes": True}, "--attributes"),
                              ({"payloads": True}, "--payloads")):
            with self.assertRaises(FailedPrecondition) as raised:
                bare.get([int(self.ids[0])], **kwargs)
            self.assertIn(needs, raised.exception.details())
            self.assertIn("bare.index", raised.exception.details())
        # The token Search needs, Get needs too.
        with self.assertRaises(grpc.RpcError) as raised:
            self.client("whole", token=None).get([1])
        self.assertEqual(raised.exception.code(),
                         grpc.StatusCode.UNAUTHENTICATED)
        status, _ = post(self.daemons["whole"].http, "/v1/get", {"ids": [1]},
                         token=None)
        self.assertEqual(status, 401)

    def check_http(self, name, ids, found, unknown):
        """POST /v1/get answers what gRPC answers: ids as strings, payloads
        and attributes as JSON objects, vectors bit for bit."""
        from knnd_client import KnnClient
        status, body = post(self.daemons[name].http, "/v1/get", {
            "ids": [str(i) if n % 2 else i for n, i in enumerate(ids)],
            "payloads": {"all_fields": True}, "with_attributes": True,
            "with_vectors": True})
        self.assertEqual(status, 200, body)
        client = KnnClient(self.daemons[name].address, timeout_s=30,
                           bearer_token=TOKEN)
        self.addCleanup(client.close)
        want = client.get(ids, payloads=True, attributes=True, vectors=True)
        self.assertEqual([r["id"] for r in body["records"]],
                         [str(i) for i in found], name)
        self.assertEqual(body.get("missing"), [str(i) for i in unknown], name)
        self.assertEqual(body["index_version"], str(want.index_version), name)
        for got, r in zip(body["records"], want.records):
            self.assertEqual(got["payload"], r.payload, name)
            self.assertEqual(got["attributes"], r.attributes, name)
            self.assertEqual([struct.pack("<f", v) for v in got["vector"]],
                             [struct.pack("<f", v) for v in r.vector], name)

    def test_http_answers_equal_grpcs(self):
        ids, found, unknown = self.asked()
        self.check_http("whole", ids, found, unknown)
        status, body = post(self.daemons["whole"].http, "/v1/get",
                            {"ids": [1, 2]})
        self.assertEqual((status, body["records"], body["missing"]),
                         (200, [], ["1", "2"]))

    def test_knnctl_get_prints_one_json_line_per_id(self):
        found = [int(i) for i in self.ids[[3, 8]]]
        run = subprocess.run(
            [ARGS.knnctl, "get", "--addr", self.daemons["whole"].address,
             "--token_file", self.tokens, "--ids",
             f"{found[0]},7,{found[1]},{found[0]}", "--fields", "page",
             "--attributes", "--vectors"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = [json.loads(line) for line in run.stdout.splitlines()]
        self.assertEqual([line["id"] for line in lines],
                         [str(found[0]), str(found[1]), "7"])
        self.assertEqual(lines[2], {"id": "7", "missing": True})
        for line, i in zip(lines, found):
            self.assertEqual(line["payload"],
                             {k: v for k, v in self.payload(i).items()
                              if k == "page"})
            self.assertEqual(line["attributes"], self.stored_attributes(i))
            np.testing.assert_array_equal(
                np.array(line["vector"], np.float32), self.xb[self.row_of(i)])
        bad = subprocess.run([ARGS.knnctl, "get", "--ids", "1,x"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("'x' is not an integer id", bad.stderr)

    def test_async_sharded_and_front_answer_the_same(self):
        from knnd_client import (AsyncKnnClient, AsyncShardedKnnClient,
                                 ShardedKnnClient)
        ids, found, unknown = self.asked()
        sharded = ShardedKnnClient([self.daemons["shard0"].address,
                                    self.daemons["shard1"].address],
                                   timeout_s=30)
        self.addCleanup(sharded.close)
        everything = {"payloads": True, "attributes": True, "vectors": True}
        self.check_records(sharded.get(ids, **everything), found, unknown,
                           "ShardedKnnClient")
        self.check_records(self.client("front").get(ids, **everything),
                           found, unknown, "front")
        self.check_http("front", ids, found, unknown)

        async def main():
            async with AsyncKnnClient(self.daemons["whole"].address,
                                      bearer_token=TOKEN) as client:
                whole = await client.get(ids, **everything)
            async with AsyncShardedKnnClient(
                    [self.daemons["shard0"].address,
                     self.daemons["shard1"].address]) as client:
                return whole, await client.get(ids, **everything)
        whole, sharded_async = asyncio.run(main())
        self.check_records(whole, found, unknown, "AsyncKnnClient")
        self.check_records(sharded_async, found, unknown,
                           "AsyncShardedKnnClient")
        # Each shard holds some of the ids and names the others missing.
        shard0 = self.client("shard0").get(found)
        shard1 = self.client("shard1").get(found)
        self.assertEqual(sorted([r.id for r in shard0.records] +
                                [r.id for r in shard1.records]), sorted(found))
        self.assertEqual(sorted(shard0.missing + shard1.missing),
                         sorted(found))
        # The front checks the shards' max_get_ids before sending; a
        # shard's refusal comes back naming the shard.
        from knnd_client import InvalidArgument
        with self.assertRaises(InvalidArgument) as raised:
            self.client("front").get(list(range(1025)))
        self.assertIn("more than max_get_ids=1024", raised.exception.details())
        with self.assertRaises(InvalidArgument) as raised:
            self.client("front").get([1, 2], payloads=["nope"])
        self.assertIn("shards failed", raised.exception.details())
        self.assertIn("nope", raised.exception.details())


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True)

#!/usr/bin/python3
"""knnd's HTTP/JSON listener (--http_listen) against gRPC on the same knnd,
with the standard library's http.client only:

- answers equal gRPC's for the same request: ids, distances bit for bit,
  payloads as JSON objects equal to gRPC's JSON bytes, every other field;
  base64 float32 vectors equal arrays; int64 ids as strings and numbers;
- every error's HTTP status, code name and message (bad JSON, wrong type,
  unknown field, knnd's own refusals with gRPC's message, tokens, routes,
  a 100 MB body answered 413 naming the limit without knnd's memory
  growing, the deadline header);
- keep-alive: many requests on one connection;
- a slowloris client and 200 half-open connections against one listener
  thread, while gRPC and HTTP searches still succeed, and the slow ones
  closed at the read timeout;
- the metrics' protocol label;
- health probes (/healthz/ready, /healthz/live) equal to grpc.health
  through a hot swap (SERVING throughout, searches answered) and through a
  drain (NOT_SERVING from SIGTERM, searches served with Connection: close
  during the shutdown delay, then the port closed);
- TLS and mutual TLS from the certificate files gRPC uses.

  http_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl --source-dir .
"""
import base64
import http.client
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time
import unittest

import numpy as np

from knnd_harness import (Daemon, free_port, generate_stubs, make_ca, make_cert,
                          make_tls_files, unittest_main)

ARGS = None
ROWS = 3000
DIM = 16
TOKEN = "http-test-token-0123456789"
FLOAT_FIELDS = ("distances", "approx_distances", "vector_scores", "text_scores")


def rss_anon(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def send(conn, method, path, body=None, headers=None, token=TOKEN):
    """One request on `conn`: (status, {lower-case header: value}, body)."""
    h = {"Content-Type": "application/json"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    h.update(headers or {})
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def call(address, method, path, body=None, headers=None, token=TOKEN, timeout=60):
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        return send(conn, method, path, body, headers, token)
    finally:
        conn.close()


def f32_bits(value):
    """The float32 bits of a JSON number (or "Infinity", "-Infinity")."""
    return struct.pack("<f", float(value))


def build_index(tmp, knnctl, rows, dim, seed, *extra):
    """A knnctl index with own 63-bit ids and payloads (objects with
    escaped quotes, unicode and nesting, and plain strings), built with
    knnctl build's `extra` flags; returns (path, vectors, ids)."""
    rng = np.random.default_rng(seed)
    xb = rng.standard_normal((rows, dim)).astype("float32")
    ids = rng.integers(0, 2**63 - 1, rows, dtype=np.int64)
    np.save(os.path.join(tmp, "base.npy"), xb)
    np.save(os.path.join(tmp, "ids.npy"), ids)
    with open(os.path.join(tmp, "payloads.jsonl"), "w", encoding="utf-8") as out:
        for r in range(rows):
            p = (f"plain \"text\" {r}" if r % 5 == 0 else
                 {"text": f"chunk {r}: caf\u00e9 \u2028 \"q\" \\", "page": r,
                  "tags": [r % 3, {"deep": [True, None, 1.5]}]})
            out.write(json.dumps(p) + "\n")
    path = os.path.join(tmp, "http.index")
    subprocess.run([knnctl, "build", "--input", os.path.join(tmp, "base.npy"),
                    "--output", path, "--nlist", "16", "--ids",
                    os.path.join(tmp, "ids.npy"), "--payloads",
                    os.path.join(tmp, "payloads.jsonl"), *extra],
                   check=True, capture_output=True)
    return path, xb, ids


class WithKnnd(unittest.TestCase):
    """Starts knnd over the test index with `config` and HTTP on; the
    generated gRPC stubs are imported as pb, health_pb, health_grpc."""

    @classmethod
    def start(cls, name, config, index, extra=(), wait=True):
        global grpc, pb, health_pb, health_grpc, json_format
        import grpc
        from google.protobuf import json_format
        from health_v1 import health_pb2 as health_pb
        from health_v1 import health_pb2_grpc as health_grpc
        from knnd.v1 import knn_service_pb2 as pb
        path = os.path.join(cls.tmp.name, f"{name}.textproto")
        with open(path, "w") as f:
            f.write(config)
        http_address = f"127.0.0.1:{free_port()}"
        daemon = Daemon(ARGS.knnd, ["--config", path, "--index", index,
                                    "--workers", "2", "--http_listen", http_address,
                                    *extra],
                        log_path=os.path.join(cls.tmp.name, f"{name}.log"))
        daemon.http = http_address
        if wait and not daemon.wait_serving(120):
            daemon.stop()
            raise RuntimeError(f"knnd ({name}) did not start: " + daemon.read_log())
        return daemon

    def assertSameAnswer(self, response, body):
        """The gRPC answer and the HTTP one (its JSON) are the same."""
        g = json_format.MessageToDict(response, preserving_proto_field_name=True)
        h = json.loads(body)
        for field in FLOAT_FIELDS:
            g.pop(field, None)
            self.assertEqual([f32_bits(v) for v in h.pop(field, [])],
                             [struct.pack("<f", v) for v in getattr(response, field)],
                             field)
        g.pop("payloads", None)
        self.assertEqual(h.pop("payloads", []),
                         [json.loads(p) if p else None for p in response.payloads])
        self.assertEqual(h, g)


class HttpApiTest(WithKnnd):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.source_dir, os.path.join(cls.tmp.name, "stubs"))
        cls.index, cls.xb, cls.ids = build_index(cls.tmp.name, ARGS.knnctl, ROWS,
                                                 DIM, seed=11)
        tokens = os.path.join(cls.tmp.name, "tokens")
        with open(tokens, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(tokens, 0o600)
        cls.daemon = cls.start("api", f'search_token_file: "{tokens}"\n'
                               "http_read_timeout_ms: 1000\n"
                               "http_max_body_bytes: 1048576\n"
                               "http_threads: 1\n", cls.index)
        cls.stub = cls.daemon.stub()
        rng = np.random.default_rng(5)
        cls.xq = (cls.xb[:8] + 0.05 * rng.standard_normal((8, DIM))).astype("float32")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.tmp.cleanup()

    def http(self, method, path, body=None, headers=None, token=TOKEN):
        return call(self.daemon.http, method, path, body, headers, token)

    def grpc_search(self, body):
        request = json_format.Parse(json.dumps(body), pb.SearchRequest())
        return self.stub.Search(request, timeout=60,
                                metadata=(("authorization", f"Bearer {TOKEN}"),))

    def grpc_error(self, body):
        with self.assertRaises(grpc.RpcError) as err:
            self.grpc_search(body)
        return err.exception

    def test_answers_equal_grpcs(self):
        q = self.xq
        own = [int(i) for i in self.ids[:40]]
        for body in [
                {"vectors": q[0].tolist(), "k": 5},
                {"vectors": q[:3].ravel().tolist(), "k": 7, "nprobe": 4,
                 "payloads": {"all_fields": True}},
                {"vectors_f32le": base64.b64encode(q[:2].tobytes()).decode(), "k": 4,
                 "refine_factor": 3, "payloads": {"fields": ["text", "page"]}},
                {"vectors": q[:2].ravel().tolist(), "k": 6,
                 "allowed_ids": [str(i) for i in own], "payloads": {"all_fields": True}},
                {"vectors": q[:2].ravel().tolist(), "k": 3, "results_as_bytes": True},
                # Fewer allowed rows than k: padded with -1, +Infinity, null.
                {"vectors": q[0].tolist(), "k": 5, "allowed_ids": own[:2],
                 "payloads": {"all_fields": True}},
        ]:
            status, headers, data = self.http("POST", "/v1/search", body)
            self.assertEqual(status, 200, data)
            self.assertEqual(headers["content-type"], "application/json")
            self.assertSameAnswer(self.grpc_search(body), data)
        padded = json.loads(data)
        self.assertEqual(padded["ids"][2:], ["-1"] * 3)
        self.assertEqual(padded["distances"][2:], ["Infinity"] * 3)
        self.assertEqual(padded["payloads"][2:], [None] * 3)

    def test_base64_vectors_equal_arrays(self):
        q = self.xq[:4]
        array = self.http("POST", "/v1/search", {"vectors": q.ravel().tolist(), "k": 5})
        packed = self.http("POST", "/v1/search", {
            "vectors_f32le": base64.b64encode(q.astype("<f4").tobytes()).decode(),
            "k": 5})
        self.assertEqual(array[0], 200)
        self.assertEqual(array[2], packed[2])

    def test_int64_ids_as_strings_and_numbers(self):
        own = [int(i) for i in self.ids[100:130]]
        self.assertTrue(any(i > 2**53 for i in own))
        q = self.xb[100:102].ravel().tolist()
        strings = self.http("POST", "/v1/search",
                            {"vectors": q, "k": 5, "allowed_ids": [str(i) for i in own]})
        numbers = self.http("POST", "/v1/search",
                            {"vectors": q, "k": 5, "allowed_ids": own})
        self.assertEqual(strings[0], 200, strings[2])
        self.assertEqual(strings[2], numbers[2])
        ids = json.loads(strings[2])["ids"]
        self.assertTrue(all(isinstance(i, str) for i in ids))
        self.assertEqual(int(ids[0]), own[0])  # each query's own row first
        self.assertEqual(int(ids[5]), own[1])
        self.assertTrue(set(int(i) for i in ids) - {-1} <= set(own))

    def assertError(self, response, status, code, message):
        got_status, headers, data = response
        self.assertEqual(got_status, status, data)
        self.assertEqual(headers["content-type"], "application/json")
        body = json.loads(data)
        self.assertEqual(body["code"], code, data)
        self.assertIn(message, body["message"])
        return body

    def test_each_error_has_its_status_code_and_message(self):
        q = self.xq[0].tolist()
        for body, message in [
                ('{"k": 5, "vectors": [1, 2', "knnd.v1.SearchRequest"),
                ('{"k": "five"}', "five"),
                ('{"k": 5, "nprobes": 3}', "nprobes"),
                ('{"k": 5, "vectors": {"a": 1}}', "vectors"),
                ("[]", "knnd.v1.SearchRequest")]:
            self.assertError(self.http("POST", "/v1/search", body), 400,
                             "INVALID_ARGUMENT", message)
        # knnd's own refusals: gRPC's code and message.
        for body in [{"vectors": q, "k": 0}, {"vectors": q[:5], "k": 3},
                     {"vectors": q, "k": 5000}, {"vectors": q, "k": 3, "nprobe": 999},
                     {"vectors": q, "k": 3, "refine_factor": 100},
                     {"vectors": q, "k": 3, "payloads": {"fields": ["nope"]}}]:
            err = self.grpc_error(body)
            self.assertEqual(err.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertError(self.http("POST", "/v1/search", body), 400,
                             "INVALID_ARGUMENT", err.details())
        self.assertError(self.http("POST", "/v1/search", {"vectors": q, "k": 3},
                                   token=None), 401, "UNAUTHENTICATED",
                         "authorization: Bearer <token>")
        self.assertError(self.http("POST", "/v1/search", {"vectors": q, "k": 3},
                                   token="not-the-token-0123456789"), 401,
                         "UNAUTHENTICATED", "unknown bearer token")
        self.assertError(self.http("POST", "/v1/searches", {}), 404, "NOT_FOUND",
                         "POST /v1/search")
        status, headers, _ = self.http("PUT", "/v1/search", {})
        self.assertEqual((status, headers["allow"]), (405, "POST"))
        # Index info: GET and POST, with the token.
        status, _, data = self.http("GET", "/v1/index_info")
        self.assertEqual((status, json.loads(data)["dim"]), (200, DIM))
        self.assertError(self.http("GET", "/v1/index_info", token=None), 401,
                         "UNAUTHENTICATED", "GetIndexInfo")

    def test_a_100_mb_body_is_refused_413_before_it_is_read(self):
        host, port = self.daemon.http.rsplit(":", 1)
        before = rss_anon(self.daemon.proc.pid)
        size = 100 << 20
        sock = socket.create_connection((host, int(port)))
        sock.sendall((f"POST /v1/search HTTP/1.1\r\nHost: x\r\nAuthorization: "
                      f"Bearer {TOKEN}\r\nContent-Length: {size}\r\n\r\n").encode())
        sent = [0]

        def stream():
            chunk = b"[" * (1 << 20)
            try:
                while sent[0] < size:
                    sock.sendall(chunk)
                    sent[0] += len(chunk)
            except OSError:
                pass  # knnd answered and closed
        sender = threading.Thread(target=stream)
        sender.start()
        response = http.client.HTTPResponse(sock)
        response.begin()
        data = response.read()
        sender.join()
        sock.close()
        self.assertEqual(response.status, 413, data)
        self.assertEqual(response.getheader("Connection"), "close")
        body = json.loads(data)
        self.assertEqual(body["code"], "RESOURCE_EXHAUSTED")
        self.assertIn(f"{size} bytes exceeds http_max_body_bytes=1048576",
                      body["message"])
        self.assertLess(sent[0], size)
        self.assertLess(rss_anon(self.daemon.proc.pid) - before, 16 << 20)
        # A body within the limit but over the largest request: knnd's own
        # refusal, after it is read.
        many = np.zeros((4097, 4), "float32").ravel().tolist()
        self.assertError(self.http("POST", "/v1/search", {"vectors": many, "k": 1,
                                                          "dim": 4}),
                         400, "INVALID_ARGUMENT", "dim=4 does not match")

    def test_the_deadline_header(self):
        q = self.xq[0].tolist()
        ok = self.http("POST", "/v1/search", {"vectors": q, "k": 3},
                       headers={"X-Knnd-Timeout-Ms": "60000"})
        self.assertEqual(ok[0], 200)
        # A deadline that has passed when the body has been read and parsed.
        big = {"vectors": np.ones((4000, DIM), "float32").ravel().tolist(), "k": 3}
        self.assertError(self.http("POST", "/v1/search", big,
                                   headers={"X-Knnd-Timeout-Ms": "1"}),
                         504, "DEADLINE_EXCEEDED", "deadline had passed")
        self.assertError(self.http("POST", "/v1/search", {"vectors": q, "k": 3},
                                   headers={"X-Knnd-Timeout-Ms": "soon"}),
                         400, "INVALID_ARGUMENT", "X-Knnd-Timeout-Ms")

    def test_keep_alive_reuses_one_connection(self):
        host, port = self.daemon.http.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        before = self.http_calls("OK")
        try:
            status, headers, _ = send(conn, "POST", "/v1/search",
                                      {"vectors": self.xq[0].tolist(), "k": 3})
            first = conn.sock
            for i in range(19):
                status, headers, _ = send(conn, "POST", "/v1/search",
                                          {"vectors": self.xq[i % 8].tolist(), "k": 3})
                self.assertEqual(status, 200)
                self.assertIsNot(headers.get("connection"), "close")
            self.assertIs(conn.sock, first)
        finally:
            conn.close()
        self.assertEqual(self.http_calls("OK") - before, 20)

    def http_calls(self, code):
        return self.daemon.metric(
            f'grpc_server_handled_total{{grpc_code="{code}",grpc_method="Search",'
            'grpc_service="knnd.v1.KnnService",grpc_type="unary",protocol="http"}')

    def test_slow_and_half_open_clients_hold_no_thread(self):
        host, port = self.daemon.http.rsplit(":", 1)
        half_open = [socket.create_connection((host, int(port))) for _ in range(200)]
        partial = [socket.create_connection((host, int(port))) for _ in range(20)]
        for s in partial:
            s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Le")
        slow = socket.create_connection((host, int(port)))
        slow.sendall(b"POST /v1/search HTTP/1.1\r\n")
        stop = threading.Event()
        closed_after = []

        def slowloris():
            start = time.monotonic()
            try:
                while not stop.is_set():
                    slow.sendall(b"X")  # a header byte a second
                    if stop.wait(1.0):
                        break
                    slow.settimeout(0.01)
                    try:
                        if slow.recv(1) == b"":
                            break
                    except socket.timeout:
                        pass
            except OSError:
                pass
            closed_after.append(time.monotonic() - start)
        t = threading.Thread(target=slowloris)
        t.start()
        try:
            # The one listener thread serves HTTP meanwhile; gRPC too.
            for i in range(10):
                status, _, _ = self.http("POST", "/v1/search",
                                         {"vectors": self.xq[i % 8].tolist(), "k": 3})
                self.assertEqual(status, 200)
                self.assertEqual(len(self.grpc_search(
                    {"vectors": self.xq[i % 8].tolist(), "k": 3}).ids), 3)
            t.join(timeout=30)
            self.assertFalse(t.is_alive(), "the slowloris connection was not closed")
            # Closed at the read timeout (1 s), not by the client.
            self.assertLess(closed_after[0], 10)
            for s in half_open[:5] + partial[:5]:
                s.settimeout(30)
                self.assertEqual(s.recv(1), b"")  # closed by knnd
        finally:
            stop.set()
            t.join()
            for s in half_open + partial + [slow]:
                s.close()

    def test_metrics_count_http_calls_under_their_protocol(self):
        before = self.http_calls("INVALID_ARGUMENT")
        self.http("POST", "/v1/search", {"vectors": [1.0], "k": 3})
        self.assertEqual(self.http_calls("INVALID_ARGUMENT") - before, 1)


class HttpLifecycleTest(WithKnnd):
    """Health probes through a hot swap and a drain."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.source_dir, os.path.join(cls.tmp.name, "stubs"))
        cls.index, cls.xb, _ = build_index(cls.tmp.name, ARGS.knnctl, 1000, DIM, seed=3)
        cls.versions = os.path.join(cls.tmp.name, "versions")
        cls.publish()

    @classmethod
    def publish(cls):
        subprocess.run([ARGS.knnctl, "publish", "--index", cls.index, "--dir",
                        cls.versions], check=True, capture_output=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def probe(self, daemon, path):
        try:
            status, _, data = call(daemon.http, "GET", path, timeout=5)
            return status, json.loads(data)["status"]
        except OSError:
            return "refused", None

    def grpc_health(self, channel, service):
        try:
            return health_pb.HealthCheckResponse.ServingStatus.Name(
                health_grpc.HealthStub(channel).Check(
                    health_pb.HealthCheckRequest(service=service), timeout=5).status)
        except grpc.RpcError as e:
            return e.code().name

    def test_probes_follow_grpc_health_through_a_swap_and_a_drain(self):
        daemon = self.start("life", "shutdown_delay_ms: 1500\n"
                            "drain_grace_period_ms: 5000\n", self.versions)
        self.addCleanup(daemon.stop)
        from knnd_harness import channel
        ch = channel(daemon.address)
        self.addCleanup(ch.close)
        stop = threading.Event()
        seen = []  # (phase, ready, live, grpc ready, grpc live, search status, close)
        phase = ["swap"]

        def watch():
            q = self.xb[0].tolist()
            while not stop.is_set():
                ready = self.probe(daemon, "/healthz/ready")
                live = self.probe(daemon, "/healthz/live")
                g_ready = self.grpc_health(ch, "knnd.v1.KnnService")
                g_live = self.grpc_health(ch, "")
                try:
                    status, headers, data = call(daemon.http, "POST", "/v1/search",
                                                 {"vectors": q, "k": 3}, timeout=5)
                    search = (status, json.loads(data).get("index_version"),
                              headers.get("connection"))
                except OSError:
                    search = ("refused", None, None)
                seen.append((phase[0], ready, live, g_ready, g_live, search))
                if ready[0] == "refused" and phase[0] == "drain":
                    return
                time.sleep(0.02)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            time.sleep(0.3)
            self.publish()  # version 2
            daemon.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(
                    s[5][1] == "2" for s in seen):
                time.sleep(0.05)
            time.sleep(0.3)
            phase[0] = "drain"
            daemon.proc.send_signal(signal.SIGTERM)
            self.assertEqual(daemon.proc.wait(timeout=60), 0, daemon.read_log())
        finally:
            stop.set()
            watcher.join()
        swap = [s for s in seen if s[0] == "swap"]
        self.assertTrue(any(s[5][1] == "1" for s in swap))
        self.assertTrue(any(s[5][1] == "2" for s in swap), daemon.read_log())
        for _, ready, live, g_ready, g_live, search in swap:
            self.assertEqual((ready, live, g_ready, g_live),
                             ((200, "SERVING"), (200, "SERVING"), "SERVING", "SERVING"))
            self.assertEqual(search[0], 200)
        drain = [s for s in seen if s[0] == "drain"]
        # SERVING until SIGTERM, then NOT_SERVING on both protocols while
        # searches are still served (each answer closing its connection),
        # then the port closed.
        states = [s[1][1] for s in drain]
        first_down = states.index("NOT_SERVING")
        self.assertTrue(all(s == "SERVING" for s in states[:first_down]), states)
        self.assertTrue(all(s in ("NOT_SERVING", None) for s in states[first_down:]),
                        states)
        self.assertEqual(drain[-1][1][0], "refused")
        served_down = [s for s in drain[first_down:]
                       if s[1] == (503, "NOT_SERVING") and s[5][0] == 200]
        self.assertTrue(served_down, "no search answered during the shutdown delay")
        for _, ready, live, g_ready, g_live, search in drain[first_down + 1:]:
            if ready[0] == 503:
                self.assertEqual(live, (503, "NOT_SERVING"))
                self.assertIn(g_ready, ("NOT_SERVING", "UNAVAILABLE"))
                self.assertIn(g_live, ("NOT_SERVING", "UNAVAILABLE"))
            if search[0] == 200:
                self.assertEqual(search[2], "close")
            self.assertIn(search[0], (200, 503, "refused"))


class HttpFrontTest(WithKnnd):
    """A front of shards (--shard_targets) serves the same routes over its
    merged answers."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.source_dir, os.path.join(cls.tmp.name, "stubs"))
        split, cls.xb, _ = build_index(cls.tmp.name, ARGS.knnctl, 2000, DIM, 6,
                                       "--shards", "2")
        cls.shards = [cls.start(f"shard{s}", "", f"{split}.shard-{s}-of-2")
                      for s in range(2)]
        path = os.path.join(cls.tmp.name, "front.textproto")
        with open(path, "w") as f:
            f.write("".join(f'shard_targets: "{d.address}"\n' for d in cls.shards))
        cls.front = Daemon(ARGS.knnd, ["--config", path, "--http_listen",
                                       f"127.0.0.1:{free_port()}"],
                           log_path=os.path.join(cls.tmp.name, "front.log"))
        cls.front.http = cls.front.proc.args[cls.front.proc.args.index(
            "--http_listen") + 1]
        if not cls.front.wait_serving(120):
            raise RuntimeError("the front did not start: " + cls.front.read_log())

    @classmethod
    def tearDownClass(cls):
        for d in [cls.front, *cls.shards]:
            d.stop()
        cls.tmp.cleanup()

    def test_the_front_answers_http_as_grpc(self):
        body = {"vectors": self.xb[:3].ravel().tolist(), "k": 5, "refine_factor": 2,
                "payloads": {"all_fields": True}}
        status, _, data = call(self.front.http, "POST", "/v1/search", body, token=None)
        self.assertEqual(status, 200, data)
        self.assertSameAnswer(self.front.stub().Search(
            json_format.Parse(json.dumps(body), pb.SearchRequest()), timeout=60), data)
        status, _, data = call(self.front.http, "GET", "/v1/index_info", token=None)
        self.assertEqual((status, json.loads(data)["shard"]["shard_count"]), (200, 2))
        self.assertEqual(call(self.front.http, "GET", "/healthz/ready")[0], 200)


class HttpTlsTest(WithKnnd):
    """TLS and mutual TLS from the files gRPC uses."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.source_dir, os.path.join(cls.tmp.name, "stubs"))
        d = cls.tmp.name
        cls.index, cls.xb, _ = build_index(d, ARGS.knnctl, 1000, DIM, seed=4)
        cls.ca, cls.cert, cls.key = make_tls_files(d)
        cls.client = make_cert(d, "client", (cls.ca, os.path.join(d, "ca.key")))
        cls.stranger = make_cert(d, "stranger", make_ca(d, "other-ca"))
        cls.daemon = cls.start("tls", f'tls_cert_file: "{cls.cert}"\n'
                               f'tls_key_file: "{cls.key}"\n'
                               f'tls_client_ca_file: "{cls.ca}"\n', cls.index,
                               wait=False)
        deadline = time.monotonic() + 120
        while cls.https("GET", "/healthz/ready")[0] != 200:
            if time.monotonic() > deadline or cls.daemon.proc.poll() is not None:
                cls.daemon.stop()
                raise RuntimeError("knnd (TLS) did not start: " + cls.daemon.read_log())
            time.sleep(0.1)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.tmp.cleanup()

    @classmethod
    def https(cls, method, path, body=None, client=None):
        context = ssl.create_default_context(cafile=cls.ca)
        if client:
            context.load_cert_chain(*client)
        host, port = cls.daemon.http.rsplit(":", 1)
        conn = http.client.HTTPSConnection("localhost", int(port), context=context,
                                           timeout=30)
        try:
            return send(conn, method, path, body, token=None)
        except (OSError, ssl.SSLError) as e:
            return "failed", {}, str(e).encode()
        finally:
            conn.close()

    def test_mutual_tls_serves_clients_with_a_certificate_of_the_ca(self):
        body = {"vectors": self.xb[7].tolist(), "k": 4}
        status, _, data = self.https("POST", "/v1/search", body, client=self.client)
        self.assertEqual(status, 200, data)
        # gRPC over the same files gives the same answer.
        credentials = grpc.ssl_channel_credentials(
            open(self.ca, "rb").read(), open(self.client[1], "rb").read(),
            open(self.client[0], "rb").read())
        with grpc.secure_channel(self.daemon.address, credentials, options=[
                ("grpc.ssl_target_name_override", "localhost")]) as ch:
            from knnd.v1 import knn_service_pb2_grpc as pb_grpc
            r = pb_grpc.KnnServiceStub(ch).Search(
                json_format.Parse(json.dumps(body), pb.SearchRequest()), timeout=30)
        self.assertEqual(json.loads(data)["ids"], [str(i) for i in r.ids])

    def test_a_client_without_an_accepted_certificate_is_refused_but_probes_pass(self):
        body = {"vectors": self.xb[7].tolist(), "k": 4}
        for client, message in [(None, "presented none"),
                                (self.stranger, "not accepted")]:
            status, _, data = self.https("POST", "/v1/search", body, client=client)
            self.assertEqual(status, 401, data)
            self.assertEqual(json.loads(data)["code"], "UNAUTHENTICATED")
            self.assertIn(message, json.loads(data)["message"])
        # Kubernetes' HTTPS probes carry no certificate.
        self.assertEqual(self.https("GET", "/healthz/ready")[0], 200)
        self.assertEqual(self.https("GET", "/healthz/live")[0], 200)

    def test_plaintext_http_is_not_served_on_a_tls_port(self):
        try:
            status = call(self.daemon.http, "GET", "/healthz/ready", timeout=5)[0]
        except (OSError, http.client.HTTPException):
            status = "failed"
        self.assertNotEqual(status, 200)


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True)

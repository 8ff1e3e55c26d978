#!/usr/bin/python3
"""knnd-client's KnnClient (knnd_client/client.py), installed in each
route's venv (client_testing.py):
  - against a small fake server that counts attempts (FakeServerTest, the
    contract AsyncKnnClient keeps too): bad inputs raise before any RPC;
    pushback and backoff timings; no retry past the deadline; bearer-token
    metadata; the fork guard;
  - against a live knnd started here (LiveKnndTest): results equal those
    of the raw generated stub (protoc 3.21 gencode, so in the pypi route
    this is old gencode on the newest runtime) and of knnctl (the C++
    client); server errors and deadlines (with AsyncKnnClient's beside
    them); RESOURCE_EXHAUSTED from a full gate is retried after the
    server's pushback until every request succeeds; round_robin over a
    headless Service (a DNS name with two addresses, served by a fake DNS
    server, each address a knnd) and around a replica that is not
    serving; TLS and bearer tokens; max_connection_age_ms makes the server
    close connections (GOAWAY); after a knnd restart on the same address
    the client answers within 2 s of knnd serving.

  client_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl --source-dir . \
      --venvs BUILD/tests/python_client_venvs [unittest args]
(unittest args, e.g. LiveKnndTest.test_tls_and_bearer_tokens, select tests;
they run in both routes.)
"""
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import concurrent.futures
import unittest

import numpy as np

import client_testing
from client_testing import (SEARCH_OK, ClientContract, FakeDns, LiveKnnd,
                            fork_and_call, make_tls_files)
from knnd_harness import free_port

ARGS = None


class FakeServerTest(ClientContract, unittest.TestCase):
    """KnnClient against the fake server."""

    def connect(self, address, **client_args):
        from knnd_client import KnnClient
        client = KnnClient(address, **client_args)
        self.addCleanup(client.close)
        self.client = client
        return client.search

    def test_bad_client_arguments_raise(self):
        from knnd_client import AsyncKnnClient, KnnClient
        with self.assertRaisesRegex(ValueError, "timeout_s=-1 must be > 0"):
            KnnClient("127.0.0.1:1", timeout_s=-1)
        token = "tok en-that-is-long-enough"
        with self.assertRaisesRegex(ValueError, "whitespace") as err:
            KnnClient("127.0.0.1:1", bearer_token=token)
        self.assertNotIn(token, str(err.exception), "the token was echoed")
        with self.assertRaisesRegex(ValueError, "knnd accepts 16 to 4096"):
            KnnClient("127.0.0.1:1", bearer_token="short")
        with self.assertRaisesRegex(RuntimeError, "running event loop"):
            AsyncKnnClient("127.0.0.1:1")

        async def zero_slots():
            AsyncKnnClient("127.0.0.1:1", max_concurrent_calls=0)
        with self.assertRaisesRegex(ValueError, "max_concurrent_calls=0 must be >= 1"):
            asyncio.run(zero_slots())

    def test_a_client_created_before_fork_refuses_in_the_child(self):
        from knnd_client import AsyncKnnClient
        fake, _ = self.serve(("ok",))
        client = self.client
        q = np.ones((1, 4), np.float32)
        client.search(q, 2)  # connected: gRPC's threads run in the parent

        def in_child():
            client.close()  # drops the inherited channel, must not hang
            client.search(q, 2)
        report = fork_and_call(in_child)
        self.assertRegex(report, r"^RuntimeError: this KnnClient was created "
                         rf"in process {os.getpid()} and is used in process \d+")
        self.assertIn("post_fork", report)

        async def async_case():
            aclient = AsyncKnnClient(fake.address)
            await aclient.search(q, 2)
            # In the child, the first step of the coroutine must raise
            # (before it awaits anything on the inherited loop).
            report = fork_and_call(lambda: aclient.search(q, 2).send(None))
            await aclient.close()
            return report
        report = asyncio.run(async_case())
        self.assertRegex(report, r"^RuntimeError: this AsyncKnnClient was created")
        self.assertEqual(len(fake.calls), 2, "the children made RPCs")
        self.assertEqual(client.search(q, 2).ids.tolist(), [[0, 1]])



    def test_close_after_retried_calls_leaves_no_thread_failing(self):
        # A retry waits with the channel watched. grpcio's connectivity
        # poller outlives a watch by up to 0.2 s, and a second watch within
        # that time asked it to connect once more: when close() came first
        # it called the closed channel and died with "Cannot invoke RPC:
        # Channel closed!", a thread traceback on stderr. Rounds of a call
        # retried twice, then close(); every thread a round started is
        # waited for, and none may end in threading.excepthook.
        import grpc
        from knnd_client import KnnClient, RetryPolicy
        unavailable = ("fail", grpc.StatusCode.UNAVAILABLE, 10)
        fake = client_testing.FakeKnnd([unavailable, unavailable, ("ok",)])
        self.addCleanup(fake.stop)
        failures = []
        hook = threading.excepthook
        threading.excepthook = lambda args: failures.append(
            f"{args.thread.name}: {args.exc_type.__name__}: {args.exc_value}")
        self.addCleanup(setattr, threading, "excepthook", hook)
        for _ in range(10):
            with fake.lock:
                fake.calls.clear()  # the script starts again
            before = set(threading.enumerate())
            client = KnnClient(fake.address, timeout_s=5,
                               retry=RetryPolicy(max_attempts=3))
            ids = client.search(np.ones((1, 4), np.float32), 2).ids
            client.close()
            self.assertEqual(ids.tolist(), [[0, 1]])
            self.assertEqual(len(fake.calls), 3)
            # The fake server's pool threads live on; gRPC's end.
            for thread in set(threading.enumerate()) - before:
                if not thread.name.startswith("ThreadPoolExecutor"):
                    thread.join(5)
                    self.assertFalse(thread.is_alive(), thread.name)
        self.assertEqual(failures, [])


class LiveKnndTest(LiveKnnd):
    """KnnClient against knnd serving the test index."""

    def test_installed_package_is_used(self):
        import knnd_client
        self.assertTrue(knnd_client.__file__.startswith(sys.prefix),
                        knnd_client.__file__)

    def test_round_trip_equals_raw_stub_and_knnctl(self):
        import grpc
        from knnd.v1 import knn_service_pb2 as raw_pb
        from knnd.v1 import knn_service_pb2_grpc as raw_grpc
        addr = self.start_knnd().address
        client = self.client(f"dns:///{addr}")
        q = self.xb[:50] + 0.1
        for nprobe in (None, 1, 8):
            result = client.search(q, 10, nprobe)
            ids, distances = result.ids, result.distances
            request = raw_pb.SearchRequest(vectors_f32le=q.tobytes(), k=10)
            if nprobe is not None:
                request.nprobe = nprobe
            with grpc.insecure_channel(addr) as channel:
                r = raw_grpc.KnnServiceStub(channel).Search(request, timeout=10)
            np.testing.assert_array_equal(ids, np.array(r.ids).reshape(50, 10))
            np.testing.assert_array_equal(
                distances, np.array(r.distances, np.float32).reshape(50, 10))
        # refine_factor 0 is plain IVF-PQ; > 0 needs the raw-vectors file,
        # which this index (written by python3-faiss) has not.
        ids0 = client.search(q, 10, 8, refine_factor=0).ids
        np.testing.assert_array_equal(ids0, client.search(q, 10, 8).ids)
        with self.assertRaises(grpc.RpcError) as refused:
            client.search(q, 10, 8, refine_factor=2)
        self.assertEqual(refused.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("--keep_vectors", refused.exception.details())
        # knnctl, the C++ client, prints ids and distances to 4 digits.
        npy = os.path.join(self.tmp.name, "queries.npy")
        np.save(npy, q)
        out = subprocess.run(
            [ARGS.knnctl, "search", "--addr", addr, "--queries", npy, "--k", "10",
             "--nprobe", "8", "--show", "50", "--batch", "50"],
            check=True, capture_output=True, text=True).stdout
        rows = re.findall(r"^query (\d+):(.*)$", out, re.M)
        self.assertEqual(len(rows), 50, out)
        pairs = [re.findall(r"(-?\d+)\(([^)]+)\)", row) for _, row in rows]
        np.testing.assert_array_equal(
            ids, np.array([[int(i) for i, _ in p] for p in pairs]))
        np.testing.assert_allclose(
            distances, np.array([[float(d) for _, d in p] for p in pairs]),
            rtol=1e-3)
        # Byte order and memory layout do not change the answer.
        for variant in (q.astype(">f4"), np.asfortranarray(q),
                        np.repeat(q, 2, axis=0)[::2]):
            np.testing.assert_array_equal(client.search(variant, 10, 8).ids, ids)
        # float16 queries travel as vectors_f16le, half the bytes, and get
        # the answer of their values as float32 (in either byte order).
        half = q.astype(np.float16)
        result = client.search(half.astype(np.float32), 10, 8)
        want_ids, want_distances = result.ids, result.distances
        for variant in (half, half.astype(">f2")):
            result = client.search(variant, 10, 8)
            got_ids, got_distances = result.ids, result.distances
            np.testing.assert_array_equal(got_ids, want_ids)
            np.testing.assert_array_equal(got_distances, want_distances)
        # The allow-list reaches the server.
        ids = client.search(q[:4], 10, 64, allowed_ids=np.array([3, 30, 300])).ids
        self.assertEqual(sorted(ids[0, :3].tolist()), [3, 30, 300])
        self.assertEqual(ids[:, 3:].tolist(), [[-1] * 7] * 4)
        self.assertEqual(client.info().dim, 48)


    def test_server_errors_surface_as_the_clients_own_errors(self):
        """A refused call raises knnd_client's error type for its code
        (InvalidArgument, Unavailable, ...), whose str() is the code and
        knnd's message without gRPC's debug blob; it is still a
        grpc.RpcError (and grpc.aio.AioRpcError) with code() and
        details(), so code written against gRPC's errors keeps working."""
        import grpc
        import grpc.aio
        import knnd_client
        from knnd_client import AsyncKnnClient, KnnClient, RetryPolicy
        addr = self.start_knnd().address
        client = self.client(addr)
        with self.assertRaises(knnd_client.InvalidArgument) as err:
            client.search(np.ones((1, 16), np.float32), 3)
        self.assertIsInstance(err.exception, grpc.RpcError)
        self.assertIsInstance(err.exception, grpc.aio.AioRpcError)
        self.assertIsInstance(err.exception, knnd_client.KnndError)
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("dim=16 does not match the index dimension 48",
                      err.exception.details())
        self.assertTrue(str(err.exception).startswith("INVALID_ARGUMENT: dim=16"),
                        str(err.exception))
        self.assertNotIn("debug_error_string", str(err.exception))
        self.assertIsNone(err.exception.pushback_ms)
        self.assertIsInstance(err.exception.cause, grpc.RpcError)

        async def main():
            async with AsyncKnnClient(addr) as aclient:
                await aclient.search(np.ones((1, 16), np.float32), 3)
        with self.assertRaises(knnd_client.InvalidArgument) as err:
            asyncio.run(main())
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("dim=16 does not match", err.exception.details())
        self.assertNotIn("debug_error_string", str(err.exception))

        # Nothing listening: Unavailable once the retries are spent.
        with KnnClient(f"127.0.0.1:{free_port()}", timeout_s=2,
                       retry=RetryPolicy(max_attempts=1)) as nowhere:
            with self.assertRaises(knnd_client.Unavailable) as err:
                nowhere.search(np.ones((1, 48), np.float32), 3)
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertTrue(str(err.exception).startswith("UNAVAILABLE: "))

    def test_deadline_is_respected(self):
        import grpc
        from knnd_client import AsyncKnnClient
        addr = self.start_knnd().address
        client = self.client(addr)
        big = np.tile(self.xb[:1024], (4, 1))
        start = time.monotonic()
        with self.assertRaises(grpc.RpcError) as err:
            client.search(big, 100, 64, timeout_s=0.005)
        self.assertEqual(err.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertLess(time.monotonic() - start, 0.5)

        async def main():
            async with AsyncKnnClient(addr) as aclient:
                await aclient.search(self.xb[:1], 1)
                start = time.monotonic()
                try:
                    await aclient.search(big, 100, 64, timeout_s=0.005)
                except grpc.RpcError as e:
                    return e, time.monotonic() - start
        error, elapsed = asyncio.run(main())
        self.assertEqual(error.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertLess(elapsed, 0.5)
        # The server dropped that work and still answers.
        ids = client.search(self.xb[:2], 5, timeout_s=10).ids
        self.assertEqual(ids[:, 0].tolist(), [0, 1])


    def test_full_gate_is_retried_after_pushback_until_all_succeed(self):
        import grpc
        from knnd_client import RetryPolicy
        from knnd.v1 import knn_service_pb2 as raw_pb
        from knnd.v1 import knn_service_pb2_grpc as raw_grpc
        addr = self.start_small_gate()
        q = self.xb[:256]
        retries = self.record_retries()
        client = self.client(addr, timeout_s=60, retry=RetryPolicy(max_attempts=1000))
        barrier = threading.Barrier(8)

        def flood(_):
            barrier.wait()
            return [client.search(q, 100, 64).ids for _ in range(3)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = [ids for r in pool.map(flood, range(8)) for ids in r]
        self.assert_flood_answered(results, retries)
        # What the client saw: knnd's own rejection and pushback value.
        errors = []

        def raw(_):
            with grpc.insecure_channel(addr) as channel:
                stub = raw_grpc.KnnServiceStub(channel)
                barrier.wait()
                try:
                    stub.Search(raw_pb.SearchRequest(
                        vectors_f32le=q.tobytes(), k=100, nprobe=64), timeout=60)
                except grpc.RpcError as e:
                    errors.append((e.code(), dict(e.trailing_metadata())))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(raw, range(8)))
        self.assertGreater(len(errors), 0)
        for code, metadata in errors:
            self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertEqual(metadata.get("grpc-retry-pushback-ms"), "100")


    def test_round_robin_over_a_headless_service(self):
        from knnd_client import AsyncKnnClient
        # Two replicas on one port, as pods behind a headless Service: one
        # name, one A record per replica.
        port = free_port()
        replicas = [self.start_daemon(address=f"{ip}:{port}")
                    for ip in ("127.0.0.1", "127.0.0.2")]
        for daemon in replicas:
            self.assertTrue(daemon.wait_serving(60), daemon.read_log())
        dns = FakeDns("knnd-headless.search.svc.cluster.local",
                      ["127.0.0.1", "127.0.0.2"])
        self.addCleanup(dns.close)
        target = (f"dns://127.0.0.1:{dns.port}/"
                  f"knnd-headless.search.svc.cluster.local:{port}")
        q = self.xb[:4]

        def served():
            return [d.scrape().get(SEARCH_OK, 0) for d in replicas]
        client = self.client(target, timeout_s=10)
        expected = client.search(q, 5).ids
        for _ in range(19):
            np.testing.assert_array_equal(client.search(q, 5).ids, expected)
        sync_counts = served()
        self.assertEqual(sum(sync_counts), 20)
        self.assertTrue(all(c >= 5 for c in sync_counts), sync_counts)

        async def main():
            async with AsyncKnnClient(target, timeout_s=10) as aclient:
                for _ in range(20):
                    await aclient.search(q, 5)
        asyncio.run(main())
        async_counts = [c - s for c, s in zip(served(), sync_counts)]
        self.assertEqual(sum(async_counts), 20)
        self.assertTrue(all(c >= 5 for c in async_counts), async_counts)
        # A service config in `options` replaces the client's own: with
        # pick_first every call goes to one replica.
        before = served()
        pinned = self.client(target, options=[("grpc.service_config", json.dumps(
            {"loadBalancingConfig": [{"pick_first": {}}]}))])
        for _ in range(6):
            pinned.search(q, 5)
        self.assertEqual(sorted(a - b for a, b in zip(served(), before)), [0, 6])

    def test_round_robin_skips_a_replica_that_is_not_serving(self):
        # knnd-client's round_robin watches grpc.health.v1: a replica that
        # turned NOT_SERVING (SIGTERM, during its shutdown delay, still
        # listening and serving) gets no new calls; a pick_first client
        # pinned to it still reaches it.
        import grpc
        replicas = [self.start_knnd("shutdown_delay_ms: 300000\n") for _ in range(2)]

        def into_delay(daemon):
            # SIGTERM, then wait until health says NOT_SERVING: the
            # replica is in its shutdown delay, still serving searches.
            if daemon.proc.poll() is None:
                daemon.proc.send_signal(signal.SIGTERM)
                while daemon.proc.poll() is None and daemon.serving():
                    time.sleep(0.01)
        # Runs before start_daemon's clean-up (clean-ups run last added
        # first), whose SIGTERM is then a second one, which ends the delay
        # (else the clean-up waits 60 s, then kills). replicas[0] gets its
        # first SIGTERM below.
        self.addCleanup(into_delay, replicas[1])
        target = "ipv4:" + ",".join(d.address for d in replicas)
        client = self.client(target, timeout_s=10)
        q = self.xb[:2]

        def served():
            return [d.scrape().get(SEARCH_OK, 0) for d in replicas]
        for _ in range(10):
            client.search(q, 5)
        self.assertTrue(all(c > 0 for c in served()), served())
        into_delay(replicas[0])
        # The channel learns it from its Watch stream, a moment later.
        time.sleep(0.5)
        before = served()
        for _ in range(20):
            client.search(q, 5)
        after = served()
        self.assertEqual([a - b for a, b in zip(after, before)], [0, 20])
        pinned = self.client(replicas[0].address)
        pinned.search(q, 5)  # still served during the delay
        self.assertEqual(served()[0], after[0] + 1)
        # Only replica 1 answers also when both are asked directly.
        with self.assertRaises(grpc.RpcError) as err:
            self.client(target, timeout_s=1,
                        options=[("grpc.service_config", json.dumps({
                            "loadBalancingConfig": [{"round_robin": {}}],
                            "healthCheckConfig": {"serviceName": "no.Such"}}))],
                        ).search(q, 5)
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_tls_and_bearer_tokens(self):
        import grpc
        from knnd_client import AsyncKnnClient, KnnClient, RetryPolicy
        ca, cert, key = make_tls_files(self.tmp.name)
        token = "search-token-" + "7" * 24
        tokens = os.path.join(self.tmp.name, "search.tokens")
        with open(tokens, "w") as f:
            f.write(f"# search tokens\n{token}\n")
        os.chmod(tokens, 0o600)
        config = f'search_token_file: "{tokens}"\n'
        with open(ca, "rb") as f:
            ca_pem = f.read()
        tls = self.start_daemon(config, ["--tls_cert", cert, "--tls_key", key])
        plain = self.start_knnd(config)  # tokens over plaintext: a mesh
        target = f"localhost:{tls.port}"

        def creds():
            return grpc.ssl_channel_credentials(root_certificates=ca_pem)
        # Ready once an authenticated call goes through (its health check
        # is behind TLS too).
        ready = KnnClient(target, credentials=creds(), bearer_token=token,
                          retry=RetryPolicy(max_attempts=50), timeout_s=60)
        self.addCleanup(ready.close)
        ready.info()
        q = self.xb[:2]

        def sync_codes(addr, **kwargs):
            with KnnClient(addr, timeout_s=10, **kwargs) as client:
                try:
                    return client.search(q, 5).ids[:, 0].tolist()
                except grpc.RpcError as e:
                    return e.code()

        async def async_codes(addr, **kwargs):
            async with AsyncKnnClient(addr, timeout_s=10, **kwargs) as client:
                try:
                    return (await client.search(q, 5)).ids[:, 0].tolist()
                except grpc.RpcError as e:
                    return e.code()
        cases = [
            (target, dict(credentials=creds(), bearer_token=token), [0, 1]),
            (f"dns:///{target}", dict(credentials=creds(), bearer_token=token), [0, 1]),
            (target, dict(credentials=creds()), grpc.StatusCode.UNAUTHENTICATED),
            (target, dict(credentials=creds(), bearer_token="x" * 32),
             grpc.StatusCode.UNAUTHENTICATED),
            (target, dict(bearer_token=token, retry=RetryPolicy(max_attempts=1)),
             grpc.StatusCode.UNAVAILABLE),  # plaintext to a TLS port
            (plain.address, dict(bearer_token=token), [0, 1]),
            (plain.address, {}, grpc.StatusCode.UNAUTHENTICATED),
        ]
        for addr, kwargs, want in cases:
            with self.subTest(addr=addr, kwargs=sorted(kwargs)):
                self.assertEqual(sync_codes(addr, **kwargs), want)
                self.assertEqual(asyncio.run(async_codes(addr, **kwargs)), want)

    def test_max_connection_age_closes_connections(self):
        import grpc

        def seconds_until_not_ready(addr):
            """Connects, then waits up to 3 s for the connection to leave
            READY; returns the time that took, or None."""
            left = threading.Event()

            def watch(state):
                if state != grpc.ChannelConnectivity.READY:
                    left.set()
            with grpc.insecure_channel(addr) as channel:
                grpc.channel_ready_future(channel).result(timeout=10)
                start = time.monotonic()
                channel.subscribe(watch)
                ok = left.wait(3)
                channel.unsubscribe(watch)
                return time.monotonic() - start if ok else None
        aged = seconds_until_not_ready(self.start_knnd(
            "max_connection_age_ms: 300\nmax_connection_age_grace_ms: 100\n").address)
        self.assertIsNotNone(aged, "the server never closed the connection")
        self.assertIsNone(seconds_until_not_ready(self.start_knnd().address),
                          "with the 5 minute default the connection stays open")


    def test_a_restarted_knnd_is_found_within_a_second(self):
        address = f"127.0.0.1:{free_port()}"
        client = self.client(address)
        self.assert_back_within(
            address, lambda: client.search(self.xb[:1], 5, timeout_s=0.5), 2.0)


if __name__ == "__main__":
    client_testing.main(__doc__)

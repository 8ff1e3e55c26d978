#!/usr/bin/python3
"""SIGTERM under load, as clients without retries see it: 8 threads of
plain generated stubs searching, each on its own connection, a health
poller (Check in a loop on one channel) and a Watch stream, then SIGTERM.

Asserted, under heavy load (up to 200 queries at nprobe 32 per call) and
light load (1 query at nprobe 1, a drain of a few ms): knnd exits 0; every
search ends OK or UNAVAILABLE, never CANCELLED or DEADLINE_EXCEEDED; an
UNAVAILABLE that knnd sent says it is shutting down, any other one is a
connect refused once the listener is closed; searches sent after the signal
are still served during the shutdown delay; health answers NOT_SERVING
from the signal until the listener closes, and the Watch stream sees
SERVING then NOT_SERVING and ends UNAVAILABLE "knnd is shutting down".
Also: a second SIGTERM ends a long shutdown delay.

  shutdown_test.py --knnd BUILD/knnd --source-dir . [unittest args]
"""
import collections
import os
import signal
import tempfile
import threading
import time
import unittest

import numpy as np

from knnd_harness import (Daemon, build_test_index, channel, generate_stubs,
                          unittest_main)

ARGS = None
# Short, so that the test takes seconds; long enough for many calls.
SHUTDOWN_DELAY_MS = 400
CLIENTS = 8
SHUTTING_DOWN = "shutting down"
# What gRPC says of a call made once the port is closed (no server reached).
CONNECT_REFUSED = ("failed to connect", "Connection refused")


def unreachable(details):
    return any(text in details for text in CONNECT_REFUSED)


class ShutdownTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.source_dir, cls.tmp.name)
        global grpc, pb, health_pb, health_grpc
        import grpc
        from health_v1 import health_pb2 as health_pb
        from health_v1 import health_pb2_grpc as health_grpc
        from knnd.v1 import knn_service_pb2 as pb
        cls.path = os.path.join(cls.tmp.name, "shutdown.index")
        cls.xb = build_test_index(cls.path, seed=5, n=8000)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def start(self, delay_ms=SHUTDOWN_DELAY_MS):
        config = os.path.join(self.tmp.name, "knnd.textproto")
        with open(config, "w") as f:
            f.write(f"shutdown_delay_ms: {delay_ms}\n"
                    "drain_grace_period_ms: 20000\n")
        self.daemon = Daemon(ARGS.knnd, ["--config", config, "--index", self.path,
                                         "--workers", "2"],
                             log_path=os.path.join(self.tmp.name, "knnd.log"))
        self.addCleanup(self.daemon.stop)
        self.assertTrue(self.daemon.wait_serving(60),
                        "knnd did not become SERVING: " + self.daemon.read_log())

    def sigterm_under_load(self, max_queries, nprobe):
        """Runs the clients, the poller and the watcher across a SIGTERM;
        returns the searches as (sent after the signal, code, details), the
        checks as (answered after the signal, status or code name, details)
        and the
        watch as (statuses, final code name, details)."""
        self.start()
        address = self.daemon.address
        stop = threading.Event()
        signalled = threading.Event()
        lock = threading.Lock()
        searches, checks = [], []
        watch = {"statuses": [], "code": None, "details": ""}

        def client(seed):
            from knnd.v1 import knn_service_pb2_grpc as pb_grpc
            rng = np.random.default_rng(seed)
            with channel(address) as ch:
                stub = pb_grpc.KnnServiceStub(ch)
                while not stop.is_set():
                    n = int(rng.integers(1, max_queries + 1))
                    q = self.xb[rng.integers(0, len(self.xb), n)]
                    after = signalled.is_set()
                    try:
                        r = stub.Search(pb.SearchRequest(
                            vectors_f32le=q.tobytes(), k=10, nprobe=nprobe),
                            timeout=60)
                        # Each query is an indexed vector: its row has at
                        # least that neighbour (a short list pads with -1).
                        ok = (len(r.ids) == n * 10
                              and min(r.ids[0::10]) >= 0)
                        outcome = (after, "OK" if ok else "BAD_RESULT", "")
                    except grpc.RpcError as e:
                        outcome = (after, e.code().name, e.details() or "")
                    with lock:
                        searches.append(outcome)

        def poller():
            with channel(address) as ch:
                stub = health_grpc.HealthStub(ch)
                while not stop.is_set():
                    try:
                        r = stub.Check(health_pb.HealthCheckRequest(
                            service="knnd.v1.KnnService"), timeout=10)
                        outcome = (health_pb.HealthCheckResponse.
                                   ServingStatus.Name(r.status), "")
                    except grpc.RpcError as e:
                        outcome = (e.code().name, e.details() or "")
                    # Whether the answer came after the signal was sent (one
                    # sent before may be answered after knnd took it).
                    checks.append((signalled.is_set(), *outcome))
                    time.sleep(0.005)

        def watcher():
            with channel(address) as ch:
                stream = health_grpc.HealthStub(ch).Watch(
                    health_pb.HealthCheckRequest(service=""), timeout=120)
                try:
                    for r in stream:
                        watch["statuses"].append(
                            health_pb.HealthCheckResponse.ServingStatus.Name(r.status))
                except grpc.RpcError as e:
                    watch["code"], watch["details"] = e.code().name, e.details()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        threads += [threading.Thread(target=poller), threading.Thread(target=watcher)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        signalled.set()
        self.daemon.proc.send_signal(signal.SIGTERM)
        code = self.daemon.proc.wait(timeout=120)
        stop.set()
        for t in threads:
            t.join(timeout=120)
            self.assertFalse(t.is_alive(), "a call was left without an answer")
        log = self.daemon.read_log()
        self.assertEqual(code, 0, log)
        self.assertIn("drained", log)
        return searches, checks, watch

    def check_outcomes(self, searches, checks, watch):
        counts = collections.Counter((after, code) for after, code, _ in searches)
        summary = f"{sorted(counts.items())} {watch}"
        print(summary, flush=True)
        self.assertEqual({code for _, code, _ in searches} - {"OK", "UNAVAILABLE"},
                         set(), summary)
        self.assertGreater(counts[(False, "OK")], 0, summary)
        # Searches sent after the signal were served during the delay...
        self.assertGreater(counts[(True, "OK")], 0, summary)
        # ... then refused by knnd itself, saying why, or (once the port is
        # closed) not sent at all.
        refused = [d for _, code, d in searches if code == "UNAVAILABLE"]
        self.assertGreater(sum(SHUTTING_DOWN in d for d in refused), 0, summary)
        odd = [d for d in refused if SHUTTING_DOWN not in d and not unreachable(d)]
        self.assertEqual(odd, [], summary)

        # Health: SERVING before, NOT_SERVING from the signal until the port
        # closed, then unreachable; never CANCELLED.
        self.assertTrue(all(status == "SERVING" for after, status, _ in checks
                            if not after), checks[:5])
        late = [(status, d) for after, status, d in checks if after]
        self.assertIn("NOT_SERVING", [status for status, _ in late], late[:5])
        seen_not_serving = False
        for status, details in late:
            if status == "NOT_SERVING":
                seen_not_serving = True
            elif status != "SERVING" or seen_not_serving:
                # After the first NOT_SERVING: only NOT_SERVING or a closed port.
                self.assertTrue(status == "UNAVAILABLE" and unreachable(details),
                                (status, details))
        self.assertEqual(watch["statuses"][:1], ["SERVING"], watch)
        self.assertEqual(watch["statuses"][-1], "NOT_SERVING", watch)
        self.assertEqual(watch["code"], "UNAVAILABLE", watch)
        self.assertIn(SHUTTING_DOWN, watch["details"], watch)

    def test_heavy_load(self):
        self.check_outcomes(*self.sigterm_under_load(max_queries=200, nprobe=32))

    def test_light_load(self):
        self.check_outcomes(*self.sigterm_under_load(max_queries=1, nprobe=1))

    def test_second_sigterm_ends_the_delay(self):
        self.start(delay_ms=300000)
        self.daemon.proc.send_signal(signal.SIGTERM)
        while self.daemon.serving():
            time.sleep(0.01)
        self.assertIsNone(self.daemon.proc.poll())  # still in its delay
        self.daemon.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.daemon.proc.wait(timeout=60), 0)
        log = self.daemon.read_log()
        self.assertIn("ending the shutdown delay", log)
        self.assertIn("drained", log)


if __name__ == "__main__":
    unittest_main(__doc__)

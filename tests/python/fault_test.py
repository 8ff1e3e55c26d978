#!/usr/bin/python3
"""Faults knnd must survive, scripted against the real binaries:
SIGKILL under load then a restart to SERVING; the index file renamed over
while serving; the index file's directory unreadable at start; the disk
filling up while `knnctl build` writes; a client that hangs up mid-request.

  fault_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl --source-dir . [unittest args]
"""
import hashlib
import os
import resource
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import numpy as np

from knnd_harness import Daemon, generate_stubs, unittest_main

ARGS = None
DIM = 32


def make_index(path, seed, first_id):
    """A small IVF-PQ file; returns its vectors."""
    import faiss
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, DIM)).astype("float32") * 4
    xb = (centres[rng.integers(0, 40, 20000)]
          + rng.standard_normal((20000, DIM))).astype("float32")
    index = faiss.index_factory(DIM, "IVF64,PQ8")
    # index_factory turns polysemous training on; it takes minutes here.
    faiss.downcast_index(faiss.extract_index_ivf(index)).do_polysemous_training = False
    index.train(xb)
    index.add_with_ids(xb, np.arange(first_id, first_id + len(xb), dtype="int64"))
    faiss.write_index(index, path)
    return xb


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_fvecs(path, x):
    rows = np.hstack([np.full((len(x), 1), x.shape[1], dtype="int32").view("float32"), x])
    rows.astype("float32").tofile(path)


class FaultTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import faiss
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.source_dir, cls.tmp.name)
        global grpc, pb
        import grpc
        from knnd.v1 import knn_service_pb2 as pb
        cls.path_a = os.path.join(cls.tmp.name, "a.index")
        cls.path_b = os.path.join(cls.tmp.name, "b.index")
        cls.xb = make_index(cls.path_a, seed=1, first_id=0)
        make_index(cls.path_b, seed=2, first_id=1_000_000)
        cls.faiss_a = faiss.read_index(cls.path_a)
        cls.faiss_b = faiss.read_index(cls.path_b)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.daemons = []

    def tearDown(self):
        for daemon in self.daemons:
            daemon.stop()

    # ---- helpers ----
    def start(self, index, address=None, extra=(), **popen):
        """knnd on `index` (at `address`, or a free port)."""
        log_path = os.path.join(self.tmp.name, f"knnd.{len(self.daemons)}.{self.id()}.log")
        daemon = Daemon(ARGS.knnd, ["--index", index, "--workers", "2", *extra],
                        log_path=log_path, address=address, **popen)
        self.daemons.append(daemon)
        return daemon

    def wait_serving(self, daemon, timeout=60):
        """A KnnService stub once `daemon` is SERVING."""
        self.assertTrue(daemon.wait_serving(timeout),
                        "knnd exited or did not become SERVING: " + daemon.read_log())
        return daemon.stub()

    def search(self, stub, q, k=10, nprobe=8, **kw):
        return stub.Search(pb.SearchRequest(
            vectors_f32le=q.astype("<f4").tobytes(), k=k, nprobe=nprobe), **kw)

    def assert_answers(self, stub, faiss_index, q, k=10, nprobe=8):
        r = self.search(stub, q, k, nprobe, timeout=30)
        faiss_index.nprobe = nprobe
        _, want = faiss_index.search(q, k)
        np.testing.assert_array_equal(np.array(r.ids).reshape(len(q), k), want)

    # ---- the faults ----
    def test_sigkill_under_load_then_restart_reaches_serving_and_answers(self):
        daemon = self.start(self.path_a)
        stub = self.wait_serving(daemon)
        stop = threading.Event()
        answered = []

        def load():
            q = self.xb[:64] + 0.01
            while not stop.is_set():
                try:
                    self.search(stub, q, nprobe=32, timeout=5)
                    answered.append(1)
                except grpc.RpcError:
                    pass
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.time() + 30
        while len(answered) < 20 and time.time() < deadline:
            time.sleep(0.05)
        self.assertGreaterEqual(len(answered), 20, "no load reached knnd")
        daemon.proc.send_signal(signal.SIGKILL)
        self.assertEqual(daemon.proc.wait(), -signal.SIGKILL)
        stop.set()
        for t in threads:
            t.join()

        stub = self.wait_serving(self.start(self.path_a, address=daemon.address))
        self.assert_answers(stub, self.faiss_a, self.xb[100:150] + 0.05)

    def test_index_file_renamed_over_while_serving_keeps_answering_correctly(self):
        live = os.path.join(self.tmp.name, "live.index")
        with open(self.path_a, "rb") as src, open(live, "wb") as dst:
            dst.write(src.read())
        daemon = self.start(live)
        stub = self.wait_serving(daemon)
        q = self.xb[200:232] + 0.02
        self.assert_answers(stub, self.faiss_a, q)
        with open(self.path_b, "rb") as src, open(live + ".new", "wb") as dst:
            dst.write(src.read())
        os.rename(live + ".new", live)
        # The mapped pages are the old inode's: the same answers, no crash.
        deadline = time.time() + 2
        while time.time() < deadline:
            self.assert_answers(stub, self.faiss_a, q, nprobe=64)
        self.assertIsNone(daemon.proc.poll())

    def test_unreadable_index_directory_at_start_exits_with_a_message(self):
        locked = os.path.join(self.tmp.name, "locked")
        os.makedirs(locked, exist_ok=True)
        index = os.path.join(locked, "a.index")
        with open(self.path_a, "rb") as src, open(index, "wb") as dst:
            dst.write(src.read())
        os.chmod(locked, 0)
        self.addCleanup(os.chmod, locked, 0o755)
        popen = {}
        if os.geteuid() == 0:
            # root reads through mode 000: run the daemon as nobody.
            nobody = 65534

            def drop():
                os.setgid(nobody)
                os.setuid(nobody)
            popen["preexec_fn"] = drop
            if not os.access(ARGS.knnd, os.X_OK):
                self.skipTest("knnd binary not executable")
        try:
            daemon = self.start(index, **popen)
        except (PermissionError, subprocess.SubprocessError) as e:
            self.skipTest(f"cannot run knnd as another user here: {e}")
        try:
            code = daemon.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.fail("knnd kept running without a readable index: " + daemon.read_log())
        text = daemon.read_log()
        if code != 0 and "exec" in text and "Permission denied" in text and \
                "index" not in text:
            self.skipTest("nobody cannot execute the build's knnd here")
        self.assertNotIn(code, (0, -signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS), text)
        self.assertIn(index, text)
        self.assertIn("Permission denied", text)

    def test_disk_full_while_knnctl_build_writes_keeps_the_old_file(self):
        work = os.path.join(self.tmp.name, "build")
        os.makedirs(work, exist_ok=True)
        vectors = os.path.join(work, "x.fvecs")
        write_fvecs(vectors, self.xb[:8000])
        out = os.path.join(work, "out.index")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run([ARGS.knnctl, "build", "--input", vectors, "--output", out,
                        "--factory", "IVF16,PQ4"], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before = {name: sha256(os.path.join(work, name)) for name in os.listdir(work)}
        limit = os.path.getsize(out) // 2

        def small_disk():
            # Writes past `limit` bytes fail with EFBIG, as on a full disk
            # (SIGXFSZ ignored, as the daemon's supervisor would not kill it).
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        r = subprocess.run([ARGS.knnctl, "build", "--input", vectors, "--output", out,
                            "--factory", "IVF16,PQ16"], env=env, preexec_fn=small_disk,
                           capture_output=True, text=True, timeout=300)
        self.assertNotEqual(r.returncode, 0, r.stderr)
        self.assertGreater(r.returncode, 0, "knnctl died of a signal: " + r.stderr)
        self.assertIn("cannot write", r.stderr)
        after = {name: sha256(os.path.join(work, name)) for name in os.listdir(work)}
        self.assertEqual(after, before, "the old index, its sidecar and nothing else remain")

    def test_client_disconnecting_mid_request_cancels_its_work(self):
        daemon = self.start(self.path_a, extra=["--workers", "1"])
        stub = self.wait_serving(daemon)
        # 4096 queries over every list: 32 units of 128 rows on one worker.
        q = np.tile(self.xb[:512], (8, 1)) + 0.03
        future = stub.Search.future(pb.SearchRequest(
            vectors_f32le=q.astype("<f4").tobytes(), k=100, nprobe=64), timeout=60)
        deadline = time.time() + 30
        while time.time() < deadline and \
                daemon.scrape().get("knnd_queries_in_flight", 0) == 0:
            time.sleep(0.01)
        self.assertFalse(future.done(), "the request finished before it could be cancelled")
        future.cancel()
        cancelled = ('grpc_server_handled_total{grpc_code="CANCELLED",'
                     'grpc_method="Search",grpc_service="knnd.v1.KnnService",'
                     'grpc_type="unary",protocol="grpc"}')
        deadline = time.time() + 30
        while time.time() < deadline:
            values = daemon.scrape()
            if values.get(cancelled, 0) >= 1 and values["knnd_queries_in_flight"] == 0:
                break
            time.sleep(0.05)
        values = daemon.scrape()
        self.assertEqual(values.get(cancelled), 1, sorted(k for k in values if "handled" in k))
        self.assertEqual(values["knnd_queries_in_flight"], 0)
        self.assertEqual(values["knnd_estimated_bytes_in_flight"], 0)
        self.assertEqual(values["knnd_work_units_queued"], 0)
        ok = ('grpc_server_handled_total{grpc_code="OK",grpc_method="Search",'
              'grpc_service="knnd.v1.KnnService",grpc_type="unary",'
              'protocol="grpc"}')
        self.assertEqual(values.get(ok, 0), 0, "the cancelled search was answered")
        self.assert_answers(stub, self.faiss_a, self.xb[:8] + 0.01)


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True)

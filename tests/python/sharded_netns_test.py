#!/usr/bin/python3
"""A sharded index whose shards run on separate hosts, checked against one
unsharded knnd: each shard's knnd runs in a network namespace of its own,
reached from the root namespace over its own veth pair, so that a shard
can be cut off the way a host is (its link goes down and packets are
dropped, not refused) as well as killed (connections refused).

Runs as root (skipped otherwise, or where `ip netns` cannot create
namespaces). One run:

- builds two small indexes from clustered float32 data of two seeds with
  `knnctl build` (versions 1 and 2 of "the same" index), splits each with
  `knnctl shard --shards N` and publishes version 1 of every shard into
  that shard's versions directory (`knnctl publish`);
- starts N shard knnds (one per namespace, keep_previous_versions: 1), two
  unsharded reference knnds (one per build) and a front knnd
  (--shard_targets) on 127.0.0.1, and waits for SERVING;
- MergeTest: merged answers through the front, ShardedKnnClient and (once)
  AsyncShardedKnnClient equal the unsharded knnd's (docs/sharding.md's
  equality rule) for 1 and 100 queries, with and without re-ranking, with
  allow-lists;
- FailureTest: a shard cut off mid-load (its link down), then killed
  (SIGKILL): every call ends by its deadline; default calls fail naming
  the shard; calls allowing partial results answer without it
  (missing_shards, ids outside its range, equal to the unsharded index
  without that range); after the link comes back / the shard restarts,
  calls succeed fully again;
- VersionSwapTest: the shard set swapped to version 2 one shard at a time
  under load, through the front and ShardedKnnClient: every answer is of
  version 1 or 2 and equals that version's unsharded answer (an answer
  mixing versions would equal neither); at the end version 2.

The knnd and knnctl under test must be built from a tree where `knnctl
shard` writes correct shards for M >= 32 sub-quantizers (the default
recipe at --dim 64); --dim 16 (M = 16) runs everything else meanwhile.

  sharded_netns_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl \\
      --source-dir . [--shards N] [--dim D] [unittest args]

--shards (default 3) reruns the whole check with another split of the
same data (2 to 8 shards). --dim (default 64) changes the vectors'
dimension, and with it the PQ of `knnctl build`'s default recipe (M =
dim sub-quantizers of one dimension each below dim 128, wider above).
"""
import asyncio
import atexit
import ctypes
import fcntl
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from knnd_harness import (channel, free_ports, generate_stubs, install_client,
                          unittest_main)

ARGS = None
DIM = 64              # set from --dim
ROWS = 20000
K = 10
REFINE = 3            # the re-ranking factor checked (> 0)
POOL = 64             # fixed query pool of the load phases
DEADLINE_S = 1.0      # deadline of every call under load
# Slack over a deadline for a call to be cancelled, answered and timed by
# a Python thread on a busy 2-core machine.
DEADLINE_MARGIN_S = 0.5
# How long a shard stays cut off (it must span a few deadlines).
CUT_S = 3.0
# Bound on the time from a shard's return to the first fully merged
# answer: gRPC's reconnect backoff (1 s, then x1.6) after a kill, TCP's
# retransmission backoff after a link cut. A bound, not a measurement.
RECOVERY_BOUND_S = 20.0
SHARD_PORT, SHARD_METRICS_PORT, SHARD_ADMIN_PORT = 50051, 9090, 50052
NETNS_PREFIX = "knndnet-"
TMP_PREFIX = "knnd-netns-"   # + pid: work folders, swept like namespaces
LOCK_PATH = "/tmp/knnd-sharded-netns-test.lock"
PR_SET_PDEATHSIG = 1
READINESS = "knnd.v1.KnnService"   # the health service that says "ready"
# Ends every skip reason (ctest's SKIP_REGULAR_EXPRESSION matches it).
NO_NETNS = "network namespaces unavailable, test skipped"
# The shards keep the version they replace (docs/sharding.md rule 4).
SHARD_CONFIG = "keep_previous_versions: 1\nshutdown_delay_ms: 0\n"
# The front learns shard versions and readiness quickly.
FRONT_CONFIG = "shard_poll_interval_ms: 200\nshutdown_delay_ms: 0\n"


def run(*cmd, check=True):
    """Runs a command; returns its CompletedProcess (stdout+stderr as text)."""
    r = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed "
                           f"({r.returncode}): {r.stdout}")
    return r


def die_with_parent():
    """preexec_fn: the child gets SIGKILL when the test process dies, so
    that a test killed by ctest's timeout leaves no knnd behind (and no
    process keeping a namespace alive). Processes are started from the
    main thread only: the signal follows the thread that forked."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG,
                                                   signal.SIGKILL)


def clustered(seed, n, centres=50):
    """n float32 vectors around `centres` random centres (the shape of
    embedding data: dense clusters, so that IVF lists are uneven)."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, DIM)).astype(np.float32) * 3
    return (c[rng.integers(0, centres, n)]
            + rng.standard_normal((n, DIM))).astype(np.float32)


# --------------------------------------------------------------------------
# Network namespaces

def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class Network:
    """N network namespaces, each linked to the root namespace by its own
    veth pair with its own /30 in 10.213.B.0/24 (B picked free at start):
    root side 10.213.B.(4i+1), namespace side 10.213.B.(4i+2), loopback up
    in the namespace (each shard's admin and metrics ports listen there).

    Names carry this process's pid and a random suffix, so that concurrent
    runs never clash, and namespaces left behind by a run that was killed
    (its pid gone) are removed by the next one. Deleting a namespace (once
    no process is in it) destroys its veth pair as well."""

    def __init__(self, count):
        self.count = count
        suffix = "%06x" % random.getrandbits(24)
        self.names = [f"{NETNS_PREFIX}{os.getpid()}-{suffix}-{i}"
                      for i in range(count)]
        self.root_links = [f"kn{suffix}r{i}" for i in range(count)]
        self.ns_links = [f"kn{suffix}n{i}" for i in range(count)]
        self.created = []
        self.subnet = None

    @staticmethod
    def remove_leftovers():
        """Deletes the namespaces and work folders of earlier runs whose
        process is gone (killed before it could clean up)."""
        listed = run("ip", "netns", "list", check=False).stdout
        for line in listed.splitlines():
            m = re.match(rf"({re.escape(NETNS_PREFIX)}(\d+)-\S+)", line)
            if m and not pid_alive(int(m.group(2))):
                run("ip", "netns", "del", m.group(1), check=False)
        tmp = tempfile.gettempdir()
        for name in os.listdir(tmp):
            m = re.match(rf"{re.escape(TMP_PREFIX)}(\d+)-", name)
            if m and not pid_alive(int(m.group(1))):
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)

    def create(self):
        """Creates everything; raises RuntimeError (with ip's message) on
        the first failure, having removed what it made."""
        # The lock makes picking a free subnet and claiming it atomic
        # between concurrent runs.
        with open(LOCK_PATH, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.remove_leftovers()
            used = run("ip", "-4", "addr").stdout + run("ip", "-4", "route").stdout
            free = [b for b in range(256) if f"10.213.{b}." not in used]
            if not free:
                raise RuntimeError("no free 10.213.x.0/24 for the namespaces")
            self.subnet = random.choice(free)
            try:
                for i in range(self.count):
                    self._create_one(i)
            except Exception:
                self.destroy()
                raise

    def _create_one(self, i):
        ns, root, inner = self.names[i], self.root_links[i], self.ns_links[i]
        run("ip", "netns", "add", ns)
        self.created.append(ns)
        run("ip", "link", "add", root, "type", "veth", "peer", "name", inner)
        run("ip", "link", "set", inner, "netns", ns)
        run("ip", "addr", "add", f"{self.root_address(i)}/30", "dev", root)
        run("ip", "link", "set", root, "up")
        run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/30", "dev", inner)
        run("ip", "-n", ns, "link", "set", inner, "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")

    def root_address(self, i):
        return f"10.213.{self.subnet}.{4 * i + 1}"

    def address(self, i):
        """The address of namespace i (its shard's host)."""
        return f"10.213.{self.subnet}.{4 * i + 2}"

    def exec_prefix(self, i):
        return ["ip", "netns", "exec", self.names[i]]

    def cut(self, i):
        """Takes namespace i's end of its link down: the root side loses
        carrier and drops what it sends there (routes stay, so nothing is
        refused locally), as when a host or its switch port goes dark."""
        run("ip", "-n", self.names[i], "link", "set", self.ns_links[i], "down")

    def restore(self, i):
        run("ip", "-n", self.names[i], "link", "set", self.ns_links[i], "up")

    def destroy(self):
        """Removes every namespace and link made (idempotent). Processes
        inside must have been killed first."""
        for ns in self.created:
            run("ip", "netns", "del", ns, check=False)
        for link in self.root_links:
            if run("ip", "link", "show", link, check=False).returncode == 0:
                run("ip", "link", "del", link, check=False)
        self.created = []


# --------------------------------------------------------------------------
# knnd processes

class Knnd:
    """One knnd (`cmd`, possibly under `ip netns exec`) logging to
    `log_path`, searched at `address`. Started at once; restart() runs
    the same command again (same ports)."""

    def __init__(self, name, cmd, log_path, address):
        self.name, self.cmd, self.log_path = name, cmd, log_path
        self.address = address
        self.proc = None
        self.start()

    def start(self):
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log,
                                         stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent)

    def health(self, service=READINESS):
        """SERVING, NOT_SERVING... or the error code name (a fresh channel)
        of `service`: by default knnd's readiness to search, which for a
        front means every shard up as one set; "" is liveness, which a
        front keeps while shards are away (restarting it would not help)."""
        import grpc
        from health_v1 import health_pb2 as health_pb
        from health_v1 import health_pb2_grpc as health_grpc
        with channel(self.address) as ch:
            try:
                r = health_grpc.HealthStub(ch).Check(
                    health_pb.HealthCheckRequest(service=service), timeout=1)
                return health_pb.HealthCheckResponse.ServingStatus.Name(r.status)
            except grpc.RpcError as e:
                return e.code().name

    def wait_serving(self, timeout_s=60):
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}: "
                                     + self.read_log()[-3000:])
            if self.health() == "SERVING":
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.name} not SERVING after {timeout_s} s: "
                             + self.read_log()[-3000:])

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.proc.wait()

    def read_log(self):
        with open(self.log_path) as f:
            return f.read()


# --------------------------------------------------------------------------
# The equality rule

def mismatch(got_ids, got_d, want_ids, want_d):
    """Why (got_ids, got_d) is not the answer (want_ids, want_d), or None.

    docs/sharding.md: distances equal per rank, exactly (float32); ids
    equal, except among the entries whose distance equals the row's last
    one (a tie at the k-th place may be decided for any of the tied ids:
    those ids must still be distinct real ids, or -1 padding where the
    reference pads)."""
    got_ids, want_ids = np.asarray(got_ids), np.asarray(want_ids)
    got_d, want_d = np.asarray(got_d, np.float32), np.asarray(want_d, np.float32)
    if got_ids.shape != want_ids.shape or got_d.shape != want_d.shape:
        return f"shape {got_ids.shape} != {want_ids.shape}"
    for row in range(want_ids.shape[0]):
        g, w, gd, wd = got_ids[row], want_ids[row], got_d[row], want_d[row]
        if not np.array_equal(gd, wd):
            return f"row {row}: distances {gd.tolist()} != {wd.tolist()}"
        tail = wd == wd[-1]
        if not np.array_equal(g[~tail], w[~tail]):
            return f"row {row}: ids {g.tolist()} != {w.tolist()}"
        real = g[g >= 0]
        if len(set(real.tolist())) != len(real):
            return f"row {row}: repeated ids {g.tolist()}"
        if not np.array_equal(g[tail] < 0, w[tail] < 0):
            return (f"row {row}: padding differs in the tie at the last "
                    f"rank: {g.tolist()} != {w.tolist()}")
    return None


def search_request(pb, queries, k=K, refine=0, allowed=None,
                   allow_partial=False):
    request = pb.SearchRequest(vectors_f32le=queries.astype("<f4").tobytes(),
                               dim=DIM, k=k, refine_factor=refine,
                               allow_partial_results=allow_partial)
    if allowed is not None:
        request.allowed_ids.extend(int(i) for i in allowed)
    return request


def as_arrays(response):
    nq, k = response.num_queries, response.k
    return (np.array(response.ids, np.int64).reshape(nq, k),
            np.array(response.distances, np.float32).reshape(nq, k))


# --------------------------------------------------------------------------
# Load

class Load:
    """Threads searching through one address (the front) in a loop, each
    on its own channel, every call with DEADLINE_S; thread t sends
    `partial[t]` as allow_partial_results and re-ranks with `refine[t]`.
    Each call is recorded with its wall-clock bounds (monotonic), the
    pool rows asked, and its outcome; calls are checked afterwards."""

    def __init__(self, address, pool, partial, refine, nq=4, pause_s=0.02):
        self.address, self.pool = address, pool
        self.partial, self.refine = partial, refine
        self.nq, self.pause_s = nq, pause_s
        self.records = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(t,))
                        for t in range(len(partial))]
        for t in self.threads:
            t.start()

    def _loop(self, t):
        import grpc
        from knnd.v1 import knn_service_pb2 as pb
        from knnd.v1 import knn_service_pb2_grpc as pb_grpc
        rng = np.random.default_rng(100 + t)
        with channel(self.address) as ch:
            stub = pb_grpc.KnnServiceStub(ch)
            while not self.stopping.is_set():
                rows = rng.choice(len(self.pool), self.nq, replace=False)
                request = search_request(pb, self.pool[rows],
                                         refine=self.refine[t],
                                         allow_partial=self.partial[t])
                record = {"thread": t, "rows": rows, "partial": self.partial[t],
                          "refine": self.refine[t], "start": time.monotonic()}
                try:
                    r = stub.Search(request, timeout=DEADLINE_S)
                    record.update(code="OK", version=r.index_version,
                                  missing=list(r.missing_shards))
                    record["ids"], record["distances"] = as_arrays(r)
                except grpc.RpcError as e:
                    record.update(code=e.code().name, details=e.details() or "")
                record["end"] = time.monotonic()
                with self.lock:
                    self.records.append(record)
                time.sleep(self.pause_s)

    def wait_for(self, condition, after, timeout_s):
        """The first record started at or after `after` satisfying
        `condition`, waiting up to timeout_s for it; None if none came."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self.lock:
                for r in self.records:
                    if r["start"] >= after and condition(r):
                        return r
            time.sleep(0.05)
        return None

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads), "a call never ended"
        return sorted(self.records, key=lambda r: r["start"])


# --------------------------------------------------------------------------
# The fixture: data, indexes, namespaces, processes

class Fixture:
    """Everything MergeTest, FailureTest and VersionSwapTest share, made
    once per run (building and starting take seconds, the checks less):
    see the module docstring."""

    def __init__(self, n):
        self.n = n
        self.tmp = tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-")
        self.dir = self.tmp.name
        self.daemons = []
        self.net = None
        self.closed = False

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def setup(self):
        t0 = time.monotonic()
        install_client(ARGS.source_dir, self.path("client"))
        generate_stubs(ARGS.source_dir, self.path("stubs"))
        # Version v's data, whole index and shards; the unsharded index is
        # the reference, split with `knnctl shard` (one build, one split).
        self.wholes, self.ranges = {}, {}
        for version, seed in ((1, 1), (2, 2)):
            os.makedirs(self.path(f"v{version}"))
            npy = self.path(f"v{version}", "x.npy")
            np.save(npy, clustered(seed, ROWS))
            whole = self.path(f"v{version}", "whole.faiss")
            run(ARGS.knnctl, "build", "--input", npy, "--output", whole,
                "--threads", "2")
            run(ARGS.knnctl, "shard", "--index", whole, "--shards", self.n)
            self.wholes[version] = whole
        self.versions_dirs = [self.path(f"shard-{s}") for s in range(self.n)]
        for s in range(self.n):
            self.publish(1, s)
        print(f"[{time.monotonic() - t0:5.1f} s] built and published "
              f"2 x {self.n} shards", flush=True)

        self.net = Network(self.n)
        self.net.create()
        with open(self.path("shard.textproto"), "w") as f:
            f.write(SHARD_CONFIG)
        with open(self.path("front.textproto"), "w") as f:
            f.write(FRONT_CONFIG)
        self.shards = [self._start_shard(s) for s in range(self.n)]
        self.shard_addresses = [s.address for s in self.shards]
        self.references = {v: self._start_local(
            f"reference-v{v}", ["--index", self.wholes[v]]) for v in (1, 2)}
        # Targets in another order than the shard ids: answers must be
        # merged and named by shard id, not by position.
        self.front_targets = self.shard_addresses[::-1]
        self.front = self._start_local(
            "front", ["--config", self.path("front.textproto"),
                      "--shard_targets=" + ",".join(self.front_targets)])
        for d in self.shards + list(self.references.values()):
            d.wait_serving()
        self.front.wait_serving()
        print(f"[{time.monotonic() - t0:5.1f} s] {self.n} shards in namespaces "
              f"10.213.{self.net.subnet}.0/24, 2 references and the front "
              "SERVING", flush=True)

        import grpc
        from knnd.v1 import knn_service_pb2 as pb
        from knnd.v1 import knn_service_pb2_grpc as pb_grpc
        self.grpc, self.pb = grpc, pb
        self.channels = []

        def stub(address):
            self.channels.append(channel(address))
            return pb_grpc.KnnServiceStub(self.channels[-1])
        self.front_stub = stub(self.front.address)
        self.reference_stubs = {v: stub(d.address)
                                for v, d in self.references.items()}
        self.shard_stubs = [stub(a) for a in self.shard_addresses]
        infos = [st.GetIndexInfo(pb.GetIndexInfoRequest(), timeout=5)
                 for st in self.shard_stubs]
        self.ranges = [(i.shard.first_id, i.shard.end_id) for i in infos]
        assert [i.shard.shard_id for i in infos] == list(range(self.n)), infos
        self.pool = clustered(1, ROWS + POOL)[ROWS:]   # unseen queries
        self.pool_refs = self._pool_references()
        print(f"[{time.monotonic() - t0:5.1f} s] reference answers ready",
              flush=True)

    def publish(self, version, s):
        shard = f"{self.wholes[version]}.shard-{s}-of-{self.n}"
        out = run(ARGS.knnctl, "publish", "--index", shard,
                  "--dir", self.versions_dirs[s]).stdout
        if f"as version {version}" not in out:
            raise AssertionError(f"publish of v{version} shard {s}: {out}")

    def _start_shard(self, s):
        """Shard s's knnd in namespace s, on the namespace's address; admin
        and metrics on the namespace's own loopback (fixed ports: nothing
        else listens in there)."""
        address = f"{self.net.address(s)}:{SHARD_PORT}"
        cmd = [*self.net.exec_prefix(s), ARGS.knnd,
               "--config", self.path("shard.textproto"),
               "--index", self.versions_dirs[s], "--workers", "1",
               "--listen", address,
               "--metrics_listen", f"127.0.0.1:{SHARD_METRICS_PORT}",
               "--admin_listen", f"127.0.0.1:{SHARD_ADMIN_PORT}"]
        d = Knnd(f"shard {s}", cmd, self.path(f"shard-{s}.log"), address)
        self.daemons.append(d)
        return d

    def _start_local(self, name, args):
        listen, metrics = free_ports(2)
        cmd = [ARGS.knnd, *args, "--workers", "1",
               "--listen", f"127.0.0.1:{listen}",
               "--metrics_listen", f"127.0.0.1:{metrics}", "--admin_listen="]
        d = Knnd(name, cmd, self.path(f"{name}.log"), f"127.0.0.1:{listen}")
        self.daemons.append(d)
        return d

    def reload_shard(self, s):
        """`knnctl reload` on shard s's admin port (its namespace's loopback)."""
        return run(*self.net.exec_prefix(s), ARGS.knnctl, "reload",
                   "--addr", f"127.0.0.1:{SHARD_ADMIN_PORT}")

    def shard_info(self, s):
        return self.shard_stubs[s].GetIndexInfo(self.pb.GetIndexInfoRequest(),
                                                timeout=5)

    def reference(self, version, queries, refine=0, allowed=None):
        """The unsharded knnd's (ids, distances) at `version`."""
        r = self.reference_stubs[version].Search(
            search_request(self.pb, queries, refine=refine, allowed=allowed),
            timeout=30)
        return as_arrays(r)

    def without(self, s):
        """Every id outside shard s's range: the allow-list under which the
        unsharded index answers as a merge of the other shards."""
        first, end = self.ranges[s]
        return np.concatenate([np.arange(0, first), np.arange(end, ROWS)])

    def _pool_references(self):
        """For the load's query pool: {(version, refine, missing shard or
        None): (ids, distances)}."""
        refs = {}
        for version in (1, 2):
            for refine in (0, REFINE):
                refs[version, refine, None] = self.reference(
                    version, self.pool, refine)
                for s in range(self.n):
                    refs[version, refine, s] = self.reference(
                        version, self.pool, refine, allowed=self.without(s))
        return refs

    def close(self):
        """Kills every process, then removes the namespaces (idempotent;
        also run at exit and on SIGTERM)."""
        if self.closed:
            return
        self.closed = True
        for ch in getattr(self, "channels", []):
            ch.close()
        for d in self.daemons:
            d.kill()
        if self.net:
            self.net.destroy()
        self.tmp.cleanup()


FIXTURE = None
FIXTURE_ERROR = None


def fixture():
    """The run's Fixture, made on first use; unittest.SkipTest when this
    machine cannot run it. A fixture that failed to set up is cleaned up
    and its error raised again for every later test class."""
    global FIXTURE, FIXTURE_ERROR
    if FIXTURE_ERROR is not None:
        raise FIXTURE_ERROR
    if FIXTURE is None:
        if os.geteuid() != 0:
            raise unittest.SkipTest(f"not root: {NO_NETNS}")
        probe = f"{NETNS_PREFIX}{os.getpid()}-probe"
        try:
            r = run("ip", "netns", "add", probe, check=False)
        except FileNotFoundError:
            raise unittest.SkipTest(f"no `ip` (iproute2): {NO_NETNS}")
        if r.returncode != 0:
            raise unittest.SkipTest(
                f"`ip netns add` fails ({r.stdout.strip()}): {NO_NETNS}")
        run("ip", "netns", "del", probe, check=False)
        FIXTURE = Fixture(ARGS.shards)
        atexit.register(FIXTURE.close)
        try:
            FIXTURE.setup()
        except BaseException as e:
            FIXTURE.close()
            FIXTURE_ERROR = e
            raise
    return FIXTURE


def tearDownModule():
    if FIXTURE is not None:
        FIXTURE.close()


def close_on_sigterm(signum, frame):
    """ctest's timeout (or a user) ending the run: kill and clean up first."""
    if FIXTURE is not None:
        FIXTURE.close()
    os._exit(128 + signum)


class FixtureTest(unittest.TestCase):
    """Base of the test classes: the shared Fixture, and the equality rule
    as an assertion. The tests do not depend on their order: answers are
    compared with the reference of the version they report."""

    @classmethod
    def setUpClass(cls):
        cls.f = fixture()
        cls.pb, cls.grpc = cls.f.pb, cls.f.grpc

    def assertAnswer(self, got, want, msg=""):
        why = mismatch(*got, *want)
        self.assertIsNone(why, msg)

    def sharded_client(self, **kwargs):
        """A ShardedKnnClient over the shards, listed in another order than
        the front's (any order must do)."""
        from knnd_client import ShardedKnnClient
        targets = self.f.shard_addresses[1:] + self.f.shard_addresses[:1]
        client = ShardedKnnClient(targets, **kwargs)
        self.addCleanup(client.close)
        return client

    def current_version(self):
        return self.f.front_stub.Search(search_request(
            self.pb, self.f.pool[:1]), timeout=5).index_version


# --------------------------------------------------------------------------
# 3. Merged answers equal the unsharded knnd's

class MergeTest(FixtureTest):
    """The merge itself, on a quiet set: both mergers return the unsharded
    index's answer, whatever the split, including re-ranking (rule 3,
    the delicate one) and allow-lists (which leave shards with few or no
    results, so padding is merged too)."""

    def cases(self):
        """(name, queries, refine, allowed ids) of every checked search."""
        rng = np.random.default_rng(7)
        queries = clustered(1, ROWS + 300)[ROWS + 100:]
        ids = np.arange(ROWS)
        # 40 % of the ids, across every shard.
        wide = ids[(ids % 5 == 0) | (ids % 5 == 3)]
        # 30 ids in the first and last shards only: most rows padded.
        sparse = np.concatenate([
            rng.choice(np.arange(*self.f.ranges[0]), 15, replace=False),
            rng.choice(np.arange(*self.f.ranges[-1]), 15, replace=False)])
        for nq in (1, 100):
            for refine in (0, REFINE):
                for label, allowed in (("all", None), ("wide", wide),
                                       ("sparse", sparse)):
                    yield (f"nq={nq} refine={refine} allowed={label}",
                           queries[:nq], refine, allowed)

    def test_merged_answers_equal_the_unsharded_index(self):
        version = self.current_version()
        client = self.sharded_client()
        compared = 0
        for name, queries, refine, allowed in self.cases():
            compared += 1
            with self.subTest(name):
                want = self.f.reference(version, queries, refine, allowed)
                r = self.f.front_stub.Search(search_request(
                    self.pb, queries, refine=refine, allowed=allowed), timeout=10)
                self.assertEqual((r.index_version, list(r.missing_shards),
                                  r.refine_factor), (version, [], refine))
                self.assertAnswer(as_arrays(r), want, f"front, {name}")
                result = client.search(queries, K, refine_factor=refine,
                                       allowed_ids=allowed)
                self.assertEqual((result.index_version, result.missing_shards),
                                 (version, ()))
                self.assertAnswer((result.ids, result.distances), want,
                                  f"ShardedKnnClient, {name}")
        self.assertEqual(compared, 12)

    def test_async_client_equals_the_unsharded_index(self):
        from knnd_client.aio import AsyncShardedKnnClient
        version = self.current_version()
        name, queries, refine, allowed = [
            c for c in self.cases() if c[0] == "nq=100 refine=3 allowed=wide"][0]

        async def search():
            # Made inside the running loop, as the client requires.
            client = AsyncShardedKnnClient(self.f.shard_addresses)
            try:
                return await client.search(
                    queries, K, refine_factor=refine, allowed_ids=allowed)
            finally:
                await client.close()
        result = asyncio.run(search())
        self.assertEqual((result.index_version, result.missing_shards),
                         (version, ()))
        self.assertAnswer((result.ids, result.distances),
                          self.f.reference(version, queries, refine, allowed),
                          f"AsyncShardedKnnClient, {name}")

    def test_the_checks_tell_wrong_merges_apart(self):
        """The equalities above could not fail if the reference did not
        depend on what they check: re-ranking and allow-lists change the
        answers, equal distances occur, and merging each shard's own k
        exact best (instead of re-ranking the unsharded candidates) gives
        another answer than the unsharded index's."""
        version = self.current_version()
        queries = clustered(1, ROWS + 300)[ROWS + 100:]
        plain = self.f.reference(version, queries)
        refined = self.f.reference(version, queries, REFINE)
        self.assertIsNotNone(mismatch(*plain, *refined))
        self.assertIsNotNone(mismatch(*plain, *self.f.reference(
            version, queries, allowed=np.arange(0, ROWS, 2))))
        self.assertTrue((np.diff(plain[1], axis=1) == 0).any(),
                        "no equal distances: the tie rule is not exercised")
        per_shard = [as_arrays(st.Search(search_request(
            self.pb, queries, refine=REFINE), timeout=10))
            for st in self.f.shard_stubs]
        ids = np.concatenate([p[0] for p in per_shard], axis=1)
        distances = np.concatenate([p[1] for p in per_shard], axis=1)
        order = np.lexsort((ids, distances), axis=1)[:, :K]
        naive = (np.take_along_axis(ids, order, 1),
                 np.take_along_axis(distances, order, 1))
        self.assertIsNotNone(mismatch(*naive, *refined),
                             "a per-shard re-ranking merge passes the check")
        # A tie decided otherwise than by id before the last rank is caught.
        d = plain[1]
        ties = np.argwhere((d[:, :-1] == d[:, 1:]) & (d[:, :-1] != d[:, -1:]))
        self.assertGreater(len(ties), 0, "no tie before the last rank")
        row, j = ties[0]
        swapped = plain[0].copy()
        swapped[row, [j, j + 1]] = swapped[row, [j + 1, j]]
        self.assertIsNotNone(mismatch(swapped, d, *plain))
        # The sparse allow-list pads rows: the padding rule is exercised.
        sparse = [c for c in self.cases() if c[0].endswith("allowed=sparse")][0]
        self.assertTrue((self.f.reference(version, queries, 0, sparse[3])[0]
                         == -1).any(), "the sparse allow-list pads nothing")


# --------------------------------------------------------------------------
# 4. A shard cut off or killed mid-load

class FailureTest(FixtureTest):
    """Rule 5 on real sockets: a shard that goes silent (its link down:
    only deadlines end the calls) and one whose connections are refused
    (killed). The shard cut is the middle one, the killed one the last,
    and the front lists its targets in reverse, so that a shard id
    confused with a target position shows."""

    # Threads: default calls and partial calls, without and with re-ranking.
    PARTIAL = (False, True, False, True)
    REFINES = (0, 0, REFINE, REFINE)

    def check_ok(self, r, s, errors):
        """An answer must be complete and equal the unsharded one, or lack
        exactly shard s and equal the unsharded index without s's ids."""
        missing = None if not r["missing"] else r["missing"]
        if missing not in (None, [s]) or (missing and not r["partial"]):
            errors.append(f"missing_shards {r['missing']}: {r}")
            return
        first, end = self.f.ranges[s]
        if missing and ((r["ids"] >= first) & (r["ids"] < end)).any():
            errors.append(f"ids of shard {s} in a partial answer: {r['ids']}")
        key = (r["version"], r["refine"], s if missing else None)
        if key not in self.f.pool_refs:
            errors.append(f"unexpected version {r['version']}")
            return
        ids, distances = self.f.pool_refs[key]
        why = mismatch(r["ids"], r["distances"], ids[r["rows"]],
                       distances[r["rows"]])
        if why:
            errors.append(f"answer {key} differs: {why}")

    def cut_under_load(self, s, cut, restore, expect_codes):
        """Load through the front; cut() shard s off, call ShardedKnnClient
        both ways while it is away, restore() it, wait for complete answers
        again. The load's calls are checked once it has stopped (a failed
        assertion in the middle would leave the shard cut off)."""
        grpc = self.grpc
        target = self.f.shard_addresses[s]
        client = self.sharded_client(timeout_s=DEADLINE_S)
        client.search(self.f.pool[:2], K)      # connected, versions known
        load = Load(self.f.front.address, self.f.pool, self.PARTIAL,
                    self.REFINES)
        try:
            time.sleep(0.5)
            t_cut = time.monotonic()
            cut()
            t_away = time.monotonic()
            # The Python client, both ways, while the shard is away.
            client_calls = []
            for partial in (False, True):
                start = time.monotonic()
                try:
                    result = client.search(self.f.pool[:4], K,
                                           allow_partial=partial)
                    outcome = ("OK", result.missing_shards, result)
                except grpc.RpcError as e:
                    outcome = (e.code().name, e.details(), None)
                client_calls.append((partial, time.monotonic() - start, outcome))
            time.sleep(max(0.0, t_away + CUT_S - time.monotonic()))
            front_health = (self.f.front.health(),
                            self.f.front.health(service=""))
            t_back = time.monotonic()
            restore()
            t_restored = time.monotonic()
            recovered = load.wait_for(
                lambda r: r["code"] == "OK" and not r["missing"]
                and not r["partial"], t_restored, RECOVERY_BOUND_S)
            time.sleep(1.0)
        finally:
            records = load.stop()
        self.assertIsNotNone(recovered, "no complete answer within "
                             f"{RECOVERY_BOUND_S} s of the shard's return")
        # The client comes back too (its own channel reconnects).
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while True:
            try:
                result = client.search(self.f.pool[:4], K)
                break
            except grpc.RpcError:
                self.assertLess(time.monotonic(), deadline,
                                "the client did not recover")
                time.sleep(0.2)
        self.assertEqual(result.missing_shards, ())
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while self.f.front.health() != "SERVING":
            self.assertLess(time.monotonic(), deadline,
                            "the front's health did not return to SERVING")
            time.sleep(0.1)

        errors, window = [], {"default": 0, "partial": 0}
        for r in records:
            elapsed = r["end"] - r["start"]
            if elapsed > DEADLINE_S + DEADLINE_MARGIN_S:
                errors.append(f"a call took {elapsed:.2f} s: {r}")
            inside = r["start"] >= t_away and r["end"] <= t_back
            if r["start"] >= recovered["start"] or r["end"] <= t_cut:
                # Before the cut and after recovery: complete answers only.
                if r["code"] != "OK" or r["missing"]:
                    errors.append(f"shard {s} present, yet {r}")
            if r["code"] == "OK":
                self.check_ok(r, s, errors)
                if inside:
                    if not r["partial"] or r["missing"] != [s]:
                        errors.append(f"answered without shard {s}: {r}")
                    window["partial"] += 1
            else:
                if r["code"] not in expect_codes or \
                        f"shard {s} ({target})" not in r["details"]:
                    errors.append(f"failure not naming shard {s}: {r}")
                if r["partial"]:
                    errors.append(f"a partial call failed: {r}")
                if inside:
                    window["default"] += 1
        clients = [(p, round(e, 2), o[:2]) for p, e, o in client_calls]
        summary = (f"{len(records)} calls, inside the cut {window}, front "
                   f"health (ready, alive) while away {front_health}, "
                   f"recovered {recovered['start'] - t_restored:.2f} s after "
                   f"the return, client {clients}")
        print(summary, flush=True)
        self.assertEqual(errors[:5], [], summary)
        self.assertGreater(window["default"], 0, summary)
        self.assertGreater(window["partial"], 0, summary)
        # Not ready while the shard is away, yet alive.
        self.assertEqual(front_health, ("NOT_SERVING", "SERVING"), summary)
        for partial, elapsed, (code, detail, result) in client_calls:
            self.assertLess(elapsed, DEADLINE_S + DEADLINE_MARGIN_S, summary)
            if partial:
                self.assertEqual((code, detail), ("OK", (s,)), summary)
                first, end = self.f.ranges[s]
                self.assertFalse(((result.ids >= first) & (result.ids < end)).any())
            else:
                self.assertIn(code, expect_codes, summary)
                self.assertIn(f"shard {s} at {target}", detail, summary)

    def test_a_link_cut_mid_load(self):
        """Packets dropped: the shard is silent, calls end by their
        deadline (DEADLINE_EXCEEDED; UNAVAILABLE if a reconnect fails)."""
        s = self.f.n // 2
        self.cut_under_load(s, lambda: self.f.net.cut(s),
                            lambda: self.f.net.restore(s),
                            ("DEADLINE_EXCEEDED", "UNAVAILABLE"))

    def test_a_shard_killed_mid_load(self):
        """Connections refused: calls fail fast (UNAVAILABLE; the client
        retries those until its deadline, so DEADLINE_EXCEEDED too)."""
        s = self.f.n - 1
        shard = self.f.shards[s]

        def restart():
            shard.start()
            shard.wait_serving()
        self.cut_under_load(s, shard.kill, restart,
                            ("UNAVAILABLE", "DEADLINE_EXCEEDED"))


# --------------------------------------------------------------------------
# 5. Versions swapped shard by shard under load

class VersionSwapTest(FixtureTest):
    """Rule 4 on a real rollout: shards swap one at a time as their own
    knnd reloads, keeping the previous version, while the front and a
    ShardedKnnClient are searched. Versions 1 and 2 hold different data, so
    an answer merged from both would equal neither reference."""

    def test_swap_to_version_2_under_load(self):
        f, pb = self.f, self.pb
        infos = [f.shard_info(s) for s in range(f.n)]
        self.assertEqual([i.version for i in infos], [1] * f.n,
                         "the shards must start at version 1")
        for refine in (0, REFINE):
            self.assertIsNotNone(mismatch(*f.pool_refs[1, refine, None],
                                          *f.pool_refs[2, refine, None]),
                                 "versions 1 and 2 answer alike")
        client = self.sharded_client(timeout_s=5)
        client.search(f.pool[:2], K)
        client_records = []
        stopping = threading.Event()

        def client_load():
            """ShardedKnnClient under the same swap (its own pinning)."""
            rng = np.random.default_rng(9)
            while not stopping.is_set():
                rows = rng.choice(POOL, 4, replace=False)
                try:
                    r = client.search(f.pool[rows], K,
                                      refine_factor=REFINE)
                    client_records.append((rows, "OK", r))
                except self.grpc.RpcError as e:
                    client_records.append((rows, e.code().name, e.details()))
                time.sleep(0.02)
        client_thread = threading.Thread(target=client_load)
        load = Load(f.front.address, f.pool, (False,) * 3, (0, REFINE, 0))
        client_thread.start()
        try:
            time.sleep(0.5)
            for s in range(f.n):
                f.publish(2, s)
                f.reload_shard(s)
                info = f.shard_info(s)
                self.assertEqual((info.version, list(info.retained_versions)),
                                 (2, [1]), f"shard {s} after its reload")
                time.sleep(0.7)
            t_swapped = time.monotonic()
            v2 = load.wait_for(lambda r: r.get("version") == 2, t_swapped, 10)
            time.sleep(1.0)
        finally:
            stopping.set()
            client_thread.join(timeout=30)
            records = load.stop()
        self.assertIsNotNone(v2, "the front never answered version 2")

        errors, versions = [], {1: 0, 2: 0}
        for r in records:
            if r["code"] != "OK" or r["missing"]:
                errors.append(f"front: {r}")
                continue
            key = (r["version"], r["refine"], None)
            if key not in f.pool_refs:
                errors.append(f"front: version {r['version']}")
                continue
            versions[r["version"]] += 1
            ids, distances = f.pool_refs[key]
            why = mismatch(r["ids"], r["distances"], ids[r["rows"]],
                           distances[r["rows"]])
            if why:
                errors.append(f"front, version {r['version']}: {why}")
        client_versions = {1: 0, 2: 0}
        for rows, code, r in client_records:
            if code != "OK" or r.missing_shards:
                errors.append(f"client: {code} {r}")
                continue
            if r.index_version not in (1, 2):
                errors.append(f"client: version {r.index_version}")
                continue
            client_versions[r.index_version] += 1
            ids, distances = f.pool_refs[r.index_version, REFINE, None]
            why = mismatch(r.ids, r.distances, ids[rows], distances[rows])
            if why:
                errors.append(f"client, version {r.index_version}: {why}")
        summary = (f"front answers by version {versions}, client's "
                   f"{client_versions}")
        print(summary, flush=True)
        self.assertEqual(errors[:5], [], summary)
        self.assertTrue(all(versions.values()), summary)
        self.assertTrue(all(client_versions.values()), summary)
        # At the end: version 2 everywhere, through both mergers.
        r = f.front_stub.Search(search_request(pb, f.pool), timeout=5)
        self.assertEqual(r.index_version, 2)
        self.assertAnswer(as_arrays(r), f.pool_refs[2, 0, None])
        end = time.monotonic() + 10
        while client.search(f.pool, K).index_version != 2:
            self.assertLess(time.monotonic(), end, "the client stays at 1")
            time.sleep(0.05)
        result = client.search(f.pool, K, refine_factor=REFINE)
        self.assertEqual(result.index_version, 2)
        self.assertAnswer((result.ids, result.distances),
                          f.pool_refs[2, REFINE, None])


def add_arguments(parser):
    parser.add_argument("--shards", type=int, default=3,
                        help="shard count of the split (2 to 8)")
    parser.add_argument("--dim", type=int, default=DIM,
                        help="dimension of the test vectors (default %(default)s)")


def check_arguments(args):
    global DIM
    if not 2 <= args.shards <= 8:
        sys.exit("--shards must be 2 to 8")
    if not 4 <= args.dim <= 1024:
        sys.exit("--dim must be 4 to 1024")
    DIM = args.dim
    signal.signal(signal.SIGTERM, close_on_sigterm)


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True, add_arguments=add_arguments,
                  setup=check_arguments)

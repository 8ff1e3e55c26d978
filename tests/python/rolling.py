"""A rolling restart of two knnd replicas under load from knnd-client, for
rolling_restart_test.py and bench/shutdown_bench.py.

The two replicas serve the same vectors under different ids (replica r's
vector i has id r * ID_STRIDE + i), so that every answer names the replica
that gave it. A restart is what a Kubernetes rolling update does to one
pod: SIGTERM, wait for the exit, start knnd again (here on the same port)
and wait until it is SERVING; the next replica is restarted only once the
clients send to this one again (a rolling update waits for readiness).

Needs knnd_harness.install_client() first (knnd_client importable).

"""
import asyncio
import os
import signal
import threading
import time

import numpy as np

from knnd_harness import Daemon, build_test_index, free_port

CLIENTS = 8
ID_STRIDE = 1_000_000
K = 10


def build_indexes(work_dir, n=5000):
    """The two replicas' index files, and the vectors both hold: one
    training, the vectors added under each replica's ids."""
    import faiss
    paths = [os.path.join(work_dir, f"replica-{r}.index") for r in range(2)]
    xb = build_test_index(paths[0], seed=3, n=n)
    index = faiss.read_index(paths[0])
    index.reset()
    index.add_with_ids(xb, np.arange(n, dtype="int64") + ID_STRIDE)
    faiss.write_index(index, paths[1])
    return paths, xb


class Replicas:
    """Two knnd processes on fixed loopback ports, serving `indexes`
    (build_indexes) with the config file `config_text`
    (shutdown_delay_ms...). Needs knnd_harness.generate_stubs() first."""

    def __init__(self, knnd, work_dir, config_text, indexes):
        self.knnd = knnd
        self.work_dir = work_dir
        self.config = os.path.join(work_dir, "replica.textproto")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.indexes = indexes
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
        self.daemons = [None, None]
        self.exit_codes = []
        self.starts = 0

    def target(self):
        """Both replicas as one static target (round_robin in knnd-client)."""
        return "ipv4:" + ",".join(self.addresses)

    def start(self, r):
        self.starts += 1
        log = os.path.join(self.work_dir, f"replica-{r}-{self.starts}.log")
        self.daemons[r] = Daemon(self.knnd, ["--config", self.config, "--index",
                                             self.indexes[r], "--workers", "1"],
                                 log_path=log, address=self.addresses[r])
        if not self.daemons[r].wait_serving(120):
            raise AssertionError(f"replica {r} did not become SERVING: "
                                 + self.daemons[r].read_log())

    def stop(self):
        for daemon in self.daemons:
            if daemon is not None:
                daemon.stop()


class Outcomes:
    """What the clients saw: per call, the replica that answered or the
    error. Thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.answered = [0, 0]
        self.errors = []
        self.bad = []

    def record(self, ids=None, error=None):
        with self.lock:
            if error is not None:
                self.errors.append(f"{error.code().name}: {error.details()}"
                                   if hasattr(error, "code") else repr(error))
                return
            replicas = set((ids // ID_STRIDE).ravel().tolist())
            if len(replicas) == 1 and replicas <= {0, 1}:
                self.answered[replicas.pop()] += 1
            else:
                self.bad.append(ids)

    def calls(self):
        with self.lock:
            return sum(self.answered) + len(self.errors) + len(self.bad)

    def answered_by(self, r):
        with self.lock:
            return self.answered[r]


def query_stream(xb, seed):
    """Endless batches of 1 to 32 rows of `xb`."""
    rng = np.random.default_rng(seed)
    while True:
        yield xb[rng.integers(0, len(xb), int(rng.integers(1, 33)))]


class SyncLoad:
    """CLIENTS threads, each with its own KnnClient, searching until stop()."""

    def __init__(self, target, xb, outcomes, **client_args):
        import grpc
        from knnd_client import KnnClient
        self.stopping = threading.Event()
        self.clients = [KnnClient(target, **client_args) for _ in range(CLIENTS)]

        def loop(client, seed):
            for q in query_stream(xb, seed):
                if self.stopping.is_set():
                    return
                try:
                    outcomes.record(ids=client.search(q, K).ids)
                except grpc.RpcError as e:
                    outcomes.record(error=e)
        self.threads = [threading.Thread(target=loop, args=(c, i))
                        for i, c in enumerate(self.clients)]
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=120)
        for client in self.clients:
            client.close()


class AsyncLoad:
    """CLIENTS AsyncKnnClients, one task each, in an event loop on a thread
    of its own, searching until stop()."""

    def __init__(self, target, xb, outcomes, **client_args):
        self.stopping = threading.Event()
        started = threading.Event()

        async def loop(seed):
            import grpc
            from knnd_client import AsyncKnnClient
            async with AsyncKnnClient(target, **client_args) as client:
                started.set()
                for q in query_stream(xb, seed):
                    if self.stopping.is_set():
                        return
                    try:
                        outcomes.record(ids=(await client.search(q, K)).ids)
                    except grpc.RpcError as e:
                        outcomes.record(error=e)

        async def main():
            await asyncio.gather(*(loop(i) for i in range(CLIENTS)))
        self.thread = threading.Thread(target=asyncio.run, args=(main(),))
        self.thread.start()
        started.wait(60)

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=120)


def wait_for_answers(outcomes, r, more_than, timeout_s=60):
    """Waits until replica r has answered more than `more_than` calls;
    False if `timeout_s` passes first."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if outcomes.answered_by(r) > more_than:
            return True
        time.sleep(0.02)
    return False


def roll(replicas, outcomes, rounds, come_back=True):
    """Restarts replica 0 then 1, `rounds` times, under the running load.
    Returns, per restart, the calls the other replica answered while this
    one was away (SIGTERM to SERVING again). With `come_back`, waits after
    each restart until the clients send to the restarted replica again
    (raising if they never do); without (pick_first clients stay where
    they are), one second."""
    for r in ((0, 1) if come_back else ()):
        if not wait_for_answers(outcomes, r, 0):
            raise AssertionError(f"replica {r} got no calls")
    others_answered = []
    for _ in range(rounds):
        for r in (0, 1):
            other = 1 - r
            before = outcomes.answered_by(other)
            daemon = replicas.daemons[r]
            daemon.proc.send_signal(signal.SIGTERM)
            replicas.exit_codes.append(daemon.proc.wait(timeout=120))
            replicas.start(r)
            others_answered.append(outcomes.answered_by(other) - before)
            mine = outcomes.answered_by(r)
            if not come_back:
                time.sleep(1)
            elif not wait_for_answers(outcomes, r, mine):
                raise AssertionError(f"no call reached restarted replica {r}")
    return others_answered

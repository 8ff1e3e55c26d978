#!/usr/bin/python3
"""The API worker's side of a call: client CPU per call of knnd's Python
client, today's (--baseline-rev, installed from git) against this tree's,
beside a bare grpcio stub call (the floor: a prebuilt request, no result
conversion) and, with --pg-python where PostgreSQL is installed, psycopg 3
on pgvector's query shape (bench/RESULTS.md, "Client cost").

One knnd serves Fashion-MNIST (knnctl build's default recipe, built once
under --work). Each measurement is a fresh process that makes calls back
to back (closed loop) for --seconds after a warm-up, and reports its own
CPU time (user + system, time.process_time) divided by its calls: the
client's CPU per call, whatever the server costs. Cases: sync and asyncio,
1 and 100 queries per request (k 10, the index's tuned nprobe). Rounds
alternate the cases (--rounds); medians are printed.

Then throughput: --procs single-query client processes (sync, closed
loop) against the same knnd for --seconds, today's client and this
tree's alternately, --rounds each; median q/s of each and their ratio.

  client_cost.py --build BUILD [--baseline-rev REV] [--seconds 3] [--rounds 3]
      [--pg-python VENV/bin/python]
"""
import argparse
import asyncio
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "python"))
import knnd_harness  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
PSYCOPG = "psycopg 3, pgvector's query shape"
K = 10

# --------------------------------------------------------------------------
# One measurement (run in a process of its own: --case)


def load_queries(n):
    """The first n Fashion-MNIST test images as float32 (n, 784)."""
    import gzip
    with gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")) as f:
        data = np.frombuffer(f.read(), np.uint8, offset=16)
    return data.reshape(-1, 784)[:n].astype(np.float32)


def sync_loop(call, seconds):
    """Calls `call()` back to back for `seconds` after a warm-up; returns
    (calls, CPU seconds, wall seconds)."""
    for _ in range(50):
        call()
    calls, cpu0, start = 0, time.process_time(), time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(20):
            call()
        calls += 20
        if time.perf_counter() >= end:
            break
    return calls, time.process_time() - cpu0, time.perf_counter() - start


def async_loop(make_call, seconds):
    """sync_loop for a coroutine function, in a new event loop; `make_call`
    is awaited once inside the loop and returns the coroutine function."""
    async def main():
        call = await make_call()
        for _ in range(50):
            await call()
        calls, cpu0, start = 0, time.process_time(), time.perf_counter()
        end = start + seconds
        while True:
            for _ in range(20):
                await call()
            calls += 20
            if time.perf_counter() >= end:
                break
        return calls, time.process_time() - cpu0, time.perf_counter() - start
    return asyncio.run(main())


def run_case(case, address, nq, seconds, pg_dsn):
    q = load_queries(nq)
    if case in ("stub", "aio_stub"):
        import grpc
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        from knnd_client._generated.knnd.v1 import knn_service_pb2_grpc as pbg
        request = pb.SearchRequest(vectors_f32le=q.tobytes(), dim=q.shape[1],
                                   k=K, results_as_bytes=True)
        if case == "stub":
            stub = pbg.KnnServiceStub(grpc.insecure_channel(address))
            return sync_loop(lambda: stub.Search(request, timeout=10), seconds)

        async def make():
            stub = pbg.KnnServiceStub(grpc.aio.insecure_channel(address))
            return lambda: stub.Search(request, timeout=10)
        return async_loop(make, seconds)
    if case == "sync":
        from knnd_client import KnnClient
        client = KnnClient(address, timeout_s=10)
        return sync_loop(lambda: client.search(q, K), seconds)
    if case == "async":
        from knnd_client import AsyncKnnClient

        async def make():
            client = AsyncKnnClient(address, timeout_s=10)
            return lambda: client.search(q, K)
        return async_loop(make, seconds)
    if case == "psycopg":
        # The same query shape through psycopg 3: the query vectors in as
        # pgvector-python's binary form (big-endian float32 after a dim
        # header), k (id, distance) rows per query out, one prepared
        # statement. The server's side is a stand-in (see PostgreSQL
        # below): only the client's CPU is compared.
        import struct
        import psycopg
        connection = psycopg.connect(pg_dsn, autocommit=True,
                                     prepare_threshold=0)
        dim = q.shape[1]
        header = struct.pack(">HH", dim, 0)
        sql = ("SELECT q, id, d FROM generate_series(1, %s) AS q, answers "
               "WHERE octet_length(%b) = %s ORDER BY q, id")

        def call():
            vectors = header + q.astype(">f4").tobytes()
            rows = connection.execute(
                sql, (nq, vectors, len(vectors))).fetchall()
            return (np.array([r[1] for r in rows], np.int64).reshape(nq, K),
                    np.array([r[2] for r in rows], np.float32).reshape(nq, K))
        return sync_loop(call, seconds)
    raise ValueError(case)


# --------------------------------------------------------------------------
# The driver


def install(label, source, work):
    """knnd-client from `source` (a tree with proto/ and clients/python)
    installed under work/label; returns its site folder."""
    dst = os.path.join(work, label)
    shutil.rmtree(dst, ignore_errors=True)
    client = knnd_harness.copy_client_sources(source, os.path.join(dst, "src"))
    site = os.path.join(dst, "site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    "--no-index", "--no-build-isolation", "--no-deps",
                    "--target", site, client], check=True,
                   env=dict(os.environ, PIP_ROOT_USER_ACTION="ignore"))
    return site


def baseline_tree(rev, work):
    """proto/ and clients/python/ of `rev`, exported with git archive."""
    tree = os.path.join(work, "baseline-tree")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", SOURCE, "archive", rev, "proto",
                              "clients/python"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def measure(site, case, address, nq, seconds, pg_dsn=None, python=None):
    """Runs one case in a fresh process; returns (calls, cpu_s, wall_s)."""
    env = dict(os.environ, PYTHONPATH=site, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [python or sys.executable, os.path.abspath(__file__), "--case", case,
         "--address", address, "--nq", str(nq), "--seconds", str(seconds),
         "--pg-dsn", pg_dsn or ""],
        check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def throughput(site, address, procs, seconds):
    """q/s of `procs` single-query sync client processes at once."""
    env = dict(os.environ, PYTHONPATH=site, OMP_NUM_THREADS="1")
    workers = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--case", "sync",
         "--address", address, "--nq", "1", "--seconds", str(seconds)],
        stdout=subprocess.PIPE, text=True, env=env) for _ in range(procs)]
    results = [json.loads(w.communicate()[0].strip().splitlines()[-1])
               for w in workers]
    return sum(r[0] / r[2] for r in results)


def build_index(build, work):
    """Fashion-MNIST's 60,000 training images indexed once with knnctl's
    default recipe and tuned for recall@10 0.95, as `make demo` does."""
    index = os.path.join(work, "fashion-mnist.index")
    if not os.path.exists(index):
        subprocess.run([os.path.join(build, "knnctl"), "build", "--input",
                        os.path.join(FASHION, "train-images-idx3-ubyte.gz"),
                        "--output", index], check=True, capture_output=True)
        subprocess.run([os.path.join(build, "knnctl"), "tune", "--index", index,
                        "--queries",
                        os.path.join(FASHION, "t10k-images-idx3-ubyte.gz"),
                        "--limit", "2000", "--target_recall", "0.95"],
                       check=True, capture_output=True)
    return index


class PostgreSQL:
    """A PostgreSQL cluster of its own under `work` (initdb of the newest
    /usr/lib/postgresql/*/bin; as the postgres user when run as root) on
    127.0.0.1:55432, holding `answers`: K rows (id,
    distance) that every query returns, so that the server's work is small
    and alike for every call. pgvector is not used (this machine's apt
    sources have no postgresql-15-pgvector): the client's side of its
    query (a vector in, K rows out, over loopback TCP) is what is
    measured."""

    def __init__(self, work):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            raise FileNotFoundError("no PostgreSQL under /usr/lib/postgresql")
        self.bin = os.path.dirname(bins[-1])
        self.data = os.path.join(work, "pgdata")
        self.socket = os.path.join(work, "pgsocket")
        self.as_user = (["runuser", "-u", "postgres", "--"]
                        if os.getuid() == 0 else [])
        shutil.rmtree(self.data, ignore_errors=True)
        os.makedirs(self.socket, exist_ok=True)
        if self.as_user:
            subprocess.run(["chown", "postgres", work, self.socket], check=True)
        self._pg("initdb", "-D", self.data, "-A", "trust", "-U", "bench")
        self._pg("pg_ctl", "-D", self.data, "-w", "-l",
                 os.path.join(work, "pg.log"), "-o",
                 f"-c listen_addresses=127.0.0.1 -k {self.socket} -p 55432",
                 "start")
        # Over loopback TCP, as the gRPC clients are.
        self.dsn = "host=127.0.0.1 port=55432 user=bench dbname=postgres"
        self._pg("psql", "-h", self.socket, "-p", "55432", "-U", "bench",
                 "-d", "postgres", "-q", "-c",
                 "CREATE TABLE answers (id bigint, d real); INSERT INTO answers "
                 f"SELECT i, i / 10.0 FROM generate_series(1, {K}) AS i")

    def _pg(self, tool, *args):
        subprocess.run([*self.as_user, os.path.join(self.bin, tool), *args],
                       check=True, capture_output=True)

    def stop(self):
        self._pg("pg_ctl", "-D", self.data, "-w", "-m", "fast", "stop")


def median_case(samples):
    """Median CPU microseconds per call over the rounds."""
    return statistics.median(1e6 * cpu / calls for calls, cpu, _ in samples)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build")
    parser.add_argument("--baseline-rev", default="42dbcf3",
                        help="the commit whose client is 'today's'")
    parser.add_argument("--work", default="/tmp/knnd_bench/client_cost")
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--pg-python", default=None,
                        help="a Python with psycopg 3 (a venv of "
                        "/usr/bin/python3 --system-site-packages); with it "
                        "a PostgreSQL cluster is made under --work and "
                        "psycopg measured beside the clients")
    parser.add_argument("--pg-dsn", default="", help=argparse.SUPPRESS)
    # One measurement, in its own process.
    parser.add_argument("--case")
    parser.add_argument("--address")
    parser.add_argument("--nq", type=int, default=1)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.address, args.nq,
                                  args.seconds, args.pg_dsn)))
        return

    os.makedirs(args.work, exist_ok=True)
    index = build_index(args.build, args.work)
    with tempfile.TemporaryDirectory(prefix="knnd-client-cost-") as tmp:
        sites = {"today": install("today", baseline_tree(args.baseline_rev, tmp),
                                  tmp),
                 "new": install("new", SOURCE, tmp)}
        daemon = knnd_harness.Daemon(
            os.path.join(args.build, "knnd"), ["--index", index],
            log_path=os.path.join(tmp, "knnd.log"),
            knnctl=os.path.join(args.build, "knnctl"))
        postgres = PostgreSQL(args.work) if args.pg_python else None
        try:
            if postgres:
                args.pg_dsn = postgres.dsn
            if not daemon.wait_serving(120):
                sys.exit("knnd did not start: " + daemon.read_log())
            report(args, sites, daemon.address)
        finally:
            daemon.stop(10)
            if postgres:
                postgres.stop()


def report(args, sites, address):
    cases = [("bare grpcio stub (floor)", "new", "stub"),
             ("KnnClient, today", "today", "sync"),
             ("KnnClient, new", "new", "sync"),
             ("bare grpc.aio stub", "new", "aio_stub"),
             ("AsyncKnnClient, today", "today", "async"),
             ("AsyncKnnClient, new", "new", "async")]
    if args.pg_dsn:
        cases.append((PSYCOPG, "new", "psycopg"))
    samples = {(label, nq): [] for label, _, _ in cases for nq in (1, 100)}
    for _ in range(args.rounds):
        for nq in (1, 100):
            for label, site, case in cases:
                samples[label, nq].append(measure(
                    sites[site], case, address, nq, args.seconds, args.pg_dsn,
                    args.pg_python if case == "psycopg" else None))
    print(f"Client CPU per call (us, median of {args.rounds} rounds of "
          f"{args.seconds:g} s), k={K}, Fashion-MNIST (784 dims):")
    print("| case | 1 query | 100 queries |\n|---|---|---|")
    cpu = {key: median_case(v) for key, v in samples.items()}
    for label, _, _ in cases:
        print(f"| {label} | {cpu[label, 1]:.0f} | {cpu[label, 100]:.0f} |")
    for nq in (1, 100):
        print(f"{nq} queries: new/today sync "
              f"{cpu['KnnClient, new', nq] / cpu['KnnClient, today', nq]:.2f}x, "
              f"async {cpu['AsyncKnnClient, new', nq] / cpu['AsyncKnnClient, today', nq]:.2f}x; "
              f"new async/sync "
              f"{cpu['AsyncKnnClient, new', nq] / cpu['KnnClient, new', nq]:.2f}x; "
              f"new sync/floor "
              f"{cpu['KnnClient, new', nq] / cpu['bare grpcio stub (floor)', nq]:.2f}x"
              + (f"; new sync/psycopg "
                 f"{cpu['KnnClient, new', nq] / cpu[PSYCOPG, nq]:.2f}x"
                 if args.pg_dsn else ""))
    qps = {"today": [], "new": []}
    for _ in range(args.rounds):
        for label in ("today", "new"):
            qps[label].append(throughput(sites[label], address, args.procs,
                                         args.seconds))
    today, new = (statistics.median(qps[k]) for k in ("today", "new"))
    print(f"{args.procs} single-query client processes (median of "
          f"{args.rounds} rounds of {args.seconds:g} s): today {today:.0f} q/s, "
          f"new {new:.0f} q/s, {new / today:.2f}x")


if __name__ == "__main__":
    main()

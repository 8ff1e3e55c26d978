#!/usr/bin/python3
"""What sharding costs and gives, measured on one machine (docs/sharding.md).

  /usr/bin/python3 bench/shard_bench.py [--build build] [--data fashion|synthetic]
      [--shards 1,2,4] [--seconds 4] [--rounds 3] [--nprobe N --refine_factor R]
      [--workers N] [--placement auto|netns|loopback] [--rebuild]
      [--baseline KNND] [--json FILE] [--work /tmp/knnd_shard_bench]

One index is built with `knnctl build`'s default recipe (FastScan with
INDEX.vectors): Fashion-MNIST's 60,000 x 784 training images by default,
queries from its t10k images; `--data synthetic` takes 200,000 seeded
clustered vectors x 128 instead (run_bench.py's generator), queries from
the same clusters. Unless --nprobe and --refine_factor are given, `knnctl
tune` (recall@10 >= 0.95 on the first 1,000 queries) chooses them; either
way every request of every setup sends the same nprobe and refine_factor.
`knnctl shard --shards S` then splits that one index for every S, so that
every set shares its quantizers.

Setups, all started before the first measurement and kept for the whole run:
  - unsharded: the unsharded index served by one knnd, called directly (the
    baseline);
  - front, S shards (S in --shards, S = 1 included): S shard knnds and a
    knnd front (`--shard_targets`) that merges them, called through the
    front.
Each shard knnd gets --workers max(1, cores / S) (the unsharded one: cores),
so that the search threads of a set add up to the cores where S divides
them; a knnd cannot have fewer than one. Placement: run as root where `ip
netns` works, each knnd serving an index (the unsharded one and every
shard) runs in its own network namespace joined to the root namespace by a
veth pair (a simulated host; the kernel still carries the bytes, on the
same cores); the fronts and load_gen run in the root namespace (the
caller's host). Otherwise everything is on 127.0.0.1.

Measured through each setup's address with build/bench/load_gen (closed
loop), --rounds rounds that alternate the order of the setups: 1-query
requests with 1 and 32 clients, 100-query requests with 4 clients. The
table gives medians over the rounds, the ratios vs the unsharded knnd are
medians of the per-round ratios. recall@10 of each setup's answers for the
first 1,000 queries (100 per request) against exact neighbours (FAISS
IndexFlatL2 over the base vectors) checks the merge: every setup's recall
must be the unsharded knnd's (within RECALL_TOLERANCE, what ties at equal
distances explain; the table counts the queries whose ids or distances
differ), else the run says MERGE CHECK FAILED and exits 1 after the load
figures. Last, build/bench/merge_bench (when built) times the merge itself. Output is markdown on stdout; --json writes the raw figures.
Every process and namespace this script starts is removed on exit.
"""
import argparse
import atexit
import datetime
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "python"))
sys.path.insert(0, os.path.join(SOURCE, "bench"))
from knnd_harness import Daemon, generate_stubs  # noqa: E402
import run_bench  # noqa: E402  (clustered, read_idx_gz, machine, cpu_seconds)

ARGS = None
K = 10
RECALL_QUERIES = 1000
# Largest difference in recall@K from the unsharded knnd that ties (see the
# recall table's text) explain; above it the merge check fails.
RECALL_TOLERANCE = 0.002
LOADS = [(1, 1), (1, 32), (100, 4)]  # (queries per request, clients)
FASHION = "/usr/share/datasets/fashion-mnist"
# Processes that, running beside the bench, would take its cores.
FOREIGN = r"ctest|sharded_netns_test|cc1plus|knnd|knnctl|load_gen|search_bench"


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def foreign_processes():
    """Processes matching FOREIGN that this script neither started nor was
    started by."""
    parent, children = {}, {}
    for line in run(["ps", "-e", "-o", "pid=,ppid="]).splitlines():
        pid, ppid = map(int, line.split())
        parent[pid] = ppid
        children.setdefault(ppid, []).append(pid)
    mine, pid = set(), os.getpid()
    while pid > 1 and pid not in mine:  # this process and its ancestors
        mine.add(pid)
        pid = parent.get(pid, 1)
    todo = [os.getpid()]
    while todo:  # its descendants
        for child in children.get(todo.pop(), []):
            if child not in mine:
                mine.add(child)
                todo.append(child)
    found = subprocess.run(["pgrep", "-af", FOREIGN], text=True,
                           capture_output=True).stdout.splitlines()
    return [f for f in found if int(f.split()[0]) not in mine and "pgrep" not in f]


def describe(processes, show=3):
    if not processes:
        return "none"
    more = f"; and {len(processes) - show} more" if len(processes) > show else ""
    return (f"{len(processes)}: " + "; ".join(f"`{p[:90]}`" for p in processes[:show])
            + more)


# ----------------------------------------------------------- placement --

class Placement:
    """Where a knnd serving an index runs: its own network namespace
    joined by a veth pair, or loopback. Owns the namespaces it makes."""

    def __init__(self, mode):
        self.namespaces = []
        self.tag = f"ksb{os.getpid() % 100000}"
        self.netns = False
        self.why = ""
        if mode == "loopback":
            self.why = "loopback (--placement loopback)"
            return
        reason = self._netns_usable()
        if reason:
            if mode == "netns":
                raise SystemExit(f"--placement netns: {reason}")
            self.why = f"loopback ({reason})"
            return
        self.netns = True
        self.why = ("network namespaces: each knnd serving an index (the unsharded "
                    "one and every shard) in its own namespace, joined to the root "
                    "namespace by a veth pair (a /30 each, 10.%d.N.0); the fronts "
                    "and load_gen in the root namespace" % self.octet)

    def _netns_usable(self):
        if os.geteuid() != 0:
            return "not root"
        if not shutil.which("ip"):
            return "no `ip` command"
        used = run(["ip", "-o", "addr"])
        self.octet = next((o for o in range(213, 250) if f" 10.{o}." not in used), None)
        if self.octet is None:
            return "no free 10.x.0.0/16"
        probe = f"{self.tag}-probe"
        r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if r.returncode != 0:
            return f"`ip netns add` failed: {r.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return ""

    def host(self, i):
        """(command prefix, IP address) of simulated host i."""
        if not self.netns:
            return [], "127.0.0.1"
        ns = f"{self.tag}-{i}"
        host_if, ns_if = f"{self.tag}h{i}", f"{self.tag}n{i}"
        subnet = f"10.{self.octet}.{i}"
        run(["ip", "netns", "add", ns])
        self.namespaces.append(ns)
        for cmd in (["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if,
                     "netns", ns],
                    ["ip", "addr", "add", f"{subnet}.1/30", "dev", host_if],
                    ["ip", "link", "set", host_if, "up"],
                    ["ip", "-n", ns, "addr", "add", f"{subnet}.2/30", "dev", ns_if],
                    ["ip", "-n", ns, "link", "set", ns_if, "up"],
                    ["ip", "-n", ns, "link", "set", "lo", "up"]):
            run(cmd)
        return ["ip", "netns", "exec", ns], f"{subnet}.2"

    def cleanup(self):
        """Deletes every namespace made (its end of the veth pair goes with
        it, and the other end with that)."""
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces = []


# --------------------------------------------------------------- setups --

class Setup:
    """One way of serving the index: shard knnds (or the unsharded knnd)
    and, for a sharded set, a front."""

    def __init__(self, name, shards, front, count):
        self.name, self.shards, self.front, self.count = name, shards, front, count
        self.target = (front or shards[0]).address

    def daemons(self):
        return self.shards + ([self.front] if self.front else [])


DAEMONS = []


def start_knnd(args, log, prefix=(), address=None, binary=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    d = Daemon(binary or f"{ARGS.bin}/knnd", [*args, "--log_level", "warn"],
               log_path=f"{ARGS.work}/logs/{log}.log", address=address,
               knnctl=f"{ARGS.bin}/knnctl", prefix=prefix, env=env)
    DAEMONS.append(d)
    return d


def wait_all(daemons):
    for d in daemons:
        if not d.wait_serving(300, poll_s=0.05):
            raise RuntimeError(f"knnd not SERVING ({d.log_path}):\n{d.read_log()[-2000:]}")


def stop_all(placement):
    for d in reversed(DAEMONS):
        try:
            d.stop(grace_s=5)
        except Exception:
            pass
    DAEMONS.clear()
    placement.cleanup()


# ------------------------------------------------------------------ data --

def prepare_data():
    """Base vectors file for knnctl, queries (all, float32), the raw query
    file for load_gen and a description."""
    os.makedirs(ARGS.work, exist_ok=True)
    if ARGS.data == "fashion":
        train = f"{FASHION}/train-images-idx3-ubyte.gz"
        test = f"{FASHION}/t10k-images-idx3-ubyte.gz"
        base = run_bench.read_idx_gz(train)
        queries = run_bench.read_idx_gz(test)
        base_file, tune_file = train, test
        desc = (f"Fashion-MNIST: {len(base):,} x {base.shape[1]} training images "
                f"({train}); {len(queries):,} t10k images as queries")
    else:
        base_file = f"{ARGS.work}/synthetic_200000x128.npy"
        tune_file = f"{ARGS.work}/synthetic_queries_128.npy"
        if not os.path.exists(base_file):
            np.save(base_file + ".tmp.npy", run_bench.clustered(200_000, 128, 1))
            os.rename(base_file + ".tmp.npy", base_file)
        if not os.path.exists(tune_file):
            np.save(tune_file + ".tmp.npy", run_bench.clustered(10_000, 128, 2))
            os.rename(tune_file + ".tmp.npy", tune_file)
        base, queries = np.load(base_file), np.load(tune_file)
        desc = (f"synthetic: {len(base):,} seeded clustered vectors x 128 (256 clusters, "
                f"seed 1); {len(queries):,} queries from the same clusters (seed 2)")
    raw = f"{ARGS.work}/{ARGS.data}_queries.f32"
    np.ascontiguousarray(queries, dtype=np.float32).tofile(raw)
    return base, queries, base_file, tune_file, raw, desc


def knnctl(*args):
    return run([f"{ARGS.bin}/knnctl", *args])


def sidecar(path):
    with open(path + ".meta.json") as f:
        return json.load(f)


def build(base_file, tune_file):
    """The one index (built unless present), its nprobe and refine_factor,
    and a line saying where they come from."""
    index = f"{ARGS.work}/{ARGS.data}{f'_m{ARGS.m}' if ARGS.m else ''}.index"
    built = False
    if ARGS.rebuild or not os.path.exists(index + ".meta.json"):
        t0 = time.time()
        knnctl("build", "--input", base_file, "--output", index,
               *(["--m", str(ARGS.m)] if ARGS.m else []))
        built = True
        print(f"[built {index} in {time.time() - t0:.0f} s]", flush=True)
    meta = sidecar(index)
    if ARGS.nprobe and ARGS.refine_factor is not None:
        return index, built, ARGS.nprobe, ARGS.refine_factor, "explicit (--nprobe, --refine_factor)"
    if not meta.get("tuned_nprobe"):
        t0 = time.time()
        try:
            knnctl("tune", "--index", index, "--queries", tune_file, "--limit",
                   str(RECALL_QUERIES), "--k", str(K), "--target_recall", "0.95")
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"knnctl tune failed ({(e.stderr or e.stdout).strip()[-300:]}); "
                             "give --nprobe and --refine_factor")
        print(f"[tuned {index} in {time.time() - t0:.0f} s]", flush=True)
        meta = sidecar(index)
    return (index, built, int(meta["tuned_nprobe"]), int(meta["tuned_refine_factor"]),
            f"the index's tuned defaults (`knnctl tune --target_recall 0.95 --limit "
            f"{RECALL_QUERIES}` on the first {RECALL_QUERIES} queries: recall@10 "
            f"{meta['tuned_recall']:.4f} in-process), sent explicitly in every request")


def shard(index, s):
    paths = [f"{index}.shard-{i}-of-{s}" for i in range(s)]
    if ARGS.rebuild or not all(os.path.exists(p + ".meta.json") for p in paths):
        knnctl("shard", "--index", index, "--shards", str(s))
    return paths


def mib(path):
    return os.path.getsize(path) / 2**20


# --------------------------------------------------------------- measure --

def cpu(pid):
    try:
        return run_bench.cpu_seconds(pid)
    except (FileNotFoundError, ProcessLookupError):
        return float("nan")


def load(setup, batch, clients, nprobe, refine):
    shard_pids = [d.proc.pid for d in setup.shards]
    front_pid = setup.front.proc.pid if setup.front else None
    s0 = sum(cpu(p) for p in shard_pids)
    f0 = cpu(front_pid) if front_pid else 0.0
    t0 = time.time()
    res = json.loads(run([f"{ARGS.bin}/load_gen", "--target", setup.target,
                          "--queries", ARGS.raw_queries, "--d", str(ARGS.dim),
                          "--batch", str(batch), "--clients", str(clients),
                          "--seconds", str(ARGS.seconds), "--k", str(K),
                          "--nprobe", str(nprobe), "--refine_factor", str(refine)]))
    wall = time.time() - t0
    res["shard_cores"] = (sum(cpu(p) for p in shard_pids) - s0) / wall
    res["front_cores"] = ((cpu(front_pid) - f0) / wall) if front_pid else 0.0
    if res["errors"]:
        print(f"  [{setup.name}, {batch} x {clients}: {res['errors']} errors: "
              f"{res['first_error']}]", flush=True)
    return res


def answers(setup, queries, nprobe, refine):
    """The setup's ids and distances (RECALL_QUERIES x K each) for the first
    RECALL_QUERIES queries, 100 per request."""
    from knnd.v1 import knn_service_pb2 as pb
    from knnd.v1 import knn_service_pb2_grpc as pb_grpc
    import grpc
    ids, distances = [], []
    with grpc.insecure_channel(setup.target, options=[
            ("grpc.max_receive_message_length", -1)]) as ch:
        stub = pb_grpc.KnnServiceStub(ch)
        for i in range(0, RECALL_QUERIES, 100):
            q = np.ascontiguousarray(queries[i:i + 100], dtype=np.float32)
            r = stub.Search(pb.SearchRequest(vectors_f32le=q.tobytes(), k=K, nprobe=nprobe,
                                             refine_factor=refine), timeout=120)
            assert r.nprobe == nprobe and r.refine_factor == refine, (r.nprobe, r.refine_factor)
            ids.append(np.array(r.ids, dtype=np.int64).reshape(r.num_queries, r.k))
            distances.append(np.array(r.distances, dtype=np.float32).reshape(r.num_queries, r.k))
    return np.concatenate(ids), np.concatenate(distances)


def recall(found, truth):
    return float(np.mean([len(set(f) & set(t)) / K for f, t in zip(found, truth)]))


def fmt(x, digits=2):
    return f"{x:.{digits}f}"


def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(flush=True)


# ------------------------------------------------------------------ main --

def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=f"{SOURCE}/build")
    p.add_argument("--work", default="/tmp/knnd_shard_bench")
    p.add_argument("--data", choices=("fashion", "synthetic"), default="fashion")
    p.add_argument("--shards", default="1,2,4")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per load")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nprobe", type=int, default=0, help="0: the tuned default")
    p.add_argument("--refine_factor", type=int, default=None,
                   help="with --nprobe: explicit; else the tuned default")
    p.add_argument("--workers", type=int, default=0,
                   help="workers per shard knnd; 0: max(1, cores / S)")
    p.add_argument("--placement", choices=("auto", "netns", "loopback"), default="auto")
    p.add_argument("--m", type=int, default=0,
                   help="knnctl build --m (PQ sub-quantizers); 0: the recipe's")
    p.add_argument("--rebuild", action="store_true", help="build and shard the index anew")
    p.add_argument("--baseline", default="",
                   help="another knnd binary (e.g. an older build) run as a second front "
                        "of each set of shards, measured in the same rounds")
    p.add_argument("--json", default="", help="write the raw figures here")
    p.add_argument("--skip-merge-bench", action="store_true")
    ARGS = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    command = shlex.join(["/usr/bin/python3", os.path.relpath(sys.argv[0], SOURCE)]
                         + sys.argv[1:])
    print(f"Command: `{command}` (in {SOURCE})", flush=True)
    shard_counts = [int(s) for s in ARGS.shards.split(",") if s]
    cores = os.cpu_count()
    started = datetime.datetime.now(datetime.timezone.utc)
    foreign_before = foreign_processes()
    load_before = loadavg()

    placement = Placement(ARGS.placement)

    def on_signal(signum, _frame):
        raise SystemExit(f"signal {signum}")
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    atexit.register(stop_all, placement)

    # Copies of the binaries, taken now: a rebuild of BUILD during the run
    # (other work on the machine) then changes nothing under it.
    ARGS.bin = f"{ARGS.work}/bin"
    os.makedirs(ARGS.bin, exist_ok=True)
    for src in ("knnd", "knnctl", "bench/load_gen", "bench/merge_bench"):
        copy = f"{ARGS.bin}/{os.path.basename(src)}"
        if os.path.exists(f"{ARGS.build}/{src}"):
            shutil.copy2(f"{ARGS.build}/{src}", copy)
        elif os.path.exists(copy):
            os.unlink(copy)  # not built: no stale copy either
    base, queries, base_file, tune_file, ARGS.raw_queries, data_desc = prepare_data()
    ARGS.dim = base.shape[1]
    index, built, nprobe, refine, knobs = build(base_file, tune_file)
    meta = sidecar(index)
    sets = {s: shard(index, s) for s in shard_counts}
    os.makedirs(f"{ARGS.work}/logs", exist_ok=True)
    stubs = tempfile.mkdtemp(prefix="stubs-", dir=ARGS.work)
    atexit.register(shutil.rmtree, stubs, True)
    generate_stubs(SOURCE, stubs)

    import faiss
    faiss.omp_set_num_threads(cores)
    flat = faiss.IndexFlatL2(base.shape[1])
    flat.add(np.ascontiguousarray(base, dtype=np.float32))
    _, truth = flat.search(np.ascontiguousarray(queries[:RECALL_QUERIES], dtype=np.float32), K)
    del flat

    def workers(s):
        return ARGS.workers or max(1, cores // s)

    version = run([f"{ARGS.bin}/knnd", "--version"]).strip()
    print(f"- Date: {started:%Y-%m-%d %H:%M} UTC")
    print(f"- Machine: {run_bench.machine()}; load average before the run: {load_before}")
    print("- Other processes (" + FOREIGN.replace("|", ", ") + ") at the start: "
          + describe(foreign_before))
    print(f"- knnd: `{version}` (knnd, knnctl, load_gen and merge_bench copied from "
          f"{os.path.relpath(ARGS.build, SOURCE)}/ at the start)")
    print(f"- Data: {data_desc}")
    print(f"- Index: `knnctl build --input {base_file} --output {index}"
          + (f" --m {ARGS.m}" if ARGS.m else "") + "` ("
          + ("" if ARGS.m else "default recipe: ") + f"{meta['factory']}, with INDEX.vectors); "
          + ("built in this run" if built else f"reused from {meta['created']}")
          + f"; split with `knnctl shard --shards S` for S in {ARGS.shards}")
    print(f"- Requests: k {K}, nprobe {nprobe}, refine_factor {refine}: {knobs}")
    print(f"- Workers: unsharded knnd {cores} (one per core); each shard knnd "
          + ", ".join(f"{workers(s)} for S = {s}" for s in shard_counts)
          + (" (--workers)" if ARGS.workers else
             f" = max(1, {cores} cores / S): a set's search threads add up to the cores "
             "where S divides them; a knnd has at least one, so S above the cores "
             "oversubscribes them")
          + "; fronts: knnd defaults (a front holds no index and searches nothing)")
    print(f"- Placement: {placement.why}")
    print(f"- Load: `build/bench/load_gen` (closed loop, one connection per client), "
          f"{ARGS.seconds:g} s measured (+0.5 s warm-up) per load, {ARGS.rounds} rounds "
          "alternating the order of the setups; medians over the rounds")
    print(flush=True)

    # Shard sizes: rows and files, from the sidecars.
    rows = [["unsharded", "—", f"{int(meta['ntotal']):,}", fmt(mib(index), 1),
             fmt(mib(index + '.vectors'), 1)]]
    for s, paths in sets.items():
        for pth in paths:
            m = sidecar(pth)
            rows.append([f"{s}", f"{m['shard_id']} [{int(m['shard_first_id']):,}, "
                         f"{int(m['shard_end_id']):,})", f"{int(m['ntotal']):,}",
                         fmt(mib(pth), 1), fmt(mib(pth + '.vectors'), 1)])
    print("Shards (from the sidecars; the index file holds the codes and ids of the "
          "shard's rows plus the replicated coarse centroids and PQ codebooks):")
    print()
    table(["S", "shard [ids)", "rows", "index MiB", "vectors MiB"], rows)

    # Start every setup.
    setups = []
    try:
        host = 0
        prefix, ip = placement.host(host)
        host += 1
        d = start_knnd(["--index", index, "--workers", str(cores)], "unsharded", prefix,
                       f"{ip}:50051" if placement.netns else None)
        setups.append(Setup("unsharded (direct)", [d], None, 0))
        shard_daemons = {}
        for s, paths in sets.items():
            shard_daemons[s] = []
            for i, pth in enumerate(paths):
                prefix, ip = placement.host(host)
                host += 1
                shard_daemons[s].append(start_knnd(
                    ["--index", pth, "--workers", str(workers(s))], f"s{s}_shard{i}", prefix,
                    f"{ip}:50051" if placement.netns else None))
        # The shards' addresses are final once they serve (a loopback knnd
        # whose port was taken meanwhile restarts on another).
        wait_all(DAEMONS)
        for s, shards in shard_daemons.items():
            targets = "--shard_targets=" + ",".join(x.address for x in shards)
            label = f"{s} shard{'s' if s > 1 else ''}"
            front = start_knnd([targets], f"s{s}_front")
            setups.append(Setup(f"front, {label}", shards, front, s))
            if ARGS.baseline:
                front = start_knnd([targets], f"s{s}_baseline_front", binary=ARGS.baseline)
                setups.append(Setup(f"baseline front, {label}", shards, front, s))
        wait_all(DAEMONS)
        print(f"[{len(DAEMONS)} knnd processes serving]", flush=True)

        # Recall, and the merged ids against the unsharded knnd's.
        found = {st.name: answers(st, queries, nprobe, refine) for st in setups}
        base_ids, base_dist = found[setups[0].name]
        recall_rows, R = [], {"recall": {}, "rounds": []}
        base_recall = recall(base_ids, truth)
        merge_ok = True
        for st in setups:
            f, dist = found[st.name]
            order = int(np.sum(np.any(f != base_ids, axis=1)))
            sets_differ = sum(set(a) != set(b) for a, b in zip(f, base_ids))
            dist_differ = int(np.sum(np.any(~np.isclose(np.sort(dist, axis=1),
                                                       np.sort(base_dist, axis=1),
                                                       rtol=1e-5, atol=1e-3), axis=1)))
            rc = recall(f, truth)
            merge_ok &= abs(rc - base_recall) <= RECALL_TOLERANCE
            R["recall"][st.name] = {"recall": rc, "rows_differ": order,
                                    "sets_differ": sets_differ, "distances_differ": dist_differ}
            recall_rows.append([st.name, f"{rc:.4f}", str(sets_differ), str(dist_differ),
                                str(order)])
        print(f"recall@{K} of the answers to the first {RECALL_QUERIES} queries (100 per "
              "request) against exact neighbours, and how many of those queries' answers "
              "differ from the unsharded knnd's (other ids; other distances, compared "
              "sorted; other ids or order). Ties: the merge orders equal distances by id, "
              "FAISS by scan order, so at equal distances other ids are expected with the "
              "same distances (docs/sharding.md); with re-ranking, FastScan's quantized "
              "estimates tie often at the refine_factor x k cut, where which of the tied "
              "candidates are re-ranked changes the exact answer:")
        print()
        table(["setup", f"recall@{K}", "queries with other ids", "queries with other "
               "distances", "queries with other ids or order"], recall_rows)
        if not merge_ok:
            print(f"**MERGE CHECK FAILED**: a recall@{K} through the front differs from the "
                  f"unsharded knnd's by more than {RECALL_TOLERANCE} (docs/sharding.md: the "
                  "merged top-k is the unsharded index's up to the order of equal "
                  "distances). The load figures below still measure the same lists, codes "
                  "and re-ranking per query, but their answers are wrong.")
            print(flush=True)

        # Load rounds.
        for r in range(ARGS.rounds):
            order = setups if r % 2 == 0 else list(reversed(setups))
            results = {}
            for st in order:
                for batch, clients in LOADS:
                    results[(st.name, batch, clients)] = load(st, batch, clients, nprobe,
                                                              refine)
            R["rounds"].append(results)
            print(f"[round {r + 1}/{ARGS.rounds} done, load average {loadavg()}]", flush=True)
    finally:
        stop_all(placement)

    # The table: medians over rounds; ratios: medians of per-round ratios.
    base_name = setups[0].name
    rows = []
    R["table"] = []
    for batch, clients in LOADS:
        for st in setups:
            per = [rd[(st.name, batch, clients)] for rd in R["rounds"]]
            ref = [rd[(base_name, batch, clients)] for rd in R["rounds"]]

            def med(key, xs=per):
                return statistics.median(x[key] for x in xs)
            qps_ratio = statistics.median(a["qps"] / b["qps"] for a, b in zip(per, ref)
                                          if b["qps"] > 0)
            p50_ratio = statistics.median(a["p50_ms"] / b["p50_ms"] for a, b in zip(per, ref)
                                          if b["p50_ms"] > 0)
            p99_ratio = statistics.median(a["p99_ms"] / b["p99_ms"] for a, b in zip(per, ref)
                                          if b["p99_ms"] > 0)
            errors = sum(x["errors"] for x in per)
            row = dict(setup=st.name, shards=st.count, batch=batch, clients=clients,
                       qps=med("qps"), p50_ms=med("p50_ms"), p99_ms=med("p99_ms"),
                       errors=errors, shard_cores=med("shard_cores"),
                       front_cores=med("front_cores"), client_cores=med("client_cores"),
                       qps_ratio=qps_ratio, p50_ratio=p50_ratio, p99_ratio=p99_ratio,
                       qps_rounds=[x["qps"] for x in per])
            R["table"].append(row)
            rows.append([f"{batch} x {clients}", st.name, f"{row['qps']:.0f}",
                         fmt(row["p50_ms"]), fmt(row["p99_ms"]), str(errors),
                         fmt(row["shard_cores"]),
                         fmt(row["front_cores"]) if st.front else "—",
                         fmt(row["client_cores"]), fmt(qps_ratio), fmt(p50_ratio),
                         fmt(p99_ratio)])
    print(f"q/s, p50 and p99 (ms, client side), medians of {ARGS.rounds} rounds; cores = CPU "
          "seconds per wall second of the shard knnds together, of the front and of "
          "load_gen; vs unsharded = median over the rounds of the ratio to the unsharded "
          "knnd measured in the same round:")
    print()
    table(["queries/request x clients", "setup", "q/s", "p50 ms", "p99 ms", "errors",
           "shard cores", "front cores", "load_gen cores", "q/s vs unsharded",
           "p50 vs unsharded", "p99 vs unsharded"], rows)
    print(f"Load average after the run: {loadavg()}. Other processes at the end: "
          + describe(foreign_processes()) + ".")
    print(flush=True)

    merge_bench = f"{ARGS.bin}/merge_bench"
    if not ARGS.skip_merge_bench and os.path.exists(merge_bench):
        print("`build/bench/merge_bench` (the front's CheckShardAnswers + "
              "MergeShardAnswers on synthetic shard answers, no gRPC):")
        print()
        text = run([merge_bench])
        R["merge_bench"] = text
        print("\n".join(line for line in text.splitlines() if not line.startswith("# ")))
        print(flush=True)

    if ARGS.json:
        R["rounds"] = [{f"{n} | {b} x {c}": v for (n, b, c), v in rd.items()}
                       for rd in R["rounds"]]
        R.update(command=command, date=f"{started:%Y-%m-%d %H:%M} UTC",
                 machine=run_bench.machine(), knnd=version, placement=placement.why,
                 nprobe=nprobe, refine_factor=refine, data=data_desc,
                 workers={s: workers(s) for s in shard_counts})
        with open(ARGS.json, "w") as f:
            json.dump(R, f, indent=1)
    if not merge_ok:
        sys.exit(1)


if __name__ == "__main__":
    main()

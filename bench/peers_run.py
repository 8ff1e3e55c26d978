#!/usr/bin/env python3
"""`make bench-peers`: knnd against the newest FAISS, ScaNN and hnswlib in one
run, with paired, interleaved rounds (bench/RESULTS.md "Peers").

  peers_run.py --build BUILD [--work /tmp/knnd_peers] [--sets fashion,minilm]
               [--rounds 5] [--targets 0.95,0.98,0.99]

Run by the Python of a venv holding faiss-cpu, scann and hnswlib (the make
target creates it under --work; `make test` never needs it). Per set:
  knnd       knnctl build's default recipe (IVF<nlist>,PQ<M>x4fs with its
             INDEX.vectors), searched in process by build/bench/peers_bench
             (IndexSnapshot::Search), nprobe x refine_factor sweep
  faiss      faiss-cpu's index_factory("<knnd's factory>,RFlat"), nprobe x
             k_factor sweep (the same recipe and exact re-ranking)
  scann      a tree of as many leaves as knnd's nlist, 4-bit anisotropic
             hashing (dims / 2 blocks), exact reorder; leaves x reorder sweep
  hnswlib    M 16, efConstruction 200, ef sweep
Every system is swept once in each mode, one query per call ("single") and
all the queries in one call ("batch") (recall@10 against exact search; the
faster of --sweep_passes passes per setting, 2 by default); then,
for each recall target and mode, each system's fastest setting reaching it in
that mode's sweep is measured again in --rounds rounds, each round running
every system once in a rotated order, 1 thread; q/s are from process CPU time, so
time spent descheduled on a shared machine counts against nobody. The ratio
knnd / best peer is taken inside each round (median, min-max printed).
Then knnd through gRPC: build/knnd serving the same index, build/bench/load_gen
sending 256-row requests from each of --grpc_clients closed-loop client
counts (2 and 4: with 2, a worker idles while its client's next request is
in transit; 4 keeps both workers' queues filled, as a server's throughput is
measured), against peers_bench's 2 threads of 256-row calls in process (wall
q/s, rounds interleaved the same way). The load generator runs on the same
cores: its share (client_cores) is printed, and the cores knnd (all its
threads, and its workers alone) and the in-process loop used in the same
windows, with the q/s per core of each over the in-process loop's. --grpc_wire f32,f16 measures
float16 requests (vectors_f16le, half the bytes) in the same rounds, and the
recall of the queries rounded to float16. bench/noop_server --index, the same
search inline on gRPC's threads with none of knnd's serving (gate, workers,
limits, metrics, logging), is measured beside it at each client count
(--no-grpc_bare: not): the part of the gap to in process that any gRPC
server around this search pays.

Sets: Fashion-MNIST (60,000 x 784, the first --nq test images as queries)
and "minilm": seeded synthetic rows shaped like all-MiniLM-L6-v2 embeddings
(384 dims spanned by a 24-dim latent space of 1,024 clusters plus noise,
frontier_run.embedding_like), --minilm_rows rows; and any data of one's
own as NAME=BASE.npy:QUERIES.npy (float32 rows; the first --nq queries),
e.g. --sets fashion,mine=/data/base.npy:/data/queries.npy. Indexes are built
once under --work and reused.
"""
import argparse
import datetime
import gzip
import json
import os
import subprocess
import sys
import time

import numpy as np

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(SOURCE, "bench"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "python"))
from frontier_run import embedding_like  # noqa: E402
from knnd_harness import free_port  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
K = 10
ARGS = None


def read_idx_gz(path):
    with gzip.open(path) as f:
        data = f.read()
    n, rows, cols = np.frombuffer(data[4:16], dtype=">u4")
    return np.frombuffer(data[16:], dtype=np.uint8).reshape(n, rows * cols).astype(np.float32)


def cpu_model():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def recall(ids, truth):
    hits = sum(len(set(a) & set(b)) for a, b in zip(ids.tolist(), truth.tolist()))
    return hits / (K * len(truth))


def data_set(name, work, files=None):
    """(base, queries) of set `name`, cached as .npy under `work`; `files`:
    (BASE.npy, QUERIES.npy) of a set of one's own."""
    base_npy, query_npy = f"{work}/base.npy", f"{work}/queries.npy"
    if not os.path.exists(base_npy):
        if files is not None:
            base = np.load(files[0], mmap_mode="r").astype(np.float32)
            queries = np.load(files[1]).astype(np.float32)[:ARGS.nq]
        elif name == "fashion":
            base = read_idx_gz(f"{FASHION}/train-images-idx3-ubyte.gz")
            queries = read_idx_gz(f"{FASHION}/t10k-images-idx3-ubyte.gz")[:ARGS.nq]
        elif name == "minilm":
            base = embedding_like(ARGS.minilm_rows, 384, seed=1)
            queries = embedding_like(ARGS.nq, 384, seed=2)
        else:
            raise SystemExit(f"unknown set {name}: fashion, minilm or "
                             "NAME=BASE.npy:QUERIES.npy")
        np.save(query_npy, np.ascontiguousarray(queries))
        np.save(base_npy + ".tmp.npy", np.ascontiguousarray(base))
        os.rename(base_npy + ".tmp.npy", base_npy)
    return np.load(base_npy), np.load(query_npy)


def exact_truth(base, queries, work):
    import faiss
    path = f"{work}/truth.npy"
    if not os.path.exists(path):
        index = faiss.IndexFlatL2(base.shape[1])
        index.add(base)
        np.save(path, index.search(queries, K)[1])
    return np.load(path)


class CpuTimer:
    """Process CPU seconds of a block."""

    def __enter__(self):
        self.t0 = time.process_time()
        return self

    def __exit__(self, *exc):
        self.seconds = time.process_time() - self.t0


# ---- Systems: each has settings(), prepare(setting), single(q), batch(Q) ----

# The IVF systems' grid: nprobe (ScaNN: leaves searched) x refine factor
# (ScaNN: reorder = K x it). Low-dimensional sets (128 dims) reach 0.98
# with one or two lists and a deep re-ranking, Fashion-MNIST with 8-16
# lists and a shallow one; the sweep skips deeper re-ranking once a setting
# reached the highest target.
NPROBES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
REFINES = (2, 3, 4, 6, 8, 12, 16, 24)


class Knnd:
    name = "knnd"

    def __init__(self, work, base_npy, query_npy):
        self.index = f"{work}/knnd.index"
        if not os.path.exists(self.index):
            subprocess.run([f"{ARGS.build}/knnctl", "build", "--input", base_npy,
                            "--output", self.index, "--threads", "2"], check=True)
        info = subprocess.run([f"{ARGS.build}/knnctl", "info", "--index", self.index],
                              check=True, capture_output=True, text=True).stdout
        self.factory = next(line.split(":", 1)[1].strip() for line in info.splitlines()
                            if line.startswith("type:"))
        self.nlist = int(self.factory.split(",")[0][3:])
        self.proc = subprocess.Popen(
            [f"{ARGS.build}/bench/peers_bench", "--index", self.index,
             "--queries", query_npy], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        ready = self.proc.stdout.readline().split()
        assert ready[:1] == ["ready"], ready
        self.blas = ready[1] if len(ready) > 1 else "?"  # OpenBLAS's kernels
        self.ids_out = f"{work}/knnd_ids.bin"
        self.setting = None

    def settings(self):
        return [(p, r) for p in NPROBES if p <= self.nlist for r in REFINES]

    def run(self, rows, threads, reps, ids=False):
        nprobe, refine = self.setting
        self.proc.stdin.write(f"{rows} {threads} {nprobe} {refine} {reps} "
                              f"{self.ids_out if ids else '-'}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def measure(self, setting, mode, reps, queries):
        """(CPU seconds, ids of the last pass or None)."""
        self.setting = setting
        r = self.run(1 if mode == "single" else 0, 1, reps, ids=True)
        ids = np.fromfile(self.ids_out, dtype=np.int64).reshape(len(queries), K)
        return r["cpu_s"], ids

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def padded(found):
    """One query's ids, -1 after the last found (ScaNN returns fewer than K
    when the leaves searched hold fewer)."""
    return np.concatenate([found, np.full(K - found.size, -1, np.int64)])


def python_measure(single, batch, mode, reps, queries):
    ids = np.empty((len(queries), K), dtype=np.int64)
    with CpuTimer() as t:
        for _ in range(reps):
            if mode == "single":
                for i in range(len(queries)):
                    found = single(queries[i:i + 1])
                    if found.size == K:
                        ids[i] = found
                    else:
                        ids[i] = padded(found.ravel())
            else:
                found = batch(queries)
                if found.shape == ids.shape:
                    ids[:] = found
                else:
                    ids[:] = [padded(np.ravel(f)) for f in found]
    return t.seconds, ids


class Faiss:
    name = "faiss"

    def __init__(self, work, base, factory):
        import faiss
        faiss.omp_set_num_threads(1)
        self.factory = f"{factory},RFlat"
        path = f"{work}/faiss.index"
        if not os.path.exists(path):
            faiss.omp_set_num_threads(2)
            index = faiss.index_factory(base.shape[1], self.factory)
            index.train(base)
            index.add(base)
            faiss.write_index(index, path)
            faiss.omp_set_num_threads(1)
        self.index = faiss.read_index(path)
        self.ivf = faiss.extract_index_ivf(self.index)
        self.refine = faiss.downcast_index(self.index)

    def settings(self):
        return [(p, r) for p in NPROBES if p <= self.ivf.nlist for r in REFINES]

    def measure(self, setting, mode, reps, queries):
        self.ivf.nprobe, self.refine.k_factor = setting[0], float(setting[1])
        search = lambda q: self.index.search(q, K)[1]  # noqa: E731
        return python_measure(search, search, mode, reps, queries)


class Scann:
    name = "scann"

    def __init__(self, work, base, nlist):
        import scann
        path = f"{work}/scann"
        if not os.path.exists(f"{path}/built"):  # its files name their folder
            os.makedirs(path, exist_ok=True)
            searcher = (scann.scann_ops_pybind.builder(base, K, "squared_l2")
                        .tree(num_leaves=nlist, num_leaves_to_search=8,
                              training_sample_size=min(len(base), 100 * nlist))
                        .score_ah(2, anisotropic_quantization_threshold=0.2)
                        .reorder(100).build())
            searcher.serialize(path)
            open(f"{path}/built", "w").close()
        self.searcher = scann.scann_ops_pybind.load_searcher(path)
        self.nlist = nlist

    def settings(self):
        # reorder counts candidates: K x the others' refine factors
        return [(l, K * r) for l in NPROBES if l <= self.nlist for r in REFINES]

    def measure(self, setting, mode, reps, queries):
        leaves, reorder = setting
        single = lambda q: self.searcher.search(  # noqa: E731
            q[0], final_num_neighbors=K, pre_reorder_num_neighbors=reorder,
            leaves_to_search=leaves)[0]
        batch = lambda Q: self.searcher.search_batched(  # noqa: E731
            Q, final_num_neighbors=K, pre_reorder_num_neighbors=reorder,
            leaves_to_search=leaves)[0]
        return python_measure(single, batch, mode, reps, queries)


class Hnsw:
    name = "hnswlib"

    def __init__(self, work, base):
        import hnswlib
        path = f"{work}/hnsw16.bin"
        self.index = hnswlib.Index(space="l2", dim=base.shape[1])
        if not os.path.exists(path):
            self.index.init_index(max_elements=len(base), M=16, ef_construction=200,
                                  random_seed=1)
            self.index.add_items(base, num_threads=2)
            self.index.save_index(path)
        else:
            self.index.load_index(path)
        self.index.set_num_threads(1)

    def settings(self):
        return [(ef,) for ef in (10, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256,
                                 384, 512)]

    def measure(self, setting, mode, reps, queries):
        self.index.set_ef(setting[0])
        search = lambda q: self.index.knn_query(q, k=K, num_threads=1)[0]  # noqa: E731
        return python_measure(search, search, mode, reps, queries)


# ---- The run ----

def sweep(system, queries, truth, mode):
    """Recall and q/s of every setting (the faster of --sweep_passes passes
    each, after one unmeasured pass that brings the index's pages in): the
    setting each system is then measured at is its fastest reaching a target
    in this sweep, and one noisy pass could pick a slower one (minilm, knnd,
    2026-12-04 21:28: (12, 8) over (6, 6))."""
    settings = system.settings()
    system.measure(settings[len(settings) // 2], mode, 1, queries)
    top = max(float(t) for t in ARGS.targets.split(","))
    rows = []
    reached = set()  # first parameters whose recall reached every target
    for s in settings:
        # A larger last parameter (refine factor, reorder, ef) only costs
        # more once the recall reached the highest target.
        if s[:-1] in reached:
            continue
        seconds, ids = system.measure(s, mode, 1, queries)
        for _ in range(ARGS.sweep_passes - 1):
            seconds = min(seconds, system.measure(s, mode, 1, queries)[0])
        rows.append({"setting": list(s), "recall": recall(ids, truth),
                     "qps": len(queries) / seconds})
        if rows[-1]["recall"] >= top:
            reached.add(s[:-1])
    print(f"  {system.name} {mode}: " + "; ".join(
        f"{r['setting']} {r['recall']:.3f} {r['qps']:.0f}" for r in rows), flush=True)
    return rows


def fastest(rows, target):
    hits = [r for r in rows if r["recall"] >= target]
    return max(hits, key=lambda r: r["qps"]) if hits else None


def paired(systems, picks, queries, truth, mode):
    """Per round, every system once in a rotated order: q/s and recall."""
    runs = [s for s in systems if picks[s.name] is not None]
    # Enough passes for about 0.4 s of CPU at the sweep's single-query rate.
    reps = {s.name: max(1, round(0.4 * picks[s.name]["qps"] / len(queries)))
            for s in runs}
    out = {s.name: [] for s in runs}
    rec = {}
    for r in range(ARGS.rounds):
        for i in range(len(runs)):
            s = runs[(i + r) % len(runs)]
            seconds, ids = s.measure(tuple(picks[s.name]["setting"]), mode,
                                     reps[s.name], queries)
            out[s.name].append(reps[s.name] * len(queries) / seconds)
            rec[s.name] = recall(ids, truth)
    return out, rec


def ratios(qps):
    peers = [n for n in qps if n != "knnd"]
    if "knnd" not in qps or not peers:
        return None
    per_round = [qps["knnd"][r] / max(qps[p][r] for p in peers)
                 for r in range(len(qps["knnd"]))]
    return sorted(per_round)


def grpc_mode(knnd, work, queries, setting):
    """knnd through gRPC (256-row requests from each of --grpc_clients closed-
    loop client counts, in each encoding of --grpc_wire) vs in process (2
    threads), interleaved per round. Returns {(wire, clients): [q/s per
    round]}, [in-process q/s per round], {(wire, clients): [load_gen's
    cores per round]} and the cores used: {"server": {(wire, clients):
    [knnd's, per round]}, "workers": {... its workers'}, "inproc": [the
    in-process loop's, per round]}. With --grpc_bare, ("bare", clients)
    keys are bench/noop_server --index at each client count (f32): the same
    search inline on gRPC's threads, with none of knnd's gate, workers,
    limits, metrics or logging."""
    raw = f"{work}/queries.f32"
    queries.astype("<f4").tofile(raw)
    cfg = f"{work}/knnd.textproto"
    with open(cfg, "w") as f:
        f.write('log_level: "warn"\nslow_request_ms: 0\nenable_reflection: false\n'
                "shutdown_delay_ms: 0\n")
    port = free_port()
    address = f"127.0.0.1:{port}"
    log = open(f"{work}/knnd.log", "w")
    daemon = subprocess.Popen([f"{ARGS.build}/knnd", "--config", cfg, "--index",
                               knnd.index, "--listen", address,
                               "--metrics_listen", f"127.0.0.1:{free_port()}"],
                              stdout=log, stderr=log,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    counts = [int(c) for c in ARGS.grpc_clients.split(",")]
    wires = ARGS.grpc_wire.split(",")
    bare = None
    bare_port = free_port()
    if ARGS.grpc_bare:
        bare = subprocess.Popen([f"{ARGS.build}/bench/noop_server", "--port",
                                 str(bare_port), "--index",
                                 knnd.index, "--nprobe", str(setting[0])],
                                stdout=subprocess.PIPE, stderr=log, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        for _ in range(600):
            if subprocess.run([f"{ARGS.build}/knnctl", "health", "--addr", address],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("knnd did not become healthy (see knnd.log)")
        if bare is not None and bare.stdout.readline().strip() != "serving":
            raise RuntimeError("noop_server did not start (see knnd.log)")
        knnd.setting = setting
        keys = [(w, c) for w in wires for c in counts]
        if bare is not None:
            keys += [("bare", c) for c in counts]
        grpc = {key: [] for key in keys}
        client_cores = {key: [] for key in keys}
        server = {key: [] for key in keys}  # knnd's cores (all its threads)
        workers = {key: [] for key in keys}  # its workers' cores
        inproc = []
        inproc_cores = []
        runs = [("grpc", key) for key in keys] + [("inproc", None)]
        for r in range(ARGS.rounds):
            shift = r % len(runs)
            for which, key in runs[shift:] + runs[:shift]:
                if which == "grpc":
                    wire, clients = key
                    target, pid = address, daemon.pid
                    if wire == "bare":
                        wire, target, pid = "f32", f"127.0.0.1:{bare_port}", bare.pid
                    text = subprocess.run(
                        [f"{ARGS.build}/bench/load_gen", "--target", target,
                         "--queries", raw, "--d", str(queries.shape[1]),
                         "--batch", "256", "--clients", str(clients),
                         "--seconds", "2", "--wire", wire,
                         "--nprobe", str(setting[0]), "--refine_factor",
                         str(setting[1]), "--k", str(K),
                         "--server_pid", str(pid)],
                        check=True, capture_output=True, text=True).stdout
                    res = json.loads(text)
                    if res["errors"]:
                        raise RuntimeError(f"load_gen: {res['first_error']}")
                    grpc[key].append(res["qps"])
                    client_cores[key].append(res["client_cores"])
                    server[key].append(res["server_cores"])
                    workers[key].append(res["server_threads"].get("knnd-worker", 0.0))
                else:
                    last = [v[-1] for v in grpc.values() if v]
                    reps = max(1, round(2.0 * (max(last) if last else 2000) / len(queries)))
                    res = knnd.run(256, 2, reps)
                    inproc.append(res["queries"] / res["wall_s"])
                    inproc_cores.append(res["cpu_s"] / res["wall_s"])
        return (grpc, inproc, client_cores,
                {"server": server, "workers": workers, "inproc": inproc_cores})
    finally:
        daemon.terminate()
        daemon.wait()
        if bare is not None:
            bare.terminate()
            bare.wait()
        log.close()


def rounded_recall(work, queries, truth, setting, wire):
    """Recall@10 of knnd in process on the queries rounded as --wire sends
    them (knnd widens 16-bit values exactly, so this is the answer the
    server gives to those requests)."""
    if wire == "f16":
        rounded = queries.astype(np.float16).astype(np.float32)
    else:  # bf16: to nearest, ties to even, as load_gen rounds
        bits = queries.astype("<f4").view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        rounded = bits.astype(np.uint32).view(np.float32)
    path = f"{work}/queries_{wire}.npy"
    np.save(path, rounded)
    runner = Knnd(work, None, path)
    try:
        _, ids = runner.measure(setting, "batch", 1, rounded)
    finally:
        runner.close()
    return recall(ids, truth)


def spread(values, fmt="{:.0f}"):
    v = sorted(values)
    return f"{fmt.format(v[len(v) // 2])} ({fmt.format(v[0])}-{fmt.format(v[-1])})"


def run_set(spec, targets):
    name, _, files = spec.partition("=")
    work = os.path.join(ARGS.work, name)
    os.makedirs(work, exist_ok=True)
    base, queries = data_set(name, work, files.split(":") if files else None)
    truth = exact_truth(base, queries, work)
    print(f"\n## {name}: {base.shape[0]} x {base.shape[1]}, {len(queries)} queries",
          flush=True)
    knnd = Knnd(work, f"{work}/base.npy", f"{work}/queries.npy")
    print(f"  knnd's recipe: {knnd.factory} (OpenBLAS kernels {knnd.blas})", flush=True)
    systems = [knnd]
    wanted = ARGS.peers.split(",")
    if "faiss" in wanted:
        systems.append(Faiss(work, base, knnd.factory))
    if "scann" in wanted:
        systems.append(Scann(work, base, knnd.nlist))
    if "hnswlib" in wanted:
        systems.append(Hnsw(work, base))
    del base
    result = {"name": name, "factory": knnd.factory, "nq": len(queries), "targets": []}
    # Each mode's picks come from that mode's sweep: per-call costs and
    # batch costs favour different settings.
    swept = {mode: {s.name: sweep(s, queries, truth, mode) for s in systems}
             for mode in ("single", "batch")}
    result["sweep"] = swept
    for target in targets:
        row = {"target": target}
        for mode in ("single", "batch"):
            picks = {s.name: fastest(swept[mode][s.name], target) for s in systems}
            qps, rec = paired(systems, picks, queries, truth, mode)
            row[mode] = {"picks": picks, "qps": qps, "recall": rec,
                         "ratio": ratios(qps)}
            parts = [f"{n} {spread(v)} (recall {rec[n]:.3f}, "
                     f"{picks[n]['setting']})" for n, v in qps.items()]
            ratio = row[mode]["ratio"]
            print(f"  recall@10 >= {target} {mode}: " + "; ".join(parts) +
                  (f"; knnd / best peer {spread(ratio, '{:.2f}')}x" if ratio else ""),
                  flush=True)
        result["targets"].append(row)
    pick = fastest(swept["batch"]["knnd"], ARGS.grpc_target)
    if pick is not None and not ARGS.no_grpc:
        grpc, inproc, cores, used = grpc_mode(knnd, work, queries,
                                              tuple(pick["setting"]))
        result["grpc"] = {"setting": pick["setting"], "inproc_qps": inproc,
                          "by_clients": {}}
        print(f"  in process 2 threads x 256 rows, {pick['setting']}: "
              f"{spread(inproc)} q/s", flush=True)
        inproc_per_core = [q / c for q, c in zip(inproc, used["inproc"])]
        for (wire, clients), qps in grpc.items():
            ratio = sorted(g / i for g, i in zip(qps, inproc))
            # Per core: q/s for each core the server's process (or knnd's
            # workers) used, over the in-process loop's q/s per core it
            # used, round by round: the server's cost per query whatever
            # the load generator beside it takes.
            server = used["server"][(wire, clients)]
            per_core = sorted(g / s / i for g, s, i in
                              zip(qps, server, inproc_per_core))
            if wire == "bare":
                # Any gRPC server around the same search: what is left of
                # the gap to in process once knnd's own work is taken away.
                knnd_over = sorted(k / b for k, b in
                                   zip(grpc.get(("f32", clients), []), qps))
                result["grpc"]["by_clients"][f"{clients} bare"] = {
                    "grpc_qps": qps, "ratio": ratio,
                    "client_cores": cores[(wire, clients)],
                    "server_cores": server, "per_server_core": per_core,
                    "knnd_over_bare": knnd_over}
                print(f"  bare gRPC server (noop_server --index: the search "
                      f"inline on gRPC's threads), {clients} clients: "
                      f"{spread(qps)} q/s (load_gen "
                      f"{spread(cores[(wire, clients)], '{:.2f}')} cores, "
                      f"server {spread(server, '{:.2f}')}); / in process "
                      f"{spread(ratio, '{:.2f}')}x, per core "
                      f"{spread(per_core, '{:.2f}')}x; knnd / bare "
                      f"{spread(knnd_over, '{:.2f}')}x", flush=True)
                continue
            workers = used["workers"][(wire, clients)]
            per_worker_core = sorted(g / w / i for g, w, i in
                                     zip(qps, workers, inproc_per_core))
            entry = {"grpc_qps": qps, "ratio": ratio,
                     "client_cores": cores[(wire, clients)],
                     "server_cores": server, "worker_cores": workers,
                     "inproc_cores": used["inproc"],
                     "per_server_core": per_core,
                     "per_worker_core": per_worker_core}
            label = f"{clients}" if wire == "f32" else f"{clients} {wire}"
            result["grpc"]["by_clients"][label] = entry
            versus = ""
            if wire != "f32" and ("f32", clients) in grpc:
                # The same round's float32 requests: the encoding's own gain.
                entry["over_f32"] = sorted(
                    g / f for g, f in zip(qps, grpc[("f32", clients)]))
                versus = f"; {wire} / f32 {spread(entry['over_f32'], '{:.2f}')}x"
            print(f"  gRPC, 256-row requests ({wire}), {clients} clients: "
                  f"{spread(qps)} q/s (load_gen "
                  f"{spread(cores[(wire, clients)], '{:.2f}')} cores, knnd "
                  f"{spread(server, '{:.2f}')}, its workers "
                  f"{spread(workers, '{:.2f}')}; in process "
                  f"{spread(used['inproc'], '{:.2f}')}); "
                  f"gRPC / in process {spread(ratio, '{:.2f}')}x, per core "
                  f"of knnd {spread(per_core, '{:.2f}')}x, per core of its "
                  f"workers {spread(per_worker_core, '{:.2f}')}x{versus}",
                  flush=True)
        for wire in ARGS.grpc_wire.split(","):
            if wire == "f32":
                continue
            rec = rounded_recall(work, queries, truth, tuple(pick["setting"]),
                                 wire)
            result["grpc"][f"recall_{wire}"] = rec
            print(f"  recall@10 of {wire} queries at {pick['setting']}: "
                  f"{rec:.4f} (float32: {pick['recall']:.4f})", flush=True)
    knnd.close()
    return result


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(SOURCE, "build"))
    p.add_argument("--work", default="/tmp/knnd_peers")
    p.add_argument("--sets", default="fashion,minilm")
    p.add_argument("--peers", default="faiss,scann,hnswlib")
    p.add_argument("--nq", type=int, default=2000)
    p.add_argument("--minilm_rows", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sweep_passes", type=int, default=2,
                   help="passes per setting in the sweep (the faster counts)")
    p.add_argument("--targets", default="0.95,0.98,0.99")
    p.add_argument("--grpc_target", type=float, default=0.98)
    p.add_argument("--no_grpc", action="store_true")
    p.add_argument("--grpc_wire", default="f32",
                   help="encodings of the gRPC part's queries, each measured "
                        "in the same rounds: f32, f16, bf16 (load_gen --wire)")
    p.add_argument("--grpc_bare", action=argparse.BooleanOptionalAction,
                   default=True,
                   help="also measure bench/noop_server --index (the same "
                        "search inline on gRPC's threads, none of knnd's "
                        "serving) at each client count in the same rounds")
    p.add_argument("--grpc_clients", default="2,4",
                   help="closed-loop load_gen clients, each count measured "
                        "against the same in-process rounds")
    p.add_argument("--json", default="", help="also write every figure here")
    ARGS = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    import faiss
    import hnswlib  # noqa: F401
    import scann  # noqa: F401
    from importlib.metadata import version
    targets = [float(t) for t in ARGS.targets.split(",")]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# peers_run.py {stamp}; CPU: {cpu_model()} ({os.cpu_count()} vCPU); "
          f"load {open('/proc/loadavg').read().split()[:3]}")
    print(f"# faiss-cpu {faiss.__version__} ({faiss.get_compile_options()}), "
          f"scann {version('scann')}, hnswlib {version('hnswlib')}; "
          f"rounds {ARGS.rounds}, q/s from process CPU time, 1 thread", flush=True)
    results = [run_set(name, targets) for name in ARGS.sets.split(",")]
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"stamp": stamp, "cpu": cpu_model(), "sets": results}, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""`make bench-frontier`: the recall@10 vs q/s frontier of knnd's default
recipe against FAISS's own recipe over the same FastScan codes, the 8-bit
recipes and hnswlib, in process and through gRPC, on Fashion-MNIST and on
a 1M-vector set, in one run (bench/RESULTS.md "Frontier", bench/frontier.png).

  frontier_run.py --build BUILD [--work /tmp/knnd_frontier] [--sets fashion,1m]
                  [--seconds 2] [--plot bench/frontier.png]

For each set, build/bench/frontier_bench builds every recipe, sweeps it in
process (1 thread, 1 query per call; CPU-time q/s) and measures knnd's
recipes in calls of 1 and of 256 rows on 2 threads (--json). This script then serves
the knnd-fastscan index it wrote with build/knnd and, for every (nprobe,
refine_factor) on its in-process frontier, measures through gRPC with build/bench/load_gen:
recall (every test query answered over gRPC, scored against frontier_bench's
exact search), 1 single-query client and 32 single-query clients
(coalescing on, knnd's defaults). At each target's fastest setting it
compares 32 clients with frontier_bench's 2-thread single-query figure and
the transport bound of bench/run_bench.py (a no-op gRPC server's CPU per
request), and 256-row requests with its 2-thread 256-row figure, and prints
the issue's targets as ratios measured in this run.

The 1M set is seeded synthetic data shaped like text embeddings: 128 dims
spanned by a 24-dim latent space with 1,024 clusters, plus small isotropic
noise (real embeddings have a low intrinsic dimension; isotropic Gaussian
blobs in 128 dims have no near neighbours worth finding). It is generated
under --work and reused.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import numpy as np

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "python"))
sys.path.insert(0, os.path.join(SOURCE, "bench"))
from knnd_harness import Daemon, free_port, generate_stubs  # noqa: E402
from memory_test import status_bytes  # noqa: E402
from run_bench import cpu_seconds, loadavg, machine, read_idx_gz  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
K = 10
ARGS = None


def embedding_like(n, d, seed, latent=24, clusters=1024, noise=0.05):
    """Seeded vectors on a `latent`-dim subspace of R^d (shared by every
    seed), clustered there, plus isotropic noise."""
    shared = np.random.default_rng(7)
    basis = shared.standard_normal((latent, d)).astype(np.float32) / np.sqrt(latent)
    centres = shared.standard_normal((clusters, latent)).astype(np.float32)
    rng = np.random.default_rng(seed)
    x = np.empty((n, d), dtype=np.float32)
    step = 1 << 18
    for i in range(0, n, step):
        m = min(step, n - i)
        z = centres[rng.integers(0, clusters, m)] + 0.5 * rng.standard_normal(
            (m, latent), dtype=np.float32)
        x[i:i + m] = z @ basis + noise * rng.standard_normal((m, d), dtype=np.float32)
    return x


def data_set(name, work):
    """(frontier_bench flags, queries as float32 rows) for set `name`."""
    if name == "fashion":
        return [], read_idx_gz(f"{FASHION}/t10k-images-idx3-ubyte.gz")[:ARGS.nq]
    base_npy, query_npy = f"{work}/base.npy", f"{work}/queries.npy"
    if not os.path.exists(base_npy):
        np.save(query_npy, embedding_like(ARGS.nq, 128, seed=2))
        np.save(base_npy + ".tmp.npy", embedding_like(1_000_000, 128, seed=1))
        os.rename(base_npy + ".tmp.npy", base_npy)
    return ["--base", base_npy, "--queries", query_npy], np.load(query_npy)


def recall(ids, truth):
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(ids, truth)]))


def load(address, pid, queries_raw, d, clients, batch=1, nprobe=0, refine=-1):
    seconds = ARGS.seconds
    cpu0, t0 = cpu_seconds(pid), time.time()
    text = subprocess.run(
        [f"{ARGS.build}/bench/load_gen", "--target", address, "--queries", queries_raw,
         "--d", str(d), "--batch", str(batch), "--clients", str(clients),
         "--seconds", str(seconds), "--nprobe", str(nprobe),
         "--refine_factor", str(refine), "--k", str(K)],
        check=True, text=True, capture_output=True).stdout
    res = json.loads(text)
    res["server_cores"] = (cpu_seconds(pid) - cpu0) / (time.time() - t0)
    if res["errors"]:
        print(f"  load_gen errors: {res['errors']} ({res['first_error']})", flush=True)
    return res


def grpc_recall(stub, pb, queries, truth, nprobe, refine):
    """Every query through knnd, 100 per request."""
    ids = []
    for i in range(0, len(queries), 100):
        chunk = queries[i:i + 100]
        r = stub.Search(pb.SearchRequest(vectors_f32le=chunk.tobytes(), k=K,
                                         nprobe=nprobe, refine_factor=refine),
                        timeout=60)
        ids.append(np.array(r.ids, dtype=np.int64).reshape(len(chunk), K))
    return recall(np.concatenate(ids), truth)


def fastest(rows, recipe, target):
    hits = [r for r in rows if r["recipe"] == recipe and r["recall"] >= target]
    return max(hits, key=lambda r: r["qps"]) if hits else None


def run_set(name):
    work = os.path.join(ARGS.work, name)
    os.makedirs(work, exist_ok=True)
    flags, queries = data_set(name, work)
    d = queries.shape[1]
    recipes = ARGS.recipes_fashion if name == "fashion" else ARGS.recipes_1m
    extra = ARGS.extra_fashion if name == "fashion" else ""
    out_json = f"{work}/frontier.json"
    cmd = [f"{ARGS.build}/bench/frontier_bench", "--work", work, "--json", out_json,
           "--nq", str(ARGS.nq), "--recipes", recipes, "--knnd_factories", extra,
           "--nprobes", ARGS.nprobes, "--refine_factors", ARGS.refine_factors,
           "--efs", ARGS.efs, *flags]
    print(f"\n## {name}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    with open(out_json) as f:
        R = json.load(f)
    # frontier_bench's exact search (FAISS flat L2), k ids per query.
    truth = np.array(R.pop("truth"), dtype=np.int64).reshape(-1, K)
    queries_raw = f"{work}/queries.f32"
    queries.astype("<f4").tofile(queries_raw)

    cfg = f"{work}/knnd.textproto"
    with open(cfg, "w") as f:
        f.write('log_level: "warn"\nslow_request_ms: 0\nenable_reflection: false\n'
                "shutdown_delay_ms: 0\n")
    stubs = generate_stubs(SOURCE, f"{work}/stubs-{os.getpid()}")
    from knnd.v1 import knn_service_pb2 as pb
    daemon = Daemon(f"{ARGS.build}/knnd", ["--config", cfg, "--index",
                                          f"{work}/knnd-fastscan.index"],
                    log_path=f"{work}/knnd.log", knnctl=f"{ARGS.build}/knnctl",
                    env={**os.environ, "OMP_NUM_THREADS": "1"})
    grpc_rows = []
    try:
        if not daemon.wait_serving(600):
            raise RuntimeError(f"knnd not SERVING: {daemon.read_log()[-2000:]}")
        stub = daemon.stub()
        pid = daemon.proc.pid
        ours = [r for r in R["rows"] if r["recipe"] == "knnd-fastscan"]
        for row in reversed(pareto(ours, lambda r: r["qps"], lambda r: r["recall"])):
            nprobe, refine = row["nprobe"], row["refine"]
            g = {"nprobe": nprobe, "refine": refine, "inproc_qps": row["qps"],
                 "inproc_recall": row["recall"],
                 "recall": grpc_recall(stub, pb, queries, truth, nprobe, refine)}
            g["c1"] = load(daemon.address, pid, queries_raw, d, 1, nprobe=nprobe,
                           refine=refine)
            g["c32"] = load(daemon.address, pid, queries_raw, d, 32, nprobe=nprobe,
                            refine=refine)
            print(f"grpc nprobe {nprobe} refine {refine}: recall {g['recall']:.4f} "
                  f"(in process {row['recall']:.4f}); 1 client {g['c1']['qps']:.0f} q/s "
                  f"p50 {g['c1']['p50_ms']:.3f} ms; 32 clients {g['c32']['qps']:.0f} q/s "
                  f"p99 {g['c32']['p99_ms']:.2f} ms", flush=True)
            grpc_rows.append(g)
        for b in R["batched"]:
            if b["recipe"] != "knnd-fastscan" or b["rows"] == 1:
                continue
            b["grpc"] = load(daemon.address, pid, queries_raw, d, 4,
                             batch=min(b["rows"], len(queries)),
                             nprobe=b["nprobe"], refine=b["refine"])
            print(f"{b['rows']}-row requests nprobe {b['nprobe']} refine {b['refine']}: "
                  f"{b['grpc']['qps']:.0f} q/s through gRPC, {b['qps']:.0f} in process "
                  f"({b['threads']} threads)", flush=True)
        R["knnd_rss_anon_kib"] = status_bytes(pid, "RssAnon") / 1024
        R["knnd_rss_file_kib"] = status_bytes(pid, "RssFile") / 1024
    finally:
        daemon.stop(grace_s=10)
        subprocess.run(["rm", "-rf", stubs])
        sys.path.remove(stubs)
    # The transport floor: a no-op server answering the same requests.
    port = free_port()
    noop = subprocess.Popen([f"{ARGS.build}/bench/noop_server", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert noop.stdout.readline().strip() == "serving"
        R["noop32"] = load(f"127.0.0.1:{port}", noop.pid, queries_raw, d, 32)
        R["noop1"] = load(f"127.0.0.1:{port}", noop.pid, queries_raw, d, 1)
    finally:
        noop.terminate()
        noop.wait()
    R["grpc"] = grpc_rows
    R["name"] = name
    return R


def report(R):
    """Markdown tables and the targets of one set; returns its lines."""
    lines = []
    emit = lines.append
    n32 = R["noop32"]
    rpc_cpu = (n32["server_cores"] + n32["client_cores"]) / n32["qps"]
    emit(f"### {R['name']}: {R['n']:,} x {R['d']}, {R['nq']} queries, k {K}")
    emit("")
    emit("Build and memory (frontier_bench, in process; RSS and RssAnon are the growth "
         "from loading the file through the sweep):")
    emit("")
    emit("| recipe | index | build s (wall, 2 threads) | files MiB | RSS MiB | RssAnon MiB |")
    emit("|---|---|---|---|---|---|")
    for s in R["summaries"]:
        emit(f"| {s['recipe']} | {s['factory']} | {s['build_s']:.1f} | "
             f"{s['file_bytes'] / 2**20:.1f} | {s['rss_bytes'] / 2**20:.1f} | "
             f"{s['anon_bytes'] / 2**20:.1f} |")
    emit("")
    emit(f"knnd serving knnd-fastscan after the gRPC sweep: RssAnon "
         f"{R['knnd_rss_anon_kib'] / 1024:.1f} MiB (the whole process), RssFile "
         f"{R['knnd_rss_file_kib'] / 1024:.1f} MiB (mapped lists and vectors).")
    emit("")
    emit("The fastest setting of each recipe reaching each target (in process, 1 thread, "
         "1 query per call, CPU-time q/s):")
    emit("")
    emit("| target | recipe | setting | recall@10 | q/s | knnd-fastscan / this |")
    emit("|---|---|---|---|---|---|")
    recipes = [s["recipe"] for s in R["summaries"]]
    for target in ARGS.targets:
        ours = fastest(R["rows"], "knnd-fastscan", target)
        for recipe in recipes:
            best = fastest(R["rows"], recipe, target)
            if best is None:
                emit(f"| {target} | {recipe} | not reached | | | |")
                continue
            ratio = f"{ours['qps'] / best['qps']:.2f}" if ours else "-"
            emit(f"| {target} | {recipe} | {best['setting']} | {best['recall']:.4f} | "
                 f"{best['qps']:.0f} | {ratio} |")
    emit("")
    emit("knnd-fastscan through gRPC, each setting of its in-process frontier (recall: "
         "every query answered "
         "by the daemon; 1 and 32 single-query clients from load_gen, wall-clock q/s, "
         "coalescing on as knnd's defaults; in process: 1 thread, CPU-time q/s):")
    emit("")
    emit("| nprobe | refine | recall (gRPC) | in process q/s | 1 client q/s | 1 client p50 ms "
         "| 32 clients q/s | 32 clients p99 ms |")
    emit("|---|---|---|---|---|---|---|---|")
    for g in R["grpc"]:
        emit(f"| {g['nprobe']} | {g['refine']} | {g['recall']:.4f} | {g['inproc_qps']:.0f} | "
             f"{g['c1']['qps']:.0f} | {g['c1']['p50_ms']:.3f} | {g['c32']['qps']:.0f} | "
             f"{g['c32']['p99_ms']:.2f} |")
    emit("")
    emit("32 single-query clients against single-query calls in process on 2 threads "
         "(both cores busy), at each target's fastest setting. Bound: the best any gRPC "
         "server could do with the client on the same 2 cores, f / (f + rpc), f = 2 / "
         "in-process q/s (FAISS's CPU per query), rpc = the no-op server's and load_gen's "
         f"CPU per request ({rpc_cpu * 1e6:.0f} us), as in bench/run_bench.py:")
    emit("")
    emit("| nprobe | refine | in process, 2 threads q/s | 32 clients q/s | ratio | bound | "
         "ratio / bound |")
    emit("|---|---|---|---|---|---|---|")
    for b in R["batched"]:
        g = [x for x in R["grpc"] if (x["nprobe"], x["refine"]) == (b["nprobe"], b["refine"])]
        if b["rows"] != 1 or b["recipe"] != "knnd-fastscan" or not g:
            continue
        f = 2 / b["qps"]
        b["bound"] = f / (f + rpc_cpu)
        b["share"] = g[0]["c32"]["qps"] / b["qps"]
        emit(f"| {b['nprobe']} | {b['refine']} | {b['qps']:.0f} | {g[0]['c32']['qps']:.0f} | "
             f"{b['share']:.2f} | {b['bound']:.2f} | {b['share'] / b['bound']:.2f} |")
    emit("")
    emit(f"No-op server (bench/noop_server): 1 client p50 {R['noop1']['p50_ms']:.3f} ms, "
         f"32 clients {n32['qps']:.0f} req/s.")
    emit("")
    emit("Batched: 256 rows per request through gRPC (4 clients) against 256 rows per "
         "call in process on 2 threads, at each target's fastest setting:")
    emit("")
    emit("| nprobe | refine | in process q/s | gRPC q/s | gRPC / in process |")
    emit("|---|---|---|---|---|")
    for b in R["batched"]:
        if "grpc" in b:
            emit(f"| {b['nprobe']} | {b['refine']} | {b['qps']:.0f} | "
                 f"{b['grpc']['qps']:.0f} | {b['grpc']['qps'] / b['qps']:.2f} |")
    emit("")
    return lines


def targets(sets):
    """The issue's targets, each a ratio measured in this run."""
    lines = ["### Targets", "", "| target | measured | met |", "|---|---|---|"]

    def add(text, value, ok):
        lines.append(f"| {text} | {value} | {'yes' if ok else 'no'} |")

    for R in sets:
        rows, tag = R["rows"], R["name"]
        ours = fastest(rows, "knnd-fastscan", 0.98)
        faiss_best = fastest(rows, "faiss-fastscan", 0.98)
        if ours and faiss_best:
            same = [o["qps"] / t["qps"] for o in rows if o["recipe"] == "knnd-fastscan"
                    for t in rows if t["recipe"] == "faiss-fastscan"
                    and (t["nprobe"], t["refine"]) == (o["nprobe"], o["refine"])]
            r = ours["qps"] / faiss_best["qps"]
            add(f"{tag}: knnd in process >= 0.95x FAISS IndexRefineFlat at recall 0.98",
                f"{r:.2f}x fastest vs fastest; median {np.median(same):.2f}x setting by "
                f"setting", r >= 0.95)
        for peer, want in (("knnd IVF256,PQ56", 3.5), ("hnsw16", 1.2), ("hnsw32", 1.2)):
            best = fastest(rows, peer, 0.98)
            if ours and best:
                r = ours["qps"] / best["qps"]
                add(f"{tag}: recall 0.98, knnd >= {want}x {peer}", f"{r:.2f}x", r >= want)
        hnsw = [s for s in R["summaries"] if s["recipe"] == "hnsw16"]
        if hnsw:
            r = R["knnd_rss_anon_kib"] * 1024 / hnsw[0]["anon_bytes"]
            add(f"{tag}: knnd's RssAnon <= 1/4 of hnswlib M 16's",
                f"{R['knnd_rss_anon_kib'] / 1024:.1f} / {hnsw[0]['anon_bytes'] / 2**20:.1f} "
                f"MiB = {r:.2f}", r <= 0.25)
        for b in R["batched"]:
            if "grpc" in b:
                r = b["grpc"]["qps"] / b["qps"]
                add(f"{tag}: 256-row requests >= 0.9x in process (nprobe {b['nprobe']}, "
                    f"refine {b['refine']})", f"{r:.2f}x", r >= 0.9)
        for b in R["batched"]:
            if "bound" in b:
                r = b["share"] / b["bound"]
                add(f"{tag}: 32 clients >= 0.9x the transport bound (nprobe "
                    f"{b['nprobe']}, refine {b['refine']})",
                    f"{b['share']:.2f} of in process, bound {b['bound']:.2f}: "
                    f"{r:.2f}x", r >= 0.9)
        builds = {s["recipe"]: s["build_s"] for s in R["summaries"]}
        for old in ("knnd IVF256,PQ56", "knnd-pq8"):
            if old in builds and "knnd-fastscan" in builds:
                r = builds["knnd-fastscan"] / builds[old]
                add(f"{tag}: building takes <= 1/4 of {old}'s", f"{r:.2f}", r <= 0.25)
    lines.append("")
    return lines


def plot(sets, path, stamp):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(sets), figsize=(7 * len(sets), 5.5), squeeze=False)
    styles = {"knnd-fastscan": "o-", "faiss-fastscan": "s--", "knnd-pq8": "v:",
              "knnd IVF256,PQ56": "^:", "hnsw16": "d-.", "hnsw32": "x-."}
    for ax, R in zip(axes[0], sets):
        for recipe in [s["recipe"] for s in R["summaries"]]:
            pts = pareto([r for r in R["rows"] if r["recipe"] == recipe],
                         lambda r: r["qps"], lambda r: r["recall"])
            ax.plot([r["qps"] for r in pts], [r["recall"] for r in pts],
                    styles.get(recipe, "o-"), label=f"{recipe} (in process)")
        for key, label in (("c1", "knnd gRPC, 1 client"),
                           ("c32", "knnd gRPC, 32 clients (2 cores)")):
            pts = pareto(R["grpc"], lambda g: g[key]["qps"], lambda g: g["recall"])
            ax.plot([g[key]["qps"] for g in pts], [g["recall"] for g in pts], "*-",
                    label=label)
        ax.set_xscale("log")
        ax.set_xlabel("queries/s (1 query per call; in process: 1 thread)")
        ax.set_ylabel("recall@10")
        ax.set_ylim(0.85, 1.0)  # where recipes are chosen
        ax.set_title(f"{R['name']}: {R['n']:,} x {R['d']}")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.text(0.01, 0.005, stamp, fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=100)


def pareto(items, qps, recall):
    """The items no other item beats in both qps(item) and recall(item):
    the upper-right frontier, slowest (most accurate) first."""
    best, out = -1.0, []
    for item in sorted(items, key=lambda i: -qps(i)):
        if recall(item) > best:
            out.append(item)
            best = recall(item)
    return out[::-1]


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=f"{SOURCE}/build")
    p.add_argument("--work", default="/tmp/knnd_frontier")
    p.add_argument("--sets", default="fashion,1m")
    p.add_argument("--nq", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--nprobes", default="4,6,8,12,16,24,32")
    p.add_argument("--refine_factors", default="0,2,3,4,6,8,16")
    p.add_argument("--recipes_fashion",
                   default="knnd-fastscan,faiss-fastscan,knnd-pq8,hnsw16,hnsw32")
    p.add_argument("--extra_fashion", default="IVF256,PQ56",
                   help="more knnd factories on Fashion-MNIST (';'-separated): the "
                        "8-bit recipe knnd built before FastScan")
    p.add_argument("--recipes_1m",
                   default="knnd-fastscan,faiss-fastscan,knnd-pq8,hnsw16,hnsw32")
    p.add_argument("--efs", default="10,12,14,16,18,20,24,28,32,40,48,64,96,128",
                   help="hnswlib ef sweep (as fine near recall 0.95-0.99 as the IVF one)")
    p.add_argument("--targets", default="0.95,0.98")
    p.add_argument("--plot", default=f"{SOURCE}/bench/frontier.png")
    p.add_argument("--json", default="", help="write every figure here too")
    p.add_argument("--from_json", default="",
                   help="report and plot a run that --json wrote, measuring nothing")
    ARGS = p.parse_args()
    ARGS.build = os.path.abspath(ARGS.build)
    ARGS.targets = [float(t) for t in ARGS.targets.split(",")]
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    if ARGS.from_json:
        with open(ARGS.from_json) as f:
            sets = json.load(f)
        stamp = sets[0]["stamp"]
    else:
        start = datetime.datetime.utcnow()
        load0 = loadavg()
        sets = [run_set(name) for name in ARGS.sets.split(",") if name]
        end = datetime.datetime.utcnow()
        stamp = (f"{start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC, {machine()}, load {load0} -> "
                 f"{loadavg()}; {sets[0]['version']}")
        sets[0]["stamp"] = stamp
    lines = [f"Run: {stamp}", f"Command: `{' '.join(sys.argv)}`", ""]
    for R in sets:
        lines += report(R)
    lines += targets(sets)
    print("\n".join(lines))
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(sets, f, indent=1)
    if ARGS.plot:
        plot(sets, ARGS.plot, stamp)
        print(f"plot: {ARGS.plot}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Filtered search at selectivities 0.1% to 99% on Fashion-MNIST or a
seeded 1M-row set, measured in one run (bench/RESULTS.md, "Filters").

  /usr/bin/python3 bench/filter_bench.py --build build \\
      --faiss_python VENV/bin/python [--set fashion|1m] [--rows 1000000] \\
      [--dim 128] [--nq 400] [--rounds 8] [--batch 1]

1. The data: Fashion-MNIST's 60,000 training images (queries: the test
   images), or --rows x --dim seeded rows shaped like text embeddings
   (frontier_run.embedding_like, the frontier's 1M set; queries: the same
   distribution, another seed). knnctl build (the default recipe:
   IVF<nlist>,PQ<M>x4fs with INDEX.vectors) with --attributes, one integer
   "u" per row, uniform in [0, 100000) from a fixed seed, so that u <
   100000*s admits a fraction s of the rows, and --payloads, a seeded
   JSON object of about --payload_bytes per row; knnctl tune
   --target_recall 0.95 records its defaults, measured on 2,000 more
   held-out queries (Fashion-MNIST: test images 5,000 to 6,999; the 1M
   set: seed 3), as a user with real queries tunes. A second copy of the same
   index and vectors without INDEX.attrs and INDEX.payloads (its sidecar
   says neither).
2. knnd serves each copy. Per selectivity, the first --nq queries, one
   query per call (as an API worker sends them; --batch N: N a call),
   k=10, recall@10 against
   an exact search (FAISS IndexFlatL2) of the admitted rows, and queries/s:
     knnd filter   SearchRequest.filter {u < 100000*s}
     post-filter   knnd unfiltered with k' = min(max_k, 10/s), the first 10
                   admitted kept (what a client does without filters)
     faiss sel     FAISS's own search of the same index file, codes and
                   vectors with an IDSelectorBitmap, at knnd's nprobe and
                   refine_factor (bench/filter_faiss.py, run by
                   --faiss_python, in process)
     unfiltered    knnd, no filter (the q/s every ratio is taken against)
   The methods take turns every --chunk queries, --rounds times, so that
   other load on the machine slows each alike. knnd's own execution time
   per request (its knnd_search_execution_duration_seconds histogram,
   read around each turn) is printed for the filter and the unfiltered
   searches: the search's cost without the client's.
3. RssAnon of both knnd processes (/proc/PID/status) after the same
   unfiltered load (the copy with payloads returns them), before the
   filtered searches and again after them (the copy without attributes
   getting, per selectivity, the same unfiltered searches at k and at the
   post-filter's k').
Prints a Markdown table and the issue's targets as ratios of this run.

--set clustered: filters that follow the vector space (bench/RESULTS.md,
"Filters that follow the space"), before and after in one run:

  /usr/bin/python3 bench/filter_bench.py --set clustered --build build \
      [--baseline_build OLD_BUILD] [--rows 100000] [--clusters 48] \
      [--batch 1] [--nq 400] [--rounds 4] [--nprobe N] [--refine_factor R]

--rows x --dim seeded rows shaped like text embeddings (24-dim latent
space, --clusters clusters) with their own 63-bit ids, a keyword "topic"
tied to the clusters (topic-{cluster % 12}: the rows of a few clusters,
8.3% each) and the integer "u" as above; knnctl build, knnctl tune
--target_recall 0.95 on 2,000 held-out queries. This build's knnd and,
with --baseline_build, another build's knnd serve the same files, and take
turns every --chunk queries, --rounds times. Filters: u below 0.1% to 99%
(spread evenly over the space), topic = topic-3 (correlated: most queries
lie far from its clusters), topics 0-3 (33%), and every topic but the
query's own (anti-correlated, $ne; a request holds queries of one topic).
Prints recall@10 against an exact search of the admitted rows, queries/s
and knnd's execution time per request, for each knnd.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, HERE)
from knnd_harness import Daemon, install_client  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
SELECTIVITIES = (0.001, 0.01, 0.1, 0.5, 0.99)
K = 10
WORDS = ("index vector shard replica token probe cluster memory latency "
         "batch queue worker payload chunk document source page text field "
         "search answer version swap budget gate file mapped cache").split()


def read_idx(path):
    import gzip
    with gzip.open(path) as f:
        data = f.read()
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
            for i in range(data[3])]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims)).reshape(
        dims[0], -1).astype("float32")


def data_set(args, work):
    """(base rows, queries, tuning queries, a one-line description). The
    tuning queries are held out from both: knnctl tune measures on them,
    the benchmark on the queries."""
    if args.set == "fashion":
        test = read_idx(f"{FASHION}/t10k-images-idx3-ubyte.gz")
        return (read_idx(f"{FASHION}/train-images-idx3-ubyte.gz"),
                test[:args.nq], test[5000:7000], "Fashion-MNIST 60,000 x 784")
    from frontier_run import embedding_like
    base = os.path.join(work, "base.npy")
    if not os.path.exists(base):
        np.save(base + ".tmp.npy", embedding_like(args.rows, args.dim, seed=1))
        os.rename(base + ".tmp.npy", base)
    return (np.load(base), embedding_like(args.nq, args.dim, seed=2),
            embedding_like(2000, args.dim, seed=3),
            f"seeded embedding-like {args.rows:,} x {args.dim}")


def write_inputs(work, n, payload_bytes):
    """The attribute u per row (returned) and the attributes and payloads
    files knnctl build reads."""
    u = np.random.default_rng(2026).integers(0, 100000, n)
    with open(os.path.join(work, "attrs.jsonl"), "w") as f:
        f.writelines(f'{{"u": {int(v)}}}\n' for v in u)
    rng = np.random.default_rng(33)
    words = np.array(WORDS)[rng.integers(0, len(WORDS),
                                         (n, max(1, payload_bytes // 7)))]
    with open(os.path.join(work, "payloads.jsonl"), "w") as f:
        f.writelines(json.dumps({"text": " ".join(w),
                                 "source": f"doc{r // 50}.pdf",
                                 "page": r % 50}) + "\n"
                     for r, w in enumerate(words))
    return u


def link_or_copy(src, dst):
    if os.path.exists(dst):
        os.remove(dst)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def rss_anon_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return -1


def recall(got, truth):
    hits = [len(set(a) & set(b) - {-1}) / max(1, len(set(b) - {-1}))
            for a, b in zip(got, truth)]
    return float(np.mean(hits))


class FaissSearch:
    """bench/filter_faiss.py as a child process: chunks of queries searched
    by FAISS with a selector, timed there."""

    def __init__(self, python, index, work, xq, u, nprobe, refine_factor):
        np.save(os.path.join(work, "queries.npy"), xq)
        np.save(os.path.join(work, "u.npy"), u)
        self.proc = subprocess.Popen(
            [python, os.path.join(HERE, "filter_faiss.py"), "--index", index,
             "--queries", os.path.join(work, "queries.npy"), "--attr",
             os.path.join(work, "u.npy"), "--nprobe", str(nprobe),
             "--refine_factor", str(refine_factor), "--k", str(K)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"))
        first = self.proc.stdout.readline().split(None, 1)
        if not first or first[0] != "ready":
            raise RuntimeError(
                f"{python} bench/filter_faiss.py: {' '.join(first)} (a "
                "faiss whose IVF FastScan takes an IDSelector: faiss-cpu "
                "from PyPI in a venv, `make bench-filter`)")
        self.version = first[1].strip()
        self.seconds = 0.0

    def search(self, bound, rows):
        self.proc.stdin.write(f"{bound} {rows.start} {rows.stop}\n")
        self.proc.stdin.flush()
        fields = self.proc.stdout.readline().split()
        self.seconds += float(fields[0])
        return np.array(fields[1:], dtype=np.int64).reshape(-1, K)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


def clustered_rows(n, dim, clusters, seed):
    """Seeded rows shaped like text embeddings (frontier_run.embedding_like:
    clusters on a 24-dim subspace of R^dim shared by every seed, plus
    isotropic noise) and each row's cluster."""
    latent = 24
    shared = np.random.default_rng(7)
    basis = shared.standard_normal((latent, dim)).astype(np.float32) / np.sqrt(
        latent)
    centres = shared.standard_normal((clusters, latent)).astype(np.float32)
    rng = np.random.default_rng(seed)
    cluster = rng.integers(0, clusters, n)
    z = centres[cluster] + 0.5 * rng.standard_normal((n, latent),
                                                     dtype=np.float32)
    x = z @ basis + 0.05 * rng.standard_normal((n, dim), dtype=np.float32)
    return x.astype(np.float32), cluster


def exact_among(xb, mask, xq):
    """The K nearest admitted rows of each query, as row numbers."""
    import faiss
    rows = np.flatnonzero(mask)
    flat = faiss.IndexFlatL2(xb.shape[1])
    flat.add(xb[rows])
    return rows[flat.search(xq, K)[1]]


def run_clustered(args):
    import faiss
    faiss.omp_set_num_threads(1)
    knnctl = os.path.join(args.build, "knnctl")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    tmp = tempfile.TemporaryDirectory()
    work = os.path.join(args.workdir or tmp.name,
                        f"clustered_{args.rows}_{args.clusters}")
    os.makedirs(work, exist_ok=True)
    install_client(os.path.join(HERE, ".."), os.path.join(tmp.name, "client"))
    from knnd_client import KnnClient

    started = time.time()
    topics = 12
    xb, cluster = clustered_rows(args.rows, args.dim, args.clusters, 1)
    xq, q_cluster = clustered_rows(args.nq, args.dim, args.clusters, 2)
    xt, _ = clustered_rows(2000, args.dim, args.clusters, 3)
    topic, q_topic = cluster % topics, q_cluster % topics
    u = np.random.default_rng(2026).integers(0, 100000, args.rows)
    ids = np.random.default_rng(11).integers(0, 2**63 - 1, args.rows)
    assert len(np.unique(ids)) == args.rows
    index = os.path.join(work, "index")
    if not os.path.exists(index + ".meta.json"):
        np.save(os.path.join(work, "base.npy"), xb)
        np.save(os.path.join(work, "ids.npy"), ids)
        np.save(os.path.join(work, "tune.npy"), xt)
        with open(os.path.join(work, "attrs.jsonl"), "w") as f:
            f.writelines(f'{{"u": {int(v)}, "topic": "topic-{int(t)}"}}\n'
                         for v, t in zip(u, topic))
        subprocess.run([knnctl, "build", "--input",
                        os.path.join(work, "base.npy"), "--ids",
                        os.path.join(work, "ids.npy"), "--output", index,
                        "--attributes", os.path.join(work, "attrs.jsonl")],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run([knnctl, "tune", "--index", index, "--queries",
                        os.path.join(work, "tune.npy"), "--target_recall",
                        "0.95"], check=True, env=env, stdout=subprocess.DEVNULL)
    print(f"index ready after {time.time() - started:.0f} s", flush=True)
    builds = {"after": args.build}
    if args.baseline_build:
        builds = {"before": args.baseline_build, **builds}
    daemons = {name: Daemon(os.path.join(b, "knnd"), ["--index", index],
                            knnctl=knnctl, env=env,
                            log_path=os.path.join(work, name + ".log"))
               for name, b in builds.items()}
    for name, daemon in daemons.items():
        if not daemon.wait_serving(300):
            raise RuntimeError(f"knnd ({name}): " + daemon.read_log())
    clients = {name: KnnClient(d.address, timeout_s=60)
               for name, d in daemons.items()}
    info = clients["after"].info()
    setting = {}
    if args.nprobe > 0:
        setting["nprobe"] = args.nprobe
    if args.refine_factor >= 0:
        setting["refine_factor"] = args.refine_factor
    order = np.argsort(ids)
    sorted_ids = ids[order]

    def rows_of(got):
        got = np.asarray(got)
        pos = np.clip(np.searchsorted(sorted_ids, got), 0, args.rows - 1)
        return np.where((got >= 0) & (sorted_ids[pos] == got), order[pos], -1)

    # (name, the filter of topic t's queries, its mask, whether it is the
    # same for every query).
    filters = [(f"u < {s:.1%} (even)", lambda t, b=int(100000 * s): {
                   "u": {"$lt": b}}, lambda t, b=int(100000 * s): u < b, True)
               for s in SELECTIVITIES]
    filters += [
        ("topic-3 (correlated)", lambda t: {"topic": "topic-3"},
         lambda t: topic == 3, True),
        ("topics 0-3 (correlated)",
         lambda t: {"topic": {"$in": [f"topic-{i}" for i in range(4)]}},
         lambda t: topic < 4, True),
        ("not the query's topic (anti-correlated)",
         lambda t: {"topic": {"$ne": f"topic-{t}"}},
         lambda t: topic != t, False),
    ]
    by_topic = np.argsort(q_topic, kind="stable")
    execution = "knnd_search_execution_duration_seconds_"

    def execution_so_far(daemon):
        page = daemon.scrape()
        return (sum(v for n, v in page.items()
                    if n.startswith(execution + "sum")),
                sum(v for n, v in page.items()
                    if n.startswith(execution + "count")))

    table = []
    for name, make_filter, make_mask, shared in filters:
        # The calls: `batch` queries of one topic each (every query's
        # filter is the same, or its topic's).
        sequence = np.arange(args.nq) if shared else by_topic
        calls = []
        for begin in range(0, args.nq, args.batch):
            group = sequence[begin:begin + args.batch]
            if not shared:
                group = group[q_topic[group] == q_topic[group[0]]]
            calls.append(group)
        if not shared:  # what the topic cut off goes in calls of its own
            covered = np.concatenate(calls)
            rest = np.setdiff1d(sequence, covered)
            calls += [rest[q_topic[rest] == t] for t in np.unique(q_topic[rest])]
        truth = np.full((args.nq, K), -1)
        for t in (np.unique(q_topic) if not shared else [0]):
            which = (np.arange(args.nq) if shared
                     else np.flatnonzero(q_topic == t))
            truth[which] = exact_among(xb, make_mask(t), xq[which])
        results = {m: np.full((args.nq, K), -1) for m in clients}
        seconds = {m: 0.0 for m in clients}
        served = {m: [0.0, 0.0] for m in clients}
        methods = list(clients)
        chunk_calls = max(1, args.chunk // args.batch)
        for r in range(args.rounds):
            for begin in range(0, len(calls), chunk_calls):
                for m in methods:
                    before = execution_so_far(daemons[m])
                    start = time.perf_counter()
                    for group in calls[begin:begin + chunk_calls]:
                        t = int(q_topic[group[0]])
                        got = clients[m].search(
                            xq[group], K, filter=make_filter(t),
                            **setting).ids
                        results[m][group] = rows_of(got)
                    seconds[m] += time.perf_counter() - start
                    after = execution_so_far(daemons[m])
                    served[m][0] += after[0] - before[0]
                    served[m][1] += after[1] - before[1]
                methods = methods[1:] + methods[:1]
        n_rows = int(make_mask(int(q_topic[0])).sum())
        table.append((name, n_rows, {
            m: (recall(results[m], truth), args.rounds * args.nq / seconds[m],
                1e6 * served[m][0] / max(1, served[m][1])) for m in clients}))
        print(f"{name} done after {time.time() - started:.0f} s", flush=True)

    print()
    per_call = "one per call" if args.batch == 1 else f"{args.batch} per call"
    print(f"seeded clustered {args.rows:,} x {args.dim} ({args.clusters} "
          f"clusters, {topics} topics, own 63-bit ids), {args.nq} queries "
          f"{per_call}, k={K}, nprobe "
          f"{setting.get('nprobe', info.default_nprobe)} refine_factor "
          f"{setting.get('refine_factor', info.default_refine_factor)} "
          f"({'flags' if setting else 'tuned'}), {args.rounds} rounds "
          f"interleaved by {args.chunk}; {cpu_model()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{time.time() - started:.0f} s")
    print()
    names = list(clients)
    print("| filter | rows | " + " | ".join(
        f"{m} recall@10 | {m} q/s | {m} us/request" for m in names) +
        (" | after / before q/s |" if len(names) == 2 else " |"))
    print("|---|---|" + "---|---|---|" * len(names) +
          ("---|" if len(names) == 2 else ""))
    for name, n_rows, r in table:
        cells = " | ".join(f"{r[m][0]:.3f} | {r[m][1]:,.0f} | {r[m][2]:.0f}"
                           for m in names)
        ratio = (f" | {r['after'][1] / r['before'][1]:.2f} |"
                 if len(names) == 2 else " |")
        print(f"| {name} | {n_rows:,} | {cells}{ratio}")
    print("(the anti-correlated filter's rows: those of the first query's "
          "topic left out; us/request: knnd_search_execution_duration_seconds "
          "over the turn's requests)")
    for daemon in daemons.values():
        daemon.stop(10)
    tmp.cleanup()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--set", choices=("fashion", "1m", "clustered"),
                        default="fashion")
    parser.add_argument("--rows", type=int, default=0,
                        help="rows of the seeded set (--set 1m: default "
                             "1,000,000; clustered: 100,000)")
    parser.add_argument("--clusters", type=int, default=48,
                        help="clusters of --set clustered")
    parser.add_argument("--baseline_build", default="",
                        help="--set clustered: another build whose knnd "
                             "serves the same index in the same run")
    parser.add_argument("--dim", type=int, default=128,
                        help="its dimension (128, or 384 like MiniLM)")
    parser.add_argument("--payload_bytes", type=int, default=100)
    parser.add_argument("--faiss_python", default=sys.executable,
                        help="a Python whose faiss takes an IDSelector on "
                             "IVF FastScan (bench/filter_faiss.py)")
    parser.add_argument("--nq", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--batch", type=int, default=1,
                        help="queries per knnd request (1: one at a time, "
                             "as an API worker serving one user; the "
                             "post-filter too)")
    parser.add_argument("--workdir", default="")
    parser.add_argument("--nprobe", type=int, default=0,
                        help="every search's nprobe; 0: knnd's tuned one")
    parser.add_argument("--refine_factor", type=int, default=-1,
                        help="every search's refine_factor; -1: knnd's "
                             "tuned one")
    args = parser.parse_args()
    if not args.rows:
        args.rows = 100000 if args.set == "clustered" else 1000000
    if args.set == "clustered":
        return run_clustered(args)
    import faiss
    faiss.omp_set_num_threads(1)
    knnctl = os.path.join(args.build, "knnctl")
    knnd = os.path.join(args.build, "knnd")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    tmp = tempfile.TemporaryDirectory()
    work = os.path.join(args.workdir or tmp.name, args.set)
    os.makedirs(work, exist_ok=True)
    install_client(os.path.join(HERE, ".."), os.path.join(tmp.name, "client"))
    from knnd_client import KnnClient

    started = time.time()
    xb, xq, xt, described = data_set(args, work)
    u = write_inputs(work, len(xb), args.payload_bytes)
    with_attrs = os.path.join(work, "with.index")
    if not os.path.exists(with_attrs + ".meta.json"):
        # knnctl reads .npy; Fashion's rows are written once as one.
        base = os.path.join(work, "base.npy")
        if not os.path.exists(base):
            np.save(base, xb)
        subprocess.run([knnctl, "build", "--input", base, "--output",
                        with_attrs, "--attributes",
                        os.path.join(work, "attrs.jsonl"), "--payloads",
                        os.path.join(work, "payloads.jsonl")], check=True,
                       env=env, stdout=subprocess.DEVNULL)
    tune_queries = os.path.join(work, "tune_queries.npy")
    with open(with_attrs + ".meta.json") as f:
        tuned_on = json.load(f).get("tuned_on", "")
    if tune_queries not in tuned_on:
        np.save(tune_queries, xt)
        subprocess.run([knnctl, "tune", "--index", with_attrs, "--queries",
                        tune_queries, "--target_recall", "0.95"], check=True,
                       env=env, stdout=subprocess.DEVNULL)
    print(f"index ready after {time.time() - started:.0f} s", flush=True)
    without = os.path.join(work, "without.index")
    for suffix in ("", ".vectors"):
        link_or_copy(with_attrs + suffix, without + suffix)
    with open(with_attrs + ".meta.json") as f:
        meta = json.load(f)
    meta.pop("attributes", None)
    meta.pop("payloads", None)
    with open(without + ".meta.json", "w") as f:
        json.dump(meta, f)

    daemons = {name: Daemon(knnd, ["--index", path], knnctl=knnctl, env=env,
                            log_path=os.path.join(work, name + ".log"))
               for name, path in (("with", with_attrs), ("without", without))}
    for name, daemon in daemons.items():
        if not daemon.wait_serving(300):
            raise RuntimeError(f"knnd ({name}): " + daemon.read_log())
    client = KnnClient(daemons["with"].address, timeout_s=60)
    plain = KnnClient(daemons["without"].address, timeout_s=60)
    info = client.info()
    max_k = info.max_k
    setting = {}
    if args.nprobe > 0:
        setting["nprobe"] = args.nprobe
    if args.refine_factor >= 0:
        setting["refine_factor"] = args.refine_factor
    nprobe = args.nprobe if args.nprobe > 0 else info.default_nprobe
    refine = (args.refine_factor if args.refine_factor >= 0
              else info.default_refine_factor)
    faiss_sel = FaissSearch(args.faiss_python, with_attrs, work, xq, u,
                            nprobe, refine)

    def same_load():
        # Unfiltered, on both copies; the one with payloads returns them.
        for i in range(len(xq)):
            client.search(xq[i:i + 1], K, payloads=True, **setting)
            plain.search(xq[i:i + 1], K, **setting)
    same_load()
    rss_at_rest = {name: rss_anon_kib(d.proc.pid)
                   for name, d in daemons.items()}

    batch = max(1, args.batch)

    def in_calls(search):
        # The chunk's queries, `batch` a call (never across chunks).
        def run(rows):
            return np.vstack([search(xq[i:min(i + batch, rows.stop)])
                              for i in range(rows.start, rows.stop, batch)])
        return run

    flat_all = faiss.IndexFlatL2(xb.shape[1])
    flat_all.add(xb)
    truth_all = flat_all.search(xq, K)[1]
    del flat_all
    table = []
    unfiltered_qps = []
    unfiltered_recall = []
    for s in SELECTIVITIES:
        bound = int(100000 * s)
        mask = u < bound
        rows = np.flatnonzero(mask)
        flat = faiss.IndexFlatL2(xb.shape[1])
        flat.add(xb[rows])
        truth = rows[flat.search(xq, K)[1]]
        del flat
        k_post = min(max_k, int(np.ceil(K / s)))

        def post_filter(q):
            ids = client.search(q, k_post, **setting).ids
            out = np.full((len(q), K), -1)
            for r, row in enumerate(ids):
                kept = [i for i in row if i >= 0 and mask[i]][:K]
                out[r, :len(kept)] = kept
            return out
        methods = {
            "knnd filter": in_calls(lambda q: client.search(
                q, K, filter={"u": {"$lt": bound}}, **setting).ids),
            "post-filter": in_calls(post_filter),
            "faiss sel": lambda chunk: faiss_sel.search(bound, chunk),
            "unfiltered": in_calls(
                lambda q: client.search(q, K, **setting).ids),
        }
        results = {m: np.full((len(xq), K), -1) for m in methods}
        seconds = {m: 0.0 for m in methods}
        # knnd's own execution time per request of each method served by
        # the copy with attributes (its histogram's sum and count read
        # around each chunk): what the search costs without the client.
        served = {m: [0.0, 0.0] for m in ("knnd filter", "unfiltered")}
        execution = "knnd_search_execution_duration_seconds_"

        def execution_so_far():
            page = daemons["with"].scrape()
            return (sum(v for n, v in page.items()
                        if n.startswith(execution + "sum")),
                    sum(v for n, v in page.items()
                        if n.startswith(execution + "count")))
        faiss_sel.seconds = 0.0
        order = list(methods)
        for r in range(args.rounds):
            for begin in range(0, len(xq), args.chunk):
                chunk = range(begin, min(len(xq), begin + args.chunk))
                for m in order:
                    before = execution_so_far() if m in served else None
                    start = time.perf_counter()
                    results[m][chunk.start:chunk.stop] = methods[m](chunk)
                    seconds[m] += time.perf_counter() - start
                    if before is not None:
                        after = execution_so_far()
                        served[m][0] += after[0] - before[0]
                        served[m][1] += after[1] - before[1]
                order = order[1:] + order[:1]
        seconds["faiss sel"] = faiss_sel.seconds  # its own clock, in process
        qps = {m: args.rounds * len(xq) / seconds[m] for m in methods}
        unfiltered_qps.append(qps["unfiltered"])
        unfiltered_recall.append(recall(results["unfiltered"], truth_all))
        table.append((s, mask.sum(), {m: (recall(results[m], truth), qps[m])
                                      for m in methods if m != "unfiltered"}
                      | {"unfiltered": (0.0, qps["unfiltered"])}
                      | {"us": {m: 1e6 * t / max(1, c)
                                for m, (t, c) in served.items()}}))
        print(f"{s:.1%} done after {time.time() - started:.0f} s",
              flush=True)
        # The copy without attributes gets the unfiltered searches of this
        # selectivity (k and the post-filter's k'): large k holds memory.
        for i in range(len(xq)):
            plain.search(xq[i:i + 1], K, **setting)
            plain.search(xq[i:i + 1], k_post, **setting)
    faiss_sel.close()
    same_load()

    print()
    per_call = "one per call" if batch == 1 else f"{batch} per call"
    print(f"{described}, {args.nq} queries {per_call}, k={K}, nprobe "
          f"{nprobe}, refine_factor {refine} "
          f"({'flags' if setting else 'tuned'}), {args.rounds} rounds "
          f"interleaved by {args.chunk}; "
          f"faiss {faiss_sel.version} in process; {cpu_model()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{time.time() - started:.0f} s")
    print()
    print("| selectivity | rows | knnd filter recall | q/s | x unfiltered "
          "| knnd us/request (unfiltered) "
          "| post-filter recall | q/s | FAISS IDSelector recall | q/s "
          "| knnd / FAISS q/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s, n, r in table:
        f, p, fs, un = (r["knnd filter"], r["post-filter"], r["faiss sel"],
                        r["unfiltered"])
        print(f"| {s:.1%} | {n:,} | {f[0]:.3f} | {f[1]:,.0f} | "
              f"{f[1] / un[1]:.2f} | {r['us']['knnd filter']:.0f} "
              f"({r['us']['unfiltered']:.0f}) | {p[0]:.3f} | {p[1]:,.0f} | "
              f"{fs[0]:.3f} | {fs[1]:,.0f} | {f[1] / fs[1]:.2f} |")
    print("(knnd us/request: knnd_search_execution_duration_seconds over "
          "the requests of the filter, and of the unfiltered searches in "
          "the same turns)")
    print()
    print(f"unfiltered knnd: {np.median(unfiltered_qps):,.0f} q/s (median "
          f"of the five runs), recall@10 {np.mean(unfiltered_recall):.3f}")
    rss = {name: rss_anon_kib(d.proc.pid) for name, d in daemons.items()}
    sizes = {ext: os.path.getsize(with_attrs + "." + ext)
             for ext in ("attrs", "payloads")}
    print(f"RssAnon after the unfiltered load (payloads returned): with "
          f"attributes and payloads {rss_at_rest['with']:,} KiB, without "
          f"{rss_at_rest['without']:,} KiB "
          f"({rss_at_rest['with'] / rss_at_rest['without']:.3f}x); after "
          f"the filtered load too: {rss['with']:,} KiB, {rss['without']:,} "
          f"KiB ({rss['with'] / rss['without']:.3f}x); INDEX.attrs "
          f"{sizes['attrs']:,} bytes, INDEX.payloads {sizes['payloads']:,} "
          "bytes")
    # The targets, each against this run's unfiltered q/s measured
    # alongside the same selectivity.
    by_s = {s: r for s, _, r in table}
    worst = min(r["knnd filter"][0] for r in by_s.values())
    at = {s: by_s[s]["knnd filter"][1] / by_s[s]["unfiltered"][1]
          for s in (0.01, 0.5)}
    ratio = rss_at_rest["with"] / rss_at_rest["without"]
    print(f"targets: recall@10 >= 0.95 everywhere: lowest {worst:.3f} "
          f"({'met' if worst >= 0.95 else 'missed'}); q/s at 1% >= "
          f"unfiltered: {at[0.01]:.2f}x "
          f"({'met' if at[0.01] >= 1 else 'missed'}); q/s at 50% >= 0.7x: "
          f"{at[0.5]:.2f}x ({'met' if at[0.5] >= 0.7 else 'missed'}); "
          f"RssAnon within 5% (unfiltered load): {ratio:.3f}x "
          f"({'met' if abs(ratio - 1) <= 0.05 else 'missed'})")
    for daemon in daemons.values():
        daemon.stop(10)
    tmp.cleanup()


if __name__ == "__main__":
    main()

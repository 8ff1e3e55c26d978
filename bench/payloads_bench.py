#!/usr/bin/python3
"""Payloads and knnd's anonymous memory (issue 33: "RssAnon with payloads of
the whole corpus within 5% of the same index without them").

Fashion-MNIST's 60,000 training vectors, built twice with `knnctl build`'s
default recipe: once plain, once with `--payloads` of a seeded ~1 KB text
chunk per row ({"text", "source", "page"}). Fresh knnd processes serve each
in turn (paired rounds, so the machine's noise hits both alike), run the
same query load (the test set's first queries, k=10, in batches; the
payload index is asked for every field of every result), and RssAnon and
RssFile are read from /proc/PID/status afterwards. Prints a Markdown table
and the RssAnon ratio per round for bench/RESULTS.md.

  /usr/bin/python3 bench/payloads_bench.py --build build
"""
import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SOURCE, "tests", "python"))
from knnd_harness import Daemon, generate_stubs  # noqa: E402
FASHION = "/usr/share/datasets/fashion-mnist"

WORDS = ("index vector shard replica token probe cluster memory latency "
         "batch queue worker payload chunk document source page text field "
         "search answer version swap budget gate file mapped cache").split()


def read_idx(path, limit=0):
    with gzip.open(path, "rb") as f:
        data = f.read()
    n, rows, cols = (int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
                     for i in range(3))
    x = np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, rows * cols)
    if limit:
        x = x[:limit]
    return np.ascontiguousarray(x.astype(np.float32))


def write_payloads(path, rows, text_bytes, seed):
    """One JSON object per row: ~text_bytes of seeded words, a source and a
    page. Returns the file's size."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as out:
        for r in range(rows):
            words = []
            size = 0
            while size < text_bytes:
                w = WORDS[rng.integers(len(WORDS))]
                words.append(w)
                size += len(w) + 1
            out.write(json.dumps({"text": " ".join(words),
                                  "source": f"doc{r // 50}.pdf",
                                  "page": r % 50}) + "\n")
    return os.path.getsize(path)


def rss(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                key, value, _ = line.split()
                out[key[:-1]] = int(value) * 1024
    return out


def serve_and_measure(knnd, index, tmp, name, xq, k, batch, payloads):
    """A fresh knnd on `index`, the query load, then its RssAnon/RssFile."""
    from knnd.v1 import knn_service_pb2 as pb
    config = os.path.join(tmp, f"{name}.textproto")
    with open(config, "w") as f:
        f.write(f'index_path: "{index}"\n'
                "num_workers: 1\nomp_threads_per_worker: 1\n"
                "warmup_queries: 0\nslow_request_ms: 0\n")
    daemon = Daemon(knnd, ["--config", config],
                    log_path=os.path.join(tmp, f"{name}.log"),
                    env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        if not daemon.wait_serving(240):
            raise RuntimeError(f"knnd did not start: {daemon.read_log()}")
        stub = daemon.stub()
        sent = 0
        for b in range(0, len(xq), batch):
            request = pb.SearchRequest(
                vectors_f32le=xq[b:b + batch].astype("<f4").tobytes(), k=k)
            if payloads:
                request.payloads.all_fields = True
            r = stub.Search(request, timeout=600)
            assert len(r.payloads) == (len(r.ids) if payloads else 0)
            sent += sum(len(p) for p in r.payloads)
        return rss(daemon.proc.pid), sent
    finally:
        daemon.stop(60)


def mib(b):
    return b / 2**20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(SOURCE, "build"))
    p.add_argument("--nq", type=int, default=2000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--text-bytes", type=int, default=1000)
    p.add_argument("--workdir", default="/tmp/knnd_payloads_bench")
    p.add_argument("--rebuild", action="store_true",
                   help="build the indexes even when the workdir has them")
    args = p.parse_args()

    os.makedirs(args.workdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="payloads_bench_")
    generate_stubs(SOURCE, tmp)
    knnd = os.path.join(args.build, "knnd")
    knnctl = os.path.join(args.build, "knnctl")
    train = f"{FASHION}/train-images-idx3-ubyte.gz"
    xq = read_idx(f"{FASHION}/t10k-images-idx3-ubyte.gz", args.nq)
    lines = os.path.join(args.workdir, "payloads.jsonl")
    jsonl_bytes = write_payloads(lines, 60000, args.text_bytes, seed=33)
    plain = os.path.join(args.workdir, "plain.index")
    with_payloads = os.path.join(args.workdir, "payloads.index")
    for path, extra in ((plain, []), (with_payloads, ["--payloads", lines])):
        if os.path.exists(path + ".meta.json") and not args.rebuild:
            continue  # built by an earlier run with the same seeds
        t = time.time()
        subprocess.run([knnctl, "build", "--input", train, "--output", path,
                        *extra], check=True, stdout=subprocess.DEVNULL)
        print(f"built {path} in {time.time() - t:.0f} s", file=sys.stderr)
    payload_file = os.path.getsize(with_payloads + ".payloads")

    rows = []
    for r in range(args.rounds):
        # Alternate which goes first, so a drift of the machine is shared.
        order = [(False, plain), (True, with_payloads)]
        if r % 2:
            order.reverse()
        got = {}
        for payloads, path in order:
            got[payloads] = serve_and_measure(
                knnd, path, tmp, f"r{r}-{int(payloads)}", xq, args.k,
                args.batch, payloads)
        rows.append(got)

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in cpu.splitlines()
                  if l.startswith("Model name")), platform.processor())
    print(f"\n`/usr/bin/python3 bench/payloads_bench.py --build build` "
          f"({time.strftime('%Y-%m-%d', time.gmtime())}, {model}, "
          f"{os.cpu_count()} cores): Fashion-MNIST 60,000 x 784, default "
          f"recipe; payloads {mib(jsonl_bytes):.1f} MiB of JSON Lines "
          f"(~{args.text_bytes} B of text per row) -> INDEX.payloads "
          f"{mib(payload_file):.1f} MiB; {args.nq} queries, k={args.k}, "
          f"batches of {args.batch}, every field asked for; fresh knnd per "
          f"measurement, {args.rounds} paired rounds.\n")
    print("| round | RssAnon plain MiB | RssAnon payloads MiB | ratio | "
          "RssFile plain MiB | RssFile payloads MiB | payload bytes sent |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for r, got in enumerate(rows):
        (a, _), (b, sent) = got[False], got[True]
        ratio = b["RssAnon"] / a["RssAnon"]
        ratios.append(ratio)
        print(f"| {r + 1} | {mib(a['RssAnon']):.1f} | {mib(b['RssAnon']):.1f} "
              f"| {ratio:.3f} | {mib(a['RssFile']):.1f} | "
              f"{mib(b['RssFile']):.1f} | {mib(sent):.1f} MiB |")
    print(f"\nRssAnon with payloads / without: median "
          f"{statistics.median(ratios):.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()

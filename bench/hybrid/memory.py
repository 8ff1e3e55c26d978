"""RssAnon of knnd serving an index with its text index against the same
index without one (issue 54's target: within 5%; the text index is mapped,
file-backed). Builds both from one language's cached vectors and chunks
(bench/hybrid/hybrid_bench.py's work folder), serves each with one worker,
sends the same queries (hybrid to the one with text, dense to the other,
then texts alone), and reads /proc/PID/status after each phase.

  python3 bench/hybrid/memory.py --work HYBRID_WORK/knnd/en-US-... \
      --build build --queries 500
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "python"))


def status_kib(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True,
                    help="a knnd work folder of hybrid_bench.py (vectors.npy)")
    ap.add_argument("--chunks", required=True)
    ap.add_argument("--queries_file", required=True)
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"))
    ap.add_argument("--queries", type=int, default=500)
    args = ap.parse_args()
    from knnd_harness import Daemon, generate_stubs
    import tempfile
    stubs = tempfile.mkdtemp()
    generate_stubs(SOURCE, stubs)
    from knnd.v1 import knn_service_pb2 as pb
    vecs = os.path.join(args.work, "vectors.npy")
    x = np.load(vecs, mmap_mode="r")
    texts = [json.loads(l)["query"] for l in open(args.queries_file)]
    texts = texts[:args.queries]
    rng = np.random.default_rng(1)
    rows = rng.integers(0, x.shape[0], len(texts))
    result = {}
    for name, extra in (("with text", ["--text", "text"]), ("without", [])):
        index = os.path.join(args.work, "memory-" + name.replace(" ", "-"))
        subprocess.run([os.path.join(args.build, "knnctl"), "build", "--input",
                        vecs, "--output", index, "--payloads", args.chunks,
                        "--metric", "cosine", *extra], check=True,
                       stdout=subprocess.DEVNULL)
        daemon = Daemon(os.path.join(args.build, "knnd"),
                        ["--index", index, "--workers", "1"],
                        env=dict(os.environ, OMP_NUM_THREADS="1"))
        if not daemon.wait_serving(240):
            raise RuntimeError(daemon.read_log())
        stub = daemon.stub()
        loaded = status_kib(daemon.proc.pid)
        for i, t in zip(rows, texts):
            req = pb.SearchRequest(k=10, vectors_f32le=np.asarray(
                x[i], "<f4").tobytes(), refine_factor=10)
            if extra:
                req.texts.append(t)
                req.text_window = 100
                req.vector_window = 100
            stub.Search(req, timeout=30)
        searched = status_kib(daemon.proc.pid)
        result[name] = {"loaded": loaded, "searched": searched,
                        "files_mib": sum(os.path.getsize(index + s) for s in
                                         ("", ".vectors", ".payloads", ".text")
                                         if os.path.exists(index + s)) / 2**20}
        daemon.stop(30)
    a = result["with text"]["searched"]["RssAnon"]
    b = result["without"]["searched"]["RssAnon"]
    result["rss_anon_ratio"] = a / b
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Exact re-ranking on Fashion-MNIST, measured in one run (bench/RESULTS.md).

  /usr/bin/python3 bench/rerank_bench.py --build build [--nq 2000]

1. knnctl build --keep_vectors: IVF-PQ index + INDEX.vectors (float32).
2. Exact ground truth with python3-faiss IndexFlatL2 (k=10).
3. For each (nprobe, refine_factor): recall@10 and queries/s of
   - knnd over loopback gRPC (1 worker x 1 OpenMP thread: one core), one
     client sending requests of --batch queries back to back, and
   - the same recipe in-process: python3-faiss IndexRefineFlat over the same
     IVF-PQ file (k_factor = refine_factor), one thread, same batches;
   measured alternately, so their ratio holds on a noisy machine.
4. RssAnon / RssFile of knnd from /proc/PID/status after the same query load,
   served with re-ranking (vectors mapped) and without (load_vectors: false).
5. The share of queries whose ids equal exact search at a large
   refine_factor (all lists probed).
Prints Markdown tables for RESULTS.md.
"""
import argparse
import gzip
import os
import platform
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


def read_idx(path, limit=0):
    with gzip.open(path, "rb") as f:
        data = f.read()
    n, rows, cols = (int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
                     for i in range(3))
    x = np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, rows * cols)
    if limit:
        x = x[:limit]
    return np.ascontiguousarray(x.astype(np.float32))


def rss(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                key, value, _ = line.split()
                out[key[:-1]] = int(value) * 1024
    return out


class Knnd:
    """A knnd process on loopback with one worker thread."""

    def __init__(self, binary, index, tmp, name, load_vectors):
        config = os.path.join(tmp, f"{name}.textproto")
        with open(config, "w") as f:
            f.write(f'index_path: "{index}"\n'
                    "num_workers: 1\nomp_threads_per_worker: 1\n"
                    "max_refine_factor: 1024\nmax_k: 1024\n"
                    f"load_vectors: {'true' if load_vectors else 'false'}\n"
                    "warmup_queries: 0\nslow_request_ms: 0\n")
        log = os.path.join(tmp, f"{name}.log")
        self.daemon = Daemon(binary, ["--config", config], log_path=log,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.proc = self.daemon.proc
        if not self.daemon.wait_serving(240):
            self.daemon.stop()
            raise RuntimeError(f"knnd did not start; see {log}")
        self.stub = self.daemon.stub()

    def info(self):
        from knnd.v1 import knn_service_pb2 as pb
        return self.stub.GetIndexInfo(pb.GetIndexInfoRequest(), timeout=5)

    def search(self, q, k, nprobe, refine_factor, batch):
        from knnd.v1 import knn_service_pb2 as pb
        ids = np.empty((len(q), k), dtype=np.int64)
        for b in range(0, len(q), batch):
            chunk = q[b:b + batch]
            r = self.stub.Search(pb.SearchRequest(
                vectors_f32le=chunk.astype("<f4").tobytes(), k=k,
                nprobe=nprobe, refine_factor=refine_factor), timeout=600)
            assert r.refine_factor == refine_factor, r.refine_factor
            ids[b:b + len(chunk)] = np.asarray(r.ids).reshape(len(chunk), k)
        return ids

    def stop(self):
        self.daemon.stop(60)


def recall(ids, truth, k=10):
    return np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(ids, truth)])


def timed(fn, min_seconds):
    """Runs fn until min_seconds pass; returns its last output, the runs and
    the seconds they took."""
    runs, start = 0, time.perf_counter()
    while True:
        out = fn()
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return out, runs, elapsed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(SOURCE, "build"))
    p.add_argument("--factory", default="IVF256,PQ56")
    p.add_argument("--nq", type=int, default=2000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--points", default="8:0,8:4,16:4,16:8,32:8,32:16,64:16")
    p.add_argument("--exact-point", default="256:100")
    p.add_argument("--workdir", default="/tmp/knnd_rerank_bench")
    args = p.parse_args()

    import faiss
    faiss.omp_set_num_threads(1)
    os.makedirs(args.workdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="rerank_bench_")
    generate_stubs(SOURCE, tmp)
    knnd_bin = os.path.join(args.build, "knnd")
    knnctl = os.path.join(args.build, "knnctl")
    train = f"{FASHION}/train-images-idx3-ubyte.gz"
    index = os.path.join(args.workdir, f"fashion-{args.factory.replace(',', '_')}.index")
    if not os.path.exists(index + ".vectors") or not os.path.exists(index + ".meta.json"):
        t = time.time()
        subprocess.run([knnctl, "build", "--input", train, "--output", index,
                        "--factory", args.factory, "--keep_vectors"],
                       check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, OMP_NUM_THREADS="2"))
        print(f"built {index} in {time.time() - t:.0f} s", file=sys.stderr)

    xb = read_idx(train)
    xq = read_idx(f"{FASHION}/t10k-images-idx3-ubyte.gz", args.nq)
    flat = faiss.IndexFlatL2(xb.shape[1])
    flat.add(xb)
    t = time.time()
    exact_d, truth = flat.search(xq, 10)
    print(f"exact search of {len(xq)} queries: {time.time() - t:.1f} s",
          file=sys.stderr)

    # The same recipe in-process: the knnd file's IVF-PQ (read into memory)
    # refined with the exact vectors on the heap (FAISS 1.7.3's way).
    base = faiss.read_index(index)
    ivf = faiss.extract_index_ivf(base)
    refine = faiss.IndexRefineFlat(base, faiss.swig_ptr(xb))

    def inproc(nprobe, rf):
        ivf.nprobe = nprobe
        out = np.empty((len(xq), 10), dtype=np.int64)
        for b in range(0, len(xq), args.batch):
            chunk = xq[b:b + args.batch]
            if rf == 0:
                _, out[b:b + len(chunk)] = base.search(chunk, 10)
            else:
                refine.k_factor = rf
                _, out[b:b + len(chunk)] = refine.search(chunk, 10)
        return out

    points = [tuple(int(v) for v in s.split(":")) for s in args.points.split(",")]
    server = Knnd(knnd_bin, index, tmp, "rerank", load_vectors=True)
    info = server.info()
    rows = []
    for nprobe, rf in points:
        server.search(xq[:args.batch], 10, nprobe, rf, args.batch)  # warm
        ids_k, runs_k, sec_k = timed(
            lambda: server.search(xq, 10, nprobe, rf, args.batch), args.seconds)
        ids_f, runs_f, sec_f = timed(lambda: inproc(nprobe, rf), args.seconds)
        qps_k = runs_k * len(xq) / sec_k
        qps_f = runs_f * len(xq) / sec_f
        rows.append((nprobe, rf, recall(ids_k, truth), qps_k,
                     recall(ids_f, truth), qps_f, qps_k / qps_f))
        print(rows[-1], file=sys.stderr)

    # Identity with exact search at a large refine_factor, all lists probed.
    e_nprobe, e_rf = (int(v) for v in args.exact_point.split(":"))
    ids_e = server.search(xq, 10, e_nprobe, e_rf, args.batch)
    same = np.mean([np.array_equal(a, b) for a, b in zip(ids_e, truth)])
    # Ties: Fashion-MNIST pixels are integers and has duplicate images, so
    # equal distances may be listed in another order; compare distances too.
    xq64, xb64 = xq.astype(np.float64), xb.astype(np.float64)
    same_or_tie = 0
    for i in range(len(xq)):
        if np.array_equal(ids_e[i], truth[i]):
            same_or_tie += 1
            continue
        de = ((xb64[ids_e[i]] - xq64[i]) ** 2).sum(1)
        dt = ((xb64[truth[i]] - xq64[i]) ** 2).sum(1)
        same_or_tie += int(np.allclose(np.sort(de), np.sort(dt), rtol=0, atol=0.5))

    server.stop()

    # Memory: two fresh servers given the same query load, one re-ranking
    # (vectors mapped) and one not (load_vectors: false).
    load_nprobe, load_rf = points[-1]
    mem = {}
    for name, rf in (("off", 0), ("on", load_rf)):
        srv = Knnd(knnd_bin, index, tmp, f"mem_{name}", load_vectors=rf > 0)
        assert srv.info().has_vectors == (rf > 0)
        for _ in range(3):
            srv.search(xq, 10, load_nprobe, rf, args.batch)
        mem[name] = rss(srv.proc.pid)
        srv.stop()
    mem_on, mem_off = mem["on"], mem["off"]

    mib = lambda b: b / 2**20
    print(f"\n- Command: `/usr/bin/python3 bench/rerank_bench.py --build "
          f"{args.build} --nq {args.nq} --batch {args.batch}` (`make bench-rerank`)")
    print(f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"- Machine: {os.cpu_count()} vCPU {platform.processor() or platform.machine()}, "
          f"Debian's python3-faiss {faiss.__version__}")
    print(f"- Index: {args.factory} via `knnctl build --keep_vectors` "
          f"({info.code_size_bytes} B/vector codes, index file "
          f"{mib(info.file_bytes):.1f} MiB, vectors file "
          f"{mib(os.path.getsize(index + '.vectors')):.1f} MiB f32); "
          f"{len(xq)} t10k queries, k=10, truth: IndexFlatL2")
    print(f"- knnd: 1 worker x 1 OpenMP thread, one client, {args.batch} "
          f"queries per request; in-process: IndexRefineFlat(IVF-PQ of the "
          f"same file, k_factor = refine_factor), 1 thread, same batches\n")
    print("| nprobe | refine_factor | knnd recall@10 | knnd q/s (1 core) | "
          "in-process recall@10 | in-process q/s | knnd / in-process |")
    print("|---|---|---|---|---|---|---|")
    for n, rf, rk, qk, rfr, qf, ratio in rows:
        print(f"| {n} | {rf} | {rk:.4f} | {qk:.0f} | {rfr:.4f} | {qf:.0f} | "
              f"{ratio:.2f} |")
    print(f"\nIds equal to exact search at nprobe {e_nprobe}, refine_factor "
          f"{e_rf}: {100 * same:.2f}% of queries exactly, "
          f"{100 * same_or_tie / len(xq):.2f}% counting equal-distance ties "
          f"in another order as equal.\n")
    print(f"Fresh knnd processes, each after the same {3 * len(xq)} queries:\n")
    print("| knnd | RssAnon MiB | RssFile MiB |")
    print("|---|---|---|")
    print(f"| re-ranking off (load_vectors: false, nprobe {load_nprobe}) | {mib(mem_off['RssAnon']):.1f} "
          f"| {mib(mem_off['RssFile']):.1f} |")
    print(f"| re-ranking on (nprobe {load_nprobe}, refine_factor {load_rf}) | "
          f"{mib(mem_on['RssAnon']):.1f} | {mib(mem_on['RssFile']):.1f} |")
    print(f"\nRssAnon on / off: {mem_on['RssAnon'] / mem_off['RssAnon']:.3f}")


if __name__ == "__main__":
    main()

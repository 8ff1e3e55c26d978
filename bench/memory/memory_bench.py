#!/usr/bin/python3
"""Memory benchmarks of knnd (bench/RESULTS.md "Memory"):

  pss     8 python3-faiss API workers each reading the index (read_index
          without mmap, as a typical API does) vs 8 client processes calling
          one knnd: total PSS (/proc/PID/smaps_rollup) of each setup
  cgroup  knnd inside a cgroup v1 memory cgroup whose limit is half the
          index file: sustained queries, no OOM kill, queries/s, failcnt,
          page-cache residency; the same queries without the cgroup side by
          side (needs root and a writable /sys/fs/cgroup/memory)
  model   anonymous RSS of knnd vs the memory model's index heap: within
          10% + 32 MiB

  memory_bench.py --knnd BUILD/knnd --source-dir . --index F [--cases ...]
Build the index with bench/memory/build_index.py (seeded; not committed).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
import knnd_harness  # noqa: E402
import memory_test as mt  # noqa: E402

FAISS_WORKER = """
import sys, time
import faiss, numpy as np
index = faiss.read_index(sys.argv[1])  # no mmap: what a typical API does
faiss.extract_index_ivf(index).nprobe = 16
q = np.random.default_rng(0).standard_normal((16, index.d)).astype("float32")
for _ in range(20):
    index.search(q, 10)
print("ready", flush=True)
time.sleep(3600)
"""

CLIENT_WORKER = """
import sys, time
sys.path.insert(0, sys.argv[1])
import grpc, numpy as np
from knnd.v1 import knn_service_pb2 as pb, knn_service_pb2_grpc as pb_grpc
stub = pb_grpc.KnnServiceStub(grpc.insecure_channel(sys.argv[2]))
d = int(sys.argv[3])
q = np.random.default_rng(0).standard_normal(16 * d).astype("<f4").tobytes()
for _ in range(20):
    stub.Search(pb.SearchRequest(k=10, nprobe=16, dim=d, vectors_f32le=q))
print("ready", flush=True)
time.sleep(3600)
"""


def pss(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(pid)


def start_workers(code, args, n):
    procs = [subprocess.Popen([sys.executable, "-c", code] + args,
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
             for _ in range(n)]
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"worker failed: {line!r}")
    return procs


def stop(procs):
    for p in procs:
        p.kill()
        p.wait()


def index_dim(path):
    import faiss
    return faiss.read_index(path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY).d


def case_pss(a, tmp, dim):
    mib = 2 ** 20
    workers = start_workers(FAISS_WORKER, [a.index], 8)
    time.sleep(1)
    per = [pss(p.pid) for p in workers]
    faiss_total = sum(per)
    stop(workers)
    d = mt.Daemon(tmp, a.index, name="pss")
    try:
        assert d.wait_serving(600), d.read_log()
        clients = start_workers(CLIENT_WORKER, [tmp, f"127.0.0.1:{d.port}", str(dim)], 8)
        time.sleep(1)
        knnd_pss = pss(d.proc.pid)
        client_pss = [pss(p.pid) for p in clients]
        stop(clients)
    finally:
        d.stop()
    knnd_total = knnd_pss + sum(client_pss)
    print(f"| 8 python3-faiss workers, each read_index (no mmap) | "
          f"{faiss_total / mib:.0f} MiB ({min(per) / mib:.0f}-{max(per) / mib:.0f} MiB each) |")
    print(f"| knnd + 8 python gRPC client workers | {knnd_total / mib:.0f} MiB "
          f"(knnd {knnd_pss / mib:.0f} MiB, clients {min(client_pss) / mib:.0f}-"
          f"{max(client_pss) / mib:.0f} MiB each) |")
    print(f"| ratio | {faiss_total / knnd_total:.1f}x less with knnd |")
    return faiss_total / knnd_total


def sustained(d, dim, seconds, nprobe):
    stub = d.stub()
    rng = np.random.default_rng(5)
    reqs = [mt.request(rng, dim, 1, 10, nprobe) for _ in range(200)]
    start = time.time()
    n = 0
    codes = set()
    while time.time() - start < seconds:
        res = mt.run_requests(stub, reqs, window=4)
        codes |= {c for c, _, _ in res}
        n += len(res)
    return n / (time.time() - start), codes


def case_cgroup(a, tmp, dim):
    mib = 2 ** 20
    # A private copy whose pages are dropped, so that the cgroup is charged
    # for every page it reads (pages cached by another cgroup stay charged
    # there).
    copy = os.path.join(tmp, "cg.index")
    shutil.copyfile(a.index, copy)
    fd = os.open(copy, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    size = os.path.getsize(copy)
    limit = size // 2
    extra = "use_precomputed_table: false\nmemory_headroom_bytes: 8388608\n"
    free = mt.Daemon(tmp, copy, name="nocg", extra=extra)
    try:
        assert free.wait_serving(600), free.read_log()
        free_qps, _ = sustained(free, dim, a.seconds, a.nprobe)
        free_res = free.metric("knnd_index_page_cache_resident_bytes")
    finally:
        free.stop()
    fd = os.open(copy, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    cg = mt.Cgroup(limit)
    d = mt.Daemon(tmp, copy, cgroup=cg.path, name="cg", extra=extra)
    try:
        assert d.wait_serving(600), d.read_log()
        qps, codes = sustained(d, dim, a.seconds, a.nprobe)
        alive = d.proc.poll() is None
        resident = d.metric("knnd_index_page_cache_resident_bytes")
        anon = mt.rss_anon(d.proc.pid)
        oom = cg.read("memory.oom_control").split()
        oom_kills = oom[oom.index("oom_kill") + 1] if "oom_kill" in oom else "?"
        print(f"| index file | {size / mib:.0f} MiB |")
        print(f"| cgroup v1 memory.limit_in_bytes | {limit / mib:.0f} MiB (half the file) |")
        print(f"| queries/s in the cgroup (1 query, k=10, nprobe {a.nprobe}, 4 in flight, "
              f"{a.seconds:.0f} s) | {qps:.0f} (status codes {sorted(codes)}) |")
        print(f"| queries/s without the cgroup, same run | {free_qps:.0f} |")
        print(f"| knnd alive after the run / oom_kill | {alive} / {oom_kills} |")
        print(f"| memory.failcnt (limit hits, reclaim) | {cg.read('memory.failcnt').strip()} |")
        print(f"| memory.max_usage_in_bytes | "
              f"{int(cg.read('memory.max_usage_in_bytes')) / mib:.1f} MiB |")
        print(f"| knnd anonymous RSS | {anon / mib:.1f} MiB |")
        print(f"| index pages resident in page cache (knnd_index_page_cache_resident_bytes) | "
              f"{resident / mib:.1f} MiB = {100 * resident / size:.0f}% of the file "
              f"(without the cgroup: {100 * free_res / size:.0f}%) |")
    finally:
        d.stop()
        cg.remove()


def case_model(a, tmp, dim):
    mib = 2 ** 20
    d = mt.Daemon(tmp, a.index, name="model")
    try:
        assert d.wait_serving(600), d.read_log()
        stub = d.stub()
        rng = np.random.default_rng(6)
        mt.run_requests(stub, [mt.request(rng, dim, 16, 10, a.nprobe)
                               for _ in range(500)], window=4)
        time.sleep(0.5)
        anon = mt.rss_anon(d.proc.pid)
        heap = d.metric("knnd_index_heap_bytes")
        table = d.metric("knnd_index_precomputed_table_bytes")
        bound = 0.1 * heap + 32 * mib
        print(f"| {os.path.basename(a.index)} | {heap / mib:.1f} MiB "
              f"(table {table / mib:.1f}) | {anon / mib:.1f} MiB | "
              f"{(anon - heap) / mib:+.1f} MiB | {bound / mib:.1f} MiB | "
              f"{'yes' if abs(anon - heap) <= bound else 'NO'} |")
    finally:
        d.stop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--knnd", required=True)
    p.add_argument("--source-dir", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--cases", default="pss,cgroup,model")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--nprobe", type=int, default=32)
    a = p.parse_args()
    mt.ARGS = argparse.Namespace(knnd=os.path.abspath(a.knnd), source_dir=a.source_dir)
    with tempfile.TemporaryDirectory() as tmp:
        knnd_harness.generate_stubs(a.source_dir, tmp)
        dim = index_dim(a.index)
        print(f"index {a.index}: {os.path.getsize(a.index) / 2**20:.0f} MiB, d={dim}; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
              f"{os.cpu_count()} CPUs", flush=True)
        for case in a.cases.split(","):
            print(f"\n### {case}", flush=True)
            if case == "cgroup" and not mt.cgroup_v1_writable():
                print("skipped: needs root and a writable cgroup v1 memory hierarchy")
                continue
            {"pss": case_pss, "cgroup": case_cgroup, "model": case_model}[case](a, tmp, dim)
            sys.stdout.flush()


if __name__ == "__main__":
    main()

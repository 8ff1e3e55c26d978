#!/usr/bin/python3
"""knnd under a memory limit smaller than its files (issue 56, item 1):
one index served inside a fresh cgroup v1 memory cgroup per limit, the
index's files evicted from the page cache before each point, a closed-loop
load for a fixed time, and per point: q/s, p50/p99, recall@10 against exact
search, major faults a query (the process's majflt and the cgroup's
pgmajfault), memory.stat, failcnt, max_usage, oom_kill, failed calls, and
which of the files stayed resident (fincore). The disk's own 4 KiB
random-read rate (fio, O_DIRECT, queue depth 1 and 16) gives "what the disk
allows": that rate over the pages a query's re-ranking reads
(refine_factor * k rows of 4*d bytes, rounded up to pages).

  memory_limit_bench.py --knnd BUILD/knnd --knnctl BUILD/knnctl --source-dir . \\
      [--rows 1000000 --dim 128] [--limits 1.25,1,0.5,0.25,hot,below] \\
      [--seconds 60] [--clients 2] [--nprobe N --refine_factor R]

Data, index and ground truth are cached under --cache (seeded; reused when
present): bench/make_clustered.py vectors, `knnctl build` (FastScan recipe,
INDEX.vectors kept), `knnctl tune` (target recall 0.95), exact neighbours
with python3-faiss. Needs root and a writable cgroup v1 memory hierarchy.
A limit is a share of the files' total bytes, "hot" ((index file + knnd's
anonymous memory, its index heap included, as memory.stat rss counted it at
the first point) + 10%) or "below" (the same without the 10%, less 16 MiB).
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
import knnd_harness  # noqa: E402

CGROUP_V1 = "/sys/fs/cgroup/memory"
MIB = 2 ** 20
PAGE = 4096
MEMORY_STAT = ("cache", "rss", "mapped_file", "active_file", "inactive_file",
               "pgmajfault", "pgpgin")


def run(cmd, **kw):
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(list(map(str, cmd)), check=True, **kw)


def prepare(a):
    """The cached data set, index (tuned) and exact ground truth; returns
    (folder, index path)."""
    folder = os.path.join(a.cache, f"clustered_{a.rows}_{a.dim}_s{a.seed}")
    index = os.path.join(folder, "index", "index.faiss")
    base, queries = (os.path.join(folder, n) for n in ("base.npy", "queries.npy"))
    gt = os.path.join(folder, "gt.npy")
    os.makedirs(os.path.dirname(index), exist_ok=True)
    make = os.path.join(HERE, "..", "make_clustered.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not os.path.exists(base):
        run([sys.executable, make, a.rows, a.dim, a.seed, base + ".tmp.npy"])
        os.rename(base + ".tmp.npy", base)
    if not os.path.exists(queries):
        run([sys.executable, make, a.queries, a.dim, a.seed + 1,
             queries + ".tmp.npy", a.seed])
        os.rename(queries + ".tmp.npy", queries)
    tuned = os.path.join(folder, "tuned")
    if not os.path.exists(tuned):
        run([a.knnctl, "build", "--input", base, "--output", index], env=env)
        run([a.knnctl, "tune", "--index", index, "--queries", queries,
             "--target_recall", "0.95"], env=env)
        open(tuned, "w").close()
    if not os.path.exists(gt):
        import faiss
        faiss.omp_set_num_threads(1)
        xb = np.load(base, mmap_mode="r")
        flat = faiss.IndexFlatL2(a.dim)
        for begin in range(0, len(xb), 100000):
            flat.add(np.ascontiguousarray(xb[begin:begin + 100000]))
        _, ids = flat.search(np.load(queries), 10)
        np.save(gt + ".tmp.npy", ids)
        os.rename(gt + ".tmp.npy", gt)
    return folder, index


def version_files(index):
    folder = os.path.dirname(index)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder))


def evict(files):
    """Writes back and drops the files' pages from the page cache."""
    os.sync()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(files):
    """{file name: resident bytes} by fincore (util-linux)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw",
                          "--output", "RES,FILE", *files],
                         capture_output=True, text=True, check=True).stdout
    result = {}
    for line in out.splitlines():
        res, path = line.split(" ", 1)
        result[os.path.basename(path)] = int(res)
    return result


def fio(a):
    """{queue depth: (IOPS, p50 us, p99 us)} of 4 KiB O_DIRECT random reads
    on a file in the cache folder (the index's file system)."""
    path = os.path.join(a.cache, "fio", "fio.dat")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rates = {}
    for qd in (1, 16):
        out = subprocess.run(
            ["fio", f"--name=randread-qd{qd}", f"--filename={path}", "--size=2G",
             "--rw=randread", "--bs=4k", "--direct=1", "--ioengine=libaio",
             f"--iodepth={qd}", f"--runtime={a.fio_seconds}", "--time_based",
             "--output-format=json"], capture_output=True, text=True, check=True).stdout
        read = json.loads(out)["jobs"][0]["read"]
        pct = read["clat_ns"]["percentile"]
        rates[qd] = (read["iops"], pct["50.000000"] / 1e3, pct["99.000000"] / 1e3)
        print(f"fio qd {qd}: {read['iops']:.0f} IOPS, p50 {rates[qd][1]:.0f} us, "
              f"p99 {rates[qd][2]:.0f} us", flush=True)
    return rates


def read_ahead_kb(path):
    """The read-ahead of the block device holding `path`: the kernel's
    read-around on a major fault of a mapping without MADV_RANDOM."""
    dev = os.stat(path).st_dev
    queue = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for q in (queue + "/queue", queue + "/../queue"):
        try:
            with open(q + "/read_ahead_kb") as f:
                return int(f.read())
        except OSError:
            pass
    return None


class Cgroup:
    """A fresh cgroup v1 memory cgroup with a limit; removed by remove()."""

    def __init__(self, name, limit):
        self.path = os.path.join(CGROUP_V1, name)
        os.mkdir(self.path)
        self.write("memory.limit_in_bytes", str(limit))

    def write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def stat(self):
        values = dict(line.split() for line in self.read("memory.stat").splitlines())
        return {k: int(values[k]) for k in MEMORY_STAT}

    def oom_kills(self):
        fields = self.read("memory.oom_control").split()
        return int(fields[fields.index("oom_kill") + 1]) if "oom_kill" in fields else -1

    def remove(self):
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def majflt(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[9])


def read_bytes(pid):
    """Bytes the process caused to be read from storage (/proc/PID/io),
    the read-around of its page faults included."""
    with open(f"/proc/{pid}/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["read_bytes"])


def load(stub, pb, queries, seconds, clients, nprobe, refine_factor):
    """Closed loop: `clients` threads each sending one query a call, the
    queries in turn from a different start each. Returns (calls answered,
    failed calls by status, latencies in s, {query row: ids})."""
    lat, failed, answers = [], {}, {}
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client(c):
        i = c * len(queries) // clients
        mine, my_failed, my_answers = [], {}, {}
        while time.monotonic() < end:
            row = i % len(queries)
            req = pb.SearchRequest(k=10, dim=queries.shape[1], nprobe=nprobe,
                                   refine_factor=refine_factor,
                                   vectors_f32le=queries[row].tobytes())
            t = time.monotonic()
            try:
                r = stub.Search(req, timeout=30)
                mine.append(time.monotonic() - t)
                my_answers.setdefault(row, list(r.ids))
            except Exception as e:  # grpc.RpcError: counted by its code
                code = str(e.code()) if hasattr(e, "code") else type(e).__name__
                my_failed[code] = my_failed.get(code, 0) + 1
            i += 1
        with lock:
            lat.extend(mine)
            answers.update(my_answers)
            for k, v in my_failed.items():
                failed[k] = failed.get(k, 0) + v

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(lat), failed, lat, answers


def recall(answers, gt):
    hits = [len(set(ids[:10]) & set(gt[row].tolist())) / 10 for row, ids in answers.items()]
    return sum(hits) / len(hits) if hits else float("nan")


def point(a, n, label, limit, index, files, queries, gt, tmp, pb):
    """One limit: evict, start knnd in a fresh cgroup, load, record."""
    evict(files)
    cg = Cgroup(f"knnd-bench-{os.getpid()}-{n}", limit)
    config = os.path.join(tmp, f"knnd-{n}.textproto")
    with open(config, "w") as f:
        f.write(f'index_path: "{index}"\nnum_workers: 1\nomp_threads_per_worker: 1\n'
                f"memory_headroom_bytes: {a.headroom_mib * MIB}\n")
    # The shell joins the cgroup, then execs knnd: every page knnd maps is
    # charged to the cgroup from the first.
    prefix = ["nice", "-n", "5", "sh", "-c",
              f'echo $$ > {cg.path}/cgroup.procs && exec "$@"', "sh"]
    d = knnd_harness.Daemon(a.knnd, ["--config", config],
                            log_path=os.path.join(tmp, f"knnd-{n}.log"), prefix=prefix,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    row = {"label": label, "limit_mib": limit / MIB}
    try:
        if not d.wait_serving(600):
            row.update(started=False, oom_kill=cg.oom_kills(),
                       log=d.read_log()[-600:])
            return row
        stub = d.stub()
        info = stub.GetIndexInfo(pb.GetIndexInfoRequest())
        nprobe = a.nprobe or info.default_nprobe
        refine = a.refine_factor if a.refine_factor is not None else info.default_refine_factor
        pid = d.proc.pid
        f0, s0, b0 = majflt(pid), cg.stat(), read_bytes(pid)
        t0 = time.monotonic()
        calls, failed, lat, answers = load(stub, pb, queries, a.seconds, a.clients,
                                           nprobe, refine)
        wall = time.monotonic() - t0
        alive = d.proc.poll() is None
        f1 = majflt(pid) if alive else f0
        b1 = read_bytes(pid) if alive else b0
        s1 = cg.stat()
        lat.sort()
        row.update(
            started=True, alive=alive, nprobe=nprobe, refine_factor=refine,
            file_bytes=info.file_bytes, heap_bytes=info.heap_bytes,
            calls=calls, failed=failed, qps=calls / wall,
            p50_ms=1e3 * lat[len(lat) // 2] if lat else None,
            p99_ms=1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
            recall10=recall(answers, gt), distinct_queries=len(answers),
            majflt_per_query=(f1 - f0) / max(calls, 1),
            cg_pgmajfault_per_query=(s1["pgmajfault"] - s0["pgmajfault"]) / max(calls, 1),
            read_kib_per_query=(b1 - b0) / 1024 / max(calls, 1),
            cg_pgpgin_per_query=(s1["pgpgin"] - s0["pgpgin"]) / max(calls, 1),
            memory_stat_mib={k: v / MIB for k, v in s1.items()
                             if k not in ("pgmajfault", "pgpgin")},
            failcnt=int(cg.read("memory.failcnt")),
            max_usage_mib=int(cg.read("memory.max_usage_in_bytes")) / MIB,
            oom_kill=cg.oom_kills(),
            resident_mib={k: v / MIB for k, v in resident(files).items()})
        return row
    finally:
        d.stop(grace_s=2)
        cg.remove()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--knnd", required=True)
    p.add_argument("--knnctl", required=True)
    p.add_argument("--source-dir", required=True)
    p.add_argument("--cache", default="/var/cache/knnd-bench/memory-limit")
    p.add_argument("--rows", type=int, default=1000000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--limits", default="1.25,1,0.5,0.25,hot,below",
                   help="shares of the files' total, 'hot' or 'below'")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--nprobe", type=int, default=0, help="0: the index's tuned default")
    p.add_argument("--refine_factor", type=int, default=None,
                   help="default: the index's tuned default")
    p.add_argument("--headroom_mib", type=int, default=8,
                   help="knnd's memory_headroom_bytes, in MiB")
    p.add_argument("--fio_seconds", type=int, default=20)
    p.add_argument("--out", default="memory_limit.json")
    a = p.parse_args()
    if os.geteuid() != 0 or not os.path.isdir(CGROUP_V1):
        sys.exit("needs root and a cgroup v1 memory hierarchy at " + CGROUP_V1)

    folder, index = prepare(a)
    files = version_files(index)
    total = sum(os.path.getsize(f) for f in files)
    queries = np.load(os.path.join(folder, "queries.npy"))
    gt = np.load(os.path.join(folder, "gt.npy"))
    rates = fio(a)

    import tempfile
    tmp = tempfile.mkdtemp(prefix="knnd-memory-limit-")
    knnd_harness.generate_stubs(a.source_dir, os.path.join(tmp, "stubs"))
    from knnd.v1 import knn_service_pb2 as pb

    index_bytes = os.path.getsize(index)
    anon = None
    rows = []
    for n, spec in enumerate(a.limits.split(",")):
        if spec in ("hot", "below"):
            if anon is None:
                # knnd's anonymous memory (its index heap, GetIndexInfo's
                # heap_bytes, and the rest of the process) as the cgroup
                # counted it (memory.stat rss) at the first point: the hot
                # and below points come last.
                anon = next(r["memory_stat_mib"]["rss"] for r in rows
                            if r.get("started")) * MIB
            hot = index_bytes + anon
            limit = int(hot * 1.1 if spec == "hot" else hot - 16 * MIB)
        else:
            limit = int(float(spec) * total)
        print(f"point {spec}: limit {limit / MIB:.0f} MiB", flush=True)
        r = point(a, n, spec, limit, index, files, queries, gt, tmp, pb)
        if r.get("started"):
            # Pages a query's re-ranking reads: refine_factor * k rows of
            # 4*d bytes, each on whole pages (a row straddling pages counted).
            row_bytes = 4 * a.dim
            pages_row = math.ceil(row_bytes / PAGE) + (1 if PAGE % row_bytes and row_bytes % PAGE else 0)
            pages = r["refine_factor"] * 10 * pages_row
            r["pages_per_query"] = pages
            for qd, (iops, _, _) in rates.items():
                r[f"disk_allows_qps_qd{qd}"] = iops / pages if pages else None
        print(json.dumps(r), flush=True)
        rows.append(r)
        # Written after every point: a sweep cut short keeps what it measured.
        result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "files_bytes": total,
                  "files": {os.path.basename(f): os.path.getsize(f) for f in files},
                  "index_bytes": index_bytes, "fio": rates, "points": rows,
                  "read_ahead_kb": read_ahead_kb(index),
                  "args": vars(a)}
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(table(result))


def table(result):
    lines = ["| limit | MiB | q/s | p50 ms | p99 ms | recall@10 | majflt/q | cg pgmajfault/q "
             "| cache / rss / mapped_file MiB | active / inactive file MiB "
             "| index.faiss / .vectors resident MiB | failcnt | max usage MiB | oom_kill "
             "| failed | KiB read/q | disk allows q/s (QD1 / QD16) |",
             "|" + "---|" * 17]
    for r in result["points"]:
        if not r.get("started"):
            lines.append(f"| {r['label']} | {r['limit_mib']:.0f} | did not start "
                         f"(oom_kill {r['oom_kill']}) |" + " |" * 14)
            continue
        m, res = r["memory_stat_mib"], r["resident_mib"]
        lines.append(
            f"| {r['label']} | {r['limit_mib']:.0f} | {r['qps']:.0f} | {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['recall10']:.3f} | {r['majflt_per_query']:.1f} "
            f"| {r['cg_pgmajfault_per_query']:.1f} "
            f"| {m['cache']:.0f} / {m['rss']:.0f} / {m['mapped_file']:.0f} "
            f"| {m['active_file']:.0f} / {m['inactive_file']:.0f} "
            f"| {res.get('index.faiss', 0):.0f} / {res.get('index.faiss.vectors', 0):.0f} "
            f"| {r['failcnt']} | {r['max_usage_mib']:.0f} | {r['oom_kill']} "
            f"| {sum(r['failed'].values())} | {r['read_kib_per_query']:.0f} "
            f"| {r.get('disk_allows_qps_qd1', 0):.0f} / {r.get('disk_allows_qps_qd16', 0):.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

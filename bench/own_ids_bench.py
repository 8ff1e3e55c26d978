#!/usr/bin/python3
"""Own ids against row ids on Fashion-MNIST, measured in one run
(bench/RESULTS.md, "Own ids").

  /usr/bin/python3 bench/own_ids_bench.py --build build [--nq 5000] \\
      [--rounds 5]

1. knnctl build (the default recipe, IVF256,PQ196x4fs with INDEX.vectors)
   three times over the same 60,000 training images: with row ids, with
   --ids 7*row+3 and with --ids of seeded random 63-bit ids. The three index
   files must be byte for byte the same (the lists hold rows); the two
   own-id builds add INDEX.ids.
2. build/bench/own_ids_bench over the three (knnd's IndexSnapshot in one
   process, one thread, one query per call, the first --nq test images):
   recall@10 in each index's own ids and queries/s at every --settings
   (nprobe:refine_factor), the indexes taking turns every --chunk queries
   in a rotating order, so that other load on the machine slows each alike.
3. knnctl tune (default sweep, --target_recall 0.95, --dry_run) on each:
   the setting it would record and the recall it measured there.
Prints the bench's Markdown table and the tune lines.
"""
import argparse
import os
import platform
import subprocess
import tempfile
import time

import numpy as np

FASHION = "/usr/share/datasets/fashion-mnist"
ROWS = 60000


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build",
                        help="CMake build directory holding knnctl")
    parser.add_argument("--nq", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--settings", default="8:0,8:4,16:0,16:4,16:8,32:8")
    parser.add_argument("--workdir", default="",
                        help="keep the indexes here (default: a temporary "
                             "directory, removed)")
    args = parser.parse_args()
    knnctl = os.path.join(args.build, "knnctl")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    tmp = None
    work = args.workdir
    if not work:
        tmp = tempfile.TemporaryDirectory()
        work = tmp.name
    train = f"{FASHION}/train-images-idx3-ubyte.gz"
    test = f"{FASHION}/t10k-images-idx3-ubyte.gz"
    rng = np.random.default_rng(33)
    hashes = rng.integers(0, 2**63 - 1, ROWS, dtype=np.int64)
    assert len(np.unique(hashes)) == ROWS
    variants = {
        "row ids": None,
        "ids 7*row+3": 7 * np.arange(ROWS, dtype=np.int64) + 3,
        "random 63-bit ids": hashes,
    }
    paths = {}
    for name, ids in variants.items():
        tag = name.split()[0]
        path = os.path.join(work, f"{tag}.index")
        cmd = [knnctl, "build", "--input", train, "--output", path]
        if ids is not None:
            ids_path = os.path.join(work, f"{tag}.ids.npy")
            np.save(ids_path, ids)
            cmd += ["--ids", ids_path]
        start = time.time()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        print(f"built {name}: {path} in {time.time() - start:.0f} s",
              flush=True)
        paths[name] = path
    with open(paths["row ids"], "rb") as f:
        reference = f.read()
    for name, path in paths.items():
        with open(path, "rb") as f:
            assert f.read() == reference, f"{name}: index differs from row ids"
    print("the three index files are identical (lists of rows)", flush=True)

    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{cpu_model()}, {os.cpu_count()} cores\n", flush=True)
    subprocess.run(
        [os.path.join(args.build, "bench", "own_ids_bench"),
         "--indexes", ",".join(paths.values()), "--queries", test,
         "--limit", str(args.nq), "--rounds", str(args.rounds),
         "--chunk", str(args.chunk), "--settings", args.settings],
        check=True, env=env)
    print(flush=True)
    for name, path in paths.items():
        out = subprocess.run(
            [knnctl, "tune", "--index", path, "--queries", test, "--limit",
             str(args.nq), "--target_recall", "0.95", "--dry_run"],
            check=True, capture_output=True, text=True, env=env).stdout
        chosen = [line for line in out.splitlines()
                  if line.startswith(("tuned", "target"))]
        print(f"knnctl tune, {name}: {chosen[0] if chosen else out}")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""knnd_bucket_sync: brings the index versions that `knnctl publish
--remote` uploads to a bucket into the versions directory knnd serves
(knnd --index DIR), on the pod's local disk.

The bucket holds PREFIX/<N>/ per version: index.faiss and the files its
manifest binds (a sharded set: shard S under shard-S/), and
PREFIX/<N>/bucket-manifest.json, uploaded last, listing every file with
its size and SHA-256. A version without that manifest is incomplete and
is never fetched.

One pass:
  1. the complete versions in the bucket are listed; those newer than the
     newest one on disk (and not refused before) are tried newest first;
  2. the disk budget is checked: the version's bytes must fit beside the
     versions kept (--disk_budget_bytes, and the filesystem's free space),
     else it is refused and logged;
  3. its files are copied with rclone into DIR/<N>.tmp/ (the same
     filesystem), rate and parallelism bounded (--bwlimit, --transfers);
  4. every file is checked against the bucket manifest's size and SHA-256;
     a mismatch refuses the version (logged, never retried until its bucket
     manifest changes) and removes the copy;
  5. DIR/<N>.tmp/ is renamed to DIR/<N>/: knnd sees the version whole or
     not at all, loads it (checking its own manifest's CRC-32s as for any
     version) and swaps to it while it answers;
  6. versions beyond the --keep newest are removed (renamed to N.tmp, then
     deleted), so that the directory holds the version serving and the one
     before it; knnd keeps a replaced version it still maps (its
     keep_previous_versions) readable until it lets it go.
A sharded set: each shard's pod runs with --shard S --shards N and fetches
shard-S/ of each version under the version's number, so every shard has
the same numbers and a front serves a version once every shard does
(docs/sharding.md).

--once (the init container): removes staging folders left by a killed
sync, then fetches the newest complete version that verifies (falling back
to older ones) unless one is already on disk; exit 0 once a version is in
place, 1 when none could be. Without --once (the sidecar): the same pass
every --poll_interval_s seconds until SIGTERM.

rclone must be on PATH (or --rclone). The remote is configured through
rclone's environment variables (RCLONE_CONFIG_<NAME>_TYPE=s3, ...),
which the pod takes from a Secret or its workload identity; nothing is
written to disk. Standard library only.
"""
import argparse
import ctypes
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MANIFEST = "bucket-manifest.json"
FORMAT_VERSION = 1
# rclone's exit code for "directory not found" (an empty prefix).
RCLONE_DIRECTORY_NOT_FOUND = 3
VERSION_MANIFEST = "index.faiss.manifest.json"
PR_SET_PDEATHSIG = 1


class SyncError(Exception):
    """A pass that cannot go on: the message says what and why."""


class NotFound(SyncError):
    """rclone's "directory not found": an empty prefix."""


def log(message):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{stamp} knnd_bucket_sync: {message}", file=sys.stderr, flush=True)


def _die_with_parent():
    """In the rclone child: killed when the sync dies, however it dies, so
    that no orphan goes on writing into a staging folder."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class Sync:
    """The passes of one sync over one versions directory, of which it is
    the only writer (its N.tmp folders, the versions it renames in and
    removes). Remembers the versions it refused and the messages it logged;
    owns the rclone child running, which stop() (the SIGTERM handler)
    ends. Single-threaded."""

    def __init__(self, args):
        self.args = args
        self.remote = args.remote.rstrip("/")
        self.dir = args.versions_dir
        self.refused = {}  # version -> SHA-256 of the bucket manifest refused
        self.child = None
        self.stopping = False
        self.reported = set()  # messages logged since a clean pass

    # rclone

    def rclone(self, args, what):
        """rclone's stdout; SyncError with its last stderr lines otherwise
        (NotFound for rclone's "directory not found")."""
        cmd = [self.args.rclone, *args]
        try:
            self.child = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        except FileNotFoundError:
            raise SyncError(f"rclone ({self.args.rclone}) is not on PATH: the "
                            "sync copies through rclone (Debian: apt-get "
                            "install rclone)") from None
        out, err = self.child.communicate()
        code = self.child.returncode
        self.child = None
        if self.stopping:
            raise SyncError("stopped")
        if code != 0:
            tail = "; ".join(line.strip() for line in err.splitlines()
                             if line.strip())[-600:]
            error = NotFound if code == RCLONE_DIRECTORY_NOT_FOUND else SyncError
            raise error(f"rclone could not {what} (exit {code}): {tail}")
        return out

    def stop(self, *_):
        self.stopping = True
        if self.child is not None:
            self.child.terminate()

    # the bucket

    def bucket_versions(self):
        """The complete versions in the bucket (with a bucket manifest),
        highest first."""
        try:
            out = self.rclone(["lsf", "--files-only", "--max-depth", "2",
                               "--include", f"/*/{MANIFEST}", self.remote],
                              f"list {self.remote}")
        except NotFound:
            return []
        found = []
        for line in out.splitlines():
            m = re.fullmatch(r"(\d+)/" + re.escape(MANIFEST), line.strip())
            if m and int(m[1]) > 0:
                found.append(int(m[1]))
        return sorted(found, reverse=True)

    def read_manifest(self, version):
        """(parsed bucket manifest, its SHA-256, the files this pod fetches
        as [(path in the bucket, local name, bytes, sha256)])."""
        text = self.rclone(["cat", f"{self.remote}/{version}/{MANIFEST}"],
                           f"read {self.remote}/{version}/{MANIFEST}")
        digest = hashlib.sha256(text.encode()).hexdigest()
        try:
            manifest = json.loads(text)
            if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
                raise SyncError(f"version {version}: bucket manifest format "
                                f"{manifest['format_version']} is newer than "
                                f"this sync reads ({FORMAT_VERSION})")
            if int(manifest.get("version", 0)) != version:
                raise SyncError(f"version {version}: its bucket manifest says "
                                f"version {manifest.get('version')}")
            shard_count = int(manifest.get("shard_count", 0))
            files = [(f["path"], int(f["bytes"]), f["sha256"])
                     for f in manifest.get("files", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SyncError(f"version {version}: bucket manifest is not "
                            f"valid: {e!r}") from None
        shards = self.args.shards
        if shard_count != shards:
            what = (f"a set of {shard_count} shards" if shard_count
                    else "one index, not a sharded set")
            want = (f"shard {self.args.shard} of {shards}" if shards
                    else "one whole index")
            raise SyncError(f"version {version} is {what}; this pod serves "
                            f"{want}")
        prefix = f"shard-{self.args.shard}/" if shards else ""
        chosen = []
        for path, size, sha in files:
            if prefix and not path.startswith(prefix):
                continue
            name = path[len(prefix):]
            if not name or "/" in name or name.startswith("."):
                raise SyncError(f"version {version}: bucket manifest lists "
                                f"{path!r}, not a file of {prefix or 'the version'}")
            chosen.append((path, name, size, sha))
        if not any(name == VERSION_MANIFEST for _, name, _, _ in chosen):
            raise SyncError(f"version {version}: bucket manifest lists no "
                            f"{prefix}{VERSION_MANIFEST}")
        return manifest, digest, chosen

    # the versions directory

    def local_versions(self):
        """The complete versions on disk (their own manifest present),
        highest first."""
        found = []
        for name in os.listdir(self.dir):
            if name.isdigit() and int(name) > 0 and os.path.exists(
                    os.path.join(self.dir, name, VERSION_MANIFEST)):
                found.append(int(name))
        return sorted(found, reverse=True)

    def remove_staging(self):
        """Removes N.tmp folders: a killed sync's partial copies, and
        versions being deleted."""
        for name in os.listdir(self.dir):
            if name.endswith(".tmp"):
                shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)
                log(f"removed {name} (a copy or removal that did not finish)")

    def prune(self, keep):
        """Removes the versions beyond the `keep` newest on disk."""
        for version in self.local_versions()[keep:]:
            path = os.path.join(self.dir, str(version))
            # Out of knnd's sight at once (a rename), then deleted.
            os.rename(path, path + ".tmp")
            shutil.rmtree(path + ".tmp", ignore_errors=True)
            log(f"removed version {version} (beyond the {keep} newest kept)")

    def used_bytes(self):
        total = 0
        for root, _, names in os.walk(self.dir):
            for name in names:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
        return total

    def check_budget(self, version, needed):
        used = self.used_bytes()
        budget = self.args.disk_budget_bytes
        if budget and used + needed > budget:
            raise SyncError(
                f"version {version} needs {needed} bytes; the versions "
                f"directory holds {used} of its budget {budget} "
                "(--disk_budget_bytes): not fetched. Raise the volume's "
                "sizeLimit and --disk_budget_bytes, or lower --keep")
        fs = os.statvfs(self.dir)
        free = fs.f_bavail * fs.f_frsize
        if needed > free:
            raise SyncError(f"version {version} needs {needed} bytes; the "
                            f"filesystem of {self.dir} has {free} free: not "
                            "fetched")

    # one version

    def fetch(self, version):
        """Copies, verifies and renames `version` into place; SyncError
        when it cannot (the version is then remembered as refused when its
        files do not match its bucket manifest)."""
        manifest, digest, files = self.read_manifest(version)
        needed = sum(size for _, _, size, _ in files)
        # The new version will be one of the --keep kept.
        self.prune(max(self.args.keep - 1, 1))
        self.check_budget(version, needed)
        staging = os.path.join(self.dir, f"{version}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        os.mkdir(staging)
        try:
            start = time.monotonic()
            source = f"{self.remote}/{version}"
            if self.args.shards:
                source += f"/shard-{self.args.shard}"
            with tempfile.NamedTemporaryFile("w", suffix=".list") as listing:
                listing.write("".join(f"{name}\n" for _, name, _, _ in files))
                listing.flush()
                cmd = ["copy", "--files-from", listing.name, "--no-traverse",
                       "--transfers", str(self.args.transfers)]
                if self.args.bwlimit:
                    cmd += ["--bwlimit", self.args.bwlimit]
                self.rclone(cmd + [source, staging],
                            f"copy version {version} from {source}")
            copied = time.monotonic()
            self.verify(version, digest, staging, files)
            for _, name, _, _ in files:
                fd = os.open(os.path.join(staging, name), os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            os.rename(staging, os.path.join(self.dir, str(version)))
            fd = os.open(self.dir, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        built = manifest.get("source", "?")
        log(f"version {version} ready ({built}, build "
            f"{manifest.get('build_id', '?')}): {len(files)} files, "
            f"{needed} bytes, copied in {copied - start:.1f} s, verified in "
            f"{time.monotonic() - copied:.1f} s")

    def verify(self, version, digest, staging, files):
        for path, name, size, sha in files:
            local = os.path.join(staging, name)
            actual = os.path.getsize(local) if os.path.exists(local) else None
            if actual != size:
                self.refused[version] = digest
                raise SyncError(f"refused version {version}: {path} has "
                                f"{actual} bytes, its bucket manifest lists "
                                f"{size}")
            h = hashlib.sha256()
            with open(local, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
            if h.hexdigest() != sha:
                self.refused[version] = digest
                raise SyncError(f"refused version {version}: {path} has "
                                f"SHA-256 {h.hexdigest()}, its bucket "
                                f"manifest lists {sha} (corrupt or "
                                "replaced in the bucket)")

    # passes

    def sync_once(self):
        """Fetches the newest complete version newer than what is on disk
        that verifies, logging each one that does not. Returns (the version
        fetched or None, whether a version failed)."""
        local = self.local_versions()
        newest_local = local[0] if local else 0
        failed = False
        for version in self.bucket_versions():
            if version <= newest_local:
                break
            if version in self.refused:
                # Tried again only once its bucket manifest changed.
                _, digest, _ = self.read_manifest(version)
                if self.refused[version] == digest:
                    continue
                del self.refused[version]
            try:
                self.fetch(version)
            except (SyncError, OSError) as e:
                if self.stopping:
                    raise
                self.report(str(e))
                failed = True
                continue
            self.prune(self.args.keep)
            return version, failed
        return None, failed

    def report(self, message):
        """Logs `message` unless it was logged since the last pass that
        went through without an error."""
        if message not in self.reported:
            log(message)
            self.reported.add(message)

    def run_once(self):
        try:
            self.sync_once()
        except (SyncError, OSError) as e:
            log(str(e))
        local = self.local_versions()
        if not local:
            log(f"no complete version of {self.remote} could be fetched "
                f"into {self.dir}")
            return 1
        log(f"version {local[0]} in place in {self.dir}")
        return 0

    def run_forever(self):
        while not self.stopping:
            try:
                _, failed = self.sync_once()
                if not failed:
                    self.reported.clear()
            except (SyncError, OSError) as e:
                if self.stopping:
                    break
                self.report(str(e))
            deadline = time.monotonic() + self.args.poll_interval_s
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(min(0.2, self.args.poll_interval_s))
        log("stopped")
        return 0


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--remote", required=True,
                        help="REMOTE:bucket/prefix that knnctl publish --remote "
                        "uploads to (an rclone remote path)")
    parser.add_argument("--versions_dir", required=True,
                        help="knnd's versions directory (knnd --index DIR)")
    parser.add_argument("--once", action="store_true",
                        help="one pass, for an init container (exit 1 when no "
                        "version could be put in place)")
    parser.add_argument("--poll_interval_s", type=float, default=30,
                        help="seconds between passes (default 30)")
    parser.add_argument("--shard", type=int, default=0,
                        help="with --shards: the shard this pod serves")
    parser.add_argument("--shards", type=int, default=0,
                        help="the set's shard count; 0 (default): one index")
    parser.add_argument("--bwlimit", default="",
                        help="rclone --bwlimit of each copy (e.g. 100M bytes/s); "
                        "default none")
    parser.add_argument("--transfers", type=int, default=4,
                        help="rclone --transfers: files copied at once (default 4)")
    parser.add_argument("--disk_budget_bytes", type=int, default=0,
                        help="bytes the versions directory may hold (the "
                        "volume's sizeLimit); 0: the filesystem's free space only")
    parser.add_argument("--keep", type=int, default=2,
                        help="versions kept on disk, newest first (default 2: "
                        "the one serving and the one before)")
    parser.add_argument("--rclone", default="rclone",
                        help="the rclone executable (default: rclone on PATH)")
    args = parser.parse_args(argv)
    problems = []
    if ":" not in args.remote:
        problems.append(f"--remote {args.remote} is not REMOTE:bucket/prefix")
    if args.shards < 0 or (args.shards and not 0 <= args.shard < args.shards):
        problems.append(f"--shard {args.shard} is not in [0, --shards "
                        f"{args.shards})")
    if args.keep < 1:
        problems.append(f"--keep {args.keep} is below 1")
    if args.transfers < 1:
        problems.append(f"--transfers {args.transfers} is below 1")
    if args.poll_interval_s <= 0:
        problems.append(f"--poll_interval_s {args.poll_interval_s} is not "
                        "above 0")
    if args.disk_budget_bytes < 0:
        problems.append(f"--disk_budget_bytes {args.disk_budget_bytes} is "
                        "negative")
    if problems:
        parser.error("; ".join(problems))
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if shutil.which(args.rclone) is None:
        log(f"rclone ({args.rclone}) is not on PATH: the sync copies through "
            "rclone (Debian: apt-get install rclone)")
        return 1
    os.makedirs(args.versions_dir, exist_ok=True)
    sync = Sync(args)
    signal.signal(signal.SIGTERM, sync.stop)
    signal.signal(signal.SIGINT, sync.stop)
    sync.remove_staging()
    log(f"{args.remote} -> {args.versions_dir}"
        + (f" (shard {args.shard} of {args.shards})" if args.shards else "")
        + ("" if args.once else f", every {args.poll_interval_s:g} s"))
    return sync.run_once() if args.once else sync.run_forever()


if __name__ == "__main__":
    sys.exit(main())

"""Scaffolding shared by the Python tests (tests/python, tests/deploy) and
benches (bench/) that start knnd and talk to it: free ports, client stubs
generated from the .proto files, a knnd process that is waited on until
SERVING, and the common argparse + unittest main of the test scripts.

Standard library only (grpc and the generated stubs are imported where
used). Bench scripts import it with tests/python put on sys.path.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import unittest
import urllib.request


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(n):
    """`n` distinct TCP ports on 127.0.0.1 that were free a moment ago (held
    together while they are picked, so that no two are the same)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def generate_stubs(source_dir, out_dir):
    """Compiles knnd/v1/knn_service.proto and the gRPC health proto into
    out_dir the way a client project would, puts out_dir first on sys.path
    and returns it: `knnd.v1.knn_service_pb2(_grpc)` and
    `health_v1.health_pb2(_grpc)` import from there. The health proto is
    copied under another folder: its Python module path comes from the file
    path, and grpc/health/v1 would clash with the grpc package."""
    os.makedirs(os.path.join(out_dir, "protos", "health_v1"))
    with open(f"{source_dir}/proto/grpc/health/v1/health.proto") as src, \
            open(os.path.join(out_dir, "protos", "health_v1", "health.proto"), "w") as dst:
        dst.write(src.read())
    plugin = "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"
    for proto_path, proto in ((f"{source_dir}/proto", "knnd/v1/knn_service.proto"),
                              (os.path.join(out_dir, "protos"), "health_v1/health.proto")):
        subprocess.run(
            ["protoc", f"--proto_path={proto_path}", f"--python_out={out_dir}",
             f"--grpc_out={out_dir}", plugin, os.path.join(proto_path, proto)],
            check=True)
    sys.path.insert(0, out_dir)
    return out_dir


def build_test_index(path, seed, n=20000, dim=48):
    """Writes the tests' index to `path` with python3-faiss and returns its
    vectors: n clustered dim-d float32 vectors (40 centres), IVF64,PQ12,
    nprobe 6 stored as the default."""
    import faiss
    import numpy as np
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, dim)).astype("float32") * 4
    xb = (centres[rng.integers(0, 40, n)]
          + rng.standard_normal((n, dim))).astype("float32")
    index = faiss.index_factory(dim, "IVF64,PQ12")
    # index_factory turns polysemous training on (minutes here). Through the
    # downcast IndexIVFPQ: set on extract_index_ivf()'s IndexIVF proxy, the
    # flag would be a Python attribute, ignored.
    faiss.downcast_index(
        faiss.extract_index_ivf(index)).do_polysemous_training = False
    index.train(xb)
    index.add(xb)
    faiss.extract_index_ivf(index).nprobe = 6
    faiss.write_index(index, path)
    return xb


def _openssl(*command):
    subprocess.run(["openssl", *command], check=True, capture_output=True)


EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def make_ca(directory, name):
    """A self-signed CA made with openssl; returns (NAME.crt, NAME.key)."""
    crt, key = (os.path.join(directory, f"{name}.{e}") for e in ("crt", "key"))
    _openssl("req", "-x509", *EC_KEY, "-keyout", key, "-out", crt, "-days", "2",
             "-subj", f"/CN=knnd test {name}")
    return crt, key


def make_cert(directory, name, ca, subject_alt_name=None):
    """A certificate NAME.crt (CN=NAME) and its key signed by `ca`, a
    (crt, key) pair; returns (NAME.crt, NAME.key)."""
    crt, key, csr = (os.path.join(directory, f"{name}.{e}")
                     for e in ("crt", "key", "csr"))
    _openssl("req", *EC_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    extra = []
    if subject_alt_name:
        ext = os.path.join(directory, f"{name}.ext")
        with open(ext, "w") as f:
            f.write(f"subjectAltName={subject_alt_name}\n")
        extra = ["-extfile", ext]
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1],
             "-CAcreateserial", "-out", crt, "-days", "2", *extra)
    return crt, key


def make_tls_files(directory):
    """A CA and a server certificate for localhost / 127.0.0.1 signed by
    it, made with openssl; returns (ca.crt, server.crt, server.key)."""
    ca = make_ca(directory, "ca")
    crt, key = make_cert(directory, "server", ca, "DNS:localhost,IP:127.0.0.1")
    return ca[0], crt, key


def copy_client_sources(source_dir, dst):
    """Copies proto/ and clients/python/ under `dst` (so that building the
    client leaves nothing in the source tree); returns the copy of
    clients/python."""
    shutil.copytree(os.path.join(source_dir, "proto"), os.path.join(dst, "proto"))
    client = os.path.join(dst, "clients", "python")
    shutil.copytree(os.path.join(source_dir, "clients", "python"), client,
                    ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                  "__pycache__", "_generated"))
    return client


def install_client(source_dir, dst):
    """knnd-client (clients/python) built from Debian's packages (system
    protoc, python3-grpcio; nothing downloaded) and installed under
    dst/site, which is put first on sys.path; returns that folder."""
    client = copy_client_sources(source_dir, os.path.join(dst, "src"))
    site = os.path.join(dst, "site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    "--no-index", "--no-build-isolation", "--no-deps",
                    "--target", site, client], check=True,
                   env=dict(os.environ, PIP_ROOT_USER_ACTION="ignore"))
    sys.path.insert(0, site)
    return site


def channel(address):
    """A gRPC channel to `address` with no message size limits, on its own
    subchannel: a first connect that was refused would otherwise keep a
    shared subchannel backing off for seconds."""
    import grpc
    return grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", -1),
                          ("grpc.max_send_message_length", -1),
                          ("grpc.use_local_subchannel_pool", 1)])


class Daemon:
    """One knnd process: `prefix + [knnd] + args` plus --listen (`address`,
    a free loopback port unless given), --metrics_listen (a free loopback
    port) and --admin_listen 127.0.0.1:0, so that no fixed port clashes with
    another knnd on the machine. stdout and stderr go to `log_path` (or are
    dropped). With `knnctl`, readiness is polled with `knnctl health` in the
    daemon's environment; otherwise with the generated health stub (call
    generate_stubs first). `popen` goes to subprocess.Popen (env,
    preexec_fn...).

    Owns the process and the channels it hands out; stop() ends both. Not
    thread-safe: one thread starts, waits on and stops it."""

    # A port picked by free_ports() can be taken by another process (an
    # outgoing connection's local port, for one) before knnd binds it; knnd
    # then exits with this message and wait_serving() starts it again on
    # new ports, this many times at most.
    PORT_TAKEN = "(address in use or invalid)"
    PORT_RETRIES = 3

    def __init__(self, knnd, args=(), log_path=None, address=None, knnctl=None,
                 prefix=(), **popen):
        self.fixed_address = address
        self.log_path = log_path
        self.knnctl = knnctl
        self.env = popen.get("env")
        self.channels = []
        self.port_retries = 0
        self._launch = (prefix, knnd, args, popen)
        self._start()

    def _start(self):
        prefix, knnd, args, popen = self._launch
        listen, metrics = free_ports(2)
        self.address = self.fixed_address or f"127.0.0.1:{listen}"
        self.port = int(self.address.rsplit(":", 1)[1])
        self.metrics_address = f"127.0.0.1:{metrics}"
        self.metrics_port = metrics
        cmd = [*prefix, knnd, *args, "--listen", self.address,
               "--metrics_listen", self.metrics_address,
               "--admin_listen", "127.0.0.1:0"]
        if self.log_path:
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             **popen)
        else:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, **popen)

    def _restarted_on_new_ports(self):
        """After knnd exited: starts it again on new ports if it exited
        because a port it was given had been taken meanwhile."""
        if (self.port_retries >= self.PORT_RETRIES or not self.log_path
                or self.PORT_TAKEN not in self.read_log()):
            return False
        self.port_retries += 1
        self._start()
        return True

    def serving(self):
        """Whether one health check says SERVING (a fresh channel each time)."""
        if self.knnctl:
            return subprocess.run(
                [self.knnctl, "health", "--addr", self.address, "--timeout_ms", "500"],
                capture_output=True, env=self.env).returncode == 0
        import grpc
        from health_v1 import health_pb2 as health_pb
        from health_v1 import health_pb2_grpc as health_grpc
        with channel(self.address) as ch:
            try:
                r = health_grpc.HealthStub(ch).Check(health_pb.HealthCheckRequest(),
                                                     timeout=1)
                return r.status == health_pb.HealthCheckResponse.SERVING
            except grpc.RpcError:
                return False

    def wait_serving(self, timeout=120, poll_s=0.05):
        """True once health says SERVING; False if knnd exits first or
        `timeout` seconds pass."""
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                if self._restarted_on_new_ports():
                    continue
                return False
            if self.serving():
                return True
            time.sleep(poll_s)
        return False

    def stub(self):
        """A KnnService stub on a new channel (closed by stop())."""
        from knnd.v1 import knn_service_pb2_grpc as pb_grpc
        self.channels.append(channel(self.address))
        return pb_grpc.KnnServiceStub(self.channels[-1])

    def read_log(self):
        if not self.log_path:
            return ""
        with open(self.log_path) as f:
            return f.read()

    def scrape(self):
        """The /metrics page as {sample name with labels: value}."""
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics",
                                    timeout=5) as r:
            text = r.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def metric(self, prefix):
        """The sum of the samples whose name (with labels) starts with `prefix`."""
        return sum(v for name, v in self.scrape().items() if name.startswith(prefix))

    def close_channels(self):
        """Closes every channel stub() made (knnd then drops the connections
        and what gRPC kept for them)."""
        for ch in self.channels:
            ch.close()
        self.channels = []

    def stop(self, grace_s=0):
        """Closes the channels and ends knnd: SIGKILL, or with `grace_s` a
        SIGTERM and SIGKILL after that many seconds. Returns the exit code."""
        return self._reap(self._begin_stop(grace_s))

    def _begin_stop(self, grace_s):
        """stop()'s first half: the channels closed, SIGTERM sent when
        `grace_s`; returns the time at which _reap() kills."""
        self.close_channels()
        if grace_s and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return time.monotonic() + grace_s

    def _reap(self, kill_at):
        """stop()'s second half: waits for the exit until `kill_at`, then
        SIGKILL. Returns the exit code."""
        if self.proc.poll() is None:
            try:
                return self.proc.wait(max(0.0, kill_at - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self.proc.kill()
        return self.proc.wait()


def stop_all(daemons, grace_s=0):
    """Daemon.stop(grace_s) for each of `daemons`, their shutdown delays
    (knnd's default is 5 s) passing together rather than one after another:
    every one gets its SIGTERM before any is waited on. Returns the exit
    codes."""
    daemons = list(daemons)
    kill_at = [daemon._begin_stop(grace_s) for daemon in daemons]
    return [daemon._reap(t) for daemon, t in zip(daemons, kill_at)]


def start_serving(daemons, name, knnd, args, log_dir, knnctl=None,
                  timeout=60):
    """Starts knnd `args` as daemons[name] (its log LOG_DIR/NAME.log) and
    waits until it serves; if it does not, stops every daemon of `daemons`
    and raises RuntimeError with its log. Returns the daemon."""
    daemon = Daemon(knnd, args, log_path=os.path.join(log_dir, name + ".log"),
                    knnctl=knnctl)
    daemons[name] = daemon
    if not daemon.wait_serving(timeout):
        log = daemon.read_log()
        stop_all(daemons.values(), 30)
        raise RuntimeError(f"knnd ({name}) did not start: {log}")
    return daemon


def unittest_main(description, knnctl=False, add_arguments=None, setup=None):
    """The main of a test script: parses --knnd, --source-dir (and --knnctl),
    plus what `add_arguments(parser)` adds; sets ARGS in the __main__ module
    (where unittest.main finds the tests); calls `setup(args)` if given (it
    may exit); runs the tests with the arguments left over."""
    import warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--knnd", required=True)
    if knnctl:
        parser.add_argument("--knnctl", required=True)
    parser.add_argument("--source-dir", required=True)
    if add_arguments:
        add_arguments(parser)
    args, rest = parser.parse_known_args()
    sys.modules["__main__"].ARGS = args
    if setup:
        setup(args)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


class LoopThread:
    """An asyncio event loop running in a thread of its own, so that one
    synchronous test body can drive an asyncio client as it drives a
    blocking one. Timings are unaffected: the calling thread only waits."""

    def __init__(self):
        import asyncio
        import threading
        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever,
                                       daemon=True)
        self.thread.start()

    def run(self, coroutine):
        return self._asyncio.run_coroutine_threadsafe(coroutine,
                                                      self.loop).result()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

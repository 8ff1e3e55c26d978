"""Build steps of knnd-client that pyproject.toml cannot declare: the gRPC
stubs, generated at build time from the repository's proto/ folder
(../../proto), or from a proto/ folder next to this file (an sdist), and
the runtime requirements those stubs impose. The stubs are never checked in.

Two generators, tried in this order:
  grpcio-tools (`python -m grpc_tools.protoc`): what an isolated build uses,
    `pip install ./clients/python` (pyproject.toml's [build-system] brings
    it from PyPI);
  protoc + grpc_python_plugin from PATH (or $PROTOC, $GRPC_PYTHON_PLUGIN;
    Debian: protobuf-compiler, protobuf-compiler-grpc): the system-packages
    route, `pip install --no-build-isolation --no-deps` in a venv over
    python3-grpcio, python3-protobuf and python3-numpy, where nothing is
    downloaded.
KNND_CLIENT_STUB_GENERATOR=grpc_tools|system forces one.

Generated code pins the runtime it can run on, and the build environment
is resolved apart from the one the package is installed into, so the
wheel's protobuf and grpcio requirements are read from the stubs it ships
(see runtime_requirements) rather than written down once: a wheel whose
stubs need protobuf 7 says so, and pip refuses to pair it with protobuf 4
instead of the import failing later.

Which stubs an isolated build makes is chosen in pyproject.toml: the
newest grpcio-tools would write stubs that refuse any grpcio and protobuf
older than itself (an application on grpcio 1.66 could not install the
client), so the build uses grpcio-tools 1.62.3, the last whose stubs check
no version (protoc 25.1): the wheel then declares grpcio>=1.51 and
protobuf>=4.25.1, and client_install_test.py installs it with exactly
those lowest versions as well as with the newest.
"""
import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile

import setuptools
from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = "knnd/v1/knn_service.proto"
# The generated modules live inside knnd_client, not as a top-level `knnd`
# package, so installing the client cannot shadow anything else.
GENERATED_PACKAGE = "knnd_client._generated"

# Tested ranges (tests/python/client_install_test.py makes both install
# routes, the other client_*_test.py scripts run in each):
# Debian 12's python3-numpy 1.24.2 and PyPI's newest 2.x.
NUMPY_REQUIREMENT = "numpy>=1.24,<3"
# Stubs without a version check (grpc_python_plugin before 1.63: Debian
# 12's 1.51, grpcio-tools 1.62.3): they import under grpcio 1.51.1
# (Debian's, and PyPI's in the lowest route) and PyPI's newest 1.x.
UNCHECKED_GRPC_REQUIREMENT = "grpcio>=1.51.1,<2"
# Protobuf gencode without a runtime check (protoc before 26: Debian 12's
# 3.21.12, grpcio-tools 1.62.3's 25.1) needs a runtime at least as new as
# the protoc; it was tested up to PyPI's newest 7.x, and 8 does not exist
# yet.
UNCHECKED_PROTOBUF_MAJOR_LIMIT = 8


def proto_root():
    for root in (os.path.join(HERE, "proto"),
                 os.path.normpath(os.path.join(HERE, "..", "..", "proto"))):
        if os.path.isfile(os.path.join(root, PROTO)):
            return root
    raise SystemExit(
        f"knnd-client: cannot find {PROTO} in {HERE}/proto or ../../proto; "
        "build from a clone of the knnd repository or from its sdist")


def find_tool(name, env):
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise SystemExit(
            f"knnd-client: neither grpcio-tools (an isolated build installs "
            f"it) nor {name} was found (set {env}); on Debian install "
            "protobuf-compiler and protobuf-compiler-grpc")
    return path


def has_grpc_tools():
    try:
        import grpc_tools.protoc  # noqa: F401
    except ImportError:
        return False
    return True


def protoc_command():
    """(the protoc command line to run, the generator's name)."""
    choice = os.environ.get("KNND_CLIENT_STUB_GENERATOR", "")
    if choice not in ("", "grpc_tools", "system"):
        raise SystemExit(
            f"knnd-client: KNND_CLIENT_STUB_GENERATOR={choice!r}: use "
            "grpc_tools or system")
    if choice == "grpc_tools" or (not choice and has_grpc_tools()):
        return [sys.executable, "-m", "grpc_tools.protoc"], ["--grpc_python_out"]
    return ([find_tool("protoc", "PROTOC"),
             "--plugin=protoc-gen-grpc="
             + find_tool("grpc_python_plugin", "GRPC_PYTHON_PLUGIN")],
            ["--grpc_out"])


def generate_stubs(out_dir):
    """Writes knn_service_pb2.py(i) and knn_service_pb2_grpc.py under
    out_dir/knnd_client/_generated/knnd/v1/; returns (the protoc version
    line, the two modules' text). The descriptor keeps the file name
    knnd/v1/knn_service.proto, so it is the same descriptor any other client
    generated from proto/ registers, and both can be imported in one
    process."""
    root = proto_root()
    gen = os.path.join(out_dir, *GENERATED_PACKAGE.split("."))
    os.makedirs(gen, exist_ok=True)
    command, grpc_out = protoc_command()
    version = subprocess.run(command + ["--version"], check=True,
                             capture_output=True, text=True).stdout.strip()
    subprocess.run(
        command + [f"--proto_path={root}", f"--python_out={gen}",
                   f"--pyi_out={gen}", f"{grpc_out[0]}={gen}",
                   os.path.join(root, PROTO)],
        check=True)
    # The grpc module imports its messages by the proto's path ("from
    # knnd.v1 import ..."); point it at the package it now lives in.
    v1 = os.path.join(gen, "knnd", "v1")
    grpc_module = os.path.join(v1, "knn_service_pb2_grpc.py")
    with open(grpc_module) as f:
        grpc_text = f.read()
    grpc_text, n = re.subn(r"^from knnd\.v1 import ",
                           f"from {GENERATED_PACKAGE}.knnd.v1 import ",
                           grpc_text, flags=re.M)
    if n != 1:
        raise SystemExit(f"knnd-client: unexpected import in {grpc_module}")
    with open(grpc_module, "w") as f:
        f.write(grpc_text)
    for package in (gen, os.path.join(gen, "knnd"), v1):
        open(os.path.join(package, "__init__.py"), "a").close()
    with open(os.path.join(v1, "knn_service_pb2.py")) as f:
        pb2_text = f.read()
    return version, pb2_text, grpc_text


def python_protobuf_version(protoc_version):
    """The Python protobuf release of a protoc from before protoc 26 (whose
    gencode carries no version line): protoc 3.21.12 is Python 4.21.12,
    protoc 22.x to 25.x are Python 4.22.x to 4.25.x."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", protoc_version)
    if not match:
        raise SystemExit(f"knnd-client: cannot read protoc's version from "
                         f"{protoc_version!r}")
    major, minor, patch = (int(g or 0) for g in match.groups())
    if major == 3 and minor >= 21:
        return f"4.{minor}.{patch}"
    if 22 <= major <= 25:
        return f"4.{major}.{minor}"
    raise SystemExit(
        f"knnd-client: {protoc_version} is not supported: use protoc 3.21 or "
        "newer (Debian 12's protobuf-compiler, or grpcio-tools)")


def runtime_requirements(protoc_version, pb2_text, grpc_text):
    """The protobuf and grpcio requirements of the generated stubs.

    protoc 26+ writes a call to ValidateProtobufRuntimeVersion, which
    refuses a runtime older than the gencode's "# Protobuf Python Version:
    X.Y.Z" or of another major version (one major newer only warns):
    required is X.Y.Z up to the next major. grpcio-tools 1.63+ writes
    GRPC_GENERATED_VERSION and refuses an older grpcio. Older generators
    check nothing (protoc 25 writes the version line, but no check): their
    gencode needs a protobuf at least as new as the protoc, and their
    ranges are the tested ones above."""
    stated = re.search(r"^# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)",
                       pb2_text, re.M)
    if stated and "ValidateProtobufRuntimeVersion" in pb2_text:
        protobuf = (f"protobuf>={'.'.join(stated.groups())},"
                    f"<{int(stated.group(1)) + 1}")
    else:
        lowest = (".".join(stated.groups()) if stated
                  else python_protobuf_version(protoc_version))
        protobuf = f"protobuf>={lowest},<{UNCHECKED_PROTOBUF_MAJOR_LIMIT}"
    grpc_version = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'",
                             grpc_text, re.M)
    grpcio = (f"grpcio>={grpc_version.group(1)},<2" if grpc_version
              else UNCHECKED_GRPC_REQUIREMENT)
    return [grpcio, protobuf, NUMPY_REQUIREMENT]


# Generated once per setup.py run, before setup(): the requirements are
# part of the metadata pip asks for before it builds the wheel.
_STUBS = tempfile.mkdtemp(prefix="knnd-client-stubs-")
atexit.register(shutil.rmtree, _STUBS, True)
INSTALL_REQUIRES = runtime_requirements(*generate_stubs(_STUBS))


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        if not self.dry_run:
            shutil.copytree(os.path.join(_STUBS, "knnd_client"),
                            os.path.join(self.build_lib, "knnd_client"),
                            dirs_exist_ok=True)


class SdistWithProto(sdist):
    """Puts proto/ into the sdist so that it builds away from the repo."""
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = os.path.join(base_dir, "proto", os.path.dirname(PROTO))
        os.makedirs(target, exist_ok=True)
        shutil.copy(os.path.join(proto_root(), PROTO), target)


def license_metadata():
    """Apache-2.0 as an SPDX expression where setuptools knows them (77+,
    PEP 639: the table form is deprecated there), else as License:."""
    major = int(setuptools.__version__.split(".")[0])
    if major >= 77:
        return {"license_expression": "Apache-2.0"}
    return {"license": "Apache-2.0"}


def version():
    """knnd_client.__version__, read without importing the package (its
    imports need the stubs this build generates)."""
    with open(os.path.join(HERE, "knnd_client", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


setup(version=version(),
      packages=["knnd_client"],
      package_data={"knnd_client": ["py.typed"]},
      zip_safe=False,
      install_requires=INSTALL_REQUIRES,
      cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto},
      **license_metadata())

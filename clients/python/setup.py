"""knnd-client: the Python client of knnd.

Install without downloading anything (the system's grpcio, protobuf and
numpy are used; on Debian: python3-grpcio python3-protobuf python3-numpy,
and protoc from protobuf-compiler, grpc_python_plugin from
protobuf-compiler-grpc):

    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation --no-deps clients/python

There is deliberately no pyproject.toml: with one, pip would build in an
isolated environment and download setuptools first.

The gRPC stubs are generated at build time from the repository's proto/
folder (../../proto), or from a proto/ folder next to this file (an sdist),
with protoc and grpc_python_plugin; they are never checked in.
"""
import os
import re
import shutil
import subprocess

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = "knnd/v1/knn_service.proto"
# The generated modules live inside knnd_client, not as a top-level `knnd`
# package, so installing the client cannot shadow anything else.
GENERATED_PACKAGE = "knnd_client._generated"


def proto_root():
    for root in (os.path.join(HERE, "proto"),
                 os.path.normpath(os.path.join(HERE, "..", "..", "proto"))):
        if os.path.isfile(os.path.join(root, PROTO)):
            return root
    raise SystemExit(
        f"knnd-client: cannot find {PROTO} in {HERE}/proto or ../../proto; "
        "build from a clone of the knnd repository")


def find_tool(name, env):
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise SystemExit(
            f"knnd-client: {name} not found (set {env}); on Debian install "
            "protobuf-compiler and protobuf-compiler-grpc")
    return path


def generate_stubs(out_dir):
    """Writes knn_service_pb2.py and knn_service_pb2_grpc.py under
    out_dir/knnd_client/_generated/knnd/v1/. The descriptor keeps the file
    name knnd/v1/knn_service.proto, so it is the same descriptor any other
    client generated from proto/ registers, and both can be imported in one
    process."""
    root = proto_root()
    gen = os.path.join(out_dir, *GENERATED_PACKAGE.split("."))
    os.makedirs(gen, exist_ok=True)
    subprocess.run(
        [find_tool("protoc", "PROTOC"), f"--proto_path={root}",
         f"--python_out={gen}", f"--grpc_out={gen}",
         "--plugin=protoc-gen-grpc="
         + find_tool("grpc_python_plugin", "GRPC_PYTHON_PLUGIN"),
         os.path.join(root, PROTO)],
        check=True)
    # The grpc module imports its messages by the proto's path ("from
    # knnd.v1 import ..."); point it at the package it now lives in.
    grpc_module = os.path.join(gen, "knnd", "v1", "knn_service_pb2_grpc.py")
    with open(grpc_module) as f:
        text = f.read()
    text, n = re.subn(r"^from knnd\.v1 import ",
                      f"from {GENERATED_PACKAGE}.knnd.v1 import ", text,
                      flags=re.M)
    if n != 1:
        raise SystemExit(f"knnd-client: unexpected import in {grpc_module}")
    with open(grpc_module, "w") as f:
        f.write(text)
    for package in (gen, os.path.join(gen, "knnd"),
                    os.path.join(gen, "knnd", "v1")):
        open(os.path.join(package, "__init__.py"), "a").close()


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        if not self.dry_run:
            generate_stubs(self.build_lib)


class SdistWithProto(sdist):
    """Puts proto/ into the sdist so that it builds away from the repo."""
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = os.path.join(base_dir, "proto", os.path.dirname(PROTO))
        os.makedirs(target, exist_ok=True)
        shutil.copy(os.path.join(proto_root(), PROTO), target)


with open(os.path.join(HERE, "README.md")) as f:
    long_description = f.read()

setup(
    name="knnd-client",
    version="0.1.0",
    description="Python client of knnd, the k-NN search daemon",
    long_description=long_description,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=find_packages(include=["knnd_client", "knnd_client.*"]),
    package_data={"knnd_client": ["py.typed", "*.pyi"]},
    # Not enforced by the install commands above (--no-deps): they are the
    # system packages. Versions are those of Debian 12.
    install_requires=["grpcio>=1.51", "protobuf>=3.21", "numpy>=1.21"],
    cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto},
    zip_safe=False,
)

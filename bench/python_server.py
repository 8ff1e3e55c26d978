#!/usr/bin/python3
"""The alternative a Python team would write instead of knnd: a grpcio server
(ThreadPoolExecutor) wrapping python3-faiss, serving knnd's own Search API
from the same index file, so that bench/load_gen drives both alike.

  python_server.py --index FILE --port PORT [--nprobe 16] [--workers 16]
                   [--source-dir .]

Stubs are generated at start with protoc + /usr/bin/grpc_python_plugin
(tests/python/knnd_harness.py, as tests/python do). The index is read onto the heap with faiss.read_index;
FAISS runs one OpenMP thread per call (the pool's threads give the
parallelism; FAISS releases the GIL while it searches). Prints "serving" on
stdout once the port is open.
"""
import argparse
import concurrent.futures
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "tests", "python"))
from knnd_harness import generate_stubs  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--source-dir",
                        default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_args()

    import faiss
    import grpc
    stubs = tempfile.TemporaryDirectory()
    generate_stubs(os.path.abspath(args.source_dir), stubs.name)
    from knnd.v1 import knn_service_pb2 as pb
    from knnd.v1 import knn_service_pb2_grpc as pb_grpc

    faiss.omp_set_num_threads(1)
    index = faiss.read_index(args.index)
    ivf = faiss.extract_index_ivf(index)
    ivf.nprobe = args.nprobe
    d = index.d

    class Service(pb_grpc.KnnServiceServicer):
        def Search(self, request, context):
            if request.vectors_f32le:
                x = np.frombuffer(request.vectors_f32le, dtype="<f4")
            else:
                x = np.asarray(request.vectors, dtype=np.float32)
            if x.size == 0 or x.size % d:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"vectors: {x.size} floats is not a multiple of dim {d}")
            x = x.reshape(-1, d)
            k = request.k or 10
            if request.HasField("nprobe") and request.nprobe != args.nprobe:
                params = faiss.SearchParametersIVF()
                params.nprobe = request.nprobe
                distances, ids = index.search(x, k, params=params)
            else:
                distances, ids = index.search(x, k)
            return pb.SearchResponse(num_queries=x.shape[0], k=k,
                                     ids=ids.ravel(), distances=distances.ravel(),
                                     nprobe=request.nprobe or args.nprobe)

    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=args.workers),
        options=[("grpc.max_receive_message_length", 64 << 20)])
    pb_grpc.add_KnnServiceServicer_to_server(Service(), server)
    server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print("serving", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()

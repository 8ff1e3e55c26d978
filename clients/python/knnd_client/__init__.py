"""knnd-client: k-NN search against knnd.

    from knnd_client import KnnClient
    client = KnnClient("dns:///knnd-headless.search.svc.cluster.local:50051")
    ids, distances = client.search(queries, k=10)   # float32 (nq, dim)
"""
from knnd_client.client import (PUSHBACK_METADATA_KEY, KnnClient, RetryPolicy,
                                pushback_ms)

__all__ = ["KnnClient", "RetryPolicy", "PUSHBACK_METADATA_KEY", "pushback_ms"]
__version__ = "0.1.0"

"""knnd-client: k-NN search against knnd.

    from knnd_client import KnnClient
    client = KnnClient("dns:///knnd-headless.search.svc.cluster.local:50051")
    ids, distances = client.search(queries, k=10)   # float32 (nq, dim)

    from knnd_client import AsyncKnnClient          # asyncio, same contract
    ids, distances = await async_client.search(queries, k=10)

    from knnd_client import ShardedKnnClient        # an index split in shards
    sharded = ShardedKnnClient(["dns:///knnd-shard-0:50051",
                                "dns:///knnd-shard-1:50051"])
    ids, distances = sharded.search(queries, k=10)  # the unsharded answer
    # knnd_client.aio.AsyncShardedKnnClient: the same, awaited

The LangChain vector store is knnd_client.langchain.KnndVectorStore
(`pip install './clients/python[langchain]'`); it is not imported here, so this
package does not need langchain-core.
"""
from knnd_client._common import PUSHBACK_METADATA_KEY, RetryPolicy, pushback_ms
from knnd_client.aio import AsyncKnnClient, AsyncShardedKnnClient
from knnd_client.client import KnnClient, ShardedKnnClient
from knnd_client.errors import (Aborted, AlreadyExists, Cancelled, DataLoss,
                                DeadlineExceeded, FailedPrecondition, Internal,
                                InvalidArgument, KnndError, NotFound,
                                OutOfRange, PermissionDenied,
                                ResourceExhausted, Unauthenticated,
                                Unavailable, Unimplemented, Unknown)
from knnd_client.sharding import (SERVING_VERSION_METADATA_KEY,
                                  ShardedSearchError, ShardedSearchResult)

__all__ = ["KnnClient", "AsyncKnnClient", "ShardedKnnClient",
           "AsyncShardedKnnClient", "ShardedSearchResult",
           "ShardedSearchError", "RetryPolicy", "PUSHBACK_METADATA_KEY",
           "SERVING_VERSION_METADATA_KEY", "pushback_ms", "KnndError",
           "Aborted", "AlreadyExists", "Cancelled", "DataLoss",
           "DeadlineExceeded", "FailedPrecondition", "Internal",
           "InvalidArgument", "NotFound", "OutOfRange", "PermissionDenied",
           "ResourceExhausted", "Unauthenticated", "Unavailable",
           "Unimplemented", "Unknown"]
__version__ = "0.3.0"

"""knnd-client: k-NN search against knnd.

    from knnd_client import KnnClient
    client = KnnClient("dns:///knnd-headless.search.svc.cluster.local:50051")
    result = client.search(queries, k=10)       # float32 (nq, dim)
    result.ids, result.distances                # (nq, k) int64, float32
    for hit in result.hits(0):                  # query 0: Hit(id, distance,
        ...                                     #   payload)

    from knnd_client import AsyncKnnClient      # asyncio, same search()
    result = await async_client.search(queries, k=10)

    from knnd_client import ShardedKnnClient    # an index split in shards
    sharded = ShardedKnnClient(["dns:///knnd-shard-0:50051",
                                "dns:///knnd-shard-1:50051"])
    result = sharded.search(queries, k=10)      # the unsharded answer
    # AsyncShardedKnnClient: the same, awaited
    got = client.get([7, 42], payloads=True)    # records by id: Chroma's
    got.records, got.missing                    #   get, Qdrant's retrieve

The four clients share one search(), get() and info() (knnd_client._base); the
types they return are defined in knnd_client.types, the errors they raise
in knnd_client.errors; this module's __all__ is the public surface.

The LangChain vector store is knnd_client.langchain.KnndVectorStore
(`pip install './clients/python[langchain]'`); it is not imported here, so
this package does not need langchain-core.
"""
from knnd_client._common import PUSHBACK_METADATA_KEY, pushback_ms
from knnd_client.aio import AsyncKnnClient, AsyncShardedKnnClient
from knnd_client.client import KnnClient, ShardedKnnClient
from knnd_client.errors import (Aborted, AlreadyExists, Cancelled, DataLoss,
                                DeadlineExceeded, FailedPrecondition, Internal,
                                InvalidArgument, KnndError, NotFound,
                                OutOfRange, PermissionDenied,
                                ResourceExhausted, ShardedSearchError,
                                Unauthenticated, Unavailable, Unimplemented,
                                Unknown)
from knnd_client.sharding import SERVING_VERSION_METADATA_KEY
from knnd_client.types import (FilterSpec, FusionName, GetResult, Hit,
                               Payload, PayloadFields, Record, RetryPolicy,
                               SearchResult, ShardedSearchResult, TextQueries)

__all__ = ["KnnClient", "AsyncKnnClient", "ShardedKnnClient",
           "AsyncShardedKnnClient", "SearchResult", "ShardedSearchResult",
           "Hit", "GetResult", "Record", "Payload", "PayloadFields", "FilterSpec", "TextQueries",
           "FusionName", "RetryPolicy",
           "PUSHBACK_METADATA_KEY", "SERVING_VERSION_METADATA_KEY",
           "pushback_ms", "KnndError", "ShardedSearchError", "Aborted",
           "AlreadyExists", "Cancelled", "DataLoss", "DeadlineExceeded",
           "FailedPrecondition", "Internal", "InvalidArgument", "NotFound",
           "OutOfRange", "PermissionDenied", "ResourceExhausted",
           "Unauthenticated", "Unavailable", "Unimplemented", "Unknown"]
__version__ = "0.6.0"

"""knnd as a LangChain vector store and retriever (read-only).

    pip install './clients/python[langchain]'   # from a knnd checkout

    from knnd_client import KnnClient
    from knnd_client.langchain import KnndVectorStore

    store = KnndVectorStore(KnnClient("dns:///knnd-headless:50051"),
                            embedding=my_embeddings)
    docs = store.similarity_search("how do I rotate tokens?", k=4)
    retriever = store.as_retriever(search_kwargs={"k": 4, "nprobe": 16})

Hybrid retrieval (an index built with `knnctl build --text FIELD`):
hybrid=True sends the query's embedding and its text in one search, fused
by knnd (RRF unless fusion="weighted"), with filter= applied to both:

    docs = store.similarity_search("error E1234 on rotate", k=4,
                                   hybrid=True, filter={"source": "ops"})
    retriever = store.as_retriever(search_kwargs={
        "k": 4, "hybrid": True, "filter": {"source": "ops"}})

An index split into shards is searched the same way through a
ShardedKnnClient (or an AsyncShardedKnnClient) over the shards' targets:
the store sees the merged answer of the whole index.

The documents come from knnd itself when the index was built with payloads
(`knnctl build --payloads chunks.jsonl`, one JSON object per vector, e.g.
{"text": "...", "source": "a.pdf", "page": 3}): page_content is the
payload's text field ("text" unless text_field says otherwise), metadata
its other fields, and Document.id the vector's id as a decimal string;
get_by_ids reads them by id (knnd's Get, the client's get()). An
index without payloads needs a docstore the application owns (a dict, a
SQLite table behind a Mapping, a LangChain BaseStore), keyed by the ids the
index was built with (`knnctl build --ids`, or row numbers); given one, the
store reads documents from it instead. knnd serves one immutable index, so
this store cannot add or delete: new vectors go through `knnctl build` and
`knnctl publish`, and knnd loads the new version by itself.

This module needs langchain-core; `import knnd_client` does not import it.
"""
from __future__ import annotations

import json
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional,
                    Sequence, Tuple, Union)

import numpy as np

try:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.stores import BaseStore
    from langchain_core.vectorstores import VectorStore
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError(
        "knnd_client.langchain needs langchain-core: install knnd-client "
        "with its langchain extra, from a knnd checkout: "
        "pip install './clients/python[langchain]' (or a wheel built from "
        "it: pip install 'knnd_client-VERSION-py3-none-any.whl[langchain]'), "
        "or pip install 'langchain-core>=0.3,<2'") from error

from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
from knnd_client.aio import AsyncKnnClient, AsyncShardedKnnClient
from knnd_client.client import KnnClient, ShardedKnnClient
from knnd_client.types import GetResult, Payload, SearchResult

__all__ = ["KnndVectorStore"]

_READ_ONLY = (
    "KnndVectorStore is read-only: knnd serves one immutable index. New "
    "vectors go through `knnctl build` (a new index file, with --ids for "
    "your docstore's ids) and `knnctl publish --index FILE --dir DIR` (a new "
    "version that knnd loads and swaps in); add their documents to your "
    "docstore before publishing")

# The search() arguments a caller may pass through similarity_search's
# **kwargs (and a retriever's search_kwargs).
# filter: knnd's attribute filter dict (KnnClient.search), evaluated by
# the server over the attributes the index was built with.
# fusion ... text_window: hybrid search's (with hybrid=True).
_SEARCH_KWARGS = ("nprobe", "refine_factor", "allowed_ids", "filter",
                  "timeout_s", "fusion", "rrf_k", "vector_weight",
                  "text_weight", "vector_window", "text_window")
# The store's own: hybrid=True searches the query's text too.
_HYBRID_KWARG = "hybrid"

Docstore = Union[Mapping[int, Document], "BaseStore[str, Document]"]

# The clients whose methods block (the store's sync methods use them) and
# those to await (its a* methods).
_SYNC_CLIENTS = (KnnClient, ShardedKnnClient)
_ASYNC_CLIENTS = (AsyncKnnClient, AsyncShardedKnnClient)
SyncClient = Union[KnnClient, ShardedKnnClient]
AsyncClient = Union[AsyncKnnClient, AsyncShardedKnnClient]


class KnndVectorStore(VectorStore):
    """A LangChain VectorStore over knnd.

    client: a KnnClient or ShardedKnnClient (the sync methods; LangChain
      runs the a* methods in a thread) or an AsyncKnnClient or
      AsyncShardedKnnClient (the a* methods, natively; the sync methods
      then raise TypeError, as they would block the loop).
    embedding: embeds queries; it must be the model (and normalisation)
      the index was built from, or the neighbours mean nothing.
    docstore: None (the default): documents are built from the payloads
      knnd returns with each search (an index built with `knnctl build
      --payloads`). Else the documents by vector id: a
      Mapping[int, Document] (a dict, or a Mapping over a database table),
      or a LangChain BaseStore[str, Document] whose keys are the ids as
      decimal strings (InMemoryStore, ...), read with one mget per search.
    text_field: the payload field that becomes page_content (default
      "text"); the payload's other fields become metadata.
    nprobe, refine_factor, timeout_s: defaults of every search; a search's
      own keyword arguments override them.
    relevance_score_fn: maps knnd's distance to a relevance in [0, 1] for
      similarity_search_with_relevance_scores and the retriever's
      "similarity_score_threshold"; default: by the served index's metric,
      assuming unit-length embeddings (see _relevance).
    """

    def __init__(self, client: Union[SyncClient, AsyncClient],
                 embedding: Embeddings, docstore: Optional[Docstore] = None,
                 *, text_field: str = "text",
                 nprobe: Optional[int] = None,
                 refine_factor: Optional[int] = None,
                 timeout_s: Optional[float] = None,
                 relevance_score_fn: Optional[Callable[[float], float]] = None
                 ) -> None:
        if not isinstance(client, _SYNC_CLIENTS + _ASYNC_CLIENTS):
            raise TypeError(
                "client must be a knnd_client KnnClient, ShardedKnnClient, "
                "AsyncKnnClient or AsyncShardedKnnClient, got "
                f"{type(client).__name__}")
        if not isinstance(embedding, Embeddings):
            raise TypeError("embedding must be a langchain_core Embeddings, "
                            f"got {type(embedding).__name__}")
        if docstore is not None and not isinstance(docstore,
                                                   (Mapping, BaseStore)):
            raise TypeError(
                "docstore must be None (documents from knnd's payloads), a "
                "Mapping[int, Document] or a LangChain BaseStore[str, "
                f"Document], got {type(docstore).__name__}")
        if not isinstance(text_field, str) or not text_field:
            raise TypeError("text_field must be a non-empty str, got "
                            f"{text_field!r}")
        self._text_field = text_field
        self._client = client
        self._embedding = embedding
        self._docstore = docstore
        self._defaults = {"nprobe": nprobe, "refine_factor": refine_factor,
                          "timeout_s": timeout_s}
        self._relevance_score_fn = relevance_score_fn
        self._metric: Optional[int] = None

    @property
    def embeddings(self) -> Embeddings:
        return self._embedding

    # -- search, sync ------------------------------------------------------

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any
                          ) -> List[Document]:
        """The k documents closest to `query`. kwargs: nprobe,
        refine_factor, allowed_ids (only these vector ids), filter (knnd's
        attribute filter dict), timeout_s; hybrid=True: the query's
        embedding and its text in one hybrid search (an index built with
        `knnctl build --text`), with fusion, rrf_k, vector_weight,
        text_weight, vector_window, text_window as KnnClient.search takes
        them."""
        return [doc for doc, _ in self.similarity_search_with_score(
            query, k, **kwargs)]

    def similarity_search_by_vector(self, embedding: List[float], k: int = 4,
                                    **kwargs: Any) -> List[Document]:
        return [doc for doc, _ in self._search(embedding, k, kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4,
                                     **kwargs: Any
                                     ) -> List[Tuple[Document, float]]:
        """(document, distance) pairs, closest first. The distance is
        knnd's: squared L2 (smaller is closer) or inner product / cosine
        (larger is closer), as the index was built; with hybrid=True the
        fused score (larger first)."""
        self._sync_client("similarity_search_with_score")
        return self._search(self._embedding.embed_query(query), k, kwargs,
                            query)

    def _similarity_search_with_relevance_scores(
            self, query: str, k: int = 4, **kwargs: Any
    ) -> List[Tuple[Document, float]]:
        _no_hybrid_relevance(kwargs)
        pairs = self.similarity_search_with_score(query, k, **kwargs)
        relevance = self._select_relevance_score_fn()
        return [(doc, relevance(d)) for doc, d in pairs]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        if self._relevance_score_fn is None and self._metric is None:
            self._metric = _metric(
                self._sync_client("similarity_search").info())
        return self._relevance

    # -- search, asyncio ---------------------------------------------------

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any
                                 ) -> List[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score(
            query, k, **kwargs)]

    async def asimilarity_search_by_vector(
            self, embedding: List[float], k: int = 4, **kwargs: Any
    ) -> List[Document]:
        if isinstance(self._client, _SYNC_CLIENTS):
            return await super().asimilarity_search_by_vector(
                embedding, k, **kwargs)
        return [doc for doc, _ in await self._asearch(embedding, k, kwargs)]

    async def asimilarity_search_with_score(
            self, query: str, k: int = 4, **kwargs: Any
    ) -> List[Tuple[Document, float]]:
        if isinstance(self._client, _SYNC_CLIENTS):
            return await super().asimilarity_search_with_score(
                query, k, **kwargs)
        return await self._asearch(
            await self._embedding.aembed_query(query), k, kwargs, query)

    async def _asimilarity_search_with_relevance_scores(
            self, query: str, k: int = 4, **kwargs: Any
    ) -> List[Tuple[Document, float]]:
        _no_hybrid_relevance(kwargs)
        if isinstance(self._client, _SYNC_CLIENTS):
            return await super()._asimilarity_search_with_relevance_scores(
                query, k, **kwargs)
        pairs = await self.asimilarity_search_with_score(query, k, **kwargs)
        if self._relevance_score_fn is None and self._metric is None:
            self._metric = _metric(await self._async_client().info())
        return [(doc, self._relevance(d)) for doc, d in pairs]

    # -- documents by id ---------------------------------------------------

    def get_by_ids(self, ids: Sequence[str], /) -> List[Document]:
        """The documents of these vector ids (decimal strings), in their
        order; ids the index (or the docstore) does not hold, and strings
        that are no id, are left out, as LangChain specifies. Without a
        docstore, from knnd's payloads by id (the client's get(): one call,
        at most the server's max_get_ids ids)."""
        if self._docstore is not None:
            found = self._lookup(_vector_ids(ids), missing_ok=True)
            return [doc for doc in found if doc is not None]
        wanted = _vector_ids(ids)
        if not wanted:
            return []
        client = self._sync_client("get_by_ids")
        return self._records(client.get(
            wanted, payloads=True, timeout_s=self._defaults["timeout_s"]))

    async def aget_by_ids(self, ids: Sequence[str], /) -> List[Document]:
        wanted = _vector_ids(ids)
        if (self._docstore is not None or not wanted
                or isinstance(self._client, _SYNC_CLIENTS)):
            return self.get_by_ids(ids)
        return self._records(await self._async_client().get(
            wanted, payloads=True, timeout_s=self._defaults["timeout_s"]))

    def _records(self, result: GetResult) -> List[Document]:
        return [self._from_payload(r.id, r.payload) for r in result.records]

    # -- read-only ---------------------------------------------------------

    def add_texts(self, texts: Iterable[str],
                  metadatas: Optional[List[Dict[str, Any]]] = None, *,
                  ids: Optional[List[str]] = None, **kwargs: Any) -> List[str]:
        raise NotImplementedError(_READ_ONLY)

    async def aadd_texts(self, texts: Iterable[str],
                         metadatas: Optional[List[Dict[str, Any]]] = None, *,
                         ids: Optional[List[str]] = None, **kwargs: Any
                         ) -> List[str]:
        raise NotImplementedError(_READ_ONLY)

    def add_documents(self, documents: List[Document], **kwargs: Any
                      ) -> List[str]:
        raise NotImplementedError(_READ_ONLY)

    async def aadd_documents(self, documents: List[Document], **kwargs: Any
                             ) -> List[str]:
        raise NotImplementedError(_READ_ONLY)

    def delete(self, ids: Optional[List[str]] = None, **kwargs: Any
               ) -> Optional[bool]:
        raise NotImplementedError(_READ_ONLY)

    async def adelete(self, ids: Optional[List[str]] = None, **kwargs: Any
                      ) -> Optional[bool]:
        raise NotImplementedError(_READ_ONLY)

    @classmethod
    def from_texts(cls, texts: List[str], embedding: Embeddings,
                   metadatas: Optional[List[Dict[str, Any]]] = None, *,
                   ids: Optional[List[str]] = None, **kwargs: Any
                   ) -> "KnndVectorStore":
        raise NotImplementedError(_READ_ONLY)

    @classmethod
    async def afrom_texts(cls, texts: List[str], embedding: Embeddings,
                          metadatas: Optional[List[Dict[str, Any]]] = None, *,
                          ids: Optional[List[str]] = None, **kwargs: Any
                          ) -> "KnndVectorStore":
        raise NotImplementedError(_READ_ONLY)

    # -- internals ---------------------------------------------------------

    def _sync_client(self, method: str) -> SyncClient:
        if not isinstance(self._client, _SYNC_CLIENTS):
            raise TypeError(
                f"KnndVectorStore.{method} needs a KnnClient or "
                f"ShardedKnnClient; this store has an "
                f"{type(self._client).__name__}: await the a* methods "
                "(asimilarity_search, retriever.ainvoke) instead")
        return self._client

    def _async_client(self) -> AsyncClient:
        assert isinstance(self._client, _ASYNC_CLIENTS)  # callers checked
        return self._client

    def _search_arguments(self, k: int, kwargs: Dict[str, Any],
                          query: Optional[str]) -> Dict[str, Any]:
        """The client's search() arguments of one store search: the
        store's defaults, the caller's kwargs, and with hybrid=True the
        text of `query` (None: a search by vector, which has none)."""
        unknown = sorted(set(kwargs) - set(_SEARCH_KWARGS) - {_HYBRID_KWARG})
        if unknown:
            raise TypeError(
                f"KnndVectorStore searches take {', '.join(_SEARCH_KWARGS)} "
                f"and {_HYBRID_KWARG}; got {', '.join(unknown)}")
        arguments = dict(self._defaults, **kwargs)
        hybrid = arguments.pop(_HYBRID_KWARG, False)
        if not isinstance(hybrid, bool):
            raise TypeError(f"hybrid must be True or False, got {hybrid!r}")
        if hybrid:
            if query is None:
                raise ValueError(
                    "hybrid=True searches the query's text beside its "
                    "embedding: a search by vector has no text; use "
                    "similarity_search (or the client's search(text=...))")
            arguments["text"] = query
        arguments["k"] = k
        if self._docstore is None:
            arguments["payloads"] = True
        return arguments

    def _search(self, embedding: Sequence[float], k: int,
                kwargs: Dict[str, Any], query: Optional[str] = None
                ) -> List[Tuple[Document, float]]:
        client = self._sync_client("similarity_search")
        arguments = self._search_arguments(k, kwargs, query)
        return self._documents(
            client.search(_query_row(embedding), **arguments))

    async def _asearch(self, embedding: Sequence[float], k: int,
                       kwargs: Dict[str, Any], query: Optional[str] = None
                       ) -> List[Tuple[Document, float]]:
        arguments = self._search_arguments(k, kwargs, query)
        return self._documents(await self._async_client().search(
            _query_row(embedding), **arguments))

    def _documents(self, result: SearchResult
                   ) -> List[Tuple[Document, float]]:
        """(document, distance) of the one query of a client's search()
        result (its padding -1 left out by hits())."""
        hits = result.hits(0)
        if self._docstore is None:
            docs = [self._from_payload(hit.id, hit.payload) for hit in hits]
        else:
            found = self._lookup([hit.id for hit in hits], missing_ok=False)
            docs = [doc for doc in found if doc is not None]
        return [(doc, hit.distance) for hit, doc in zip(hits, docs)]

    def _from_payload(self, vector_id: int, payload: Optional[Payload]
                      ) -> Document:
        """The Document of a payload: its text field as page_content (""
        when absent, a non-string one as JSON text), the rest as
        metadata."""
        metadata = dict(payload or {})
        text = metadata.pop(self._text_field, "")
        if not isinstance(text, str):
            text = json.dumps(text)
        return Document(page_content=text, metadata=metadata,
                        id=str(vector_id))

    def _lookup(self, ids: List[int], missing_ok: bool
                ) -> List[Optional[Document]]:
        docstore = self._docstore
        assert docstore is not None  # callers checked
        if isinstance(docstore, BaseStore):
            docs = list(docstore.mget([str(i) for i in ids]))
        else:
            docs = [docstore.get(i) for i in ids]
        if not missing_ok:
            for i, doc in zip(ids, docs):
                if doc is None:
                    raise LookupError(
                        f"knnd returned vector id {i}, which the docstore "
                        "does not hold: the served index and the docstore "
                        "are out of step (add documents to the docstore "
                        "before publishing an index that refers to them)")
        return docs

    def _relevance(self, distance: float) -> float:
        """knnd's distance as a relevance in [0, 1], 1 the closest.

        For unit-length embeddings (what sentence-embedding models give)
        every metric here is a function of the cosine c: cosine and inner
        product are c, squared L2 is 2 - 2c. Each maps to (1 + c) / 2, so
        one score_threshold means the same whatever metric the index was
        built with. Other embeddings need their own relevance_score_fn."""
        if self._relevance_score_fn is not None:
            return self._relevance_score_fn(distance)
        if self._metric == pb.METRIC_L2:
            relevance = 1.0 - distance / 4.0
        else:
            relevance = (1.0 + distance) / 2.0
        return min(max(relevance, 0.0), 1.0)


def _metric(info: Union[pb.GetIndexInfoResponse,
                        List[pb.GetIndexInfoResponse]]) -> int:
    """The served metric, from a client's info(): one response, or one per
    shard (a sharded client's, checked to be one set: one metric)."""
    return info[0].metric if isinstance(info, list) else info.metric


def _no_hybrid_relevance(kwargs: Mapping[str, Any]) -> None:
    """Relevance scores map vector distances; a hybrid search's scores are
    fused ones, with no such map."""
    if kwargs.get(_HYBRID_KWARG):
        raise ValueError(
            "relevance scores (similarity_search_with_relevance_scores, the "
            "similarity_score_threshold retriever) map vector distances; a "
            "hybrid search's scores are fused ranks or weights: use "
            "similarity_search_with_score, or search without hybrid")


def _vector_ids(ids: Sequence[str]) -> List[int]:
    """The ids of get_by_ids as vector ids: decimal strings of ids >= 0;
    others name no vector (left out, as an id not held is)."""
    wanted: List[int] = []
    for i in ids:
        text = str(i)
        if text.isdigit() and int(text) < 2**63:
            wanted.append(int(text))
    return wanted


def _query_row(embedding: Sequence[float]) -> np.ndarray:
    row = np.asarray(embedding, dtype=np.float32)
    if row.ndim != 1:
        raise ValueError(
            f"an embedding must be one vector, got shape {row.shape}")
    return row.reshape(1, -1)

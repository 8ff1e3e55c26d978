#!/usr/bin/python3
"""knnd-client's declared surface, installed in each route's venv
(client_testing.py), without a server:
  - the four clients share one search() and one info() (ClientBase's), so
    their signatures cannot drift; the sharded ones return
    ShardedSearchResult, a SearchResult;
  - knnd_client.__all__ is the public surface: every name exists, the
    result types are defined in knnd_client.types alone;
  - mypy --strict passes over the installed package (generated stubs
    aside), and a typed caller sees SearchResult, Hit and their fields
    with their types, an awaited search as a SearchResult, and a wrong
    keyword, a reassigned field or the old tuple unpacking as errors
    (where mypy is installed: the pypi route, TYPE_CHECK_REQUIREMENTS).

  client_types_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl \\
      --source-dir . --venvs BUILD/tests/python_client_venvs
"""
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import client_testing

ARGS = None

CLIENTS = ("KnnClient", "AsyncKnnClient", "ShardedKnnClient",
           "AsyncShardedKnnClient")

# A caller written against the typed surface: mypy --strict must accept it.
TYPED_CALLER = """\
import asyncio
from typing import Any, Dict, List, Optional, assert_type

import numpy as np
import numpy.typing as npt

from knnd_client import (AsyncKnnClient, AsyncShardedKnnClient, GetResult,
                         Hit, KnnClient, Record, SearchResult,
                         ShardedKnnClient, ShardedSearchResult)


def blocking(client: KnnClient, sharded: ShardedKnnClient,
             q: npt.NDArray[np.float32]) -> None:
    result = client.search(q, 10, 8, filter={"genre": "news"},
                           payloads=["text"], timeout_s=0.5)
    assert_type(result, SearchResult)
    assert_type(result.ids, npt.NDArray[np.int64])
    assert_type(result.distances, npt.NDArray[np.float32])
    assert_type(result.payloads, Optional[List[List[Optional[Dict[str, Any]]]]])
    assert_type(result.index_version, int)
    hit = result.hits(0)[0]
    assert_type(hit, Hit)
    assert_type(hit.id, int)
    assert_type(hit.distance, float)
    assert_type(hit.payload, Optional[Dict[str, Any]])
    merged = sharded.search(q, 10, allow_partial=True)
    assert_type(merged, ShardedSearchResult)
    assert_type(merged.missing_targets, tuple[str, ...])
    assert_type(client.info().dim, int)
    text_alone = client.search(text="printer setup", k=5)
    assert_type(text_alone.text_ranks, Optional[npt.NDArray[np.int32]])
    assert_type(text_alone.text_scores, Optional[npt.NDArray[np.float32]])
    assert_type(text_alone.fusion, Optional[str])
    fused = sharded.search(q, 10, text=["a", "b"], fusion="weighted",
                           rrf_k=60, vector_weight=0.3, text_weight=0.7,
                           vector_window=20, text_window=20)
    assert_type(fused.vector_ranks, Optional[npt.NDArray[np.int32]])
    best = fused.hits(0)[0]
    assert_type(best.vector_rank, Optional[int])
    assert_type(best.text_score, Optional[float])
    got = client.get([7, 42], payloads=True, attributes=True, vectors=True)
    assert_type(got, GetResult)
    assert_type(got.records[0], Record)
    assert_type(got.records[0].vector, Optional[npt.NDArray[np.float32]])
    assert_type(got.missing, tuple[int, ...])
    assert_type(sharded.get(np.array([1, 2])).by_id(), Dict[int, Record])


async def awaited(client: AsyncKnnClient, sharded: AsyncShardedKnnClient,
                  q: npt.NDArray[np.float32]) -> None:
    assert_type(await client.search(q, 10), SearchResult)
    assert_type(await sharded.search(q, 10), ShardedSearchResult)
    task = asyncio.create_task(client.search(q, 10))
    assert_type(await task, SearchResult)
    assert_type((await client.info()).ntotal, int)
    assert_type(await client.get([1]), GetResult)
    assert_type(await sharded.get([1], payloads=["text"]), GetResult)
"""

# Mistakes mypy --strict must report, one per line named.
WRONG_CALLER = """\
import numpy as np
import numpy.typing as npt

from knnd_client import KnnClient


def wrong(client: KnnClient, q: npt.NDArray[np.float32]) -> None:
    client.search(q, 10, nprob=8)
    ids, distances = client.search(q, 10)
    result = client.search(q, 10)
    result.ids = result.ids[:1]
    client.search(q, "10")
    client.search(text="x", fusion="dbsf")
    client.search(text=b"x")
"""
WRONG_LINES = (8, 9, 11, 12, 13, 14)


class SurfaceTest(unittest.TestCase):
    def test_the_four_clients_share_one_search_one_get_and_one_info(self):
        import knnd_client
        from knnd_client._base import ClientBase
        for name in CLIENTS:
            client = getattr(knnd_client, name)
            with self.subTest(client=name):
                self.assertTrue(issubclass(client, ClientBase))
                self.assertIs(client.search, ClientBase.search)
                self.assertIs(client.info, ClientBase.info)
                self.assertIs(client.get, ClientBase.get)
        parameters = inspect.signature(ClientBase.search).parameters
        self.assertEqual(
            [(p.name, p.kind.name) for p in parameters.values()],
            [("self", "POSITIONAL_OR_KEYWORD"),
             ("queries", "POSITIONAL_OR_KEYWORD"),
             ("k", "POSITIONAL_OR_KEYWORD"),
             ("nprobe", "POSITIONAL_OR_KEYWORD"),
             ("allowed_ids", "KEYWORD_ONLY"), ("filter", "KEYWORD_ONLY"),
             ("refine_factor", "KEYWORD_ONLY"), ("payloads", "KEYWORD_ONLY"),
             ("allow_partial", "KEYWORD_ONLY"), ("text", "KEYWORD_ONLY"),
             ("fusion", "KEYWORD_ONLY"), ("rrf_k", "KEYWORD_ONLY"),
             ("vector_weight", "KEYWORD_ONLY"), ("text_weight", "KEYWORD_ONLY"),
             ("vector_window", "KEYWORD_ONLY"), ("text_window", "KEYWORD_ONLY"),
             ("timeout_s", "KEYWORD_ONLY")])
        # Text alone needs no queries; k has a default.
        self.assertIsNone(parameters["queries"].default)
        self.assertEqual(parameters["k"].default, 10)

    def test_all_is_the_public_surface(self):
        import knnd_client
        from knnd_client import types
        self.assertEqual(len(knnd_client.__all__), len(set(knnd_client.__all__)))
        for name in knnd_client.__all__:
            self.assertTrue(hasattr(knnd_client, name), name)
        for name in types.__all__:
            self.assertIn(name, knnd_client.__all__)
            value = getattr(types, name)
            if inspect.isclass(value):
                self.assertEqual(value.__module__, "knnd_client.types", name)
        for name in ("SearchResult", "ShardedSearchResult", "Hit",
                     "RetryPolicy", "GetResult", "Record"):
            self.assertIs(getattr(knnd_client, name), getattr(types, name))
        self.assertTrue(issubclass(types.ShardedSearchResult,
                                   types.SearchResult))


class MypyTest(unittest.TestCase):
    def mypy(self, tmp, *files):
        """mypy --strict with the package's configuration, run over a copy
        of the installed package (mypy reports nothing it finds in
        site-packages) and `files`, from `tmp`."""
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--config-file",
             os.path.join(os.environ[client_testing.SOURCE_ENV], "clients",
                          "python", "pyproject.toml"),
             "--cache-dir", os.path.join(tmp, ".mypy_cache"), *files],
            cwd=tmp, capture_output=True, text=True)

    def test_the_package_and_its_callers_pass_mypy_strict(self):
        if importlib.util.find_spec("mypy") is None:
            self.skipTest("mypy is installed in the pypi route only")
        import knnd_client
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(os.path.dirname(knnd_client.__file__),
                            os.path.join(tmp, "knnd_client"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            for name, text in (("typed_caller.py", TYPED_CALLER),
                               ("wrong_caller.py", WRONG_CALLER)):
                with open(os.path.join(tmp, name), "w") as f:
                    f.write(textwrap.dedent(text))
            checked = self.mypy(tmp, "knnd_client", "typed_caller.py")
            print(f"\n  {checked.stdout.strip()}", flush=True)
            self.assertEqual(checked.returncode, 0,
                             checked.stdout + checked.stderr)
            wrong = self.mypy(tmp, "wrong_caller.py")
            lines = {int(line.split(":")[1]) for line in
                     wrong.stdout.splitlines()
                     if line.startswith("wrong_caller.py:") and
                     ": error:" in line}
            self.assertEqual(lines, set(WRONG_LINES), wrong.stdout)


if __name__ == "__main__":
    client_testing.main(__doc__)

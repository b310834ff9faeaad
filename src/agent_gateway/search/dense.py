"""Dense retrieval, optional: tool texts and queries embedded by an OpenAI-compatible
``/embeddings`` endpoint (OpenAI, vLLM, Ollama, LM Studio, a local model server), compared by
cosine similarity and fused with the lexical ranking.

Needs numpy (``pip install 'agent-gateway[embeddings]'``). Vectors are kept per upstream, so one
upstream's change re-embeds only its tools.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import httpx2

from agent_gateway.config import EmbeddingsConfig
from agent_gateway.errors import ConfigError, GatewayError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

logger = logging.getLogger(__name__)

_QUERIES_KEPT = 512


class EmbeddingsFailed(GatewayError):
    """The embeddings endpoint did not answer with vectors (search falls back to lexical)."""


def numpy_module() -> Any:
    """numpy, or a ``ConfigError`` saying which extra brings it."""
    try:
        import numpy
    except ImportError:
        raise ConfigError("search.embeddings needs numpy: pip install 'agent-gateway[embeddings]'") from None
    return numpy


class Embedder:
    """Client of one OpenAI-compatible ``/embeddings`` endpoint."""

    def __init__(self, config: EmbeddingsConfig) -> None:
        self._config = config
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._http = httpx2.AsyncClient(
            base_url=config.base_url.rstrip("/"), headers=headers, timeout=config.timeout
        )
        self._queries: OrderedDict[str, list[float]] = OrderedDict()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order, in batches of ``embeddings.batch``.

        Raises:
            EmbeddingsFailed: the endpoint failed, or answered something else than vectors.
        """
        prefix, batch = self._config.document_prefix, self._config.batch
        vectors: list[list[float]] = []
        for start in range(0, len(texts), batch):
            vectors += await self._batch([prefix + text for text in texts[start : start + batch]])
        return vectors

    async def query(self, text: str) -> list[float]:
        """A query's vector (the latest ones are kept: a client repeats its searches)."""
        if (known := self._queries.get(text)) is not None:
            self._queries.move_to_end(text)
            return known
        (vector,) = await self._batch([self._config.query_prefix + text])
        self._queries[text] = vector
        if len(self._queries) > _QUERIES_KEPT:
            self._queries.popitem(last=False)
        return vector

    async def _batch(self, texts: list[str]) -> list[list[float]]:
        try:
            response = await self._http.post(
                "/embeddings", json={"model": self._config.model, "input": texts}
            )
        except httpx2.HTTPError as exc:  # never the URL or key: the message names the kind only
            raise EmbeddingsFailed(f"embeddings endpoint unreachable: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise EmbeddingsFailed(f"embeddings endpoint answered HTTP {response.status_code}")
        return _vectors(response, len(texts))


def _vectors(response: httpx2.Response, count: int) -> list[list[float]]:
    try:
        data = sorted(response.json()["data"], key=lambda item: item["index"])
        vectors = [[float(x) for x in item["embedding"]] for item in data]
    except (ValueError, KeyError, TypeError) as exc:
        raise EmbeddingsFailed(f"embeddings endpoint answered no vectors ({type(exc).__name__})") from None
    if not all(math.isfinite(x) for v in vectors for x in v):  # one NaN would void every standing
        raise EmbeddingsFailed("embeddings endpoint answered a vector that is not finite")
    if len(vectors) != count or len({len(v) for v in vectors}) != 1:
        raise EmbeddingsFailed(f"embeddings endpoint answered {len(vectors)} vectors for {count} texts")
    return vectors


class DenseIndex:
    """Unit vectors per tool, kept per upstream; nearest tools by cosine similarity."""

    def __init__(self) -> None:
        self._np = numpy_module()
        self._parts: dict[str, tuple[list[str], NDArray[np.float32]]] = {}

    def __len__(self) -> int:
        return sum(len(keys) for keys, _ in self._parts.values())

    def replace(self, upstream: str, keys: Sequence[str], vectors: Sequence[Sequence[float]]) -> None:
        matrix = self._unit(self._np.asarray(vectors, dtype=self._np.float32).reshape(len(keys), -1))
        self._parts[upstream] = (list(keys), matrix)

    def remove(self, upstream: str) -> None:
        self._parts.pop(upstream, None)

    def nearest(
        self, vector: Sequence[float], limit: int, upstream: str | None, accept: Callable[[str], bool] | None
    ) -> list[tuple[str, float, float]]:
        """The ``limit`` nearest tools: (key, cosine, how far it stands out of the crowd, 0..1)."""
        parts = [p for u, p in self._parts.items() if upstream is None or u == upstream]
        if not parts:
            return []
        np = self._np
        keys = [k for part_keys, _ in parts for k in part_keys]
        matrix = np.vstack([m for _, m in parts])
        query = self._unit(np.asarray(vector, dtype=np.float32).reshape(1, -1))
        if query.shape[1] != matrix.shape[1]:
            return []
        similar = matrix @ query[0]
        confidence = _confidence(similar, np)
        found: list[tuple[str, float, float]] = []
        for i in np.argsort(-similar):
            if accept is None or accept(keys[i]):
                found.append((keys[i], float(similar[i]), float(confidence[i])))
                if len(found) == limit:
                    break
        return found

    def _unit(self, matrix: NDArray[np.float32]) -> NDArray[np.float32]:
        norms = self._np.linalg.norm(matrix, axis=1, keepdims=True)
        return matrix / self._np.where(norms == 0, 1, norms)


def _confidence(similar: NDArray[np.float32], np: Any) -> NDArray[np.float32]:
    """How strongly each tool matches, 0..1: its cosine similarity, and, in a catalog large
    enough to have a crowd, how far it stands out of it (both must hold: some models give
    every text a high cosine, and some queries match nothing however far one tool stands out)."""
    by_cosine = np.clip((similar - _COSINE_WEAK) / _COSINE_SPAN, 0.0, 1.0)
    if len(similar) < _CROWD:
        return by_cosine
    z = (similar - similar.mean()) / (similar.std() or 1.0)
    return np.minimum(by_cosine, np.clip((z - _Z_WEAK) / _Z_SPAN, 0.0, 1.0))


_COSINE_WEAK = 0.3
_COSINE_SPAN = 0.4
_CROWD = 30
_Z_WEAK = 2.0
"""A tool this many standard deviations above the query's mean similarity starts to count."""
_Z_SPAN = 4.0
"""And this many more make it a full match."""

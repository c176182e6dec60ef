"""Tokenising prompts (processor/jobs/textprep.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.jobs.textprep import TextTokenizer, TokenizerError

# ------------------------------------------------------------------------------------------------
# tokenising


def test_the_default_tokenizer_neither_truncates_nor_pads() -> None:
    tok = TextTokenizer()
    long_text, short_text = "word " * 300, "hi"
    long_ids, short_ids = (e.ids for e in tok.encode_many([long_text, short_text]))
    assert len(long_ids) > 300  # the file asks for truncation at 128 and padding to 128
    assert len(short_ids) == 3  # [CLS] hi [SEP]: the tokenizer's own special tokens, no padding


def test_a_prompt_the_tokenizer_refuses_is_reported_alone() -> None:
    results = TextTokenizer().encode_many(["fine", "bad \ud800 surrogate", "also fine"])
    assert results[0].ids and results[2].ids
    assert results[1].error is not None and "tokenizer refused" in results[1].error


def test_a_missing_tokenizer_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no such file"):
        TextTokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="not a tokenizers JSON file"):
        TextTokenizer(tmp_path)


def test_text_that_holds_its_special_tokens_is_encoded_without_adding_more() -> None:
    tok = TextTokenizer()
    (with_specials,) = tok.encode_many(["hi"])
    (without,) = tok.encode_many(["hi"], add_special_tokens=False)
    assert len(with_specials.ids) == 3 and list(without.ids) == list(with_specials.ids[1:-1])
    (refused,) = tok.encode_many(["bad \ud800"], add_special_tokens=False)
    assert refused.error is not None

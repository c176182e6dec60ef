"""The generative backlog: the templated backlog with prefixes of production length, for a real
generation server's prefix cache.

The main job's ``templated`` backlog fits MiniLM's 512 positions, so its shared prefixes are 26 to
208 tokens. A generative model's few-shot and system prompts run to hundreds or a couple of thousand
tokens, and that is where a prefix cache pays. This workload keeps everything of ``templated`` (the
eight templates, their Zipf popularity, the row order and seed, the user parts' lengths from the
Azure conversation trace, divided by 10) except two things:

* each template's cacheable prefix is **modelled** at ``PREFIX_SCALE`` (8) times its MiniLM
  word-piece count: 208 to 1,664 tokens (data/templates/README.md lists the counts); the texts are not
  longer, the lengths are;
* prompts may take up to ``MAX_PROMPT_TOKENS`` positions (the user part is clipped to fit).

Token ids (:func:`generative_tokens`): ``[CLS]``, then the template's prefix ids (drawn from a seed of
the template's shape: every row of a template starts with the same ids, as rendering the same
cacheable text gives), then the row's own user ids (drawn from a seed of the item id), then
``[SEP]``. The ids are stand-in word pieces of MiniLM's vocabulary, which the local llama-server's
model uses (docs/llm-local.md): its weights are random, so the text means nothing, but its prefill
cost, KV cache and continuous batching are real, and a cache can only serve what rows truly share.

Output lengths (:func:`output_budget`): the row's ``GeneratedTokens`` in the Azure conversation trace,
divided by ``OUTPUT_DIVISOR`` (8), rounded up. The prompts are scaled too: their user parts by 1/10,
their prefixes up by 8x, which brings the whole prompts to 0.94 of the trace's; outputs at 0.94 (about
250 tokens an item) would make a CPU demo decode for most of an hour, so they are divided by 8 (33.6
tokens an item over the first 500 rows, 32.5 over 300), between the user parts' 1/10 and the
prompts' 0.94. The demo holds each request to that length (``ignore_eos``, docs/demo.md).

A perfect prefix cache serves ``1 + prefix`` tokens of every row (``[CLS]`` and the prefix):
:func:`cacheable_tokens`, what the demo's report calls ``prefix_tokens``.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from dataclasses import replace

import xxhash

from processor.sim.templated import (
    CLS_ID,
    FIRST_PIECE,
    SEP_ID,
    VOCAB_SIZE,
    TemplatedRow,
    Workload,
    load_workload,
    templated_records,
)
from processor.sim.traces import read_shipped

#: A generative template's prefix is this many times its MiniLM word-piece count (modelled lengths).
PREFIX_SCALE = 8
#: A row's output length is the trace's ``GeneratedTokens`` divided by this, rounded up (module docstring).
OUTPUT_DIVISOR = 8
#: Longest prompt (``[CLS]`` + prefix + user + ``[SEP]``): it and a few output tokens fit a 4,096-position
#: server slot.
MAX_PROMPT_TOKENS = 3072


def generative_workload(base: Workload | None = None) -> Workload:
    """``templated``'s manifest with prefixes scaled by ``PREFIX_SCALE`` and room for longer prompts."""
    base = base or load_workload()
    templates = tuple(replace(t, prefix_tokens=t.prefix_tokens * PREFIX_SCALE) for t in base.templates)
    return replace(base, templates=templates, max_tokens=MAX_PROMPT_TOKENS)


def generative_rows(limit: int | None = None, workload: Workload | None = None) -> list[TemplatedRow]:
    """The first ``limit`` rows of the generative backlog (all of the manifest's items if None)."""
    workload = workload or generative_workload()
    items = workload.items if limit is None else min(limit, workload.items)
    source = read_shipped(workload.length_source, limit=items)
    return templated_records(replace(workload, items=items), source)


def output_budget(output_length: int) -> int:
    """The tokens a row generates: the trace's output length / ``OUTPUT_DIVISOR``, at least 1."""
    return max(1, -(-output_length // OUTPUT_DIVISOR))


def prefix_ids(shape: int, count: int) -> list[int]:
    """The template's ``count`` prefix ids: the same for every row of the shape."""
    rng = random.Random(shape)
    return [rng.randrange(FIRST_PIECE, VOCAB_SIZE) for _ in range(count)]


def generative_tokens(row: TemplatedRow, salt: int = 0) -> bytes:
    """``[CLS]`` + the shape's prefix ids + the row's user ids + ``[SEP]``, little-endian uint32.

    ``salt`` draws other ids for the same lengths and sharing: two runs against one long-lived
    server (``demo --endpoint``) salt theirs apart, so the second finds nothing of the first in the
    server's cache. Invariant: ``len(result) // 4 == row.record.length`` (``2 + prefix + user``).
    """
    prefix = row.record.length - 2 - row.user_tokens
    rng = random.Random(xxhash.xxh3_64_intdigest(row.record.id.encode("utf-8"), seed=salt))
    user = [rng.randrange(FIRST_PIECE, VOCAB_SIZE) for _ in range(row.user_tokens)]
    ids = [CLS_ID, *prefix_ids(row.record.shape ^ salt, prefix), *user, SEP_ID]
    return struct.pack(f"<{len(ids)}I", *ids)


def cacheable_tokens(rows: Sequence[TemplatedRow]) -> int:
    """What a perfect prefix cache could serve: ``[CLS]`` and the prefix of every row."""
    return sum(row.record.length - 1 - row.user_tokens for row in rows)

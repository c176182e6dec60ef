"""Deterministic synthetic traces, for tests and benchmarks that need more (or stranger) load than the
shipped real traces give: a million records, many shapes, several models, a chosen arrival rate.

Only ``random.Random(seed)`` is used, so a (seed, parameters) pair names one exact trace on every
machine and Python version that keeps ``random``'s documented reproducibility guarantees.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from processor.core.signature import shape_signature
from processor.sim.traces import TraceRecord

__all__ = ["synthetic_records", "synthetic_shape", "template_shape", "templated_records", "write_jsonl"]


def synthetic_shape(k: int) -> int:
    """Signature of synthetic shape ``k`` (0-based popularity rank)."""
    return shape_signature([f"synthetic-shape-{k}"])


def synthetic_records(
    n: int,
    *,
    seed: int,
    shapes: int,
    models: tuple[str, ...] = ("default",),
    min_len: int,
    max_len: int,
    rate_per_s: float | None,
    zipf_s: float = 1.1,
) -> list[TraceRecord]:
    """``n`` records, sorted by ``t_ms``, that look roughly like real prompt traffic.

    * Lengths are log-normal in token count, clipped to [min_len, max_len]: the median sits 40% of the
      way up the log range and sigma is a fifth of it (about 2% land on min_len, 0.1% on max_len), so
      most prompts are short with a long tail, as in the Mooncake and Azure traces.
    * Shapes are Zipf(``zipf_s``) over ``shapes`` signatures (rank k has weight 1/(k+1)^s), so a few hot
      shapes dominate and a long tail is rare, which is what makes shape-aware batching matter.
    * Models are drawn uniformly from ``models`` (no draw when there is only one).
    * Arrivals are Poisson at ``rate_per_s`` (exponential gaps, floored to ms); ``None`` means every
      record arrives at ``t_ms = 0``, i.e. a backlog.

    ``id`` is the 0-based index as a string and ``line`` is index + 1, so :func:`write_jsonl` followed by
    ``read_trace(path, "jsonl")`` gives back an equal list. ``output_length`` is ``None``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if shapes < 1:
        raise ValueError(f"shapes must be >= 1, got {shapes}")
    if not models or not all(isinstance(m, str) and m for m in models):
        raise ValueError(f"models must be non-empty strings, got {models!r}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    if rate_per_s is not None and not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be > 0 or None, got {rate_per_s}")
    if zipf_s < 0:
        raise ValueError(f"zipf_s must be >= 0, got {zipf_s}")

    rng = random.Random(seed)
    signatures = [synthetic_shape(k) for k in range(shapes)]
    cum = _zipf_cum(shapes, zipf_s)
    ranks = rng.choices(range(shapes), cum_weights=cum, k=n) if shapes > 1 else [0] * n

    lo, hi = math.log(min_len), math.log(max_len)
    mu, sigma = lo + 0.4 * (hi - lo), (hi - lo) / 5
    lognorm = rng.lognormvariate
    lengths = [min(max_len, max(min_len, round(lognorm(mu, sigma)))) for _ in range(n)]

    if len(models) == 1:
        picked = [models[0]] * n
    else:
        picked = [models[i] for i in rng.choices(range(len(models)), k=n)]

    times = _arrival_times(rng, n, rate_per_s)

    return [
        TraceRecord(times[i], picked[i], signatures[ranks[i]], lengths[i], str(i), None, i + 1)
        for i in range(n)
    ]


def _zipf_cum(n: int, s: float) -> list[float]:
    cum: list[float] = []
    total = 0.0
    for k in range(n):
        total += (k + 1) ** -s
        cum.append(total)
    return cum


def _arrival_times(rng: random.Random, n: int, rate_per_s: float | None) -> list[int]:
    """Poisson arrivals at ``rate_per_s`` (exponential gaps, floored to ms), or all at 0 for None."""
    if rate_per_s is None:
        return [0] * n
    expo, t, times = rng.expovariate, 0.0, []
    for _ in range(n):
        t += expo(rate_per_s) * 1000.0
        times.append(math.floor(t))
    return times


def template_shape(k: int) -> int:
    """Signature of prompt template ``k`` (0-based popularity rank) of :func:`templated_records`."""
    return shape_signature([f"template-{k}"])


def templated_records(
    n: int,
    *,
    seed: int,
    user_lengths: Sequence[int],
    templates: int = 40,
    models: tuple[str, ...] = ("model-a", "model-b"),
    prefix_min: int = 150,
    prefix_max: int = 2500,
    zipf_s: float = 1.1,
    rate_per_s: float | None = None,
) -> list[TraceRecord]:
    """``n`` requests built from prompt templates: the backlog shape this system exists for.

    * Template ``k`` (popularity rank k, Zipf(``zipf_s``) weight 1/(k+1)^s) is one shape,
      :func:`template_shape`, with a cacheable prefix of a length drawn uniformly in
      [``prefix_min``, ``prefix_max``] tokens, and belongs to model ``models[k % len(models)]``
      (so the first model gets the hottest template and a little more than its share of traffic).
    * Each request is its template's prefix plus a user part whose length is drawn from
      ``user_lengths`` (the benchmarks pass the Azure conversation trace's context lengths).
    * Arrivals as in :func:`synthetic_records`: Poisson at ``rate_per_s``, or all at t=0 (a backlog).

    ``id`` is the 0-based index and ``line`` index + 1, as in :func:`synthetic_records`.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if templates < 1:
        raise ValueError(f"templates must be >= 1, got {templates}")
    if not user_lengths or min(user_lengths) < 0:
        raise ValueError("user_lengths must be a non-empty list of lengths >= 0")
    if not models or not all(isinstance(m, str) and m for m in models):
        raise ValueError(f"models must be non-empty strings, got {models!r}")
    if not 1 <= prefix_min <= prefix_max:
        raise ValueError(f"need 1 <= prefix_min <= prefix_max, got {prefix_min}, {prefix_max}")
    if rate_per_s is not None and not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be > 0 or None, got {rate_per_s}")

    rng = random.Random(seed)
    prefixes = [rng.randint(prefix_min, prefix_max) for _ in range(templates)]
    signatures = [template_shape(k) for k in range(templates)]
    owners = [models[k * len(models) // templates] for k in range(templates)]
    ranks = rng.choices(range(templates), cum_weights=_zipf_cum(templates, zipf_s), k=n)
    users = rng.choices(user_lengths, k=n)
    times = _arrival_times(rng, n, rate_per_s)
    return [
        TraceRecord(times[i], owners[k], signatures[k], prefixes[k] + users[i], str(i), None, i + 1)
        for i, k in enumerate(ranks)
    ]


def write_jsonl(records: Iterable[TraceRecord], path: str | Path) -> Path:
    """Write records in the native ``jsonl`` trace format (gzipped when ``path`` ends in ``.gz``).

    Fields are ``t_ms, model, shape, length, id``, ``output_length`` when known, ``job`` and
    ``adapter`` when not ""; ``line`` is not written (it is where the record lands). Returns the path.
    """
    path = Path(path)
    dumps = json.dumps
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8", newline="\n") as out:
        for r in records:
            obj: dict[str, object] = {
                "t_ms": r.t_ms, "model": r.model, "shape": r.shape, "length": r.length, "id": r.id,
            }  # fmt: skip
            if r.output_length is not None:
                obj["output_length"] = r.output_length
            if r.job:
                obj["job"] = r.job
            if r.adapter:
                obj["adapter"] = r.adapter
            out.write(dumps(obj, separators=(",", ":")) + "\n")
    return path

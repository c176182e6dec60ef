"""One local llama-server per card for a run of ``demo --engine llm``, started cold and stopped after.

Each run (tokenfabric, then the plain queue) gets fresh servers of identical settings, so neither
inherits the other's prompt caches: what each run's cards find in their caches is what its own
routing put there. The servers are named ``demo-<run>-<card>`` (``tokenfabric llm status`` lists
them while they run) and take one CPU thread each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from processor.local.llm.build import build_server
from processor.local.llm.model import MODEL_SHAPES, ensure_model
from processor.local.llm.server import ServerInfo, ServerSettings, start_server, stop_server
from processor.local.pipeline import Card

#: KV-cache positions per slot: the generative backlog's longest prompt and its output fit.
SLOT_TOKENS = 4096


class CardServers:
    """The servers of one run's cards: :meth:`start` them all, give each card its engine flags,
    :meth:`stop` them all (also those of a start that failed half-way)."""

    def __init__(
        self,
        run: str,
        cards: Sequence[Card],
        slots: int,
        say: Callable[[str], None],
        shape: str = "prod",
        affinity: bool = True,
    ) -> None:
        self.run = run
        self.shape = shape
        self.affinity = affinity
        self.cards = tuple(cards)
        self.settings = ServerSettings(slots=slots, ctx_tokens=slots * SLOT_TOKENS, threads=1)
        self.say = say
        self.started: dict[str, ServerInfo] = {}

    def name(self, card: Card) -> str:
        return f"demo-{self.run}-{card.name}"

    def start(self) -> None:
        binary = build_server(progress=self.say).binary  # at once when built; the first time ~14 min
        model = ensure_model(MODEL_SHAPES[self.shape])
        for card in self.cards:
            stop_server(self.name(card))  # one left over by a killed demo: this run starts cold
            self.started[card.name] = start_server(
                binary, model, name=self.name(card), settings=self.settings
            )
        self.say(f"{self.run}: {len(self.cards)} llama-servers started cold ({self.describe()})")

    def describe(self) -> str:
        s = self.settings
        return (
            f"model {self.shape}, {s.slots} slots of {s.ctx_tokens_per_slot:,} positions, "
            f"{s.threads} thread, prompt cache on, no host-memory cache, "
            + ("slot by shape (id_slot)" if self.affinity else f"slot similarity {s.slot_similarity}")
        )

    def engine_args(self, card: Card) -> list[str]:
        """The ``consumer`` / ``plain-queue`` / ``share-queue`` flags that send ``card``'s batches to its
        server: llama.cpp's spelling, each item held to its output budget (``ignore_eos``), and each
        shape's items in one slot (``slot_affinity``) unless turned off."""
        opts = [f"url={self.started[card.name].url}", "server=llamacpp", "ignore_eos=true"]
        if self.affinity:
            opts.append(f"slot_affinity={self.settings.slots}")
        return ["--engine", "openai", *(a for o in opts for a in ("--engine-opt", o))]

    def stop(self) -> None:
        for card in self.cards:
            stop_server(self.name(card))
        self.started.clear()


class GivenEndpoints:
    """``demo --engine llm --endpoint URL ...``: servers the user runs (a GPU fleet's vLLM or SGLang),
    one per card in card order, the same for both runs; nothing is started or stopped here. Their
    caches outlive a run, so the demo salts each run's token ids apart (generative_tokens)."""

    def __init__(self, cards: Sequence[Card], urls: Sequence[str], model: str | None) -> None:
        if len(urls) != len(cards):
            raise ValueError(
                f"--endpoint: give one per card ({len(cards)}: {', '.join(c.name for c in cards)})"
            )
        self.urls = {card.name: url for card, url in zip(cards, urls, strict=True)}
        self.model = model

    def start(self) -> None:
        """Nothing to start: the endpoints run already."""

    def stop(self) -> None:
        """Nothing to stop: the endpoints are the user's."""

    def describe(self) -> str:
        return "given endpoints: " + ", ".join(f"{card} {url}" for card, url in self.urls.items())

    def engine_args(self, card: Card) -> list[str]:
        named = [] if self.model is None else ["--engine-opt", f"model={self.model}"]
        held = ["--engine-opt", "ignore_eos=true"]  # vLLM and SGLang take it too
        return ["--engine", "openai", "--engine-opt", f"url={self.urls[card.name]}", *named, *held]

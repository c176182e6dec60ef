"""From dataset rows to items: what each row's prompt is, what it asks, its shape and its token ids.

Three kinds of input, one pipeline (``tokenfabric submit`` drives it; docs/jobs.md):

* **template** rows: a prompt template renders the row (processor/jobs/templates.py); the shape is the
  template's cacheable parts.
* **chat** rows: a column holds the row's ``messages``, rendered with the model's chat template
  (processor/jobs/chat.py); the shape is that of the leading messages every row shares.
* **OpenAI batch input** lines (processor/jobs/openai_input.py): a completions ``prompt`` (text or
  token ids: no declared shared prefix, so :data:`~processor.jobs.chat.NO_SHAPE`) or chat
  ``messages`` (as chat rows).

A :class:`RowReader` turns one :class:`~processor.jobs.datasets.DatasetRow` into a :class:`RowPrompt`
(or says why the row is bad); :func:`scan` reads every row once before submitting when the job has
chat messages (the shared leading messages are a property of all rows) or is an OpenAI input (its
model is the first line's); :func:`prepare` renders, tokenises and shapes one chunk of prompts.
Per-row settings (processor/jobs/settings.py) are merged and checked in the reader, so a row whose
settings are invalid is a bad row like any other.

Pure apart from the tokenizer it is handed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from processor.jobs.chat import (
    NO_PREFIX,
    NO_SHAPE,
    ChatPrefix,
    ChatTemplate,
    Message,
    chat_prefix,
    check_messages,
    common_leading,
)
from processor.jobs.datasets import DatasetRow
from processor.jobs.model import BadRow
from processor.jobs.openai_input import EMBEDDINGS, CustomIds, custom_id_of, endpoint_of, parse_line
from processor.jobs.settings import (
    RowSettings,
    Settings,
    SettingsError,
    merge_settings,
    row_settings,
    settings_cell,
)
from processor.jobs.templates import RowError, Template
from processor.jobs.textprep import TextTokenizer

NO_TOKENS = "the prompt has no tokens"


@dataclass(frozen=True, slots=True)
class RowPrompt:
    """One row read: at most one of ``text``, ``ids`` and ``messages``, or ``error`` when it is bad."""

    row: int
    text: str | None = None
    """A prompt to tokenise with the tokenizer's special tokens (a template's rendering, a completions
    prompt)."""
    ids: tuple[int, ...] | None = None
    """Token ids given as they are (an OpenAI completions prompt of ids)."""
    messages: list[dict[str, Any]] | None = None
    """Chat messages, rendered with the chat template."""
    settings: RowSettings = field(default_factory=RowSettings)
    model: str | None = None
    """The model the row names (OpenAI lines), None when it names none."""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PreparedItem:
    """One row ready to produce."""

    row: int
    ids: Sequence[int]
    shape: int
    settings: RowSettings


class RowReader(Protocol):
    """Reads one dataset row; never raises for a bad row (the prompt's ``error`` says why)."""

    def read(self, drow: DatasetRow) -> RowPrompt: ...


@dataclass(frozen=True, slots=True)
class SettingsSource:
    """The job-wide settings and the column (if any) whose cell overrides them per row."""

    job: Settings = field(default_factory=dict)
    column: str | None = None

    def for_row(self, values: Mapping[str, Any], own: Settings | None = None) -> RowSettings:
        """Job-wide, then ``own`` (an OpenAI body's), then the row's column; RowError when invalid."""
        try:
            merged = merge_settings(self.job, own or {})
            if self.column is not None:
                merged = merge_settings(merged, settings_cell(values.get(self.column)))
            return row_settings(merged)
        except SettingsError as exc:
            raise RowError(f"settings: {exc}") from None


def _read(drow: DatasetRow, read: Callable[[Mapping[str, Any]], RowPrompt]) -> RowPrompt:
    """``read(values)`` for a parsed row; the parse error or the RowError as the row's error."""
    if drow.error is not None or drow.values is None:
        return RowPrompt(drow.row, error=drow.error or "no values")
    try:
        return read(drow.values)
    except RowError as exc:
        return RowPrompt(drow.row, error=str(exc))


@dataclass(frozen=True, slots=True)
class TemplateRows:
    """Rows rendered with a prompt template."""

    template: Template
    settings: SettingsSource

    def read(self, drow: DatasetRow) -> RowPrompt:
        return _read(
            drow,
            lambda v: RowPrompt(drow.row, text=self.template.render(v), settings=self.settings.for_row(v)),
        )


@dataclass(frozen=True, slots=True)
class ChatRows:
    """Rows whose ``column`` holds chat messages."""

    column: str
    settings: SettingsSource

    def read(self, drow: DatasetRow) -> RowPrompt:
        def read(values: Mapping[str, Any]) -> RowPrompt:
            if values.get(self.column) is None:
                raise RowError(
                    f"missing column {self.column!r}" if self.column not in values else "no messages"
                )
            messages = check_messages(values[self.column])
            return RowPrompt(drow.row, messages=messages, settings=self.settings.for_row(values))

        return _read(drow, read)


@dataclass(slots=True)
class OpenAIRows:
    """OpenAI batch input lines. ``model``: the job's (base) model.

    A line's ``body.model`` chooses what runs it, as vLLM serves LoRA adapters by name: none, the
    job's model, or (with ``--model``, ``override``) the file's own model name ``file_model`` run on the
    base model; any other name is a LoRA adapter of the job's model (the item's ``request.adapter``,
    scheduled by ``model@adapter``). ``adapters``: the adapters consumers serve for the job's model
    (``submit`` reads their contracts); a line naming one not in it is bad, so an unknown adapter is
    that row's error rather than work no consumer takes. None: not known (no check).
    """

    settings: SettingsSource
    model: str | None = None
    override: bool = False
    custom_ids: CustomIds = field(default_factory=CustomIds)
    file_model: str | None = None
    adapters: frozenset[str] | None = None
    embeddings: bool | None = None
    """Whether the job's lines are embeddings: the first usable line decides (OpenAI: one endpoint a
    batch; an embedding and a generation need consumers of different engines)."""

    def read(self, drow: DatasetRow) -> RowPrompt:
        def read(values: Mapping[str, Any]) -> RowPrompt:
            custom_id = custom_id_of(values)
            if custom_id:  # first, so a custom_id belongs to its first line even when that line is bad
                self.custom_ids.claim(custom_id, drow.row)
            self._check_endpoint(endpoint_of(values))
            line = parse_line(values)
            adapter = self._adapter(line.model, line.settings.get("adapter"))
            own = {**line.settings, "adapter": adapter} if adapter else line.settings
            settings = self.settings.for_row(values, own)
            return RowPrompt(
                drow.row,
                text=line.prompt,
                ids=line.prompt_ids,
                messages=line.messages,
                settings=settings,
                model=line.model,
            )

        return _read(drow, read)

    def _check_endpoint(self, url: str | None) -> None:
        if url is None:
            return  # no url tokenfabric runs: parse_line says so
        if self.embeddings is None:
            self.embeddings = url == EMBEDDINGS
        elif (url == EMBEDDINGS) != self.embeddings:
            first = EMBEDDINGS if self.embeddings else "completions"
            raise RowError(
                f"url {url!r} in a job of {first} lines: a batch input takes one kind "
                "(submit embeddings and generations as jobs of their own)"
            )

    def _adapter(self, named: str | None, asked: str | None = None) -> str:
        """The LoRA adapter a line's ``body.model`` names, or its ``body.adapter`` (``asked``,
        tokenfabric's own setting) asks for; "" for the base model; RowError for one no consumer
        serves (when ``adapters`` is known)."""
        key = "body.adapter" if asked else "body.model"
        if asked:
            named = asked
        elif (
            named in (None, self.model) or self.model is None or (self.override and named == self.file_model)
        ):
            return ""
        if self.adapters is not None and named not in self.adapters:
            served = ", ".join(sorted(self.adapters)) or "none"
            raise RowError(
                f"{key} {named!r} is neither the job's model {self.model!r} nor a LoRA adapter a "
                f"consumer serves for it (adapters served: {served}; a consumer with --model "
                f"{self.model} --adapter {named} serves it)"
            )
        return named


@dataclass(frozen=True, slots=True)
class Scan:
    """What one read of every row found: the leading messages all chat rows share, whether any row has
    messages, and the first model a row names."""

    leading: tuple[Message, ...] = ()
    has_messages: bool = False
    first_model: str | None = None


def scan(reader: RowReader, rows: Iterable[DatasetRow]) -> Scan:
    """Read every row once (bad rows are ignored here; the submitting pass reports them)."""
    leading: list[Message] | None = None
    first_model: str | None = None
    for drow in rows:
        prompt = reader.read(drow)
        if prompt.error is not None:
            continue
        if first_model is None:
            first_model = prompt.model
        if prompt.messages is not None:
            leading = common_leading(leading, prompt.messages)
    return Scan(tuple(leading or ()), leading is not None, first_model)


@dataclass(frozen=True, slots=True)
class Shaper:
    """Shapes of a job's items: a template's for rendered text, the chat prefix's for messages."""

    text_shape: int = NO_SHAPE
    chat: ChatTemplate | None = None
    prefix: ChatPrefix = NO_PREFIX


def chat_shaper(chat: ChatTemplate, leading: Sequence[Message], tokenizer: TextTokenizer) -> Shaper:
    """The shaper of a job whose chat rows share ``leading`` (:attr:`Scan.leading`): its prefix is
    tokenised as the rows are, without adding special tokens."""

    def tokenize(text: str) -> Sequence[int] | None:
        (enc,) = tokenizer.encode_many([text], add_special_tokens=False)
        return enc.ids if enc.error is None else None

    return Shaper(chat=chat, prefix=chat_prefix(chat, leading, tokenize))


def prepare(
    prompts: Sequence[RowPrompt], tokenizer: TextTokenizer, shaper: Shaper
) -> tuple[list[PreparedItem], list[BadRow]]:
    """Render, tokenise and shape one chunk; the items in row order, and the chunk's bad rows.

    Text is tokenised with the tokenizer's special tokens, a chat rendering without (it holds them);
    each kind in one batch call. A prompt with no tokens is bad: there is nothing to run.
    """
    bad: list[BadRow] = []
    ready: list[PreparedItem] = []
    texts: list[tuple[RowPrompt, str]] = []
    chats: list[tuple[RowPrompt, str]] = []
    for p in prompts:
        if p.error is not None or p.ids == ():
            bad.append(BadRow(p.row, p.error or NO_TOKENS))
        elif p.ids is not None:
            ready.append(PreparedItem(p.row, p.ids, NO_SHAPE, p.settings))
        elif p.text is not None:
            texts.append((p, p.text))
        elif p.messages is not None and shaper.chat is not None:
            try:
                rendered = shaper.chat.render(p.messages)
            except RowError as exc:
                bad.append(BadRow(p.row, str(exc)))
                continue
            chats.append((p, rendered))
        else:
            bad.append(BadRow(p.row, "chat messages, but the job has no chat template"))
    for group, specials in ((texts, True), (chats, False)):
        encoded = tokenizer.encode_many([text for _, text in group], add_special_tokens=specials)
        for (p, text), enc in zip(group, encoded, strict=True):
            if enc.error is not None or not enc.ids:
                bad.append(BadRow(p.row, enc.error or NO_TOKENS))
            else:
                shape = shaper.prefix.shape_of(text, enc.ids) if p.messages is not None else shaper.text_shape
                ready.append(PreparedItem(p.row, enc.ids, shape, p.settings))
    ready.sort(key=lambda i: i.row)
    bad.sort(key=lambda b: b.row)
    return ready, bad


@dataclass(frozen=True, slots=True)
class JobRows:
    """How a job's rows become items, and what its record says about it: ``shape`` (the job's) and
    ``source`` (``JobRecord.template``: the template's path, the chat template's, or an OpenAI
    input's marker)."""

    reader: RowReader
    shaper: Shaper
    shape: int
    source: str

    @classmethod
    def from_template(cls, template: Template, settings: SettingsSource | None = None) -> JobRows:
        reader = TemplateRows(template, settings or SettingsSource())
        return cls(reader, Shaper(text_shape=template.shape), template.shape, str(template.source))

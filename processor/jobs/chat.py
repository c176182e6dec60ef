"""Chat rows: ``messages`` rendered with the model's own chat template, and the shape of what repeats.

The template is the Jinja ``chat_template`` of a Hugging Face model (its ``tokenizer_config.json``, or
the ``chat_template.jinja`` newer models ship beside it). It is rendered the way transformers'
``apply_chat_template`` renders it, so the prompt is the one the model was trained on and the one its
server would build: jinja2's ``ImmutableSandboxedEnvironment`` (a template cannot reach Python
internals or mutate its inputs) with ``trim_blocks``, ``lstrip_blocks`` and loop controls, the
``tojson`` filter without ASCII escaping, the ``raise_exception`` and ``strftime_now`` globals, and
the variables ``messages``, ``add_generation_prompt=True`` and the tokenizer's special tokens
(``bos_token``, ``eos_token``, ...). The rendered text already holds the special tokens the model
expects, so it is tokenised without adding any (transformers does the same).

**The shape.** A template's cacheable parts are declared; a chat job's are found: the *leading
messages every row shares* (its system message, few-shot turns), at most all but each row's last
message. Their rendering without the generation prompt (the template's own text before them
included) is the shared prefix, and the job's shape is ``shape_signature([prefix])``. A row gets
that shape only when the prefix really is the start of its full rendering and of its token ids (a
template may render a system message differently once it sees later turns; a prefix's last token may
merge with the row's next text); otherwise it gets :data:`NO_SHAPE`, the shape of no shared
components, because claiming a prefix it does not have would put it in the wrong lane.

Pure apart from :func:`load_chat_template` reading the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from processor.core.signature import shape_signature
from processor.jobs.templates import RowError

#: The shape of an item that shares no declared prefix (no cacheable parts, or no chat prefix).
NO_SHAPE = shape_signature(())
#: Special-token names transformers passes to a chat template, when the tokenizer config has them.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_JINJA_NAME = "chat_template.jinja"
_CONFIG_NAME = "tokenizer_config.json"

Message = Mapping[str, Any]


class ChatTemplateError(ValueError):
    """The chat template cannot be loaded or compiled; the message names the file."""


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template's source text and the special tokens it is rendered with (compiled once, on
    first use; no ``slots``, so the compiled template can be cached on the instance)."""

    source: str
    text: str
    special_tokens: tuple[tuple[str, str], ...] = ()

    @cached_property
    def _compiled(self) -> Any:
        return compile_template(self.text, self.source)

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
        """The prompt for ``messages``; :class:`RowError` with the template's complaint if it refuses."""
        try:
            return str(
                self._compiled.render(
                    messages=list(messages),
                    add_generation_prompt=add_generation_prompt,
                    **dict(self.special_tokens),
                )
            )
        except Exception as exc:  # a template raises what it likes (raise_exception, TypeError, ...):
            # each is this row's reason, reported as a bad row
            raise RowError(f"chat template refused the messages: {exc}") from None


def compile_template(text: str, source: str) -> Any:
    """The jinja2 template, in transformers' environment (module docstring)."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ChatTemplateError("chat templates need jinja2: pip install 'tokenfabric[jobs]'") from None

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(text)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template {source}: line {exc.lineno}: {exc.message}") from None


def load_chat_template(path: str | Path) -> ChatTemplate:
    """A ``tokenizer_config.json``, a ``.jinja`` file, or a model folder holding either.

    A config's ``chat_template`` may be a list of named templates: the one named ``default`` is used,
    as transformers does. A ``.jinja`` file takes its special tokens from a ``tokenizer_config.json``
    beside it, if there is one.
    """
    p = Path(path)
    if p.is_dir():
        found = find_chat_template(p)
        if found is None:
            raise ChatTemplateError(
                f"chat template: {p} holds no {_JINJA_NAME} and no {_CONFIG_NAME} with one"
            )
        p = found
    if p.suffix.lower() == ".json":
        config = _read_config(p)
        text = _config_template(config, p)
    else:
        text = _read_text(p)
        beside = p.with_name(_CONFIG_NAME)
        config = _read_config(beside) if beside.is_file() else {}
    template = ChatTemplate(str(p.resolve()), text, _special_tokens(config))
    _ = template._compiled  # a syntax error is a setup error, found before any row
    return template


def find_chat_template(folder: Path) -> Path | None:
    """The chat template in a model folder: ``chat_template.jinja``, else a ``tokenizer_config.json``
    that has a ``chat_template``; None when neither does."""
    if (folder / _JINJA_NAME).is_file():
        return folder / _JINJA_NAME
    config = folder / _CONFIG_NAME
    if config.is_file():
        try:
            has = bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
        except (OSError, ValueError, AttributeError):
            has = False  # not a usable config: the caller reports that no template was found
        if has:
            return config
    return None


def _read_text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"chat template {p}: {getattr(exc, 'strerror', None) or exc}") from None


def _read_config(p: Path) -> dict[str, Any]:
    try:
        config = json.loads(_read_text(p))
    except json.JSONDecodeError as exc:
        raise ChatTemplateError(f"chat template {p}: not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(config, dict):
        raise ChatTemplateError(f"chat template {p}: not a JSON object")
    return config


def _config_template(config: Mapping[str, Any], p: Path) -> str:
    value = config.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if not isinstance(value, str) or not value:
        raise ChatTemplateError(f"chat template {p}: no 'chat_template' string (nor one named 'default')")
    return value


def _special_tokens(config: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Special tokens as text: a config writes them as strings or as ``{"content": ...}`` objects."""
    out: list[tuple[str, str]] = []
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out.append((name, value))
    return tuple(out)


# --------------------------------------------------------------------------------------------------
# rows of messages


def check_messages(value: Any) -> list[dict[str, Any]]:
    """A row's messages: a non-empty list of objects, each with a string ``role``; JSON text of one
    is accepted (a CSV cell). Content goes to the template as given (a string, a list of parts, or
    null with tool calls): the template decides what it renders. RowError otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RowError(f"messages: not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, list) or not value:
        raise RowError("messages must be a non-empty list of {role, content} objects")
    for n, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RowError(f"message {n} is not an object with a string 'role'")
    return value


def common_leading(shared: Sequence[Message] | None, messages: Sequence[Message]) -> list[Message]:
    """The leading messages ``shared`` (None: no row seen yet) has in common with ``messages``, at most
    all but the last of ``messages`` (a row's last message is its own). Fold it over every row."""
    limit = len(messages) - 1
    if shared is None:
        return list(messages[:limit])
    n = 0
    while n < min(limit, len(shared)) and shared[n] == messages[n]:
        n += 1
    return list(shared[:n])


@dataclass(frozen=True, slots=True)
class ChatPrefix:
    """The rendered leading messages every row shares (None: none), its token ids, and the job's shape.

    ``ids`` are the prefix's token ids (tokenised without special tokens, as renderings are); a row
    shares the prefix only if its ids start with them too: an engine's prefix cache matches tokens,
    and a text prefix whose last token merges with the row's next text would not be one.
    """

    text: str | None
    ids: tuple[int, ...] = ()

    @property
    def shape(self) -> int:
        return NO_SHAPE if self.text is None else shape_signature([self.text])

    def shape_of(self, prompt: str, ids: Sequence[int]) -> int:
        """The shape of one row's full rendering and its ids: the job's when the prefix starts both,
        else NO_SHAPE."""
        if self.text is None or not prompt.startswith(self.text):
            return NO_SHAPE
        return self.shape if tuple(ids[: len(self.ids)]) == self.ids else NO_SHAPE


#: No shared prefix: every row has NO_SHAPE.
NO_PREFIX = ChatPrefix(None)


def chat_prefix(
    template: ChatTemplate, leading: Sequence[Message], tokenize: Callable[[str], Sequence[int] | None]
) -> ChatPrefix:
    """The shared prefix of ``leading`` (from :func:`common_leading` over every row); ``tokenize``
    gives a text's ids as rows are tokenised (None if the tokenizer refuses it).

    No leading messages, a template that refuses to render them alone (some insist on a user turn),
    an empty rendering or one the tokenizer refuses: no prefix, and every row has NO_SHAPE.
    """
    if not leading:
        return NO_PREFIX
    try:
        text = template.render(leading, add_generation_prompt=False)
    except RowError:
        return NO_PREFIX
    ids = tokenize(text) if text else None
    return ChatPrefix(text, tuple(ids)) if ids else NO_PREFIX

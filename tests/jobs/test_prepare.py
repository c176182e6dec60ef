"""From rows to items (processor/jobs/prepare.py): each kind of prompt tokenised its own way, shaped,
kept in row order, and every failure a bad row of its own."""

from __future__ import annotations

from dataclasses import replace

from processor.jobs.chat import NO_SHAPE, load_chat_template
from processor.jobs.datasets import DatasetRow
from processor.jobs.model import BadRow
from processor.jobs.prepare import (
    ChatRows,
    RowPrompt,
    SettingsSource,
    Shaper,
    TemplateRows,
    chat_shaper,
    prepare,
    scan,
)
from processor.jobs.settings import RowSettings
from processor.jobs.textprep import TextTokenizer
from processor.wire.request import GenerationRequest
from tests.jobs.helpers import EXAMPLES, QUESTION, SYSTEM, template

CHATML = EXAMPLES / "chatml" / "tokenizer_config.json"
SYS = {"role": "system", "content": "Be brief."}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_prepare_tokenises_each_kind_its_own_way_and_keeps_row_order() -> None:
    tok, chat = TextTokenizer(), load_chat_template(CHATML)
    shaper = replace(chat_shaper(chat, [SYS], tok), text_shape=12345)
    prefix = shaper.prefix
    assert prefix.ids == tuple(tok.encode_many([prefix.text or ""], add_special_tokens=False)[0].ids)
    asks = RowSettings(GenerationRequest(seed=1), 9)
    prompts = [
        RowPrompt(4, messages=[SYS, user("hi")], settings=asks),
        RowPrompt(0, text="hi"),
        RowPrompt(1, ids=(7, 8)),
        RowPrompt(2, error="not JSON"),
        RowPrompt(3, messages=[{"role": "tool", "content": "x"}]),
        RowPrompt(5, ids=()),
        RowPrompt(6, messages=[user("no prefix")]),
    ]
    ready, bad = prepare(prompts, tok, shaper)
    rendered = chat.render([SYS, user("hi")])
    assert [(i.row, list(i.ids), i.shape, i.settings) for i in ready] == [
        (0, list(tok.encode_many(["hi"])[0].ids), 12345, RowSettings()),  # [CLS] hi [SEP]
        (1, [7, 8], NO_SHAPE, RowSettings()),
        (4, list(tok.encode_many([rendered], add_special_tokens=False)[0].ids), prefix.shape, asks),
        (
            6,
            list(tok.encode_many([chat.render([user("no prefix")])], add_special_tokens=False)[0].ids),
            NO_SHAPE,
            RowSettings(),
        ),
    ]
    assert ready[0].ids[0] == 101 and ready[2].ids[0] != 101  # the chat rendering gets no [CLS]
    assert [b.row for b in bad] == [2, 3, 5]
    assert bad[0] == BadRow(2, "not JSON") and "unknown role tool" in bad[1].reason
    assert bad[2] == BadRow(5, "the prompt has no tokens")


def test_messages_without_a_chat_template_are_a_bad_row_not_a_crash() -> None:
    _, bad = prepare([RowPrompt(0, messages=[user("x")])], TextTokenizer(), Shaper())
    assert bad == [BadRow(0, "chat messages, but the job has no chat template")]


def test_readers_turn_rows_into_prompts_and_scan_folds_the_shared_messages() -> None:
    rows = [
        DatasetRow(0, {"m": [SYS, user("a")], "s": '{"seed": 3}'}),
        DatasetRow(1, None, "not JSON"),
        DatasetRow(2, {"m": [SYS, user("b")]}),
        DatasetRow(3, {"m": None}),
    ]
    reader = ChatRows("m", SettingsSource({"temperature": 0.0}, "s"))
    prompts = [reader.read(r) for r in rows]
    assert prompts[0].settings == RowSettings(GenerationRequest(temperature=0.0, seed=3))
    assert prompts[2].settings == RowSettings(GenerationRequest(temperature=0.0))
    assert [p.error for p in prompts] == [None, "not JSON", None, "no messages"]
    found = scan(reader, rows)
    assert (found.leading, found.has_messages, found.first_model) == ((SYS,), True, None)
    assert not scan(reader, rows[1:2]).has_messages
    by_template = TemplateRows(template(SYSTEM, QUESTION), SettingsSource())
    assert by_template.read(DatasetRow(0, {"question": "q"})).text == "Be brief.\nQ: q\nA:"
    assert by_template.read(DatasetRow(1, {})).error == "missing column 'question'"

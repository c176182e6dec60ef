"""Chat rows (processor/jobs/chat.py): the model's template rendered as transformers renders it, the
special tokens from its config, and the shape of the leading messages every row shares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from processor.core.signature import shape_signature
from processor.jobs.chat import (
    NO_PREFIX,
    NO_SHAPE,
    ChatTemplate,
    ChatTemplateError,
    chat_prefix,
    check_messages,
    common_leading,
    find_chat_template,
    load_chat_template,
)
from processor.jobs.templates import RowError
from tests.jobs.helpers import EXAMPLES

CHATML = EXAMPLES / "chatml" / "tokenizer_config.json"
SYSTEM = {"role": "system", "content": "Label the sentiment."}
SHOT_Q = {"role": "user", "content": "Great value."}
SHOT_A = {"role": "assistant", "content": "positive"}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_the_example_chatml_template_renders_with_the_generation_prompt() -> None:
    t = load_chat_template(CHATML)
    assert t.render([SYSTEM, user("Broke in a day.")]) == (
        "<|im_start|>system\nLabel the sentiment.<|im_end|>\n"
        "<|im_start|>user\nBroke in a day.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert t.render([user("x")], add_generation_prompt=False) == "<|im_start|>user\nx<|im_end|>\n"
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert t.render([{"role": "user", "content": parts}]).startswith("<|im_start|>user\nab<|im_end|>")


def test_transformers_environment_special_tokens_tojson_and_raise_exception(tmp_path: Path) -> None:
    config = {
        "bos_token": {"content": "<s>", "lstrip": False},
        "eos_token": "</s>",
        "chat_template": [
            {"name": "tool_use", "template": "unused"},
            {
                "name": "default",
                "template": "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}"
                "{{ raise_exception('no tools here') }}{% endif %}"
                "[{{ m.role }}]{{ m.content | tojson }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}",
            },
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    t = load_chat_template(tmp_path)  # a model folder
    assert t.render([user("é")]) == '<s>[user]"é"\n[assistant]'  # trim_blocks, tojson without escaping
    with pytest.raises(RowError, match="chat template refused the messages: no tools here"):
        t.render([{"role": "tool", "content": "x"}])
    (tmp_path / "chat_template.jinja").write_text("{{ eos_token }}{{ messages[0].content }}")
    assert find_chat_template(tmp_path) == tmp_path / "chat_template.jinja"
    assert load_chat_template(tmp_path).render([user("hi")]) == "</s>hi"  # tokens from the config beside it


def test_a_template_cannot_reach_python_internals_or_mutate_its_input() -> None:
    sneaky = ChatTemplate("t", "{{ messages.__class__.__mro__ }}{{ messages.append(1) }}")
    messages = [user("x")]
    with pytest.raises(RowError, match="chat template refused"):
        sneaky.render(messages)
    assert messages == [user("x")]


def test_unusable_templates_are_setup_errors_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert find_chat_template(tmp_path) is None
    with pytest.raises(ChatTemplateError, match=r"holds no chat_template\.jinja"):
        load_chat_template(tmp_path)
    with pytest.raises(ChatTemplateError, match="no 'chat_template' string"):
        load_chat_template(tmp_path / "tokenizer_config.json")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match=r"bad.jinja: line 1"):
        load_chat_template(bad)


def test_messages_must_be_a_list_of_objects_with_roles() -> None:
    assert check_messages('[{"role": "user", "content": "x"}]') == [user("x")]
    for value, message in [
        ([], "non-empty list"),
        ("[{]", "messages: not JSON"),
        ([{"content": "x"}], "message 0 is not an object with a string 'role'"),
        ({"role": "user"}, "non-empty list"),
    ]:
        with pytest.raises(RowError, match=message):
            check_messages(value)


def test_the_shared_leading_messages_stop_at_the_first_difference_and_before_each_last_message() -> None:
    rows = [
        [SYSTEM, SHOT_Q, SHOT_A, user("a")],
        [SYSTEM, SHOT_Q, SHOT_A, user("b")],
        [SYSTEM, SHOT_Q, SHOT_A, user("c"), {"role": "assistant", "content": "x"}, user("d")],
    ]
    leading = None
    for messages in rows:
        leading = common_leading(leading, messages)
    assert leading == [SYSTEM, SHOT_Q, SHOT_A]
    assert common_leading([SYSTEM, SHOT_Q], [SYSTEM, SHOT_Q]) == [SYSTEM]  # a row keeps its last message
    assert common_leading([SYSTEM], [user("x"), SYSTEM]) == []


def test_the_job_shape_is_the_rendered_shared_prefix_and_rows_without_it_get_no_shape() -> None:
    t = load_chat_template(CHATML)
    ids = {"A": [1], "AB": [1, 2], "AC": [3]}  # a stand-in tokenizer: "AC" merges across the prefix's end
    chars = ChatTemplate("t", "{% for m in messages %}{{ m.content }}{% endfor %}")
    merged = chat_prefix(chars, [{"role": "system", "content": "A"}], lambda text: ids[text])
    assert merged.text == "A" and merged.ids == (1,)
    assert merged.shape_of("AB", ids["AB"]) == merged.shape != NO_SHAPE
    assert merged.shape_of("AC", ids["AC"]) == NO_SHAPE  # the text starts with the prefix, the tokens do not

    def tokenize(text: str) -> list[int]:
        return [ord(c) for c in text]

    prefix = chat_prefix(t, [SYSTEM, SHOT_Q, SHOT_A], tokenize)
    assert prefix.text == t.render([SYSTEM, SHOT_Q, SHOT_A], add_generation_prompt=False)
    assert prefix.shape == shape_signature([prefix.text]) != NO_SHAPE
    full = t.render([SYSTEM, SHOT_Q, SHOT_A, user("z")])
    assert prefix.shape_of(full, tokenize(full)) == prefix.shape
    other = t.render([user("z")])
    assert prefix.shape_of(other, tokenize(other)) == NO_SHAPE
    assert chat_prefix(t, [], tokenize) == NO_PREFIX and NO_PREFIX.shape == NO_SHAPE
    assert chat_prefix(t, [{"role": "tool", "content": "x"}], tokenize) == NO_PREFIX  # refused alone
    assert chat_prefix(t, [SYSTEM], lambda text: None) == NO_PREFIX  # the tokenizer refuses it

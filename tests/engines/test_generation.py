"""An item's generation request in each server's spelling (processor/engines/generation.py): what each
dialect sends, what it refuses with a reason, and that nothing asked for is dropped silently."""

from __future__ import annotations

import json

import pytest

from processor.engines.generation import DIALECTS, SERVERS, ServerName, Unsupported, choices_grammar, dialect
from processor.wire.request import GenerationRequest

SCHEMA = '{"type": "object", "properties": {"c": {"enum": ["red", "blue"]}}, "required": ["c"]}'

EVERYWHERE = GenerationRequest(temperature=0.7, top_p=0.9, seed=11, stop=("\n\n",))
"""What OpenAI's own completions API names, so every server takes it under the same names."""


@pytest.mark.parametrize("server", SERVERS)
def test_the_openai_api_fields_go_under_their_own_names_everywhere(server: ServerName) -> None:
    fields = DIALECTS[server].fields(EVERYWHERE, temperature=0.0)
    assert fields == {"temperature": 0.7, "top_p": 0.9, "seed": 11, "stop": ["\n\n"]}


@pytest.mark.parametrize("server", SERVERS)
def test_no_request_sends_the_consumers_temperature_only(server: ServerName) -> None:
    assert DIALECTS[server].fields(None, temperature=0.25) == {"temperature": 0.25}
    assert DIALECTS[server].fields(GenerationRequest(), temperature=0.25) == {"temperature": 0.25}


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ("vllm", {"structured_outputs": {"json": json.loads(SCHEMA)}}),
        ("vllm-guided", {"guided_json": json.loads(SCHEMA)}),
        ("sglang", {"json_schema": SCHEMA}),
        ("llamacpp", {"json_schema": json.loads(SCHEMA)}),
        (
            "openai",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": json.loads(SCHEMA), "strict": True},
                }
            },
        ),
    ],
)
def test_a_json_schema_in_each_servers_form(server: ServerName, expected: dict[str, object]) -> None:
    fields = DIALECTS[server].fields(GenerationRequest(json_schema=SCHEMA), temperature=0.0)
    assert fields == {"temperature": 0.0, **expected}


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ("vllm", {"structured_outputs": {"choice": ["yes", "no"]}}),
        ("vllm-guided", {"guided_choice": ["yes", "no"]}),
        ("sglang", {"ebnf": 'root ::= "yes" | "no"'}),
        ("llamacpp", {"grammar": 'root ::= "yes" | "no"'}),
    ],
)
def test_a_choice_list_in_each_servers_form(server: ServerName, expected: dict[str, object]) -> None:
    fields = DIALECTS[server].fields(GenerationRequest(choices=("yes", "no")), temperature=0.0)
    assert fields == {"temperature": 0.0, **expected}


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ("vllm", {"structured_outputs": {"regex": "[0-9]+"}}),
        ("vllm-guided", {"guided_regex": "[0-9]+"}),
        ("sglang", {"regex": "[0-9]+"}),
    ],
)
def test_a_regex_in_each_servers_form(server: ServerName, expected: dict[str, object]) -> None:
    fields = DIALECTS[server].fields(GenerationRequest(regex="[0-9]+"), temperature=0.0)
    assert fields == {"temperature": 0.0, **expected}


@pytest.mark.parametrize(
    ("server", "request_", "names"),
    [
        ("llamacpp", GenerationRequest(regex="[0-9]+"), ("regex", "server=llamacpp", "vllm", "sglang")),
        ("llamacpp", GenerationRequest(stop_token_ids=(102,)), ("stop_token_ids", "vllm", "sglang")),
        ("openai", GenerationRequest(top_k=5), ("top_k", "server=openai", "llamacpp")),
        ("openai", GenerationRequest(stop_token_ids=(7,)), ("stop_token_ids", "vllm")),
        ("openai", GenerationRequest(choices=("a", "b")), ("choices", "vllm", "llamacpp")),
        ("openai", GenerationRequest(regex="a+"), ("regex", "sglang")),
    ],
)
def test_what_a_server_cannot_be_told_is_refused_naming_servers_that_can(
    server: ServerName, request_: GenerationRequest, names: tuple[str, ...]
) -> None:
    with pytest.raises(Unsupported) as refused:
        DIALECTS[server].fields(request_, temperature=0.0)
    assert all(name in str(refused.value) for name in names), str(refused.value)


def test_top_k_zero_means_no_limit_in_each_servers_value() -> None:
    no_limit = GenerationRequest(top_k=0)
    assert DIALECTS["vllm"].fields(no_limit, temperature=0.0)["top_k"] == -1
    assert DIALECTS["sglang"].fields(no_limit, temperature=0.0)["top_k"] == -1
    assert DIALECTS["llamacpp"].fields(no_limit, temperature=0.0)["top_k"] == 0
    assert DIALECTS["vllm"].fields(GenerationRequest(top_k=40), temperature=0.0)["top_k"] == 40


def test_logprobs_go_as_llama_cpps_n_probs_with_at_least_one() -> None:
    assert DIALECTS["llamacpp"].fields(GenerationRequest(logprobs=0), temperature=0.0)["n_probs"] == 1
    assert DIALECTS["llamacpp"].fields(GenerationRequest(logprobs=3), temperature=0.0)["n_probs"] == 3
    assert DIALECTS["vllm"].fields(GenerationRequest(logprobs=0), temperature=0.0)["logprobs"] == 0


def test_stop_token_ids_and_priority_where_servers_take_them() -> None:
    asks = GenerationRequest(stop_token_ids=(102, 7), priority=-3)
    assert DIALECTS["vllm"].fields(asks, temperature=0.0) == {
        "temperature": 0.0,
        "stop_token_ids": [102, 7],
        "priority": -3,
    }
    # priority is a scheduling hint: dropped where a server has none, never sent as 0 (vLLM refuses a
    # non-zero priority without priority scheduling, so the default must not be sent)
    assert "priority" not in DIALECTS["llamacpp"].fields(GenerationRequest(priority=5), temperature=0.0)
    assert "priority" not in DIALECTS["vllm"].fields(GenerationRequest(priority=0), temperature=0.0)


def test_an_adapter_is_the_model_on_vllm_lora_path_on_sglang_and_an_id_on_llama_cpp() -> None:
    tone = GenerationRequest(adapter="tone")
    assert DIALECTS["vllm"].fields(tone, temperature=0.0)["model"] == "tone"
    assert DIALECTS["openai"].fields(tone, temperature=0.0)["model"] == "tone"
    assert DIALECTS["sglang"].fields(tone, temperature=0.0)["lora_path"] == "tone"
    llama = dialect("llamacpp", {"tone": 1, "legal": 0})
    assert llama.fields(tone, temperature=0.0)["lora"] == [{"id": 1, "scale": 1.0}]
    # llama.cpp applies loaded adapters at their start-up scale to a request without a lora list
    assert llama.fields(None, temperature=0.0)["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]
    with pytest.raises(Unsupported, match=r"adapter 'other' has no llama\.cpp adapter id .*lora_ids"):
        llama.fields(GenerationRequest(adapter="other"), temperature=0.0)
    with pytest.raises(Unsupported, match="known: none"):
        DIALECTS["llamacpp"].fields(tone, temperature=0.0)


def test_extra_is_merged_last_but_cannot_take_the_engines_fields() -> None:
    extra = GenerationRequest(temperature=0.5, extra='{"temperature": 0.1, "min_p": 0.05}')
    assert DIALECTS["vllm"].fields(extra, temperature=0.0) == {"temperature": 0.1, "min_p": 0.05}
    with pytest.raises(Unsupported, match="extra sets n, prompt"):
        DIALECTS["vllm"].fields(GenerationRequest(extra='{"prompt": [1], "n": 2}'), temperature=0.0)


def test_an_invalid_request_is_refused_with_its_problem() -> None:
    both = GenerationRequest(json_schema=SCHEMA, regex="a")
    with pytest.raises(Unsupported, match="invalid request: more than one structured-output constraint"):
        DIALECTS["vllm"].fields(both, temperature=0.0)


def test_equal_requests_give_equal_fields() -> None:
    one = GenerationRequest(seed=3, json_schema=SCHEMA, stop=("x",))
    other = GenerationRequest(seed=3, json_schema=SCHEMA, stop=("x",))
    for d in DIALECTS.values():
        assert d.fields(one, temperature=0.0) == d.fields(other, temperature=0.0)


def test_a_choice_grammar_escapes_what_gbnf_literals_need() -> None:
    assert choices_grammar(('say "hi"', "a\\b", "two\nlines", "\x01")) == (
        'root ::= "say \\"hi\\"" | "a\\\\b" | "two\\nlines" | "\\x01"'
    )

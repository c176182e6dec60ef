"""A real llama-server (processor/local/llm/), started and stopped through ``tokenfabric llm``: health,
token-id prompts in one request, the slots' prompt cache measured by the server, several named servers, stop.

No skip: the module fixture builds llama-server through the project's own code when the machine's cache
lacks it (about 13 minutes on 2 cores, once per machine; ``tokenfabric llm build`` does it ahead). Server
state goes to a temporary ``$TOKENFABRIC_HOME``, so a developer's own servers are never touched.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.cli.llm import main as llm_main
from processor.local.llm.build import build_server
from processor.local.llm.model import ensure_model
from processor.local.llm.server import server_status
from tests.common import get

pytestmark = pytest.mark.llm

NAME = "pytest-llm"

PREFIX = [2023, 2003, 1037, 3231, 1997, 1996, 3145, 3677, 2005, 7861, 2361, 2013, 1996, 2190, 2173, 2000]
"""Sixteen WordPiece ids ("this is a test of the ..."): the shared prefix of the cache scenario."""


def _start(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, str], str]:
    code = llm_main(["start", *argv])
    captured = capsys.readouterr()
    fields = dict(line.split("=", 1) for line in captured.out.splitlines() if "=" in line)
    return code, fields, captured.err


@pytest.fixture(scope="module")
def llm_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Runtime state in a temporary home; llama-server and the model come from the machine's cache."""
    build_server(progress=print)
    ensure_model()
    home = tmp_path_factory.mktemp("llm-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOKENFABRIC_HOME", str(home))
        yield home
        for name in (NAME, f"{NAME}-b"):
            llm_main(["stop", "--name", name])


@pytest.fixture(scope="module")
def server_url(llm_home: Path) -> str:
    code = llm_main(["start", "--name", NAME, "--slots", "2", "--ctx-tokens", "2048", "--threads", "1"])
    assert code == 0
    info = server_status(NAME)
    assert info is not None
    return info.url


def _post(url: str, body: dict[str, Any], timeout_s: float = 60.0) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def _complete(url: str, prompt: list[int] | list[list[int]], max_tokens: int = 4) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 7}
    answer: dict[str, Any] = _post(f"{url}/v1/completions", body)
    return answer


def test_health_is_ok(server_url: str) -> None:
    status, body = get(f"{server_url}/health")
    assert status == 200
    assert json.loads(body) == {"status": "ok"}


def test_a_list_of_token_id_prompts_gets_one_choice_each(server_url: str) -> None:
    prompts = [PREFIX[:5], [*PREFIX[:3], 4937], PREFIX]
    answer = _complete(server_url, prompts, max_tokens=3)
    choices = sorted(answer["choices"], key=lambda choice: choice["index"])
    assert [choice["index"] for choice in choices] == [0, 1, 2]
    assert all(
        isinstance(choice["text"], str) and choice["finish_reason"] in ("length", "stop")
        for choice in choices
    )
    # llama.cpp answers a list with ONE usage, the first prompt's (its choices are merged into the first
    # result): per-item token counts need one prompt per request, or the native /completion endpoint.
    usage = answer["usage"]
    assert usage["prompt_tokens"] == len(prompts[0])  # the ids reach the model as sent: nothing added
    assert usage["completion_tokens"] == 3


def test_the_native_endpoint_reports_each_prompts_cached_tokens(server_url: str) -> None:
    prompts = [[*PREFIX, 2003], PREFIX[:4]]
    _post(f"{server_url}/completion", {"prompt": prompts[0], "n_predict": 1, "temperature": 0})
    answer = _post(f"{server_url}/completion", {"prompt": prompts, "n_predict": 2, "temperature": 0})
    assert isinstance(answer, list) and [item["index"] for item in answer] == [0, 1]
    first, second = answer
    assert first["tokens_evaluated"] == len(prompts[0]) and second["tokens_evaluated"] == len(prompts[1])
    assert first["timings"]["cache_n"] >= len(PREFIX)  # the same prompt again: all but the last token
    assert first["timings"]["cache_n"] + first["timings"]["prompt_n"] == len(prompts[0])


def test_a_repeated_prefix_is_served_from_the_slots_cache(server_url: str) -> None:
    first = _complete(server_url, [*PREFIX, 2003, 2009])
    second = _complete(server_url, [*PREFIX, 2079, 2017, 2113])
    details = second["usage"]["prompt_tokens_details"]
    assert second["usage"]["prompt_tokens"] == len(PREFIX) + 3
    assert details["cached_tokens"] >= len(PREFIX), (first["usage"], second["usage"])
    assert details["cached_tokens"] < second["usage"]["prompt_tokens"]  # the differing tail is computed


def test_a_second_start_of_the_same_name_says_it_is_already_running(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    running = server_status(NAME)
    assert running is not None
    code, fields, err = _start(capsys, "--name", NAME)
    assert code == 0
    assert "already running" in err
    assert fields["url"] == server_url and int(fields["pid"]) == running.pid


def test_a_second_name_runs_beside_the_first_and_stops_alone(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    other = f"{NAME}-b"
    code, fields, _ = _start(capsys, "--name", other, "--slots", "1", "--ctx-tokens", "512")
    assert code == 0
    assert fields["url"].startswith("http://127.0.0.1:") and fields["url"] != server_url
    assert get(f"{fields['url']}/health")[0] == 200
    assert llm_main(["status"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("url=")]
    assert sorted(listed) == sorted([f"url={server_url}", f"url={fields['url']}"])

    assert llm_main(["stop", "--name", other]) == 0
    assert capsys.readouterr().out == "stopped\n"
    assert server_status(other) is None
    assert get(f"{fields['url']}/health", timeout_s=2.0)[0] == 0  # nothing listens any more
    assert llm_main(["status", "--name", other]) == 1
    assert get(f"{server_url}/health")[0] == 200  # the first one is untouched

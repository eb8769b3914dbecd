"""`make serve` (python -m pipeline serve-local): a local run's model served on OpenAI's API by
`transformers serve`, as README's "Serve it" runs it, after the same curl and openai calls the
deploy step's Markdown gives. The server answering them, word for word the CLI's greedy reply:
tests/workload/models/test_serve.py, which starts it the same way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.__main__ import main, serve_local


def a_run_with_a_model(root: Path) -> Path:
    model = root / "demo" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    return model


def test_make_serve_prints_the_calls_then_becomes_the_server(tmp_path, monkeypatch, capsys):
    model = a_run_with_a_model(tmp_path)
    became: list = []
    monkeypatch.setattr("os.execve", lambda path, argv, env: became.append((path, argv, env)))
    main(["serve-local", "--root", str(tmp_path), "--run", "demo"])
    ((path, argv, env),) = became
    assert argv == [str(Path(sys.executable).with_name("transformers")), "serve", str(model),
                    "--host", "127.0.0.1", "--port", "8000", "--device", "cpu"]  # fmt: skip
    assert path == argv[0]
    # a cache of its own (its /v1/models needs one), nothing downloaded
    assert env["HF_HOME"] == str(tmp_path / "hf-home") and env["HF_HUB_OFFLINE"] == "1"
    said = capsys.readouterr().out
    assert said.startswith(f"serving {model} on http://localhost:8000/v1 (Ctrl-C stops it)")
    assert ("curl http://localhost:8000/v1/completions -H 'content-type: application/json' \\\n"
            f"    -d '{{\"model\": \"{model}\", \"prompt\": \"The\", \"max_tokens\": 16, "
            "\"temperature\": 0}'") in said  # fmt: skip
    assert "client = OpenAI(base_url='http://localhost:8000/v1', api_key=\"unused\")" in said
    assert f"model={str(model)!r}" in said


def test_the_calls_are_the_deploy_steps_own(tmp_path):
    """One writer of the calls for both: the deploy step's Markdown and make serve's lines."""
    from components.serving.completion import Endpoint, curl_call, openai_call

    model = a_run_with_a_model(tmp_path)
    lines: list[str] = []
    serve_local(tmp_path, "demo", "127.0.0.1", 8001, say=lines.append)
    endpoint = Endpoint("http://localhost:8001/v1", str(model))
    assert curl_call(endpoint) in lines[0] and openai_call(endpoint) in lines[0]


def test_the_calls_ask_no_more_than_the_models_context_holds(tmp_path):
    """A model of 8 positions: "The" and 5 tokens (a server refuses more than its context)."""
    model = a_run_with_a_model(tmp_path)
    (model / "config.json").write_text('{"max_position_embeddings": 8}')
    lines: list[str] = []
    serve_local(tmp_path, "demo", "127.0.0.1", 8000, say=lines.append)
    assert '"max_tokens": 5' in lines[0] and "max_tokens=5," in lines[0]


def test_a_run_without_a_model_is_one_line(tmp_path, capsys):
    assert main(["serve-local", "--root", str(tmp_path), "--run", "none"]) == 2
    assert capsys.readouterr().err == (
        f"python -m pipeline serve-local: error: {tmp_path / 'none' / 'model'}: no model there; "
        "train one first (make demo)\n")


@pytest.mark.parametrize("host,shown", [("127.0.0.1", "localhost"), ("0.0.0.0", "localhost"),
                                        ("myhost", "myhost")])  # fmt: skip
def test_the_calls_name_where_the_server_listens(tmp_path, host, shown):
    a_run_with_a_model(tmp_path)
    lines: list[str] = []
    serve_local(tmp_path, "demo", host, 9000, say=lines.append)
    assert f"http://{shown}:9000/v1/completions" in lines[0]

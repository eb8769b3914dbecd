"""A run's model served by `transformers serve`, read by the official `openai` client: the
streamed greedy completion is our CLI's greedy reply, word for word (README, "Serve it"), for
the default model (GPT-NeoX) and for GPT-2's shape (what a run fine-tuned from GPT-2 exports)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.models import CORPUS, PROMPTS, cli_replies, peaked
from support.servers import free_ports, wait_until_answering

from gpt.models.export import save_export
from gpt.models.model import GPTConfig
from gpt.rundir.layout import RunDir
from gpt.tokenizer.kinds import GPT2Tokenizer

openai = pytest.importorskip("openai")
SERVE = Path(sys.executable).with_name("transformers")
START_S = 120


# The default shape (a GPTNeoXForCausalLM export), and GPT-2's (a GPT2LMHeadModel: learned
# positions, gelu_new, biases), which a run fine-tuned from GPT-2 (--init_from gpt2) exports.
SHAPES = {"default": {}, "gpt2": {"position": "learned", "activation": "gelu_new", "bias": True}}


@pytest.fixture(params=SHAPES)
def run(request, tmp_path) -> RunDir:
    """A run whose model/ has the shape on the compact tokenizer of the embedded corpus."""
    tokenizer = GPT2Tokenizer.fit([CORPUS])
    config = GPTConfig(dropout=0.0, vocab_size=tokenizer.vocab_size, **SHAPES[request.param])
    rundir = RunDir.of(tmp_path, "served")
    save_export(peaked(config), tokenizer, rundir.model_dir,
                finetuned_from="gpt2" if request.param == "gpt2" else "")  # fmt: skip
    return rundir


@pytest.fixture
def server(run: RunDir, tmp_path):
    """`transformers serve <model dir>` as the README runs it, offline, on a free port."""
    if not SERVE.exists():
        pytest.skip(f"{SERVE} missing: install the serve extra")
    [port] = free_ports(1)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1"}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [str(SERVE), "serve", str(run.model_dir), "--host", "127.0.0.1", "--port", str(port),
         "--device", "cpu"], env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(f"{url}/health", proc, tmp_path / "serve.log", START_S,
                             "transformers serve")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_the_openai_clients_streamed_greedy_completion_is_our_clis_reply(run, server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == [str(run.model_dir)]
    n = 24
    for prompt, ours in zip(PROMPTS, cli_replies(run, PROMPTS, n), strict=True):
        stream = client.completions.create(model=str(run.model_dir), prompt=prompt,
                                           max_tokens=n, temperature=0, stream=True)  # fmt: skip
        pieces = [choice.text for chunk in stream for choice in chunk.choices]
        assert len(pieces) > 1, "not streamed"
        # A character the last token cuts short ends our reply as U+FFFD (repl.py's
        # _Streamed.end); transformers serve leaves it out. Every whole character is the same.
        assert "".join(pieces) == ours.removesuffix("\ufffd"), prompt

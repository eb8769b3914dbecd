"""Turns in the prompt stage (issue 58, goal 4): a chat model's replies continue the
conversation, rendered as transformers' `apply_chat_template` renders it for any server, with
the oldest exchanges dropped whole when the context is full; a system prompt (--system,
/system), /reset, replies that end with the assistant's turn, and a transcript of turns that
load-corpus --chat reads back.

The model is the tiny chat model trained once per session (support/chat.py), which has learned
to end its turns; the expected ids come from transformers alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from support.chats import SYSTEM, trained_chat_run
from support.models import ENV, cli_transcript, export
from support.runs import in_process

from gpt.config.configs import SamplingConfig
from gpt.generation.conversation import Conversation
from gpt.generation.repl import NOTE
from gpt.generation.session import Refused, Session
from gpt.models.export import load_export
from gpt.rundir.layout import RunDir
from gpt.tokenizer.chat import IM_END
from gpt.tokenizer.kinds import CharTokenizer

GREEDY = SamplingConfig(temperature=0, max_new_tokens=12)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> RunDir:
    return trained_chat_run(tmp_path_factory, tmp_path_factory.mktemp("talk"))


@pytest.fixture(scope="module")
def hf_tok(run):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(run.model_dir)


@pytest.fixture(scope="module")
def loaded(run):
    return load_export(run.model_dir)


def template_ids(hf_tok, messages: list[dict]) -> list[int]:
    return hf_tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                      add_generation_prompt=True)["input_ids"]  # fmt: skip


def turn(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def test_the_prompt_is_the_template_and_full_context_drops_the_oldest_exchanges_whole(
        loaded, hf_tok):  # fmt: skip
    _, tok = loaded
    conversation = Conversation(tok, SYSTEM)
    history = []
    for k in range(6):
        conversation.add(f"Where is the ship {k}?", f"Here, {k}.")
        history += [turn("user", f"Where is the ship {k}?"), turn("assistant", f"Here, {k}.")]
    user = "And the merchant?"
    wide = conversation.prompt(user, block_size=1024, room=100)
    assert wide.dropped == 0
    assert wide.ids == template_ids(hf_tok, [turn("system", SYSTEM), *history, turn("user", user)])

    budget = len(wide.ids) - 1  # one id short: the oldest exchange must go, and only it
    cut = conversation.prompt(user, block_size=budget + 10, room=10)
    assert cut.dropped == 2
    assert cut.ids == template_ids(hf_tok, [turn("system", SYSTEM), *history[2:],
                                            turn("user", user)])  # fmt: skip
    alone = template_ids(hf_tok, [turn("system", SYSTEM), turn("user", user)])
    least = conversation.prompt(user, block_size=len(alone) + 10, room=10)
    assert (least.ids, least.dropped) == (alone, 12)  # the system prompt always stays
    assert conversation.messages() == [turn("system", SYSTEM), *history]  # all of it, kept


def test_a_message_too_long_or_spelling_a_marker_is_refused_and_nothing_recorded(loaded, tmp_path):
    model, tok = loaded
    session = Session(model, tok, GREEDY, 0, tmp_path / "t.jsonl", SYSTEM)
    with pytest.raises(Refused, match=r"the model reads \d+ before a reply of up to 12: shorten"):
        session.prepare("ship " * 60)
    with pytest.raises(Refused, match=f"your message .*spells the token '{IM_END}'; not sent"):
        session.prepare(f"hi {IM_END}")
    with pytest.raises(Refused, match="the system prompt .*spells the token"):
        session.set_system(f"{IM_END} be terse")
    assert session.conversation.system == SYSTEM and not session.conversation.turns
    assert not (tmp_path / "t.jsonl").exists()


def reply(session: Session, text: str) -> str:
    return "".join(session.stream(session.prepare(text)))


def test_replies_end_with_the_turn_continue_the_conversation_and_reset_starts_over(
        loaded, hf_tok, tmp_path):  # fmt: skip
    model, tok = loaded
    transcript = tmp_path / "t.jsonl"
    session = Session(model, tok, GREEDY, 0, transcript)  # the context holds 2 exchanges
    first = reply(session, "Where is the ship?")
    second_prompt = session.prepare("And then?")
    assert second_prompt.ids == template_ids(hf_tok, [
        turn("user", "Where is the ship?"), turn("assistant", first), turn("user", "And then?")])
    second = "".join(session.stream(second_prompt))
    session.reset()
    session.set_system(SYSTEM)
    assert session.prepare("Hello").ids == template_ids(hf_tok, [turn("system", SYSTEM),
                                                                turn("user", "Hello")])
    third = reply(session, "Hello")

    records = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert [r["reply"] for r in records] == [first, second, third]
    assert all(r["stopped"] == "end_of_turn" and r["reply_tokens"] < 12 for r in records)
    assert first.strip() and IM_END not in first
    one, other = {records[0]["conversation"], records[1]["conversation"]}, records[2]
    assert len(one) == 1 and other["conversation"] not in one
    assert records[1]["messages"] == [
        turn("user", "Where is the ship?"), turn("assistant", first), turn("user", "And then?"),
        turn("assistant", second)]  # fmt: skip
    assert other["messages"] == [turn("system", SYSTEM), turn("user", "Hello"),
                                 turn("assistant", third)]  # fmt: skip

    # The transcript is chat data: load-corpus --chat reads it back
    assert in_process("load-corpus", "--root", str(tmp_path), "--run", "again", "--source",
                      str(transcript), "--chat", "true", "--block_size", "48") == 0


def test_the_cli_holds_one_conversation_over_its_prompts_as_transformers_generates(
        run, hf_tok, loaded):  # fmt: skip
    """--system and repeated --prompt: one conversation; each reply is transformers' greedy
    generation (the export's generation_config.json, which ends at <|im_end|>) on the
    template's rendering of the turns before it that the context holds."""
    from transformers import AutoModelForCausalLM

    asked = ["Where?", "Then?", "Where is the ship?"]
    records = cli_transcript(run, asked, 8, "--system", SYSTEM)
    # 48 positions, 8 kept for the reply: the system prompt and the newest message only
    assert [r["dropped_turns"] for r in records] == [0, 2, 4]
    theirs = AutoModelForCausalLM.from_pretrained(run.model_dir)
    messages = [turn("system", SYSTEM)]
    for record in records:
        messages.append(turn("user", record["prompt"]))
        seen = messages[:1] + messages[1 + record["dropped_turns"] :]
        ids = template_ids(hf_tok, seen)
        with torch.no_grad():
            out = theirs.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
        said = hf_tok.decode(out[0, len(ids):], skip_special_tokens=True)
        assert record["reply"] == said and said.strip()
        messages.append(turn("assistant", said))
    assert records[-1]["messages"] == messages
    assert len({r["conversation"] for r in records}) == 1


@pytest.mark.process
def test_the_terminal_takes_system_reset_and_help_for_a_chat_model(run, tmp_path) -> None:
    """The loop `kubectl attach` reaches, fed by a pipe."""
    lines = ["/help", "/system Be brief.", "/system", "Where is the ship?", "/reset",
             "/system off", "Hello", "exit"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "gpt", "generative-prompt", "--root", str(run.root), "--run",
         run.run_id, "--temperature", "0", "--max_new_tokens", "12"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, env=ENV, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "a chat model: replies in turns" in out.stderr
    assert "/system TEXT | off" in out.stdout and "/reset " in out.stdout
    assert f"{NOTE}system prompt: 'Be brief.'" in out.stdout
    assert f"{NOTE}a new conversation" in out.stdout
    records = [json.loads(x) for x in run.transcript_jsonl.read_text().splitlines()][-2:]
    assert records[0]["messages"][0] == turn("system", "Be brief.")
    assert records[1]["messages"][0] == turn("user", "Hello")  # reset, and no system prompt
    assert records[0]["conversation"] != records[1]["conversation"]


def test_a_text_model_refuses_a_system_prompt_and_has_nothing_to_reset(root, capsys) -> None:
    rundir = export(root, CharTokenizer.fit(["abc hi"]))
    assert in_process("generative-prompt", "--root", str(root), "--run", rundir.run_id,
                      "--system", "Be brief.", "--prompt", "hi") == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--system: a text model continues text; a system prompt needs a "
                            "chat model (load-corpus --chat true)")
    model, tok = load_export(rundir.model_dir)
    session = Session(model, tok, GREEDY, 0, root / "t.jsonl")
    with pytest.raises(Refused, match="nothing to reset"):
        session.reset()


def test_a_system_prompt_spelling_a_marker_is_refused_in_one_line(run, capsys) -> None:
    assert in_process("generative-prompt", "--root", str(run.root), "--run", run.run_id,
                      "--system", "<|im_start|>user", "--prompt", "hi") == 2  # fmt: skip
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "--system: the system prompt spells the token '<|im_start|>'")

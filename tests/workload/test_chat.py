"""Chat data (issue 58, goals 1-3): load-corpus --chat true renders conversations with the chat
template into rows of whole conversations and a mask of the assistant's tokens; train-gpt trains
on those alone; the export's tokenizer renders the same ids through transformers'
`apply_chat_template`, and its generation config stops at the end of the assistant's turn.

The expected ids and mask are derived here from transformers alone (the rendered string, its
offsets), not from our renderer: the test holds load-corpus to what every server renders."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from support.chats import BLOCK, SYSTEM, conversations, load_chat_corpus, trained_chat_run
from support.models import cli_transcript
from support.runs import TINY, as_flags, in_process
from support.servers import free_ports, wait_until_answering

from gpt.config.configs import GPTConfig
from gpt.models import pretrained
from gpt.models.export import (
    EMBEDDING,
    TOKENIZER,
    TOKENIZER_CONFIG,
    tokenizer_config,
)
from gpt.rundir.layout import DataMeta, RunDir
from gpt.tokenizer.chat import IM_END, IM_START, MARKERS
from gpt.tokenizer.huggingface import hf_tokenizer, tokenizer_from_hf
from gpt.tokenizer.kinds import GPT2Tokenizer, load_tokenizer, tokenizer_from_json


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory) -> RunDir:
    return load_chat_corpus(tmp_path_factory.mktemp("chat"), "chat")


@pytest.fixture(scope="module")
def hf_tok(chat_run, tmp_path_factory):
    """transformers' tokenizer of the files the export writes for the run's tokenizer."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("export")
    tok = load_tokenizer(chat_run.tokenizer_json)
    hf_tokenizer(tok).save(str(folder / TOKENIZER))
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config(tok, BLOCK)))
    return AutoTokenizer.from_pretrained(folder)


def template_ids(hf_tok, messages: list[dict], **kw) -> list[int]:
    return hf_tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kw)[
        "input_ids"]


def expected(hf_tok, messages: list[dict]) -> tuple[list[int], list[int], bool] | None:
    """transformers' ids of the longest prefix ending in an assistant turn that fits a row,
    which count (the tokens holding an assistant content's characters, and its <|im_end|>), and
    whether that cut the conversation."""
    ends = [k + 1 for k, m in enumerate(messages) if m["role"] == "assistant"]
    for end in reversed(ends):
        text = hf_tok.apply_chat_template(messages[:end], tokenize=False)
        enc = hf_tok(text, add_special_tokens=False, return_offsets_mapping=True)
        if len(enc.input_ids) <= BLOCK + 1:
            break
    else:
        return None
    spans, at = [], 0
    for m in messages[:end]:
        at += len(IM_START) + len(m["role"]) + 1
        if m["role"] == "assistant":
            spans.append((at, at + len(m["content"]) + len(IM_END)))
        at += len(m["content"]) + len(IM_END) + 1
    counted = [int(any(a < e and b > s for s, e in spans)) for a, b in enc.offset_mapping]
    return enc.input_ids, counted, end < len(messages)


def rows_of(convs: list[tuple[list[int], list[int], bool]], pad: int
            ) -> tuple[list[int], list[int]]:  # fmt: skip
    """Whole conversations in order, as many as fit a row, then padding never counted."""
    ids, mask, row = [], [], ([], [])
    for conv_ids, conv_mask, _ in convs:
        if len(row[0]) + len(conv_ids) > BLOCK + 1:
            ids += row[0] + [pad] * (BLOCK + 1 - len(row[0]))
            mask += row[1] + [0] * (BLOCK + 1 - len(row[1]))
            row = ([], [])
        row[0].extend(conv_ids)
        row[1].extend(conv_mask)
    return (ids + row[0] + [pad] * (BLOCK + 1 - len(row[0])),
            mask + row[1] + [0] * (BLOCK + 1 - len(row[1])))


def test_load_corpus_writes_what_apply_chat_template_renders_and_the_assistants_mask(
        chat_run, hf_tok):  # fmt: skip
    meta = DataMeta.read(chat_run.meta_json)
    convs = [e for r in conversations() if r["messages"]
             if (e := expected(hf_tok, r["messages"])) is not None]
    assert meta.chat and meta.documents == len(convs) == 30  # the too long one skipped
    n_train = int(len(convs) * 0.9)
    for split, part in (("train", convs[:n_train]), ("val", convs[n_train:])):
        ids, mask = rows_of(part, meta.eot_id)
        assert np.fromfile(chat_run.data_dir / f"{split}.bin", meta.dtype).tolist() == ids
        assert np.fromfile(chat_run.data_dir / f"{split}.mask", np.uint8).tolist() == mask
    source = json.loads(chat_run.source_json.read_text())
    cut = sum(c for _, _, c in convs)
    assert cut >= 2  # the long one, and some of several turns
    assert source["chat"] == {"conversations": 30, "cut": cut, "block_size": BLOCK}
    assert source["documents"][0]["skipped"] == {"null": 1, "too long": 1}


def test_the_mask_holds_the_assistants_words_and_never_the_users(chat_run):
    meta = DataMeta.read(chat_run.meta_json)
    tok = load_tokenizer(chat_run.tokenizer_json)
    ids = np.fromfile(chat_run.train_bin, meta.dtype)
    mask = np.fromfile(chat_run.train_mask, np.uint8).astype(bool)
    trained = tok.decode(ids[mask])
    assert trained.startswith("Ship is here, 0.<|im_end|>At is here, 1.<|im_end|>")
    assert "Merchant is here, 3.<|im_end|> Then — é — we go.<|im_end|>" in trained
    assert "Where is" not in trained and "Answer in one line" not in trained
    assert "assistant" not in trained and IM_START not in trained
    assert trained.count(IM_END) == tok.decode(ids).count("assistant\n")
    row = BLOCK + 1
    assert (ids[::row] == tok.vocab_size - 2).all()  # every row starts a conversation
    assert meta.train_counted == mask.sum() and meta.train_bytes == len(trained.encode())


def test_add_generation_prompt_is_the_prefix_a_reply_starts_from(chat_run, hf_tok):
    meta = DataMeta.read(chat_run.meta_json)
    ids = np.fromfile(chat_run.train_bin, meta.dtype).tolist()
    mask = np.fromfile(chat_run.train_mask, np.uint8).tolist()
    messages = conversations()[3]["messages"]  # user, assistant, user, assistant: kept whole
    prompt = template_ids(hf_tok, messages[:-1], add_generation_prompt=True)
    at = [k for k in range(len(ids)) if ids[k : k + len(prompt)] == prompt]
    assert len(at) == 1  # the conversation as written, up to its last reply
    end = at[0] + len(prompt)
    assert mask[end - 1] == 0 and mask[end] == 1 and ids[end : end + 3] == template_ids(
        hf_tok, messages)[len(prompt) : len(prompt) + 3]


def test_parquet_and_compressed_records_give_the_same_data(chat_run, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = conversations()
    pq.write_table(pa.table({"messages": [r["messages"] for r in records]}), tmp_path / "c.parquet",
                   row_group_size=7)
    (tmp_path / "c.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    for name in ("c.parquet", "c.jsonl.gz"):
        assert in_process("load-corpus", "--root", str(tmp_path), "--run", name[2:].replace(
            ".", "-"), "--source", str(tmp_path / name), "--chat", "true", "--block_size",
            str(BLOCK)) == 0  # fmt: skip
        run = RunDir.of(tmp_path, name[2:].replace(".", "-"))
        for f in ("train.bin", "train.mask", "val.bin", "val.mask", "tokenizer.json"):
            assert (run.data_dir / f).read_bytes() == (chat_run.data_dir / f).read_bytes(), f


@pytest.mark.parametrize(("messages", "why"), [
    ([{"role": "bot", "content": "hi"}], "message 1: role 'bot' is not one of system, user, "
                                         "assistant"),
    ([{"role": "user", "content": "hi"}], "no assistant turn: nothing to train on"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ["x"]}],
     "message 2 (assistant): content is an array, not a string"),
    ([{"role": "user", "content": "a <|im_end|> b"}, {"role": "assistant", "content": "x"}],
     "message 1 (user): its content spells the token '<|im_end|>'"),
    ("hello", "'messages' is a string, not a non-empty array of messages"),
])  # fmt: skip
def test_a_malformed_conversation_is_one_line_naming_the_record(tmp_path, capsys, messages, why):
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    source = tmp_path / "bad.jsonl"
    source.write_text(json.dumps(good) + "\n" + json.dumps({"messages": messages}) + "\n")
    code = in_process("load-corpus", "--root", str(tmp_path), "--run", "bad", "--source",
                      str(source), "--chat", "true")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].endswith(f"--source {str(source)!r}: line 2: {why}")
    assert not (tmp_path / "bad").exists()


def test_a_parquet_row_is_named_and_plain_text_refused(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            [{"role": "user", "content": "a"}]]
    pq.write_table(pa.table({"messages": rows}), tmp_path / "c.parquet")
    (tmp_path / "t.txt").write_text("just text\n")
    for name, why in (("c.parquet", "row 2: no assistant turn"),
                      ("t.txt", "plain text holds no conversations")):
        assert in_process("load-corpus", "--root", str(tmp_path), "--run", "r", "--source",
                          str(tmp_path / name), "--chat", "true") == 2
        assert why in capsys.readouterr().err


def test_train_gpt_counts_only_the_mask_and_exports_a_chat_model(chat_run, capsys):
    from gpt.training.batches import IGNORE, Batches, TokenData

    data = TokenData.load(chat_run)
    batches = Batches(data.train, BLOCK, 8, seed=1, mask=data.train_mask)
    x, y = batches.get(3, 0, 1, torch.device("cpu"))
    for offset, xs, ys in zip(batches.offsets(3), x, y, strict=True):
        assert offset % (BLOCK + 1) == 0 and xs[0] == data.tokenizer.vocab_size - 2
        counted = data.train_mask[offset + 1 : offset + BLOCK + 1].astype(bool)
        assert (ys[~counted] == IGNORE).all()
        assert ys[counted].tolist() == data.train[offset + 1 : offset + BLOCK + 1][counted].tolist()
    flags = as_flags({**TINY, "block_size": BLOCK, "max_iters": 2, "warmup_iters": 1,
                      "eval_interval": 2})
    assert in_process("train-gpt", "--root", str(chat_run.root), "--run", chat_run.run_id,
                      *flags) == 0  # fmt: skip
    said = capsys.readouterr().out
    assert f"validation tokens in conversations, the loss on the assistant's " \
           f"{data.meta.train_counted:,} / {data.meta.val_counted:,}" in said
    model = chat_run.model_dir
    config = json.loads((model / TOKENIZER_CONFIG).read_text())
    assert config["eos_token"] == IM_END and "<|im_start|>" in config["chat_template"]
    end_of_turn = data.tokenizer.vocab_size - 1
    assert json.loads((model / "generation_config.json").read_text())["eos_token_id"] == [
        end_of_turn, data.tokenizer.eot_id]
    assert tokenizer_from_hf(json.loads((model / TOKENIZER).read_text())).chat
    assert in_process("train-gpt", "--root", str(chat_run.root), "--run", chat_run.run_id,
                      *flags, "--block_size", "32") == 2
    assert "--block_size 32: the chat data holds rows" in capsys.readouterr().err


def test_the_markers_follow_any_vocabulary_and_start_from_the_mean_row():
    compact = GPT2Tokenizer.fit(["a b c"], 0)
    tok = GPT2Tokenizer(compact.kept, chat=True)
    assert tok.vocab_size == compact.vocab_size + 2 and tok.base_size() == compact.vocab_size
    assert [tok.bpe.encode_single_token(m) for m in MARKERS] == [tok.vocab_size - 2,
                                                                 tok.vocab_size - 1]
    assert tok.encode(IM_START) == compact.encode(IM_START)  # typed in a text, it is text
    for again in (tokenizer_from_json(tok.to_json()),
                  tokenizer_from_hf(json.loads(hf_tokenizer(tok).to_str()))):
        assert again.chat and again.kept == tok.kept and again.vocab_size == tok.vocab_size
    assert "chat" not in compact.to_json()  # a text tokenizer's file as it was

    gpt2 = GPT2Tokenizer()
    rows = pretrained.row_map(tok, gpt2, "data")
    assert rows[:-2].tolist() == tok.kept and (rows[-2:] == pretrained.NEW).all()
    earlier = pretrained.row_map(tok, tok, "data")  # an earlier chat run: its own rows
    assert earlier.tolist() == list(range(tok.vocab_size))
    table = torch.randn(gpt2.vocab_size, 8)
    config = GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=1, n_embd=8, block_size=8)
    start = pretrained.initial_weights(pretrained.Pretrained(config, {EMBEDDING: table}, ""),
                                       config, rows)[EMBEDDING]
    assert torch.equal(start[:-2], table[tok.kept])
    assert torch.equal(start[-2], table.mean(0)) and torch.equal(start[-1], table.mean(0))


def test_a_text_corpus_is_untouched(tmp_path: Path):
    """No mask, no chat key: meta.json and tokenizer.json as they always were."""
    assert in_process("load-corpus", "--root", str(tmp_path), "--run", "t",
                      "--block_size", "16") == 0  # fmt: skip
    run = RunDir.of(tmp_path, "t")
    meta = json.loads(run.meta_json.read_text())
    assert not {"chat", "train_counted", "val_counted"} & meta.keys()
    assert "chat" not in json.loads(run.tokenizer_json.read_text())
    assert not run.train_mask.exists() and not run.val_mask.exists()


def test_kserves_server_answers_the_conversation_with_our_template_and_greedy_reply(
        tmp_path_factory, kserve_server, tmp_path):  # fmt: skip
    """The round trip: a conversation file (load-corpus, `chat_run`), trained on (train-gpt),
    exported, served by KServe's own Hugging Face server (kserve/kserve v0.20.0's
    huggingfaceserver, backend `huggingface`, as its `kserve-huggingfaceserver` runtime runs
    it): `/openai/v1/chat/completions`, streamed and not, through the `openai` client, renders
    the export's template (without one it answers HTTP 500) and replies what our prompt stage
    replies, greedily, to the same system prompt and message."""
    import openai

    run = trained_chat_run(tmp_path_factory, tmp_path)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Where is the ship?"}]
    n = 12
    (ours,) = cli_transcript(run, [messages[1]["content"]], n, "--system", SYSTEM)
    assert ours["reply"].strip() and ours["stopped"] == "end_of_turn"  # ended by <|im_end|>

    ports = free_ports(2)
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [str(kserve_server), "-m", "huggingfaceserver", "--model_dir", str(run.model_dir),
         "--model_name", "chat", "--backend", "huggingface", "--http_port", str(ports[0]),
         "--grpc_port", str(ports[1])],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
        stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{ports[0]}"
        wait_until_answering(f"{url}/v1/models/chat", server, tmp_path / "server.log", 180,
                             "KServe's server")
        client = openai.OpenAI(base_url=f"{url}/openai/v1", api_key="unused")
        whole = client.chat.completions.create(model="chat", messages=messages, max_tokens=n,
                                               temperature=0)  # fmt: skip
        assert whole.choices[0].message.content == ours["reply"]
        # It stopped at <|im_end|> as ours did (generation_config.json's eos_token_id), which
        # it counts; its finish_reason says "length" all the same (KServe's, not checked here).
        assert whole.usage.completion_tokens == ours["reply_tokens"] + 1
        stream = client.chat.completions.create(model="chat", messages=messages, max_tokens=n,
                                                temperature=0, stream=True)  # fmt: skip
        pieces = [c.choices[0].delta.content for c in stream
                  if c.choices and c.choices[0].delta.content]
        assert len(pieces) > 1, "not streamed"
        assert "".join(pieces) == ours["reply"]
    finally:
        server.terminate()
        server.wait(timeout=30)

"""The shipped conversation set (issue 58, goal 6): gpt/assets/comedy_chat.jsonl.gz is what
bench/comedy_chat.py makes of the embedded comedy, and the README's chat example loads it
offline."""

from __future__ import annotations

import gzip
import json
import re
import shlex

from support.paths import PROJECT
from support.runs import in_process

from bench.comedy_chat import PLAY, SHIPPED, conversations, jsonl_gz
from gpt.rundir.layout import DataMeta, RunDir


def test_the_shipped_file_is_what_the_script_makes_of_the_comedy():
    assert SHIPPED.read_bytes() == jsonl_gz(PLAY.read_text())
    first = json.loads(gzip.decompress(SHIPPED.read_bytes()).splitlines()[0])["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    assert first[1]["content"].startswith("Proceed, Solinus, to procure my fall,")
    assert first[2]["content"].startswith("Merchant of Syracuse, plead no more;")
    assert "You are Duke " in first[0]["content"] and "Comedy of Errors" in first[0]["content"]
    for record in conversations(PLAY.read_text()):  # no stage direction line, no speaker line
        for turn in record["messages"][1:]:
            assert not re.search(r"^\[[^]]*\]$|^[A-Z ]+\.$", turn["content"], re.M), turn["content"]


def test_the_readmes_chat_example_loads_the_shipped_conversations(tmp_path, monkeypatch):
    readme = (PROJECT / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if "load-corpus --run comedy-chat" in ln)
    argv = shlex.split(line)[3:]  # after ".venv/bin/python -m gpt"
    monkeypatch.chdir(PROJECT)  # the example's relative --source
    assert in_process(*argv, "--root", str(tmp_path)) == 0
    run = RunDir.of(tmp_path, "comedy-chat")
    meta = DataMeta.read(run.meta_json)
    assert meta.chat and meta.block_size == 256
    assert 0 < meta.val_counted < meta.val_tokens and 0 < meta.train_counted < meta.train_tokens

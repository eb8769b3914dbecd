"""`python -m bench.comedy_chat`: the shipped conversation set, made from the embedded comedy.

gpt/assets/comedy_chat.jsonl.gz holds one conversation per pair of consecutive speeches of a
scene of *The Comedy of Errors* (gpt/assets/comedy_of_errors.txt, public domain) by two
different characters: a system line naming the play and the character who replies, the first
speech as the user's turn, the reply as the assistant's. Stage directions (bracketed lines, on
one line or several) are left out; a speech's lines keep their breaks. Deterministic: the same
text gives the same bytes (the gzip header carries no time or name), so
tests/workload/test_comedy_chat.py holds the shipped file to this script.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "gpt" / "assets"
PLAY, SHIPPED = ASSETS / "comedy_of_errors.txt", ASSETS / "comedy_chat.jsonl.gz"
SPEAKER = re.compile(r"^[A-Z][A-Z '-]*[A-Z]\.$")  # "DROMIO OF SYRACUSE."
SYSTEM = "You are {who} in Shakespeare's The Comedy of Errors. Answer in character."


def scenes(text: str) -> Iterator[list[tuple[str, str]]]:
    """Each scene's speeches in order, (speaker, speech); the cast list before Act I is none."""
    speeches: list[tuple[str, str]] = []
    speaker, lines = None, []
    started = direction = False
    for line in text.splitlines() + [""]:
        line = line.rstrip()
        if direction or line.startswith("["):  # a stage direction, over one line or several
            direction = "]" not in line
        elif line.startswith(("ACT ", "SCENE ")) and line != line.lower():
            if speaker and lines:
                speeches.append((speaker, "\n".join(lines)))
            if started and speeches:
                yield speeches
            speeches, speaker, lines, started = [], None, [], started or line.startswith("ACT ")
        elif started and SPEAKER.match(line):
            if speaker and lines:
                speeches.append((speaker, "\n".join(lines)))
            speaker, lines = line[:-1], []
        elif speaker and line:
            lines.append(line.strip())
    if speaker and lines:
        speeches.append((speaker, "\n".join(lines)))
    if speeches:
        yield speeches


def conversations(text: str) -> Iterator[dict]:
    """One conversation per two consecutive speeches of a scene by different characters."""
    for speeches in scenes(text):
        for (asker, asked), (replier, reply) in pairwise(speeches):
            if asker != replier:
                who = replier.title().replace(" Of ", " of ")
                yield {"messages": [{"role": "system", "content": SYSTEM.format(who=who)},
                                    {"role": "user", "content": asked},
                                    {"role": "assistant", "content": reply}]}  # fmt: skip


def jsonl_gz(text: str) -> bytes:
    """The conversations as gzip'd JSON Lines, the same bytes for the same text."""
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        for record in conversations(text):
            gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode())
    return out.getvalue()


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else SHIPPED
    target.write_bytes(jsonl_gz(PLAY.read_text()))
    print(f"{target}: {sum(1 for _ in conversations(PLAY.read_text()))} conversations")

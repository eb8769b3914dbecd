"""GPT-2's BPE as shipped in `gpt/assets/`: its ranks file (checked against its sha256, never
downloaded, never tiktoken's cache), its tiktoken Encoding, and the merges it implies."""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
from importlib import resources
from pathlib import Path

import tiktoken

# OpenAI's r50k_base.tiktoken (= GPT-2's vocabulary), gzipped; sha256 of the decompressed bytes.
RANKS_ASSET = "r50k_base.tiktoken.gz"
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pre-tokenizer split pattern and its one special token, as in tiktoken_ext.openai_public.
GPT2_PAT_STR = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
ENDOFTEXT = "<|endoftext|>"
GPT2_EOT = 50256


def read_ranks(path: Path) -> dict[bytes, int]:
    """Parse a gzipped `.tiktoken` ranks file (`base64(token) rank` per line), sha256-checked."""
    data = gzip.decompress(path.read_bytes())
    digest = hashlib.sha256(data).hexdigest()
    if digest != RANKS_SHA256:
        # A damaged installation, not bad user input: fail loudly with the evidence.
        raise RuntimeError(f"{path}: sha256 {digest} != expected {RANKS_SHA256}; reinstall")
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def gpt2_ranks() -> dict[bytes, int]:
    """GPT-2's tokens and their ranks (= ids), from the shipped ranks file."""
    with resources.as_file(resources.files("gpt.assets") / RANKS_ASSET) as path:
        return read_ranks(path)


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """GPT-2's BPE as a tiktoken Encoding, built offline from the shipped ranks."""
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=gpt2_ranks(),
        special_tokens={ENDOFTEXT: GPT2_EOT},
        explicit_n_vocab=GPT2_EOT + 1,
    )


@functools.cache
def gpt2_tokens() -> tuple[bytes, ...]:
    """The bytes of every GPT-2 token by id (end-of-text spelt out)."""
    tokens = dict.fromkeys(range(GPT2_EOT + 1), ENDOFTEXT.encode())
    tokens.update((t, g) for g, t in gpt2_ranks().items())
    return tuple(tokens.values())


@functools.cache
def merge_parts(gpt2_id: int) -> tuple[int, int] | None:
    """The two GPT-2 tokens BPE merges into `gpt2_id` (None for a byte or end-of-text): its bytes
    split by BPE over the tokens of lower rank only, as transformers' TikTokenConverter derives
    GPT-2's merges. A vocabulary holding both parts of each of its tokens is merge-closed: BPE
    over it merges as GPT-2's does wherever a text's GPT-2 tokens are all in it."""
    ranks, token = gpt2_ranks(), gpt2_tokens()[gpt2_id]
    if gpt2_id == GPT2_EOT or len(token) == 1:
        return None
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        rank, i = min(
            (ranks.get(a + b, gpt2_id), i)
            for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False))
        )
        if rank >= gpt2_id:
            break
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise RuntimeError(f"GPT-2 token {gpt2_id} {token!r}: lower ranks split it in {parts}")
    return ranks[parts[0]], ranks[parts[1]]

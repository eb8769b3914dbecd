"""Texts the benchmarks train on beyond ../shared: fetched once, checked, cached.

- **German fortunes** (issue 22's third text, of another kind and language than Shakespeare):
  the German `fortune` cookies of Debian's `fortunes-de` 0.35-1 (Andreas Tille and
  contributors, GPL-2+): quotations, proverbs, jokes, recipes and short poems, 3 MB of UTF-8.
  The package is fetched from Debian's archive by its pinned sha256; its files under
  `usr/share/games/fortunes/de/` (the links beside them left out) are joined in name order.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import tarfile
import urllib.request
from pathlib import Path

from gpt.rundir.atomic import write_bytes

CACHE = Path(__file__).resolve().parent / ".cache"
FORTUNES_DE_URL = "http://deb.debian.org/debian/pool/main/f/fortunes-de/fortunes-de_0.35-1_all.deb"
FORTUNES_DE_SHA256 = "03fe7a7912935bd3d4e02e38d79ef32a289097f8718d4488c409595abce067a0"
FORTUNES_DIR = "./usr/share/games/fortunes/de/"


def german_fortunes(cache: Path = CACHE) -> Path:
    """The German fortunes as one text file in `cache` (fetched on first use)."""
    path = cache / "fortunes-de.txt"
    if not path.exists():
        with urllib.request.urlopen(FORTUNES_DE_URL, timeout=60) as response:
            deb = response.read()
        digest = hashlib.sha256(deb).hexdigest()
        if digest != FORTUNES_DE_SHA256:
            raise RuntimeError(f"{FORTUNES_DE_URL}: sha256 {digest}, expected {FORTUNES_DE_SHA256}")
        cache.mkdir(parents=True, exist_ok=True)
        write_bytes(path, fortunes_text(deb), what="the German fortunes")
    return path


def fortunes_text(deb: bytes) -> bytes:
    """The fortune files of a Debian package, joined in name order by a newline."""
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(_member(deb, "data.tar.xz")))) as tar:
        files = sorted((m for m in tar.getmembers() if m.isfile()
                        and m.name.startswith(FORTUNES_DIR)), key=lambda m: m.name)
        return b"\n".join(tar.extractfile(m).read() for m in files)


def _member(deb: bytes, name: str) -> bytes:
    """A member of a .deb, an `ar` archive: an 8-byte magic, then per member a 60-byte header
    (name in 16 bytes, size in bytes 48-58) and the data, padded to an even length."""
    if not deb.startswith(b"!<arch>\n"):
        raise RuntimeError("not a Debian package (no ar archive)")
    pos = 8
    while pos + 60 <= len(deb):
        header = deb[pos : pos + 60]
        size = int(header[48:58])
        if header[:16].decode().strip().rstrip("/") == name:
            return deb[pos + 60 : pos + 60 + size]
        pos += 60 + size + size % 2
    raise RuntimeError(f"Debian package without {name}")

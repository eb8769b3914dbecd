"""The benchmarks' fetched texts: read out of their package as described, refused when altered."""

from __future__ import annotations

import hashlib
import io
import lzma
import tarfile

import pytest

from bench import texts


def deb(files: dict[str, bytes], links: dict[str, str]) -> bytes:
    """A Debian package (an `ar` archive) whose data.tar.xz holds `files` and symlinks `links`."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    out = b"!<arch>\n"
    for name, data in [("debian-binary", b"2.0\n"), ("control.tar.xz", lzma.compress(b"x")),
                       ("data.tar.xz", lzma.compress(tar_bytes.getvalue()))]:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += data + b"\n" * (len(data) % 2)
    return out


def test_the_fortunes_are_the_package_files_in_name_order_without_the_links() -> None:
    package = deb(
        {f"{texts.FORTUNES_DIR}zitate": "Zitat ä\n%\n".encode(),
         f"{texts.FORTUNES_DIR}anekdoten": b"Anekdote\n",
         "./usr/share/doc/fortunes-de/README": b"not a fortune\n"},
        {f"{texts.FORTUNES_DIR}zitate.u8": "zitate"},
    )
    assert texts.fortunes_text(package) == "Anekdote\n\nZitat ä\n%\n".encode()


def test_a_package_that_is_not_an_ar_archive_or_lacks_its_data_is_refused() -> None:
    with pytest.raises(RuntimeError, match="not a Debian package"):
        texts.fortunes_text(b"PK\x03\x04 a zip")
    with pytest.raises(RuntimeError, match="without data.tar.xz"):
        texts.fortunes_text(b"!<arch>\n")


def test_a_download_with_another_sha256_is_refused_and_nothing_is_cached(
    tmp_path, monkeypatch
) -> None:
    package = deb({f"{texts.FORTUNES_DIR}witze": b"Witz\n"}, {})
    monkeypatch.setattr(texts.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(package))
    with pytest.raises(RuntimeError, match="sha256"):
        texts.german_fortunes(tmp_path)
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(texts, "FORTUNES_DE_SHA256", hashlib.sha256(package).hexdigest())
    assert texts.german_fortunes(tmp_path).read_bytes() == b"Witz\n"

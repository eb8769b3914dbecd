"""Object storage: `s3://` (AWS S3, and MinIO, SeaweedFS or any S3 API at an endpoint URL) and
`gs://`, read and written through fsspec (`s3fs`, `gcsfs`: the `storage` extra); and, read only,
Hugging Face datasets, `hf://datasets/ORG/NAME[@REVISION][/PATH]`, through huggingface_hub's
fsspec filesystem (HfFileSystem: a workload dependency).

load-corpus downloads a source object (or each corpus object directly under a prefix, or each
file a Hugging Face path names: the file, a folder's files, a glob's matches) into its scratch
directory in chunks, then reads it as a local file; train-gpt copies the finished `model/` to
`--export_uri`. fsspec and its backends are imported only here and only when such a URI is
given, so the default pipeline needs none of them; the URI checks below import nothing.

Credentials are the backends' own: for S3, botocore's chain (`AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, IRSA's web identity token, an instance role), the
endpoint from `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`, the region from `AWS_REGION` or
`AWS_DEFAULT_REGION`; for GCS, Application Default Credentials (Workload Identity on GKE); for
the Hub, `HF_TOKEN` (and `HF_ENDPOINT` for a mirror). Every failure is an `InputError` naming the
URI and the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt.errors import InputError, first_line
from gpt.progress import Progress
from gpt.rundir.atomic import writing

HF_ENV = ("HF_TOKEN", "HF_ENDPOINT")  # the token; the Hub's address (a mirror, or a test's fake)
# The variables the S3 and Hub clients read here: on a cluster each comes from the key of the same
# name of the Secret a step names (`storage_secret`, components/trainjob/launcher.py's
# secret_env: the first two must be in it where the step names an s3:// URI, the others may).
ENV_REQUIRED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
ENV_OPTIONAL = ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION",
                "AWS_DEFAULT_REGION", *HF_ENV)  # fmt: skip
# scheme -> the package that implements it for fsspec
BACKENDS = {"s3": "s3fs", "gs": "gcsfs"}
# Read only (load-corpus's --source): Hugging Face datasets, huggingface_hub's HfFileSystem.
HF = "hf"
_GLOB = re.compile(r"[*?\[]")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)(/.*)?$")
CHUNK = 1 << 20  # bytes read (and held) at a time while downloading
PART = 16 << 20  # bytes an upload holds before it sends them (a multipart upload's part size)
MANIFEST = "gpt-export.json"
"""Written last by `upload_dir`: a prefix without it holds no complete export."""
LOADED_BY = "config.json"
"""The file without which transformers (and KServe's Hugging Face runtime) loads no model:
uploaded after every other file of model/, and removed first when an export is replaced."""


def scheme_of(uri: str) -> str | None:
    """'s3' or 'gs' for an object-store URI, None for anything else."""
    m = _URI.match(uri)
    return m.group(1).lower() if m and m.group(1).lower() in BACKENDS else None


def check_uri(uri: str, flag: str) -> None:
    """Refuse a URI that is not `s3://bucket[/key]` or `gs://bucket[/key]` (no network)."""
    m = _URI.match(uri)
    if not m or scheme_of(uri) is None:
        raise ValueError(f"{flag} {uri!r}: not an s3://bucket/... or gs://bucket/... URI")
    if not m.group(2):
        raise ValueError(f"{flag} {uri!r}: no bucket")


def is_prefix(uri: str) -> bool:
    """A URI ending in "/", or naming only a bucket, means the objects under it."""
    return (_URI.match(uri).group(3) or "/").endswith("/")  # type: ignore[union-attr]


@dataclass(frozen=True)
class Patience:
    """How long to wait on the store: seconds per connect and read, extra attempts."""

    timeout: float = 30.0
    retries: int = 3


class Store:
    """One object-store URI and the fsspec filesystem that serves it; `flag` names the URI in
    every error (`--source`, `--export_uri`)."""

    def __init__(self, uri: str, flag: str, patience: Patience = Patience()) -> None:
        self.uri, self.flag = uri, flag
        self.scheme = scheme_of(uri) or (HF if uri.lower().startswith("hf://") else "")
        self.path = uri.split("://", 1)[1].rstrip("/")  # bucket/key: what fsspec's calls take
        self.fs = filesystem(self.scheme, patience, self.fail)

    def fail(self, reason: str, uri: str | None = None) -> InputError:
        return InputError(f"{self.flag} {uri or self.uri!r}: {reason}")

    def call(self, what: Callable[[], Any], uri: str | None = None) -> Any:
        """`what()`, with any failure of the store as one InputError naming the URI."""
        try:
            return what()
        except (InputError, TypeError, AttributeError, NameError):  # ours, or a bug: as they are
            raise
        except Exception as e:  # botocore, aiohttp, google-auth: many types, one message each
            raise self.fail(reason(e), uri) from None

    def uri_of(self, path: str) -> str:
        return f"{self.scheme}://{path.lstrip('/')}"

    def size(self) -> int:
        def head() -> dict[str, Any]:
            try:
                return self.fs.info(self.path)
            except PermissionError:
                # A refused HEAD has no body to say why ("Forbidden"); a GET's names the
                # refusal (a key the store does not know, or a user without the right).
                self.fs.cat_file(self.path, start=0, end=1)
                raise

        info = self.call(head)
        if info.get("type") != "file":
            raise self.fail("not an object (a prefix? end the URI with '/')")
        return int(info["size"])

    def data_files(self, wanted: Callable[[str], object], which: str) -> list[tuple[str, int]]:
        """The files whose names are `wanted` (`which` says which, for the refusal) directly
        under the prefix (as a folder is read: not recursive), in key order, with their sizes;
        for a Hugging Face dataset, its file, or its folder's files, or its glob's matches."""
        if self.scheme == HF:
            entries = self.hf_entries()
        else:
            entries = self.call(lambda: self.fs.ls(self.path, detail=True))
        found = sorted(
            (self.uri_of(e["name"]), int(e["size"])) for e in entries
            if e.get("type") == "file" and wanted(e["name"])
        )  # fmt: skip
        if not found:
            glob = _GLOB.search(self.path)
            where = "matching this glob" if glob else "directly under this prefix"
            raise self.fail(f"no corpus files ({which}) {where}")
        return found

    def hf_entries(self) -> list[dict[str, Any]]:
        """A Hugging Face path's entries: a glob's matches, a folder's files, or the file."""
        if _GLOB.search(self.path):
            return list(self.call(lambda: self.fs.glob(self.path, detail=True)).values())
        info = self.call(lambda: self.fs.info(self.path))
        if info.get("type") == "file":
            return [info]
        return self.call(lambda: self.fs.ls(self.path, detail=True))

    def download_prefix(self, dest: Path, max_bytes: int = 1 << 40) -> list[str]:
        """Copy the objects directly under the prefix (a model folder: not recursive) into the
        folder `dest`, by their names; returns the names."""
        entries = self.call(lambda: self.fs.ls(self.path, detail=True))
        files = sorted(e["name"] for e in entries if e.get("type") == "file")
        if not files:
            raise self.fail("no objects directly under this prefix")
        for name in files:
            self.download(self.uri_of(name), dest / name.rsplit("/", 1)[-1], max_bytes)
        return [name.rsplit("/", 1)[-1] for name in files]

    def download(self, uri: str, dest: Path, max_bytes: int) -> int:
        """Copy the object `uri` to the file `dest` a CHUNK at a time, refusing more than
        `max_bytes`; returns the bytes written (the object's size when the copy began)."""
        path = uri.split("://", 1)[1]
        size = self.call(lambda: self.fs.info(path), uri).get("size") or 0
        if size > max_bytes:
            raise self.fail(f"{size} bytes exceeds --max_bytes {max_bytes}", uri)
        progress, got = Progress("downloaded", size), 0
        with (
            writing(dest, f"the download of {uri}"),
            open(dest, "wb") as out,
            self.stream(path, uri) as read,
        ):
            while got < size:
                want = min(CHUNK, size - got)
                chunk = self.call(lambda n=want: read(n), uri)
                if not chunk:
                    raise self.fail(f"changed while read (ended at {got} of {size} bytes)", uri)
                out.write(chunk)
                got += len(chunk)
                progress.update(len(chunk))
        progress.done()
        return got

    @contextlib.contextmanager
    def stream(self, path: str, uri: str) -> Iterator[Callable[[int], bytes]]:
        """`read(n)` over the object at `path`. On S3 one streamed GET: it reads the object once
        at the network's pace in a chunk's memory, where ranged GETs cost a request each (and
        moto's server reads the whole object for every range: 5x slower here); elsewhere
        fsspec's file, which buffers one block of its backend's."""
        if self.scheme == HF:  # one streamed GET (HfFileSystemStreamFile), not ranged blocks
            with self.call(lambda: self.fs.open(path, "rb", block_size=0), uri) as f:
                yield f.read
            return
        if self.scheme != "s3":
            with self.call(lambda: self.fs.open(path, "rb"), uri) as f:
                yield f.read
            return
        from fsspec.asyn import sync

        bucket, key = path.split("/", 1)

        async def get() -> Any:
            return (await self.fs._call_s3("get_object", Bucket=bucket, Key=key))["Body"]

        body = self.call(lambda: sync(self.fs.loop, get), uri)
        try:
            yield lambda n: sync(self.fs.loop, body.read, n)
        finally:
            body.close()

    def upload_dir(self, local: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
        """Copy every file of the directory `local` under the prefix, so that what a reader
        sees is all of it or plainly incomplete (see docs/cluster.md, "Model out"):

        1. remove the manifest, then `config.json`, of any earlier export there;
        2. put every other file (`put`): each makes its object whole or not at all, so a
           killed upload leaves whole files or none, never a partial one;
        3. put `config.json`, without which no model loads from the prefix;
        4. put the manifest (each file's bytes and sha256), the mark of a complete export.

        Returns the manifest."""
        names = sorted(p.name for p in local.iterdir() if p.is_file())
        order = [n for n in names if n != LOADED_BY] + [n for n in names if n == LOADED_BY]
        for stale in (MANIFEST, LOADED_BY):
            key = f"{self.path}/{stale}"
            if self.call(lambda key=key: self.fs.exists(key)):
                self.call(lambda key=key: self.fs.rm_file(key))
        files: dict[str, Any] = {}
        for name in order:
            src = local / name
            self.call(lambda src=src, name=name: self.put(src, f"{self.path}/{name}"))
            files[name] = {"bytes": src.stat().st_size, "sha256": sha256_of(src)}
            say(f"export: uploaded {name} ({files[name]['bytes']:,} bytes)")
        manifest = {"files": files}
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        self.call(lambda: self.fs.pipe_file(f"{self.path}/{MANIFEST}", data))
        say(f"export: {self.uri} complete ({MANIFEST} written last)")
        return manifest


    def put(self, src: Path, key: str) -> None:
        """Write the file `src` to the object `key`, PART bytes held at a time (s3fs's
        `put_file` sends parts concurrently: it held 1 GB to upload 500 MB here). The object
        appears whole when the file is closed (a PUT, or the completion of a multipart upload);
        a failure discards it (aborting the multipart upload), so nothing partial is seen."""
        out = self.fs.open(key, "wb", block_size=PART)
        try:
            with open(src, "rb") as f:
                while chunk := f.read(CHUNK):
                    out.write(chunk)
        except BaseException:
            out.discard()
            # fsspec's file would otherwise try to close (and so complete) it when collected
            with contextlib.suppress(AttributeError):
                out.closed = True
            raise
        out.close()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def reason(e: BaseException) -> str:
    """What went wrong, for a person: the kind of failure, then the backend's own words."""
    said = first_line(e)
    status = hub_status(e)
    if status == 401:
        return ("the Hub answered 401 Unauthorized: a private or gated dataset, or no such "
                "repository; set HF_TOKEN (on a cluster, a key of the Secret storage_secret "
                f"names): {said}")
    if status == 403:
        return f"the Hub answered 403 Forbidden (accept the dataset's terms on its page?): {said}"
    if isinstance(e, FileNotFoundError):
        return f"not found (no such bucket, key or prefix): {said}"
    if isinstance(e, PermissionError):
        return f"access denied (check the credentials and the bucket's policy): {said}"
    name = type(e).__name__
    if isinstance(e, ConnectionError | TimeoutError) or "Connect" in name or "Timeout" in name:
        return f"the endpoint does not answer: {name}: {said}"
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return f"no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY): {said}"
    return f"{name}: {said}"


def hub_status(e: BaseException | None) -> int | None:
    """The HTTP status of a Hub error behind `e` (HfFileSystem turns a refusal into
    FileNotFoundError, the Hub's error its cause)."""
    seen = 0
    while e is not None and seen < 8:
        response = getattr(e, "response", None)
        status = getattr(response, "status_code", None)
        if isinstance(status, int):
            return status
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def hf_filesystem(patience: Patience, fail: Callable[[str], InputError]) -> Any:
    """huggingface_hub's fsspec filesystem: the token from HF_TOKEN (unset: huggingface_hub's
    own, `hf auth login`'s, or none, for public datasets), the Hub at HF_ENDPOINT (read now,
    not when huggingface_hub was imported)."""
    try:
        from huggingface_hub import HfFileSystem
    except ImportError as e:
        raise fail(f"hf:// needs huggingface_hub (a workload dependency): {e}") from None
    for name in ("huggingface_hub", "fsspec"):
        logging.getLogger(name).addHandler(logging.NullHandler())
    token, endpoint = (os.environ.get(k) or None for k in HF_ENV)
    return HfFileSystem(token=token, endpoint=endpoint, skip_instance_cache=True)


def filesystem(scheme: str, patience: Patience, fail: Callable[[str], InputError]) -> Any:
    """The fsspec filesystem for `scheme`, its package imported now (the `storage` extra)."""
    if scheme == HF:
        return hf_filesystem(patience, fail)
    try:
        fsspec = importlib.import_module("fsspec")
        importlib.import_module(BACKENDS[scheme])
    except ImportError as e:
        raise fail(
            f"{scheme}:// needs the storage extra (pip install 'gpt-trainjobs[storage]'): {e}"
        ) from None
    # Their warnings carry tracebacks (aiobotocore's "Refreshing temporary credentials failed",
    # with the STS error) that Python's last-resort handler would print on stderr beside the
    # one-line error that says the same; a handler of their own keeps them out of it.
    for name in ("aiobotocore", "s3fs", "gcsfs", "fsspec"):
        logging.getLogger(name).addHandler(logging.NullHandler())
    if scheme != "s3":
        return fsspec.filesystem(scheme, skip_instance_cache=True)
    # botocore reads the keys, the web identity token (IRSA) and AWS_DEFAULT_REGION itself;
    # the endpoint and AWS_REGION are handed over here so any botocore version takes them.
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    fs = fsspec.filesystem(
        "s3",
        endpoint_url=endpoint or None,
        client_kwargs={"region_name": region} if region else {},
        config_kwargs={
            "connect_timeout": patience.timeout,
            "read_timeout": patience.timeout,
            "retries": {"max_attempts": patience.retries + 1, "mode": "standard"},
        },
        skip_instance_cache=True,
    )
    fs.retries = patience.retries + 1  # s3fs's own retry loop (a class attribute, 5 by default)
    return fs

"""Where a pretrained model's files come from (train-gpt's and load-corpus's --init_from): the
Hugging Face Hub, an object store, or a local folder, always ending as a local folder.

- `gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`: the Hub's `openai-community/<name>`;
  `hf://ORG/NAME[@REVISION]` any Hub repository. Downloaded through `huggingface_hub` (its token
  from `HF_TOKEN`) into the Hub cache the user set (`HF_HUB_CACHE`, or `HF_HOME`/hub), else the
  shared volume's, `<root>/.cache/huggingface/hub` (`cache_dir`): a resumed run, a second run,
  every rank of a TrainJob and a copy `huggingface-cli download` or transformers left there are
  found and nothing is downloaded; `HF_HUB_OFFLINE=1` reads that same cache alone.
- `s3://` or `gs://` prefix: copied (gpt/fetch/objectstore.py, its credentials) into
  `<root>/.cache/init_from/<sha256 of the URI>/`, whole or not at all.
- anything else: a local folder (an earlier run's `model/`, or any GPT-2 / GPT-NeoX directory).

Every failure is one `InputError` line naming --init_from and the reason. This module imports
no PyTorch (the component image checks --init_from's form with `parse`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpt.errors import InputError, first_line

# The Hub's names of GPT-2's four released sizes (OpenAI's, kept by openai-community).
GPT2_REPOS = {name: f"openai-community/{name}"
              for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}  # fmt: skip
HF_SCHEME = "hf://"
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt")
"""What load-corpus needs of a pretrained model: its tokenizer (GPT-2's own also ships
vocab.json and merges.txt)."""
MODEL_FILES = (*TOKENIZER_FILES, "config.json", "generation_config.json", "*.safetensors",
               "model.safetensors.index.json")  # fmt: skip
"""What train-gpt needs: the tokenizer, the config and the safetensors weights (never a pickled
`pytorch_model.bin`, which the Hub's GPT-2 also holds)."""
FLAG = "--init_from"


@dataclass(frozen=True)
class Source:
    """A parsed --init_from: `kind` hub (`repo`, `revision`), store (`uri`) or dir (`path`)."""

    kind: str
    text: str
    repo: str = ""
    revision: str | None = None

    @property
    def canonical(self) -> str:
        """One spelling per model: `gpt2` and `hf://openai-community/gpt2` are the same; a
        folder's absolute path."""
        if self.kind == "hub":
            return HF_SCHEME + self.repo + (f"@{self.revision}" if self.revision else "")
        if self.kind == "dir":
            return str(Path(self.text).resolve())
        return self.text


def parse(init_from: str) -> Source:
    """The source --init_from names; ValueError (one line) for a malformed Hub name."""
    if init_from in GPT2_REPOS:
        return Source("hub", init_from, repo=GPT2_REPOS[init_from])
    if init_from.startswith(HF_SCHEME):
        name, _, revision = init_from[len(HF_SCHEME):].partition("@")
        if not _REPO.match(name) or (_ and not revision):
            raise ValueError(f"{FLAG} {init_from!r}: expected hf://ORG/NAME or "
                             "hf://ORG/NAME@REVISION")
        return Source("hub", init_from, repo=name, revision=revision or None)
    if re.match(r"^(s3|gs)://", init_from):
        from gpt.fetch.objectstore import check_uri

        check_uri(init_from, FLAG)
        return Source("store", init_from.rstrip("/") + "/")
    if "://" in init_from:
        raise ValueError(f"{FLAG} {init_from!r}: expected gpt2, gpt2-medium, gpt2-large, "
                         "gpt2-xl, hf://ORG/NAME[@REVISION], s3://, gs:// or a local folder")
    return Source("dir", init_from)


def cache_dir(root: str | Path) -> Path:
    """The Hub cache, where huggingface_hub and every tool of its ecosystem look for it: the
    user's `HF_HUB_CACHE` (or its older name `HUGGINGFACE_HUB_CACHE`), else the user's
    `HF_HOME`/hub, else the run root's volume, `<root>/.cache/huggingface/hub` (the runtimes set
    HF_HOME there, so a cluster keeps one copy per volume). Read at each call, as the stage's
    environment says, not huggingface_hub's import-time constants."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(root) / ".cache" / "huggingface" / "hub"


@dataclass(frozen=True)
class Fetched:
    """A pretrained model's files, local: where, and what they are (for the run's record)."""

    path: Path
    source: str
    """--init_from, canonical (`Source.canonical`)."""
    revision: str | None
    """The Hub commit the files are from; None for a folder or an object store (whose
    weights' sha256 identifies them instead)."""


def fetch(init_from: str, root: str | Path, patterns: tuple[str, ...],
          say: Callable[[str], None] = print, offline: bool | None = None) -> Fetched:
    """The files matching `patterns` of --init_from, in a local folder (downloaded once, then
    cached on the run root's volume). `offline`: read the cache only (None: as HF_HUB_OFFLINE
    says)."""
    src = parse(init_from)
    if src.kind == "dir":
        path = Path(src.text)
        if not path.is_dir():
            raise InputError(f"{FLAG} {init_from!r}: no such folder (and not gpt2, gpt2-medium, "
                             "gpt2-large, gpt2-xl, hf://..., s3:// or gs://)")
        return Fetched(path, src.canonical, None)
    if src.kind == "store":
        return Fetched(_from_store(src, Path(root), say), src.canonical, None)
    if offline is None:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    path = _from_hub(src, Path(root), patterns, offline, say)
    return Fetched(path, src.canonical, path.name)


def _from_hub(src: Source, root: Path, patterns: tuple[str, ...], offline: bool,
              say: Callable[[str], None]) -> Path:
    import huggingface_hub
    from huggingface_hub import errors

    where = f"{FLAG} {src.text!r}"
    revision = f" revision {src.revision!r}" if src.revision else ""
    say(f"init_from: {src.repo}{revision} from the Hub (cache {cache_dir(root)}"
        f"{', offline' if offline else ''})")
    try:
        path = huggingface_hub.snapshot_download(
            src.repo, revision=src.revision, cache_dir=cache_dir(root),
            allow_patterns=list(patterns), local_files_only=offline,
            token=os.environ.get("HF_TOKEN") or None,
        )
    except errors.GatedRepoError:
        raise InputError(f"{where}: gated on the Hub: accept its terms and set HF_TOKEN "
                         "(on the cluster, in the Secret storage_secret names)") from None
    except errors.RepositoryNotFoundError:
        raise InputError(f"{where}: no such repository on the Hub, or a private one and no "
                         "HF_TOKEN with access to it") from None
    except errors.RevisionNotFoundError:
        raise InputError(f"{where}: the repository has no revision {src.revision!r}") from None
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as e:
        why = ("HF_HUB_OFFLINE is set and the cache holds no copy" if offline
               else f"the Hub cannot be reached and the cache holds no copy ({first_line(e)})")
        raise InputError(f"{where}: {why} (cache {cache_dir(root)})") from None
    except errors.HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            raise InputError(f"{where}: HTTP {status} from the Hub: a gated or private model "
                             "needs HF_TOKEN with access to it") from None
        raise InputError(f"{where}: the Hub answered: {first_line(e)}") from None
    except OSError as e:  # no network, a full volume, ...
        raise InputError(f"{where}: could not download from the Hub: {first_line(e)}") from None
    return Path(path)


def _from_store(src: Source, root: Path, say: Callable[[str], None]) -> Path:
    """The prefix's files copied into the cache, staged and renamed whole: a copy that is there
    is complete, and is not downloaded again."""
    from gpt.fetch.objectstore import Store
    from gpt.rundir import atomic

    dest = root / ".cache" / "init_from" / hashlib.sha256(src.text.encode()).hexdigest()[:32]
    if dest.is_dir():
        say(f"init_from: {src.text} cached in {dest}")
        return dest
    say(f"init_from: copying {src.text} into {dest}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic.staged_dir(dest, what=f"the copy of {src.text}") as stage:
        Store(src.text, FLAG).download_prefix(stage)
    return dest

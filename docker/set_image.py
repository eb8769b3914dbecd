"""Point a kustomization's `images:` entry at an image, like `kustomize edit set image`, for
machines without kustomize. Only the entry's `newName:` and `newTag:` values change, so the file's
comments and layout survive.

usage: python set_image.py KUSTOMIZATION REPO=NEWNAME:NEWTAG
  REPO picks the entry whose `name` is REPO or ends in /REPO (e.g. gpt-workload).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# A tag YAML would read as a number or a boolean (1.0, 2, yes) must be quoted to stay a string.
NOT_A_PLAIN_STRING = re.compile(
    r"[-+]?[0-9_]*\.?[0-9_]*(e[-+]?[0-9]+)?|0x[0-9a-f]+|0o[0-7]+|yes|no|true|false|on|off|null",
    re.I,
)


def split_ref(ref: str) -> tuple[str, str]:
    """`registry:5000/me/gpt-workload:v1` -> (`registry:5000/me/gpt-workload`, `v1`)."""
    name, sep, tag = ref.rpartition(":")
    if not sep or not name or not tag or "/" in tag:
        raise ValueError(f"image {ref!r} has no tag (want NAME:TAG)")
    return name, tag


def set_image(text: str, repo: str, ref: str) -> str:
    """Return the kustomization `text` with the `repo` entry of `images:` pointing at `ref`."""
    new_name, new_tag = split_ref(ref)
    lines = text.splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if re.match(r"images:\s*$", line))
    except StopIteration:
        raise ValueError("no top-level `images:` list") from None
    # The list runs to the next top-level key; each entry starts at a `- ` line.
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"[^\s#-]", lines[i])),
               len(lines))
    starts = [i for i in range(start + 1, end) if re.match(r"\s*- ", lines[i])] + [end]
    for first, last in zip(starts, starts[1:], strict=False):
        entry = lines[first:last]
        names = [m["v"] for line in entry if (m := re.match(r"\s*(- )?name:\s*(?P<v>\S+)", line))]
        if not names or not (names[0] == repo or names[0].endswith("/" + repo)):
            continue
        done = set()
        for i in range(first, last):
            m = re.match(r"(?P<key>\s*(- )?(?P<k>newName|newTag):\s*)", lines[i])
            if m:
                value = new_name if m["k"] == "newName" else new_tag
                quote = '"' if NOT_A_PLAIN_STRING.fullmatch(value) else ""
                lines[i] = f"{m['key']}{quote}{value}{quote}\n"
                done.add(m["k"])
        if done != {"newName", "newTag"}:
            raise ValueError(f"the `images:` entry {names[0]!r} needs both newName and newTag")
        return "".join(lines)
    raise ValueError(f"no `images:` entry named {repo!r} or ending in /{repo}")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or "=" not in argv[1]:
        print(__doc__.strip().split("\n\n")[-1], file=sys.stderr)
        return 2
    path = Path(argv[0])
    repo, _, ref = argv[1].partition("=")
    # Whole or not at all: a new file beside it, renamed over it (a full disk or a kill leaves
    # the old kustomization, never half of one).
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(set_image(path.read_text(), repo, ref))
        tmp.replace(path)
    except (OSError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        print(f"set_image.py: error: {path}: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {repo} -> {ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""load-corpus from object storage against the same text on disk: seconds, MB/s, peak memory.

The text (the Shakespeare plays repeated to 100 MB; 5 MB with --quick; 1 GB with --large) is put
once into a real S3 server on this machine (moto's, bench/s3server.py), then the stage runs as a
child process on `s3://.../text.txt` and on the file, alternately, in rounds (the machine's speed
drifts over minutes, and each side sees the same drift); the ratios are the medians' and, per
round, the object's time over the file's just before it. Peak RSS is the last round's ru_maxrss
(bench/corpus_speed.py's `child`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench.corpus_speed import child, source_text
from bench.harness import Result, Stats, fmt_stats
from bench.s3server import AWS_VARIABLES, BUCKET, S3Server

SIZES = {"5 MB": 5_000_000, "100 MB": 100_000_000, "1 GB": 1_000_000_000}


def run(quick: bool, large: bool = False, rounds: int = 3) -> Result:
    labels = ["5 MB"] if quick else ["100 MB"] + (["1 GB"] if large else [])
    rounds = 1 if quick else rounds
    result = Result(
        "objectstore",
        {"sizes": labels, "rounds": rounds, "tokenizer": "gpt2 (compacted, the default)",
         "server": "moto's S3 server on a loopback port", "cores": os.cpu_count()},
        ["size", "source", "seconds", "MB/s", "peak RSS MB", "vs disk", "each round vs disk"],
    )
    saved = {name: os.environ.pop(name) for name in AWS_VARIABLES if name in os.environ}
    try:
        with S3Server() as s3, tempfile.TemporaryDirectory() as tmp:
            os.environ.update(s3.env())  # the stage's children take the keys and endpoint
            for label in labels:
                folder = Path(tmp) / label.replace(" ", "")
                folder.mkdir()
                path = source_text(SIZES[label], folder)
                key = f"bench/{label.replace(' ', '')}/text.txt"
                s3.client().upload_file(str(path), BUCKET, key)
                sources = {"disk": str(path), "s3": f"s3://{BUCKET}/{key}"}
                seconds = {name: [] for name in sources}
                rss: dict[str, float] = {}
                for r in range(rounds):
                    for name, source in sources.items():
                        run_dir = f"{name}-{r}"
                        took, rss[name], _ = child(
                            [sys.executable, "-m", "gpt", "load-corpus", "--root",
                             str(folder / "root"), "--run", run_dir, "--source", source]
                        )  # fmt: skip
                        seconds[name].append(took)
                        print(f"bench: objectstore {label} {name}: {took:.2f} s", flush=True)
                        shutil.rmtree(folder / "root" / run_dir)
                disk = Stats(seconds["disk"]).median
                for name in sources:
                    took = Stats(seconds[name])
                    paired = [t / d for t, d in zip(took.values, seconds["disk"], strict=True)]
                    result.rows.append({
                        "size": label, "bytes": path.stat().st_size, "source": name,
                        "seconds": fmt_stats(took, " s"), "seconds_each": took.values,
                        "MB/s": round(path.stat().st_size / 1e6 / took.median, 2),
                        "peak RSS MB": round(rss[name]),
                        "vs disk": f"{took.median / disk:.2f}x time",
                        "each round vs disk": f"median {Stats(paired).median:.2f}x ("
                        + ", ".join(f"{r:.2f}" for r in paired) + ")",
                    })  # fmt: skip
                s3.client().delete_object(Bucket=BUCKET, Key=key)
    finally:
        for name in AWS_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(saved)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.objectstore_speed", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="5 MB, one round")
    parser.add_argument("--large", action="store_true", help="add the 1 GB case (minutes)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    result = run(args.quick, args.large, args.rounds)
    print(result.markdown())
    print(f"bench: wrote {result.write()}")


if __name__ == "__main__":
    main()

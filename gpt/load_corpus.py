"""load-corpus: `python -m gpt load-corpus`. Reads --source (a file, a folder, a URL, an object
store, a Hugging Face dataset, or the embedded corpus) and writes the run's `corpus/` and
`data/` (gpt/data/corpus.py does the work); its flags are gpt/config/configs.py's CorpusConfig.
"""

from __future__ import annotations

from gpt.config.configs import CorpusConfig
from gpt.data.corpus import build


def main(cfg: CorpusConfig) -> None:
    """The stage: build the run's training data, then say what it holds."""
    rundir = cfg.rundir
    meta = build(cfg)
    if meta is None:
        print(f"corpus: {rundir.path} already up to date (same inputs and text); nothing written")
        return
    print(f"corpus: train {meta.train_tokens:,} tokens ({meta.train_bytes:,} bytes), "
          f"val {meta.val_tokens:,} tokens ({meta.val_bytes:,} bytes), {meta.dtype}")
    print(f"corpus: wrote {rundir.corpus_dir}/{{text.txt,source.json}}")
    print(f"corpus: wrote {rundir.data_dir}/{{train.bin,val.bin,tokenizer.json,meta.json}}")

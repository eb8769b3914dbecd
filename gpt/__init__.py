"""The GPT workload: corpus, tokenizer, model, training, sampling and the prompt REPL.

Knows PyTorch only; nothing here imports Kubernetes or KFP. The command line is
`python -m gpt <stage>` (see `gpt/__main__.py` and `gpt/stages.py`); the layers are in
docs/architecture.md.
"""

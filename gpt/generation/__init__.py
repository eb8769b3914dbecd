"""generative-prompt's engine and its terminal: sampling knows only token ids (sampling.py); the
REPL holds the tokenizer, the conversation and the transcript (repl.py)."""

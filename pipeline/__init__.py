"""The KFP pipeline that chains load-corpus -> train-gpt -> generative-prompt."""

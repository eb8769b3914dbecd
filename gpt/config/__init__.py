"""The knobs: every stage's config dataclass (configs.py: a field is a flag, its docstring the
help) and the command line made from them (cli.py). No PyTorch, numpy or tiktoken: the component
image imports this to check a step's flags before it creates a TrainJob."""

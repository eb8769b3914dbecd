"""Every stage's configuration: plain dataclasses, one field per flag (gpt/config/cli.py makes them
command lines), no PyTorch.

One name per knob: a field `block_size` is the flag `--block_size`, the KFP parameter
`block_size` and the key in saved configs. Validation lives in each config's `__post_init__`
and raises `ValueError` naming the flag, before any file is written or tensor allocated. The
pipeline's component image (which has no PyTorch, numpy or tiktoken) imports this module to check
a step's flags before it creates a TrainJob. See docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from gpt.fetch.model_source import parse as parse_init_from
from gpt.fetch.objectstore import check_uri
from gpt.rundir.layout import RunDir, check_run_id

# --source's name for the embedded corpus (gpt/assets/comedy_of_errors.txt), which needs no
# network, and --max_bytes's default (CorpusConfig.max_bytes says why).
DEFAULT_SOURCE = "default"
MAX_BYTES = 10_000_000_000


@dataclass
class RunConfig:
    """What every stage shares: where the run directory is."""

    root: str = "runs"
    """Directory that holds one sub-directory per run: /gpt (PVC gpt-pvc, where the runtimes
    mount it) for a TrainJob, any folder for a local run."""
    run: str = "demo"
    """Run id: the sub-directory of --root this stage reads and writes (the KFP run id on a
    cluster)."""

    def __post_init__(self) -> None:
        if not self.root:
            raise ValueError("--root: must not be empty")
        check_run_id(self.run)

    @property
    def rundir(self) -> RunDir:
        return RunDir.of(self.root, self.run)


# The longest byte n-grams --spelling takes: longer ones are nearly whole tokens, rows of
# their own that share nothing.
MAX_SPELLING = 4


@dataclass
class ContextConfig:
    """The context length: the model's and training's (train-gpt), and what load-corpus checks
    each split can give (one name, one default, for both stages)."""

    block_size: int = 64
    """Context window in tokens: the most the model attends over, and each training window's
    length; load-corpus checks that each split holds at least one window."""

    def __post_init__(self) -> None:
        check_positive_int("block_size", self.block_size)


@dataclass
class InitFromConfig:
    """Where the model starts (train-gpt's weights, load-corpus's tokenizer: one name, one
    default, for both stages)."""

    init_from: str = ""
    """Start from a trained model instead of random weights: gpt2, gpt2-medium, gpt2-large or
    gpt2-xl (the Hub's openai-community/gpt2*), hf://ORG/NAME[@REVISION], a local model folder
    (an earlier run's model/, any GPT-2 or GPT-NeoX folder this project's export could write),
    or an s3:// or gs:// prefix holding one. load-corpus then tokenizes with its tokenizer and
    train-gpt takes its shape and weights (read at iteration 0, and again by a resumed
    --lora_rank run, whose checkpoints hold only its adapters; Hub downloads cached where
    HF_HUB_CACHE or HF_HOME says, else in <root>/.cache/huggingface). A run with a checkpoint
    resumes only from the same one. Empty: from scratch."""

    def __post_init__(self) -> None:
        if self.init_from:
            parse_init_from(self.init_from)


@dataclass
class SeedConfig:
    """The seed of a stage's randomness (train-gpt's and generative-prompt's)."""

    seed: int = 1337
    """Seed of everything random in the stage: training's initialisation, batch order and dropout
    (equal seeds give equal runs on a CPU), or the first reply's sampling (each later reply uses
    the next number, so any transcript line can be reproduced with --seed and --prompt)."""


# The model's shape when its flags are left unset and nothing else decides it (no --init_from,
# a new run): nanoGPT's CPU "baby GPT" with this project's recipe choices (bench/recipe_trials.md).
DEFAULT_SHAPE: dict[str, Any] = dict(n_layer=4, n_head=4, n_embd=128, bias=False,
                                     position="rope", activation="relu2")  # fmt: skip
POSITIONS = ("rope", "learned")
# The projections of each block LoRA may adapt (--lora_targets), by their names in
# gpt/models/model.py, which are also GPT-2's.
LORA_TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
LORA_FLAGS = ("lora_rank", "lora_alpha", "lora_targets")  # what a LoRA run resumes with
ACTIVATIONS = ("relu2", "gelu", "gelu_new")


@dataclass
class ModelConfig(ContextConfig):
    """The model's shape, as a person chooses it: train-gpt's model flags. `GPTConfig`
    adds the vocabulary size, which comes from the data. Left unset, a shape flag is
    DEFAULT_SHAPE's (the training recipe's, bench/recipe_trials.md: nanoGPT's CPU "baby GPT"
    shape with dropout for a small corpus), or, with --init_from, the pretrained model's; a
    resumed run keeps what it started with (gpt/training/recipe.py)."""

    n_layer: int | None = None
    """Number of transformer blocks (unset: 4, or --init_from's)."""
    n_head: int | None = None
    """Attention heads per block; must divide n_embd (into an even head size with --position
    rope, which turns pairs of dimensions). Unset: 4, or --init_from's."""
    n_embd: int | None = None
    """Width of the residual stream (embedding dimension). Unset: 128, or --init_from's."""
    dropout: float | None = None
    """Dropout probability while training, in [0, 1). Unset: DROPOUT_REPEATED when the run
    trains on more tokens than its training split holds (max_iters x batch_size x block_size:
    it sees the text again, and dropout holds off learning it by heart; the default corpus
    18 times), else 0 (dropout only slows a model that never sees a token twice: the plays,
    a third of a pass, reach nanoGPT's quality 10% sooner without it); the same rule with
    --init_from (fine-tuning a small text overfits as training on it from scratch does)."""
    bias: bool | None = None
    """Bias terms in linear layers and LayerNorms (GPT-2 has them; without is a little faster).
    Unset: false, or --init_from's (whether its bias tensors hold anything)."""
    position: Literal["rope", "learned"] | None = None
    """How attention knows token order: rope (rotary embeddings: relative, no parameters) or
    learned (GPT-2's table of absolute positions). rope learned more per iteration here.
    Unset: rope, or --init_from's."""
    activation: Literal["relu2", "gelu", "gelu_new"] | None = None
    """The MLP's nonlinearity: relu2 (squared ReLU, as in Primer), gelu (the exact GELU) or
    gelu_new (GPT-2's tanh approximation of it, which its released weights were trained with).
    relu2 learned more per iteration here at the same cost. Unset: relu2, or --init_from's."""
    spelling: int | None = None
    """Spell the token embedding in byte n-grams up to this long while training: each token's
    row is a free vector plus the mean of vectors its bytes and byte pairs share with other
    tokens (gpt/models/spelling.py), so rare and unseen tokens start from their spelling. 0: a plain
    table (GPT-2's). Unset: DEFAULT_SPELLING for a new run (0 with --init_from: the pretrained
    table is plain), and a resumed run keeps what it started with. The export is a plain table
    either way (the sum written out)."""

    def __post_init__(self) -> None:
        ContextConfig.__post_init__(self)
        for name in ("n_layer", "n_head", "n_embd"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.position is not None and self.position not in POSITIONS:
            raise ValueError(f"--position {self.position!r}: expected rope or learned")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ValueError(f"--activation {self.activation!r}: expected relu2, gelu or gelu_new")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout {self.dropout!r}: must be in [0, 1) (unset: automatic)")
        if self.spelling is not None and (
            not isinstance(self.spelling, int) or isinstance(self.spelling, bool)
            or not 0 <= self.spelling <= MAX_SPELLING
        ):
            raise ValueError(f"--spelling {self.spelling!r}: must be an integer from 0 (a plain "
                             f"embedding table) to {MAX_SPELLING} (unset: automatic)")

    def shape_with(self, unset: dict[str, Any]) -> dict[str, Any]:
        """The shape flags (DEFAULT_SHAPE's names), each unset one taken from `unset`."""
        return {k: unset[k] if getattr(self, k) is None else getattr(self, k)
                for k in DEFAULT_SHAPE}  # fmt: skip


def check_heads(n_embd: int, n_head: int, position: str) -> None:
    """Refuse a width the heads do not divide (into an even head size for rotary positions)."""
    if n_embd % n_head:
        raise ValueError(f"--n_embd {n_embd}: must be divisible by --n_head {n_head}")
    if position == "rope" and (n_embd // n_head) % 2:
        raise ValueError(
            f"--n_embd {n_embd} / --n_head {n_head}: the head size must be even "
            "(rotary position embeddings turn pairs of dimensions)"
        )


def check_positive_int(name: str, value: Any) -> None:
    """Refuse anything but an int >= 1 (a bool is no int here), naming the flag."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"--{name} {value!r}: must be a positive integer")


@dataclass
class SamplingConfig:
    """How the next token is chosen. Validated on construction (and on `dataclasses.replace`)."""

    temperature: float = 0.8
    """Softmax temperature: below 1 is more conservative, above 1 more adventurous; 0 is greedy
    (always the most likely token)."""
    top_k: int = 0
    """Sample only among the k most likely tokens; 0: no limit."""
    top_p: float = 1.0
    """Nucleus sampling: sample only among the most likely tokens whose probabilities add up to
    at least p, in (0, 1]; 1 keeps all."""
    max_new_tokens: int = 200
    """Most tokens generated per reply (fewer if the model emits end-of-text)."""

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"--temperature {self.temperature!r}: must be >= 0 (0 = greedy)")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"--top_k {self.top_k!r}: must be an integer >= 0 (0: no limit)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top_p {self.top_p!r}: must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max_new_tokens {self.max_new_tokens!r}: must be >= 1")


def fields_of(cfg: Any, part: type) -> dict[str, Any]:
    """`cfg`'s values of the fields of `part`, one of its dataclass bases (e.g. the model or
    sampling settings of a stage's config), to build a `part` or a subclass of it."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(part)}


@dataclass
class GPTConfig(ModelConfig):
    """The shape (n_layer, n_head, n_embd, block_size, dropout, bias: ModelConfig above, where
    the training flags come from) plus the vocabulary size, which the tokenizer decides."""

    vocab_size: int = 50257
    """Number of token ids: the tokenizer's vocabulary size (the model pads its matrices beyond
    it, gpt/models/model.py, but never returns a logit for a padding id)."""

    def __post_init__(self) -> None:
        if self.dropout is None:  # a model has a dropout; only the flag may be left to training
            self.dropout = 0.0
        if self.spelling is None:  # so is its embedding spelled or not
            self.spelling = 0
        for name, value in self.shape_with(DEFAULT_SHAPE).items():  # and a whole shape
            setattr(self, name, value)
        super().__post_init__()
        check_heads(self.n_embd, self.n_head, self.position)
        check_positive_int("vocab_size", self.vocab_size)


@dataclass
class TrainConfig(InitFromConfig, SeedConfig, ModelConfig, RunConfig):
    """train-gpt's flags: the run directory, the model (ModelConfig), and these."""

    # batch
    batch_size: int = 12
    """Sequences per iteration, over all ranks and micro-batches together: the effective batch,
    the same for any number of processes."""
    grad_accum: int = 1
    """Micro-batches per rank per iteration (to fit memory): each rank computes
    batch_size / (world size * grad_accum) sequences at a time."""
    # how long, and how fast
    max_iters: int = 600
    """Stop after this many iterations (optimizer updates); the learning rate decays to min_lr
    over them. 600 iterations of 12 x 64 tokens are ~18 passes over the default corpus: past
    that it overfits."""
    time_budget: float = 0.0
    """Stop after this many seconds of training, counted over restarts (0 = no limit, the
    default). A budget only picks the iteration to stop at (the learning rate follows the
    iterations), so the weights equal those of an unbudgeted run at that iteration; but which
    one that is depends on the machine, so a budgeted run is not reproducible, and the default
    sets none."""
    learning_rate: float | None = None
    """Peak learning rate, reached after warmup_iters (unset: 1e-3; with --init_from
    finetune_lr of the model's width, 5e-4 at 128; with --lora_rank the adapters' lora_lr,
    5e-3 at 128: gpt/training/recipe.py)."""
    min_lr: float | None = None
    """Learning rate at the end of the cosine decay (unset: 1e-4; with --init_from a tenth of
    the learning rate, MIN_LR_FRACTION)."""
    warmup_iters: int | None = None
    """Iterations of linear learning-rate warmup from 0, fewer than max_iters (unset: 30, or a
    quarter of max_iters when that is fewer, so a short smoke test needs no other flag; with
    --init_from 0)."""
    weight_decay: float = 0.1
    """AdamW weight decay, applied to 2-D weights only (not to biases and LayerNorm gains)."""
    beta2: float = 0.99
    """AdamW beta2; 0.99 suits small batches, 0.95 large ones."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    ema_decay: float | None = None
    """Evaluate and export an exponential moving average of the weights with this decay per
    iteration, in [0, 1) (0: the weights as trained; training itself is the same either way,
    gpt/training/ema.py). Unset: 0.995 (about the last 200 iterations) when the run passes over
    its training split at least 4 times (the default corpus: 18) in at least 600 iterations:
    there the validation loss is flat over the last few hundred iterations, which overfit, and
    their average generalises better. Else 0: the average lags behind a model still learning,
    on a larger corpus or in a shorter run (bench/recipe_trials.md)."""
    # reporting and checkpoints
    eval_interval: int = 250
    """Evaluate on val.bin every this many iterations (and at the end)."""
    eval_iters: int = 200
    """Batches per evaluation, at most (a small validation split is evaluated whole)."""
    log_interval: int = 10
    """Print progress and append to metrics/train.jsonl every this many iterations (and after
    the first)."""
    ckpt_interval: int = 500
    """Write a checkpoint every this many iterations (and at the end)."""
    ckpt_interval_s: float = 300.0
    """Also write one when this many seconds of training passed since the last (rank 0's clock;
    0: iterations only), so a run killed without warning loses minutes, not hours. When
    checkpoints are written never changes the weights. A SIGTERM writes one too
    (gpt/training/stopping.py)."""
    keep_last: int = 2
    """Keep the newest this many checkpoints."""
    resume: Literal["auto", "never", "require"] = "auto"
    """auto: continue from ckpt/LATEST if there is one; never: start over, removing old
    checkpoints; require: fail unless there is a checkpoint to continue from."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train; auto picks CUDA when available."""
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """Precision of the forward and backward passes: bfloat16 autocast (weights and optimizer
    stay float32), or float32 throughout; auto: bfloat16 on a GPU that has it (float32 matmuls
    there run as TF32), float32 on a CPU."""
    compile: bool | None = None
    """torch.compile the model (unset: on a GPU, where its ~40 s pay off within minutes; not on
    a CPU, where a small model's compiling costs more than it saves)."""
    chunked_loss: bool | None = None
    """Compute the loss a chunk of positions at a time, never holding the whole (micro-batch,
    context, vocabulary) logits (unset: on a GPU, where they are an iteration's largest tensors;
    not on a CPU, whose runs keep their bits: the chunks sum in another order)."""
    activation_checkpointing: bool = False
    """Keep only each transformer block's input for the backward pass and compute the rest of
    its activations again there: about a third more compute for a fraction of the activations'
    memory (bench/activation_memory.py), the same loss and gradients. For a model or context
    whose activations do not fit the device."""
    shard: bool = False
    """Shard the weights, gradients and AdamW's state over the ranks torchrun starts (PyTorch's
    FSDP2, each transformer block then the rest), instead of a whole copy on every rank (DDP):
    about 16 / ranks bytes a parameter plus one block's weights gathered at a time, for a model
    that does not fit one device. Checkpoints are then written sharded
    (torch.distributed.checkpoint), every rank its part, and resume on any number of ranks."""
    lora_rank: int = 0
    """Train low-rank adapters (LoRA, through PEFT: gpt/models/lora.py) of this rank beside the
    projections --lora_targets names, every weight of the pretrained model frozen: a fraction of
    the parameters to train, so gradients and AdamW's moments for a fraction of the memory.
    Needs --init_from. The export model/ has the adapters merged in; adapter/ holds them alone,
    in PEFT's format. 0: off, the whole model trains."""
    lora_alpha: float = 16.0
    """LoRA's scale: an adapter adds lora_alpha / lora_rank times its low-rank product to its
    projection. Fixed while the rank changes, as the LoRA paper advises, so another rank needs
    no other learning rate."""
    lora_targets: str = ",".join(LORA_TARGETS)
    """The projections that get adapters, comma-separated, of attn.c_attn (queries, keys,
    values), attn.c_proj (attention's output), mlp.c_fc and mlp.c_proj (the MLP's two). Every
    one by default: adapting all of them is what matched full fine-tuning in QLoRA's
    measurements, where attention's alone fell short."""
    fused_loss: bool = False
    """Compute each chunk's cross-entropy, its loss and its gradient, in one Triton kernel
    (gpt/models/fused_loss.py) instead of PyTorch's ops: CUDA only, and with the chunked loss
    (unset --chunked_loss means it then). Off until measured (bench/speed_trials.md)."""
    export_uri: str = ""
    """Also copy the finished model/ to this object-store prefix (s3://bucket/prefix, e.g. for
    KServe's storageUri, or gs://...) after it is written locally; its manifest gpt-export.json
    is written last, so a prefix without it holds no complete export. Empty: no copy."""

    def __post_init__(self) -> None:
        RunConfig.__post_init__(self)
        ModelConfig.__post_init__(self)
        InitFromConfig.__post_init__(self)
        if not self.init_from:  # else the pretrained model's shape fills the unset flags
            shape = self.shape_with(DEFAULT_SHAPE)
            check_heads(shape["n_embd"], shape["n_head"], shape["position"])
        positive = ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters",
                    "log_interval", "ckpt_interval", "keep_last")
        for name in positive:
            check_positive_int(name, getattr(self, name))
        if self.batch_size % self.grad_accum:
            raise ValueError(f"--batch_size {self.batch_size}: must be divisible by "
                             f"--grad_accum {self.grad_accum}")
        if self.warmup_iters is not None and (not isinstance(self.warmup_iters, int)
                                              or not 0 <= self.warmup_iters < self.max_iters):
            raise ValueError(
                f"--warmup_iters {self.warmup_iters}: must be in [0, --max_iters {self.max_iters})"
            )
        if not self.time_budget >= 0:
            raise ValueError(f"--time_budget {self.time_budget}: must be >= 0 (0 = no limit)")
        if not self.ckpt_interval_s >= 0:
            raise ValueError(f"--ckpt_interval_s {self.ckpt_interval_s}: must be >= 0 "
                             "(0 = iterations only)")
        check_rates(self.learning_rate, self.min_lr)
        if not 0 < self.beta2 < 1:
            raise ValueError(f"--beta2 {self.beta2}: must be in (0, 1)")
        if self.ema_decay is not None and not 0 <= self.ema_decay < 1:
            raise ValueError(f"--ema_decay {self.ema_decay}: must be in [0, 1) (0 = no average)")
        for name in ("weight_decay", "grad_clip"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name} {getattr(self, name)}: must be >= 0")
        if self.export_uri:
            check_uri(self.export_uri, "--export_uri")
        check_lora(self.lora_rank, self.lora_alpha, self.lora_targets, self.init_from)
        if self.lora_rank and self.shard:
            # A sharded checkpoint holds the model's whole state dict, where a LoRA one holds
            # the adapters alone; the adapters' state is small enough for DDP anyway.
            raise ValueError(f"--shard true with --lora_rank {self.lora_rank}: not both; "
                             "adapters train under DDP (leave --shard false)")
        if self.fused_loss and self.chunked_loss is False:
            raise ValueError("--fused_loss true: computes the chunked loss; leave --chunked_loss "
                             "unset or true")

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_finished"):
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to field {name!r}: the run's config is finished "
                "(gpt/training/recipe.py)")
        super().__setattr__(name, value)

    def finished(self) -> TrainConfig:
        """This config, read-only from now on: what gpt/training/recipe.py returns once it has
        decided every unset flag. (The mark is no field: `dataclasses.replace` makes a config
        that may change again, and no saved flags carry it.)"""
        object.__setattr__(self, "_finished", True)
        return self


def check_lora(rank: Any, alpha: float, targets: str, init_from: str) -> None:
    """Refuse LoRA flags no run can take: a rank that is no integer >= 0, a scale that is not
    positive, a target that is no projection of the model (or named twice), and adapters
    without --init_from, whose frozen weights would be random ones (train the whole model
    then)."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ValueError(f"--lora_rank {rank!r}: must be an integer >= 0 (0: off)")
    if not alpha > 0:
        raise ValueError(f"--lora_alpha {alpha!r}: must be > 0")
    names = targets.split(",")
    for name in names:
        if name not in LORA_TARGETS:
            raise ValueError(f"--lora_targets {targets!r}: {name!r} is none of "
                             f"{', '.join(LORA_TARGETS)} (comma-separated)")
    if len(set(names)) < len(names):
        raise ValueError(f"--lora_targets {targets!r}: names a projection twice")
    if rank and not init_from:
        raise ValueError(f"--lora_rank {rank}: adapts a pretrained model, whose weights it "
                         "freezes; give --init_from (from random weights, train the whole "
                         "model: leave --lora_rank 0)")


def check_rates(learning_rate: float | None, min_lr: float | None) -> None:
    """Refuse rates no schedule can take: a peak that is not positive, an end outside
    [0, peak] (either may still be unset: then only the other is checked)."""
    if learning_rate is not None and not learning_rate > 0:
        raise ValueError(f"--learning_rate {learning_rate}: must be > 0")
    if min_lr is not None and not 0 <= min_lr <= (
            math.inf if learning_rate is None else learning_rate):  # fmt: skip
        raise ValueError(f"--min_lr {min_lr}: must be in [0, --learning_rate]")


@dataclass
class CorpusConfig(InitFromConfig, ContextConfig, RunConfig):
    """load-corpus's flags: the run directory, the source, the tokenizer, and these."""

    source: str = DEFAULT_SOURCE
    """What to train on: an http(s) URL, a local file, a local directory (its corpus files in
    name order), an s3:// or gs:// object, an s3:// or gs:// prefix ending in '/' (its corpus
    objects in key order), a Hugging Face dataset hf://datasets/ORG/NAME[@REVISION][/PATH] (a
    file, a folder or a glob), or 'default' (or empty) for the embedded Comedy of Errors, which
    needs no network. Corpus files: .txt (one document), .jsonl or .json (JSON Lines) and
    .parquet (one document a record), each optionally .gz, .zst, .bz2 or .xz."""
    text_field: str = "text"
    """JSON Lines and Parquet sources: the field (column) holding each record's text."""
    chat: bool = False
    """Records are conversations: each JSON Lines or Parquet record's 'messages' (an array of
    {role: system, user or assistant; content}), rendered with the chat template, the loss on
    the assistant's turns alone (gpt2 tokenizer only)."""
    tokenizer: Literal["gpt2", "char"] = "gpt2"
    """gpt2: GPT-2 BPE (tiktoken, offline); char: one token per character of the corpus. With
    --init_from, the kind of that model's tokenizer, which is used instead."""
    compact: bool = True
    """gpt2 only: keep just the BPE tokens the corpus uses plus the 256 single bytes, so a small
    corpus gets a small embedding table (a prompt's unseen tokens are spelt with the kept ones)."""
    max_vocab: int = 8192
    """gpt2 with --compact: keep at most this many ids (the 256 bytes, end-of-text and the most
    frequent BPE tokens, counted on a 16 MB sample of a text over 64 MB); rarer tokens are spelt
    with the kept ones. 0: no limit (every token the corpus uses, counted exactly), which
    --init_from always takes (the text as the pretrained model's tokenizer splits it)."""
    val_fraction: float = 0.1
    """Fraction of the cleaned text, taken from its end, held out for validation."""
    overwrite: bool = False
    """Replace this run's corpus and data even if they came from different inputs."""
    download_timeout: float = 30.0
    """Seconds to wait on a URL or an object store (connect and each read) before an attempt
    fails."""
    download_retries: int = 3
    """Extra attempts after a failed download (connection errors, timeouts, HTTP 5xx/429; the
    object stores' own throttling and server errors)."""
    download_backoff: float = 1.0
    """Seconds before the first retry; doubled before each further one."""
    max_bytes: int = MAX_BYTES
    """Refuse a source larger than this many bytes (downloads stop reading past it). The default,
    10 GB (about 2.5 billion GPT-2 tokens), is sized for real corpora: memory no longer grows with
    the corpus, but disk and time do (the run needs about 2.5x the source on its volume while it
    works: a downloaded copy, the cleaned text, the token files; and at ~10 MB/s on 2 cores,
    10 GB takes about 17 minutes), so a larger source is refused as a likely mistake."""

    def __post_init__(self) -> None:
        RunConfig.__post_init__(self)
        ContextConfig.__post_init__(self)
        InitFromConfig.__post_init__(self)
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"--val_fraction {self.val_fraction}: must be in (0, 1)")
        if self.max_vocab and self.max_vocab < 257:  # the 256 bytes and end-of-text
            raise ValueError(f"--max_vocab {self.max_vocab}: must be 0 (no limit) or >= 257")
        if not self.download_timeout > 0:
            raise ValueError(f"--download_timeout {self.download_timeout}: must be positive")
        if self.download_retries < 0:
            raise ValueError(f"--download_retries {self.download_retries}: must be >= 0")
        if self.download_backoff < 0:
            raise ValueError(f"--download_backoff {self.download_backoff}: must be >= 0")
        if self.max_bytes < 1:
            raise ValueError(f"--max_bytes {self.max_bytes}: must be at least 1")
        if not self.text_field:
            raise ValueError("--text_field '': name the field holding each record's text")
        if self.chat and self.tokenizer != "gpt2":
            raise ValueError(f"--chat true: needs --tokenizer gpt2 (the chat markers are BPE "
                             f"special tokens), not {self.tokenizer}")


_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


@dataclass
class PromptConfig(SeedConfig, SamplingConfig, RunConfig):
    """generative-prompt's flags: the run directory, the sampling settings, and these."""

    prompt: list[str] = field(default_factory=list)
    """Answer this prompt and exit instead of opening the interactive prompt (repeatable; a chat
    model takes each as the next turn of one conversation)."""
    system: str = ""
    """A chat model's system prompt, the conversation's first turn (/system changes it)."""
    idle_timeout: float = 0.0
    """End the interactive session after this many seconds without input; 0: wait forever."""
    web_port: int = 0
    """Serve a chat page on this port of localhost instead of the terminal prompt (on a cluster:
    kubectl port-forward to it); 0: the terminal."""
    device: str = "auto"
    """Where the model runs: auto (cuda if available, else cpu), cpu, cuda, cuda:N, mps."""

    def __post_init__(self) -> None:
        RunConfig.__post_init__(self)
        SamplingConfig.__post_init__(self)
        if not self.idle_timeout >= 0:  # also refuses NaN
            raise ValueError(f"--idle_timeout {self.idle_timeout!r}: must be >= 0 seconds "
                             "(0: wait forever)")
        if not _DEVICE.match(self.device):
            raise ValueError(
                f"--device {self.device!r}: must be auto, cpu, mps, cuda or cuda:N"
            )
        if not 0 <= self.web_port <= 65535:
            raise ValueError(f"--web_port {self.web_port}: must be a port, 1 to 65535 (0: the "
                             "terminal)")
        if self.web_port and self.prompt:
            raise ValueError("--web_port with --prompt: --prompt answers and exits, --web_port "
                             "serves a page; choose one")

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(**fields_of(self, SamplingConfig))

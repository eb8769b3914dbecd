"""A decoder-only GPT, in the shape of GPT-2, in one file that reads top to bottom.

Token embeddings, pre-LayerNorm transformer blocks (causal self-attention, then an MLP), a final
LayerNorm and a language-model head that shares its weight with the token embedding. Positions
are rotary by default, or GPT-2's learned table (`position`); the MLP uses a squared ReLU by
default, or a GELU (`activation`: exact, or GPT-2's tanh approximation `gelu_new`): the
defaults learned more per CPU-second here (bench/recipe_trials.md), and GPT-2's choices remain
so the nanoGPT reference runs unchanged and GPT-2's released weights load exactly.
While it trains, the embedding can be spelled: each row the mean of vectors shared by the
token's byte n-grams (gpt/models/spelling.py) plus, but for a token too rare in the training split,
a free vector of its own; still one matrix, which inference and the export use as a plain table.
Attention runs through `scaled_dot_product_attention`, which picks flash or memory-efficient
kernels where the device has them. A `KVCache` lets generation feed one new token at a time
instead of the whole context.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from gpt.config.configs import GPTConfig
from gpt.models.loss import linear_cross_entropy
from gpt.models.spelling import Spelling

# The embedding and output matrices get rows for ids no tokenizer emits, up to a multiple of 64
# (GPT-2's 50,257 -> 50,304, as nanoGPT does): GPU matmuls over a dimension that is a multiple of
# their tile size run whole tiles instead of a ragged last one. The loss gives padding ids
# probability 0 and `GPT.forward` returns logits of the real ids only, so the model is the
# unpadded one, and nothing can sample a padding id. Exports leave the padding rows out
# (gpt/models/export.py).
VOCAB_MULTIPLE = 64


def padded_vocab(vocab_size: int) -> int:
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


class KVCache:
    """Keys and values of every layer for the tokens seen so far.

    Preallocated to the context window so decoding never reallocates; `pos` counts the tokens
    already stored. The model writes each layer's new keys/values at `pos`, then `advance`s.
    """

    def __init__(self, config: GPTConfig, batch_size: int, device, dtype) -> None:
        head_dim = config.n_embd // config.n_head
        shape = (config.n_layer, batch_size, config.n_head, config.block_size, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = 0

    @property
    def capacity(self) -> int:
        return self.k.size(3)

    def store(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys/values (B, nh, T, hs); return all so far, (B, nh, pos+T, hs)."""
        end = self.pos + k.size(2)
        self.k[layer, :, :, self.pos : end] = k
        self.v[layer, :, :, self.pos : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, n: int) -> None:
        self.pos += n

    def reset(self) -> None:
        self.pos = 0


class Rotary(nn.Module):
    """Rotary position embeddings (RoFormer, Su et al. 2021) for the model's context window.

    Instead of adding a learned position vector to each token, every query and key is rotated by
    angles proportional to its position, so the q.k score depends only on how far apart two
    tokens are. It costs no parameters, and a window that restarts at 0 (generation past
    block_size) looks like any window seen in training.
    """

    def __init__(self, head_dim: int, block_size: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = base ** -(torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(block_size, dtype=torch.float32), inv_freq)
        # Both halves' factors at full width, the sign of the rotation folded into sin, so that
        # apply_rotary is one multiply and one multiply-add. Not saved with the weights
        # (persistent=False): they follow from the shape alone. The middle axis broadcasts over
        # the heads of (B, T, heads, hs).
        cos = torch.cat((angles.cos(), angles.cos()), dim=-1)[:, None]  # (block_size, 1, hs)
        sin = torch.cat((-angles.sin(), angles.sin()), dim=-1)[:, None]  # (block_size, 1, hs)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, start: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and (signed) sin of positions start .. start+T-1, each (T, 1, hs)."""
        return self.cos[start : start + T], self.sin[start : start + T]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, T, heads, hs) queries or keys: each pair (x[i], x[i + hs/2]) by its position's
    angle, (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, T, heads, hs/2) each
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # keep bf16 activations bf16 under autocast
    return torch.addcmul(x * cos, torch.cat((x2, x1), dim=-1), sin)


def dropout_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """A dropout mask like `x`, already scaled: each element 0 with probability p (rounded to a
    multiple of 1/65536), else 1 / (1 - p).

    For a CPU: PyTorch's CPU dropout draws its Bernoulli mask one element at a time, but for Intel
    CPUs (MKL); on an AMD EPYC that was 13% of the default corpus's training iteration. Here every
    64-bit draw of the same generator (so seeding and a checkpoint's RNG state govern it as they
    do dropout) gives four elements 16 random bits each, at a quarter of the cost.
    """
    drop = min(round(p * 65536), 65535)  # of 65536 equally likely values of the 16 bits
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device)
    bits = words.random_(-(2**63), None).view(torch.int16)[: x.numel()].view(x.shape)  # all 64
    return (bits >= drop - 32768).to(x.dtype).mul_(65536 / (65536 - drop))


class Dropout(nn.Dropout):
    """`nn.Dropout`, with `dropout_mask` on a CPU; elsewhere the device's fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not self.p or x.device.type != "cpu":
            return super().forward(x)
        return x * dropout_mask(x, self.p)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float
) -> torch.Tensor:
    """Causal self-attention of (B, nh, T, hs) queries, keys and values, with dropout on the
    attention weights. Written out on a CPU when there is dropout: `scaled_dot_product_attention`
    computes the same there (its fused kernel takes no dropout) but with PyTorch's slow mask."""
    if not dropout_p or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    T = q.size(2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, nh, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
    att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
    return (att * dropout_mask(att, dropout_p)) @ v  # (B, nh, T, hs)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        # query, key and value projections for all heads in one matmul
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = Dropout(config.dropout)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
        cache: KVCache | None, layer: int,
    ) -> torch.Tensor:
        B, T, C = x.size()
        nh, hs = self.n_head, C // self.n_head
        qkv = self.c_attn(x).view(B, T, 3 * nh, hs)  # queries, keys, values of all heads
        # split, not two slices: its backward writes both gradients into one tensor, where each
        # slice's would zero a gradient of qkv's full size and then add them up.
        qk, v = qkv.split([2 * nh, nh], dim=2)  # (B, T, 2nh, hs), (B, T, nh, hs)
        if rope is not None:
            # Queries and keys in one pass (half the kernels of two); keys before they are
            # cached, so cached keys keep their own positions.
            qk = apply_rotary(qk, *rope)
        q, k = qk.transpose(1, 2).split(nh, dim=1)  # (B, nh, T, hs) each
        v = v.transpose(1, 2)  # (B, nh, T, hs)
        dropout_p = self.dropout if self.training else 0.0
        if cache is None:
            y = causal_attention(q, k, v, dropout_p)
        else:
            k, v = cache.store(layer, k, v)  # (B, nh, L, hs), L = cached + T
            L = k.size(2)
            # SDPA's is_causal aligns the mask top-left, which is wrong when the queries are the
            # last T of L positions; a single new token may attend to everything, so needs none.
            mask = None
            if T > 1:
                mask = torch.ones(T, L, dtype=torch.bool, device=x.device).tril(diagonal=L - T)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all heads side by side
        return self.resid_dropout(self.c_proj(y))


class ReLUSquared(torch.autograd.Function):
    """relu(x)^2, with its gradient 2 relu(x) in one pass: autograd's chain for
    `relu(x).square()` takes three (measured on a CPU: 6% of a baby-GPT training iteration)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        r = F.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (r,) = ctx.saved_tensors
        return grad.mul(r).mul_(2)


class MLP(nn.Module):
    """Two linear layers around a squared ReLU (So et al. 2021, "Primer"), the exact GELU, or
    GPT-2's tanh-approximated GELU (`gelu_new`, transformers' name)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.activation = config.activation
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)  # (B, T, 4C)
        if self.activation == "relu2":
            h = ReLUSquared.apply(h)
        else:  # GPT-2's released weights were trained with the tanh approximation (gelu_new)
            h = F.gelu(h, approximate="tanh" if self.activation == "gelu_new" else "none")
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
        cache: KVCache | None, layer: int,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope, cache, layer)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """With a `spelling` of its vocabulary (as train-gpt builds it when `config.spelling` is
    set), the embedding is spelled: `embedding()` is the free table (its rows of tokens without a
    free vector kept at 0) plus each token's mean n-gram vector. Without, it is the plain table,
    which is what inference and the export use:
    `export.export_weights` writes the spelled matrix out as one."""

    chunked_loss: bool = False
    """Whether `forward` computes the loss of `targets` in chunks of positions
    (`gpt.models.loss.linear_cross_entropy`), never forming the whole (B, T, padded vocab) logits,
    and returns no logits with it (train-gpt's --chunked_loss, which gpt/training/recipe.py
    turns on for CUDA, where those logits and their float32 copies are a training iteration's
    largest tensors: 13.2 GB each at GPT-2's shape, 64 sequences a micro-batch)."""
    activation_checkpointing: bool = False
    """Whether training's forward keeps only each block's input for backward, which runs the
    block again to get the rest (train-gpt's --activation_checkpointing): the activations of one
    block at a time instead of all `n_layer`, for a third more compute. Dropout draws the same
    masks the second time (the checkpoint restores the RNG state), so the gradients are those
    of the plain forward."""
    fused_loss: bool = False
    """Whether that chunked loss computes each chunk's cross-entropy in one Triton kernel
    (gpt/models/fused_loss.py, train-gpt's --fused_loss; CUDA only): then the loss is chunked
    whatever `chunked_loss` says."""

    def __init__(self, config: GPTConfig, spelling: Spelling | None = None) -> None:
        super().__init__()
        self.config = config
        modules = dict(wte=nn.Embedding(padded_vocab(config.vocab_size), config.n_embd))
        if config.position == "learned":  # in nanoGPT's place, so it initialises as nanoGPT
            modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        else:
            self.rotary = Rotary(config.n_embd // config.n_head, config.block_size)
        self.transformer = nn.ModuleDict(
            dict(
                **modules,
                drop=Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, padded_vocab(config.vocab_size), bias=False)
        # Padding ids' logits are -inf, so the softmax is the real vocabulary's alone and padding
        # rows get no gradient. A bias the output matmul adds: masking the logits in place made
        # backward copy the iteration's largest tensor, and slicing them copies it forward.
        padding = self.lm_head.weight.size(0) - config.vocab_size
        mask = F.pad(torch.zeros(config.vocab_size), (0, padding), value=float("-inf"))
        self.register_buffer("logit_mask", mask if padding else None, persistent=False)
        # Weight tying: the token embedding and the output projection are one matrix, which
        # saves vocab_size * n_embd parameters and helps small models generalise.
        self.transformer.wte.weight = self.lm_head.weight
        self.spelled = spelling is not None
        if spelling is not None:
            if spelling.vocab_size != config.vocab_size or spelling.n != config.spelling:
                raise ValueError(f"a spelling of {spelling.vocab_size} tokens in up to "
                                 f"{spelling.n}-grams does not fit {config}")
            self.transformer.wse = nn.Embedding(spelling.grams, config.n_embd)  # n-gram vectors
            # Rebuilt from the tokenizer, never saved (persistent=False).
            for name in ("index", "offsets", "weights"):
                self.register_buffer(f"spell_{name}", getattr(spelling, name), persistent=False)
            free = F.pad(spelling.free.float(), (0, padding), value=1.0)[:, None]  # (padded, 1)
            self.register_buffer("spell_free", free, persistent=False)
        self.apply(self._init_weights)
        if self.spelled:  # a token without a free vector starts, and stays, at its spelling
            with torch.no_grad():
                self.lm_head.weight.mul_(self.spell_free)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer) so the residual stream's
        # variance does not grow with depth (two residual additions per block).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Parameter count (the tied token embedding once: as the output head it does compute),
        without the padding rows, which take no part in the model, and without a spelled
        embedding's n-gram table, which the embedding folds in."""
        padding = (self.lm_head.weight.size(0) - self.config.vocab_size) * self.config.n_embd
        spelling = self.transformer.wse.weight.numel() if self.spelled else 0  # folds into wte
        return sum(p.numel() for p in self.parameters()) - padding - spelling

    def num_trained_params(self) -> int:
        """Parameters the optimizer updates: `num_params`, or where some are frozen (LoRA's
        adapters added, gpt/models/lora.py: the pretrained weights) the rest alone."""
        trained = [p for p in self.parameters() if p.requires_grad]
        if len(trained) == len(list(self.parameters())):
            return self.num_params()
        return sum(p.numel() for p in trained)

    def describe(self) -> str:
        """The model in one line, for logs and reports (the one place it is spelled out)."""
        c = self.config
        rows = padded_vocab(c.vocab_size)
        padding = f" (padded to {rows})" if rows != c.vocab_size else ""
        spelled = ""
        if self.spelled:
            alone = c.vocab_size - int(self.spell_free[: c.vocab_size].sum())
            spelled = (f" spelled in {self.transformer.wse.num_embeddings:,} byte "
                       f"1-{c.spelling}-grams")
            if alone:
                spelled += f" ({alone:,} rare tokens spelled alone)"
        trained = self.num_trained_params()
        frozen = f", {trained:,} of them trained" if trained != self.num_params() else ""
        return (f"{self.num_params() / 1e6:.2f}M parameters: {c.n_layer} layers x {c.n_head} heads "
                f"x {c.n_embd} wide, context {c.block_size}, vocab {c.vocab_size}{padding}"
                f"{spelled}, dropout {c.dropout:g}{frozen}")

    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward), as in the PaLM paper's appendix B: of
        the real vocabulary, so the padding rows' work counts as overhead in MFU."""
        cfg = self.config
        n_params = self.num_params()
        attn = 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
        return 6 * n_params + attn

    def embedding(self) -> torch.Tensor:
        """The token embedding, which is also the output head's weight: (padded vocab, C)."""
        table = self.lm_head.weight
        if not self.spelled:
            return table
        table = table * self.spell_free  # no gradient reaches the rows it keeps at 0
        spelt = F.embedding_bag(self.spell_index, self.transformer.wse.weight, self.spell_offsets,
                                mode="sum", per_sample_weights=self.spell_weights)  # (vocab, C)
        return table + F.pad(spelt, (0, 0, 0, table.size(0) - spelt.size(0)))  # padding rows: 0

    def new_cache(self, batch_size: int = 1) -> KVCache:
        p = self.lm_head.weight
        return KVCache(self.config, batch_size, device=p.device, dtype=p.dtype)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
        embedding: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logits of the real token ids (B, T, vocab_size) for every position of `idx` (B, T),
        and the mean cross-entropy if `targets` (then no logits where the loss is computed in
        chunks: `chunked_loss`).

        With a `cache`, `idx` continues the sequence already in it: positions start at
        `cache.pos`, and the cache advances by T. `embedding`: what `embedding()` returns, where
        the caller built it already (train-gpt: once per iteration, not per micro-batch).
        """
        B, T = idx.size()
        start = cache.pos if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(
                f"sequence of {start + T} tokens exceeds block_size {self.config.block_size}"
            )
        if embedding is None:
            embedding = self.embedding()  # (padded vocab, C), computed once for input and output
        x = F.embedding(idx, embedding)  # (B, T, C)
        rope = None
        if self.config.position == "learned":
            x = x + self.transformer.wpe(torch.arange(start, start + T, device=idx.device))
        else:
            rope = self.rotary(start, T)  # positions start .. start+T-1, shared by every layer
        x = self.transformer.drop(x)
        recompute = self.activation_checkpointing and torch.is_grad_enabled() and cache is None
        for layer, block in enumerate(self.transformer.h):
            if recompute:  # not reentrant: the one PyTorch recommends, and DDP- and compile-safe
                x = checkpoint(block, x, rope, None, layer, use_reentrant=False)
            else:
                x = block(x, rope, cache, layer)
        x = self.transformer.ln_f(x)
        if cache is not None:
            cache.advance(T)
        if targets is not None and (self.chunked_loss or self.fused_loss):
            loss_of = linear_cross_entropy
            if self.fused_loss:  # imported only here: Triton, which the CPU image lacks
                from gpt.models.fused_loss import fused_linear_cross_entropy as loss_of
            loss = loss_of(x.view(B * T, -1), embedding, self.logit_mask, targets.view(-1))
            return None, loss
        logits = F.linear(x, embedding, self.logit_mask)  # (B, T, padded vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits[..., : self.config.vocab_size], loss  # a view: (B, T, vocab_size)

"""A GPT-style decoder-only transformer you can read in one sitting.

Pre-LayerNorm blocks, learned absolute positions, tied input/output embeddings, dropout. The attention kernel is
pluggable (memlab.core.attention): the model only hands it q, k, v and asks for causal (optionally windowed)
attention. Shapes are noted as B (batch), T (sequence), C (d_model), nh (heads), hs (head size), V (vocab).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from memlab.core.attention.kernel import AttentionKernel
from memlab.core.fused.forward import fused_head_loss, fused_hidden
from memlab.core.loss import loss_from_hidden


@dataclass
class GPTConfig:
    n_layer: int
    n_head: int
    d_model: int
    d_ff: int
    vocab_size: int
    seq_len: int
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, kernel: AttentionKernel):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.kernel = kernel

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """Everything before the output projection: (B, T, C) -> attention output (B, T, C)."""
        return self.attend_projected(self.qkv(x))

    def attend_projected(self, qkv: torch.Tensor) -> torch.Tensor:
        """The attention over the qkv projection (B, T, 3C) -> its output (B, T, C)."""
        B, T, C = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        dropout_p = self.resid_dropout.p if self.training else 0.0
        packed = getattr(self.kernel, "packed", None)
        if packed is not None:  # FA4: takes the projection whole, and writes its gradient whole (no concatenation)
            return packed(qkv, self.n_head, dropout_p)
        q, k, v = qkv.split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs): the layout every kernel takes; flash-style kernels transpose inside.
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = self.kernel(q, k, v, dropout_p=dropout_p)  # (B, nh, T, hs)
        return y.transpose(1, 2).contiguous().view(B, T, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resid_dropout(self.proj(self.attend(x)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.proj = nn.Linear(cfg.d_ff, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, kernel: AttentionKernel):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg, kernel)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    family = "gpt"
    architecture = "gpt"

    def __init__(self, cfg: GPTConfig, kernel: AttentionKernel):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, kernel) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings: one V x C matrix, not two
        self.loss_chunk_size = 0  # rows per cross-entropy chunk; 0 = full logits (set from the profile's [loss])
        self.loss_kernel = None  # loss.fused: a library's head + loss in one (memlab.core.linear_ce), else None
        self.fused = False  # kernels.fused: hidden() and the loss run through memlab.core.fused (same function, fewer passes)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections keeps the residual stream's variance flat with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # The family adapter's names (memlab.core.models.family): what techniques ask for, whatever the model.
    @property
    def final_norm(self) -> nn.Module:
        return self.ln_f

    @property
    def head(self) -> nn.Module:
        return self.lm_head

    @property
    def embedding(self) -> nn.Module:
        return self.wte

    @staticmethod
    def sublayer(block: Block, which: str) -> nn.Module:
        return block.attn if which == "attention" else block.mlp

    def flops_params(self) -> int:
        """Parameters that multiply each token: all but the position table (the tied head is a matmul)."""
        return self.num_params() - self.wpe.weight.numel()

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters counted once (the tied matrix once). non_embedding drops wte and wpe (for FLOPs)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel() + self.wpe.weight.numel()
        return n

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> final hidden states (B, T, C), before the LM head."""
        if self.fused:
            return fused_hidden(self, idx)
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (B, T) -> logits (B, T, V); with targets (B, T), the mean next-token loss instead.

        The loss is computed here (not by the caller) so that torch.compile sees it whole, and so that chunked
        cross-entropy (loss_chunk_size > 0) or a library's fused kernel (loss_kernel) never builds the B x T x V logits.
        """
        h = self.hidden(idx)
        if targets is None:
            return self.lm_head(h)
        if self.loss_kernel is not None:
            return self.loss_kernel(h, self.lm_head.weight, targets)
        if self.fused and not self.loss_chunk_size:
            return fused_head_loss(h, self.lm_head.weight, targets)
        return loss_from_hidden(h, self.lm_head.weight, targets, self.loss_chunk_size)


def build_gpt(cfg: GPTConfig, kernel: AttentionKernel) -> GPT:
    return GPT(cfg, kernel)

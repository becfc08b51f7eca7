"""A toy GPT and a small experiment, for the tests of the model, the techniques and the estimator."""

from __future__ import annotations

import torch

from memlab.core.attention import build_attention
from memlab.core.config import AttentionConfig, Experiment, ModelConfig
from memlab.core.model import GPT, GPTConfig

CPU = torch.device("cpu")
CFG = GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, vocab_size=96, seq_len=16)


def kernel(name="sdpa", window=0):
    return build_attention(AttentionConfig(kernel=name, window=window), CPU, torch.float32)


def make_model(seed=0, k=None, cfg=CFG):
    torch.manual_seed(seed)
    return GPT(cfg, k or kernel())


def batch(seed=1, B=3, cfg=CFG):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (B, cfg.seq_len), generator=g)
    return x, torch.roll(x, -1, dims=1)


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_loss_and_grads(ref, model, run=None, **tol):
    """One batch through `ref` and through `model` (or `run`, what trains it: e.g. its compiled wrapper); the same
    loss, and the same gradient for every parameter (`tol`: assert_close's atol / rtol for the gradients)."""
    x, y = batch()
    l1, l2 = ref(x, y), (model if run is None else run)(x, y)
    l1.backward()
    l2.backward()
    torch.testing.assert_close(l1, l2)
    for (n, a), b in zip(grads(ref).items(), grads(model).values()):
        torch.testing.assert_close(a, b, msg=n, **tol)



def small(L=2, C=64, H=2, T=64, V=512, batch=4, **train) -> Experiment:
    e = Experiment(name="small", model=ModelConfig(n_layer=L, n_head=H, d_model=C, seq_len=T, vocab_size=V))
    e.train.batch_size = batch
    for k, v in train.items():
        setattr(e.train, k, v)
    return e

"""Built-in model presets: the published config.json values of well-known causal LMs (facts, not downloads).

Each preset is what the model's config.json on its hub page says (architecture keys only: no weights, no tokenizer).
`params` is the published parameter count, checked against the model transformers builds (tests/test_models.py).
"""

from __future__ import annotations

from typing import Any

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

PRESETS: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {
        "hub": "meta-llama/Llama-3.2-1B", "params": 1_235_814_400,
        "config": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
                   "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
                   "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": _LLAMA3_ROPE,
                   "tie_word_embeddings": True, "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128001},
    },
    "llama-3.1-8b": {
        "hub": "meta-llama/Llama-3.1-8B", "params": 8_030_261_248,
        "config": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
                   "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
                   "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0},
                   "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128001},
    },
    "qwen2.5-0.5b": {
        "hub": "Qwen/Qwen2.5-0.5B", "params": 494_032_768,
        "config": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
                   "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                   "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
                   "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "hidden_act": "silu",
                   "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151643},
    },
    "qwen2.5-1.5b": {
        "hub": "Qwen/Qwen2.5-1.5B", "params": 1_543_714_304,
        "config": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 1536,
                   "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                   "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 131072,
                   "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "hidden_act": "silu",
                   "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151643},
    },
    "qwen2.5-7b": {
        "hub": "Qwen/Qwen2.5-7B", "params": 7_615_616_512,
        "config": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584,
                   "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 131072,
                   "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False, "hidden_act": "silu",
                   "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151643},
    },
    "mistral-7b": {
        "hub": "mistralai/Mistral-7B-v0.3", "params": 7_248_023_552,
        "config": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 4096,
                   "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 32768, "max_position_embeddings": 32768,
                   "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": None,
                   "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2},
    },
    "gemma-2-2b": {
        "hub": "google/gemma-2-2b", "params": 2_614_341_888,
        "config": {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "hidden_size": 2304,
                   "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
                   "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                   "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                   "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                   "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0},
    },
    "gpt2": {
        "hub": "openai-community/gpt2", "params": 124_439_808,
        "config": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_layer": 12,
                   "n_head": 12, "n_inner": None, "n_positions": 1024, "vocab_size": 50257,
                   "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
                   "bos_token_id": 50256, "eos_token_id": 50256},
    },
}

"""Tiny random-weight checkpoints written by transformers, for numerical comparisons."""

from __future__ import annotations

import shutil
from pathlib import Path

VOCAB = 49152  # the default model's tokenizer is copied next to every tiny model

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)

# name -> (transformers config class name, extra kwargs): every model family, with the features
# that set it apart switched on (sliding windows, soft-caps, partial rotary, scaled rope, MoE ...)
TINY_CONFIGS = {
    "llama": ("LlamaConfig", dict(rope_theta=10000.0)),
    "llama3_scaled": ("LlamaConfig", dict(
        rope_theta=500000.0, head_dim=32, max_position_embeddings=512,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 128})),
    "llama_tied_mha": ("LlamaConfig", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", dict(sliding_window=6)),
    "qwen2": ("Qwen2Config", dict(rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", dict(head_dim=24)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
                                    attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", dict(  # six layers: five sliding, one global (llama.cpp's fixed pattern)
        num_hidden_layers=6, head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}})),
    "phi3": ("Phi3Config", dict(
        max_position_embeddings=256, original_max_position_embeddings=64, sliding_window=10,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "short_factor": [1.0, 1.1, 1.3, 1.7], "long_factor": [1.5, 2.0, 3.0, 5.0]})),
    "olmo2": ("Olmo2Config", dict(num_key_value_heads=4, pad_token_id=1)),
    "granite": ("GraniteConfig", dict(embedding_multiplier=6.0, residual_multiplier=0.3,
                                      attention_multiplier=0.2, logits_scaling=4.0)),
    "smollm3": ("SmolLM3Config", dict(num_hidden_layers=4, pad_token_id=2)),  # layer 3 NoPE, as llama.cpp fixes it
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=48)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                                         head_dim=24, norm_topk_prob=True)),
    "gpt_oss": ("GptOssConfig", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, head_dim=16,
                                     sliding_window=4, rope_parameters={
                                         "rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0,
                                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})),
    "deepseek_v3": ("DeepseekV3Config", dict(
        num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=32,
        n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=12, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 64})),
    "deepseek_v2": ("DeepseekV2Config", dict(
        num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        topk_method="group_limited_greedy",
        moe_intermediate_size=32, n_shared_experts=2, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=None,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, routed_scaling_factor=1.5)),
    "glm4": ("Glm4Config", dict(head_dim=16, pad_token_id=2)),
    "cohere2": ("Cohere2Config", dict(num_hidden_layers=4, sliding_window=4, logit_scale=0.5, pad_token_id=2)),
    "ministral3": ("Ministral3Config", dict(rope_parameters={
        "type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 4,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1})),
    # hybrids: Gated DeltaNet on layers 0-2, gated full attention (partial rotary) on layer 3
    "qwen3_next": ("Qwen3NextConfig", dict(
        num_hidden_layers=4, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})),
    "qwen3_5": ("Qwen3_5TextConfig", dict(
        num_hidden_layers=4, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=8, linear_conv_kernel_dim=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_hidden_layers=4, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=8, linear_conv_kernel_dim=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})),
    # Granite 4.0-H: Mamba-2 on layers 0, 2, 3 (8 heads of 16 in 2 groups), attention (here with rotary) on
    # layer 1, 4 experts + a shared MLP, Granite's four multipliers
    "granitemoehybrid": ("GraniteMoeHybridConfig", dict(
        num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"], intermediate_size=32,
        mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48, position_embedding_type="rope",
        embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.2, logits_scaling=4.0)),
    # LFM2: short convolutions (3 taps, with biases) on layers 0, 1, 3, attention on layer 2; the MLP width
    # adjusted as the reference does (int(2 * 128 / 3) = 85, rounded up to 96)
    "lfm2": ("Lfm2Config", dict(
        num_hidden_layers=4, layer_types=["conv", "conv", "full_attention", "conv"], conv_L_cache=3,
        conv_bias=True, norm_eps=1e-5, block_multiple_of=32)),
    # Nemotron-H: Mamba-2 on layers 0, 2, 4 (8 heads of 16 in 2 groups), attention (no positions) on layer 1, an
    # MLP alone (relu^2) on layer 3; biases on every projection that can have one
    "nemotron_h": ("NemotronHConfig", dict(
        num_hidden_layers=5, head_dim=16, layers_block_type=["linear_attention", "full_attention", "linear_attention",
                                                             "mlp", "linear_attention"],
        mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, use_bias=True,
        mlp_bias=True, layer_norm_epsilon=1e-5, rms_norm_eps=1e-5)),  # (llama.cpp's converter writes rms_norm_eps)
    # plain Mamba-2: every layer a mixer (8 heads of 16, 2 groups), no attention and so no KV cache at all
    "mamba2": ("Mamba2Config", dict(
        num_heads=8, head_dim=16, expand=2, n_groups=2, state_size=16, conv_kernel=4, use_bias=True,
        layer_norm_epsilon=1e-5, chunk_size=8)),
    # Falcon-H1: Mamba-2 (8 heads of 16 over a 128-wide mixer, 2 groups) beside attention in every layer,
    # the mixer's optional gated norm on, every muP multiplier away from 1
    "falcon_h1": ("FalconH1Config", dict(
        head_dim=16, mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16,
        mamba_d_conv=4, mamba_chunk_size=8, mamba_rms_norm=True, mamba_proj_bias=True, projectors_bias=True,
        ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.7], ssm_in_multiplier=1.3, ssm_out_multiplier=0.6,
        attention_in_multiplier=0.9, attention_out_multiplier=1.4, key_multiplier=0.5, mlp_multipliers=[1.3, 0.7],
        embedding_multiplier=2.0, lm_head_multiplier=0.8)),
    # Llama 4: chunks of 4 positions on the rotary layers 0, 2, 3 (so 12-token prompts span three), layer 1
    # NoPE with its query temperature (floor_scale 4: it grows within the prompt), experts on layers 1 and 3
    # (4, two per token, each fed its input times its score) beside a shared expert, Llama 3.1 rope scaling
    "llama4": ("Llama4TextConfig", dict(
        num_hidden_layers=4, head_dim=16, attention_chunk_size=4, no_rope_layers=[1, 0, 1, 1],
        interleave_moe_layer_step=2, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
        intermediate_size_mlp=96, use_qk_norm=True, attn_temperature_tuning=True, floor_scale=4, attn_scale=0.1,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    # Gemma 4: sliding layers 0, 1, 3, 4 (window 4, head 16, 2 KV heads), global layers 2 and 5 (head 32, one KV
    # head, values = keys, proportional rotary on a quarter of the head); layers 4 and 5 share the K/V of 3 and 2
    # with double-wide MLPs; per-layer inputs of 16; the final soft-cap
    "gemma4": ("Gemma4TextConfig", dict(
        num_hidden_layers=6, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
        sliding_window=4, num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=VOCAB, final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0}})),
}


# keys the hub's checkpoints carry that transformers' config classes do not (llama.cpp's converter reads them)
# config.json keys as the released checkpoints spell them (transformers 5 rewrites some on save; llama.cpp's
# converter reads the hub's spelling): keys to set, or a function of the saved config giving the config to write
HUB_KEYS = {"deepseek_v3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, "cohere2": {"rotary_pct": 1.0},
            "granitemoehybrid": lambda cfg: {**cfg, "layer_types": [
                {"linear_attention": "mamba", "full_attention": "attention"}.get(t, t) for t in cfg["layer_types"]]},
            # Nemotron-H (not Nemotron 3): a hybrid_override_pattern and no mixture-of-experts keys
            "nemotron_h": lambda cfg: {**{k: v for k, v in cfg.items() if k not in NEMOTRON_H_MOE_KEYS},
                                       "hybrid_override_pattern": "".join(
                                           {"linear_attention": "M", "full_attention": "*", "mlp": "-"}[t]
                                           for t in cfg["layers_block_type"])}}
NEMOTRON_H_MOE_KEYS = ("num_experts_per_tok", "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
                       "moe_shared_expert_intermediate_size", "n_group", "topk_group", "norm_topk_prob",
                       "routed_scaling_factor", "moe_latent_size", "mtp_layers_block_type")


def write_tiny_model(name: str, folder: Path, tokenizer_dir: Path, max_shard_size=None, seed: int = 0,
                     **overrides):
    """Save a random model of config `name` (safetensors) plus the default tokenizer into `folder`;
    `overrides` change config fields (e.g. head counts that a tensor-parallel size divides).

    Returns the torch model (float32, eval mode).
    """
    import torch
    import transformers

    cls_name, extra = TINY_CONFIGS[name]
    config = getattr(transformers, cls_name)(**{**COMMON, **extra, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms default to 1 and biases to 0: randomize them so they are tested
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight") or pname.endswith(".bias") or pname.endswith("_bias"):
                param.add_(0.1 * torch.randn_like(param))
        for pname, buffer in model.named_buffers():  # DeepSeek-V3's router correction is a buffer
            if pname.endswith(("correction_bias", "layer_scalar")):  # Gemma 4's layer scalars too
                buffer.add_(0.1 * torch.randn_like(buffer))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    if name in HUB_KEYS:
        import json

        path = folder / "config.json"
        saved = json.loads(path.read_text())
        hub = HUB_KEYS[name](saved) if callable(HUB_KEYS[name]) else {**saved, **HUB_KEYS[name]}
        path.write_text(json.dumps(hub, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / f, folder / f)
    return model


def family_name(name: str) -> str:
    """The tiny config's HF model_type (what the registry resolves)."""
    import transformers

    cls_name, _ = TINY_CONFIGS[name]
    return getattr(transformers, cls_name).model_type


def chosen(*names: str) -> tuple[str, ...]:
    """Tiny checkpoints a test picks on purpose (a subset: `FAMILIES = chosen("llama", "qwen2")`): each must be one
    here, of a family the registry runs, so a typo, or a family gone from the registry, fails at collection
    instead of quietly testing less."""
    unknown = [n for n in names if n not in TINY_CONFIGS]
    chosen_model_types(*(family_name(n) for n in names if n in TINY_CONFIGS))
    if unknown:
        raise ValueError(f"{unknown}: no such tiny checkpoint (tests/tiny_models.py TINY_CONFIGS)")
    return names


def chosen_model_types(*model_types: str) -> tuple[str, ...]:
    """HF model types a test picks on purpose; each must be one a family of the registry runs."""
    from vsurge.models.registry import hf_model_types

    unknown = [t for t in model_types if t not in hf_model_types()]
    if unknown:
        raise ValueError(f"{unknown}: no registered family (models/families/) runs these model types")
    return model_types


def add_special_tokens(folder: Path, tokens: list[str]) -> list[int]:
    """Add special tokens (e.g. fill-in-the-middle ones) to the tokenizer.json in `folder`; their new ids
    (from the end of the vocabulary: write the model with a vocab_size that covers them)."""
    from tokenizers import AddedToken, Tokenizer

    path = Path(folder) / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
    tokenizer.save(str(path))
    return [tokenizer.token_to_id(t) for t in tokens]

"""Write a tiny transformers checkpoint of any family as llama.cpp's converter would (for tests).

The tensor names come from the `gguf` package's own HF-to-GGUF name map; the transforms are
the converter's (convert_hf_to_gguf.py and its conversion/ modules): q/k rows interleaved for
the archs llama.cpp rotates in pairs (Llama, Mistral, Mixtral, Granite, SmolLM3), Gemma's norms
stored as 1 + w, experts stacked into *_exps tensors, DeepSeek's kv_b split into k_b
(transposed) and v_b, GPT-OSS's fused gate/up split back into gate and up. Metadata carries the
keys llama.cpp reads for each architecture. benchmarks/families_vs_llamacpp.py checks this writer
against the real converter (tensor by tensor) and the files against llama.cpp itself.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from gguf_files import copy_tokenizer_metadata, llama_cpp_permute
from tiny_models import chosen

# the tiny checkpoints written here as llama.cpp's converter writes them: tests/loading/test_gguf_families.py loads
# each, benchmarks/families_vs_llamacpp.py checks each against the converter and llama.cpp
FAMILIES = chosen("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "olmo2", "granite", "smollm3",
                  "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v2", "deepseek_v3", "glm4", "cohere2",
                  "ministral3", "qwen3_next", "lfm2", "mamba2", "granitemoehybrid", "nemotron_h", "falcon_h1",
                  "qwen3_5", "qwen3_5_moe", "llama4", "gemma4")
# HF model_type -> GGUF architecture
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3", "olmo2": "olmo2", "granite": "granite",
             "smollm3": "smollm3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss",
             "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2", "glm4": "glm4", "cohere2": "cohere2",
             "ministral3": "mistral3", "qwen3_next": "qwen3next", "lfm2": "lfm2",
             "mamba2": "mamba2", "granitemoehybrid": "granitehybrid", "nemotron_h": "nemotron_h",
             "falcon_h1": "falcon-h1", "qwen3_5_text": "qwen35", "qwen3_5_moe_text": "qwen35moe",
             "llama4_text": "llama4", "gemma4_text": "gemma4", "qwen2_5_vl_text": "qwen2vl", "qwen3_vl_text": "qwen3vl",
             "qwen3_vl_moe_text": "qwen3vlmoe"}
QWEN3_NEXT_LIKE = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
MROPE_TEXT = ("qwen2_5_vl_text", "qwen3_vl_text", "qwen3_vl_moe_text")  # the Qwen-VL text models: M-RoPE sections in the file
# llama.cpp's "NORM" rotation from HF weights (the hybrids' converters permute their attention layers' too)
PERMUTED_QK = {"llama", "mistral", "mixtral", "granite", "smollm3", "ministral3", "granitemoehybrid", "nemotron_h"}
MODEL_ARCH = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
# the tiny config changed to what the converter writes without loss: its Granite 4.0-H drops rotary from
# every hybrid (the released ones have none); its Falcon-H1 scales in_proj's bias as its rows (so none, as
# released) and its llama.cpp normalises the mixer's output after gating (the file does not say); its Llama 4
# writes no chunk size, NoPE layers or temperature floor, which llama.cpp fixes at Scout's and Maverick's
AS_CONVERTED = {"granitemoehybrid": {"position_embedding_type": "nope"},
                "llama4": {"attention_chunk_size": 8192, "floor_scale": 8192, "no_rope_layers": [1, 1, 1, 0]},
                "falcon_h1": {"mamba_proj_bias": False, "mamba_norm_before_gate": False}}


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _gemma4_global(hparams: dict, key: str, global_key: str):
    """A Gemma 4 global layer's head_dim / num_key_value_heads from config.json (as the converter reads it)."""
    return hparams.get(global_key) or next(
        (int(o[key]) for i, o in (hparams.get("per_layer_config") or {}).items()
         if hparams["layer_types"][int(i)] == "full_attention" and key in o), None)


def _rope(cfg) -> dict:
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    return params.get("full_attention", params)


def write_family_gguf(path: Path, hf_dir: Path, tokenizer_source: Path, types: dict | None = None,
                      tokenizer=None, arch: str | None = None) -> None:
    """The checkpoint in `hf_dir` (as transformers saves it) -> a GGUF file at `path`; types: GGUF
    tensor name suffix -> quant type (default F32; vectors always F32); tokenizer: writes the
    tokenizer's metadata (default: the one of the GGUF file `tokenizer_source`); arch: the GGUF
    architecture where the converter names it by more than the model type (default: GGUF_ARCH's)."""
    import json

    import transformers
    from safetensors.numpy import load_file

    hparams = json.loads((Path(hf_dir) / "config.json").read_text())
    cfg = transformers.AutoConfig.from_pretrained(hf_dir)
    state = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        state.update({k: v.astype(np.float32) for k, v in load_file(f).items()})
    model_type = cfg.model_type
    arch = arch or GGUF_ARCH[model_type]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{model_type}")
    _metadata(writer, cfg, hparams, model_type)
    (tokenizer or (lambda w: copy_tokenizer_metadata(w, tokenizer_source)))(writer)
    names = gguf.get_tensor_name_map(MODEL_ARCH[arch], cfg.num_hidden_layers)
    for name, array in _tensors(state, cfg, model_type):
        if name.startswith(("model.", "lm_head", "backbone.")):
            mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
            assert mapped is not None, f"no GGUF name for {name}"
            name = mapped
        _add(writer, name, array, types or {})
    if _rope(cfg).get("rope_type") == "llama3":  # LlamaModel.generate_extra_tensors
        _add(writer, "rope_freqs.weight", _llama3_rope_factors(cfg), types or {})
    if model_type == "gemma4_text":  # Gemma4Model.generate_extra_tensors: the global layers' unrotated pairs
        full_hd = _gemma4_global(hparams, "head_dim", "global_head_dim")
        pairs, rotated = full_hd // 2, int(full_hd * _rope(cfg)["partial_rotary_factor"] / 2)
        _add(writer, "rope_freqs.weight", np.asarray([1.0] * rotated + [1e30] * (pairs - rotated), np.float32), {})
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def with_nextn_blocks(path: Path, out: Path, n: int = 1) -> Path:
    """A copy of the F32 GGUF at `path` with `n` multi-token-prediction layers after its own, as llama.cpp's
    converter writes a released Qwen3.5 (or GLM-4.5, DeepSeek V3) checkpoint: block_count counts them,
    nextn_predict_layers says how many, and each is a copy of the last block plus the nextn projection and
    norms (random: the model must not read them)."""
    src = gguf.GGUFReader(str(path))
    arch = str(src.fields["general.architecture"].contents())
    layers = int(src.fields[f"{arch}.block_count"].contents())
    w = gguf.GGUFWriter(str(out), arch)
    for key, field in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = layers + n if key == f"{arch}.block_count" else field.contents()
        w.add_key_value(key, value, field.types[0], field.types[-1] if len(field.types) > 1 else None)
    w.add_uint32(f"{arch}.nextn_predict_layers", n)
    rng = np.random.default_rng(0)
    last = f"blk.{layers - 1}."
    for t in src.tensors:
        w.add_tensor(t.name, np.array(t.data))
    d = int(src.fields[f"{arch}.embedding_length"].contents())
    for i in range(layers, layers + n):
        for t in src.tensors:
            if t.name.startswith(last):
                w.add_tensor(f"blk.{i}." + t.name[len(last):], rng.standard_normal(t.data.shape).astype(np.float32))
        w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", rng.standard_normal((d, 2 * d)).astype(np.float32))
        for norm in ("enorm", "hnorm", "shared_head_norm"):
            w.add_tensor(f"blk.{i}.nextn.{norm}.weight", np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _llama3_rope_factors(cfg) -> np.ndarray:
    """Llama 3.1's rope scaling as per-frequency divisors (the converter's rope_freqs)."""
    rope, dim = _rope(cfg), _head_dim(cfg)
    freqs = 1.0 / (rope.get("rope_theta", 10000.0) ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def _add(writer, name: str, array: np.ndarray, types: dict) -> None:
    suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
    qtype = gguf.GGMLQuantizationType.F32 if array.ndim == 1 else types.get(suffix, gguf.GGMLQuantizationType.F32)
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, np.ascontiguousarray(array, np.float32))
    else:
        writer.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(array, np.float32), qtype), raw_dtype=qtype)


def _tensors(state: dict, cfg, model_type: str):
    """(HF or GGUF name, float32 array) as the converter writes them."""
    if getattr(cfg, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name, w in state.items():
        parts = name.split(".")
        layer = int(parts[2]) if name.startswith("model.layers.") else None
        if model_type.startswith("gemma") and model_type != "gemma4_text" and name.endswith("norm.weight"):
            w = w + 1.0  # (Gemma 4's norms multiply by w: stored as is)
        if model_type == "gemma4_text" and name.endswith("layer_scalar"):
            name += ".weight"
        if model_type in PERMUTED_QK and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = llama_cpp_permute(w, cfg.num_attention_heads)
        if model_type in PERMUTED_QK and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = llama_cpp_permute(w, cfg.num_key_value_heads)
        if model_type == "qwen3_vl_moe_text" and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # Qwen3VLMoeTextModel.modify_tensors: (out, in) stacks, gate rows then up (transformers 5 saves them
            # so; the hub's checkpoints (in, out))
            f = cfg.moe_intermediate_size
            if w.shape[1] != (2 * f if name.endswith("gate_up_proj") else cfg.hidden_size):
                w = w.swapaxes(1, 2)
            if name.endswith("gate_up_proj"):
                gate, up = np.split(w, 2, axis=1)  # (E, F, D) each
                yield f"blk.{layer}.ffn_gate_exps.weight", gate
                yield f"blk.{layer}.ffn_up_exps.weight", up
            else:
                yield f"blk.{layer}.ffn_down_exps.weight", w  # (E, D, F)
            continue
        if ".experts." in name and parts[-2] in ("gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"):
            kind = {"w1": "gate", "w3": "up", "w2": "down"}.get(parts[-2], parts[-2].split("_")[0])
            experts.setdefault((layer, kind), {})[int(parts[-3])] = w
            continue
        if model_type == "mixtral" and name.endswith("block_sparse_moe.gate.weight"):
            yield f"blk.{layer}.ffn_gate_inp.weight", w
            continue
        if name.endswith("e_score_correction_bias"):
            yield f"blk.{layer}.exp_probs_b.bias", w
            continue
        if name.endswith("kv_b_proj.weight"):  # DeepSeek: MLA's absorbed halves
            nope, v = cfg.qk_nope_head_dim, cfg.v_head_dim
            kv_b = w.reshape(cfg.num_attention_heads, nope + v, -1)
            yield f"blk.{layer}.attn_k_b.weight", kv_b[:, :nope].transpose(0, 2, 1)
            yield f"blk.{layer}.attn_v_b.weight", kv_b[:, nope:]
            continue
        if model_type == "gpt_oss" and ".mlp.experts." in name:
            yield from _gpt_oss_experts(layer, parts[-1], w)
            continue
        if name.endswith("self_attn.sinks"):
            yield f"blk.{layer}.attn_sinks.weight", w
            continue
        if model_type == "llama4_text" and ".experts." in name:  # Llama4Model.modify_tensors: (in, out) -> (out, in)
            if name.endswith("gate_up_proj"):
                gate, up = np.split(w.transpose(0, 2, 1), 2, axis=1)
                yield f"blk.{layer}.ffn_gate_exps.weight", gate
                yield f"blk.{layer}.ffn_up_exps.weight", up
            else:
                yield f"blk.{layer}.ffn_down_exps.weight", w.transpose(0, 2, 1)
            continue
        if model_type in QWEN3_NEXT_LIKE:
            yield from _qwen3_next(name, _tiled_value_heads(name, w, cfg) if model_type != "qwen3_next" else w,
                                   cfg, layer)
            continue
        if model_type == "lfm2" and name.endswith("conv.conv.weight"):  # LFM2Model.modify_tensors
            w = w.squeeze(1)
        if model_type in ("mamba2", "nemotron_h"):
            yield from _mamba2(name, w, cfg)
            continue
        if model_type == "granitemoehybrid":
            yield from _granite_hybrid(name, w, cfg, layer)
            continue
        if model_type == "falcon_h1":
            yield from _mamba2(name, _falcon_h1_mup(name, w, cfg), cfg, n_groups=cfg.mamba_n_groups)
            continue
        yield name, w
    for (layer, kind), by_expert in sorted(experts.items()):
        yield f"blk.{layer}.ffn_{kind}_exps.weight", np.stack([by_expert[e] for e in sorted(by_expert)])


def _qwen3_next(name: str, w: np.ndarray, cfg, layer: int | None):
    """The converter's Qwen3NextModel.modify_tensors: A = -exp(A_log), dt_bias as ssm_dt.bias, the
    convolution squeezed, norms but the gated one as 1 + w, in_proj_qkvz regrouped head-major."""
    if name.endswith(".A_log"):
        yield name, -np.exp(w)
    elif name.endswith(".dt_bias"):
        yield name.rpartition(".dt_bias")[0] + ".dt_proj.bias", w
    elif "conv1d" in name:
        yield name, w.squeeze()
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        yield name, w + 1.0
    elif name.endswith("in_proj_qkvz.weight"):
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        per = [dk, dk, hv // hk * dv, hv // hk * dv]
        grouped = w.T.reshape(cfg.hidden_size, hk, sum(per))  # (D, Hk, [q | k | v | z])
        q, k, v, z = np.split(grouped, np.cumsum(per)[:-1], axis=-1)
        flat = [part.reshape(cfg.hidden_size, -1) for part in (q, k, v, z)]
        yield f"blk.{layer}.attn_qkv.weight", np.concatenate(flat[:3], axis=-1).T
        yield f"blk.{layer}.attn_gate.weight", flat[3].T
    else:
        yield name, w


def _tiled_value_heads(name: str, w: np.ndarray, cfg) -> np.ndarray:
    """Qwen3.5's converter (_LinearAttentionVReorderBase): with more value heads than key heads, every
    DeltaNet tensor's value heads go from grouped (per key head) to tiled order."""
    hk, hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                      cfg.linear_value_head_dim)
    if hk == hv or "linear_attn." not in name:
        return w

    def tile(a, axis, width):  # (.., Hk * r * width, ..) -> (.., r * Hk * width, ..)
        a = np.moveaxis(a, axis, 0)
        a = a.reshape(hk, hv // hk, width, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)
        return np.moveaxis(a, 0, axis)

    qk = 2 * hk * dk
    if ".in_proj_qkv." in name or ".conv1d." in name:
        return np.concatenate([w[:qk], tile(w[qk:], 0, dv)])
    if ".in_proj_z." in name:
        return tile(w, 0, dv)
    if ".in_proj_a." in name or ".in_proj_b." in name or name.endswith((".A_log", ".dt_bias")):
        return tile(w, 0, 1)
    if ".out_proj." in name:
        return tile(w, 1, dv)
    return w


def _mamba2(name: str, w: np.ndarray, cfg, n_groups: int | None = None):
    """The converter's Mamba2Model: dt_bias as dt_proj.bias, the convolution squeezed, A = -exp(A_log)
    and D as (H, 1), the gated norm as (G, I / G)."""
    if name.endswith(".dt_bias"):
        yield name.rpartition(".dt_bias")[0] + ".dt_proj.bias", w
    elif "conv1d.weight" in name:
        yield name, w.squeeze()
    elif name.endswith(".A_log"):
        yield name, -np.exp(w).reshape(-1, 1)
    elif name.endswith(".D"):
        yield name, w.reshape(-1, 1)
    elif name.endswith(("mixer.norm.weight", "mamba.norm.weight")):
        yield name, w.reshape(n_groups or cfg.n_groups, -1)
    else:
        yield name, w


def _granite_hybrid(name: str, w: np.ndarray, cfg, layer: int | None):
    """The converter's GraniteHybridModel: the Mamba-2 mixer's tensors as Mamba2Model's, the shared
    MLP's and the experts' fused gate | up rows split (the shared MLP's as *_shexp when there are
    experts, as the plain MLP's otherwise)."""
    s = "_shexp" if cfg.num_local_experts else ""
    if name.endswith("shared_mlp.input_linear.weight"):
        gate, up = np.split(w, 2, axis=0)
        yield f"blk.{layer}.ffn_gate{s}.weight", gate
        yield f"blk.{layer}.ffn_up{s}.weight", up
    elif name.endswith("shared_mlp.output_linear.weight"):
        yield f"blk.{layer}.ffn_down{s}.weight", w
    elif name.endswith("block_sparse_moe.input_linear.weight"):
        gate, up = np.split(w, 2, axis=1)
        yield f"blk.{layer}.ffn_gate_exps.weight", gate
        yield f"blk.{layer}.ffn_up_exps.weight", up
    elif ".mamba." in name:
        yield from _mamba2(name, w, cfg, n_groups=cfg.mamba_n_groups)
    else:
        yield name, w


def _falcon_h1_mup(name: str, w: np.ndarray, cfg) -> np.ndarray:
    """FalconH1Model.modify_tensors: the muP multipliers folded into the weights (in_proj's rows
    z | x | B | C | dt each by its own)."""
    gate, down = cfg.mlp_multipliers
    attn_in = cfg.attention_in_multiplier
    for key, scale in (("down_proj", down), ("gate_proj", gate), ("k_proj", cfg.key_multiplier * attn_in),
                       ("q_proj", attn_in), ("v_proj", attn_in), ("o_proj", cfg.attention_out_multiplier),
                       ("out_proj", cfg.ssm_out_multiplier), ("lm_head", cfg.lm_head_multiplier),
                       ("embed_tokens", cfg.embedding_multiplier)):
        if key in name:
            return w * scale
    if "in_proj" in name:
        i, gn = cfg.mamba_d_ssm, cfg.mamba_n_groups * cfg.mamba_d_state
        rows = np.repeat(cfg.ssm_multipliers, [i, i, gn, gn, w.shape[0] - 2 * i - 2 * gn])
        return w * cfg.ssm_in_multiplier * rows[:, None]
    return w


def _gpt_oss_experts(layer: int, leaf: str, w: np.ndarray):
    if leaf == "gate_up_proj":  # (E, D, 2F) interleaved -> gate, up (E, F, D)
        t = w.transpose(0, 2, 1)
        yield f"blk.{layer}.ffn_gate_exps.weight", t[:, ::2]
        yield f"blk.{layer}.ffn_up_exps.weight", t[:, 1::2]
    elif leaf == "gate_up_proj_bias":
        yield f"blk.{layer}.ffn_gate_exps.bias", w[:, ::2]
        yield f"blk.{layer}.ffn_up_exps.bias", w[:, 1::2]
    elif leaf == "down_proj":  # (E, F, D) -> (E, D, F)
        yield f"blk.{layer}.ffn_down_exps.weight", w.transpose(0, 2, 1)
    elif leaf == "down_proj_bias":
        yield f"blk.{layer}.ffn_down_exps.bias", w
    else:
        raise ValueError(leaf)


# its LlamaModel writes vocab, rope dims
LLAMA_CONVERTER = {"llama", "mistral", "mixtral", "granite", "smollm3", "ministral3", "llama4_text"}


def _metadata(w, cfg, hparams: dict, model_type: str) -> None:
    if model_type == "mamba2":
        return _mamba2_metadata(w, cfg)
    if model_type == "granitemoehybrid":
        return _granite_hybrid_metadata(w, cfg)
    if model_type == "nemotron_h":
        return _nemotron_h_metadata(w, cfg, hparams)
    if model_type == "gemma4_text":
        return _gemma4_metadata(w, cfg, hparams)
    if model_type == "falcon_h1":
        return _falcon_h1_metadata(w, cfg)
    hd = _head_dim(cfg)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(_lfm2_ffn(hparams) if model_type == "lfm2" else
                              cfg.intermediate_size_mlp if model_type == "llama4_text" else cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(cfg.norm_eps if model_type == "lfm2" else cfg.rms_norm_eps)  # (LFM2's: norm_eps)
    if model_type == "cohere2":  # its converter writes both epsilons; the LayerNorm's is layer_norm_eps
        w.add_layer_norm_eps(cfg.layer_norm_eps)
        w.add_logit_scale(cfg.logit_scale)
        w.add_sliding_window(cfg.sliding_window)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    if model_type in LLAMA_CONVERTER or model_type == "cohere2" or model_type.startswith("deepseek"):
        w.add_vocab_size(cfg.vocab_size)
    rope = _rope(cfg)
    if model_type == "ministral3" and rope.get("llama_4_scaling_beta"):
        w.add_attn_temperature_scale(rope["llama_4_scaling_beta"])
    if model_type == "ministral3" and rope.get("mscale_all_dim"):
        w.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
    if model_type != "gemma2":  # its converter leaves the base at llama.cpp's default (10000)
        w.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    kind = rope.get("rope_type", "default")
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope.get("beta_fast", 32.0))
        w.add_rope_scaling_yarn_beta_slow(rope.get("beta_slow", 1.0))
    if model_type.startswith("deepseek"):
        _deepseek(w, cfg, rope)
        if hparams.get("scoring_func") in ("sigmoid", "softmax"):  # as the converter's base class
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if hparams["scoring_func"] == "sigmoid"
                                     else gguf.ExpertGatingFuncType.SOFTMAX)
        return
    if model_type == "lfm2":  # LFM2Model.set_gguf_parameters: KV heads per layer, 0 on a convolution's
        w.add_head_count_kv([cfg.num_key_value_heads if t != "conv" else 0 for t in cfg.layer_types])
        w.add_vocab_size(cfg.vocab_size)
        w.add_shortconv_l_cache(cfg.conv_L_cache)
    else:
        w.add_head_count_kv(cfg.num_key_value_heads)
    if hparams.get("head_dim") or model_type.startswith("gemma"):  # as the converter: only when the config says
        w.add_key_length(hd)
        w.add_value_length(hd)
    if model_type in LLAMA_CONVERTER or model_type in ("phi3", "glm4", "cohere2"):
        w.add_rope_dimension_count(int(hd * rope.get("partial_rotary_factor", 0.5 if model_type == "glm4" else 1.0)))
    if model_type in ("gemma2", "gemma3_text", "phi3", "gpt_oss") and getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)
    if model_type == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if model_type == "gemma3_text":
        w.add_rope_freq_base_swa(cfg.rope_parameters["sliding_attention"]["rope_theta"])
    if model_type == "granite":
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_logit_scale(cfg.logits_scaling)
    if model_type == "phi3":
        _phi3(w, cfg, rope, hd)
    if model_type != "qwen3_next" and model_type in QWEN3_NEXT_LIKE + MROPE_TEXT:  # the multimodal rotary's sections
        sections = list(_rope(cfg).get("mrope_section") or [11, 11, 10])
        w.add_rope_dimension_sections(sections + [0] * (4 - len(sections)))
    if model_type in ("qwen3_vl_text", "qwen3_vl_moe_text"):  # Qwen3VL(Moe)TextModel.set_gguf_parameters (the VLM's config: deepstack_layers)
        w.add_num_deepstack_layers(int(hparams.get("deepstack_layers", 0)))
    if model_type in QWEN3_NEXT_LIKE:  # Qwen3NextModel.set_gguf_parameters
        w.add_uint32(f"{w.arch}.ssm.conv_kernel", cfg.linear_conv_kernel_dim)
        w.add_uint32(f"{w.arch}.ssm.state_size", cfg.linear_key_head_dim)
        w.add_uint32(f"{w.arch}.ssm.group_count", cfg.linear_num_key_heads)
        w.add_uint32(f"{w.arch}.ssm.time_step_rank", cfg.linear_num_value_heads)
        w.add_uint32(f"{w.arch}.ssm.inner_size", cfg.linear_value_head_dim * cfg.linear_num_value_heads)
        w.add_array(f"{w.arch}.attention.recurrent_layers", [t == "linear_attention" for t in cfg.layer_types])
        w.add_uint32(f"{w.arch}.full_attention_interval", getattr(cfg, "full_attention_interval", 4))
        w.add_rope_dimension_count(int(hd * rope.get("partial_rotary_factor", 0.25)))
    if model_type == "llama4_text":  # Llama4Model.set_gguf_parameters (its expert width: below)
        w.add_interleave_moe_layer_step(cfg.interleave_moe_layer_step)
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        if model_type != "mixtral":
            w.add_expert_feed_forward_length(getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size)
    if getattr(cfg, "shared_expert_intermediate_size", None):
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)


def _mamba2_metadata(w, cfg) -> None:
    """Mamba2Model.set_gguf_parameters: no attention keys, the mixer's ssm.* keys."""
    w.add_context_length(2**20)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_ssm_conv_kernel(cfg.conv_kernel)
    w.add_ssm_inner_size(cfg.num_heads * cfg.head_dim)
    w.add_ssm_state_size(cfg.state_size)
    w.add_ssm_time_step_rank(cfg.num_heads)
    w.add_ssm_group_count(cfg.n_groups)
    w.add_layer_norm_rms_eps(cfg.layer_norm_epsilon)


def _granite_hybrid_metadata(w, cfg) -> None:
    """GraniteHybridModel.set_gguf_parameters: Llama's keys (the head width hidden / heads, as Granite's
    converter drops head_dim), Granite's four scales, the ssm.* keys, KV heads per layer (0 on a
    Mamba-2 layer), no rotary for a hybrid (rope.scaling.finetuned false, context 2^20)."""
    hd = cfg.hidden_size // cfg.num_attention_heads
    w.add_block_count(cfg.num_hidden_layers)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_rope_freq_base(float(_rope(cfg).get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if cfg.num_local_experts:
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(hd)
    w.add_attention_scale(cfg.attention_multiplier)
    w.add_embedding_scale(cfg.embedding_multiplier)
    w.add_residual_scale(cfg.residual_multiplier)
    w.add_logit_scale(cfg.logits_scaling)
    if cfg.shared_intermediate_size:
        w.add_expert_shared_feed_forward_length(cfg.shared_intermediate_size)
    w.add_ssm_conv_kernel(cfg.mamba_d_conv)
    w.add_ssm_state_size(cfg.mamba_d_state)
    w.add_ssm_group_count(cfg.mamba_n_groups)
    w.add_ssm_inner_size(cfg.mamba_expand * cfg.hidden_size)
    w.add_ssm_time_step_rank(cfg.mamba_n_heads)
    w.add_head_count_kv([0 if t in ("mamba", "linear_attention") else cfg.num_key_value_heads
                         for t in cfg.layer_types])
    w.add_rope_scaling_finetuned(False)
    w.add_context_length(2**20)


def _nemotron_h_metadata(w, cfg, hparams: dict) -> None:
    """NemotronHModel.set_gguf_parameters (GraniteHybridModel's, then): KV heads and MLP widths per layer
    (0 where the layer is not one), both epsilons, no rotary."""
    kinds = hparams["hybrid_override_pattern"]  # M: Mamba-2, *: attention, -: MLP
    w.add_block_count(cfg.num_hidden_layers)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length([cfg.intermediate_size if k == "-" else 0 for k in kinds])
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv([cfg.num_key_value_heads if k == "*" else 0 for k in kinds])
    w.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_ssm_conv_kernel(cfg.conv_kernel)
    w.add_ssm_state_size(cfg.ssm_state_size)
    w.add_ssm_group_count(cfg.n_groups)
    w.add_ssm_inner_size(cfg.mamba_num_heads * cfg.mamba_head_dim)
    w.add_ssm_time_step_rank(cfg.mamba_num_heads)
    w.add_rope_scaling_finetuned(False)
    w.add_context_length(2**20)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)


def _gemma4_metadata(w, cfg, hparams: dict) -> None:
    """Gemma4Model.set_gguf_parameters (Gemma 3's, then): the global layers' head size as key_length and the
    sliding layers' as key_length_swa, KV heads and MLP widths per layer, the sliding pattern, K/V
    sharing, the per-layer input width, both rotary bases and widths (config.json's own values where
    transformers' config holds them per layer)."""
    n, sliding = cfg.num_hidden_layers, [t == "sliding_attention" for t in cfg.layer_types]
    full_hd, shared = _gemma4_global(hparams, "head_dim", "global_head_dim"), cfg.num_kv_shared_layers
    full_kv = _gemma4_global(hparams, "num_key_value_heads", "num_global_key_value_heads")
    w.add_block_count(n)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    f = cfg.intermediate_size
    w.add_feed_forward_length([f * 2 if cfg.use_double_wide_mlp and i >= n - shared else f for i in range(n)]
                              if cfg.use_double_wide_mlp else f)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv([hparams["num_key_value_heads"] if s else full_kv for s in sliding] if full_kv
                        else hparams["num_key_value_heads"])
    w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(cfg.rope_parameters["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(full_hd)
    w.add_value_length(full_hd)
    if cfg.final_logit_softcapping:
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_sliding_window(cfg.sliding_window)
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(cfg.hidden_size_per_layer_input or 0)
    w.add_sliding_window_pattern(sliding)
    w.add_key_length_swa(hparams["head_dim"])
    w.add_value_length_swa(hparams["head_dim"])
    w.add_rope_dimension_count(full_hd)
    swa_rope = cfg.rope_parameters["sliding_attention"]
    w.add_rope_dimension_count_swa(int(hparams["head_dim"] * swa_rope.get("partial_rotary_factor", 1.0)))


def _falcon_h1_metadata(w, cfg) -> None:
    """FalconH1Model.set_gguf_parameters: Mamba2Model's keys, then the attention's; no multipliers (they
    are in the weights)."""
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_ssm_conv_kernel(cfg.mamba_d_conv)
    w.add_ssm_inner_size(cfg.mamba_d_ssm)
    w.add_ssm_state_size(cfg.mamba_d_state)
    w.add_ssm_time_step_rank(cfg.mamba_d_ssm // cfg.mamba_d_head)
    w.add_ssm_group_count(cfg.mamba_n_groups)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(float(_rope(cfg).get("rope_theta", 10000.0)))


def _lfm2_ffn(hparams: dict) -> int:
    """LFM2Model._add_feed_forward_length: the MLP width the converter writes."""
    f = hparams.get("block_ff_dim") or hparams["intermediate_size"]
    if hparams.get("block_auto_adjust_ff_dim", True):
        f = int(2 * f / 3)
        if hparams.get("block_ffn_dim_multiplier") is not None:
            f = int(hparams["block_ffn_dim_multiplier"] * f)
        f = hparams["block_multiple_of"] * ((f + hparams["block_multiple_of"] - 1) // hparams["block_multiple_of"])
    return f


def _phi3(w, cfg, rope: dict, hd: int) -> None:
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if rope.get("rope_type") == "longrope":
        scale = cfg.max_position_embeddings / rope["original_max_position_embeddings"]
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(scale) / np.log(rope["original_max_position_embeddings"]))))
        w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], np.float32))


def _deepseek(w, cfg, rope: dict) -> None:
    kv, r = cfg.kv_lora_rank, cfg.qk_rope_head_dim
    w.add_head_count_kv(1)
    if cfg.q_lora_rank:
        w.add_q_lora_rank(cfg.q_lora_rank)
    w.add_kv_lora_rank(kv)
    w.add_key_length(kv + r)
    w.add_value_length(kv)
    w.add_key_length_mla(cfg.qk_nope_head_dim + r)
    w.add_value_length_mla(cfg.v_head_dim)
    w.add_rope_dimension_count(r)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    if getattr(cfg, "norm_topk_prob", False):
        w.add_expert_weights_norm(True)
    if getattr(cfg, "n_group", None) is not None:  # the converter writes whatever the config holds
        w.add_expert_group_count(cfg.n_group)
        w.add_expert_group_used_count(cfg.topk_group)
    if rope.get("mscale_all_dim"):
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])

"""Write a tiny HF vision-language checkpoint (tests/tiny_vlm.py) as the pair llama.cpp's converter writes
(for tests): the text model's GGUF (`convert_hf_to_gguf.py DIR`) and the mmproj GGUF (`... --mmproj`).

The text half is the language model written by gguf_families.write_family_gguf (the converter's text
path: SmolVLM's as a `llama`, Gemma 3's as a `gemma3`) with the checkpoint's own vocabulary: the base
tokens, its added tokens at their ids (special ones CONTROL) and [PAD<i>] up to vocab_size, as the
converter's get_vocab_base writes a tokenizer.json's. The mmproj follows MmprojModel and its
SmolVLMModel / Gemma3VisionModel subclasses (conversion/base.py, smolvlm.py, gemma.py): `clip.*` keys,
tensor names from the `gguf` package's MMPROJ name map, all float32 (--outtype f32) except Gemma 3's
input projection (forced to F16), Gemma 3's soft_emb_norm stored as 1 + w.
benchmarks/families_vs_llamacpp.py --mmproj checks both files against the real converter's.

Two ways this writer is kinder than the converter, both noted where they happen: a Gemma 3 checkpoint
saved by transformers 5 names its tower `vision_tower.*` where the converter knows only the hub's
`vision_tower.vision_model.*` (it stops: "Can not map tensor"); and the converter cuts Gemma 3's
token_embd to the tokenizer.json's token count, which on these tiny checkpoints leaves fewer rows than
tokens (a file neither vsurge nor llama.cpp loads): here the embedding stays whole.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np

from gguf_families import write_family_gguf
from gguf_files import _tokenizer_fields

# the language model's tensors in each VLM checkpoint layout -> the text model's own names
TEXT_PREFIXES = {"model.text_model.": "model.", "language_model.model.": "model.", "model.language_model.": "model.",
                 "language_model.lm_head.": "lm_head.", "lm_head.": "lm_head."}
PROJECTORS = {"idefics3": "idefics3", "smolvlm": "idefics3", "gemma3": "gemma3"}


def write_pair(hf_dir: Path, text_path: Path, mmproj_path: Path, tokenizer_source: Path) -> None:
    """Both halves of the checkpoint in `hf_dir`; tokenizer_source: a GGUF file with its base vocabulary."""
    write_text_half(hf_dir, text_path, tokenizer_source)
    write_mmproj(hf_dir, mmproj_path)


def _read(hf_dir: Path, name: str) -> dict:
    path = Path(hf_dir) / name
    return json.loads(path.read_text()) if path.exists() else {}


def _state(hf_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    state = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        state.update({k: v.astype(np.float32) for k, v in load_file(f).items()})
    return state


def write_text_half(hf_dir: Path, path: Path, tokenizer_source: Path) -> None:
    """The language model as a text checkpoint of its own (its config the converter's merge of config.json
    and text_config), written by write_family_gguf with the checkpoint's vocabulary."""
    from safetensors.numpy import save_file

    cfg = _read(hf_dir, "config.json")
    text = {**{k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}, **cfg["text_config"]}
    text.pop("architectures", None)
    state = {}
    for name, w in _state(hf_dir).items():
        prefix = next((p for p in TEXT_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            state[TEXT_PREFIXES[prefix] + name[len(prefix):]] = w
    half = Path(path).parent / (Path(path).stem + "-hf")
    half.mkdir(parents=True, exist_ok=True)
    (half / "config.json").write_text(json.dumps(text))
    save_file(state, str(half / "model.safetensors"), metadata={"format": "pt"})
    write_family_gguf(path, half, tokenizer_source,
                      tokenizer=lambda w: _vocabulary(w, tokenizer_source, hf_dir, int(text["vocab_size"])))
    shutil.rmtree(half)


def _vocabulary(writer: gguf.GGUFWriter, source: Path, hf_dir: Path, vocab_size: int) -> None:
    """The converter's _set_vocab_gpt2 on the checkpoint's tokenizer: the base vocabulary (that of `source`),
    then each id up to vocab_size: an added token (CONTROL where special) or [PAD<i>] (UNUSED)."""
    base = _tokenizer_fields(Path(source))
    tokens, types = list(base["tokenizer.ggml.tokens"]), list(base["tokenizer.ggml.token_type"])
    added = {a["id"]: a for a in _read(hf_dir, "tokenizer.json")["added_tokens"]}
    for i in range(len(tokens), vocab_size):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model(base["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(base["tokenizer.ggml.pre"])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(base["tokenizer.ggml.merges"])
    special = _read(hf_dir, "tokenizer_config.json")  # SpecialVocab: the named tokens' ids
    for key, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                     ("unk_token", writer.add_unk_token_id), ("pad_token", writer.add_pad_token_id)):
        if special.get(key) in tokens:
            add(tokens.index(special[key]))
    template = Path(hf_dir) / "chat_template.jinja"
    if template.exists():
        writer.add_chat_template(template.read_text())


def write_mmproj(hf_dir: Path, path: Path) -> None:
    """The vision tower and projector of the checkpoint in `hf_dir` as the converter's mmproj."""
    cfg = _read(hf_dir, "config.json")
    vision, text = cfg["vision_config"], {**cfg, **cfg.get("text_config", {})}
    processor = _read(hf_dir, "processor_config.json")
    pre = {**_read(hf_dir, "preprocessor_config.json"), **processor, **(processor.get("image_processor") or {})}
    projector = PROJECTORS[cfg["model_type"]]
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ])
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(f"tiny-{cfg['model_type']}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_clip_has_vision_encoder(True)  # MmprojModel.set_gguf_parameters
    w.add_vision_projection_dim(text["hidden_size"])
    w.add_vision_image_size(vision["image_size"])
    w.add_vision_patch_size(vision["patch_size"])
    w.add_vision_embedding_length(vision["hidden_size"])
    w.add_vision_feed_forward_length(vision["intermediate_size"])
    w.add_vision_block_count(vision["num_hidden_layers"])
    w.add_vision_head_count(vision["num_attention_heads"])
    w.add_vision_image_mean(pre["image_mean"])
    w.add_vision_image_std(pre["image_std"])
    w.add_clip_projector_type(projector)
    if projector == "idefics3":  # SmolVLMModel.set_gguf_parameters
        w.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-5))
        w.add_vision_projector_scale_factor(cfg.get("scale_factor", 2))
        w.add_vision_use_gelu(True)
        w.add_vision_preproc_image_size(pre.get("size", {}).get("longest_edge", vision["image_size"]))
    else:  # Gemma3VisionModel.set_gguf_parameters: the pooling written only where it is not 4
        w.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
        w.add_vision_use_gelu(True)
        pool = (vision["image_size"] // vision["patch_size"]) // int(pre.get("image_seq_length", 256) ** 0.5)
        if pool > 0 and pool != 4:
            w.add_vision_projector_scale_factor(pool)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vision["num_hidden_layers"])
    for name, array in _mmproj_tensors(_state(hf_dir), projector):
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, f"no mmproj name for {name}"
        if "input_projection" in name:  # Gemma3VisionModel.tensor_force_quant
            w.add_tensor(mapped, array.astype(np.float16))
        else:
            w.add_tensor(mapped, np.ascontiguousarray(array, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _mmproj_tensors(state: dict, projector: str):
    """(HF name as the converter's name map takes it, array as stored) of the tower and projector."""
    for name, array in state.items():
        if projector == "idefics3":  # SmolVLMModel.filter_tensors
            if not ("vision_tower" in name or "vision_model" in name or "model.connector" in name):
                continue
        else:  # Gemma3VisionModel.filter_tensors / modify_tensors
            for old, new in (("model.vision_tower.", "vision_tower."), ("model.multi_modal_projector.",
                                                                       "multi_modal_projector.")):
                name = new + name[len(old):] if name.startswith(old) else name
            if not name.startswith(("multi_modal_projector.", "vision_tower.")) or "vision_model.head." in name:
                continue
            if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
                name = "vision_tower.vision_model." + name[len("vision_tower."):]  # (transformers 5's save: see above)
            name = name.replace("_weight", ".weight")
            if "soft_emb_norm.weight" in name:
                array = array + 1.0
        yield name, array

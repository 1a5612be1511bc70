"""Processor: tokenization equal to transformers, chat templates, UTF-8-safe incremental detokenization."""

from __future__ import annotations

import gguf
import pytest
from transformers import AutoTokenizer

from vsurge.loading.gguf import open_gguf
from vsurge.tokenizer import ChatTemplateError, Processor

TEXTS = [
    "Hello 12345 world!!  \n\n x",
    "héllo 🤖 日本語のテキスト",
    "  leading spaces\tand\ttabs",
    "<|im_start|>user\nhi<|im_end|>",
    "def f(x):\n    return x ** 2  # comment",
    # (No "½"-like numerals: SmolLM2 isolates every \p{N} char as llama.cpp and its HF
    # tokenizer.json do; transformers' GGUF converter skips that rule.)
    "👨‍👩‍👧‍👦 family, 🇫🇷 flag, ∑ ∫",
    "",
]
EMOJI_CJK = ["Paris 🗼 is lovely 😀🎉", "東京は日本の首都です。", "混合 text with 中文 and emoji 🤖🧠 ok", "🇯🇵🇫🇷👩🏽‍💻"]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(default_model, hf_reference, text):
    processor, tokenizer = default_model[1], hf_reference[1]
    assert processor.encode(text) == tokenizer.encode(text)
    assert processor.decode(processor.encode(text)) == text


def test_special_ids(default_model):
    p = default_model[1]
    assert (p.bos_token_id, p.eos_token_id, p.pad_token_id) == (1, 2, 2)
    assert p.eos_token_ids == [2]
    assert p.vocab_size == 49152 and len(p) == 49152


@pytest.mark.parametrize("text", EMOJI_CJK)
def test_incremental_detokenizer_never_emits_broken_characters(default_model, text):
    p = default_model[1]
    ids = p.encode(text)
    assert any("\ufffd" in p.decode([i]) for i in ids), "the text should split characters across tokens"
    detok = p.incremental_detokenizer()
    deltas = [detok.add([i]) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text == detok.text


def test_incremental_detokenizer_drops_unfinished_character_at_end(default_model):
    p = default_model[1]
    ids = p.encode("ok 🤖")
    detok = p.incremental_detokenizer()
    text = "".join(detok.add([i]) for i in ids[:-1]) + detok.flush()
    assert "\ufffd" not in text and text.startswith("ok")


def test_hf_directory_round_trip(default_model, tmp_path):
    p = default_model[1]
    p.save_pretrained(tmp_path)
    again = Processor.from_dir(tmp_path)
    assert again.chat_template == p.chat_template
    assert (again.bos_token_id, again.eos_token_id) == (p.bos_token_id, p.eos_token_id)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))  # the saved files are standard HF files
    for text in TEXTS:
        assert again.encode(text) == p.encode(text) == hf.encode(text)


def test_chat_template_text_parts_and_errors(default_model):
    p = default_model[1]
    plain = p.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False)
    parts = p.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
        tokenize=False)
    assert plain == parts and plain.endswith("<|im_start|>assistant\n")
    with pytest.raises(ChatTemplateError, match="non-empty list"):
        p.apply_chat_template([])
    with pytest.raises(ChatTemplateError, match="role 'wizard'"):
        p.apply_chat_template([{"role": "wizard", "content": "x"}])
    with pytest.raises(ChatTemplateError, match=r"content\[0\]"):
        p.apply_chat_template([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}])
    bare = Processor(p.tokenizer, eos_token="<|im_end|>")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "x"}])


def test_batch_call_left_pads(default_model):
    p = default_model[1]
    out = p(["a", "a longer text here"], return_tensors="np")
    assert out["input_ids"].shape == out["attention_mask"].shape
    assert out["attention_mask"][0, 0] == 0 and out["attention_mask"][0, -1] == 1
    assert out["input_ids"][0, 0] == p.pad_token_id


def write_spm_gguf(path):
    """A tiny SentencePiece-style (tokenizer.ggml.model = llama) vocabulary with byte fallback."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = "the quick brown fox jumps over lazy dog hello world".split() + list("abcdefghijklmnopqrstuvwxyz")
    pieces = sorted({("\u2581" + w)[i:j] for w in words for i in range(len(w) + 1)
                     for j in range(i + 1, len(w) + 2)}, key=lambda s: (len(s), s))
    tokens += pieces
    types += [1] * len(pieces)
    scores = [0.0] * 259 + [-float(k) for k in range(len(pieces))]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_sentencepiece_gguf_tokenizer_matches_transformers(tmp_path):
    path = tmp_path / "spm.gguf"
    write_spm_gguf(path)
    fields = dict(open_gguf(path).fields)
    ours = Processor.from_gguf_metadata(fields)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    # (Strings with a leading space are left out: llama.cpp and HF's Llama-2 tokenizer.json
    # prepend "▁" to them, transformers' GGUF converter does not; we follow llama.cpp.)
    for text in ["the quick brown fox", "hello world", "Hello  World!", "über 日本", "thequickfox jumps"]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        assert ids[0] == 1  # add_bos_token
        assert ours.decode(ids, skip_special_tokens=True) == text

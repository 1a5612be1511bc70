"""Build an HF `tokenizers.Tokenizer` from a GGUF file's tokenizer metadata.

Supports `tokenizer.ggml.model` = "gpt2" (byte-level BPE, with llama.cpp's
`tokenizer.ggml.pre` splitting rules) and "llama" (SentencePiece BPE with byte
fallback, merges recovered from the piece scores).
"""

from __future__ import annotations

import logging

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..errors import UnsupportedModelError

log = logging.getLogger(__name__)

# llama.cpp token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# `tokenizer.ggml.pre` -> the regexes applied in order (as llama.cpp does).
PRE_TOKENIZER_PATTERNS = {
    "default": [_GPT2],
    "gpt-2": [_GPT2],
    "gpt2": [_GPT2],
    "smollm": [r"\p{N}", _GPT2],
    "llama3": [_LLAMA3],
    "llama-v3": [_LLAMA3],
    "llama-bpe": [_LLAMA3],
    "qwen2": [_QWEN2],
    "deepseek-r1-qwen": [_QWEN2],
}


def _byte_level_pre_tokenizer(pre: str | None):
    patterns = PRE_TOKENIZER_PATTERNS.get(pre or "default")
    if patterns is None:
        log.warning("GGUF pre-tokenizer %r is unknown; using GPT-2 splitting", pre)
        patterns = [_GPT2]
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns]
    return pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Recover BPE merges from SentencePiece scores: a piece is formed from its two halves,
    higher-scoring pieces merge first."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, piece_id in vocab.items():
        if types[piece_id] not in (NORMAL, USER_DEFINED) or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((scores[piece_id], vocab[left], vocab[right], left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    return [(m[3], m[4]) for m in merges]


def build_tokenizer(metadata: dict) -> Tokenizer:
    """metadata: the `tokenizer.ggml.*` fields (key without prefix -> value)."""
    kind = metadata.get("model")
    tokens: list[str] = list(metadata["tokens"])
    types: list[int] = list(metadata.get("token_type") or [NORMAL] * len(tokens))
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in metadata.get("merges", [])]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tok.pre_tokenizer = _byte_level_pre_tokenizer(metadata.get("pre"))
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        scores = list(metadata.get("scores") or [0.0] * len(tokens))
        unk_id = metadata.get("unknown_token_id", 0)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=_spm_merges(tokens, scores, types),
                                   unk_token=tokens[unk_id], byte_fallback=True, fuse_unk=True))
        steps = [normalizers.Replace(" ", "\u2581")]
        if metadata.get("add_space_prefix", True):
            steps.insert(0, normalizers.Prepend("\u2581"))
        tok.normalizer = normalizers.Sequence(steps)
        strip = [decoders.Strip(" ", 1, 0)] if metadata.get("add_space_prefix", True) else []
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()] + strip
        )
    else:
        raise UnsupportedModelError(f"GGUF tokenizer model {kind!r} is not supported (supported: gpt2, llama)")

    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t == CONTROL]
    user = [AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types) if t == USER_DEFINED]
    tok.add_special_tokens(special)
    tok.add_tokens(user)

    bos_id = metadata.get("bos_token_id")
    add_bos = metadata.get("add_bos_token", kind == "llama")
    if add_bos and bos_id is not None:
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
        )
    return tok

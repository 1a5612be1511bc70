"""The processor (tokenizer) handed around with a model.

It wraps a fast `tokenizers.Tokenizer` and offers the subset of the HF
tokenizer interface the engines use (`encode`, `decode`, `__call__`,
`apply_chat_template`, special-token ids), so an HF `AutoTokenizer` can be
passed wherever a Processor is expected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tokenizers import Tokenizer

from ..errors import ModelLoadError
from .chat_template import ChatTemplateError, render_chat_template
from .detokenize import IncrementalDetokenizer
from .gguf_tokenizer import build_tokenizer


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class Processor:
    padding_side = "left"

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        extra_eos_token_ids: Sequence[int] = (),
        chat_template: str | None = None,
        name_or_path: str = "",
    ):
        self.tokenizer = tokenizer
        self.images = None  # a vision-language model's image processor (multimodal/processor.py), set at load
        self.bos_token, self.eos_token = bos_token, eos_token
        self.pad_token = pad_token if pad_token is not None else eos_token
        self.unk_token = unk_token
        self.chat_template = chat_template
        self.name_or_path = name_or_path
        eos = [self.eos_token_id] if self.eos_token_id is not None else []
        self.eos_token_ids = list(dict.fromkeys(eos + [int(i) for i in extra_eos_token_ids]))

    # ------------------------------------------------------------ construction
    @classmethod
    def from_dir(cls, model_dir: str | Path, extra_eos_token_ids: Sequence[int] = ()) -> "Processor":
        model_dir = Path(model_dir)
        tok_file = model_dir / "tokenizer.json"
        if not tok_file.exists():
            hint = " (only fast tokenizers are supported; tokenizer.model alone is not)" if (
                model_dir / "tokenizer.model").exists() else ""
            raise ModelLoadError(f"file {str(tok_file)!r} is missing{hint}")
        try:
            tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as e:
            raise ModelLoadError(f"file {str(tok_file)!r} is not a valid tokenizer: {e}") from None
        cfg: dict[str, Any] = {}
        cfg_file = model_dir / "tokenizer_config.json"
        if cfg_file.exists():
            try:
                cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ModelLoadError(f"file {str(cfg_file)!r} is not valid JSON: {e}") from None
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = model_dir / "chat_template.jinja"
        if template is None and jinja_file.exists():
            template = jinja_file.read_text(encoding="utf-8")
        return cls(
            tokenizer,
            bos_token=_token_text(cfg.get("bos_token")),
            eos_token=_token_text(cfg.get("eos_token")),
            pad_token=_token_text(cfg.get("pad_token")),
            unk_token=_token_text(cfg.get("unk_token")),
            extra_eos_token_ids=extra_eos_token_ids,
            chat_template=template,
            name_or_path=str(model_dir),
        )

    @classmethod
    def from_gguf_metadata(cls, fields: dict[str, Any], name_or_path: str = "") -> "Processor":
        """fields: GGUF metadata (full keys) -> Processor built from `tokenizer.ggml.*`."""
        prefix = "tokenizer.ggml."
        meta = {k[len(prefix):]: v for k, v in fields.items() if k.startswith(prefix)}
        if "tokens" not in meta:
            raise ModelLoadError(f"{name_or_path!r}: GGUF metadata has no tokenizer (tokenizer.ggml.tokens)")
        tokens = meta["tokens"]

        def tok(key):
            i = meta.get(key)
            return tokens[i] if i is not None and 0 <= i < len(tokens) else None

        return cls(
            build_tokenizer(meta),
            bos_token=tok("bos_token_id"),
            eos_token=tok("eos_token_id"),
            pad_token=tok("padding_token_id"),
            unk_token=tok("unknown_token_id"),
            chat_template=fields.get("tokenizer.chat_template"),
            name_or_path=name_or_path,
        )

    def save_pretrained(self, directory: str | Path) -> None:
        """Write tokenizer.json + tokenizer_config.json (readable by transformers too)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(directory / "tokenizer.json"))
        cfg = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "unk_token": self.unk_token,
            "chat_template": self.chat_template,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))

    # ------------------------------------------------------------ special ids
    def convert_tokens_to_ids(self, token: str | None) -> int | None:
        return None if token is None else self.tokenizer.token_to_id(token)

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self.tokenizer.id_to_token(ids)
        return [self.tokenizer.id_to_token(int(i)) for i in ids]

    @property
    def bos_token_id(self) -> int | None:
        return self.convert_tokens_to_ids(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self.convert_tokens_to_ids(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self.convert_tokens_to_ids(self.pad_token)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    # ------------------------------------------------------------ text <-> ids
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(s, skip_special_tokens=skip_special_tokens) for s in sequences]

    def __call__(self, text, add_special_tokens: bool = True, padding: bool | str = False,
                 return_tensors: str | None = None, **_ignored):
        """HF-style batch encoding: {'input_ids', 'attention_mask'}; left-padded when padding."""
        batch = [text] if isinstance(text, str) else list(text)
        ids = [self.encode(t, add_special_tokens=add_special_tokens) for t in batch]
        if padding or return_tensors is not None:
            width = max(len(i) for i in ids)
            pad = self.pad_token_id if self.pad_token_id is not None else 0
            mask = [[0] * (width - len(i)) + [1] * len(i) for i in ids]
            ids = [[pad] * (width - len(i)) + i for i in ids]
        else:
            mask = [[1] * len(i) for i in ids]
        if return_tensors is not None:
            ids, mask = np.asarray(ids, np.int32), np.asarray(mask, np.int32)
        elif isinstance(text, str):
            ids, mask = ids[0], mask[0]
        return {"input_ids": ids, "attention_mask": mask}

    # ------------------------------------------------------------ chat
    def apply_chat_template(self, messages, tokenize: bool = True, add_generation_prompt: bool = True,
                            return_tensors: str | None = None, tools: list[dict] | None = None,
                            content_parts: bool = False, **variables):
        """tools: OpenAI tool objects (as HF's `tools=`); a template without tools support gets
        them in its system message instead (tokenizer/tool_prompt.py)."""
        if not self.chat_template:
            raise ChatTemplateError(f"the tokenizer of {self.name_or_path!r} has no chat template")
        text = render_chat_template(
            self.chat_template, messages, add_generation_prompt=add_generation_prompt, tools=tools,
            content_parts=content_parts, bos_token=self.bos_token or "", eos_token=self.eos_token or "",
            pad_token=self.pad_token or "", unk_token=self.unk_token or "", **variables,
        )
        if not tokenize:
            return text
        # The template already writes any BOS it wants.
        ids = self.encode(text, add_special_tokens=False)
        return np.asarray([ids], np.int32) if return_tensors is not None else ids

    def incremental_detokenizer(self, skip_special_tokens: bool = True, prompt_ids=()) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens, prompt_ids=prompt_ids)

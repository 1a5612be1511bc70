"""Tokenizer side: HF fast tokenizers, chat templates, incremental detokenization. No JAX here."""

from .chat_template import ChatTemplateError
from .detokenize import IncrementalDetokenizer
from .processor import Processor

__all__ = ["ChatTemplateError", "IncrementalDetokenizer", "Processor"]

"""GrammarCompiler: the model's vocabulary prepared for llguidance once, compiled grammars cached.

One compiler per (processor, logits width): `compiler_for(processor, vocab_size)`
returns the shared one. `compile(constraint)` is cached (LRU, keyed by the
constraint's canonical text) and thread-safe, so the server can compile on the
request thread (a bad constraint fails there, as HTTP 400) and the engine gets
the cached grammar when it admits the sequence.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from copy import copy
from typing import Sequence

from .bitmask import allocate_bitmask
from .compiled import CompiledGrammar
from .matcher import GrammarMatcher
from .spec import StructuredOutput, _first_line, _NAMES


class GrammarCompiler:
    """processor: a vsurge Processor or an HF fast tokenizer (its `tokenizers.Tokenizer` is used).

    vocab_size: width of the model's logits (may exceed the tokenizer's: padded embeddings;
    the extra ids are never allowed). eos_token_ids: the model's end tokens (default: the
    processor's), what a finished grammar allows unless the request names its own."""

    def __init__(self, processor, vocab_size: int | None = None, eos_token_ids: Sequence[int] | None = None,
                 cache_size: int = 256):
        import llguidance

        tokenizer = _backend_tokenizer(processor)
        self.vocab_size = int(vocab_size or tokenizer.get_vocab_size(with_added_tokens=True))
        if eos_token_ids is None:
            eos_token_ids = _processor_eos_ids(processor)
        if not eos_token_ids:
            raise ValueError("structured outputs need an end-of-sequence token: the processor has none")
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        tokenizer = copy(tokenizer)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        # ~0.3 s for a 49k vocabulary: done once per model.
        self.tokenizer = llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=self.vocab_size,
                                                eos_token=self.eos_token_ids)
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile(self, constraint: StructuredOutput | dict) -> CompiledGrammar:
        """Raises ValueError naming the problem (invalid, or nothing can be generated)."""
        constraint = StructuredOutput.coerce(constraint)
        key = constraint.key
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                return compiled
        compiled = self._build(key, constraint.grammar_text())  # outside the lock: others go on
        with self._lock:
            compiled = self._cache.setdefault(key, compiled)
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _build(self, key, grammar: str) -> CompiledGrammar:
        import llguidance

        name = _NAMES[key[0]]
        template = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if template.is_error():
            raise ValueError(f"invalid {name}: {_first_line(template.get_error())}")
        template.compute_bitmask()  # builds the lexer's first states now, not on the first step
        if template.is_error():
            raise ValueError(f"the {name} cannot match anything: no output satisfies it")
        return CompiledGrammar(key, template, self.eos_token_ids, self.vocab_size)

    def matcher(self, constraint: StructuredOutput | dict, end_token_ids: Sequence[int] | None = None):
        """A new GrammarMatcher for one sequence. end_token_ids: the request's end tokens
        (`SamplingParams.eos_ids(model_eos)`); None = the model's."""
        return GrammarMatcher(self.compile(constraint), end_token_ids)

    def allocate_bitmask(self, batch: int):
        """(batch, ceil(V/32)) int32, all allowed."""
        return allocate_bitmask(batch, self.vocab_size)

    def cache_info(self) -> dict:
        with self._lock:
            return {"size": len(self._cache), "capacity": self._cache_size}


def _backend_tokenizer(processor):
    from tokenizers import Tokenizer

    for candidate in (processor, getattr(processor, "tokenizer", None), getattr(processor, "backend_tokenizer", None)):
        if isinstance(candidate, Tokenizer):
            return candidate
    raise TypeError(f"structured outputs need a fast tokenizer (tokenizers.Tokenizer); "
                    f"{type(processor).__name__} has none")


def _processor_eos_ids(processor) -> list[int]:
    ids = getattr(processor, "eos_token_ids", None)
    if ids:
        return list(ids)
    eos = getattr(processor, "eos_token_id", None)
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


_COMPILERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_COMPILERS_LOCK = threading.Lock()


def compiler_for(processor, vocab_size: int | None = None) -> GrammarCompiler:
    """The shared GrammarCompiler of `processor` at this logits width (built on first use)."""
    with _COMPILERS_LOCK:
        per_width = _COMPILERS.setdefault(processor, {})
        compiler = per_width.get(vocab_size)
        if compiler is None:
            compiler = per_width[vocab_size] = GrammarCompiler(processor, vocab_size)
        return compiler

"""vSurge's seed helpers for callers that buffer and merge streamed samples themselves.

Called by: code written against the seed's `vSurge` (EasyDeL), which buffered
samples ending in a partial UTF-8 byte token before detokenizing. vsurge's own
streams never need this: `ReturnSample.text` only ever holds whole characters
(tokenizer/detokenize.py holds incomplete bytes back).
"""

from __future__ import annotations

import re

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>$")


class vSurgeSeedAPI:  # noqa: N801
    processor: object

    def should_buffer_response(self, response: list) -> bool:
        """True when a sample ends with a token that is only part of a UTF-8 character."""
        for sample in response:
            if not sample.token_ids:
                continue
            last = sample.token_ids[-1]
            piece = self.processor.decode([last], skip_special_tokens=False)
            tokens = getattr(self.processor, "convert_ids_to_tokens", None)
            name = tokens(last) if tokens else piece
            if "\ufffd" in piece or (isinstance(name, str) and _BYTE_TOKEN.search(name)):
                return True
        return False

    def process_client_side_tokenization_response(self, response: list) -> list:
        """Client-side tokenization: the samples go out as they are (token ids only)."""
        return response

    def process_server_side_tokenization_response(self, response: list, buffered_response_list: list) -> list:
        """Join each sample with its buffered predecessors -> per sample
        (text, all token ids, latest tokens_per_second, latest num_generated_tokens)."""
        out = []
        for i, sample in enumerate(response):
            parts = [buffered[i] for buffered in buffered_response_list if i < len(buffered)] + [sample]
            out.append(("".join(p.text for p in parts), [t for p in parts for t in p.token_ids],
                        sample.tokens_per_second, sample.num_generated_tokens))
        return out

"""llama.cpp's split form of a vision-language model: the text model's GGUF plus an mmproj GGUF holding
the vision tower and projector (`llama-server -m text.gguf --mmproj mmproj.gguf`).

The pair loads as the family's one model: the mmproj's `clip.projector_type` and the text GGUF's
architecture pick the family (models/registry.family_for_mmproj), both files' metadata make its config
(the family's config_from_mmproj), and the two files' tensors are read as one source (their names never
meet: `v.*` / `mm.*` against `blk.*`, `token_embd`, `output*`). The text GGUF's tokenizer holds the image
tokens; what the image processor needs beyond the config comes from the mmproj (mmproj_preprocessor).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelLoadError
from ..models.parts.mmproj_config import projector_type
from ..models.registry import family_for_mmproj
from .gguf import GGUFSource, gguf_meta, open_gguf


class PairSource:
    """The tensors of the text GGUF and the mmproj as one TensorSource (and the block loader's extras)."""

    def __init__(self, text: GGUFSource, mmproj: GGUFSource):
        self.parts = (text, mmproj)
        self.path = text.path
        self._of = {name: part for part in self.parts for name in part.names()}

    def _part(self, name: str) -> GGUFSource:
        return self._of.get(name, self.parts[0])

    def names(self) -> set[str]:
        return set(self._of)

    def where(self, name: str) -> str:
        return self._part(name).where(name)

    def shape(self, name: str):
        return self._part(name).shape(name)

    def block_type(self, name: str):
        return self._part(name).block_type(name)

    def raw_rows(self, name: str):
        return self._part(name).raw_rows(name)

    def read(self, name: str, index=()):
        return self._part(name).read(name, index)

    def release(self) -> None:
        for part in self.parts:
            part.release()


def load_pair(text_reader, text_path: Path, mmproj: str | Path):
    """(family, config, source, preprocessor settings) of a text GGUF and its mmproj."""
    mm_path = Path(mmproj).expanduser()
    if mm_path.is_dir():
        raise ModelLoadError(f"mmproj {str(mm_path)!r} is a directory; give llama.cpp's mmproj .gguf file")
    mm_reader = open_gguf(mm_path)
    text, mm = gguf_meta(text_reader, text_path), gguf_meta(mm_reader, mm_path)
    where = f"{text.where} with mmproj {mm.where}"
    family = family_for_mmproj(text.arch, projector_type(mm), where)
    config = family.config_from_mmproj(text, mm, where)
    source = PairSource(GGUFSource(text_reader, text_path, family.gguf_config_tensors), GGUFSource(mm_reader, mm_path))
    return family, config, source, family.mmproj_preprocessor(mm)


def check_mmproj_model(path: Path) -> None:
    """An mmproj goes with a text model's GGUF file (not an HF directory, whose tower is in it already)."""
    if path.is_dir():
        raise ModelLoadError(f"an mmproj goes with the text model's GGUF file (llama.cpp's pair), but the model "
                             f"{str(path)!r} is a directory (an HF vision-language model directory holds its "
                             "vision tower already: load it without the mmproj)")

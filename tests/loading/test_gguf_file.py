"""Our GGUF reader (loading/gguf_file.py) against the gguf package's GGUFReader on the same files."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from vsurge.errors import ModelLoadError
from vsurge.loading import default_model_path
from vsurge.loading.gguf import open_gguf
from vsurge.loading.gguf_file import GGUFFile


def assert_same_as_gguf_reader(path):
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    assert ours.fields == {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(b.shape.tolist()), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        np.testing.assert_array_equal(a.data, b.data)


def test_default_model_reads_like_the_gguf_package():
    assert_same_as_gguf_reader(default_model_path())


def _resident_kib(path) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
    total, ours = 0, False
    for line in open("/proc/self/smaps"):
        first = line.split()[0]
        if not first.endswith(":"):  # a mapping's header line: "start-end perms offset dev inode [path]"
            ours = line.rstrip().endswith(str(path))
        elif ours and first == "Rss:":
            total += int(line.split()[1])
    return total


def test_dropping_resident_pages_keeps_the_data(tmp_path):
    """Loading copies tensors out; drop_resident_pages takes the file's pages out of the resident set
    (they counted in the load's peak beside the copies), and reading again gives the same bytes."""
    path = tmp_path / "model.gguf"
    path.write_bytes(default_model_path().read_bytes())
    reader = GGUFFile(path)
    before = [np.array(t.data) for t in reader.tensors]  # every page touched
    assert _resident_kib(path) > 50_000
    reader.drop_resident_pages()
    assert _resident_kib(path) < 1_000
    for t, data in zip(reader.tensors, before):
        np.testing.assert_array_equal(t.data, data)


def test_mixed_quantization_types_read_like_the_gguf_package(tmp_path):
    """Every value type the writer emits (incl. arrays of ints and floats) and several tensor types."""
    path = tmp_path / "mixed.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("test.u32", 7)
    w.add_int64("test.i64", -3)
    w.add_float32("test.f32", 0.5)
    w.add_float64("test.f64", 0.25)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo")
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.floats", [0.5, 1.5])
    w.add_array("test.strings", ["a", "", "ü"])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((4, 64)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((3, 32)).astype(np.float16))
    q = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same_as_gguf_reader(path)
    assert GGUFFile(path).fields["test.strings"] == ["a", "", "ü"]


@pytest.mark.parametrize("cut", [3, 20, 200, -100])
def test_truncated_file_names_the_problem(tmp_path, cut):
    data = default_model_path().read_bytes()[:1_000_000]
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        open_gguf(path)


def test_wrong_version_is_refused(tmp_path):
    path = tmp_path / "v9.gguf"
    path.write_bytes(b"GGUF" + (9).to_bytes(4, "little") + bytes(16))
    with pytest.raises(ModelLoadError, match="version 9"):
        open_gguf(path)


def test_big_endian_file_is_named(tmp_path):
    path = tmp_path / "be.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "big") + bytes(16))
    with pytest.raises(ModelLoadError, match="big-endian"):
        open_gguf(path)

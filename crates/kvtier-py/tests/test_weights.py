"""What pins a model's weights in its layouts (kvtier/_weights.py), and the pipeline stage
in a layout's key."""

from __future__ import annotations

import hashlib

import pytest

import kvtier
from kvtier import _weights


@pytest.fixture
def checkpoint(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 8}')
    (d / "model-00001-of-00002.safetensors").write_bytes(b"\x01" * 1000)
    (d / "model-00002-of-00002.safetensors").write_bytes(b"\x02" * 1000)
    (d / "README.md").write_text("not part of the weights")
    return d


def test_a_local_directory_is_pinned_by_its_files_contents(checkpoint):
    first = _weights.weights_identity(str(checkpoint), None)
    assert first is not None and first.startswith("sha256:")
    assert _weights.weights_identity(str(checkpoint), None) == first
    # Files that are not weights or config do not matter.
    (checkpoint / "README.md").write_text("edited")
    assert _weights.weights_identity(str(checkpoint), None) == first
    # New weights of the same size in the same files: another identity.
    (checkpoint / "model-00002-of-00002.safetensors").write_bytes(b"\x03" * 1000)
    second = _weights.weights_identity(str(checkpoint), None)
    assert second not in (None, first)
    # A changed config too.
    (checkpoint / "config.json").write_text('{"hidden_size": 9}')
    assert _weights.weights_identity(str(checkpoint), None) not in (first, second)
    # The operator's digest wins over everything.
    assert _weights.weights_identity(str(checkpoint), None, "deploy-7") == "deploy-7"


def test_unchanged_files_are_not_read_again(checkpoint, monkeypatch):
    first = _weights.weights_identity(str(checkpoint), None)
    reads = []
    real = hashlib.file_digest

    def counting(fh, name):  # type: ignore[no-untyped-def]
        reads.append(fh.name)
        return real(fh, name)

    monkeypatch.setattr(hashlib, "file_digest", counting)
    assert _weights.weights_identity(str(checkpoint), None) == first
    assert reads == [], "the remembered digests were not used"
    (checkpoint / "model-00001-of-00002.safetensors").write_bytes(b"\x04" * 1000)
    _weights.weights_identity(str(checkpoint), None)
    assert [p.rsplit("/", 1)[-1] for p in reads] == ["model-00001-of-00002.safetensors"]


def test_a_directory_without_weights_and_an_unknown_hub_name_pin_nothing(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    assert _weights.weights_identity(str(tmp_path / "empty"), None) is None
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert _weights.weights_identity("org/never-downloaded", None) is None
    # A revision that is a commit pins the weights by itself.
    commit = "a" * 40
    assert _weights.weights_identity("org/never-downloaded", commit) == f"hf:{commit}"


def test_a_hub_name_is_pinned_by_the_commit_its_revision_resolves_to(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf

    hub = tmp_path / "hub"
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(hub))
    repo = hub / "models--org--model"
    old, new = "1" * 40, "2" * 40
    for commit in (old, new):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(old)
    assert _weights.weights_identity("org/model", None) == f"hf:{old}"
    # main moved to new weights: another identity, with no revision given either way.
    (repo / "refs" / "main").write_text(new)
    assert _weights.weights_identity("org/model", None) == f"hf:{new}"


def test_pipeline_stages_never_share_keys():
    e = kvtier.Engine({"ssd": {"enabled": False}, "ram": "64MiB"})
    try:
        stages = {
            e.register_layout("m", "f16", 16, 2, 2, 64, pp_stage=s, pp_size=2, weights_digest="w").digest
            for s in (0, 1)
        }
        single = e.register_layout("m", "f16", 16, 2, 2, 64, weights_digest="w").digest
        assert len(stages | {single}) == 3
    finally:
        e.close()

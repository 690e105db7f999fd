"""engine.io.hub: resolving specs and listing local models, over a fake HF cache and fake embedded parts."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import torch

from engine.io import hub, provision
from engine.io.hub import LocalModel, hf_cache_dir, list_local_models, resolve
from engine.io.provision import PartSet, ProvisionError
from engine.io.weights import ModelLoadError, load_checkpoint

try:
    from test_weights import make_hf_model, make_tokenizer, save_hf_folder, write_gguf
except ImportError:  # tests/ imported as a package
    from tests.engine.test_weights import (
        make_hf_model,
        make_tokenizer,
        save_hf_folder,
        write_gguf,
    )


def cache_repo(cache: Path, repo_id: str, rev: str = "abc123", main: bool = True) -> Path:
    """An empty snapshot folder laid out as huggingface_hub does."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    return snap


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    c = tmp_path / "hf" / "hub"
    c.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(c))
    return c


@pytest.fixture
def no_embedded(monkeypatch, tmp_path):
    """Embedded pair neither converted nor installed."""
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path / "speclens"))

    def missing(pkg):
        raise ProvisionError(f"{pkg} is not installed")
    monkeypatch.setattr(provision, "locate_part", missing)


def test_hf_cache_dir_precedence(monkeypatch, tmp_path):
    """huggingface_hub's order, read at each call (its own constants are fixed at import)."""
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hubcache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_cache_dir() == tmp_path / "hubcache"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))  # the old name still counts
    assert hf_cache_dir() == tmp_path / "legacy"
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE")
    assert hf_cache_dir() == tmp_path / "hfhome" / "hub"
    monkeypatch.delenv("HF_HOME")
    assert hf_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hf_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"


def test_resolve_repo_id_follows_refs_main(cache):
    old = cache_repo(cache, "org/model", "old")
    newer = cache / "models--org--model" / "snapshots" / "new"
    newer.mkdir()
    os.utime(old, (time.time() - 100, time.time() - 100))  # so the ref, not age, must pick it
    (cache / "models--org--model" / "refs" / "main").write_text("old")  # as huggingface_hub writes it
    assert resolve("org/model") == old
    (cache / "models--org--model" / "refs" / "main").unlink()
    assert resolve("org/model") == newer  # no ref: the newest snapshot


def test_load_checkpoint_by_repo_id(cache):
    snap = cache_repo(cache, "tiny/llama")
    _, model = save_hf_folder(snap)
    ck = load_checkpoint("tiny/llama")
    assert ck.name == "tiny/llama" and ck.path == snap
    assert set(ck.tensors) == set(model.state_dict())


def test_repo_id_in_huggingface_hubs_own_layout_loads_without_the_network(cache, monkeypatch):
    """Snapshot files are symlinks into blobs/, as huggingface_hub writes them; nothing may touch the network."""
    import socket

    def no_network(*a, **k):
        raise AssertionError("tried to reach the network")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    snap = cache_repo(cache, "tiny/linked")
    _, model = save_hf_folder(snap)
    blobs = cache / "models--tiny--linked" / "blobs"
    blobs.mkdir()
    for f in [f for f in snap.iterdir() if f.is_file()]:
        blob = blobs / hashlib.sha256(f.read_bytes()).hexdigest()
        f.rename(blob)
        f.symlink_to(os.path.relpath(blob, snap))
    ck = load_checkpoint("tiny/linked")
    assert ck.path == snap and ck.name == "tiny/linked"
    for k, v in model.state_dict().items():
        assert torch.equal(ck.tensors[k], v), k
    m = hub.describe(snap, "hf-cache")
    assert m.params_b == float(f"{sum(p.numel() for p in model.parameters()) / 1e9:.3g}")


def test_corrupt_cache_repos_are_skipped_with_a_warning(cache, no_embedded, caplog):
    """What huggingface_hub's scan calls corrupt: a broken blob link, a ref to a missing snapshot."""
    save_hf_folder(cache_repo(cache, "good/llama"))
    broken = cache_repo(cache, "bad/broken-link")
    (broken / "config.json").symlink_to("../../blobs/gone")
    dangling = cache_repo(cache, "bad/dangling-ref")
    (dangling.parent.parent / "refs" / "main").write_text("elsewhere")
    with caplog.at_level("WARNING", logger="engine.io.hub"):
        assert [m.name for m in list_local_models()] == ["good/llama"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "models--bad--broken-link" in warned and "models--bad--dangling-ref" in warned


def test_unknown_repo_id_says_where_it_looked(cache):
    with pytest.raises(ModelLoadError) as e:
        resolve("nobody/nothing")
    msg = str(e.value)
    assert "nobody/nothing" in msg and str(cache / "models--nobody--nothing") in msg and "never downloads" in msg


def test_resolve_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        resolve(tmp_path / "missing" / "x")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        resolve(tmp_path / "notes.txt")
    folder = tmp_path / "ggufs"
    folder.mkdir()
    (folder / "a.gguf").write_bytes(b"GGUF")
    assert resolve(folder) == folder / "a.gguf"  # the folder's only GGUF
    assert resolve(str(folder / "a.gguf")) == folder / "a.gguf"
    (folder / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=r"several \.gguf files \(a\.gguf, b\.gguf\)"):
        resolve(folder)
    with pytest.raises(ModelLoadError, match="empty model path"):
        resolve("")


def test_list_finds_compatible_cache_models_and_skips_the_rest(cache, no_embedded):
    save_hf_folder(cache_repo(cache, "tiny/llama"))
    save_hf_folder(cache_repo(cache, "tiny/qwen"), "qwen2")
    tok = make_tokenizer()
    gsnap = cache_repo(cache, "tiny/qwen-gguf")
    write_gguf(gsnap / "q8.gguf", make_hf_model("qwen2", len(tok)), tok, "Q8_0")
    bad = cache_repo(cache, "tiny/gpt2")  # unsupported architecture
    save_hf_folder(bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    (cache_repo(cache, "tiny/broken") / "config.json").write_text("{oops")
    partial = cache_repo(cache, "tiny/partial")  # config downloaded, weights not
    save_hf_folder(partial)
    (partial / "model.safetensors").unlink()

    models = {m.name: m for m in list_local_models()}
    assert set(models) == {"tiny/llama", "tiny/qwen", "tiny/qwen-gguf/q8.gguf"}
    llama = models["tiny/llama"]
    expect = sum(p.numel() for p in make_hf_model("llama", len(tok)).parameters())
    assert llama == LocalModel("tiny/llama", cache / "models--tiny--llama" / "snapshots" / "abc123", "hf-cache",
                               "llama", len(tok), 2, 32, float(f"{expect / 1e9:.3g}"),
                               128, 2 * 2 * 2 * 8, quant="F32")  # context; K and V x 2 layers x 2 KV heads x head dim 8
    assert (models["tiny/qwen"].arch, models["tiny/qwen"].source) == ("qwen2", "hf-cache")
    g = models["tiny/qwen-gguf/q8.gguf"]
    assert (g.source, g.arch, g.vocab_size, g.num_layers, g.hidden_size) == ("gguf", "qwen2", len(tok), 2, 32)
    assert (g.context_limit, g.kv_values_per_token) == (128, 64)  # what a context costs
    assert (g.kv_bytes_per_value, llama.kv_bytes_per_value) == (2, 4)  # a GGUF model's cache is float16
    assert g.path == gsnap / "q8.gguf" and g.quant == "Q8_0"
    # asked for, the unsupported one is listed too, saying why; the broken ones never
    every = {m.name: m for m in list_local_models(include_unrunnable=True)}
    assert set(every) == set(models) | {"tiny/gpt2"}
    assert every["tiny/gpt2"].why_not == ("unsupported model_type 'gpt2': SpecLens runs llama, qwen2, mistral, qwen3, "
                                           "gemma3_text, phi3, smollm3, granite")
    assert not every["tiny/gpt2"].runnable and all(m.runnable for m in models.values())


def test_empty_or_missing_cache_lists_nothing(tmp_path, monkeypatch, no_embedded):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "does-not-exist"))
    assert list_local_models() == []


@pytest.fixture
def fake_embedded(tmp_path, monkeypatch):
    """Embedded target/draft backed by one tiny GGUF cut into two fake part packages."""
    tok = make_tokenizer()
    src = write_gguf(tmp_path / "src.gguf", make_hf_model("qwen2", len(tok)), tok, "mixed")
    data = src.read_bytes()
    files = {"fake-a": tmp_path / "a.bin", "fake-b": tmp_path / "b.bin"}
    files["fake-a"].write_bytes(data[: len(data) // 2])
    files["fake-b"].write_bytes(data[len(data) // 2:])
    sha = hashlib.sha256(data).hexdigest()
    monkeypatch.setattr(provision, "TARGET", PartSet("tiny-target", tuple(files), len(data), sha))
    monkeypatch.setattr(provision, "DRAFT", PartSet("tiny-draft", tuple(files), len(data), sha))
    monkeypatch.setattr(provision, "locate_part", lambda pkg: files[pkg])
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path / "speclens"))
    return tok


def test_embedded_pair_is_listed_before_and_after_provisioning(cache, fake_embedded):
    root = provision.cache_root()
    before = list_local_models()
    assert [(m.name, m.source, m.path) for m in before] == [
        ("tiny-target", "embedded", root / "tiny-target.gguf"), ("tiny-draft", "embedded", root / "tiny-draft.gguf")]
    assert (before[0].arch, before[0].vocab_size, before[0].num_layers) == ("qwen2", len(fake_embedded), 2)
    assert not (root / "tiny-target.gguf").exists()  # listing never provisions

    provision.default_pair()
    after = list_local_models()
    assert [(m.name, m.source, m.path) for m in after] == [(m.name, m.source, m.path) for m in before]
    assert [(m.arch, m.vocab_size, m.num_layers, m.hidden_size, m.params_b) for m in after] == \
        [(m.arch, m.vocab_size, m.num_layers, m.hidden_size, m.params_b) for m in before]
    assert after[0].params_b > 0


def test_label_of_cache_paths(cache):
    snap = cache_repo(cache, "org/name")
    assert hub.label(snap, snap) == "org/name"
    assert hub.label(snap / "m.gguf", snap / "m.gguf") == "org/name/m.gguf"
    assert hub.label("x", Path("/a/b/folder")) == "folder"
    assert hub.label("x", Path("/a/b/model-q4.gguf")) == "model-q4"


def header_only_gguf(path: Path, alignment: int) -> Path:
    """A GGUF with no tensors and two keys, the second general.alignment (uint32)."""
    import struct

    def key(name: str) -> bytes:
        return struct.pack("<Q", len(name)) + name.encode()

    arch = key("general.architecture") + struct.pack("<I", 8) + key("qwen2")  # 8: string
    align = key("general.alignment") + struct.pack("<I", 4) + struct.pack("<I", alignment)  # 4: uint32
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + arch + align)
    return path


@pytest.mark.parametrize("alignment", [0, 24])
def test_a_gguf_with_a_bad_alignment_is_a_model_load_error(tmp_path, alignment):
    """Alignment 0 was a ZeroDivisionError."""
    from engine.io.gguf_file import GGUFFile

    path = header_only_gguf(tmp_path / "bad.gguf", alignment)
    with pytest.raises(ModelLoadError, match=rf"bad.gguf: invalid general.alignment {alignment} .*power of two"):
        GGUFFile(path)


def test_one_bad_gguf_never_hides_the_other_models(cache, fake_embedded, caplog):
    """A GGUF with alignment 0 in the HF cache emptied the whole list, the embedded pair too."""
    save_hf_folder(cache_repo(cache, "good/llama"))
    header_only_gguf(cache_repo(cache, "bad/zero-align") / "x.gguf", 0)
    with caplog.at_level("WARNING", logger="engine.io.hub"):
        names = [m.name for m in list_local_models()]
    assert names == ["tiny-target", "tiny-draft", "good/llama"]
    assert "invalid general.alignment 0" in " ".join(r.getMessage() for r in caplog.records)


def test_an_unforeseen_error_skips_only_its_entry(cache, no_embedded, monkeypatch, caplog):
    save_hf_folder(cache_repo(cache, "good/llama"))
    save_hf_folder(cache_repo(cache, "odd/llama"))
    real = hub.describe

    def describe(path, source, name=None):
        if "odd" in str(path):
            raise ArithmeticError("something nobody foresaw")
        return real(path, source, name)

    monkeypatch.setattr(hub, "describe", describe)
    with caplog.at_level("WARNING", logger="engine.io.hub"):
        assert [m.name for m in list_local_models()] == ["good/llama"]
    assert "ArithmeticError: something nobody foresaw" in " ".join(r.getMessage() for r in caplog.records)


def test_load_engine_takes_the_context_asked_for_within_the_models_limit(tmp_path):
    """The cache was 4096 tokens (or the models' limit), whatever the user wanted."""
    from engine.io.loading import load_engine

    folder, _ = save_hf_folder(tmp_path / "m")  # max_position_embeddings 128
    assert load_engine(str(folder), context=64).max_seq_len == 64
    assert load_engine(str(folder), context=100_000).max_seq_len == 128  # never past what the model allows
    assert load_engine(str(folder)).max_seq_len == 128


@pytest.mark.parametrize("label, counted, expect", [
    ("0.5B", 630_167_424, 0.5),  # Qwen2.5 0.5B's GGUF stores its tied head twice
    ("270M", 268_098_176, 0.27),
    ("1.5B", 1_777_088_000, 1.5),
    ("8x7B", 46_700_000_000, 46.7),  # a mixture's label is no count: counted
    ("70B", 1_000_000, 0.001),  # far from the count: not believed
    ("9" * 40 + "B", 1_000_000, 0.001),  # too long to be a label
    (None, 123_456_789, 0.123),
])
def test_a_gguf_is_listed_at_its_known_size(label, counted, expect):
    from types import SimpleNamespace

    gf = SimpleNamespace(num_params=counted, metadata={} if label is None else {"general.size_label": label})
    assert hub._params_b(gf) == pytest.approx(expect)

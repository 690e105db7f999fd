"""engine.io.model_dirs and the listing over them: fake LM Studio, Ollama and llama.cpp folders under a fake HOME,
with tiny GGUFs, some of them broken."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.io import hub, model_dirs, provision
from engine.io.provision import ProvisionError
from engine.io.weights import load_checkpoint
from engine.tools import models as models_tool
from tests.engine.test_weights import make_hf_model, make_tokenizer, write_gguf


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty HOME; no HF cache, no embedded pair; the other apps' own variables unset."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    for var in ("OLLAMA_MODELS", "LLAMA_CACHE", "XDG_CACHE_HOME", model_dirs.ENV_SWITCH):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path / "speclens"))

    def missing(pkg):
        raise ProvisionError(f"{pkg} is not installed")
    monkeypatch.setattr(provision, "locate_part", missing)
    return h


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory) -> Path:
    """A tiny runnable Qwen2 GGUF (Q8_0), written once and copied where each test wants it."""
    tok = make_tokenizer()
    return write_gguf(tmp_path_factory.mktemp("src") / "qwen.gguf", make_hf_model("qwen2", len(tok)), tok, "Q8_0")


def put(src: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return dest


def header_gguf(path: Path, arch: str) -> Path:
    """A GGUF of another family: its header and a small embedding, enough to list it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(3)
    w.add_context_length(40960)
    w.add_embedding_length(32)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tensor("token_embd.weight", np.zeros((10, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def ollama_manifest(root: Path, name: str, tag: str, blob_of: Path | None, registry: str = "registry.ollama.ai",
                    namespace: str = "library", digest: str | None = None) -> Path:
    """A manifest as Ollama writes it, its model layer naming blob_of's copy in blobs/ (by its SHA-256)."""
    if blob_of is not None:
        digest = "sha256:" + hashlib.sha256(blob_of.read_bytes()).hexdigest()
        put(blob_of, root / "blobs" / digest.replace(":", "-"))
    manifest = root / "manifests" / registry / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
        {"mediaType": model_dirs.OLLAMA_MODEL_LAYER, "digest": digest or "sha256:" + "f" * 64, "size": 1}]}))
    return manifest


def test_locations_follow_home_and_the_apps_variables(home, monkeypatch, tmp_path):
    assert model_dirs.lmstudio_dirs() == [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    assert model_dirs.ollama_dir() == home / ".ollama" / "models"
    assert model_dirs.llamacpp_dir() == home / ".cache" / "llama.cpp"
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama"))
    assert (model_dirs.ollama_dir(), model_dirs.llamacpp_dir()) == (tmp_path / "ollama", tmp_path / "llama")
    monkeypatch.delenv("LLAMA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_dirs.llamacpp_dir() == tmp_path / "xdg" / "llama.cpp"


def test_lists_every_apps_models_with_family_size_quant_context_and_whether_they_run(home, qwen_gguf):
    put(qwen_gguf, home / ".lmstudio" / "models" / "Qwen" / "Qwen2-GGUF" / "qwen2-q8_0.gguf")
    header_gguf(home / ".cache" / "lm-studio" / "models" / "HF" / "gemma-2-GGUF" / "gemma-2-q8_0.gguf", "gemma2")
    ollama_manifest(home / ".ollama" / "models", "qwen2.5", "0.5b", qwen_gguf)
    ollama_manifest(home / ".ollama" / "models", "qwen3", "30b-a3b", header_gguf(home / "q3.gguf", "qwen3moe"))
    ollama_manifest(home / ".ollama" / "models", "repo", "Q8_0", qwen_gguf, registry="hf.co", namespace="me")
    put(qwen_gguf, home / ".cache" / "llama.cpp" / "Qwen_Qwen2-GGUF_qwen2-q8_0.gguf")

    assert [m.name for m in hub.list_local_models()] == [  # the app's picker: what runs
        "Qwen/Qwen2-GGUF/qwen2-q8_0.gguf", "hf.co/me/repo:Q8_0", "qwen2.5:0.5b", "Qwen_Qwen2-GGUF_qwen2-q8_0.gguf"]
    models = {m.name: m for m in hub.list_local_models(include_unrunnable=True)}
    assert len(models) == 6
    lm = models["Qwen/Qwen2-GGUF/qwen2-q8_0.gguf"]
    assert (lm.source, lm.arch, lm.quant, lm.context_limit, lm.runnable) == ("lm-studio", "qwen2", "Q8_0", 128, True)
    params = sum(p.numel() for p in make_hf_model("qwen2", lm.vocab_size).parameters())
    assert lm.params_b == float(f"{params / 1e9:.3g}")
    g2 = models["HF/gemma-2-GGUF/gemma-2-q8_0.gguf"]
    assert (g2.source, g2.arch, g2.num_layers, g2.context_limit, g2.quant) == ("lm-studio", "gemma2", 3, 40960, "Q8_0")
    assert g2.why_not == "Gemma 2 needs logit soft-capping, which SpecLens does not implement yet"
    ol = models["qwen2.5:0.5b"]
    assert ol.source == "ollama" and ol.runnable and ol.path.parent == home / ".ollama" / "models" / "blobs"
    assert models["qwen3:30b-a3b"].why_not.startswith("Qwen3 MoE needs mixture-of-experts layers")
    assert models["Qwen_Qwen2-GGUF_qwen2-q8_0.gguf"].source == "llama.cpp"


def test_an_ollama_blob_loads_as_the_gguf_it_is(home, qwen_gguf):
    ollama_manifest(home / ".ollama" / "models", "qwen2.5", "latest", qwen_gguf)
    (m,) = hub.list_local_models()
    assert m.path.suffix == ""  # a blob is named by its hash
    ck = load_checkpoint(m.path, dequantize=False)
    assert ck.config == load_checkpoint(qwen_gguf, dequantize=False).config
    assert ck.name == "qwen2.5:latest"  # the name the user knows it by, not the blob's hash


def test_broken_entries_are_skipped_with_a_log_line_and_never_hide_the_others(home, qwen_gguf, caplog):
    studio = home / ".lmstudio" / "models"
    put(qwen_gguf, studio / "pub" / "good" / "good.gguf")
    data = qwen_gguf.read_bytes()
    (studio / "pub" / "cut").mkdir(parents=True)
    (studio / "pub" / "cut" / "cut.gguf").write_bytes(data[: len(data) - 100])  # an interrupted download
    (studio / "pub" / "loop").symlink_to(studio / "pub")  # a folder link back to its parent
    (studio / "pub" / "self.gguf").symlink_to(studio / "pub" / "self.gguf")  # a link to itself
    (studio / "pub" / "empty.gguf").write_bytes(b"")
    ollama = home / ".ollama" / "models"
    ollama_manifest(ollama, "good", "latest", qwen_gguf)
    ollama_manifest(ollama, "noblob", "latest", None)  # its blob was deleted
    bad_json = ollama_manifest(ollama, "garbled", "latest", None)
    bad_json.write_text("{not json")
    no_layer = ollama_manifest(ollama, "nolayer", "latest", None)
    no_layer.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.license"}]}))
    odd = ollama_manifest(ollama, "odd", "latest", None, digest="sha256:../../../etc/passwd")
    assert odd.is_file()

    with caplog.at_level("WARNING"):
        names = [m.name for m in hub.list_local_models(include_unrunnable=True)]
    assert names == ["pub/good/good.gguf", "good:latest"]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "cut.gguf" in said and "truncated" in said
    assert "symlink loop" in said and "self.gguf" in said and "empty.gguf" in said
    assert "noblob" in said and "is missing" in said
    assert "garbled" in said and "nolayer" in said and "no model layer" in said
    assert "odd" in said and "not sha256:<64 hex digits>" in said


def test_the_walk_is_bounded(home, qwen_gguf, caplog):
    deep = home / ".lmstudio" / "models"
    for i in range(model_dirs.MAX_DEPTH + 2):
        deep = deep / f"d{i}"
    put(qwen_gguf, deep / "too-deep.gguf")
    for i in range(5):
        put(qwen_gguf, home / ".cache" / "llama.cpp" / f"m{i}.gguf")
    assert [p.name for p in model_dirs.walk_ggufs(home / ".lmstudio" / "models")] == []
    with caplog.at_level("WARNING"):
        assert len(list(model_dirs.walk_ggufs(home / ".cache" / "llama.cpp", max_entries=3))) == 3
    assert "stopped listing" in caplog.text


def test_split_ggufs_list_once_as_not_runnable(home, qwen_gguf):
    folder = home / ".lmstudio" / "models" / "pub" / "big"
    data = qwen_gguf.read_bytes()
    (folder).mkdir(parents=True)
    (folder / "big-00001-of-00002.gguf").write_bytes(data[: len(data) // 2])
    (folder / "big-00002-of-00002.gguf").write_bytes(data[len(data) // 2:])
    (m,) = hub.list_local_models(include_unrunnable=True)
    assert m.name == "pub/big/big-00001-of-00002.gguf" and m.arch == "qwen2"
    assert m.why_not.startswith("split into 2 files")


def test_the_switch_turns_the_other_apps_off(home, qwen_gguf, monkeypatch):
    put(qwen_gguf, home / ".cache" / "llama.cpp" / "m.gguf")
    assert len(hub.list_local_models()) == 1
    monkeypatch.setenv(model_dirs.ENV_SWITCH, "off")
    assert hub.list_local_models() == []


def test_speclens_models_prints_the_list_and_json(home, qwen_gguf, capsys):
    ollama_manifest(home / ".ollama" / "models", "qwen2.5", "0.5b", qwen_gguf)
    header_gguf(home / ".cache" / "llama.cpp" / "g2.gguf", "gemma2")
    assert models_tool.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["SOURCE", "NAME", "FAMILY", "PARAMS", "QUANT", "CONTEXT", "RUNS"]
    assert out[1].split()[:3] == ["ollama", "qwen2.5:0.5b", "qwen2"] and out[1].endswith("yes")
    assert out[2].split()[:3] == ["llama.cpp", "g2.gguf", "gemma2"] and out[2].endswith(
        "no: Gemma 2 needs logit soft-capping, which SpecLens does not implement yet")
    assert models_tool.main(["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["source"], r["name"], r["family"], r["quant"], r["runnable"]) for r in rows] == [
        ("ollama", "qwen2.5:0.5b", "qwen2", "Q8_0", True), ("llama.cpp", "g2.gguf", "gemma2", "Q8_0", False)]
    assert rows[0]["context"] == 128 and rows[0]["why_not"] is None and rows[1]["why_not"].startswith("Gemma 2 needs")


def test_nothing_found_says_where_it_looked(home, capsys):
    assert models_tool.main([]) == 0
    assert "no models found" in capsys.readouterr().out


def test_sizes_read_as_a_model_card_writes_them():
    assert [model_dirs.size_text(p) for p in (1.5, 0.27, 0.005, 2.08e-6, 0.0, None)] == [
        "1.50B", "0.27B", "5M", "2.1K", "?", "?"]

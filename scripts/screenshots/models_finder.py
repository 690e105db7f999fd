"""The model picker listing what LM Studio and Ollama keep, and Model > Find a draft's result (how
docs/images/model-picker.png and docs/images/draft-finder.png were made).

    Xvfb :98 -screen 0 1280x800x24 &
    DISPLAY=:98 python -m scripts.screenshots.models_finder [light|dark]

The run gets a HOME of its own (a temporary folder) holding the model stores another app would leave there, built
from the real GGUFs in the SpecLens cache by hard links (no copy of the gigabytes; a symlink where the cache is on
another disk):

- LM Studio, ~/.lmstudio/models/<publisher>/<repo>/<file>.gguf: the embedded Qwen2.5-Coder 0.5B draft's file and
  Gemma 3 270M's (its vocabulary is not Qwen's, so the finder turns it down with the first token that differs), and a
  stub GGUF of the Gemma 2 family written here (a few KB of random weights; SpecLens refuses Gemma 2 by name, for
  its logit soft-capping);
- Ollama, ~/.ollama/models: a manifest for qwen2.5-coder:0.5b whose model layer names the blob
  blobs/sha256-<the file's real SHA-256>, the 0.5B file again.

SPECLENS_CACHE keeps pointing at the real cache, so the embedded pair and the compiled kernels are found there and
nothing is downloaded or compiled. The picker's Target list is opened and the screen grabbed; then the embedded pair
is loaded and Model > Find a draft runs on it, shortened (16 new tokens a prompt, K = 2 and 4, an 840 s budget), until
it reports, and the screen is grabbed again. Its figures are 16 tokens a prompt: they show what the dialog reports (copies
measured once; a lead within the finder's noise said to be one), not how fast anything is.
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from scripts.screenshots import xvfb_window

LMSTUDIO_DRAFT = "lmstudio-community/Qwen2.5-Coder-0.5B-Instruct-GGUF/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"
LMSTUDIO_GEMMA = "lmstudio-community/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf"
LMSTUDIO_STUB = "speclens-demo/gemma-2-stub-GGUF/gemma-2-stub-F32.gguf"
OLLAMA_NAME, OLLAMA_TAG = "qwen2.5-coder", "0.5b"
FINDER_TOKENS = 16
FINDER_KS = [2, 4]
FINDER_BUDGET_S = 840.0


def _link(src: Path, dest: Path) -> None:
    """dest names src's bytes: a hard link (a separate path, as a second app's copy would be), else a symlink."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        print(f"hard link failed for {dest.name}; symlinked (the finder then counts it as the same file)", flush=True)
        dest.symlink_to(src)


def _sha256(path: Path, known: str | None) -> str:
    """The file's SHA-256: the one provision.py verified it against when it was assembled, else computed."""
    if known:
        return known
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _gemma2_stub(dest: Path) -> None:
    """A small but well-formed GGUF of the Gemma 2 family: listed with its facts, refused for its logit soft-capping."""
    import gguf
    import numpy as np

    dest.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    vocab, width = 64, 32
    w = gguf.GGUFWriter(str(dest), "gemma2")
    w.add_name("gemma-2-stub")
    w.add_block_count(1)
    w.add_context_length(8192)
    w.add_embedding_length(width)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_float32("gemma2.attn_logit_softcapping", 50.0)
    w.add_float32("gemma2.final_logit_softcapping", 30.0)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_tensor("token_embd.weight", rng.standard_normal((vocab, width), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(width, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_home(home: Path, cache: Path) -> None:
    """The other apps' model stores under home, from the real files in cache."""
    from engine.io import provision

    draft = provision.model_file(provision.DRAFT, cache)
    gemma = provision.model_file(provision.GEMMA3_270M, cache)
    for f in (draft, gemma, provision.model_file(provision.TARGET, cache)):
        if not f.is_file():
            raise SystemExit(f"{f} is missing: run the app (and the tests' Gemma install) once first")
    lms = home / ".lmstudio" / "models"
    _link(draft, lms / LMSTUDIO_DRAFT)
    _link(gemma, lms / LMSTUDIO_GEMMA)
    _gemma2_stub(lms / LMSTUDIO_STUB)
    ollama = home / ".ollama" / "models"
    digest = _sha256(draft, provision.DRAFT.sha256 if provision.is_trusted(draft, provision.DRAFT) else None)
    _link(draft, ollama / "blobs" / f"sha256-{digest}")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           "digest": "sha256:" + "0" * 64, "size": 487},
                "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
                            "size": draft.stat().st_size}]}
    path = ollama / "manifests" / "registry.ollama.ai" / "library" / OLLAMA_NAME / OLLAMA_TAG
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))


def main() -> int:
    from engine.paths import cache_root

    cache = cache_root().resolve()  # read before HOME moves: the real cache stays the cache
    home = Path(tempfile.mkdtemp(prefix="speclens-shots-home-"))
    try:
        build_home(home, cache)
        for key in ("OLLAMA_MODELS", "LLAMA_CACHE", "HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME",
                    "SPECLENS_OTHER_APPS"):
            os.environ.pop(key, None)
        os.environ.update(HOME=str(home), SPECLENS_CACHE=str(cache))  # the engine's process inherits both
        return shoot()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def shoot() -> int:
    qa, controller, w = xvfb_window.open_window()
    wait, wait_until = xvfb_window.wait, xvfb_window.wait_until
    from app.dialogs import draft_finder

    screen = qa.primaryScreen().availableGeometry()
    w.resize(min(1280, screen.width()), min(800, screen.height()))
    w.move(screen.topLeft())
    combo = w.controls.target_combo
    controller.scan_models()
    wait_until(lambda: combo.count() > 1, timeout=300)
    wait(1000)
    for i in range(combo.count()):
        print("picker:", combo.itemText(i), "" if combo.model().item(i).isEnabled() else "(greyed out)", flush=True)
    combo.showPopup()
    wait(800)
    popup = combo.view().window()
    print("popup", popup.frameGeometry().getRect(), "inside the screen:",
          screen.contains(popup.frameGeometry()), flush=True)
    qa.primaryScreen().grabWindow(0).save(os.environ.get("SHOT1", "docs/images/model-picker.png"))
    combo.hidePopup()
    wait(300)

    if not xvfb_window.load_pair(controller, w, timeout=1200, scan=False):
        return 1
    draft_finder.MAX_NEW_TOKENS = FINDER_TOKENS  # a short run: the dialog reads these when it opens
    draft_finder.TIME_BUDGET_S = FINDER_BUDGET_S
    finder = draft_finder.FINDER_FOR_WINDOW  # two K values instead of five: the same finder, fewer replays
    draft_finder.FINDER_FOR_WINDOW = type(finder)(finder.path, {**finder.kwargs, "ks": FINDER_KS}, finder.warm)
    t0 = time.time()
    w.menus.find_draft_action.trigger()
    dlg = w.draft_finder_dialog
    dlg.move(screen.x() + (screen.width() - dlg.width()) // 2, screen.y() + (screen.height() - dlg.height()) // 2)
    wait_until(lambda: not dlg.running, timeout=FINDER_BUDGET_S + 600)
    wait(1500)
    print(f"finder ended after {time.time() - t0:.0f}s:", dlg.status.text(), flush=True)
    for r in range(dlg.table.rowCount()):
        print("measured:", " | ".join(dlg.table.item(r, c).text() for c in range(dlg.table.columnCount())),
              flush=True)
    for r in range(dlg.rejected.rowCount()):
        print("turned down:", " | ".join(dlg.rejected.item(r, c).text() for c in range(dlg.rejected.columnCount())),
              flush=True)
    print("dialog", dlg.frameGeometry().getRect(), "inside the screen:", screen.contains(dlg.frameGeometry()),
          flush=True)
    qa.primaryScreen().grabWindow(0).save(os.environ.get("SHOT2", "docs/images/draft-finder.png"))
    dlg.close()
    w.close()
    controller.shutdown()
    return 0 if dlg.result is not None else 1


if __name__ == "__main__":  # the engine and finder processes are spawned: they must not run this again
    sys.exit(main())

"""The draft finder's candidates and its static checks: which local models may draft for a target, read from
their headers and tokenizers only, each one turned down with its reason, and which of them are one file found in
several places. The measuring is engine/tools/draft_finder.py.

A candidate must run here (its family), be smaller than the target, and speak the target's tokens: the same
vocabulary size, the same token at every id both name, and the same BOS and EOS.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.api.errors import ModelLoadError

if TYPE_CHECKING:
    from engine.io.hub import LocalModel

Cancelled = Callable[[], bool]

NGRAM = "n-gram (prompt lookup)"  # the no-model candidate's name


@dataclass(frozen=True)
class Candidate:
    """A possible draft: a local model, or the n-gram drafter (path None)."""

    name: str
    path: str | None
    source: str = ""  # where it was found: "embedded", "hf-cache", "lm-studio", ...; "" for the n-gram drafter
    family: str = ""
    params_b: float | None = None
    quant: str = ""

    @property
    def is_ngram(self) -> bool:
        return self.path is None

    @property
    def drafter(self) -> str:
        """SpecParams.drafter that runs it."""
        return "ngram" if self.is_ngram else "model"

    @staticmethod
    def of(m: LocalModel) -> Candidate:
        return Candidate(m.name, str(m.path), m.source, m.arch, m.params_b or None, m.quant)


NGRAM_CANDIDATE = Candidate(NGRAM, None, family="none (drafts from the conversation)")


@dataclass(frozen=True)
class Rejected:
    candidate: Candidate
    reason: str  # a sentence in the user's words


@dataclass(frozen=True)
class Copy:
    """A candidate whose file holds the same bytes as one that is measured (LM Studio and Ollama often keep the
    same download): measuring it again would only measure the noise."""

    candidate: Candidate
    same_as: Candidate

    @property
    def reason(self) -> str:
        from engine.io.model_dirs import SOURCE_NAMES

        source = SOURCE_NAMES.get(self.same_as.source, self.same_as.source)
        where = f" ({source})" if source else ""
        return f"the same file as {self.same_as.name}{where}: measured once, under that name"



@dataclass(frozen=True)
class Vocabulary:
    """A model's tokens by id (None where an id has no token) and its special ids, read without building a model."""

    tokens: tuple[str | None, ...]
    specials: dict[str, int]  # "bos", "eos": the ids both sides state are compared


def vocabulary(path: str | Path) -> Vocabulary:
    """A GGUF's token list from its header, or a folder's from its tokenizer."""
    p = Path(path)
    if p.is_file():
        from engine.io.gguf_file import GGUFFile

        meta = GGUFFile(p, check_data=False).metadata
        specials = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos")}
        return Vocabulary(tuple(meta.get("tokenizer.ggml.tokens") or ()),
                          {k: v for k, v in specials.items() if isinstance(v, int)})
    from engine.io.weights import load_tokenizer

    tok = load_tokenizer(p)
    by_token = tok.get_vocab()
    tokens: list[str | None] = [None] * (max(by_token.values(), default=-1) + 1)
    for t, i in by_token.items():
        tokens[i] = t
    specials = {k: getattr(tok, f"{k}_token_id", None) for k in ("bos", "eos")}
    return Vocabulary(tuple(tokens), {k: v for k, v in specials.items() if isinstance(v, int)})


def vocabulary_mismatch(target: Vocabulary, draft: Vocabulary) -> str | None:
    """Why the draft's tokens are not the target's (the first difference), or None. An id one side leaves empty
    (a folder's tokenizer lists no padding ids; a GGUF names them) is not a difference."""
    if not target.tokens or not draft.tokens:
        return "its vocabulary cannot be read from its files" if not draft.tokens else None
    for i, (a, b) in enumerate(zip(target.tokens, draft.tokens)):
        if a is not None and b is not None and a != b:
            return f"a different vocabulary: token {i} is {a!r} in the target and {b!r} in this model"
    for key in ("bos", "eos"):
        a, b = target.specials.get(key), draft.specials.get(key)
        if a is not None and b is not None and a != b:
            return f"a different {key.upper()} token: id {a} in the target, {b} in this model"
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def static_checks(target: LocalModel, models: Iterable[LocalModel],
                  vocab_of: Callable[[Path], Vocabulary] = vocabulary) -> tuple[list[Candidate], list[Rejected]]:
    """The candidates that may draft for target (smallest first), and every other model with why not."""
    ok: list[tuple[float, Candidate]] = []
    rejected: list[Rejected] = []
    target_vocab: Vocabulary | None = None
    seen: set[Path] = set()
    for m in models:
        cand = Candidate.of(m)
        key = Path(m.path).resolve() if Path(m.path).exists() else Path(m.path)
        if key in seen:
            continue
        seen.add(key)
        if _same_file(Path(m.path), Path(target.path)):
            continue  # the target itself: not a candidate at all
        if not m.runnable:
            rejected.append(Rejected(cand, f"SpecLens cannot run it: {m.why_not}"))
            continue
        if not m.params_b or not target.params_b:
            rejected.append(Rejected(cand, "its size is unknown, so it cannot be judged smaller than the target"))
            continue
        if m.params_b >= target.params_b:
            rejected.append(Rejected(cand, f"not smaller than the target ({m.params_b:g}B against "
                                           f"{target.params_b:g}B): a draft pays only when its steps are cheap"))
            continue
        if m.vocab_size != target.vocab_size:
            rejected.append(Rejected(cand, f"a different vocabulary size ({m.vocab_size} tokens, the target "
                                           f"{target.vocab_size}): SpecLens pairs models whose vocabularies match "
                                           "in size and in every token"))
            continue
        try:
            if target_vocab is None:
                target_vocab = vocab_of(Path(target.path))
            why = vocabulary_mismatch(target_vocab, vocab_of(Path(m.path)))
        except (ModelLoadError, OSError, ValueError, KeyError, TypeError) as e:
            why = f"its tokenizer cannot be read ({e})"
        if why is not None:
            rejected.append(Rejected(cand, why))
            continue
        ok.append((m.params_b, cand))
    return [c for _, c in sorted(ok, key=lambda pc: pc[0])], rejected


def _digest(path: Path, cancelled: Cancelled) -> str | None:
    """The file's SHA-256, or None when cancelled part way (a few GB at most: only files of equal size are read)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            if cancelled():
                return None
            h.update(chunk)
    return h.hexdigest()


def distinct_files(cands: list[Candidate], cancelled: Cancelled = lambda: False) -> tuple[list[Candidate],
                                                                                          list[Copy]]:
    """The candidates with each file's contents once (the first of each kept, in order), and the copies left out.
    Only files of the same size are hashed; a folder is always kept; a file that cannot be read is kept (its load
    will say why)."""
    by_size: dict[int, list[Candidate]] = {}
    for c in cands:
        if c.path is not None and Path(c.path).is_file():
            try:
                by_size.setdefault(Path(c.path).stat().st_size, []).append(c)
            except OSError:
                pass
    first: dict[tuple[int, str], Candidate] = {}
    copies: dict[Candidate, Candidate] = {}
    for size, group in by_size.items():
        for c in group if len(group) > 1 else ():
            try:
                digest = _digest(Path(c.path), cancelled)
            except OSError:
                continue
            if digest is None:
                return cands, []  # cancelled: the measuring stops before it starts anyway
            kept = first.setdefault((size, digest), c)
            if kept is not c:
                copies[c] = kept
    return [c for c in cands if c not in copies], [Copy(c, copies[c]) for c in cands if c in copies]


def describe_target(spec: str | Path | None) -> LocalModel:
    """The target as the listing describes it; None: the embedded pair's target. Refused when it cannot run."""
    from engine.io import hub, provision

    if spec is None:
        ps = provision.TARGET
        file = provision.model_file(ps)
        if not provision.is_trusted(file, ps):
            raise ModelLoadError("the embedded target is not installed yet: load the embedded pair once first")
        m = hub.describe(file, "embedded", ps.name)
    else:
        path = hub.resolve(str(spec))
        m = hub.describe(path, "target")
    if not m.runnable:
        raise ModelLoadError(f"the target {m.name} cannot run here: {m.why_not}")
    return m


def candidates_from(specs: Sequence[str]) -> tuple[list[LocalModel], list[Rejected]]:
    """The models the user named (paths or cached repo ids); one that cannot be read is rejected, saying why."""
    from engine.io import hub

    out, bad = [], []
    for spec in specs:
        try:
            path = hub.resolve(spec)
            out.append(hub.describe(path, "given"))
        except (ModelLoadError, OSError, ValueError, KeyError, TypeError) as e:
            bad.append(Rejected(Candidate(str(spec), str(spec), "given"), f"cannot be read: {e}"))
    return out, bad

"""Session statistics: RoundEvent / Summary -> rows -> CSV, plus the speedup arithmetic the charts show.

Pure Python: no Qt, no torch. The GUI records every round of every reply here and exports it on demand;
`docs/formats.md` documents the columns.
"""
from __future__ import annotations

import csv
import errno
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engine.analysis.sweep import SWEEP_COLUMNS
from engine.analysis.theory import expected_tokens, round_cost
from engine.api.config import SamplingParams, SpecParams
from engine.api.events import RoundEvent, Summary

ROUND_COLUMNS: tuple[str, ...] = (
    "chat", "message", "kind", "round", "mode", "drafter", "k", "temperature", "drafted", "accepted",
    "committed", "final_origin", "final_token_id", "final_token", "draft_ms", "verify_ms", "draft_prefill_ms",
    "tokens_per_s", "elapsed_s", "stop_reason",
)
SUMMARY_COLUMNS: tuple[str, ...] = (
    "chat", "message", "kind", "prompt", "mode", "drafter", "k_mean", "temperature", "prompt_tokens",
    "reused_prefix_tokens", "new_tokens", "rounds", "target_forwards", "drafted", "accepted", "acceptance_rate",
    "mean_tokens_per_round", "per_position_acceptance", "tokens_per_s", "ttft_s", "total_s", "draft_ms",
    "verify_ms", "draft_prefill_ms", "stop_reason", "target", "draft", "engine",
)


def round_tokens_per_s(event: RoundEvent) -> float:
    """Committed tokens over this round's own draft + verify time (0 when the round took no time)."""
    ms = event.draft_ms + event.verify_ms
    return len(event.committed) * 1000.0 / ms if ms > 0 else 0.0


@dataclass
class DrafterTotals:
    """Sums over speculative rounds that drafted anything: every drafter's together, and each drafter's own (under
    the hybrid drafter the draft model and the n-gram lookup take turns, at very different α and c)."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_ms: float = 0.0

    def add(self, event: RoundEvent) -> None:
        self.rounds += 1
        self.drafted += len(event.drafted)
        self.accepted += event.accepted
        self.draft_ms += event.draft_ms

    @property
    def alpha(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_k(self) -> float:
        """Tokens actually drafted per round (the n-gram drafter may propose fewer than K)."""
        return self.drafted / self.rounds if self.rounds else 0.0

    def cost_ratio(self, ref_ms: float) -> float:
        """c: ms per drafted token over ref_ms, one target step."""
        return self.draft_ms / self.drafted / ref_ms if self.drafted and ref_ms > 0 else 0.0


@dataclass
class WallTotals:
    """Rounds' wall time: the gaps between consecutive rounds' elapsed_s, so everything the user waited for is in,
    not only draft_ms and verify_ms (the draft model's catch-ups, sampling, rollback, the engine's own per-round work
    and passing the round on)."""

    rounds: int = 0
    committed: int = 0
    seconds: float = 0.0
    squares: float = 0.0  # sum of the rounds' seconds squared: their spread

    def add(self, event: RoundEvent, gap_s: float) -> None:
        self.rounds += 1
        self.committed += len(event.committed)
        self.seconds += gap_s
        self.squares += gap_s * gap_s

    @property
    def tokens_per_s(self) -> float | None:
        return self.committed / self.seconds if self.seconds > 0 and self.committed else None

    @property
    def relative_error(self) -> float | None:
        """The standard error of the mean round time over the mean (None under two rounds). For plain steps (one
        token each) it is how far the rate may be off from sampling alone: on a machine whose steps alternate between
        quick and preempted ones a few steps pin the rate down only loosely."""
        n = self.rounds
        if n < 2 or self.seconds <= 0:
            return None
        mean = self.seconds / n
        var = max(self.squares / n - mean * mean, 0.0) * n / (n - 1)
        return (var / n) ** 0.5 / mean


@dataclass
class SpeedTotals:
    """Running sums over rounds, split by mode; enough for alpha, c and both speedups."""

    spec_rounds: int = 0
    spec_committed: int = 0
    draft_ms: float = 0.0  # every speculative round's, also those whose lookup found nothing to draft
    spec_verify_ms: float = 0.0
    plain_committed: int = 0
    plain_ms: float = 0.0
    # One-row target passes: the verify pass of a round that drafted nothing (a plain step, or a lookup that found
    # nothing) is exactly one plain decoding step, timed in the same minutes as the rounds around it.
    step_passes: int = 0
    step_ms: float = 0.0
    drafting: DrafterTotals = field(default_factory=DrafterTotals)  # the rounds that drafted, all drafters
    by_drafter: dict[str, DrafterTotals] = field(default_factory=dict)  # "model" / "ngram", in first-seen order
    # The measured speedup's two sides, each in wall time. A request's first round is in neither: its gap holds the
    # prompt's prefills (the target's, and the draft model's lazy one), which no decoding rate counts. Nor is a plain
    # round that follows a speculative one: under a busy core that step ran faster than plain decoding does
    # (engine.api.live.PLAIN_RUN), so the plain side is the steps that follow a plain step.
    spec_wall: WallTotals = field(default_factory=WallTotals)
    plain_wall: WallTotals = field(default_factory=WallTotals)
    last_round: tuple[int, float, str] | None = None  # (round, elapsed_s, mode) of the round added last

    def add(self, event: RoundEvent) -> None:
        prev = self.last_round
        gap = self._gap(event)
        if gap is not None and event.mode == "speculative":
            self.spec_wall.add(event, gap)
        elif gap is not None and prev is not None and prev[2] == "plain":
            self.plain_wall.add(event, gap)
        if not event.drafted:
            self.step_passes += 1
            self.step_ms += event.verify_ms
        if event.mode == "speculative":
            if event.drafted:
                self.drafting.add(event)
                self.by_drafter.setdefault(event.drafter or "model", DrafterTotals()).add(event)
            self.spec_rounds += 1
            self.spec_committed += len(event.committed)
            self.draft_ms += event.draft_ms
            self.spec_verify_ms += event.verify_ms
        elif event.mode == "plain":
            self.plain_committed += len(event.committed)
            self.plain_ms += event.verify_ms + event.draft_ms

    def _gap(self, event: RoundEvent) -> float | None:
        """Seconds since the previous round of the same request ended; None for a request's first round (the
        prefills) or when the previous round of the request was not added here."""
        prev, self.last_round = self.last_round, (event.round, event.elapsed_s, event.mode)
        if event.round <= 1 or prev is None or prev[0] != event.round - 1 or event.elapsed_s < prev[1]:
            return None
        return event.elapsed_s - prev[1]

    @property
    def plain_ms_per_token(self) -> float | None:
        return self.plain_ms / self.plain_committed if self.plain_committed else None

    @property
    def step_ms_per_pass(self) -> float | None:
        """Mean ms of the one-row target passes added so far: what one plain decoding step cost in these rounds."""
        return self.step_ms / self.step_passes if self.step_passes else None

    def reference_ms(self, plain_ms_per_token: float | None = None) -> float:
        """One target step, in ms: the given plain rate, else these rounds' own one-row passes, else the mean
        verify pass of a speculative round (it stands in for one step); 0 before any of these."""
        ref = plain_ms_per_token or self.step_ms_per_pass
        if not ref and self.spec_verify_ms > 0:
            ref = self.spec_verify_ms / self.spec_rounds
        return ref or 0.0

    def cost_ratio(self, plain_ms_per_token: float | None = None) -> float:
        """c = mean draft ms per drafted token / one target step (reference_ms: a measured step when there is
        one, else the mean verify pass)."""
        if not self.drafting.drafted:
            return 0.0
        ref = self.reference_ms(plain_ms_per_token)
        return self.draft_ms / self.drafting.drafted / ref if ref > 0 else 0.0

    def measured_speedup(self) -> float | None:
        """Speculative over plain tokens/s, both in wall time from these rounds alone (spec_wall, plain_wall): the
        plain rate is that of the plain rounds among them, never one from other minutes. None before either side
        has a timed round (no estimate stands in)."""
        spec, plain = self.spec_wall.tokens_per_s, self.plain_wall.tokens_per_s
        if spec is None or plain is None:
            return None
        return spec / plain

    def theoretical_speedup(self, plain_ms_per_token: float | None = None) -> float | None:
        """Leviathan's speedup for the rounds that drafted. With more than one drafter (the hybrid) it is the
        mix of their rounds: tokens per round over cost per round, each drafter at its own α, K and c; for one
        drafter that is exactly Leviathan's formula."""
        if not self.drafting.rounds:
            return None
        ref = self.reference_ms(plain_ms_per_token)
        tokens = cost = 0.0
        for d in self.by_drafter.values():
            tokens += d.rounds * expected_tokens(d.alpha, d.mean_k)
            cost += d.rounds * round_cost(d.mean_k, d.cost_ratio(ref))
        return tokens / cost


@dataclass
class MessageRecord:
    """One assistant reply: its rounds and, once finished, its Summary."""

    chat: int
    message: int
    kind: str  # "chat", "compare-plain", "compare-speculative"
    prompt: str
    rounds: list[RoundEvent] = field(default_factory=list)
    summary: Summary | None = None
    # The request as sent, for session traces (app/trace.py): messages (system prompt included), the settings it
    # started with (live changes show in its rounds) and the models that ran it.
    messages: list[dict[str, str]] = field(default_factory=list)
    sampling: SamplingParams | None = None
    spec: SpecParams | None = None
    target: str | None = None
    draft: str | None = None
    engine: str | None = None  # where it ran: the device, or an attached server's kind, version and URL (no key)


def round_row(record: MessageRecord, event: RoundEvent) -> dict[str, object]:
    final = event.correction
    return {
        "chat": record.chat,
        "message": record.message,
        "kind": record.kind,
        "round": event.round,
        "mode": event.mode,
        "drafter": event.drafter or "",
        "k": event.k,
        "temperature": event.temperature,
        "drafted": len(event.drafted),
        "accepted": event.accepted,
        "committed": len(event.committed),
        "final_origin": final.origin.value if final else "",
        "final_token_id": final.token_id if final else "",
        "final_token": final.text if final else "",
        "draft_ms": round(event.draft_ms, 3),
        "verify_ms": round(event.verify_ms, 3),
        "draft_prefill_ms": round(event.draft_prefill_ms, 3),
        "tokens_per_s": round(round_tokens_per_s(event), 2),
        "elapsed_s": round(event.elapsed_s, 4),
        "stop_reason": event.stop_reason or "",
    }


def _joined(values: Iterable[object]) -> str:
    distinct: list[str] = []
    for v in values:
        s = str(v)
        if s not in distinct:
            distinct.append(s)
    return "+".join(distinct)


def summary_row(record: MessageRecord) -> dict[str, object]:
    s, rounds = record.summary, record.rounds
    row: dict[str, object] = {
        "chat": record.chat,
        "message": record.message,
        "kind": record.kind,
        "prompt": record.prompt,
        "mode": _joined(r.mode for r in rounds),
        # in one fixed order, so a reply of both drafters (the hybrid) has one name whichever drafted first
        "drafter": _joined(sorted({r.drafter for r in rounds if r.drafter})),
        "k_mean": round(sum(r.k for r in rounds) / len(rounds), 3) if rounds else "",
        "temperature": _joined(r.temperature for r in rounds),
        "target": record.target or "", "draft": record.draft or "", "engine": record.engine or "",
    }
    if s is None:  # the reply never finished (an engine error): what the rounds tell
        row.update(new_tokens=sum(len(r.committed) for r in rounds), rounds=len(rounds),
                   drafted=sum(len(r.drafted) for r in rounds), accepted=sum(r.accepted for r in rounds),
                   stop_reason="error")
        return {c: row.get(c, "") for c in SUMMARY_COLUMNS}
    row.update(
        prompt_tokens=s.prompt_tokens,
        reused_prefix_tokens=s.reused_prefix_tokens,
        new_tokens=s.new_tokens,
        rounds=s.rounds,
        target_forwards=s.target_forwards,
        drafted=s.drafted,
        accepted=s.accepted,
        acceptance_rate=round(s.acceptance_rate, 4),
        mean_tokens_per_round=round(s.mean_tokens_per_round, 4),
        per_position_acceptance=";".join(f"{a:.3f}" for a in s.per_position_acceptance),
        tokens_per_s=round(s.tokens_per_s, 2),
        ttft_s=round(s.ttft_s, 4),
        total_s=round(s.total_s, 4),
        draft_ms=round(s.draft_ms, 3),
        verify_ms=round(s.verify_ms, 3),
        draft_prefill_ms=round(s.draft_prefill_ms, 3),
        stop_reason=s.stop_reason,
    )
    return row


def summary_path(path: str | Path) -> Path:
    """`stats.csv` -> `stats_summary.csv`, beside it."""
    p = Path(path)
    return p.with_name(f"{p.stem}_summary{p.suffix or '.csv'}")


def tuner_path(path: str | Path) -> Path:
    """`stats.csv` -> `stats_tuner.csv` (the K tuner's sweeps), beside it."""
    p = Path(path)
    return p.with_name(f"{p.stem}_tuner{p.suffix or '.csv'}")


class SessionStats:
    """Every reply of the app session, in order. `chat` counts conversations (New chat starts the next),
    `message` counts replies across the whole session."""

    def __init__(self) -> None:
        self.records: list[MessageRecord] = []
        self.chat = 1
        self.sweeps: list = []  # engine.analysis.sweep.Sweep, one per completed Run > Tune K

    def new_chat(self) -> None:
        if any(r.chat == self.chat for r in self.records):
            self.chat += 1

    def begin(self, prompt: str, kind: str = "chat") -> MessageRecord:
        record = MessageRecord(self.chat, len(self.records) + 1, kind, prompt)
        self.records.append(record)
        return record

    def __len__(self) -> int:
        return len(self.records)

    def round_rows(self) -> list[dict[str, object]]:
        return [round_row(rec, ev) for rec in self.records for ev in rec.rounds]

    def summary_rows(self) -> list[dict[str, object]]:
        return [summary_row(rec) for rec in self.records]

    def totals(self) -> SpeedTotals:
        t = SpeedTotals()
        for rec in self.records:
            for ev in rec.rounds:
                t.add(ev)
        return t

    def write_csv(self, path: str | Path) -> tuple[Path, Path]:
        """Rounds to `path`, per-message summaries to `<name>_summary.csv`, and the K tuner's sweeps (when there
        are any) to `<name>_tuner.csv`. All or nothing: every file is written to a temporary beside it and renamed
        into place only once all are written, and a rename that fails puts back those made before it, so a
        failure (a full disk, a folder with one of the names) leaves an earlier export whole. Raises OSError."""
        main, side = Path(path), summary_path(path)
        files = [(main, ROUND_COLUMNS, self.round_rows()), (side, SUMMARY_COLUMNS, self.summary_rows())]
        if self.sweeps:
            rows = [row for i, sweep in enumerate(self.sweeps, 1) for row in sweep.rows(i)]
            files.append((tuner_path(path), SWEEP_COLUMNS, rows))
        for dest, _, _ in files:  # what no rename can replace, found before anything is renamed
            if dest.is_dir():
                raise IsADirectoryError(errno.EISDIR, "a folder has the name the export needs", str(dest))
        written: list[tuple[Path, Path]] = []
        try:
            for dest, columns, rows in files:
                written.append((_write_temporary(dest, columns, rows), dest))
            _replace_together(written)
        finally:
            for tmp, _ in written:
                tmp.unlink(missing_ok=True)
        return main, side


def _replace_together(pairs: list[tuple[Path, Path]]) -> None:
    """Rename each temporary onto its destination, all or none: every file replaced so far is put back (from a
    hard link kept beside it, or a copy where links are not supported) when a later rename fails."""
    done: list[tuple[Path, Path | None]] = []  # (destination, its earlier content; None: there was none)
    try:
        for tmp, dest in pairs:
            backup = _keep(dest)
            try:
                os.replace(tmp, dest)
            except BaseException:
                if backup is not None:
                    backup.unlink(missing_ok=True)
                raise
            done.append((dest, backup))
    except BaseException:
        for dest, backup in reversed(done):
            try:
                if backup is None:
                    dest.unlink(missing_ok=True)
                else:
                    os.replace(backup, dest)
            except OSError:  # put back what can be; the first error is the one to report
                pass
        raise
    finally:
        for _, backup in done:
            if backup is not None:
                backup.unlink(missing_ok=True)


def _keep(dest: Path) -> Path | None:
    """A second name for dest's current content, beside it (None when dest does not exist)."""
    if not dest.exists():
        return None
    backup = dest.with_name(f".{dest.name}.{secrets.token_hex(6)}.bak")
    try:
        os.link(dest, backup)
    except OSError:  # a file system without hard links (FAT, some network shares): a copy then
        shutil.copy2(dest, backup)
    return backup


def _write_temporary(dest: Path, columns: tuple[str, ...], rows: list[dict[str, object]]) -> Path:
    """The rows as CSV in a new file beside `dest`, with the permissions a plain open() would have given."""
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(name)
    try:
        # errors="replace": text the app accepted may still hold a lone surrogate (from a trace, a paste); one
        # "?" in a cell beats an export that cannot be written.
        with os.fdopen(fd, "w", newline="", encoding="utf-8", errors="replace") as f:
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            w.writerows(rows)
        os.chmod(tmp, file_mode(dest))  # mkstemp makes it private; an export is made to be shared
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def file_mode(path: Path) -> int:
    """An existing file's permissions, else what a plain open() would give (0o666 less the umask)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask

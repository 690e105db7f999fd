"""Run › Tune K: replay the last prompt with plain decoding, then at K = 1..8 with the draft model and with the
n-gram drafter, one request after another in the engine process, with the same seed and settings.

Every replay starts from an empty cache (as speclens-bench does), so each is the run a separate benchmark would
make, whatever ran before it. The replays go into the session stats as kind "tune", and a completed sweep into
`SessionStats.sweeps` (the CSV export writes it to NAME_tuner.csv). `KTuner` only orchestrates; the arithmetic
is engine/analysis/sweep.py, the dialog app/dialogs/tuner_dialog.py.
"""
from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QObject, Signal

from engine.analysis.sweep import KS, Sweep, SweepRun, plan, run_of
from engine.api.config import SamplingParams, SpecParams
from engine.api.events import PrefillProgress, RoundEvent, Summary

from app.session.names import drafter_name

KIND = "tune"


class KTuner(QObject):
    """One sweep. Signals (GUI thread): progressed(float done, int total, str label) with done counting finished
    replays plus the running one's share of its token budget, and the label saying how far a long prompt has been
    read while the replay reads it (each replay starts from an empty cache, so each reads the whole prompt); runDone(SweepRun); finished(Sweep, bool complete),
    once, after the last replay, a cancel or a failure (`error` then says why)."""

    progressed = Signal(float, int, str)
    runDone = Signal(object)
    finished = Signal(object, bool)

    def __init__(self, controller, messages: list[dict[str, str]], sampling: SamplingParams, spec: SpecParams,
                 has_draft_model: bool, ks: Sequence[int] = KS, parent: QObject | None = None) -> None:
        super().__init__(parent)
        if sampling.seed is None:
            raise ValueError("the tuner replays with one fixed seed; give SamplingParams a seed")
        self.controller = controller
        self.messages, self.sampling, self.spec = messages, sampling, spec
        self.plan = plan(has_draft_model, ks)
        self.runs: list[SweepRun] = []
        self.error: str | None = None
        self.cancelled = False
        self.started = self.done = False
        self._rid: int | None = None
        self._summary: Summary | None = None
        self._rounds: list[RoundEvent] = []
        self._message = 0

    @property
    def running(self) -> bool:
        return self.started and not self.done

    def spec_for(self, drafter: str | None, k: int) -> SpecParams:
        """Fixed K, as Leviathan's curve beside it assumes: no adaptive K, no early stop."""
        if drafter is None:
            return self.spec.with_(enabled=False, adaptive=False, stop_below=0.0)
        return self.spec.with_(enabled=True, drafter=drafter, k=k, adaptive=False, k_max=max(self.spec.k_max, k),
                               stop_below=0.0)

    def start(self) -> None:
        self.started = True
        self._next()

    def cancel(self) -> None:
        """Stop the sweep: the running replay stops after its current round (or the current chunk of its prompt),
        and no other starts."""
        if self.done:
            return
        self.cancelled = True
        if self._rid is not None:
            self.controller.cancel(self._rid)
        else:
            self._finish()

    def _next(self) -> None:
        if self.cancelled or self.error is not None or len(self.runs) == len(self.plan):
            self._finish()
            return
        drafter, k = self.plan[len(self.runs)]
        self.progressed.emit(float(len(self.runs)), len(self.plan), self._label())
        self._summary, self._rounds = None, []
        self.controller.forget_cache()  # an empty cache, as a separate benchmark run starts with
        req = self.controller.submit(self.messages, self.sampling, self.spec_for(drafter, k), KIND)
        self._rid, self._message = req.id, req.record.message
        req.handle.prefill.connect(self._on_prefill)
        req.handle.rounds.connect(self._on_rounds)
        req.handle.summary.connect(self._on_summary)
        req.handle.errored.connect(self._on_failed)
        req.handle.finished.connect(self._on_finished)

    def _label(self) -> str:
        drafter, k = self.plan[len(self.runs)]
        return "plain decoding" if drafter is None else f"{drafter_name(drafter)} K={k}"

    def _on_prefill(self, p: PrefillProgress) -> None:
        if self.cancelled or p.done >= p.total:
            return  # the rounds' progress follows at once
        who = "reading the prompt" if p.model == "target" else "the draft model reading the prompt"
        self.progressed.emit(float(len(self.runs)), len(self.plan),
                             f"{self._label()}, {who} ({p.done:,} of {p.total:,} tokens)")

    def _on_rounds(self, events: list[RoundEvent]) -> None:
        if not events:
            return
        self._rounds.extend(events)
        share = min(1.0, events[-1].new_tokens / self.sampling.max_new_tokens)
        self.progressed.emit(len(self.runs) + share, len(self.plan), self._label())

    def _on_summary(self, s: Summary) -> None:
        self._summary = s

    def _on_failed(self, message: str) -> None:
        self.error = message

    def _on_finished(self) -> None:
        self._rid = None
        s = self._summary
        if s is not None and s.stop_reason != "cancelled" and not self.cancelled:
            drafter, k = self.plan[len(self.runs)]
            run = run_of(drafter, k, s, self._rounds, self._message)
            self.runs.append(run)
            self.runDone.emit(run)
        elif s is None and self.error is None and not self.cancelled:
            self.error = "the replay ended without a result"
        self._next()

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        sweep = Sweep(tuple(self.runs))
        complete = len(self.runs) == len(self.plan)
        if complete:
            self.controller.stats.sweeps.append(sweep)
        self.progressed.emit(float(len(self.runs)), len(self.plan), "done" if complete else "stopped")
        self.finished.emit(sweep, complete)

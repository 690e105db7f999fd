"""A request's running sums over its rounds, and the Summary they make. Torch-free: the app's scripted test engine
accounts its rounds with the same object."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.api.events import RoundEvent, Summary


@dataclass
class RoundTally:
    prompt_tokens: int
    reused_prefix_tokens: int = 0
    prefill_s: float = 0.0  # the target's prefill of the uncached prompt suffix
    prefilled: bool = True  # the prompt needed a target pass of its own (counted in target_forwards)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    draft_prefill_ms: float = 0.0  # every catch-up of the draft model
    prompt_draft_prefill_ms: float = 0.0  # its first: reading the prompt (lazy, inside the first round it drafts)
    ttft_s: float | None = None
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    pos_drafted: list[int] = field(default_factory=list)  # [i]: rounds that drafted a token at position i
    pos_accepted: list[int] = field(default_factory=list)

    def add(self, event: RoundEvent, ready_s: float) -> None:
        """ready_s: seconds from the request's start until this round's tokens were decided."""
        self.rounds += 1
        if self.ttft_s is None:
            self.ttft_s = ready_s
        for i, d in enumerate(event.drafted):
            if i == len(self.pos_drafted):
                self.pos_drafted.append(0)
                self.pos_accepted.append(0)
            self.pos_drafted[i] += 1
            self.pos_accepted[i] += d.accepted
        self.drafted += len(event.drafted)
        self.accepted += event.accepted
        self.draft_ms += event.draft_ms
        self.verify_ms += event.verify_ms
        if event.draft_prefill_ms > 0 and self.draft_prefill_ms == 0:
            self.prompt_draft_prefill_ms = event.draft_prefill_ms
        self.draft_prefill_ms += event.draft_prefill_ms
        self.token_ids += [c.token_id for c in event.committed]
        self.text.append(event.text_delta)

    def summary(self, total_s: float, stop_reason: str, tail: str = "") -> Summary:
        """tail: text released at a cancel that no RoundEvent carried."""
        new = len(self.token_ids)
        # The decode rate: both prompt prefills left out (the draft's is its first catch-up, lazy, inside the first
        # round it drafts), as the bench, the K tuner, Spec-Bench's decode_seconds and llama.cpp's figures leave
        # them out; one definition wherever a rate is shown or written. Every later catch-up (text a plain round or
        # the n-gram lookup committed, read into the draft model) is paid while decoding and stays in.
        decode_s = total_s - self.prefill_s - self.prompt_draft_prefill_ms / 1e3
        return Summary(
            new_tokens=new, rounds=self.rounds, target_forwards=self.rounds + self.prefilled, drafted=self.drafted,
            accepted=self.accepted, acceptance_rate=self.accepted / self.drafted if self.drafted else 0.0,
            mean_tokens_per_round=new / self.rounds if self.rounds else 0.0,
            per_position_acceptance=tuple(a / d for a, d in zip(self.pos_accepted, self.pos_drafted)),
            tokens_per_s=new / decode_s if decode_s > 0 else 0.0,
            ttft_s=self.ttft_s if self.ttft_s is not None else total_s, total_s=total_s,
            prompt_tokens=self.prompt_tokens, reused_prefix_tokens=self.reused_prefix_tokens,
            draft_ms=self.draft_ms, verify_ms=self.verify_ms, stop_reason=stop_reason,
            text="".join(self.text) + tail, token_ids=tuple(self.token_ids), prefill_s=self.prefill_s,
            draft_prefill_ms=self.draft_prefill_ms, text_tail=tail,
        )

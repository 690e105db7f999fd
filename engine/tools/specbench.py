"""Spec-Bench (Xia et al., ACL Findings 2024) for speclens-bench: its questions, and its per-category figures.

Spec-Bench's own `question.jsonl` has one question a line: {"question_id", "category", "turns": [str, ...]}; a
question of several turns is a conversation in which each turn follows the model's own answer to the one before.
This project's prompt files ({"id", "kind", "messages"}) read as questions too: their messages are one fixed
conversation, asked once, and `kind` is the category. Both come out as `Question`s.

The figures are Spec-Bench's and vLLM's: per category and overall, the decode rate, the speedup over plain decoding
in the same run, the mean accepted length (tokens committed per target pass, the bonus or correction included),
the acceptance rate (accepted / drafted) and the acceptance per draft position (as llama.cpp's /metrics and vLLM's
per-position counters define it: of the rounds that drafted position i, the share in which it was accepted).
"""
from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engine.api.events import RoundEvent, Summary

MAX_TURNS = 16  # Spec-Bench's questions have one or two; more is a malformed file, not a benchmark
ROLES = ("system", "user", "assistant")
# Spec-Bench's file keeps MT-bench's own eight categories on its first 80 questions, and its leaderboard reports them
# as one task kind, "Multi-turn Conversation": so does this bench, under the name this project's prompt files use.
MT_BENCH = "mt-bench"
MT_BENCH_CATEGORIES = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                 "humanities"})


@dataclass(frozen=True)
class Question:
    id: str
    category: str
    turns: tuple[str, ...] = ()  # user turns, each asked after the model's own answer to the previous one
    messages: tuple[dict[str, str], ...] = ()  # or one fixed conversation (this project's prompt files)

    def __post_init__(self) -> None:
        if bool(self.turns) == bool(self.messages):
            raise ValueError("a question has either turns or messages")


def question(row: object) -> Question:
    """One line of either format, checked (ValueError says what is wrong)."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got a {type(row).__name__}")
    if "turns" in row:  # Spec-Bench's own format
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise ValueError("'turns' must be a non-empty list of non-empty strings")
        if len(turns) > MAX_TURNS:
            raise ValueError(f"{len(turns)} turns; at most {MAX_TURNS}")
        category = row.get("category")
        if not isinstance(category, str) or not category:
            raise ValueError("needs a 'category' string")
        qid = row.get("question_id", row.get("id"))
        if not isinstance(qid, (str, int)) or isinstance(qid, bool):
            raise ValueError("needs a 'question_id'")
        return Question(str(qid), MT_BENCH if category in MT_BENCH_CATEGORIES else category, turns=tuple(turns))
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("needs 'turns' (Spec-Bench) or a non-empty 'messages' list")
    for i, m in enumerate(messages, 1):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise ValueError(f"message {i} must be {{'role': one of {', '.join(ROLES)}, 'content': str}}")
    kind = row.get("kind", row.get("category", "all"))
    return Question(str(row.get("id", "")), str(kind) if kind else "all",
                    messages=tuple({"role": m["role"], "content": m["content"]} for m in messages))


def read_questions(path: str | Path) -> list[Question]:
    """Every question of a JSONL file in either format; a bad line is named by its number."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(question(json.loads(line)))
        except (json.JSONDecodeError, ValueError) as e:
            raise ValueError(f"{path}, line {n}: {e}") from None
    if not out:
        raise ValueError(f"{path} holds no question")
    return out


def per_category(questions: list[Question], n: int) -> list[Question]:
    """At most `n` questions of each category, evenly spaced through its questions in the file's order (the j-th of
    n at j * count / n), the file's order kept. Spec-Bench's 80 a kind take a CPU most of a day in every mode; spaced
    picks reach across a kind that the file keeps in blocks (MT-bench's eight sub-categories, ten each)."""
    if n < 1:
        raise ValueError(f"at least one question a category, got {n}")
    by_category: dict[str, list[int]] = {}
    for i, q in enumerate(questions):
        by_category.setdefault(q.category, []).append(i)
    keep: set[int] = set()
    for idx in by_category.values():
        m = min(n, len(idx))
        keep.update(idx[j * len(idx) // m] for j in range(m))
    return [q for i, q in enumerate(questions) if i in keep]


def decode_seconds(events: Iterable[RoundEvent], summary: Summary) -> float:
    """A reply's decoding time: its wall time less the prompt's prefills, the target's and the draft model's. The
    draft model's prompt prefill is its first catch-up of the reply (lazy, inside the first round it drafts); every
    later catch-up (text another drafter's rounds committed) is paid to decode and stays in."""
    prompt_draft_ms = next((e.draft_prefill_ms for e in events if e.draft_prefill_ms > 0), 0.0)
    return summary.total_s - summary.prefill_s - prompt_draft_ms / 1e3


def top_up(questions: list[Question], repeats: int, counted: dict[str, Tally], min_tokens: int,
           max_repeats: int) -> list[Question]:
    """The questions to ask again so that every category's replies hold at least `min_tokens` new tokens (`counted`:
    one mode's tallies after `repeats` passes; under greedy decoding every mode's are the same tokens), at most
    `max_repeats` passes in all. Spec-Bench's categories differ in reply length (a translation answers in a few
    tokens, a summary in many), so equal repeats leave the short kinds a few seconds of decoding, whose rates
    scatter by several percent from scheduling alone."""
    extra: list[Question] = []
    for category, tally in sorted(counted.items()):
        if tally.new_tokens >= min_tokens or tally.new_tokens <= 0:
            continue
        more = math.ceil((min_tokens - tally.new_tokens) / (tally.new_tokens / repeats))
        extra += [q for q in questions if q.category == category] * max(min(more, max_repeats - repeats), 0)
    return extra


@dataclass
class Tally:
    """One mode's counts over some replies (a category, or all)."""

    new_tokens: int = 0
    replies: int = 0
    decode_s: float = 0.0
    rounds: int = 0  # target passes after the prompt's prefill: one a round
    drafted: int = 0
    accepted: int = 0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    # each reply's (new tokens, decode seconds), in the order asked: every mode asks the same questions in the same
    # order, so the i-th of two modes' is the same reply (greedy: the same tokens), timed in the same seconds when
    # the modes take turns round by round (engine.tools.in_step)
    per_reply: list[tuple[int, float]] = field(default_factory=list)

    def add(self, events: Iterable[RoundEvent], summary: Summary) -> None:
        events = list(events)
        seconds = decode_seconds(events, summary)
        self.new_tokens += summary.new_tokens
        self.replies += 1
        self.decode_s += seconds
        self.per_reply.append((summary.new_tokens, seconds))
        for e in events:
            self.add_round(e)

    def add_round(self, e: RoundEvent) -> None:
        self.rounds += 1
        self.drafted += len(e.drafted)
        self.accepted += sum(d.accepted for d in e.drafted)
        for i, d in enumerate(e.drafted):
            if i == len(self.position_drafted):
                self.position_drafted.append(0)
                self.position_accepted.append(0)
            self.position_drafted[i] += 1
            self.position_accepted[i] += d.accepted

    def merge(self, other: Tally) -> None:
        self.new_tokens += other.new_tokens
        self.replies += other.replies
        self.decode_s += other.decode_s
        self.rounds += other.rounds
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.per_reply += other.per_reply
        for i, (d, a) in enumerate(zip(other.position_drafted, other.position_accepted)):
            if i == len(self.position_drafted):
                self.position_drafted.append(0)
                self.position_accepted.append(0)
            self.position_drafted[i] += d
            self.position_accepted[i] += a

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per target pass (Spec-Bench's τ): 1 for plain decoding."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def per_position(self) -> list[float]:
        return [a / d for a, d in zip(self.position_accepted, self.position_drafted)]

    def figures(self, plain: Tally | None) -> dict[str, object]:
        speedup = self.tokens_per_s / plain.tokens_per_s if plain is not None and plain.tokens_per_s > 0 else None
        return {"tokens_per_s": round(self.tokens_per_s, 3), "speedup": None if speedup is None else round(speedup, 4),
                "mean_accepted_length": round(self.mean_accepted_length, 4),
                "acceptance_rate": None if self.acceptance_rate is None else round(self.acceptance_rate, 4),
                "acceptance_per_position": [round(x, 4) for x in self.per_position],
                "new_tokens": self.new_tokens, "replies": self.replies, "rounds": self.rounds, "drafted": self.drafted,
                "accepted": self.accepted}


INTERVAL = (0.05, 0.95)  # the bootstrap interval's quantiles
DRAWS = 2000  # bootstrap resamples: the interval's ends then move by < 0.005 between seeds
SPLITS = 200  # held_out's random halvings of a category's replies (each gives two folds)


def interval(ratio: float, drawn: list[float]) -> dict[str, float]:
    """A ratio on the whole run and the INTERVAL quantiles of its bootstrap draws (paired_ratio's two parts)."""
    drawn = sorted(drawn)
    lo, hi = (drawn[min(int(q * len(drawn)), len(drawn) - 1)] for q in INTERVAL)
    return {"ratio": round(ratio, 4), "low": round(lo, 4), "high": round(hi, 4)}


def paired_ratio(a: Tally, b: Tally, draws: int = DRAWS, seed: int = 0) -> tuple[float, list[float]] | None:
    """a's rate over b's on the same replies (the i-th of each is the same reply, timed in one turn), and that
    ratio in `draws` bootstrap resamples of the replies taken in pairs; None where their replies differ in number or
    a rate is 0."""
    n = len(a.per_reply)
    if n == 0 or n != len(b.per_reply):
        return None

    def ratio(picks: Iterable[int]) -> float | None:
        at = bt = an = bn = 0.0
        for i in picks:
            an, at = an + a.per_reply[i][0], at + a.per_reply[i][1]
            bn, bt = bn + b.per_reply[i][0], bt + b.per_reply[i][1]
        return (an / at) / (bn / bt) if min(an, at, bn, bt) > 0 else None

    whole = ratio(range(n))
    if whole is None:
        return None
    rng = random.Random(seed)
    return whole, [r for _ in range(draws) if (r := ratio([rng.randrange(n) for _ in range(n)])) is not None]


def versus_best(tallies: dict[str, dict[str, Tally]], mode: str, plain: str, draws: int = DRAWS,
                seed: int = 0) -> dict[str, dict[str, object]]:
    """Per category (and "geomean", over the categories' speedups over `plain`), `mode`'s rate over that of the
    fastest other mode in the run, with a 90% bootstrap interval of that ratio (and, per category, over plain's as
    "plain": {ratio, low, high}, the issue's other bar, and the ratio to a fastest mode picked on other replies as
    "held_out"): the replies are resampled with
    replacement, the i-th of both modes together (the same question, timed in one turn of the modes), so that what
    slowed both alike cancels and what slowed one does not. The fastest mode is picked on the whole run: where two
    modes are close, the faster of the two noisy columns runs ahead of its true speed, which the interval of one
    pair does not cover. tallies: mode -> category -> Tally; a category whose modes hold different replies is left
    out."""
    others = [m for m in tallies if m not in (mode, plain)]
    if mode not in tallies or not others:
        return {}
    cats = [c for c in sorted(tallies[mode]) if all(c in t for t in tallies.values())
            and len({len(t[c].per_reply) for t in tallies.values()}) == 1 and tallies[mode][c].per_reply]

    out: dict[str, dict[str, object]] = {}
    for c in cats:
        best = max(others, key=lambda m: tallies[m][c].tokens_per_s)
        if (paired := paired_ratio(tallies[mode][c], tallies[best][c], draws, seed)) is not None:
            out[c] = {"best": best, **interval(*paired)}
            if plain in tallies and (alone := paired_ratio(tallies[mode][c], tallies[plain][c], draws, seed)):
                out[c]["plain"] = interval(*alone)
            if (fair := held_out(tallies[mode][c], {m: tallies[m][c] for m in others}, seed=seed)) is not None:
                out[c]["held_out"] = round(fair, 4)
    if cats and plain in tallies and (g := _geomean_ratio(tallies, cats, mode, plain, others, draws, seed)):
        out["geomean"] = g
    return out


def _rate(t: Tally, picks: Iterable[int]) -> float:
    """Tokens over decode seconds of the picked replies (an index may repeat: a bootstrap draw)."""
    picks = list(picks)
    seconds = sum(t.per_reply[i][1] for i in picks)
    return sum(t.per_reply[i][0] for i in picks) / seconds if seconds > 0 else 0.0


def held_out(tally: Tally, others: dict[str, Tally], splits: int = SPLITS, seed: int = 0) -> float | None:
    """`tally`'s rate over that of the fastest of `others`, that mode picked on one half of the replies and timed on
    the other: the geometric mean over `splits` random halvings, each half picking for the other. Picked and timed on
    the same replies (versus_best's "ratio") the fastest of several close columns is partly the luckiest, and the
    ratio reads low by that luck; picked on replies it is not timed on, a mode's luck does not follow it, so this is
    what a user who chose the fastest fixed mode from one run would see in the next. None with fewer than two
    replies, replies that differ in number, or a rate of 0."""
    n = len(tally.per_reply)
    if n < 2 or not others or any(len(t.per_reply) != n for t in others.values()):
        return None

    rng = random.Random(seed)
    logs = []
    for _ in range(splits):
        order = rng.sample(range(n), n)
        halves = (order[: n // 2], order[n // 2 :])
        for pick, timed in (halves, halves[::-1]):
            best = max(others.values(), key=lambda t: _rate(t, pick))
            a, b = _rate(tally, timed), _rate(best, timed)
            if a <= 0 or b <= 0:
                return None
            logs.append(math.log(a / b))
    return math.exp(sum(logs) / len(logs))


def _geomean_ratio(tallies: dict[str, dict[str, Tally]], cats: list[str], mode: str, plain: str, others: list[str],
                   draws: int, seed: int) -> dict[str, object] | None:
    """versus_best's "geomean": the categories' speedups over plain, each category resampled in pairs as above."""
    def speedup(m: str, picks: dict[str, list[int]]) -> float | None:
        pairs = [(_rate(tallies[m][c], p), _rate(tallies[plain][c], p)) for c, p in picks.items()]
        if any(x <= 0 or y <= 0 for x, y in pairs):
            return None
        return math.exp(sum(math.log(x / y) for x, y in pairs) / len(pairs))

    every = {c: list(range(len(tallies[mode][c].per_reply))) for c in cats}
    full = {m: speedup(m, every) for m in [mode, *others]}
    if any(v is None for v in full.values()):
        return None
    best = max(others, key=lambda m: full[m])
    rng = random.Random(seed)
    drawn = []
    for _ in range(draws):
        picks = {c: [rng.randrange(len(p)) for _ in p] for c, p in every.items()}
        if (x := speedup(mode, picks)) and (y := speedup(best, picks)):
            drawn.append(x / y)
    return {"best": best, **interval(full[mode] / full[best], drawn)} if drawn else None

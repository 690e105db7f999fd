"""engine.tools.in_step: lanes take rounds in turns by the time each has spent, and each request is timed by its own
rounds only. Unit tests on a scripted clock; the last test runs real engine twins."""
import pytest

from engine.api.events import RoundEvent, Summary
from engine.tools import in_step
from engine.tools.in_step import own_time, run_in_step


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _round(n: int) -> RoundEvent:
    return RoundEvent(round=n, mode="speculative", drafter="model", k=1, temperature=0.0, drafted=(), committed=(),
                      text_delta="", draft_ms=0.0, verify_ms=0.0, elapsed_s=0.0, new_tokens=n, stop_reason=None)


def _summary(new_tokens: int, total_s: float, tokens_per_s: float) -> Summary:
    return Summary(new_tokens=new_tokens, rounds=0, target_forwards=0, drafted=0, accepted=0, acceptance_rate=0.0,
                   mean_tokens_per_round=0.0, per_position_acceptance=(), tokens_per_s=tokens_per_s, ttft_s=0.0,
                   total_s=total_s, prompt_tokens=1, reused_prefix_tokens=0, draft_ms=0.0, verify_ms=0.0,
                   stop_reason="length", text="")


class Lane:
    """Requests whose rounds take scripted seconds on `clock`; the Summary's total_s is the engine's wall clock,
    which ran on while other lanes took their turns."""

    def __init__(self, name: str, clock: Clock, log: list[str], requests: list[list[float]]) -> None:
        self.name, self.clock, self.log, self.requests = name, clock, log, list(requests)
        self.done: list[tuple[int, Summary]] = []

    def request(self):
        if not self.requests:
            return None
        return self._run(self.requests.pop(0))

    def _run(self, seconds: list[float]):
        start = self.clock.now
        for n, s in enumerate(seconds, 1):
            self.clock.now += s
            self.log.append(self.name)
            yield _round(n)
        yield _summary(len(seconds), self.clock.now - start, len(seconds) / (self.clock.now - start))

    def finished(self, rounds, summary):
        self.done.append((len(rounds), summary))


def test_the_lane_that_spent_least_takes_the_next_round(monkeypatch):
    clock, log = Clock(), []
    monkeypatch.setattr(in_step.time, "perf_counter", clock)
    fast = Lane("fast", clock, log, [[1.0] * 6])  # a plain step a round
    slow = Lane("slow", clock, log, [[3.0] * 2])  # a wide pass a round
    run_in_step([slow, fast])
    # slow's 3 s round first (a tie goes to the earlier lane), then fast until it has spent as much, and so on
    assert log == ["slow", "fast", "fast", "fast", "slow", "fast", "fast", "fast"]
    (rounds_fast, s_fast), = fast.done
    (rounds_slow, s_slow), = slow.done
    assert (rounds_fast, rounds_slow) == (6, 2)
    # each timed by its own rounds, not by the 12 s of wall time its engine's clock saw
    assert s_fast.total_s == pytest.approx(6.0) and s_slow.total_s == pytest.approx(6.0)
    assert s_fast.tokens_per_s == pytest.approx(1.0) and s_slow.tokens_per_s == pytest.approx(2 / 6)


def test_a_lanes_next_request_starts_when_its_last_ends(monkeypatch):
    """A question's second turn is asked after its first (the lane decides what it asks once it has the answer)."""
    clock, log = Clock(), []
    monkeypatch.setattr(in_step.time, "perf_counter", clock)
    two_turns = Lane("a", clock, log, [[1.0], [1.0, 1.0]])
    one = Lane("b", clock, log, [[5.0]])
    run_in_step([two_turns, one])
    assert [n for n, _ in two_turns.done] == [1, 2]
    assert [s.total_s for _, s in two_turns.done] == pytest.approx([1.0, 2.0])
    assert one.done[0][1].total_s == pytest.approx(5.0)


def test_around_wraps_each_of_its_lanes_rounds(monkeypatch):
    clock, log = Clock(), []
    monkeypatch.setattr(in_step.time, "perf_counter", clock)
    entered: list[int] = []

    class Mark:
        def __init__(self, i):
            self.i = i

        def __enter__(self):
            entered.append(self.i)

        def __exit__(self, *exc):
            return False

    run_in_step([Lane("a", clock, log, [[1.0, 1.0]]), Lane("b", clock, log, [[1.5]])], around=Mark)
    # a round and then its Summary are each a turn: a, b, a, (b's Summary), a's Summary
    assert entered == [0, 1, 0, 1, 0]


def test_own_time_keeps_what_the_engine_left_out_of_the_rate():
    """The engine's rate left 0.5 s of prompt prefill out of 2.5 s; over the 1.5 s of its own turns the same 0.5 s
    stays out."""
    s = _summary(new_tokens=10, total_s=2.5, tokens_per_s=10 / 2.0)
    mine = own_time(s, 1.5)
    assert mine.total_s == 1.5 and mine.tokens_per_s == pytest.approx(10 / 1.0)
    assert own_time(_summary(0, 1.0, 0.0), 0.5).tokens_per_s == 0.0


def test_twins_taking_turns_round_by_round_decode_as_each_alone():
    """Engine.twin shares the weights only: four modes on four twins, taking turns round by round, give the tokens
    each gives alone (greedy: plain's), and each twin keeps its own conversation."""
    from engine.api.config import SamplingParams
    from engine.tools.bench import Ask, ModeRun
    from engine.tools.specbench import Question
    from tests.tiny import tiny_engine

    base = tiny_engine()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    question = Question("q", "qa", turns=("hello there", "and again"))
    settings = [("plain", 1), ("draft", 3), ("ngram", 2), ("hybrid", 4)]
    alone = []
    for mode, k in settings:
        run = ModeRun(mode, k, greedy, stop_below=0.5)
        run.add(base, question)
        alone.append(run.outputs)
    twins = [base] + [base.twin() for _ in settings[1:]]
    assert all(t.target is base.target and t.target_pool is not base.target_pool for t in twins[1:])
    runs = [ModeRun(mode, k, greedy, 0.5, engine=e) for (mode, k), e in zip(settings, twins)]
    run_in_step([Ask(run, run.engine, question) for run in runs])
    assert [run.outputs for run in runs] == alone
    assert all(len(out) == 2 and out == alone[0] for out in alone)  # two turns, every mode plain's tokens
    conversation = list(twins[1].ids)
    assert conversation and all(t.ids == conversation for t in twins)
    base.reset()  # one twin forgetting its conversation leaves the others' caches as they were
    assert base.ids == [] and twins[1].ids == conversation
    assert twins[1].target_pool.manager.length(0) == len(conversation) - 1

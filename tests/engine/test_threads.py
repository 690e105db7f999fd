"""The kernels' thread count follows the cores other programs leave free (engine/cpu/threads.py), and the numbers do
not depend on it."""
from __future__ import annotations

import os

import pytest
import torch

from engine.api.config import SamplingParams, SpecParams
from engine.cpu import threads as T
from engine.cpu.threads import ThreadGovernor, free_threads, read_busy_s
from engine.model.kv_cache import BlockManager, KVPool


class Machine:
    """A scripted machine: each read of the clock is one window (WINDOW_S) later, as when rounds go by; in each
    second the other programs keep `others` cores busy and this process one."""

    def __init__(self, others: float = 0.0) -> None:
        self.others, self.t, self.busy, self.own = others, 0.0, 0.0, 0.0
        self.threads = 2
        self.set_to: list[int] = []
        self.proc_stat = True

    def clock(self) -> float:
        self.t += T.WINDOW_S
        self.busy += (self.others + 1.0) * T.WINDOW_S
        self.own += T.WINDOW_S
        return self.t

    def idle(self, seconds: float) -> None:
        """Between requests: this process does nothing, the others go on."""
        self.t += seconds
        self.busy += self.others * seconds

    def apply(self, n: int) -> None:
        self.threads = n
        self.set_to.append(n)

    def governor(self, cores: int = 2) -> ThreadGovernor:
        return ThreadGovernor(cores, read_busy=lambda: self.busy if self.proc_stat else None,
                              read_own=lambda: self.own, clock=self.clock, apply=self.apply,
                              current=lambda: self.threads)


def test_free_threads_leave_a_core_to_each_busy_program():
    assert free_threads(2, 0.0, 2) == 2
    assert free_threads(2, 0.05, 2) == 2  # a window repainting
    assert free_threads(2, T.BUSY_CORE - 0.01, 2) == 2
    assert free_threads(2, T.BUSY_CORE, 2) == 1
    assert free_threads(2, 1.0, 2) == 1
    assert free_threads(2, 2.0, 2) == 1  # never none
    assert free_threads(8, 2.7, 8) == 5
    assert free_threads(8, 0.0, 4) == 4  # never past what the process set


def test_a_busy_neighbour_takes_a_thread_and_gives_it_back_when_it_stops():
    m = Machine()
    g = m.governor()
    g.begin()
    for _ in range(4):
        assert g.update() == 2
    m.others = 1.0
    assert g.update() == 2  # one window is a burst
    assert g.update() == 1  # two in a row: a busy program
    assert m.threads == 1 and g.others == pytest.approx(1.0)
    for _ in range(3):
        assert g.update() == 1
    m.others = 0.0
    assert g.update() == 1
    assert g.update() == 2
    assert m.set_to == [1, 2]


def test_a_single_burst_moves_nothing():
    m = Machine()
    g = m.governor()
    g.begin()
    for others in (0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0):
        m.others = others
        assert g.update() == 2
    assert m.set_to == []


def test_the_process_setting_is_the_ceiling_and_comes_back_after_the_request():
    m = Machine(others=1.0)
    g = m.governor(cores=4)
    m.threads = 3  # what the process set
    g.begin()
    g.update(), g.update(), g.update()
    assert m.threads == 3  # one busy core of four leaves three: no change
    m.others = 2.0
    g.update(), g.update()
    assert m.threads == 2
    g.end()
    assert m.threads == 3  # between requests the process's own setting
    g.begin()  # the next request starts where the last windows left it
    assert m.threads == 2
    g.end()
    m.threads = 1  # the process lowered its setting between requests: that is the ceiling now
    g.begin()
    m.others = 0.0
    for _ in range(4):
        g.update()
    assert m.threads == 1


def test_the_time_between_requests_decides_at_once():
    m = Machine()
    g = m.governor()
    g.begin()
    for _ in range(3):
        g.update()
    g.end()
    m.others = 1.0
    m.idle(5.0)
    g.begin()  # five seconds of a busy neighbour are no burst
    assert m.threads == 1
    g.end()
    m.others = 0.0
    m.idle(0.2)
    g.begin()  # too short to tell alone: the last count holds until two windows agree
    assert m.threads == 1 and g.others == 0.0
    g.update()
    assert m.threads == 2


def test_without_proc_stat_the_count_stays_as_set():
    m = Machine(others=1.5)
    m.proc_stat = False
    g = m.governor()
    g.begin()
    for _ in range(5):
        assert g.update() == 2
    g.end()
    assert m.set_to == [2] and g.others is None
    fixed = ThreadGovernor.fixed()  # a GPU engine's: measures nothing, whatever the machine
    before = torch.get_num_threads()
    fixed.begin()
    for _ in range(3):
        assert fixed.update() == before
    fixed.end()
    assert torch.get_num_threads() == before and fixed.others is None


def test_proc_stat_is_read_as_work_done(tmp_path):
    stat = tmp_path / "stat"
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(f"cpu  {3 * tick} {tick} {2 * tick} {50 * tick} {7 * tick} 0 {tick} {9 * tick} 0 0\n"
                    f"cpu0 {tick} 0 {tick} 9 9 0 0 9 0 0\n"
                    f"cpu1 {2 * tick} {tick} 0 9 9 0 {tick} 9 0 0\n"
                    f"cpu2 0 0 {tick} 9 9 0 0 9 0 0\n"
                    "intr 1 2 3\n")
    assert read_busy_s(path=str(stat)) == pytest.approx(7.0)  # idle, iowait and steal are not work done here
    assert read_busy_s({0, 2}, path=str(stat)) == pytest.approx(3.0)  # only the CPUs this process may use
    assert read_busy_s({1}, path=str(stat)) == pytest.approx(4.0)
    assert read_busy_s({0, 5}, path=str(stat)) is None  # a CPU it may use but /proc/stat does not list
    stat.write_text("intr 1 2 3\n")
    assert read_busy_s(path=str(stat)) is None
    stat.write_text("cpu  1 2 x 4 5 6 7\n")
    assert read_busy_s(path=str(stat)) is None
    assert read_busy_s(path=str(tmp_path / "missing")) is None


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux's /proc/stat is what is measured")
def test_this_machine_is_measured():
    g = ThreadGovernor(apply=lambda n: None)
    g.begin()
    g.update()
    x = 0
    g._last.wall_s -= T.WINDOW_S  # as if a window had gone by
    for i in range(200_000):
        x += i
    g.update()
    assert g.others is not None and 0.0 <= g.others <= (os.cpu_count() or 1)


# ---- the real embedded pair -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine():
    from engine.io.loading import load_engine
    from engine.io.provision import default_pair

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    target, draft = default_pair()
    yield load_engine(str(target), str(draft), device="cpu")
    torch.set_num_threads(threads)


PROMPT = [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."}]


def _run(engine, sampling: SamplingParams, spec: SpecParams) -> tuple[tuple[int, ...], set[int]]:
    engine.reset()
    used = set()
    for item in engine.generate(engine.encode_chat(PROMPT), sampling, spec):
        used.add(torch.get_num_threads())
    return item.token_ids, used


def _logits(model, ids: list[int]) -> torch.Tensor:
    """Every position's logits for ids from a fresh cache: a prompt's worth of rows at once, as a prefill or a wide
    verify pass runs."""
    w = next(model.parameters())
    pool = KVPool(model.cfg.num_layers, model.cfg.num_kv_heads, model.cfg.head_dim, BlockManager(64, 16, 1024),
                  model.kv_dtype or w.dtype, w.device)
    pool.manager.allocate(0)
    start, end = pool.manager.append(0, len(ids))
    with torch.inference_mode():
        return model(torch.tensor(ids), start, pool.view(0, start, end)).float()  # (len(ids), V)


@pytest.mark.embedded
def test_one_thread_and_two_compute_the_same_numbers(engine):
    ids = engine.encode_chat(PROMPT)
    long = engine.encode_chat([{"role": "user", "content": "Summarize: " + "The quick brown fox jumps. " * 60}])
    assert len(long) > 300  # a prompt's prefill path, attention over hundreds of keys
    cases = {"step": ids[:1], "pass": ids[:5], "rows": ids, "long": long}
    out = {}
    for n in (1, 2):
        torch.set_num_threads(n)
        for role, model in (("target", engine.target), ("draft", engine.draft)):
            for kind, case in cases.items():
                out[role, n, kind] = _logits(model, case)
    torch.set_num_threads(2)
    for role in ("target", "draft"):
        for kind in cases:
            assert torch.equal(out[role, 1, kind], out[role, 2, kind]), (role, kind)


def _scripted(others: float) -> ThreadGovernor:
    """A governor that reads a scripted machine and sets the real thread count: the test does not depend on how
    busy the machine running it is."""
    m = Machine(others)
    return ThreadGovernor(2, read_busy=lambda: m.busy, read_own=lambda: m.own, clock=m.clock)


@pytest.mark.embedded
def test_replies_are_the_same_when_a_busy_neighbour_takes_a_thread(engine):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=48)
    sampled = SamplingParams(temperature=0.8, max_new_tokens=48, seed=11)
    spec = SpecParams(k=4, drafter="hybrid", stop_below=0.7)
    # Sampled, the draft model at a fixed K: the hybrid's choices under sampling read costs the greedy replies before
    # measured (engine/spec/policy.py), which differ with the load, and a different choice draws other numbers.
    fixed = SpecParams(k=4, drafter="model", stop_below=0.7)
    measured = engine.threads
    try:
        engine.threads = _scripted(others=0.0)
        plain, used = _run(engine, greedy, SpecParams(enabled=False))
        assert used == {2}
        sampled_quiet, used = _run(engine, sampled, fixed)
        assert used == {2}
        engine.threads = _scripted(others=1.0)
        busy, used = _run(engine, greedy, spec)
        assert 1 in used  # the neighbour took a thread during the reply ...
        assert torch.get_num_threads() == 2  # ... and the process has its own setting back after it
        assert busy == plain
        sampled_busy, used = _run(engine, sampled, fixed)
        assert 1 in used and sampled_busy == sampled_quiet
    finally:
        engine.threads = measured
        torch.set_num_threads(2)

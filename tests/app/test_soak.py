"""200 turns through the ChatController, tiny real models in the engine process: plain, draft-model and n-gram
rounds, greedy and sampled, some cancelled, a New chat every 8 turns. After the last reset both KV pools have
every block free again, and the engine process's resident memory stays flat."""
import time

from engine.api.config import SamplingParams, SpecParams
from engine.api.protocol import EngineStatus
from tests.app_fixtures import LOAD_TIMEOUT_MS, tiny

TURNS = 200
MB = 1 << 20


def status(qtbot, controller) -> EngineStatus:
    """The engine process's status once it has nothing left to do (a reset may still wait in its queue)."""
    got = []
    controller.host.statusReady.connect(got.append)

    def idle() -> bool:
        if got and not got[-1].busy:
            return True
        if len(got) == len(asked):  # one query in flight at a time: none may answer a later call with stale counts
            asked.append(1)
            controller.host.query_status()
        return False

    asked: list[int] = []
    qtbot.waitUntil(idle, timeout=5000)
    controller.host.statusReady.disconnect(got.append)
    return got[-1]


def test_soak_200_turns(qtbot, make_host):
    from app.controller import ChatController

    c = ChatController(make_host(tiny(max_seq_len=512), load_timeout_ms=LOAD_TIMEOUT_MS))
    modes = [SpecParams(enabled=False), SpecParams(k=4, drafter="model"), SpecParams(k=3, drafter="ngram"),
             SpecParams(k=5, drafter="model", adaptive=True)]
    rss: dict[int, int] = {}
    outcomes = {"eos": 0, "length": 0, "cancelled": 0}
    start = time.perf_counter()
    for turn in range(1, TURNS + 1):
        if turn % 8 == 1 and turn > 1:
            c.new_chat()  # the context holds 512 tokens; the tokenizer is one token per character
        sampling = SamplingParams(temperature=0.0 if turn % 2 else 0.9, top_p=0.95, max_new_tokens=12 + turn % 7,
                                  seed=turn)
        assert c.send(f"turn {turn}: say something", sampling, modes[turn % len(modes)])
        record = c.active.record
        if turn % 10 == 5:  # cancel mid-reply (or before it starts: both must leave everything consistent)
            qtbot.waitUntil(lambda: bool(record.rounds) or not c.busy, timeout=5000)
            c.stop()
        qtbot.waitUntil(lambda: not c.busy, timeout=10_000)
        assert record.summary is not None or turn % 10 == 5, f"turn {turn} failed"
        if record.summary is not None:
            outcomes[record.summary.stop_reason] += 1
        if turn in (1, TURNS // 2, TURNS):
            rss[turn] = status(qtbot, c).rss_bytes
    elapsed = time.perf_counter() - start
    c.new_chat()
    final = status(qtbot, c)
    print(f"\nsoak: {TURNS} turns in {elapsed:.1f} s; {outcomes}; engine RSS "
          + ", ".join(f"turn {t}: {v / MB:.1f} MB" for t, v in rss.items()))
    assert final.target_free_blocks == final.target_total_blocks
    assert final.draft_free_blocks == final.draft_total_blocks
    assert outcomes["cancelled"] >= 10 and outcomes["length"] > 100
    modes_seen = {(r.mode, r.drafter) for rec in c.stats.records for r in rec.rounds}
    assert {("plain", None), ("speculative", "model"), ("speculative", "ngram")} <= modes_seen
    assert {r.temperature for rec in c.stats.records for r in rec.rounds} >= {0.0, 0.9}
    # Flat: what the first turns allocate for good (buffers, caches) may grow, the rest may not.
    assert rss[TURNS] - rss[TURNS // 2] < 32 * MB, rss
    assert rss[TURNS] - rss[1] < 96 * MB, rss

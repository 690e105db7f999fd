"""A long prompt's reading in the window, on the tiny real engine in its own process: the status line counts the
tokens read, Stop says "Stopping…" at once and takes effect within a chunk, the reply's footer says how far the
reading came, and the K tuner shows its replays' reading and cancels within a chunk too.

The engine process reads the prompt in chunks of CHUNK tokens, each slowed to CHUNK_S, so that the whole prompt
takes many seconds and a stop that waited for it could not pass the bounds below."""
from __future__ import annotations

import re
import time
from dataclasses import replace

from engine.api.config import SamplingParams, SpecParams
from engine.api.events import PrefillProgress
from engine.service.loaders import Factory
from tests.app_fixtures import make_round, make_summary

CHUNK = 8
CHUNK_S = 0.1
PROMPT = "Summarize this, please. " + "The quick brown fox jumps over the lazy dog. " * 9  # ~430 tokens
FULL_READ_S = (len(PROMPT) // CHUNK) * CHUNK_S  # at least this long to read it all: ~5 s
STOP_BOUND_S = 2.5  # from Stop to the reply's end: a chunk or two here, on a busy machine


def slow_prefill_loader(target, draft, device, progress, cancelled):
    """Runs in the engine process: the tiny pair with a 512-token context, reading prompts CHUNK tokens at a time,
    CHUNK_S per chunk (the target's and the draft's)."""
    import engine.model.forward as fwd
    from tests.app_fixtures import tiny_loader

    fwd.PREFILL_CHUNK = CHUNK
    engine = tiny_loader(target, draft, device, progress, cancelled, max_seq_len=512, draft_name="tiny-draft")
    for model in (engine.target, engine.draft):
        real = model.forward

        def forward(ids, *args, _real=real, **kwargs):
            if len(ids) == CHUNK:  # a prefill chunk (a round's passes are K + 1 <= 5 tokens here)
                time.sleep(CHUNK_S)
            return _real(ids, *args, **kwargs)

        model.forward = forward
    return engine


SLOW = Factory("tests.app.test_prefill_progress:slow_prefill_loader")
READING = re.compile(r"^Reading the prompt\u2026 ([\d,]+) of ([\d,]+) tokens$")


def test_the_status_line_counts_the_prompt_read_and_stop_acts_within_a_chunk(qtbot, make_window):
    w = make_window(SLOW, load_timeout_ms=120_000)
    heard: list[PrefillProgress] = []
    w.controller.prefillArrived.connect(heard.append)
    w.controls.max_tokens_spin.setValue(8)
    w.input.setPlainText(PROMPT)
    w.send()
    qtbot.waitUntil(lambda: any(p.done > 0 for p in heard), timeout=30000)
    m = READING.match(w.round_label.text())
    assert m is not None, w.round_label.text()
    done, total = (int(g.replace(",", "")) for g in m.groups())
    assert 0 < done < total and total > 400
    t_stop = time.monotonic()
    w.stop()
    assert w.round_label.text() == "Stopping\u2026"  # at once, before the engine has answered
    assert not w.stop_button.isEnabled() and not w.stop_action.isEnabled()
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=30000)
    stop_s = time.monotonic() - t_stop
    s = w.summary
    assert s is not None and (s.stop_reason, s.rounds, s.new_tokens) == ("cancelled", 0, 0)
    last = heard[-1]
    assert last.model == "target" and last.done < last.total  # the prompt was never read to its end
    assert stop_s < STOP_BOUND_S < FULL_READ_S - last.done // CHUNK * CHUNK_S, stop_s
    assert w.round_label.text() != "Stopping\u2026"
    footer = w.chat.toPlainText().rstrip().splitlines()[-1]
    assert f"stopped while reading the prompt: {last.done:,} of {last.total:,} tokens read" in footer, footer
    print(f"stop latency during prefill (tiny pair, {CHUNK_S} s chunks): {stop_s:.2f} s")


def test_the_tuner_shows_its_replays_reading_and_cancels_within_a_chunk(qtbot, make_window):
    from app.dialogs.tuner_dialog import TunerDialog

    w = make_window(SLOW, load_timeout_ms=120_000)
    messages = [{"role": "user", "content": PROMPT}]
    dlg = TunerDialog(w.controller, messages, SamplingParams(temperature=0.0, max_new_tokens=6, seed=3),
                      SpecParams(), True, w, ks=(1, 2))
    qtbot.addWidget(dlg)
    dlg.show()
    dlg.start()
    qtbot.waitUntil(lambda: "reading the prompt (" in dlg.status.text(), timeout=30000)
    assert re.search(r"^Replay 1 of 5: plain decoding, reading the prompt \([\d,]+ of [\d,]+ tokens\)",
                     dlg.status.text()), dlg.status.text()
    t_cancel = time.monotonic()
    dlg.cancel()
    assert dlg.status.text().startswith("Cancelling\u2026") and not dlg.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: dlg.tuner.done, timeout=30000)
    cancel_s = time.monotonic() - t_cancel
    assert dlg.sweep.runs == () and not dlg.complete and dlg.status.text().startswith("Cancelled after 0 of 5")
    record = w.controller.stats.records[-1]
    assert record.summary is not None and (record.summary.rounds, record.summary.new_tokens) == (0, 0)
    assert cancel_s < STOP_BOUND_S, cancel_s
    print(f"tuner cancel latency during prefill (tiny pair, {CHUNK_S} s chunks): {cancel_s:.2f} s")


def test_the_footer_says_how_long_a_long_prompt_took_to_read():
    from app.views.reply_footer import reading, reply_footer

    s = make_summary([make_round()], prompt_tokens=27000)
    assert "prompt read in" not in reply_footer(replace(s, prefill_s=1.2))  # no word about a short wait
    assert "prompt read in 4 min 45 s, by the draft model in 31 s" in reply_footer(
        replace(s, prefill_s=285.0, draft_prefill_ms=31_000.0))
    stopped = replace(s, stop_reason="cancelled")
    assert reply_footer(stopped, PrefillProgress("target", 8192, 27000)).endswith(
        "stopped while reading the prompt: 8,192 of 27,000 tokens read")
    assert reply_footer(stopped, PrefillProgress("target", 27000, 27000)).endswith("stopped")
    assert reading(PrefillProgress("target", 8192, 27000)) == "Reading the prompt\u2026 8,192 of 27,000 tokens"
    assert reading(PrefillProgress("draft", 64, 27000)).startswith("The draft model is reading the prompt\u2026 64")

"""The distribution inspector: the engine's per-position data against an independent computation, and the panel.

The engine side runs the tiny real pair (tests/tiny.py) in this process and checks each recorded row against a
softmax of the same models' logits computed by transformers from the whole sequence, not by the engine.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.api.config import SamplingParams, SpecParams
from engine.api.events import Origin, RoundEvent, Summary
from engine.spec.accept import accept_reject
from engine.spec.sampling import residual, sample
from tests.app_fixtures import make_round
from tests.tiny import ENGINE_CFG, draft_weights, hf_model, state_dict

PROMPT = [{"role": "user", "content": "Tell me a story about a cat."}]


@pytest.fixture(scope="module")
def pair():
    """The tiny engine and, independently, the same target and draft as transformers models."""
    from tests.tiny import tiny_engine

    torch.set_num_threads(1)
    engine = tiny_engine()
    engine.eos_ids = set()
    target = hf_model(ENGINE_CFG, 0)
    draft = hf_model(ENGINE_CFG, 0)
    draft.load_state_dict(draft_weights(state_dict(target), 0.03, 1), strict=False)
    return engine, target.eval(), draft.eval()


def run(engine, temperature: float, drafter: str = "model", seed: int = 5, n: int = 40) -> list[RoundEvent]:
    engine.reset()
    prompt = engine.encode_chat(PROMPT)
    sampling = SamplingParams(temperature=temperature, seed=seed, max_new_tokens=n)
    events = list(engine.generate(prompt, sampling, SpecParams(k=3, drafter=drafter)))
    assert isinstance(events[-1], Summary)
    return [e for e in events if isinstance(e, RoundEvent)]


def rows_of(model, ids: list[int], first: int, count: int) -> torch.Tensor:
    """Logits predicting ids[first + 1 .. first + count], from one full forward pass of `model`. (count, V)"""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return logits[first : first + count].float()


def replay(engine, events: list[RoundEvent]):
    """(event, context ids before the round) for each round."""
    ids = engine.encode_chat(PROMPT)
    for ev in events:
        yield ev, list(ids)
        ids += [c.token_id for c in ev.committed]


def test_rows_match_an_independent_softmax_of_the_models(pair):
    engine, target, draft = pair
    temperature = 0.8
    events = run(engine, temperature)
    rejections = corrections_checked = 0
    for ev, ctx in replay(engine, events):
        k = len(ev.drafted)
        assert len(ev.positions) == k + 1
        seq = ctx + [d.token_id for d in ev.drafted]
        p = torch.softmax(rows_of(target, seq, len(ctx) - 1, k + 1) / temperature, -1)
        q = torch.softmax(rows_of(draft, seq, len(ctx) - 1, k) / temperature, -1) if k else None
        for i, row in enumerate(ev.positions):
            assert not row.from_logits
            ids = torch.tensor(row.ids)
            assert row.p == pytest.approx(p[i, ids].tolist(), abs=2e-4)
            top = torch.topk(p[i], 5).indices.tolist()
            assert list(row.ids[:5]) == top, "the row starts with p's top tokens, in order"
            if i < k:
                assert row.q == pytest.approx(q[i, ids].tolist(), abs=2e-4)
                tv = 0.5 * (p[i] - q[i]).abs().sum().item()
                assert row.tv == pytest.approx(tv, abs=2e-4)
                assert row.overlap == pytest.approx(torch.minimum(p[i], q[i]).sum().item(), abs=2e-4)
                d = ev.drafted[i]
                assert row.p_of(d.token_id) == pytest.approx(d.p, abs=1e-6)
                assert row.q_of(d.token_id) == pytest.approx(d.q, abs=1e-6)
                if i <= ev.accepted:  # the tested drafts: the verdict is u * q < p, with the recorded u
                    assert (row.u * d.q < d.p) == d.accepted
            else:
                assert row.q is None and row.u is None and row.tv is None
        final = ev.committed[-1]
        if final.origin == Origin.CORRECTED:
            rejections += 1
            row = ev.positions[final.index]
            r = residual(p[final.index], q[final.index])
            assert final.token_id in row.residual_ids
            assert row.residual == pytest.approx(r[torch.tensor(row.residual_ids)].tolist(), abs=2e-4)
            assert list(row.residual_ids[:3]) == torch.topk(r, 3).indices.tolist()
            corrections_checked += 1
        else:
            assert all(not row.residual for row in ev.positions)
    assert rejections >= 2 and corrections_checked == rejections, "the run must exercise corrections"


def test_greedy_rows_show_the_logits_and_say_so(pair):
    engine, target, draft = pair
    events = run(engine, 0.0)
    assert any(ev.accepted < len(ev.drafted) for ev in events), "the run must contain a rejection"
    for ev, ctx in replay(engine, events):
        k = len(ev.drafted)
        seq = ctx + [d.token_id for d in ev.drafted]
        p_logits = rows_of(target, seq, len(ctx) - 1, k + 1)
        q_logits = rows_of(draft, seq, len(ctx) - 1, k) if k else None
        for i, row in enumerate(ev.positions):
            assert row.from_logits
            ids = torch.tensor(row.ids)
            assert row.p == pytest.approx(torch.softmax(p_logits[i], -1)[ids].tolist(), abs=2e-4)
            if i < k:
                assert row.q == pytest.approx(torch.softmax(q_logits[i], -1)[ids].tolist(), abs=2e-4)
                # p and q themselves are point masses: TV is 0 when the argmaxes agree, else 1
                agree = int(p_logits[i].argmax()) == int(q_logits[i].argmax())
                assert row.tv == pytest.approx(0.0 if agree else 1.0, abs=1e-6)
                if i <= ev.accepted:
                    assert ev.drafted[i].accepted == agree


def test_ngram_rows_have_point_mass_q(pair):
    engine, _, _ = pair
    events = [ev for ev in run(engine, 0.7, drafter="ngram", n=80) if ev.drafted]
    assert events, "the n-gram drafter proposed nothing"
    for ev in events:
        for i, d in enumerate(ev.drafted):
            row = ev.positions[i]
            assert row.q_of(d.token_id) == 1.0 and sum(row.q) == pytest.approx(1.0)
            assert len(row.ids) <= 12, "p's top 10 and the row's own tokens: not the point mass's k - 1 zeros"
            assert row.overlap == pytest.approx(d.p, abs=1e-5)  # sum(min(p, q)) for q = 1 on t is p(t)


def test_verdict_u_is_the_draw_and_takes_no_extra_randomness():
    g = torch.Generator().manual_seed(11)
    vocab, k = 50, 4
    p = torch.softmax(torch.randn(k + 1, vocab, generator=g), -1)
    q = torch.softmax(torch.randn(k, vocab, generator=g), -1)
    drafted = torch.multinomial(q, 1, generator=g)[:, 0]
    ours, ref = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    v = accept_reject(drafted, q, p, ours)
    u = torch.rand(k, generator=ref)
    assert v.u == tuple(u.tolist())
    n = v.accepted
    dist = residual(p[n], q[n]) if n < k else p[k]
    sample(dist, ref)  # the correction or bonus: the sampler's own draw, nothing more
    assert torch.equal(ours.get_state(), ref.get_state()), "accept_reject drew more (or fewer) random numbers"


def test_inspection_keeps_events_small(pair):
    import pickle

    engine, _, _ = pair
    events = run(engine, 0.8)
    per_round = max(len(pickle.dumps(ev)) for ev in events)
    assert per_round < 12_000, f"a round event pickles to {per_round} bytes"


# ---- the panel ---------------------------------------------------------------------------------------------------
def click_token(qtbot, chat, want) -> object:
    """Click the first painted token whose info satisfies `want`; returns that info."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QTextCursor

    doc = chat.document()
    for pos in range(doc.characterCount() - 1):
        info = chat.token_info_at_position(pos)
        if info is not None and want(info):
            cursor = QTextCursor(doc)
            cursor.setPosition(pos)
            chat.setTextCursor(cursor)
            chat.ensureCursorVisible()
            rect = chat.cursorRect(cursor)
            point = rect.center()
            point.setX(point.x() + 3)
            assert chat.token_info_at(point) == info
            qtbot.mouseClick(chat.viewport(), Qt.MouseButton.LeftButton, pos=point)
            return info
    raise AssertionError("no such token on screen")


@pytest.fixture
def shown(qtbot, pair):
    """A ChatView showing a sampled reply of the tiny pair, and an InspectorDock wired as in the window."""
    from PySide6.QtWidgets import QMainWindow

    from app.views.chat_view import ChatView
    from app.views.inspector_dock import InspectorDock

    engine, _, _ = pair
    events = run(engine, 0.8)
    win = QMainWindow()
    chat = ChatView()
    win.setCentralWidget(chat)
    dock = InspectorDock(win)
    win.addDockWidget(Qt_right(), dock)
    chat.tokenClicked.connect(dock.show_token)
    qtbot.addWidget(win)
    win.resize(1100, 700)
    win.show()
    qtbot.waitExposed(win)
    chat.add_user("Tell me a story about a cat.")
    chat.begin_assistant("tiny")
    for ev in events:
        chat.feed(ev)
    chat.flush()
    yield chat, dock
    win.close()


def Qt_right():
    from PySide6.QtCore import Qt

    return Qt.DockWidgetArea.RightDockWidgetArea


def test_click_on_a_rejected_draft_explains_the_verdict(qtbot, shown):
    from app.views.tokens import REJECTED

    chat, dock = shown
    assert not dock.isVisible()
    info = click_token(qtbot, chat, lambda i: i.kind == REJECTED)
    panel = dock.panel
    assert dock.isVisible() and panel.info == info
    row = info.dist
    assert "rejected" in panel.verdict.text() and f"{row.u:.4f}" in panel.verdict.text()
    assert panel.gauge.u == row.u and panel.gauge.ratio == pytest.approx(min(1.0, info.p / info.q))
    assert f"{row.tv:.3f}" in panel.overlap.text() and f"{1 - row.tv:.3f}" in panel.overlap.text()
    bars = panel.pair.rows
    assert [b.values for b in bars] == [(p, q) for p, q in zip(row.p, row.q)]
    assert sorted(b.mark for b in bars if b.mark) == ["drawn", "this"]  # the correction is never the draft
    assert panel.residual.isHidden()


def test_click_on_a_correction_shows_the_residual(qtbot, shown):
    chat, dock = shown
    info = click_token(qtbot, chat, lambda i: i.kind == Origin.CORRECTED.value)
    panel = dock.panel
    row = info.dist
    assert panel.residual.isVisible() and [b.values[0] for b in panel.residual.rows] == list(row.residual)
    assert [b.mark for b in panel.residual.rows if b.mark] == ["drawn"]
    assert panel.verdict.isHidden(), "a correction was drawn, not tested"
    assert sorted(b.mark for b in panel.pair.rows if b.mark) == ["rejected", "this"]


def test_bonus_and_accepted_tokens(qtbot, shown):
    chat, dock = shown
    info = click_token(qtbot, chat, lambda i: i.kind == Origin.ACCEPTED.value)
    assert "kept" in dock.panel.verdict.text()
    info = click_token(qtbot, chat, lambda i: i.kind in (Origin.BONUS.value, Origin.PLAIN.value))
    panel = dock.panel
    assert panel.info == info and panel.verdict.isHidden() and panel.overlap.isHidden()
    assert all(len(b.values) == 1 for b in panel.pair.rows), "no q at a bonus position"


def test_greedy_token_says_point_masses(qtbot):
    from app.views.inspector_dock import InspectorPanel
    from app.views.tokens import REJECTED, TokenInfo
    from engine.api.dists import PositionDist

    panel = InspectorPanel()
    qtbot.addWidget(panel)
    row = PositionDist(ids=(5, 6), texts=("a", "b"), p=(0.6, 0.3), q=(0.2, 0.7), u=0.4, tv=1.0, from_logits=True)
    ev = replace(make_round(rejected=("b",), temperature=0.0), positions=(row, row))  # noqa: F405
    panel.show_token(TokenInfo(REJECTED, 1, 1, 6, "b", 0.0, 1.0, ev))
    assert "point masses" in panel.note.text() and "softmax(logits)" in panel.pair_title.text()
    assert "rejected" in panel.verdict.text()


def test_token_without_inspector_data(qtbot):
    from app.views.inspector_dock import InspectorPanel
    from app.views.tokens import TokenInfo

    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.show_token(TokenInfo(Origin.ACCEPTED.value, 1, 0, 100, "Hello", 0.8, 0.5, make_round()))  # noqa: F405
    assert "no distribution data" in panel.note.text() and panel.pair.isHidden()


def test_a_long_token_title_fits_the_dock_at_its_narrowest(qtbot):
    """A token with no place to wrap (a run of spaces, a long identifier) was cut off."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QMainWindow

    from app.views.inspector_dock import InspectorDock
    from app.views.tokens import TokenInfo

    win = QMainWindow()
    qtbot.addWidget(win)
    dock = InspectorDock(win)
    win.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, dock)
    win.resize(900, 600)
    win.show()
    token = "very_long_identifier_name_without_any_break_at_all"
    dock.show_token(TokenInfo(Origin.ACCEPTED.value, 1, 0, 100, token, 0.8, 0.5, make_round()))  # noqa: F405
    qtbot.wait(50)
    title = dock.panel.title
    assert title.sizeHint().width() <= title.width() + 1 and title.width() <= dock.width()
    assert f"({len(token)} chars)" in title.text() and token[:12] in title.text()

"""The charts say what they draw: a legend on every plot with more than one line, plain titles with the symbols in
tooltips, and a view that stays readable past hundreds of rounds."""
import pytest

from app.views.charts import RAW_ROUNDS, WIDE_WINDOW, ChartsPanel
from tests.app_fixtures import make_round


@pytest.fixture
def panel(qtbot):
    p = ChartsPanel()
    qtbot.addWidget(p)
    p.resize(800, 700)
    p.show()
    return p


def long_reply(n: int):
    # accepted 0 or 2 of 2 drafts in turn: per round the acceptance is a 0/1 spike, its mean a steady 0.5
    return [make_round(i, ("a", "b") if i % 2 else (), () if i % 2 else ("x", "y"), "d", k=2) for i in range(1, n + 1)]


def test_every_plot_with_two_lines_has_a_legend(panel):
    for ev in long_reply(10):
        panel.feed(ev)
    panel.flush(full=True)
    labels = {name: [label.text for _, label in legend.items] for name, legend in panel.legends.items()}
    assert labels["k"] == ["K (ceiling)", "drafted"]  # "K and drafted per round" had two lines and no legend
    assert labels["acceptance"] == ["per round", "mean of 8 rounds"]
    assert labels["tokens"] == ["per round", "mean of 8 rounds", "plain step"]
    assert labels["speedup"][0] == "measured" and labels["speedup"][1].startswith("theory")
    assert all(legend.isVisible() for legend in panel.legends.values())


def test_titles_are_plain_and_the_symbols_are_in_tooltips(panel):
    for ev in long_reply(10):
        panel.feed(ev)
    panel.flush(full=True)
    for name, plot in panel.plots.items():
        title = plot.titleLabel.item.toPlainText()
        assert "\u03b1" not in title and "c\u2248" not in title and " n " not in f" {title} ", (name, title)
        assert plot.toolTip(), name
    assert "\u03b1" in panel.plots["acceptance"].toolTip() and "This chat: 50%" in panel.plots["acceptance"].toolTip()
    assert "50% this reply" in panel.plots["acceptance"].titleLabel.item.toPlainText()
    assert "c\u2248" in panel.plots["speedup"].toolTip() and "Leviathan" in panel.plots["speedup"].toolTip()


def test_past_a_hundred_rounds_only_a_wider_mean_is_drawn(panel):
    for ev in long_reply(RAW_ROUNDS):
        panel.feed(ev)
    panel.flush(full=True)
    assert len(panel.curves["acceptance"].getData()[0]) == RAW_ROUNDS  # the per-round line while it reads
    for ev in long_reply(3 * RAW_ROUNDS)[RAW_ROUNDS:]:
        panel.feed(ev)
    panel.flush(full=True)
    assert not panel.curves["acceptance"].isVisible() and not panel.curves["tokens"].isVisible()
    x, mean = panel.curves["acceptance_mean"].getData()
    assert len(x) == 3 * RAW_ROUNDS
    assert mean[-100:].min() >= 0.5 - 1 / WIDE_WINDOW - 1e-9 and mean[-100:].max() <= 0.5 + 1 / WIDE_WINDOW + 1e-9
    assert [label.text for _, label in panel.legends["acceptance"].items] == [f"mean of {WIDE_WINDOW} rounds"]
    assert "per round" not in [label.text for _, label in panel.legends["tokens"].items]
    assert "left out" in panel.plots["acceptance"].toolTip()
    panel.clear()  # a new chat: the per-round lines come back, in the legend too
    for ev in long_reply(5):
        panel.feed(ev)
    panel.flush(full=True)
    assert [label.text for _, label in panel.legends["acceptance"].items] == ["per round", "mean of 8 rounds"]

"""Colours: Okabe-Ito hues for token origins and chart series, blended into the current palette.

Token backgrounds are tints (the hue mixed into the base colour) so the palette's own text colour stays
readable on them in light and dark mode alike; `tests/app/test_chat_view.py` checks the WCAG contrast.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette

from engine.api.events import Origin

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies.
OKABE_ITO = {
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
    "grey": "#999999",
}

ORIGIN_HUE = {
    Origin.ACCEPTED: OKABE_ITO["bluish_green"],
    Origin.CORRECTED: OKABE_ITO["vermillion"],
    Origin.BONUS: OKABE_ITO["blue"],
    Origin.PLAIN: OKABE_ITO["grey"],
}
REJECTED_HUE = OKABE_ITO["reddish_purple"]

ORIGIN_LABEL = {
    Origin.ACCEPTED: "Accepted draft",
    Origin.CORRECTED: "Corrected",
    Origin.BONUS: "Bonus",
    Origin.PLAIN: "Plain decode",
}
ORIGIN_HELP = {
    Origin.ACCEPTED: "a token the drafter proposed and the target kept",
    Origin.CORRECTED: "the target's own token after it rejected a draft",
    Origin.BONUS: "a free extra token from the target after all K drafts passed",
    Origin.PLAIN: "one target step, no drafting (speculation off or no draft)",
}

# Chart series, one hue each.
SERIES = {
    "acceptance": OKABE_ITO["bluish_green"],
    "rolling": OKABE_ITO["orange"],
    "tokens": OKABE_ITO["blue"],
    "plain": OKABE_ITO["grey"],
    "histogram": OKABE_ITO["sky_blue"],
    "position": OKABE_ITO["orange"],
    "measured": OKABE_ITO["vermillion"],
    "theoretical": OKABE_ITO["sky_blue"],
    "k": OKABE_ITO["reddish_purple"],
    "drafted": OKABE_ITO["blue"],
}


def mix(a: QColor, b: QColor, t: float) -> QColor:
    """(1 - t) * a + t * b, per channel."""
    return QColor.fromRgbF(
        a.redF() + (b.redF() - a.redF()) * t,
        a.greenF() + (b.greenF() - a.greenF()) * t,
        a.blueF() + (b.blueF() - a.blueF()) * t,
    )


def _luminance(c: QColor) -> float:
    def lin(v: float) -> float:
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(c.redF()) + 0.7152 * lin(c.greenF()) + 0.0722 * lin(c.blueF())


def contrast_ratio(a: QColor, b: QColor) -> float:
    """WCAG 2 contrast ratio, 1 (none) .. 21 (black on white)."""
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Base).lightness() < 128


@dataclass(frozen=True)
class TokenColours:
    """What the chat view paints with, derived from one palette."""

    dark: bool
    text: QColor
    base: QColor
    muted: QColor  # secondary text (headers, meta lines)
    tint: dict[Origin, QColor]
    rejected: QColor  # foreground of struck-through rejected drafts
    code_bg: QColor  # panel behind fenced code blocks
    user_bg: QColor  # panel behind the user's messages


def token_colours(palette: QPalette) -> TokenColours:
    dark = is_dark(palette)
    base = palette.color(QPalette.ColorRole.Base)
    text = palette.color(QPalette.ColorRole.Text)
    strength = 0.42 if dark else 0.30
    tint = {o: mix(base, QColor(h), strength) for o, h in ORIGIN_HUE.items()}
    rejected = mix(text, QColor(REJECTED_HUE), 0.55 if dark else 0.65)
    return TokenColours(
        dark=dark,
        text=text,
        base=base,
        muted=mix(base, text, 0.6),
        tint=tint,
        rejected=rejected,
        code_bg=mix(base, text, 0.07),
        user_bg=mix(base, QColor(OKABE_ITO["sky_blue"]), 0.12 if dark else 0.10),
    )


def dark_palette() -> QPalette:
    p = QPalette()
    roles = {
        QPalette.ColorRole.Window: "#232428",
        QPalette.ColorRole.WindowText: "#e6e6e6",
        QPalette.ColorRole.Base: "#1b1c1f",
        QPalette.ColorRole.AlternateBase: "#26272b",
        QPalette.ColorRole.ToolTipBase: "#2d2e33",
        QPalette.ColorRole.ToolTipText: "#f0f0f0",
        QPalette.ColorRole.PlaceholderText: "#8a8c92",
        QPalette.ColorRole.Text: "#e6e6e6",
        QPalette.ColorRole.Button: "#2d2e33",
        QPalette.ColorRole.ButtonText: "#e6e6e6",
        QPalette.ColorRole.BrightText: "#ffffff",
        QPalette.ColorRole.Light: "#3a3b41",
        QPalette.ColorRole.Midlight: "#323338",
        QPalette.ColorRole.Mid: "#2a2b30",
        QPalette.ColorRole.Dark: "#151619",
        QPalette.ColorRole.Shadow: "#000000",
        QPalette.ColorRole.Highlight: "#2f7fc1",
        QPalette.ColorRole.HighlightedText: "#ffffff",
        QPalette.ColorRole.Link: "#56B4E9",
        QPalette.ColorRole.LinkVisited: "#CC79A7",
    }
    for role, colour in roles.items():
        p.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#75777d"))
    return p


def light_palette() -> QPalette:
    from PySide6.QtWidgets import QApplication

    p = QApplication.style().standardPalette()
    p.setColor(QPalette.ColorRole.Highlight, QColor("#2f7fc1"))
    p.setColor(QPalette.ColorRole.HighlightedText, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.Link, QColor(OKABE_ITO["blue"]))
    return p


THEMES = ("system", "light", "dark")


def apply_theme(mode: str) -> None:
    """Set the application palette: "light", "dark", or "system" (follow the platform's colour scheme;
    the window re-applies it when the platform reports a change)."""
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if mode == "system":
        dark = QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark
    else:
        dark = mode == "dark"
    app.setPalette(dark_palette() if dark else light_palette())

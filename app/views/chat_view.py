"""The conversation, painted token by token by how each token was made.

`ChatView` keeps a small model of the conversation (user texts; each reply as its list of RoundEvents)
and renders it into a read-only QTextDocument. Rounds arrive through `feed()` (cheap: a list append) and
are painted by `flush()`, which the window calls from its repaint timer, so the engine's rate never
drives the paint rate. Hiding rejected drafts or a palette change re-renders the whole model.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from PySide6.QtCore import QEvent, QMimeData, QObject, QPoint, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextFormat,
    QTextFrameFormat,
)
from PySide6.QtWidgets import QTextEdit, QToolTip, QWidget

from app.views.fences import FenceTracker
from app.views.theme import OKABE_ITO, TokenColours, mix, token_colours
from app.views.tokens import DISCARDED, PROVISIONAL, REJECTED, TokenInfo, token_tooltip, visible
from engine.api.events import Origin, RoundEvent

TOKEN_PROP = int(QTextFormat.Property.UserProperty) + 1  # int: index into ChatView.infos
REJECTED_PROP = int(QTextFormat.Property.UserProperty) + 2  # bool: left out of copies
SOFT_BREAK_PROP = int(QTextFormat.Property.UserProperty) + 3  # bool: a break opportunity added here, not text

# Qt's line breaking costs the square of a paragraph's longest run without a break opportunity (a 256 KB token
# froze the window for 12 s, a pasted 1 MB line for minutes). Every RUN_LIMIT characters without whitespace get
# a zero-width space, which lets a line break there and is left out of copies; at this length a run still wraps
# at the window's edge as before (a line holds ~100 characters), so ordinary text looks the same.
RUN_LIMIT = 200
SOFT_BREAK = "\u200b"
_SPACE = re.compile(r"\s")
_LAST_SPACE = re.compile(r"\s\S*\Z")


@functools.cache
def _long_run(limit: int) -> re.Pattern[str]:
    return re.compile(r"\S{%d,}" % (limit + 1))


def break_points(text: str, run: int, limit: int = RUN_LIMIT) -> tuple[list[int], int]:
    """Where in `text` a soft break goes so that no run without whitespace exceeds `limit`, given that the text
    before it ended with a run of `run` characters; and the run `text` ends with once they are in."""
    points: list[int] = []
    first = _SPACE.search(text)
    head = first.start() if first else len(text)
    points.extend(range(max(limit - run, 0), head, limit))  # the run the text continues
    if first is None:
        return points, (len(text) - points[-1] if points else run + len(text))
    for m in _long_run(limit).finditer(text, head):
        points.extend(range(m.start() + limit, m.end(), limit))
    tail = _LAST_SPACE.search(text).start() + 1  # just past the last whitespace
    return points, len(text) - max([tail, *points[-1:]])


@dataclass
class _Turn:
    role: str  # "user" or "assistant"
    text: str = ""  # the user's message
    title: str | None = None  # header line; None: no header
    rounds: list[RoundEvent] = field(default_factory=list)
    rendered: int = 0  # rounds painted so far
    footer: str | None = None
    tail: str = ""  # text the reply ended with that no round carried (stop-string text released at a cancel)
    footer_rendered: bool = False
    fence: FenceTracker = field(default_factory=FenceTracker)
    run: int = 0  # characters since the last break opportunity at the reply's end (see RUN_LIMIT)


class ChatView(QTextEdit):
    """Read-only, selectable transcript. Copying leaves struck-through drafts out. A click on a token (not the
    end of a selection) emits tokenClicked(TokenInfo)."""

    tokenClicked = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.setUndoRedoEnabled(False)
        self.setPlaceholderText("Ask something. Each token of the reply is coloured by how it was made.")
        self.setCursorWidth(0)  # read-only: no caret, though the keyboard can still select
        self.document().setDocumentMargin(14)
        body = self.font()
        body.setPointSizeF(body.pointSizeF() * 1.12)
        self.document().setDefaultFont(body)
        self.turns: list[_Turn] = []
        self.infos: list[TokenInfo] = []
        self._show_rejected = True
        self._mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self._colours = token_colours(self.palette())
        self._formats: dict[tuple[str, bool], QTextCharFormat] = {}
        self._build_formats()
        self.viewport().installEventFilter(self)
        self._follow = True  # keep the end in view as the document grows, until the user scrolls up
        self._provisional: list[tuple[str, str]] = []  # step-through: (text, kind) shown after the reply
        self._provisional_span: tuple[int, int] | None = None  # where they sit in the document
        self.verticalScrollBar().valueChanged.connect(self._on_value)
        self.verticalScrollBar().rangeChanged.connect(self._on_range)

    # ---- model -------------------------------------------------------------------------------------------
    def add_user(self, text: str) -> None:
        self.flush()
        turn = _Turn("user", text=text, title="You")
        self.turns.append(turn)
        self._render_turn(turn)
        self._follow = True  # the message just sent is what the user looks at, and the reply follows it
        self._on_range()

    def begin_assistant(self, title: str | None = "Assistant") -> None:
        self.flush()
        turn = _Turn("assistant", title=title)
        self.turns.append(turn)
        self._render_turn(turn)

    def _on_value(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 8

    def _on_range(self, *_: int) -> None:
        """The document grew (Qt lays long documents out in the background, so this comes when it is done):
        stay at the end while the user has not scrolled away from it."""
        if self._follow:
            bar = self.verticalScrollBar()
            bar.setValue(bar.maximum())

    def feed(self, event: RoundEvent) -> None:
        """Queue a round of the current reply; painted at the next flush()."""
        self._current().rounds.append(event)

    def finish(self, footer: str, tail: str = "") -> None:
        """End the current reply with `tail` (plain text no round carried) and a muted meta line (painted at the
        next flush())."""
        turn = self._current()
        turn.footer, turn.tail = footer, tail

    def withdraw_unanswered(self) -> str | None:
        """Take back the last message when its reply never began (the engine refused the message), so the chat
        does not show it as sent; returns its text. None (and nothing changes) once the reply has any round."""
        if len(self.turns) < 2 or self.turns[-1].role != "assistant" or self.turns[-1].rounds \
                or self.turns[-2].role != "user":
            return None
        self.turns.pop()
        text = self.turns.pop().text
        self._rebuild()
        return text

    def clear_chat(self) -> None:
        self.turns.clear()
        self._rebuild()

    @property
    def pending(self) -> bool:
        t = self.turns[-1] if self.turns else None
        return t is not None and (t.rendered < len(t.rounds) or (t.footer is not None and not t.footer_rendered))

    def flush(self, limit: int | None = None) -> int:
        """Paint queued rounds (at most `limit` of them: a bound on this call's layout work; the rest wait for
        the next call); returns how many."""
        if not self.pending:
            return 0
        self.clear_provisional()  # real rounds take its place
        turn = self.turns[-1]
        n = len(turn.rounds) - turn.rendered if limit is None else min(limit, len(turn.rounds) - turn.rendered)
        cursor = self._end_cursor()
        cursor.beginEditBlock()
        self._render_rounds(cursor, turn, n)
        if turn.rendered == len(turn.rounds):
            self._render_footer(cursor, turn)
        cursor.endEditBlock()
        return n

    def reply_text(self, index: int = -1) -> str:
        """The committed text of an assistant turn (rejected drafts excluded)."""
        replies = [t for t in self.turns if t.role == "assistant"]
        return "".join(ev.text_delta for ev in replies[index].rounds) if replies else ""

    # ---- step-through: a round shown before it is committed ------------------------------------------------
    def show_provisional(self, pieces: list[tuple[str, str]]) -> None:
        """Show (text, kind) pieces after the reply, replacing any shown before. kind: PROVISIONAL (drafted, not yet
        decided), an Origin value, REJECTED or DISCARDED. They are no part of the reply or its copies: the next
        painted round, or clear_provisional(), removes them."""
        self.flush()
        self.clear_provisional()
        self._provisional = list(pieces)
        mono = bool(self.turns) and self.turns[-1].fence.in_code
        cursor = self._end_cursor()
        start = cursor.position()
        cursor.beginEditBlock()
        for text, kind in pieces:
            fmt = QTextCharFormat(self._formats[(kind, mono)])
            fmt.setProperty(REJECTED_PROP, True)  # never copied
            if kind != REJECTED and kind != DISCARDED:
                fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DotLine)  # still only a proposal on screen
            cursor.insertText(visible(text) if not text.strip() else text.replace("\n", "\u21b5"), fmt)
        cursor.endEditBlock()
        self._provisional_span = (start, cursor.position())

    def clear_provisional(self) -> None:
        span, self._provisional_span, self._provisional = self._provisional_span, None, []
        if span is None:
            return
        cursor = QTextCursor(self.document())
        end = min(span[1], self.document().characterCount() - 1)
        cursor.setPosition(min(span[0], end))
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()

    @property
    def provisional_text(self) -> str:
        span = self._provisional_span
        if span is None:
            return ""
        cursor = QTextCursor(self.document())
        cursor.setPosition(span[0])
        cursor.setPosition(span[1], QTextCursor.MoveMode.KeepAnchor)
        return cursor.selectedText()

    # ---- options -------------------------------------------------------------------------------------------
    @property
    def show_rejected(self) -> bool:
        return self._show_rejected

    def set_show_rejected(self, show: bool) -> None:
        if show != self._show_rejected:
            self._show_rejected = show
            self._rebuild()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._colours = token_colours(self.palette())
            self._build_formats()
            self._rebuild()

    # ---- hover + copy --------------------------------------------------------------------------------------
    def token_info_at_position(self, pos: int) -> TokenInfo | None:
        """The token painted at document position `pos`, if any."""
        if not 0 <= pos < self.document().characterCount() - 1:
            return None
        cursor = QTextCursor(self.document())
        cursor.setPosition(pos)
        if cursor.atBlockEnd():
            return None
        cursor.movePosition(QTextCursor.MoveOperation.NextCharacter)  # charFormat() is the char before
        fmt = cursor.charFormat()
        if not fmt.hasProperty(TOKEN_PROP):
            return None
        key = fmt.intProperty(TOKEN_PROP)
        return self.infos[key] if 0 <= key < len(self.infos) else None

    def token_info_at(self, point: QPoint) -> TokenInfo | None:
        """The token under a viewport point, if any."""
        doc_point = point + QPoint(self.horizontalScrollBar().value(), self.verticalScrollBar().value())
        pos = self.document().documentLayout().hitTest(doc_point, Qt.HitTestAccuracy.ExactHit)
        return self.token_info_at_position(pos)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        """Token tooltips. An event filter rather than a viewportEvent override: the viewport's paint events
        then run in C++ without a detour through Python, so painting never holds the GIL that the engine's reader thread
        (app/host.py) needs to pass on the next round."""
        if obj is self.viewport() and event.type() == QEvent.Type.ToolTip:
            info = self.token_info_at(event.pos())
            if info is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(event.globalPos(), token_tooltip(info), self.viewport())
            return True
        if (obj is self.viewport() and event.type() == QEvent.Type.MouseButtonRelease
                and event.button() == Qt.MouseButton.LeftButton and not self.textCursor().hasSelection()):
            info = self.token_info_at(event.position().toPoint())
            if info is not None:
                self.tokenClicked.emit(info)
        return super().eventFilter(obj, event)

    def createMimeDataFromSelection(self) -> QMimeData:
        cursor = self.textCursor()
        start, end = cursor.selectionStart(), cursor.selectionEnd()
        parts: list[str] = []
        block = self.document().findBlock(start)
        first = True
        while block.isValid() and block.position() <= end:
            if not first:
                parts.append("\n")
            first = False
            it = block.begin()
            while not it.atEnd():
                frag = it.fragment()
                lo, hi = max(frag.position(), start), min(frag.position() + frag.length(), end)
                fmt = frag.charFormat()
                if lo < hi and not fmt.boolProperty(REJECTED_PROP) and not fmt.boolProperty(SOFT_BREAK_PROP):
                    parts.append(frag.text()[lo - frag.position():hi - frag.position()])
                it += 1
            block = block.next()
        # Qt's own mime object, not one made here: the clipboard keeps it past the interpreter's exit, and a
        # Python-made QMimeData is then destroyed through a dead interpreter (a segfault on quit after a copy).
        mime = super().createMimeDataFromSelection()
        mime.text()  # it fills its formats lazily from the selection, on first read: do that now, then replace them
        for fmt in mime.formats():  # text/html would bring the rejected drafts back
            mime.removeFormat(fmt)
        mime.setText("".join(parts))
        return mime

    # ---- painting ------------------------------------------------------------------------------------------
    def _current(self) -> _Turn:
        if not self.turns or self.turns[-1].role != "assistant":
            raise RuntimeError("no reply in progress: call begin_assistant() first")
        return self.turns[-1]

    def _end_cursor(self) -> QTextCursor:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        return cursor

    def _build_formats(self) -> None:
        c: TokenColours = self._colours
        self._formats.clear()
        for mono in (False, True):
            for origin in Origin:
                f = QTextCharFormat()
                f.setBackground(c.tint[origin])
                f.setForeground(c.text)
                self._formats[(origin.value, mono)] = f
            for kind, colour in ((REJECTED, c.rejected), (DISCARDED, QColor(c.muted))):
                f = QTextCharFormat()
                f.setForeground(colour)
                f.setFontStrikeOut(True)
                f.setProperty(REJECTED_PROP, True)
                self._formats[(kind, mono)] = f
            plain = QTextCharFormat()
            plain.setForeground(c.text)
            self._formats[("text", mono)] = plain
            proposed = QTextCharFormat()  # step-through: drafted, not yet verified
            proposed.setForeground(c.text)
            proposed.setBackground(mix(c.base, QColor(OKABE_ITO["yellow"]), 0.45 if c.dark else 0.35))
            self._formats[(PROVISIONAL, mono)] = proposed
            if mono:
                for f in (v for (k, m), v in self._formats.items() if m):
                    f.setFontFamilies([self._mono.family()])
                    f.setFontFixedPitch(True)
        self._body_block = QTextBlockFormat()
        self._body_block.setLineHeight(125, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value)
        self._code_block = QTextBlockFormat(self._body_block)
        self._code_block.setBackground(c.code_bg)
        self._code_block.setLeftMargin(8)
        self._code_block.setLineHeight(115, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value)
        self._header_block = QTextBlockFormat()
        self._header_block.setTopMargin(14)
        self._header_block.setBottomMargin(4)
        self._header_char = QTextCharFormat()
        self._header_char.setFontWeight(QFont.Weight.DemiBold)
        self._header_char.setForeground(c.muted)
        self._footer_block = QTextBlockFormat()
        self._footer_block.setTopMargin(6)
        self._footer_char = QTextCharFormat()
        self._footer_char.setForeground(c.muted)
        self._footer_char.setFontPointSize(max(7.0, self.font().pointSizeF() * 0.85))
        self._user_frame = QTextFrameFormat()
        self._user_frame.setBackground(c.user_bg)
        self._user_frame.setPadding(10)
        self._user_frame.setBorder(0)
        self._user_frame.setTopMargin(2)

    def _rebuild(self) -> None:
        self.document().clear()
        self.infos.clear()
        self._provisional_span = None
        cursor = self._end_cursor()
        cursor.beginEditBlock()
        for turn in self.turns:
            turn.rendered, turn.footer_rendered, turn.fence, turn.run = 0, False, FenceTracker(), 0
            self._render_turn(turn, cursor)
            self._render_rounds(cursor, turn)
            self._render_footer(cursor, turn)
        cursor.endEditBlock()
        if self._provisional:
            self.show_provisional(self._provisional)

    def _new_block(self, cursor: QTextCursor, block: QTextBlockFormat, char: QTextCharFormat) -> None:
        """Start a block at the end, reusing an empty last block (the document's first, or the one Qt
        keeps after a frame)."""
        if cursor.block().length() <= 1:
            cursor.setBlockFormat(block)
            cursor.setBlockCharFormat(char)
        else:
            cursor.insertBlock(block, char)

    def _render_turn(self, turn: _Turn, cursor: QTextCursor | None = None) -> None:
        if cursor is None:  # one edit: the document is laid out once, not after each piece of a long message
            cursor = self._end_cursor()
            cursor.beginEditBlock()
            try:
                self._render_turn(turn, cursor)
            finally:
                cursor.endEditBlock()
            return
        if turn.title is not None:
            self._new_block(cursor, self._header_block, self._header_char)
            cursor.insertText(turn.title, self._header_char)
        if turn.role == "user":
            frame = cursor.insertFrame(self._user_frame)
            inner = frame.firstCursorPosition()
            inner.setBlockFormat(self._body_block)
            for i, line in enumerate(turn.text.split("\n")):
                if i:
                    inner.insertBlock(self._body_block)
                self._put(inner, line, self._formats[("text", False)], 0)
            cursor.movePosition(QTextCursor.MoveOperation.End)
        else:
            self._new_block(cursor, self._body_block, self._formats[("text", False)])

    def _render_footer(self, cursor: QTextCursor, turn: _Turn) -> None:
        if turn.footer is None or turn.footer_rendered:
            return
        turn.footer_rendered = True
        if turn.tail:
            turn.run = self._put(cursor, turn.tail, self._formats[("text", False)], turn.run)
        cursor.insertBlock(self._footer_block, self._footer_char)
        self._put(cursor, turn.footer, self._footer_char, 0)

    def _render_rounds(self, cursor: QTextCursor, turn: _Turn, limit: int | None = None) -> None:
        end = len(turn.rounds) if limit is None else turn.rendered + limit
        for ev in turn.rounds[turn.rendered:end]:
            self._render_round(cursor, turn, ev)
        turn.rendered = min(end, len(turn.rounds))

    def _render_round(self, cursor: QTextCursor, turn: _Turn, ev: RoundEvent) -> None:
        accepted = [c for c in ev.committed if c.origin == Origin.ACCEPTED]
        final = [c for c in ev.committed if c.origin != Origin.ACCEPTED]
        for tok in accepted:
            self._insert(cursor, turn, tok.text, TokenInfo(tok.origin.value, ev.round, tok.index, tok.token_id,
                                                           tok.text, tok.p, tok.q, ev))
        if self._show_rejected:
            for i, d in enumerate(ev.drafted):
                if not d.accepted:
                    kind = REJECTED if i == ev.accepted else DISCARDED
                    self._insert(cursor, turn, d.text, TokenInfo(kind, ev.round, i, d.token_id, d.text, d.p, d.q, ev))
        for tok in final:
            self._insert(cursor, turn, tok.text, TokenInfo(tok.origin.value, ev.round, tok.index, tok.token_id,
                                                           tok.text, tok.p, tok.q, ev))

    def _put(self, cursor: QTextCursor, text: str, fmt: QTextCharFormat, run: int) -> int:
        """Insert text, with a soft break (left out of copies) wherever a run without whitespace would pass
        RUN_LIMIT; `run`: the run the text continues. Returns the run it ends with."""
        if run + len(text) <= RUN_LIMIT:  # nearly always: a token, a line of a message
            cursor.insertText(text, fmt)
            last = _LAST_SPACE.search(text)
            return run + len(text) if last is None else len(text) - last.start() - 1
        points, end_run = break_points(text, run)
        if not points:
            cursor.insertText(text, fmt)
            return end_run
        soft = QTextCharFormat(fmt)
        soft.setProperty(SOFT_BREAK_PROP, True)
        at = 0
        for p in points:
            if p > at:
                cursor.insertText(text[at:p], fmt)
            cursor.insertText(SOFT_BREAK, soft)
            at = p
        if at < len(text):
            cursor.insertText(text[at:], fmt)
        return end_run

    def _token_format(self, kind: str, mono: bool, key: int) -> QTextCharFormat:
        fmt = QTextCharFormat(self._formats[(kind, mono)])
        fmt.setProperty(TOKEN_PROP, key)
        return fmt

    def _insert(self, cursor: QTextCursor, turn: _Turn, text: str, info: TokenInfo) -> None:
        if not text:
            return
        key = len(self.infos)
        self.infos.append(info)
        if info.kind in (REJECTED, DISCARDED):  # drafts never change the fence state or break lines
            turn.run = self._put(cursor, visible(text) if text.strip() == "" else text.replace("\n", "\u21b5"),
                                 self._token_format(info.kind, turn.fence.in_code, key), turn.run)
            return
        for step in turn.fence.feed(text):
            if step[0] == "text":
                turn.run = self._put(cursor, step[1], self._token_format(info.kind, step[2], key), turn.run)
            elif step[0] == "newline":
                cursor.insertBlock(self._code_block if turn.fence.in_code else self._body_block)
                turn.run = 0
            elif step[0] == "open":
                cursor.setBlockFormat(self._code_block)

"""One sequence's new tokens as text, given out piece by piece as they come.

Each token is decoded with the few tokens before it (decoding one token alone
loses what it shares with its neighbours: a byte of a UTF-8 character, the
space a SentencePiece token carries), and a piece is given out only when it
ends in whole characters. Text that could be the start of a stop string is
held back until it is clear it is not one; when a stop string appears, the
text ends before it, and the stream says it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TextStream:
    """``add`` each new token; it returns the text that may be shown now."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.ids: list[int] = []
        self.text = ""  # the decoded text so far, whole characters only
        self.shown = 0  # characters of it given out
        self.stopped: str | None = None  # the stop string found
        self._prefix = self._read = 0  # ids[prefix:read] decode to text's tail

    def add(self, token: int) -> str:
        """The newly showable text after ``token`` ('' while held back, or once stopped)."""
        if self.stopped is not None:
            return ""
        self.ids.append(int(token))
        decode = self.tokenizer.decode
        before = decode(self.ids[self._prefix : self._read])
        now = decode(self.ids[self._prefix :])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self.text += now[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
        return self._showable()

    def _showable(self) -> str:
        end = len(self.text)
        if self.stop:
            # a stop string may begin in text already shown: search from where it could start
            start = max(0, self.shown - max(map(len, self.stop)) + 1)
            hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                end, self.stopped = min(hits)
                self.text = self.text[:end]
            else:
                end -= self._held(self.text)
        piece = self.text[self.shown : max(end, self.shown)]
        self.shown += len(piece)
        return piece

    def _held(self, text: str) -> int:
        """The length of text's longest tail that begins some stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def finish(self, final: str | None = None) -> str:
        """What is left to show at the end: the held-back tail, and where ``final`` (the
        whole decode) extends what was shown, the rest of it."""
        if final is not None and self.stopped is None and final.startswith(self.text[: self.shown]):
            self.text = final
        piece = self.text[self.shown :]
        self.shown = len(self.text)
        return piece

"""Keeping the real API key out of everything the proxy hands back to a sandbox.

Redaction works on what a client will see, not on bytes: an upstream that echoes the key may
send it JSON-escaped (`\\u0073\\u006b...`), inside a JSON string that itself holds JSON (a tool
call's arguments), or split across the deltas of a stream (two `content` deltas, two argument
deltas of one tool call) that the client joins. So:

- a JSON body is masked in its decoded strings (and in JSON nested in them), then encoded again;
- an event stream is parsed into events, each event's decoded strings are appended to the text
  of their *channel* (a choice's content, a tool call's arguments, a content block: what a client
  concatenates), and an event is held back while the end of one of its channels could still be
  the start of the key, so a key split across events is masked before any part of it leaves;
- any other body is masked as text;
- what still shows the key after masking, read through the escapes a client might decode
  (JSON `\\u`, percent-encoding, HTML entities), is refused, never passed.

"The key" here is any run of `run` (12) or more consecutive characters of it: an echo that
quotes part of a key still gives part of a key away. Pure and stdlib only (the proxy image runs it
in mitmproxy's own venv).
"""

from __future__ import annotations

import html
import json
import re
from typing import Any, Callable
from urllib.parse import unquote

REDACTED = "<carc:redacted-key>"
RUN = 12  # the shortest part of the key that counts as the key
HOLD_INSIDE = 4  # a stream's tail this long from the key's middle waits for the next event
# Fields of a stream event (or of an element of one of its lists) that say which choice, tool
# call, content block or output item its strings belong to.
CHANNEL_IDS = ("index", "output_index", "content_index", "item_id", "choice_index")
_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})|\\(.)", re.S)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


class KeyLeak(Exception):
    """A body shows the key in a form that could not be masked in place: it must be withheld."""


class KeyMask:
    """Finds and masks the runs of the key in text."""

    def __init__(self, key: str, run: int = RUN) -> None:
        self.key = key
        self.run = min(run, len(key))
        self.grams = sorted({key[i:i + self.run] for i in range(len(key) - self.run + 1)})
        self.byte_grams = [g.encode() for g in self.grams]
        # Every run holds one of these shorter pieces (one starts in every `step` positions of
        # the key): text without any of them is passed over with a few searches, not one per gram.
        size = max(1, self.run // 2)
        step = self.run - size + 1
        self.anchors = sorted({key[j:j + size] for j in range(0, len(key) - size + 1, step)})
        self.byte_anchors = [a.encode() for a in self.anchors]
        # for each character, the lengths of the key's beginnings that end in it (risky_tail)
        self.prefix_ends: dict[str, list[int]] = {}
        for length in range(len(key) - 1, 0, -1):
            self.prefix_ends.setdefault(key[length - 1], []).append(length)

    def mask(self, length: int) -> str:
        """What stands for `length` characters of the key: REDACTED cut or padded to it."""
        return (REDACTED + "*" * length)[:length]

    def spans(self, text: str) -> list[tuple[int, int]]:
        """The runs of the key in `text`, as merged [start, end) spans: as written, and as a
        client reads them through backslash escapes (`\\u0073\\u006b...`, the whole escape
        sequence being the span)."""
        marks = self._plain_spans(text)
        if "\\" in text:
            decoded, starts, ends = unescape_map(text)
            if decoded != text:
                marks += [(starts[a], ends[b - 1]) for a, b in self._plain_spans(decoded)]
        return merge(marks)

    def _plain_spans(self, text: str) -> list[tuple[int, int]]:
        if len(text) < self.run or not any(anchor in text for anchor in self.anchors):
            return []
        marks: list[tuple[int, int]] = []
        for gram in self.grams:
            at = text.find(gram)
            while at >= 0:
                marks.append((at, at + self.run))
                at = text.find(gram, at + 1)
        return marks

    def risky_tail(self, text: str) -> int:
        """How many of the last characters of `text` could begin a run still to come, so must
        wait for what follows: a suffix that begins the key, or a suffix of at least
        HOLD_INSIDE characters that is part of it (shorter pieces of the key's middle pass: a run
        cut there still leaves a run on one side), as written or through backslash escapes; an
        escape cut off at the end counts whole."""
        risky = self._plain_risky(text)
        window = text[-6 * len(self.key):]
        if "\\" in window:
            cut = window.rfind("\\")
            if len(window) - cut <= 6:  # perhaps an escape whose rest is still to come
                risky = max(risky, len(window) - cut)
            decoded, starts, _ = unescape_map(window)
            tail = self._plain_risky(decoded)
            if tail:
                risky = max(risky, len(window) - starts[len(decoded) - tail])
        return risky

    def _plain_risky(self, text: str) -> int:
        if not text:
            return 0
        for length in self.prefix_ends.get(text[-1], ()):  # longest first
            if length <= len(text) and text.endswith(self.key[:length]):
                return max(length, self._inside_risky(text))
        return self._inside_risky(text)

    def _inside_risky(self, text: str) -> int:
        for length in range(min(self.run - 1, len(text)), HOLD_INSIDE - 1, -1):
            if text[-length:] in self.key:
                return length
        return 0

    def text(self, text: str) -> str:
        out, last = [], 0
        for start, end in self.spans(text):
            out += [text[last:start], self.mask(end - start)]
            last = end
        return "".join(out + [text[last:]]) if out else text

    def bytes(self, data: bytes) -> bytes:
        """`text` on bytes, without decoding them (headers, raw journal files)."""
        if len(data) < self.run or not any(anchor in data for anchor in self.byte_anchors):
            return data
        marks: list[tuple[int, int]] = []
        for gram in self.byte_grams:
            at = data.find(gram)
            while at >= 0:
                marks.append((at, at + self.run))
                at = data.find(gram, at + 1)
        out, last = bytearray(), 0
        for start, end in merge(marks):
            out += data[last:start] + self.mask(end - start).encode()
            last = end
        return bytes(out + data[last:])

    def shows(self, text: str) -> bool:
        """Whether `text` shows a run of the key as it is or through an escape a client may
        decode (JSON/Python backslash escapes, percent-encoding, HTML entities)."""
        views = [text]
        if "\\" in text:
            views.append(unescape(text))
        if "%" in text:
            views.append(unquote(text))
        if "&" in text:
            views.append(html.unescape(text))
        return any(gram in view for view in views for gram in self.grams)

    def json(self, value: Any) -> tuple[Any, bool]:
        """`value` (decoded JSON) with the key masked in every string, key and nested JSON text;
        and whether anything changed."""
        if isinstance(value, str):
            return self._string(value)
        if isinstance(value, list):
            changed = False
            items = []
            for item in value:
                item, hit = self.json(item)
                items.append(item)
                changed |= hit
            return (items, True) if changed else (value, False)
        if isinstance(value, dict):
            changed = False
            fields = {}
            for name, item in value.items():
                name, hit_name = self._string(name)
                item, hit = self.json(item)
                fields[name] = item
                changed |= hit_name or hit
            return (fields, True) if changed else (value, False)
        return value, False

    def _string(self, value: str) -> tuple[str, bool]:
        original = value
        stripped = value.strip()
        if stripped[:1] in ("{", "[") and len(stripped) > self.run:  # a tool call's arguments
            try:
                inner = json.loads(stripped)
            except ValueError:
                inner = None
            if isinstance(inner, (dict, list)):
                inner, hit = self.json(inner)
                if hit:
                    value = json.dumps(inner, ensure_ascii=False)
        masked = self.text(value)
        return masked, masked != original


def merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def unescape_map(text: str) -> tuple[str, list[int], list[int]]:
    """`unescape(text)`, and for each decoded character the [start, end) of what spelled it."""
    decoded: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    at = 0
    for match in _ESCAPE.finditer(text):
        for position in range(at, match.start()):
            decoded.append(text[position])
            starts.append(position)
            ends.append(position + 1)
        decoded.append(_one(match))
        starts.append(match.start())
        ends.append(match.end())
        at = match.end()
    for position in range(at, len(text)):
        decoded.append(text[position])
        starts.append(position)
        ends.append(position + 1)
    return "".join(decoded), starts, ends


def _one(match: re.Match) -> str:
    if match.group(1) or match.group(2):
        return chr(int(match.group(1) or match.group(2), 16))
    return _SIMPLE_ESCAPES.get(match.group(3), match.group(3))


def unescape(text: str) -> str:
    """Backslash escapes decoded the way a JSON or Python string would be; others kept."""
    return _ESCAPE.sub(_one, text)


def redact_body(mask: KeyMask, content: bytes, event_stream: bool) -> bytes:
    """A whole (decoded) body as a client may see it, with the key masked; raises KeyLeak when
    the key would still show."""
    if event_stream:
        stream = StreamRedactor(mask)
        out = stream.feed(content) + stream.flush()
        if stream.withheld:
            raise KeyLeak(stream.withheld)
        return out
    if not any(gram in content for gram in mask.byte_grams) and b"\\" not in content \
            and b"%" not in content and b"&" not in content:
        return content  # the common case: nothing that could hold or spell the key
    text = content.decode("utf-8", errors="surrogateescape")
    try:
        value = json.loads(text)
    except ValueError:
        value = None
        out = mask.text(text)
    else:
        value, changed = mask.json(value)
        out = json.dumps(value, ensure_ascii=False) if changed else text
    if ("%" in out or "&" in out) and mask.shows(out):
        raise KeyLeak("the body shows the API key in an encoded form that could not be masked")
    return out.encode("utf-8", errors="surrogateescape")


class _Leaf:
    """One decoded string of a held event: where it sits in its channel and how to set it."""

    def __init__(self, channel: "_Channel", start: int, text: str, put: Callable[[str], None]) -> None:
        self.channel, self.start, self.text, self.put = channel, start, text, put

    @property
    def end(self) -> int:
        return self.start + len(self.text)


class _Channel:
    """The text a client joins from one place of a stream's events (a choice's content, a tool
    call's arguments...), key unmasked, from `base` on (what lies further back can no longer be
    part of a run that reaches a held event)."""

    def __init__(self, name: tuple) -> None:
        self.name, self.base, self.text, self.released = name, 0, "", 0
        self.masked_to = 0  # the end of the last run masked: what follows it is masked as it comes

    @property
    def end(self) -> int:
        return self.base + len(self.text)

    def since(self, offset: int) -> str:
        return self.text[max(0, offset - self.base):]


class _Event:
    def __init__(self, raw: str) -> None:
        self.raw = raw  # as received, event separator included
        self.lines: list[str] = []  # the non-data lines, masked as text
        self.data: Any = None  # the decoded data: JSON, or text
        self.json = False
        self.leaves: list[_Leaf] = []
        self.dirty = False

    def render(self) -> str:
        if not self.dirty:
            return self.raw
        ending = self.raw[len(self.raw.rstrip("\r\n")):]
        data = json.dumps(self.data, ensure_ascii=False) if self.json else self.data
        body = self.lines + [f"data: {line}" for line in data.split("\n")]
        return "\n".join(body) + (ending if ending in ("\n\n", "\r\n\r\n", "\r\r") else "\n\n")


_SEPARATOR = re.compile(r"\r\n\r\n|\n\n|\r\r")


class StreamRedactor:
    """Masks the key in an event stream as it passes (see the module's docstring).

    `feed` takes the stream's chunks and returns what may be passed on now; `flush` (at the end)
    returns the rest. Events that carry no part of a possible key pass at once, in order; an event
    whose channel ends in what could begin the key waits for the next event of that channel.
    A stream that shows the key in a form that cannot be masked in place (percent-encoded, HTML
    entities) is cut: an error event goes out instead, and nothing more (`withheld` says why)."""

    def __init__(self, mask: KeyMask) -> None:
        self.mask = mask
        self.buffer = ""
        self.pending = b""  # the first bytes of a UTF-8 character split across chunks
        self.held: list[_Event] = []
        self.channels: dict[tuple, _Channel] = {}
        self.withheld: str | None = None

    def feed(self, data: bytes) -> bytes:
        if self.withheld:
            return b""
        data = self.pending + data
        cut = len(data)
        while cut > 0 and len(data) - cut < 3 and data[cut - 1] & 0xC0 == 0x80:
            cut -= 1  # continuation bytes at the end: their lead byte may be just before
        if cut > 0 and data[cut - 1] >= 0xC0:  # a lead byte whose continuation is still to come
            cut -= 1
        else:
            cut = len(data)
        self.pending = data[cut:]
        self.buffer += data[:cut].decode("utf-8", errors="surrogateescape")
        out: list[str] = []
        while (found := _SEPARATOR.search(self.buffer)) is not None:
            raw, self.buffer = self.buffer[:found.end()], self.buffer[found.end():]
            self._take(_Event(raw))
            if self.withheld:
                return self._cut("".join(out))
            out.append(self._release(final=False))
        return "".join(out).encode("utf-8", errors="surrogateescape")

    def flush(self) -> bytes:
        if self.withheld:
            return b""
        tail = self.buffer + self.pending.decode("utf-8", errors="surrogateescape")
        self.buffer, self.pending = "", b""
        if tail:
            self._take(_Event(tail))
            if self.withheld:
                return self._cut("")
        return self._release(final=True).encode("utf-8", errors="surrogateescape")

    # --- internals -------------------------------------------------------------------------

    def _cut(self, passed: str) -> bytes:
        notice = {"error": {"message": f"carc proxy withheld the rest of this stream: {self.withheld}",
                            "type": "carc_proxy_withheld"}}
        self.held = []
        return (passed + "event: error\ndata: " + json.dumps(notice) + "\n\n").encode(
            "utf-8", errors="surrogateescape")

    def _take(self, event: _Event) -> None:
        data_lines = []
        for line in event.raw.rstrip("\r\n").replace("\r\n", "\n").replace("\r", "\n").split("\n"):
            field, _, value = line.partition(":")
            if field == "data":
                data_lines.append(value[1:] if value.startswith(" ") else value)
            elif line:
                event.lines.append(line)
        masked = [self.mask.text(line) for line in event.lines]
        if masked != event.lines:
            event.lines, event.dirty = masked, True
        if data_lines:
            event.data = "\n".join(data_lines)
            try:
                event.data, event.json = json.loads(event.data), True
            except ValueError:
                pass
            if event.json and not isinstance(event.data, str):
                self._leaves(event, event.data, ())
            else:  # text data ([DONE], a JSON string, anything else): a channel of its own
                def put(text: str, event=event) -> None:
                    event.data = text
                self._add(event, ("data",), event.data, put)
        self.held.append(event)
        for channel in {leaf.channel for leaf in event.leaves}:
            self._mask(channel)

    def _leaves(self, event: _Event, value: Any, channel: tuple) -> None:
        if isinstance(value, dict):
            ids = tuple((name, value[name]) for name in CHANNEL_IDS
                        if isinstance(value.get(name), (int, str)) and not isinstance(value.get(name), bool))
            for name in list(value):
                masked = self.mask.text(name)
                if masked != name:  # the key as a field's name: masked where it stands
                    value[masked] = value.pop(name)
                    event.dirty = True
                item = value[masked]
                if isinstance(item, str):
                    def put(text: str, parent=value, slot=masked) -> None:
                        parent[slot] = text
                    self._add(event, channel + ids + (masked,), item, put)
                else:
                    self._leaves(event, item, channel + ids + (masked,))
        elif isinstance(value, list):
            for position, item in enumerate(value):
                where = item.get("index", position) if isinstance(item, dict) else position
                if isinstance(item, str):
                    def put(text: str, parent=value, slot=position) -> None:
                        parent[slot] = text
                    self._add(event, channel + (("#", where),), item, put)
                else:
                    self._leaves(event, item, channel + (("#", where),))

    def _add(self, event: _Event, name: tuple, text: str, put: Callable[[str], None]) -> None:
        channel = self.channels.get(name)
        if channel is None:
            channel = self.channels[name] = _Channel(name)
        event.leaves.append(_Leaf(channel, channel.end, text, put))
        channel.text += text

    def _mask(self, channel: _Channel) -> None:
        """Mask the runs of the key that reach the held part of the channel (escaped forms
        included, which may be six characters a character)."""
        # a run reaching the held part starts at most a key's length before it; an escaped one,
        # six characters a character
        back = len(self.mask.key)
        if "\\" in channel.since(channel.released - 6 * back):
            back *= 6
        origin = max(channel.base, channel.released - back)
        leaves = [leaf for event in self.held for leaf in event.leaves if leaf.channel is channel]
        for start, end in self.mask.spans(channel.since(origin)):
            start, end = start + origin, end + origin
            channel.masked_to = max(channel.masked_to, end)
            if end <= channel.released:
                continue
            cover = self.mask.mask(end - start)
            for leaf in leaves:
                low, high = max(start, leaf.start), min(end, leaf.end)
                if low < high:
                    leaf.text = (leaf.text[:low - leaf.start] + cover[low - start:high - start]
                                 + leaf.text[high - leaf.start:])
                    leaf.put(leaf.text)
                    self._dirty(leaf)
        window = channel.since(origin)
        if ("%" in window or "&" in window) and self.mask.shows(self.mask.text(window)):
            self.withheld = f"the API key shows encoded in the stream's {describe(channel.name)}"

    def _dirty(self, leaf: _Leaf) -> None:
        for event in self.held:
            if leaf in event.leaves:
                event.dirty = True

    def _release(self, final: bool) -> str:
        """The held events that can go now, in order."""
        out: list[str] = []
        while self.held:
            event = self.held[0]
            if not final and any(leaf.end > leaf.channel.end - self.mask.risky_tail(
                                     leaf.channel.since(leaf.channel.masked_to))
                                 for leaf in event.leaves):
                break
            self.held.pop(0)
            for leaf in event.leaves:
                channel = leaf.channel
                channel.released = max(channel.released, leaf.end)
                keep = channel.released - 6 * len(self.mask.key)  # what a later run may reach back to
                if keep - channel.base > 4096:
                    channel.text, channel.base = channel.since(keep), keep
            out.append(event.render())
        return "".join(out)


def describe(channel: tuple) -> str:
    return ".".join(f"{part[0]}={part[1]}" if isinstance(part, tuple) else str(part)
                    for part in channel) or "data"

"""A report as one self-contained HTML file: inline CSS, figures as base64 PNG data URIs, and tables
that sort when a header is clicked (a few lines of inline JavaScript). Nothing is fetched: a
Content-Security-Policy forbids every source but the page itself and data URIs, so the file reads
the same from a mail attachment as from the run directory.

Generic on purpose: sections are an ordered mapping of title -> (intro, DataFrame), so a new table
is one more entry. Cells that are already text (the markdown report's `37.5 [31.2, 44.0]`) are
shown as given; numbers are formatted here. A column sorts by number when every known cell starts
a number (`37.5 [31.2, 44.0]` sorts by 37.5), else alphabetically; unknown cells (`–`) sort last.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

DASH = "–"
# a number, optionally with its interval or a percent sign: the cells a column sorts by number
_NUMBER = re.compile(r"([+\-−]?\d[\d,]*(?:\.\d+)?)(?:\s*\[[^\]]*\])?\s*%?")


@dataclass(frozen=True)
class Figure:
    """A PNG for the report, with its alt text; shown after the section titled `section`, or
    under "Figures" at the end when that is None or no such section exists."""

    title: str
    png: bytes
    alt: str
    caption: str = ""
    section: str | None = None


Sections = Mapping[str, tuple[str, pd.DataFrame]]


# --- cells ---------------------------------------------------------------------------------------

def _missing(value: Any) -> bool:
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def format_value(value: Any) -> str:
    """Text as given; integers with thousands separators; other numbers to two decimals; booleans
    as yes/no; missing values as a dash."""
    if _missing(value) or (isinstance(value, str) and not value.strip()):
        return DASH
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):,.2f}"
    return str(value)


def sort_key(value: Any) -> float | None:
    """The number a cell sorts by: the value itself, or the leading number of a formatted cell
    (`-12.5 [-20.1, -4.0]` -> -12.5, `2,200` -> 2200); None when it is not a number."""
    if _missing(value) or isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, str):
        match = _NUMBER.fullmatch(value.strip())
        return float(match.group(1).replace(",", "").replace("−", "-")) if match else None
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value) if np.isfinite(value) else None
    return None


def flat(df: pd.DataFrame) -> pd.DataFrame:
    """The frame as a plain table: a meaningful index (named, or not 0..n-1) becomes a column,
    as the exposure table's `cell` index does."""
    plain = isinstance(df.index, pd.RangeIndex) and df.index.start == 0 and df.index.step == 1
    return df if plain and df.index.name is None else df.reset_index()


def _table(df: pd.DataFrame, caption: str) -> str:
    df = flat(df)
    columns = [str(c) for c in df.columns]
    values = df.to_numpy(dtype=object)
    keys = [[sort_key(v) for v in row] for row in values]
    numeric = [all(keys[r][k] is not None for r in range(len(values))
                   if format_value(values[r][k]) != DASH)
               and any(keys[r][k] is not None for r in range(len(values)))
               for k in range(len(columns))]
    number = ' class="num" data-type="number"'
    head = "".join(
        f'<th scope="col"{number if numeric[k] else ""}>'
        f'<button type="button">{html.escape(name)}</button></th>'
        for k, name in enumerate(columns))
    rows = []
    for r, row in enumerate(values):
        cells = []
        for k, value in enumerate(row):
            text = html.escape(format_value(value))
            if numeric[k]:
                key = "" if keys[r][k] is None else repr(keys[r][k])
                cells.append(f'<td class="num" data-sort="{key}">{text}</td>')
            else:
                cells.append(f"<td>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table class="sortable"><caption>{html.escape(caption)} '
            f'<span class="hint">(click a header to sort)</span></caption><thead><tr>{head}'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


# --- text ----------------------------------------------------------------------------------------

def _inline(text: str) -> str:
    """Escaped text with the markdown report's emphasis: **bold** and *italic*."""
    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", out)


def _paragraphs(text: str) -> str:
    """Paragraphs, and a block whose every line starts with `- ` as a list."""
    out = []
    for block in (b.strip() for b in re.split(r"\n\s*\n", text)):
        if not block:
            continue
        lines = block.splitlines()
        if all(line.startswith("- ") for line in lines):
            out.append("<ul>" + "".join(f"<li>{_inline(line[2:].strip())}</li>" for line in lines) + "</ul>")
        else:
            out.append(f"<p>{_inline(block)}</p>")
    return "".join(out)


def slug(title: str) -> str:
    """The anchor of a section: lower-case words joined by dashes."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"


def _figure(figure: Figure) -> str:
    data = base64.b64encode(figure.png).decode("ascii")
    caption = html.escape(figure.title) + (f". {_inline(figure.caption)}" if figure.caption else "")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(figure.alt)}">'
            f"<figcaption>{caption}</figcaption></figure>")


# --- the page ------------------------------------------------------------------------------------

_CSS = """
:root { color-scheme: light; --ink: #1d2330; --muted: #5b6475; --line: #d9dee7; --band: #f4f6fa;
        --accent: #1f5fa8; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--ink); background: #fff; }
main { max-width: 1320px; margin: 0 auto; padding: 1.5rem 1.5rem 4rem; }
h1 { font-size: 1.6rem; margin: 0.2rem 0 1rem; }
h2 { font-size: 1.2rem; margin: 2.2rem 0 0.4rem; padding-top: 0.6rem;
     border-top: 1px solid var(--line); }
p { max-width: 80ch; }
nav ul { display: flex; flex-wrap: wrap; gap: 0.3rem 1.2rem; padding: 0; list-style: none; }
nav a, a { color: var(--accent); }
.scroll { overflow-x: auto; margin: 0.6rem 0 1rem; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 0.9rem; }
caption { text-align: left; color: var(--muted); font-size: 0.85rem; padding-bottom: 0.3rem; }
.hint { font-style: italic; }
th, td { padding: 0.3rem 0.6rem; border-bottom: 1px solid var(--line); white-space: nowrap;
         text-align: left; }
th.num, td.num { text-align: right; }
thead th { position: sticky; top: 0; background: #fff; border-bottom: 2px solid var(--ink);
           vertical-align: bottom; }
th button { all: inherit; cursor: pointer; padding: 0; border: 0; white-space: normal; }
th button:focus-visible { outline: 2px solid var(--accent); }
th[aria-sort="ascending"] button::after { content: " \\25B2"; font-size: 0.7em; }
th[aria-sort="descending"] button::after { content: " \\25BC"; font-size: 0.7em; }
tbody tr:nth-child(even) { background: var(--band); }
tbody tr:hover { background: #e8eef8; }
figure { margin: 1rem 0 1.6rem; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); font-size: 0.85rem; margin-top: 0.3rem; max-width: 80ch; }
"""

# Sort a table by the clicked header: numbers by data-sort, text alphabetically, missing last.
_JS = """
"use strict";
document.querySelectorAll("table.sortable").forEach(function (table) {
  var headers = Array.prototype.slice.call(table.tHead.rows[0].cells);
  headers.forEach(function (th, column) {
    th.addEventListener("click", function () {
      var ascending = th.getAttribute("aria-sort") !== "ascending";
      headers.forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      var numeric = th.dataset.type === "number";
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows).map(function (row, index) {
        var cell = row.cells[column];
        var key = numeric ? cell.dataset.sort : cell.textContent.trim();
        var missing = key === undefined || key === "" || key === "\\u2013";
        return {row: row, index: index, missing: missing,
                key: numeric && !missing ? Number(key) : key};
      });
      rows.sort(function (a, b) {
        if (a.missing !== b.missing) { return a.missing ? 1 : -1; }
        var order = 0;
        if (!a.missing) {
          order = numeric ? a.key - b.key
                          : a.key.localeCompare(b.key, undefined, {numeric: true});
        }
        return (ascending ? order : -order) || a.index - b.index;
      });
      rows.forEach(function (item) { body.appendChild(item.row); });
    });
  });
});
"""

_POLICY = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
           "script-src 'unsafe-inline'; base-uri 'none'; form-action 'none'")


def render_html(title: str, intro: str, sections: Sections, figures: Sequence[Figure] = ()) -> str:
    """One self-contained HTML page: the title, the intro (paragraphs; **bold**, *italic*), a
    table of contents, then each section's intro and sortable table (an empty frame shows the
    intro alone), each figure after the section it names, and the remaining figures last."""
    placed: dict[str, list[Figure]] = {}
    loose: list[Figure] = []
    for figure in figures:
        (placed.setdefault(figure.section, []) if figure.section in sections else loose).append(
            figure)
    titles = list(sections) + (["Figures"] if loose else [])
    anchors: dict[str, str] = {}
    for t in titles:  # two titles with one slug get -2, -3, ...: every id stays unique
        anchor, k = slug(t), 1
        while anchor in anchors.values():
            k += 1
            anchor = f"{slug(t)}-{k}"
        anchors[t] = anchor
    parts = [f"<h1>{html.escape(title)}</h1>", _paragraphs(intro),
             '<nav aria-label="sections"><ul>'
             + "".join(f'<li><a href="#{anchors[t]}">{html.escape(t)}</a></li>' for t in titles)
             + "</ul></nav>"]
    for name, (text, frame) in sections.items():
        parts.append(f'<section id="{anchors[name]}"><h2>{html.escape(name)}</h2>'
                     + _paragraphs(text)
                     + ("" if frame.empty else _table(frame, name))
                     + "".join(_figure(f) for f in placed.get(name, [])) + "</section>")
    if loose:
        parts.append(f'<section id="{anchors["Figures"]}"><h2>Figures</h2>'
                     + "".join(_figure(f) for f in loose) + "</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head>\n<body><main>\n" + "\n".join(parts)
            + f"\n</main><script>{_JS}</script></body></html>\n")

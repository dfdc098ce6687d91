"""Report tables: numbers as a reader scans them (:func:`fmt_num`, :func:`fmt_nums`), the
scan table (:func:`scan_table`), the text of every cell of any table (:func:`cell_text`), and
the paged HTML table (:func:`paged_table`) that a report uses for any table with more than
:data:`PAGE_ROWS` rows.

The paged table: the first page is a real HTML table in the page (readable without
JavaScript); the rows -- the display strings of :func:`cell_text` / :func:`scan_table`, as a
JSON array of arrays -- are gzip-compressed (Python's :mod:`gzip`) and base64-encoded in a
``<script type="application/octet-stream">``, decompressed in the browser with the standard
``DecompressionStream('gzip')``, and paged, filtered (substring) and sorted by a small plain
script (:data:`PAGER_JS`; no library, no network: it works from ``file://``). At 10,000 result
rows the embedded rows take 0.05 MB of the page for a sweep replicated over cases and about
0.45 MB when every number differs (a 10,000-row HTML table took 4.8 MB).
Above :data:`MAX_EMBEDDED_ROWS` only the first rows are embedded and the page says so; every
row is in the table's CSV file.

We considered itables (DataTables): its offline bundle is about 1 MB of base64 in the page
and it embeds the data uncompressed (about 2 MB at 10,000 result rows), which puts a
10,000-row report folder (with plotly.js, 4.8 MB, and ``tables/results.csv``, 2.3 MB) over
10 MB; the sweep panel keeps it (:mod:`flyexplore.ui.tables`), where it is a live widget.
"""
from __future__ import annotations

import base64
import gzip
import html
import json
import math
from typing import Sequence

import numpy as np
import pandas as pd

from flyexplore.views.export import plain

#: Rows on one page of a paged table; a table with more rows is paged (:func:`paged_table`).
PAGE_ROWS = 100

#: At most this many rows of one table are embedded in a report page (the first ones; the
#: page says how many and where every row is: the table's CSV file). An embedded result row
#: costs 4-5 bytes of the page after gzip and base64 in a sweep replicated over cases, about
#: 45 where every number differs (up to about 60 with the GPU columns), so the rows of one
#: table stay under about 2.5 MB of ``report.html`` however many rows a result set has.
MAX_EMBEDDED_ROWS = 40_000

#: Columns that, when one value holds for every row, move from a table into its caption.
CONTEXT_COLS = ("device", "timing_mode", "order", "source", "baseline")

_EMPTY = ("", "<NA>", "nan", "None")


def fmt_nums(values) -> np.ndarray:
    """:func:`fmt_num` for many numbers at once (a float array or anything ``np.asarray``
    makes floats of): an object array of strings, ``""`` for NaN. Vectorized: one formatting
    call per group of values that share a number of decimals."""
    v = np.asarray(values, dtype=float)
    out = np.full(v.shape, "", dtype=object)
    a = np.abs(v)
    ok = ~np.isnan(v)
    zero = ok & (a == 0)
    big = ok & (a >= 1000)           # inf too: "inf"
    small = ok & ~zero & (a < 1e-3)
    mid = ok & ~zero & ~big & ~small
    out[zero] = "0"
    if big.any():
        out[big] = np.char.mod("%.0f", v[big]).astype(object)
    if small.any():
        out[small] = np.char.mod("%.3g", v[small]).astype(object)
    if mid.any():
        idx = np.flatnonzero(mid)
        dec = 3 - np.floor(np.log10(a[idx])).astype(int)
        for d in np.unique(dec):
            sel = idx[dec == d]
            out[sel] = np.char.mod(f"%.{d}f", v[sel]).astype(object)
    return out


def fmt_num(v) -> str:
    """A number as a reader scans it in a table column: 4 significant digits in plain notation
    from 0.001 up (``31980``, ``7586``, ``12.35``, ``0.01235``; no ``3.198e+04`` beside
    ``7586``), scientific only below 0.001 (errors such as ``1.19e-07``); ``""`` for NA; an
    ``int`` as it is; anything else ``str(v)``. The same rule as :func:`fmt_nums`."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return str(v)
    return str(fmt_nums([v])[0])


def _is_na(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def cell_text(col: pd.Series, fmt: str | None = None) -> np.ndarray:
    """The text of each cell of ``col`` as a report shows it: ``""`` for a missing value,
    floats by :func:`fmt_nums` (or ``fmt.format(v)`` when ``fmt`` is given, e.g. ``"{:.2f}"``),
    integers and booleans as ``str`` does, other values ``str(v)``. Returns an object array of
    strings, one per cell. Vectorized for float, integer, boolean and string columns; a column
    of mixed Python objects is converted value by value."""
    s = plain(col.to_frame()).iloc[:, 0] if str(col.dtype) in ("Float64", "Int64", "boolean", "string", "str") \
        else col
    n = len(s)
    if n == 0:
        return np.asarray([], dtype=object)
    kind = s.dtype.kind
    if kind == "f":
        v = s.to_numpy(dtype=float)
        if fmt:
            return np.asarray(["" if math.isnan(x) else fmt.format(x) for x in v], dtype=object)
        return fmt_nums(v)
    if kind in "iu":
        return s.to_numpy().astype(str).astype(object)
    if kind == "b":
        return np.where(s.to_numpy(), "True", "False").astype(object)
    arr = s.to_numpy(dtype=object)
    na = pd.isna(arr)
    inferred = pd.api.types.infer_dtype(arr, skipna=True)
    if inferred in ("string", "empty"):
        out = arr.copy()
        out[na] = ""
        return out
    if inferred == "floating" and not fmt:
        return fmt_nums(np.where(na, np.nan, arr).astype(float))
    # mixed Python objects: the scan rule value by value
    return np.asarray(["" if _is_na(v) else
                       (fmt.format(v) if fmt and isinstance(v, float) else fmt_num(v))
                       if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
                       for v in arr], dtype=object)


def text_frame(df: pd.DataFrame, fmt: str | None = None) -> pd.DataFrame:
    """``df`` with every cell as its text (:func:`cell_text`), same index, columns (repeated
    names too) and order."""
    out = pd.DataFrame({i: cell_text(df.iloc[:, i], fmt) for i in range(df.shape[1])}, index=df.index)
    out.columns = df.columns
    return out


def _empty_column(s: pd.Series) -> bool:
    if s.isna().all():
        return True
    if s.dtype.kind in "fiub":
        return False
    return bool(s.dropna().astype(str).str.strip().isin(_EMPTY).all())


def scan_table(t: pd.DataFrame, note_col: str = "message") -> tuple[pd.DataFrame, list[str], list[str]]:
    """A table made for scanning (what reports and the sweep command show): columns that are
    empty in every row dropped; :data:`CONTEXT_COLS` that hold one value moved into the
    caption; each distinct ``note_col`` text (an "unavailable" reason, say) replaced by a
    footnote mark ``[n]`` (numbered in order of first appearance), the text given once;
    numbers as text via :func:`fmt_nums`.

    Returns ``(table of strings, caption parts such as "device: AMD EPYC", footnotes
    "[1] reason")``. The input is not changed; files written from it keep every column.
    Vectorized: no per-row Python loop."""
    d = plain(t)
    d = d[[c for c in d.columns if not _empty_column(d[c])]].copy()
    caption = []
    for c in CONTEXT_COLS:
        if c in d and len(d) > 1 and d[c].nunique() == 1:
            caption.append(f"{c}: {d[c].dropna().iloc[0]}")
            d = d.drop(columns=c)
    notes: list[str] = []
    if note_col in d:
        col = d[note_col].astype(object)
        blank = col.isna().to_numpy() | col.astype(str).str.strip().eq("").to_numpy()
        codes, uniques = pd.factorize(col.where(~blank, None), use_na_sentinel=True)
        notes = [f"[{i}] {v}" for i, v in enumerate(uniques, 1)]
        marks = np.asarray([f"[{i}]" for i in range(1, len(uniques) + 1)] + [""], dtype=object)
        d[note_col] = marks[np.where(codes < 0, len(uniques), codes)]
        d = d.rename(columns={note_col: "note"})
    return text_frame(d), caption, notes


# -- the paged table -------------------------------------------------------------------------
def encode_rows(rows: list[list[str]]) -> str:
    """Rows (lists of cell strings) as the paged table embeds them: JSON (UTF-8, no spaces),
    gzip-compressed (level 9, no timestamp: the same rows give the same text), base64."""
    raw = json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def decode_rows(text: str) -> list[list[str]]:
    """The rows :func:`encode_rows` embedded (base64, then gzip, then JSON). Raises
    ``ValueError`` (``binascii.Error``, ``json.JSONDecodeError``) or ``gzip.BadGzipFile`` for
    text that is not such a payload."""
    return json.loads(gzip.decompress(base64.b64decode(text)).decode("utf-8"))


def _html_rows(cells: np.ndarray, marked: set[int], offset: int = 0) -> str:
    out = []
    for i, row in enumerate(cells, offset):
        tr = "<tr class='diff'>" if i in marked else "<tr>"
        out.append(tr + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    return "\n".join(out)


def static_table(d: pd.DataFrame, marked: set[int] = frozenset()) -> str:
    """``d`` (a frame of cell strings) as an HTML table with every row (for small tables);
    rows whose position is in ``marked`` get the ``diff`` class."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in d.columns)
    return (f"<table class='dataframe fx-table'><thead><tr>{head}</tr></thead><tbody>\n"
            f"{_html_rows(d.to_numpy(dtype=object), set(marked))}\n</tbody></table>")


def paged_table(d: pd.DataFrame, table_id: str, file_note: str | None = None,
                marked: Sequence[int] = (), page_rows: int | None = None,
                max_rows: int | None = None) -> str:
    """HTML of a paged table of ``d`` (a frame of cell strings, :func:`text_frame` or
    :func:`scan_table`'s): the first ``page_rows`` rows as a real table, the first
    ``max_rows`` rows embedded (:func:`encode_rows`) for :data:`PAGER_JS` to page, filter and
    sort in the browser (defaults: :data:`PAGE_ROWS`, :data:`MAX_EMBEDDED_ROWS`; when fewer
    rows are embedded than ``d`` has, a note above the table says how many and where the
    others are). ``table_id``: a unique HTML id in the page (letters, digits, ``-``, ``_``).
    ``file_note``: the file with every row (e.g. ``"tables/results.csv"``), named under the
    table; ``marked``: row positions drawn with the ``diff`` class. The page needs
    :data:`PAGER_JS` once (:func:`pager_script`). Raises ``ValueError`` for ``page_rows`` or
    ``max_rows`` below 1."""
    page_rows = PAGE_ROWS if page_rows is None else page_rows
    max_rows = MAX_EMBEDDED_ROWS if max_rows is None else max_rows
    if page_rows < 1 or max_rows < 1:
        raise ValueError(f"page_rows and max_rows must be >= 1, got {page_rows}, {max_rows}")
    n = len(d)
    emb = min(n, max_rows)
    cells = d.to_numpy(dtype=object)
    first = cells[:page_rows]
    mk = sorted(int(i) for i in marked if 0 <= int(i) < emb)
    head = "".join(f"<th title='sort by {html.escape(str(c))}'>{html.escape(str(c))}</th>" for c in d.columns)
    payload = encode_rows(cells[:emb].tolist())
    where = f"every row is in {html.escape(file_note)}" if file_note else ""
    shown = min(n, page_rows)
    info = f"rows 1–{shown} of {n:,}"
    static = (f"Rows 1–{shown} of {n:,} are shown here; with JavaScript the controls above page through "
              f"{'them' if emb == n else f'the first {emb:,}'}, filter and sort them (click a column title)"
              + (f"; {where}" if where else "") + ".")
    cap = ""
    if emb < n:
        cap = (f"<p class='note'>This table has {n:,} rows; only the first {emb:,} are in this page (paging, "
               f"filtering and sorting work on those)" + (f"; {where}" if where else "; the others are not in "
                                                           "this report") + ".</p>")
    return (f"<div class='fx-paged' id='{table_id}' data-rows='{n}' data-embedded='{emb}' "
            f"data-page-rows='{page_rows}' data-marked='{json.dumps(mk)}'>{cap}"
            "<div class='fx-ctrl' hidden>"
            "<input type='search' class='fx-filter' placeholder='filter: rows containing…' size='28'> "
            "<button type='button' data-go='first'>«</button>"
            "<button type='button' data-go='prev'>‹ previous</button> "
            "page <input type='number' class='fx-pageno' min='1' value='1' style='width:5em'> "
            "of <span class='fx-pages'></span> "
            "<button type='button' data-go='next'>next ›</button>"
            "<button type='button' data-go='last'>»</button> "
            f"<span class='fx-info'>{info}</span></div>"
            f"<div class='fx-scroll'><table class='dataframe fx-table'><thead><tr>{head}</tr></thead>"
            f"<tbody>\n{_html_rows(first, set(mk))}\n</tbody></table></div>"
            f"<p class='fx-static'>{static}</p>"
            f"<script type='application/octet-stream' class='fx-rows' data-encoding='gzip+base64'>{payload}</script>"
            "</div>")


#: CSS of the paged table's controls (added to a report page's style).
PAGER_CSS = (".fx-ctrl{margin:0.4em 0;font-size:13px}.fx-ctrl button{margin:0 2px}"
             ".fx-scroll{overflow-x:auto}.fx-paged td{white-space:nowrap}"
             ".fx-paged th{cursor:pointer;white-space:nowrap}.fx-paged th.fx-asc::after{content:' ▲'}"
             ".fx-paged th.fx-desc::after{content:' ▼'}.fx-static{color:#555;font-size:12px}")

#: The browser side of :func:`paged_table`: decodes every ``.fx-paged`` table's rows
#: (``atob``, ``DecompressionStream('gzip')``, ``JSON.parse``) and pages, filters (every
#: word typed, case-insensitive, somewhere in the row) and sorts (click a column title; again:
#: descending) them. A column whose every non-empty cell is a number, or a speedup as written
#: (``1.103x [1.098, 1.109] vs aten``), sorts by that number; others as text in natural order
#: (``C#9`` before ``C#10``, ``64x8192`` before ``64x32768``); empty cells last. Past the
#: embedded rows the counts say how many rows the table has. Plain JavaScript, no library,
#: no network.
PAGER_JS = r"""
(function () {
  var NUM = /^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?/i;
  // a number, alone or as a speedup is written ("1.103x [1.098, 1.109] vs aten"): a case label
  // such as "64x8192" starts with a number but is text (natural order)
  var NUMCELL = /^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?(x( \[[^\]]*\])?( vs .*)?)?$/i;
  function decode(b64) {
    var s = atob(b64), n = s.length, a = new Uint8Array(n);
    for (var i = 0; i < n; i++) a[i] = s.charCodeAt(i);
    var st = new Blob([a]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Response(st).text().then(JSON.parse);
  }
  function setup(box, rows) {
    var per = +box.dataset.pageRows, total = +box.dataset.rows, marked = new Set(JSON.parse(box.dataset.marked || '[]'));
    var tbody = box.querySelector('tbody'), ths = box.querySelectorAll('thead th');
    var ctrl = box.querySelector('.fx-ctrl'), info = box.querySelector('.fx-info');
    var pageno = box.querySelector('.fx-pageno'), pages = box.querySelector('.fx-pages');
    var filter = box.querySelector('.fx-filter'), stat = box.querySelector('.fx-static');
    var order = rows.map(function (_, i) { return i; }), view = order, page = 0;
    var sortCol = -1, sortDir = 1, low = null, timer = null;
    function npages() { return Math.max(1, Math.ceil(view.length / per)); }
    function draw() {
      page = Math.min(Math.max(page, 0), npages() - 1);
      var lo = page * per, hi = Math.min(view.length, lo + per), frag = document.createDocumentFragment();
      for (var k = lo; k < hi; k++) {
        var i = view[k], tr = document.createElement('tr'), r = rows[i];
        if (marked.has(i)) tr.className = 'diff';
        for (var j = 0; j < r.length; j++) { var td = document.createElement('td'); td.textContent = r[j]; tr.appendChild(td); }
        frag.appendChild(tr);
      }
      tbody.replaceChildren(frag);
      pageno.value = page + 1; pageno.max = npages(); pages.textContent = npages();
      var f = view.length < rows.length ? ' (filtered from ' + rows.length.toLocaleString('en') + ')' : '';
      if (total > rows.length) f += ' in this page; the table has ' + total.toLocaleString('en') + ' rows';
      info.textContent = view.length ? 'rows ' + (lo + 1) + '–' + hi + ' of ' + view.length.toLocaleString('en') + f
                                     : 'no row matches' + f;
    }
    function numeric(j) {
      var any = false;
      for (var i = 0; i < rows.length; i++) { var c = rows[i][j]; if (c === '') continue; if (!NUMCELL.test(c)) return false; any = true; }
      return any;
    }
    function sortBy(j) {
      sortDir = sortCol === j ? -sortDir : 1; sortCol = j;
      var key, num = numeric(j), d = sortDir;
      if (num) key = rows.map(function (r) { var m = NUM.exec(r[j]); return m ? parseFloat(m[0]) : null; });
      else key = rows.map(function (r) { return r[j] === '' ? null : r[j]; });
      var coll = new Intl.Collator(undefined, {numeric: true, sensitivity: 'base'});
      order = rows.map(function (_, i) { return i; }).sort(function (a, b) {
        var x = key[a], y = key[b];
        if (x === null || y === null) return x === y ? a - b : (x === null ? 1 : -1);
        var c = num ? (x < y ? -1 : x > y ? 1 : 0) : coll.compare(x, y);
        return c ? c * d : a - b;
      });
      ths.forEach(function (th, k) { th.classList.toggle('fx-asc', k === j && d > 0); th.classList.toggle('fx-desc', k === j && d < 0); });
      apply(); page = 0; draw();
    }
    function apply() {
      var q = filter.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
      if (!q.length) { view = order; return; }
      if (!low) low = rows.map(function (r) { return r.join('\u0001').toLowerCase(); });
      view = order.filter(function (i) { return q.every(function (w) { return low[i].indexOf(w) >= 0; }); });
    }
    ths.forEach(function (th, j) { th.addEventListener('click', function () { sortBy(j); }); });
    filter.addEventListener('input', function () { clearTimeout(timer); timer = setTimeout(function () { apply(); page = 0; draw(); }, 150); });
    ctrl.addEventListener('click', function (e) {
      var go = e.target.dataset && e.target.dataset.go; if (!go) return;
      page = go === 'first' ? 0 : go === 'prev' ? page - 1 : go === 'next' ? page + 1 : npages() - 1; draw();
    });
    pageno.addEventListener('change', function () { page = (parseInt(pageno.value, 10) || 1) - 1; draw(); });
    ctrl.hidden = false; if (stat) stat.hidden = true;
    box.dataset.ready = '1';
    draw();
  }
  function init() {
    document.querySelectorAll('.fx-paged').forEach(function (box) {
      var src = box.querySelector('script.fx-rows');
      if (typeof DecompressionStream === 'undefined') return;  // an old browser: the first page stays
      decode(src.textContent.trim()).then(function (rows) { setup(box, rows); }, function (e) {
        box.dataset.error = String(e);
      });
    });
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init); else init();
})();
"""


def pager_script() -> str:
    """The ``<script>`` element a page with paged tables needs once (:data:`PAGER_JS`)."""
    return f"<script>{PAGER_JS}</script>"

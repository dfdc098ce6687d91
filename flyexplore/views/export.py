"""Export figures (PNG, SVG, PDF, standalone HTML) and tables (CSV, Markdown, LaTeX).

Static images are rendered by kaleido (>= 1.0), which drives a Chromium/Chrome browser. One
browser is started per process, on first use, and kept (:func:`kaleido_session`, kaleido's own
``start_sync_server``): starting Chromium costs 5-8 s, an image in a running one about 0.5 s.
Each image has a time limit (:data:`IMAGE_TIMEOUT_S`, kaleido's ``timeout``); a figure that
fails or runs past it is written as HTML instead, with a note saying why. On
Debian/Ubuntu ``apt-get install chromium`` (kaleido finds ``/usr/bin/chromium`` by itself), or
``plotly_get_chrome`` / ``kaleido.get_chrome_sync()`` to download one. HTML needs neither:
plotly.js is embedded, so the file opens offline. At exit the browser is stopped before the
temporary folders it uses are removed (:func:`_close_at_exit`). Markdown needs ``tabulate``;
LaTeX needs ``jinja2`` (both pandas' optional dependencies, installed with flyexplore).
"""
from __future__ import annotations

import atexit
import os
import shutil
from pathlib import Path
from typing import Iterable, Mapping

import pandas as pd

from flyexplore import atomic as A
from flyexplore.errors import UsageError, WriteError, bad_choice
from flyexplore.results.table import check_writable  # noqa: F401 - the views' outputs are checked by it too

IMAGE_FORMATS = ("png", "svg", "pdf")
FIGURE_FORMATS = (*IMAGE_FORMATS, "html")
TABLE_FORMATS = ("csv", "md", "tex", "html")
#: A table with more rows than this is written as CSV only (:func:`save_tables`): a Markdown or
#: LaTeX copy of 10,000 rows (5.4 and 2.5 MB for a report's results) is neither readable nor small.
TEXT_TABLE_MAX_ROWS = 1_000
#: Default size of static images, CSS pixels (PNG is rendered at ``scale`` x this).
WIDTH, HEIGHT, SCALE = 1100, 560, 2

#: Time limit for rendering one static image, s (kaleido's per-image ``timeout``).
IMAGE_TIMEOUT_S = 60.0

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def check_image_size(width=None, height=None, scale=None, names=("width", "height", "scale")) -> None:
    """Raise :class:`UsageError` naming the value unless each of ``width``, ``height`` (CSS
    pixels) and ``scale`` given (not ``None``) is a positive finite number; ``names``: what to
    call them in the message (``--width`` on the command line). Checked before anything is drawn
    (kaleido takes ``width=-5`` and fails, or writes nothing, only when rendering)."""
    for name, v in zip(names, (width, height, scale)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf")):
            raise UsageError(f"{name} must be a positive number, got {v!r}")


def static_export_problem() -> str | None:
    """Why static image export cannot work here, or ``None`` when kaleido and a browser are
    found (``BROWSER_PATH``, a Chromium/Chrome on PATH, or one kaleido downloaded)."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return "kaleido is not installed (pip install 'kaleido>=1.0')"
    if os.environ.get("BROWSER_PATH") and Path(os.environ["BROWSER_PATH"]).exists():
        return None
    if any(shutil.which(b) for b in _BROWSERS):
        return None
    try:
        from choreographer.browsers.chromium import Chromium

        if Chromium.find_browser(skip_local=False):
            return None
    except Exception:  # noqa: BLE001 - any failure means: not found
        pass
    return ("no Chromium/Chrome for kaleido: install one (Debian: apt-get install chromium) or run "
            "plotly_get_chrome")


_SESSION: dict = {}


def kaleido_session(timeout: float = IMAGE_TIMEOUT_S) -> None:
    """Start this process's kaleido server (one Chromium, kept until exit or
    :func:`close_kaleido_session`) if it is not running; later static exports reuse it.
    ``timeout``: kaleido's limit for one image, s (a new value restarts the server).
    Raises ``RuntimeError`` with :func:`static_export_problem`'s reason when there is no
    browser."""
    import kaleido

    why = static_export_problem()
    if why:
        raise RuntimeError(f"static figure export unavailable: {why}")
    if kaleido._global_server.is_running() and _SESSION.get("timeout") == timeout:  # noqa: SLF001
        return
    close_kaleido_session()
    kaleido.start_sync_server(timeout=timeout, silence_warnings=True)
    _SESSION["timeout"] = timeout


def kaleido_session_open() -> bool:
    """Whether :func:`kaleido_session` started a browser that :func:`close_kaleido_session` has
    not stopped (no import: false when kaleido was never used)."""
    return bool(_SESSION)


def close_kaleido_session() -> None:
    """Stop the kaleido server of :func:`kaleido_session` (its Chromium exits); no-op if none."""
    import kaleido

    kaleido.stop_sync_server(silence_warnings=True)
    _SESSION.clear()


_CLOSE_AT_EXIT: list[bool] = []


def _close_at_exit() -> None:
    """Stop this process's kaleido browser at exit before its temporary folders are removed.

    choreographer's Chromium profile and kaleido's page folder are ``tempfile.TemporaryDirectory``
    objects, which ``weakref.finalize`` removes at exit; kaleido stops its browser from an
    ``atexit`` hook registered when its server starts. ``atexit`` runs hooks last-registered
    first, and weakref registers its one hook when the process's first finalizer is made: here
    that profile's own, made in kaleido's thread just after kaleido registered its close. So
    weakref's hook ran first and removed the profile of the running browser, which still
    writes into it: ``OSError: [Errno 39] Directory not empty: 'Default'`` printed at exit in
    about half of the runs. This hook is registered once, after the first image (by then the
    browser runs and weakref's hook is registered), so it runs before weakref's: the browser is
    closed, then choreographer removes its folders itself (retrying while files disappear)."""
    if not _CLOSE_AT_EXIT:
        atexit.register(close_kaleido_session)
        _CLOSE_AT_EXIT.append(True)


def _write_failure(err: BaseException) -> bool:
    """Whether an error kaleido returned is the OS refusing to write the image file (a full disk,
    a quota: an ``OSError`` with an errno), not the browser failing or timing out."""
    return isinstance(err, OSError) and bool(err.errno) and not isinstance(err, (ConnectionError, TimeoutError))


def _render(items: list[tuple[object, Path, str, int, int, float]], timeout: float) -> dict[Path, str]:
    """Render ``(fig, path, format, width, height, scale)`` items in the persistent session,
    each into a temporary file beside its path, put in place whole (:mod:`flyexplore.atomic`)
    when it is a valid image; returns ``{path: why}`` for the images that failed (timeout or
    error; their files are left as they were), the rest written. Raises
    :class:`~flyexplore.errors.WriteError` naming the path when the OS refused to write an
    image (a full disk), after putting in place those that rendered."""
    import kaleido

    kaleido_session(timeout)
    temps = {p: A.temp_for(p) for _, p, *_ in items}
    try:
        failed = _render_into(items, temps, timeout, kaleido)
        again = [it for it in items if PAGE_NOT_READY in failed.get(it[1], "")]
        if again:   # kaleido's page was not ready: a fresh browser, those images once more
            close_kaleido_session()
            kaleido_session(timeout)
            retry = _render_into(again, temps, timeout, kaleido)
            for it in again:
                if it[1] in retry:
                    failed[it[1]] = retry[it[1]]
                else:
                    del failed[it[1]]
        return failed
    finally:
        for t in temps.values():
            A.discard(t)


#: What kaleido's page answers when an image is sent before its scripts have loaded (seen on the
#: 2-core CI machine under load, kaleido 1.x with Debian's Chromium: ``JavascriptError ...
#: ReferenceError: kaleido_scopes is not defined``): :func:`_render` restarts the browser and
#: renders those images once more.
PAGE_NOT_READY = "kaleido_scopes is not defined"


def _render_into(items, temps: dict[Path, Path], timeout: float, kaleido) -> dict[Path, str]:
    specs = [{"fig": fig, "path": str(temps[p]), "opts": {"format": f, "width": w, "height": h, "scale": s}}
             for fig, p, f, w, h, s in items]
    try:
        errs = kaleido.write_fig_from_object_sync(specs, cancel_on_error=False) or ()
    except Exception as exc:  # noqa: BLE001 - the browser died or would not start
        close_kaleido_session()
        errs = (exc,)
    finally:
        if kaleido._global_server.is_running():  # the browser opened: see _close_at_exit
            _close_at_exit()
    errs = list(errs)
    # kaleido removes the file of an image that failed and returns the errors in the items' order
    missing = [p for _, p, *_ in items if not temps[p].exists()]
    refused = next(((p, e) for p, e in zip(missing, errs) if _write_failure(e)), None)
    if any(_timed_out(e) for e in errs):
        # a timed-out image can leave kaleido's executor closed, so the images after it fail
        # with ChannelClosedError: the timeout is the cause; the next export starts afresh
        why = f"no image within {timeout:g} s (kaleido timeout)"
        close_kaleido_session()
    else:
        why = f"{type(errs[0]).__name__}: {errs[0]}" if errs else "not written"
    failed = {p: why for p in missing}
    for _, p, f, w, h, _s in items:
        if p not in failed and not _is_image(temps[p], f):   # kaleido can "write" a few bytes and no error
            failed[p] = (f"kaleido wrote no valid {f.upper()} ({temps[p].stat().st_size} bytes) for a figure of "
                         f"{w}x{h} px: too large for the browser to render")
    for _, p, *_ in items:
        if p not in failed:
            A.commit(temps[p], p)
    if refused is not None:
        raise A.write_error(refused[0], refused[1])
    return failed


def _timed_out(err: BaseException) -> bool:
    """Whether an error kaleido returned for an image is its per-image timeout: a
    ``TimeoutError``, or choreographer's ``ChannelClosedError("Executor is closed.")`` raised
    *from* the ``CancelledError`` of that timeout (kaleido's ``asyncio.wait_for`` cancelled the
    render while it was writing to the browser; seen on a loaded 2-core machine for about a third
    of the images at ``timeout=0.001``)."""
    import asyncio

    return isinstance(err, TimeoutError) or isinstance(err.__cause__, asyncio.CancelledError)


#: The first bytes of a valid file of each static format.
_MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF"}


def _is_image(p: Path, fmt: str) -> bool:
    """Whether ``p`` starts as a ``fmt`` file does (PNG and PDF signatures; SVG: an XML or
    ``<svg`` start)."""
    with open(p, "rb") as f:
        head = f.read(256)
    if fmt == "svg":
        return b"<svg" in head or head.lstrip().startswith(b"<?xml")
    return head.startswith(_MAGIC.get(fmt, b""))


def write_html(fig, path: str | os.PathLike) -> Path:
    """Write ``fig`` as one standalone HTML file with plotly.js embedded (opens offline),
    atomically (:func:`flyexplore.atomic.write_text`; a failed write raises
    :class:`~flyexplore.errors.WriteError` and leaves ``path`` as it was)."""
    return A.write_text(path, fig.to_html(include_plotlyjs=True, full_html=True))


def save_figures(figs: Mapping[str, object], out_dir: str | os.PathLike,
                 formats: Iterable[str] = IMAGE_FORMATS, width: int = WIDTH, height: int | None = None,
                 scale: float = SCALE, timeout: float = IMAGE_TIMEOUT_S) -> list[Path]:
    """Write each figure of ``figs`` (name -> plotly figure) as ``out_dir/<name>.<fmt>`` for
    every format (png, svg, pdf, html). Static formats are rendered in this process's
    persistent kaleido session (:func:`kaleido_session`), each image within ``timeout`` s.
    ``height`` defaults to the figure's own layout height, else :data:`HEIGHT`.

    Every file is written whole or not at all (:mod:`flyexplore.atomic`). Returns the written
    paths. Raises :class:`UsageError` for an unknown format or size (:func:`check_image_size`),
    ``RuntimeError`` (with :func:`static_export_problem`'s reason, or kaleido's error or
    timeout for the first failed image) when static export is not possible here (the images
    that did render stay written; a failed one's file is left as it was), and
    :class:`~flyexplore.errors.WriteError` naming the file when a write fails (a full disk)."""
    check_image_size(width, height, scale)
    formats = list(formats)
    for f in formats:
        if f not in FIGURE_FORMATS:
            raise bad_choice("figure format", f, FIGURE_FORMATS)
    out = Path(out_dir)
    written: list[Path] = []
    static = [f for f in formats if f in IMAGE_FORMATS]
    if static and figs:
        why = static_export_problem()
        if why:
            raise RuntimeError(f"static figure export unavailable: {why}")
    out.mkdir(parents=True, exist_ok=True)
    if static and figs:
        items = [(fig, out / f"{name}.{f}", f, fig.layout.width or width,
                  height or fig.layout.height or HEIGHT, scale) for name, fig in figs.items() for f in static]
        written.extend(_save_static(items, timeout))
    if "html" in formats:
        for name, fig in figs.items():
            written.append(write_html(fig, out / f"{name}.html"))
    return written


def _save_static(items: list[tuple[object, Path, str, int, int, float]], timeout: float) -> list[Path]:
    """:func:`_render` the items (their folders exist); returns their paths. Raises
    ``RuntimeError`` naming the first image that failed and why."""
    failed = _render(items, timeout)
    if failed:
        p, why = next(iter(failed.items()))
        raise RuntimeError(f"static figure export failed for {len(failed)} of {len(items)} image(s), "
                           f"e.g. {p.name}: {why}")
    return [p for _, p, *_ in items]


def export_figures(figs: Mapping[str, object], out_dir: str | os.PathLike,
                   formats: Iterable[str] = FIGURE_FORMATS, width: int = WIDTH, height: int | None = None,
                   scale: float = SCALE) -> pd.DataFrame:
    """Like :func:`save_figures`, but never fails for want of a browser: static formats (png,
    svg, pdf) are skipped with the reason when :func:`static_export_problem` finds no Chromium
    (or kaleido's rendering fails), and HTML is always written. For notebooks and scripts that
    must run on machines without a browser (a GPU node).

    Returns one row per (figure, format): ``figure``, ``format``, ``path``, ``status``
    (``written`` or ``skipped``) and ``note`` (why it was skipped). Raises
    :class:`UsageError` for an unknown format or a size that is not positive."""
    check_image_size(width, height, scale)
    formats = list(formats)
    for f in formats:
        if f not in FIGURE_FORMATS:
            raise bad_choice("figure format", f, FIGURE_FORMATS)
    out = Path(out_dir)
    static = [f for f in formats if f in IMAGE_FORMATS]
    why = static_export_problem() if static and figs else None
    if static and figs and not why:
        try:
            save_figures(figs, out, static, width, height, scale)
        except RuntimeError as exc:
            why = str(exc)
    if "html" in formats:
        save_figures(figs, out, ["html"])
    rows = []
    for name in figs:
        for f in formats:
            skipped = f in IMAGE_FORMATS and why is not None
            rows.append({"figure": name, "format": f, "path": str(out / f"{name}.{f}"),
                         "status": "skipped" if skipped else "written",
                         "note": f"static export unavailable: {why}" if skipped else ""})
    return pd.DataFrame(rows, columns=["figure", "format", "path", "status", "note"])


def save_figure(fig, path: str | os.PathLike, width: int = WIDTH, height: int | None = None,
                scale: float = SCALE) -> Path:
    """Write one figure to ``path``; the format is the extension (.png, .svg, .pdf, .html).
    Raises :class:`UsageError` for another extension."""
    p = Path(path)
    fmt = p.suffix.lstrip(".").lower()
    if fmt not in FIGURE_FORMATS:
        raise UsageError(f"unknown figure file extension {p.suffix!r} in {str(p)!r} "
                         f"(valid: {', '.join('.' + f for f in FIGURE_FORMATS)})")
    tmp = save_figures({p.stem: fig}, p.parent, [fmt], width, height, scale)
    return tmp[0]


def export_figure(fig, path: str | os.PathLike, width: int = WIDTH, height: int | None = None,
                  scale: float = SCALE, timeout: float = IMAGE_TIMEOUT_S) -> tuple[Path, str | None]:
    """Write one figure to ``path`` like :func:`save_figure`, but when a static image (.png,
    .svg, .pdf) cannot be made here (no browser, kaleido's error, or no image within
    ``timeout`` s) write ``path`` with ``.html`` instead. Returns ``(written path, note)``;
    the note says why the format changed, else ``None``. The file is made under a temporary
    name beside ``path`` and renamed into place (:mod:`flyexplore.atomic`), so a failure
    leaves no half-written file (an old ``path`` as it was, nor a folder made for it). Raises
    :class:`UsageError` for an unknown extension, a size that is not positive
    (:func:`check_image_size`) or a path that cannot be written (:func:`check_writable`, both
    checked before anything is drawn), and :class:`~flyexplore.errors.WriteError` naming
    ``path`` for a write that fails (disk full, ...)."""
    p = Path(path)
    fmt = p.suffix.lstrip(".").lower()
    if fmt not in FIGURE_FORMATS:
        raise UsageError(f"unknown figure file extension {p.suffix!r} in {str(p)!r} "
                         f"(valid: {', '.join('.' + f for f in FIGURE_FORMATS)})")
    check_image_size(width, height, scale)
    check_writable(p, "figure file")
    if fmt == "html":
        return write_html(fig, p), None
    made: list[Path] = []
    try:
        made = A.make_folders(p.parent)
        try:
            why = static_export_problem()
            if why:
                raise RuntimeError(f"static figure export unavailable: {why}")
            return _save_static([(fig, p, fmt, fig.layout.width or width, height or fig.layout.height or HEIGHT,
                                  scale)], timeout)[0], None
        except RuntimeError as exc:
            final = p.with_suffix(".html")
            note = f"{p.name} not written ({exc}); wrote {final.name} instead (opens offline in a browser)"
            return write_html(fig, final), note
    except WriteError:   # it names the file that failed: path, or the .html written instead
        A.remove_empty(made)
        raise
    except OSError as exc:
        A.remove_empty(made)
        raise A.write_error(p, exc) from None


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def plain(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with pandas' nullable dtypes made plain (Float64 -> float64 with NaN; Int64,
    boolean, string -> objects with None) so that formatters apply and NA prints empty."""
    d = df.copy()
    for c in d.columns:
        t = str(d[c].dtype)
        if t == "Float64":
            d[c] = d[c].astype("float64")
        elif t in ("Int64", "boolean", "string", "str"):
            d[c] = d[c].astype(object).where(d[c].notna(), None)
    return d


def save_table(df: pd.DataFrame, path: str | os.PathLike, float_format: str = "{:.4g}") -> Path:
    """Write a table; the format is the extension: ``.csv`` (full precision), ``.md``
    (GitHub Markdown via tabulate), ``.tex`` (LaTeX tabular via pandas/jinja2, special
    characters escaped) or ``.html``, atomically (:mod:`flyexplore.atomic`). Raises
    :class:`UsageError` for another extension and :class:`~flyexplore.errors.WriteError` naming
    the file when the write fails (a full disk; an old file is left as it was)."""
    p = Path(path)
    fmt = p.suffix.lstrip(".").lower()
    if fmt not in TABLE_FORMATS:
        raise UsageError(f"unknown table file extension {p.suffix!r} in {str(p)!r} "
                         f"(valid: {', '.join('.' + f for f in TABLE_FORMATS)})")
    d = plain(df)
    if fmt == "csv":
        return A.write_file(p, lambda t: df.to_csv(t, index=False))
    if fmt == "md":
        m = d.astype(object).where(d.notna(), None)  # tabulate's missingval covers None, not NaN
        text = m.to_markdown(index=False, floatfmt=".4g", missingval="") + "\n"
    elif fmt == "tex":
        text = d.to_latex(index=False, escape=True, na_rep="", float_format=lambda v: float_format.format(v))
    else:
        text = d.to_html(index=False, na_rep="", float_format=lambda v: float_format.format(v))
    return A.write_text(p, text)


def save_tables(tables: Mapping[str, pd.DataFrame], out_dir: str | os.PathLike,
                formats: Iterable[str] = ("csv", "md", "tex"),
                text_max_rows: int | None = TEXT_TABLE_MAX_ROWS) -> list[Path]:
    """Write each table (name -> DataFrame) as ``out_dir/<name>.<fmt>``; returns the paths.

    A table of more than ``text_max_rows`` rows (default :data:`TEXT_TABLE_MAX_ROWS`; ``None``:
    no limit) is written as CSV only, whatever ``formats`` asks (its Markdown, LaTeX or HTML
    copy is left out: neither readable nor small at that size); CSV keeps every row. Raises
    :class:`UsageError` for an unknown format."""
    formats = list(formats)
    for f in formats:
        if f not in TABLE_FORMATS:
            raise bad_choice("table format", f, TABLE_FORMATS)
    out = []
    for name, df in tables.items():
        big = text_max_rows is not None and len(df) > text_max_rows
        fmts = (["csv"] if formats else []) if big else formats
        out += [save_table(df, Path(out_dir) / f"{name}.{f}") for f in fmts]
    return out


def files_table(folder: str | os.PathLike) -> pd.DataFrame:
    """Every file under ``folder`` (recursively, sorted): ``path`` relative to it and ``bytes``.
    An empty table when the folder does not exist. For showing what an export wrote."""
    root = Path(folder)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    return pd.DataFrame({"path": [str(p.relative_to(root)) for p in files],
                         "bytes": [p.stat().st_size for p in files]}, columns=["path", "bytes"])

"""The paged results table in a real browser: a report opened from ``file://`` in headless
Chromium (Playwright): its rows decoded in the page (``DecompressionStream``), page 2 shows rows
101-200, the filter finds a row that is not on page 1, and sorting by a numeric column orders
by number, not by text.

Needs Debian's ``/usr/bin/chromium`` (installed by ``.ci/run``) and the ``playwright`` Python
package (the ``test`` extra; its own browser download is not used). Outside CI a missing
Chromium skips; in CI (``CI`` set) it fails."""
import os
from pathlib import Path

import pytest

from flyexplore.results import table as R
from flyexplore.views import tables as T
from flyexplore.views.report import summary_table, write_report

from tests.views.test_report_scale import many

pytestmark = pytest.mark.slow  # a headless Chromium

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _need(ok: bool, why: str):
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"browser test cannot run in CI: {why}")
        pytest.skip(why)


def _body(page, box: str) -> list[list[str]]:
    return page.eval_on_selector_all(f"{box} tbody tr",
                                     "trs => trs.map(tr => [...tr.cells].map(td => td.textContent))")


def test_paged_table_pages_filters_and_sorts_from_file_url(tmp_path):
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _need(False, "playwright is not installed (pip install playwright; no 'playwright install')")
    _need(Path(CHROMIUM).exists(), f"no {CHROMIUM} (Debian: apt-get install chromium)")
    df = many(120)                                        # 240 rows: three pages
    needle = df.index[df["case"] == "1216x256x512"]     # case 76: rows 150, 151 -> not on page 1
    df.loc[needle, "case"] = "needle-1216x256x512"
    path = write_report(df, tmp_path / "rep", static=False)
    expected, _, _ = T.scan_table(summary_table(R.normalize(df)))
    rows = expected.to_numpy().tolist()
    col = list(expected.columns).index("time_us")
    times = [r[col] for r in rows]
    by_number = sorted(times, key=float)
    assert by_number != sorted(times)                     # text order differs: the check can fail
    errors = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.resolve().as_uri())
            box = "#tbl-results"
            page.wait_for_selector(f"{box}[data-ready='1']", timeout=30_000)
            info = page.locator(f"{box} .fx-info")
            expect(info).to_have_text("rows 1–100 of 240")
            assert _body(page, box) == rows[:100]
            page.click(f"{box} button[data-go='next']")
            expect(info).to_have_text("rows 101–200 of 240")
            assert _body(page, box) == rows[100:200]           # page 2: rows 101-200
            assert not any("needle" in c for r in rows[:100] for c in r)
            page.fill(f"{box} .fx-filter", "NEEDLE")           # case-insensitive substring
            expect(info).to_have_text("rows 1–2 of 2 (filtered from 240)")
            assert _body(page, box) == [r for r in rows if "needle-1216x256x512" in r]
            page.fill(f"{box} .fx-filter", "")
            expect(info).to_have_text("rows 1–100 of 240")
            page.click(f"{box} th:text-is('time_us')")
            shown = [r[col] for r in _body(page, box)]
            assert shown == by_number[:100]                       # ascending by number
            page.click(f"{box} button[data-go='last']")
            expect(info).to_have_text("rows 201–240 of 240")
            assert [r[col] for r in _body(page, box)] == by_number[200:]
            page.click(f"{box} th:text-is('time_us')")          # again: descending
            assert [r[col] for r in _body(page, box)] == sorted(times, key=float, reverse=True)[:100]
            assert "fx-desc" in page.get_attribute(f"{box} th:text-is('time_us')", "class")
            # several words: each somewhere in the row
            page.fill(f"{box} .fx-filter", "needle triton")
            expect(info).to_have_text("rows 1–1 of 1 (filtered from 240)")
            page.fill(f"{box} .fx-filter", "")
            # case labels start with a number but are text: natural order, not by the leading number
            c = list(expected.columns).index("case")
            page.click(f"{box} th:text-is('case')")
            page.click(f"{box} button[data-go='first']")
            natural = sorted(rows, key=lambda r: (not r[c][0].isdigit(), int(r[c].split("x")[0]) if r[c][0].isdigit() else 0,
                                                  r[c]))
            assert [r[c] for r in _body(page, box)] == [r[c] for r in natural][:100]
            # a speedup column ("0.745x [0.73, 0.76] vs aten") sorts by its number; blanks last
            sc = list(expected.columns).index("speedup")
            page.click(f"{box} th:text-is('speedup')")
            got = [r[sc] for r in _body(page, box)]
            want = sorted((r[sc] for r in rows if r[sc]), key=lambda v: float(v.split("x")[0]))
            assert got == want[:100]
        finally:
            browser.close()
    assert not errors, errors


def test_the_counts_say_when_a_table_has_more_rows_than_the_page(tmp_path, monkeypatch):
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _need(False, "playwright is not installed (pip install playwright; no 'playwright install')")
    _need(Path(CHROMIUM).exists(), f"no {CHROMIUM} (Debian: apt-get install chromium)")
    monkeypatch.setattr(T, "MAX_EMBEDDED_ROWS", 150)
    path = write_report(many(120), tmp_path / "rep", static=False)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=60_000)
        try:
            page = browser.new_page()
            page.goto(path.resolve().as_uri())
            page.wait_for_selector("#tbl-results[data-ready='1']", timeout=30_000)
            expect(page.locator("#tbl-results .fx-info")).to_have_text(
                "rows 1–100 of 150 in this page; the table has 240 rows")
        finally:
            browser.close()

"""Screenshot a report (headless Chromium via Playwright): the top of the page and the FlyDSL
section, for docs/.

    PYTHONPATH=. python benchmarks/tools/screenshot_report.py flyexplore-demo/report.html docs/demo-report.png

Needs /usr/bin/chromium (Debian: apt-get install chromium) and the playwright Python package.
"""
from __future__ import annotations

import sys
from pathlib import Path


def main(argv=None) -> int:
    from playwright.sync_api import sync_playwright

    argv = argv or sys.argv[1:]
    page_path, png = Path(argv[0]).resolve(), Path(argv[1])
    anchor = argv[2] if len(argv) > 2 else "FlyDSL on MI355X"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                               args=["--no-sandbox", "--disable-gpu"])
        p = b.new_page(viewport={"width": 1400, "height": 1800})
        p.goto(page_path.as_uri())
        p.wait_for_selector(".js-plotly-plot", timeout=60_000)
        p.wait_for_timeout(1500)
        p.get_by_text(anchor).first.scroll_into_view_if_needed()
        p.evaluate("window.scrollBy(0, -40)")
        png.parent.mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(png))
        b.close()
    print(f"screenshot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The report pages' screenshots in docs/images: a task's report.html with the attention view open.

    python docs/screenshots.py reports/cumsum/report.html docs/images/report_cumsum.png --example 1 --row 11
"""

import argparse
import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--example", default="0", help="the example's place in the view's list, from 0")
    parser.add_argument("--kind", default="cross")
    parser.add_argument("--layer", default="0", help="from 0")
    parser.add_argument("--head", default="all")
    parser.add_argument("--row", type=int, default=0, help="the row whose token is clicked, from 0")
    parser.add_argument("--width", type=int, default=1250)
    args = parser.parse_args()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"))
        page = browser.new_page(viewport={"width": args.width, "height": 900})
        page.goto(args.page.resolve().as_uri())
        for control in ("example", "kind", "layer", "head"):
            page.select_option(f"#av-{control}", getattr(args, control))
        page.locator("#av-heads table").first.locator(f'tbody th[data-index="{args.row}"]').click()
        page.mouse.move(0, 0)
        box = page.locator("#attention-view").evaluate(  # in the page's coordinates: nothing scrolls
            "e => { const r = e.getBoundingClientRect(); "
            "return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}; }")
        page.screenshot(path=str(args.out), full_page=True, clip=box)
        browser.close()


if __name__ == "__main__":
    main()

"""Retake the README's screenshot (docs/live-view.png): the default demo run, started from the New run form
with its defaults, on the Live page once a given step is reached.

    .venv/bin/python scripts/screenshot_live.py [--step 24] [--out docs/live-view.png]

Needs Chromium (Debian's package, or FINETUNE_STUDIO_CHROMIUM), Playwright (the dev extra) and, for the
page's icons, an emoji font (Debian's fonts-noto-color-emoji). It runs the
dashboard on a fresh data root in a temporary folder and cancels the run when done."""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

from playwright import sync_api

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.browser import chromium_path, kill_workers_under, StreamlitServer  # noqa: E402
from tests.support import MODELS_CACHE  # noqa: E402



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=int, default=24, help="take the picture once the run reaches this step")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "live-view.png")
    parser.add_argument("--height", type=int, default=1640,
                        help="window height in pixels (Streamlit scrolls its main area inside the window, so the "
                             "picture shows what fits)")
    args = parser.parse_args()
    chromium = chromium_path()
    if chromium is None:
        print("error: no Chromium found (install Debian's chromium or set FINETUNE_STUDIO_CHROMIUM)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = {**os.environ, "FINETUNE_STUDIO_HOME": str(home), "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE),
               "FINETUNE_STUDIO_FORCE_CPU": "1"}
        env.pop("DATABASE_URL", None)
        env.pop("FINETUNE_STUDIO_PASSWORD", None)
        server = StreamlitServer(ROOT, env, Path(tmp) / "server.log")
        try:
            server.start(timeout=120)
            with sync_api.sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, headless=True)
                page = browser.new_context(viewport={"width": 1400, "height": args.height}).new_page()
                page.set_default_timeout(120_000)
                page.goto(server.url)
                page.get_by_role("button", name="Start training").click()
                page.wait_for_url(re.compile(r".*/live$"))
                step_text = re.compile(r"step ([0-9]+) / ")
                for _ in range(600):  # the default demo takes ~2 s a step on 2 CPU cores
                    found = step_text.search(page.inner_text('[data-testid="stMain"]'))
                    if found and int(found.group(1)) >= args.step:
                        break
                    page.wait_for_timeout(1000)
                else:
                    print(f"error: the run did not reach step {args.step}\n{server.log_tail()}", file=sys.stderr)
                    return 1
                page.wait_for_timeout(2500)  # let the charts draw the last refresh
                page.screenshot(path=args.out)
                browser.close()
            print(f"wrote {args.out} at step {found.group(1)}")
            return 0
        finally:
            server.stop()
            kill_workers_under(home)


if __name__ == "__main__":
    sys.exit(main())

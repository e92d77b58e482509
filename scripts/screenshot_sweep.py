"""Take the Sweeps page's picture (docs/sweep-view.png) from a data root that holds a finished sweep: the one a
``python -m trainer_core sweep --config ...`` left, or the data root ``bench/sweep_overhead.py`` prints.

    .venv/bin/python scripts/screenshot_sweep.py --home DATA_ROOT [--sweep SWEEP_ID] [--out docs/sweep-view.png]

Needs Chromium (Debian's package, or FINETUNE_STUDIO_CHROMIUM) and Playwright (the dev extra). The dashboard runs on
a copy of the data root in a temporary folder, so the picture changes nothing of it."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from playwright import sync_api

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.browser import StreamlitServer, chromium_path  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a data root with a finished sweep")
    parser.add_argument("--sweep", default="", help="the sweep to show (default: the newest)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "sweep-view.png")
    parser.add_argument("--height", type=int, default=1500)
    args = parser.parse_args()
    chromium = chromium_path()
    if chromium is None:
        print("error: no Chromium found (install Debian's chromium or set FINETUNE_STUDIO_CHROMIUM)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        shutil.copytree(args.home, home, ignore=shutil.ignore_patterns("*.lock", "checkpoints", "adapter"))
        env = {**os.environ, "FINETUNE_STUDIO_HOME": str(home), "FINETUNE_STUDIO_FORCE_CPU": "1"}
        env.pop("DATABASE_URL", None)
        env.pop("FINETUNE_STUDIO_PASSWORD", None)
        server = StreamlitServer(ROOT, env, Path(tmp) / "server.log")
        try:
            server.start(timeout=120)
            with sync_api.sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, headless=True)
                page = browser.new_context(viewport={"width": 1400, "height": args.height}).new_page()
                page.set_default_timeout(120_000)
                page.goto(f"{server.url}/sweeps" + (f"?sweep={args.sweep}" if args.sweep else ""))
                page.get_by_text("Best: trial").wait_for()
                page.wait_for_timeout(3000)  # let the charts draw
                page.screenshot(path=args.out)
                browser.close()
            print(f"wrote {args.out}")
            return 0
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())

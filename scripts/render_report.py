"""Render a run's report.html in headless Chromium: a full-page PNG, and a check that nothing
needs sideways scrolling.

    python scripts/render_report.py RUN_DIR [--width 1000 --width 412] [--out-dir DIR]

For each width it prints ``width=W scroll_width=S height=H ok|OVERFLOW png=PATH`` and exits 1
if any width overflows. Chromium is looked up as chromium-headless-shell, chromium,
chromium-browser, google-chrome (or $CHROMIUM); on Debian: ``apt-get install
chromium-headless-shell`` (or ``chromium``). Exit 3 when no Chromium is found. Nothing listens
on a port: Chromium runs with --dump-dom / --screenshot only, with networking disabled.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome",
              "headless_shell")
PROBE = ("<script>(function(){var d=document.documentElement,b=document.body;"
         "var over=[];var all=b.getElementsByTagName('*');"
         "for(var i=0;i<all.length&&over.length<5;i++){var r=all[i].getBoundingClientRect();"
         "if(r.right>d.clientWidth+1){over.push(all[i].tagName+'.'+all[i].className)}}"
         "b.setAttribute('data-probe',d.scrollWidth+'x'+d.clientWidth+'x'+d.scrollHeight"
         "+'|'+over.join(','));})();</script>")


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Render:
    width: int
    scroll_width: int
    client_width: int
    height: int
    overflowing: str  # up to five elements sticking out on the right
    png: Path | None

    @property
    def ok(self) -> bool:
        return self.scroll_width <= self.client_width


def _chromium(binary: str, args: list[str], timeout: float = 60) -> str:
    with tempfile.TemporaryDirectory(prefix="spark-bpe-chromium-") as profile:
        cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--disable-extensions", "--disable-background-networking",
               "--disable-dev-shm-usage", "--proxy-server=127.0.0.1:9",
               f"--user-data-dir={profile}", *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"chromium failed ({res.returncode}): {res.stderr.strip()[-500:]}")
    return res.stdout


def render(html_path: Path, width: int, png: Path | None, binary: str) -> Render:
    """Measure the page at ``width`` CSS pixels (and screenshot the full page to ``png``)."""
    page = html_path.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="spark-bpe-report-") as tmp:
        probe = Path(tmp) / "probe.html"
        probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
        dom = _chromium(binary, ["--dump-dom", f"--window-size={width},900", probe.as_uri()])
    m = re.search(r'data-probe="(\d+)x(\d+)x(\d+)\|([^"]*)"', dom)
    if not m:
        raise RuntimeError("could not measure the page (no probe result in the DOM)")
    scroll, client, height = (int(m.group(i)) for i in (1, 2, 3))
    if png is not None:
        png.parent.mkdir(parents=True, exist_ok=True)
        _chromium(binary, [f"--screenshot={png}", f"--window-size={width},{height + 20}",
                           html_path.resolve().as_uri()])
    return Render(width, scroll, client, height, m.group(4), png)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target", help="a run directory or a report.html")
    p.add_argument("--width", type=int, action="append", help="CSS px (default 1000 and 412)")
    p.add_argument("--out-dir", default=None, help="where the PNGs go (default: beside it)")
    args = p.parse_args(argv)
    html_path = Path(args.target)
    if html_path.is_dir():
        html_path = html_path / "report.html"
    if not html_path.exists():
        print(f"error: {html_path} does not exist", file=sys.stderr)
        return 2
    binary = find_chromium()
    if binary is None:
        print("error: no Chromium found (apt-get install chromium-headless-shell)",
              file=sys.stderr)
        return 3
    out_dir = Path(args.out_dir) if args.out_dir else html_path.parent
    bad = 0
    for w in args.width or [1000, 412]:
        r = render(html_path, w, out_dir / f"report-{w}px.png", binary)
        bad += not r.ok
        print(f"width={w} scroll_width={r.scroll_width} height={r.height} "
              f"{'ok' if r.ok else 'OVERFLOW ' + r.overflowing} png={r.png}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The HTML report in a real browser: no table or figure wider than a 1280 or 1366 px window.

Headless Chromium (Debian's package, /usr/bin/chromium) lays the page out; a script added to a
copy of the page writes what overflows into the document's title on load, and --dump-dom, which
serializes the document after its scripts ran, carries the title back. A scroll box hides an
overflowing table from the page's own scrollWidth, so the script also counts boxes whose content
is wider than they are and elements whose right edge lies past the window. Skipped without
Chromium (apt-get install -y chromium).
"""

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stepbench.cli import main
from test_report_layout import SIX_FILES

pytestmark = pytest.mark.slow     # every test here starts child processes

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# benchmarks/README.md's command for the example report (benchmarks/report/report.html).
EXAMPLE = [ROOT / "benchmarks" / "results" / "h200-2026-11-30-repeats3.jsonl",
           *sorted((ROOT / "tests" / "data" / "post").glob("*.jsonl")),
           "--prices", ROOT / "benchmarks" / "prices.toml", "--energy-price", "0.15"]
SIX = [*SIX_FILES, "--price", "NVIDIA H200=3.50", "--energy-price", "0.15"]

PROBE = """<script>
addEventListener("load", () => {
  const wide = [...document.querySelectorAll("body *")]
    .filter(e => e.getBoundingClientRect().right > innerWidth + 0.5);
  const clipped = [...document.querySelectorAll(".scroll")]
    .filter(b => b.scrollWidth > b.clientWidth);
  document.title = JSON.stringify({
    scrollWidth: document.documentElement.scrollWidth, innerWidth: innerWidth,
    clipped: clipped.length,
    wide: wide.slice(0, 3).map(e => e.tagName + " " + e.textContent.slice(0, 60))});
});
</script>
"""
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def layout(page: Path, width: int, profile: Path) -> dict:
    """What overflows `page` in a window `width` px wide, as the probe measured it."""
    probed = page.with_name("probed.html")
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
                           f"--window-size={width},900", "--dump-dom", probed.as_uri()],
                          capture_output=True, text=True, timeout=120)
    title = re.search(r"<title>(.*?)</title>", proc.stdout, re.S)
    assert title and title.group(1).startswith("{"), proc.stdout[-500:] + proc.stderr[-2000:]
    return json.loads(html.unescape(title.group(1)))


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install -y chromium)")
@pytest.mark.parametrize("case, args", [("example", EXAMPLE), ("six files", SIX)])
def test_every_table_and_plot_fits_the_window(tmp_path, capsys, case, args):
    page = tmp_path / "report.html"
    assert main(["report", *map(str, args), "--format", "html", "--out", str(page)]) == 0
    capsys.readouterr()
    for width in (1280, 1366):
        found = layout(page, width, tmp_path / "profile")
        assert found["innerWidth"] == width, found
        assert found["scrollWidth"] <= found["innerWidth"], found
        assert found["clipped"] == 0 and found["wide"] == [], found

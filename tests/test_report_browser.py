"""report.html in a real browser: headless Chromium renders it, and the verdict shows.

The verdict banner has a colour of its own (``gameday.report.html.PASS_RGB`` /
``FAIL_RGB``); the test finds it in the screenshot's top rows, and reads the verdict text
from the DOM Chromium rendered (``--dump-dom``). Skips where Chromium is absent (.ci/run
installs Debian's ``chromium``). Every Chromium started here runs in its own process
group and is stopped by that group's id, helpers included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gameday.report import build_report
from gameday.report.html import FAIL_RGB, PASS_RGB
from gameday.report.synthetic import Scenario, write_run

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian: apt-get install chromium; .ci/run does)",
)
WIDTH, HEIGHT = 1280, 900
TIMEOUT_S = 90


def _chromium(tmp_path: Path, *args: str) -> str:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--disable-breakpad",
        "--disable-crash-reporter",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--window-size={WIDTH},{HEIGHT}",
        *args,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"chromium did not finish within {TIMEOUT_S} s: {cmd}") from None
    finally:
        # The zygote, GPU and crashpad helpers share the group we created: stop them too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    return out


def _banner_share(png: Path, rgb: tuple[int, int, int]) -> float:
    """Share of the screenshot's top band whose pixels have exactly the banner's colour."""
    from matplotlib.image import imread

    image = imread(png)[:, :, :3]
    assert image.shape[:2] == (HEIGHT, WIDTH)
    band = np.rint(image[5:60] * 255).astype(int)
    return float((np.abs(band - np.array(rgb)).max(axis=2) <= 2).mean())


@pytest.mark.parametrize("verdict", ["pass", "fail"])
def test_screenshot_shows_the_verdict(tmp_path: Path, verdict: str) -> None:
    # A control run that trips fails; one that does not passes.
    run = write_run(
        tmp_path / "run",
        [Scenario("control", "control", "none", "no_trip", trips=verdict == "fail")],
        requests_per_experiment=200,
    )
    summary = build_report(run)
    assert summary.verdict == verdict
    url = summary.report_html.resolve().as_uri()

    shot = tmp_path / "shot.png"
    _chromium(tmp_path, f"--screenshot={shot}", url)
    mine, other = (PASS_RGB, FAIL_RGB) if verdict == "pass" else (FAIL_RGB, PASS_RGB)
    assert _banner_share(shot, mine) > 0.6
    assert _banner_share(shot, other) == 0.0

    dom = _chromium(tmp_path, "--dump-dom", url)
    assert f'<h1 id="verdict-text">{verdict.upper()}</h1>' in dom
    assert summary.headline in dom
    # The images are embedded: nothing but data: URIs.
    assert 'src="data:image/png;base64,' in dom and 'src="file:' not in dom

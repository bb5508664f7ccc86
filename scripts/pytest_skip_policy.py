"""pytest plugin used by every nox test session: a skip is allowed only for a missing GPU adapter or CUDA.

A test that skips for any other reason (a package not installed, a case the test could not set up)
hides a missing feature or a missing install step, so the run fails and names each such skip. At the
end of the run one line says how many tests skipped and why:

    skip policy: 3 skipped for a missing GPU adapter / CUDA, 0 for any other reason

With ``TB_SKIP_REPORT_DIR`` set, the counts are also written there as JSON (one file per run), so
``nox -s ci`` can print the total over every session.

Loaded with ``pytest -p pytest_skip_policy`` (``scripts/`` on ``PYTHONPATH``); xfails are not skips.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

#: The reasons a skip may give: no GPU adapter (WebGPU / Vulkan), an adapter without an optional
#: feature (shader-f16, shader-int64), or no CUDA device.
ALLOWED = re.compile(
    r"no (WebGPU |GPU |Vulkan )?adapter|adapter (has no|does not offer)|does not offer shader-|\bCUDA\b",
    re.IGNORECASE,
)

_skips: list[tuple[str, str]] = []


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skips.append((report.nodeid, _reason(report)))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:
        _skips.append((report.nodeid, _reason(report)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    allowed = [s for s in _skips if ALLOWED.search(s[1])]
    other = [s for s in _skips if not ALLOWED.search(s[1])]
    for nodeid, reason in other:
        terminalreporter.write_line(f"skip policy: not allowed: {nodeid}: {reason}", red=True)
    terminalreporter.write_line(
        f"skip policy: {len(allowed)} skipped for a missing GPU adapter / CUDA, {len(other)} for any other reason"
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    other = [s for s in _skips if not ALLOWED.search(s[1])]
    folder = os.environ.get("TB_SKIP_REPORT_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        counts = {
            "allowed": len(_skips) - len(other),
            "other": len(other),
            "args": [str(a) for a in session.config.args],
        }
        (Path(folder) / f"{uuid.uuid4().hex}.json").write_text(json.dumps(counts))
    if other and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

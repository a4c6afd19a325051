"""Every code example marked `<!-- docs-test: run -->` in the README and docs/ runs against a real
`chronos up`, as a reader would run it: in a directory whose `.chronos/ready.json` names the stack,
shell blocks with bash (`chronos` and `.venv/bin/chronos` both found), Python blocks as scripts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from kits.stack import ChronosUp, clean_env
from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- docs-test: run -->"
FENCE = re.compile(r"```(?P<lang>\w+)\n(?P<code>.*?)\n```", re.S)


def examples() -> list[tuple[str, str, str]]:
    """(where, language, code) of every marked block, in page order."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text()
        for match in re.finditer(re.escape(MARK) + r"\n", text):
            block = FENCE.match(text, match.end())
            if block is None or block["lang"] not in ("sh", "python"):
                raise AssertionError(f"{page.relative_to(ROOT)}: {MARK} must precede a ```sh or ```python block")
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", block["lang"], block["code"]))
    return found


EXAMPLES = examples()


def test_the_guide_has_runnable_examples():
    where = {w.split(":")[0] for w, _, _ in EXAMPLES}
    assert {"README.md", "docs/guide/scheduling.md", "docs/guide/python-client.md", "docs/guide/recurring.md"} <= where


@pytest.fixture(scope="module")
def reader_dir(tmp_path_factory):
    """A directory as a reader's would be after `make up`: `.chronos/ready.json` and `.venv/`."""
    stack = ChronosUp("--no-console")
    info = stack.start()
    home = tmp_path_factory.mktemp("reader")
    (home / ".chronos").mkdir()
    shutil.copy(stack.ready_file, home / ".chronos" / "ready.json")
    (home / ".venv").symlink_to(Path(sys.executable).parent.parent)
    yield home, info
    stack.stop()


def run(home: Path, lang: str, code: str) -> subprocess.CompletedProcess:
    env = clean_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    command = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
    return subprocess.run(command, cwd=home, env=env, capture_output=True, text=True, timeout=45)


def show(home: Path, message_id: str) -> dict:
    done = run(home, "sh", f"chronos show {message_id} --json")
    return orjson.loads(done.stdout) or {} if done.stdout.strip() else {}


@pytest.mark.timeout(120)
def test_every_marked_example_runs(reader_dir):
    home, _ = reader_dir
    # the blocks are independent (each names its own ids), so they run side by side: the test stays short
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda example: run(home, example[1], example[2]), EXAMPLES))
    for (where, _, code), done in zip(EXAMPLES, results):
        assert done.returncode == 0, f"the example at {where} failed:\n{code}\n{done.stdout}\n{done.stderr}"
        if "chronos tail" in code or "consumer.poll" in code:  # the examples that receive: something arrived
            assert done.stdout.strip(), f"{where}: nothing arrived\n{done.stderr}"
    # what the examples scheduled is really in the store
    for schedule in ("daily-report", "nightly-0230"):
        wait_for(lambda: show(home, schedule).get("state") == "recurring", timeout=20,
                 what=f"the example's schedule {schedule} in the store")

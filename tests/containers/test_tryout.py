"""`chronos up` in the image with the embedded extra: the containers page's one-command try-out, run as written."""

from __future__ import annotations

import re

import pytest

from kits.fleet import page_blocks
from kits.podman import podman, shell
from kits.stack import http_get
from containerkit import PAGE
from helpers import wait_for

pytestmark = pytest.mark.timeout(300)
NAME = "chronos-try"  # the page's container


@pytest.fixture
def tryout(images):
    podman("rm", "--force", NAME, check=False)
    yield
    podman("rm", "--force", "--time", "0", NAME, check=False)


def run_block(tag: str, timeout: float = 180.0):
    (code,) = page_blocks(PAGE, tag)
    return shell(code, timeout)


def test_chronos_up_runs_in_the_embedded_image_as_the_page_says(tryout):
    done = run_block("tryout")
    assert "key='hello' value='world'" in done.stdout, done.stdout + done.stderr
    # the console, published on the host's loopback where the page says
    (port,) = re.findall(r"--publish 127\.0\.0\.1:(\d+):9700 ", page_blocks(PAGE, "tryout")[0])
    status, page = wait_for(lambda: (lambda r: r if r[0] == 200 else None)(http_get(f"http://127.0.0.1:{port}/")),
                            timeout=30, what="the console")
    assert b"Chronos" in page
    run_block("tryout stop", timeout=90)
    assert podman("container", "exists", NAME, check=False).returncode == 1

"""The image `make image` builds: what is in it and what is not, its labels, and a build that finds its inputs
unchanged remakes nothing (and fails on no image of an earlier build that a container still uses)."""

from __future__ import annotations

import importlib.util
import json
import subprocess

from kits.fleet import page_blocks
from kits.podman import make_image, podman
from chronos import __version__
from containerkit import PAGE, ROOT, TAG

INSIDE = """
set -eu
id -u; id -g
for tool in gcc cc c++ g++ ld as make cython apt apt-get; do command -v $tool || true; done
find /usr/include /usr/local/include -name '*.h' 2>/dev/null | head -3
dpkg-query -W -f '${Package}\\n' | grep -E -- '-dev$|^gcc(-[0-9]+)?$|^g\\+\\+|^cpp|^binutils|^libgcc-[0-9]+-dev' || true
touch /opt/chronos/probe 2>&1 || true
python -I -c 'import psycopg, chronos.codec; print(psycopg.pq.__impl__, chronos.codec.IMPL, psycopg.pq.version())'
"""


def _build_script():
    """deploy/image/build.py, the script `make image` runs (not a package)."""
    spec = importlib.util.spec_from_file_location("image_build", ROOT / "deploy" / "image" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_image_runs_as_its_own_user_with_no_compiler_no_headers_and_a_read_only_root(image):
    done = podman("run", "--rm", "--read-only", "--entrypoint", "/bin/sh", image, "-c", INSIDE)
    lines = done.stdout.splitlines()
    assert lines[:2] == ["10001", "10001"], done.stdout
    assert "Read-only file system" in done.stdout + done.stderr
    # nothing between the ids and the last line: no compiler, no header, no development package
    assert [line for line in lines[2:-1] if "Read-only" not in line] == [], done.stdout
    impl, codec, libpq = lines[-1].split()
    assert (impl, codec) == ("c", "native") and int(libpq) >= 150000, lines[-1]


def test_the_labels_name_the_version_and_the_commit_and_tini_runs_chronos(image):
    (config,) = json.loads(podman("image", "inspect", image).stdout)
    labels = config["Config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    # the commit it was built from, whose files that go into the wheel are those of this checkout's commit (a
    # commit of docs or tests alone reuses the image), with "-dirty" when the checkout's differ from them
    commit, _, dirty = labels["org.opencontainers.image.revision"].partition("-")
    inputs = _build_script().WHEEL_INPUTS
    git = ["git", "-C", str(ROOT)]
    assert subprocess.run([*git, "diff", "--quiet", commit, "HEAD", "--", *inputs], timeout=60).returncode == 0, commit
    changed = subprocess.run([*git, "status", "--porcelain", "--", *inputs], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    assert dirty == ("dirty" if changed else ""), changed
    assert config["Config"]["Entrypoint"] == ["/usr/bin/tini", "--", "/opt/chronos/venv/bin/chronos"]
    assert config["Config"]["User"] == "10001:10001"
    assert podman("run", "--rm", image, "--version").stdout.strip() == f"chronos {__version__}"


def test_make_image_again_remakes_nothing_and_leaves_an_old_image_a_container_uses(images):
    # an image of an earlier build that no tag names any more, with a container on it: the build's clean-up
    # leaves it (podman refuses to remove it) instead of failing
    builder = subprocess.run(["buildah", "from", "--pull-never", "--quiet", TAG], capture_output=True, text=True,
                             check=True, timeout=120).stdout.strip()
    subprocess.run(["buildah", "config", "--label", "io.chronos.image.inputs=an-earlier-build", builder],
                   capture_output=True, check=True, timeout=120)
    old = subprocess.run(["buildah", "commit", "--quiet", "--rm", builder], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    user = podman("create", old, "--version").stdout.strip()
    try:
        (build,) = page_blocks(PAGE, "image build")
        again, output = make_image(build)
        assert podman("image", "exists", old, check=False).returncode == 0, output
    finally:
        podman("rm", user)
        podman("rmi", old)
    assert {tag: made.id for tag, made in again.items()} == {tag: made.id for tag, made in images.items()}, output
    assert all(made.built_s is None for made in again.values()), output
    assert TAG in again and f"{TAG}-embedded" in again

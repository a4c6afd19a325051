"""Chronos installed on the fleet's hosts as docs/operations/host-install.md says, and the wheels it is
installed from: this checkout's, and an earlier release's (built from the commit CHANGELOG.md records).

The install page's blocks are found by their markers (`<!-- fleet: TAG -->` before a fenced block) and run
as written: `release` and `once` (the system user, the virtual environment from the wheel: one environment
shared by every host), `host` (the shipped files, on each host), `migrate` (as the database's owner, on the
first), `start` (supervisord), `check` (once a host is up, and the page's shell functions). An earlier
release is installed beside by the upgrade page's `install beside`. Each host has its own /etc/chronos,
/run/chronos, /var/log/chronos, /var/lib/chronos, /etc/systemd/system and /etc/hosts, bind-mounted in a
mount namespace of its own.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

from kits.fleet.common import ROOT, FleetError, plain_env, write_file

INSTALL_PAGE = ROOT / "docs" / "operations" / "host-install.md"
UPGRADE_PAGE = ROOT / "docs" / "operations" / "upgrading.md"
CHANGELOG = ROOT / "CHANGELOG.md"
# what a host's mount namespace gives it of its own (mount point -> directory under the host's folder)
OWN_DIRS = {"/etc/chronos": "etc", "/run/chronos": "run", "/var/log/chronos": "log", "/var/lib/chronos": "home",
            "/etc/systemd/system": "systemd"}
SHARED_DIR = "/opt/chronos"
BLOCK = re.compile(r"^(?P<indent>[ \t]*)<!-- fleet: (?P<tag>[\w ]+) -->\n(?P=indent)```(?P<lang>sh|bash|yaml)\n(?P<code>.*?)\n"
                   r"(?P=indent)```", re.S | re.M)


def page_blocks(page: Path, tag: str, lang: tuple[str, ...] = ("sh", "bash")) -> list[str]:
    """The shell blocks (or blocks of `lang`) of `page` marked `<!-- fleet: TAG -->`, in page order."""
    blocks = [textwrap.dedent(m["code"]) for m in BLOCK.finditer(page.read_text())
              if m["tag"].strip() == tag and m["lang"] in lang]  # a block in a list item is indented with it
    if not blocks:
        raise FleetError(f"{page.relative_to(ROOT)} has no block marked <!-- fleet: {tag} -->")
    return blocks


# -- the hosts' file systems ----------------------------------------------------------------------


def mount_script(path: Path, binds: dict[str, Path]) -> Path:
    """A script that bind-mounts each directory (or file) on its place, then runs its arguments: run
    in a mount namespace of its own (`ip netns exec` makes one), the mounts are that host's alone."""
    lines = ["#!/bin/sh", "set -e"]
    lines += [f"mount --bind {shlex.quote(str(src))} {shlex.quote(target)}" for target, src in binds.items()]
    lines.append('exec "$@"')
    return write_file(path, "\n".join(lines) + "\n", 0o755)


def mount_points(targets: list[str]) -> None:
    """The mount points must exist in the machine's own file system (empty directories are made)."""
    for target in targets:
        if target != "/etc/hosts":
            Path(target).mkdir(parents=True, exist_ok=True)


# -- the wheels, and the install -----------------------------------------------------------------


#: The folder where `make test` builds the wheels before the tests start (`python -m kits.fleet FOLDER`):
#: this checkout's in FOLDER/checkout, the release before it in FOLDER/release, both at once. Without it, the
#: tests build the wheels they need themselves.
WHEELS_ENV = "TEST_WHEELS_DIR"


def built_ahead(kind: str, version: str = "*") -> Path | None:
    """The wheel `make test` built before the tests (`kind`: checkout, release), if it did."""
    folder = os.environ.get(WHEELS_ENV)
    found = sorted(Path(folder, kind, "dist").glob(f"chronos_scheduler-{version}-*.whl")) if folder else []
    return found[0] if found else None


def build_wheel(workdir: Path, timeout: float = 600.0) -> Path:
    """The wheel `pip wheel` builds from a clean copy of the checkout: the files git tracks (and new files
    it does not ignore, symbolic links as links), so no build output of the working tree leaks in; the
    native codec is compiled by the build itself."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout
    src, dist = workdir / "checkout", workdir / "dist"
    for name in filter(None, listed.split("\0")):
        origin, copy = ROOT / name, src / name
        if not origin.is_symlink() and not origin.exists():
            continue  # deleted in the working tree, not yet in git
        copy.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_symlink():
            copy.symlink_to(os.readlink(origin))
        else:
            copy.write_bytes(origin.read_bytes())
    return _pip_wheel(src, dist, "*", timeout)


def _pip_wheel(src: Path, dist: Path, version: str, timeout: float) -> Path:
    """`pip wheel` of the source tree `src` into `dist`, with nothing of this test run's environment; the wheel."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CHRONOS_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dist),
                           str(src)], capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise FleetError(f"pip wheel of {src} failed:\n{done.stdout}\n{done.stderr}")
    (built,) = dist.glob(f"chronos_scheduler-{version}-*.whl")
    return built


def release_commit(version: str) -> str:
    """The commit a release was built from, as CHANGELOG.md records it under the release's heading."""
    section = re.search(rf"^## {re.escape(version)}\b.*?(?=^## |\Z)", CHANGELOG.read_text(), re.S | re.M)
    found = section and re.search(r"commit `([0-9a-f]{40})`", section[0])
    if not found:
        raise FleetError(f"CHANGELOG.md names no commit for release {version}")
    return found[1]


def release_schema_version(version: str) -> int:
    """The schema version a release's migrations end at, read from the files of its commit."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", release_commit(version),
                             "chronos/adapters/postgres/sql/"], capture_output=True, text=True, check=True,
                            timeout=60).stdout.split()
    return max(int(m[1]) for name in listed if (m := re.search(r"/(\d{4})_[^/]*\.sql$", name)))


def previous_release() -> str:
    """The release before this checkout's, the second in CHANGELOG.md (newest first)."""
    versions = re.findall(r"^## (\d+\.\d+\.\d+)\b", CHANGELOG.read_text(), re.M)
    if len(versions) < 2:
        raise FleetError("CHANGELOG.md names no release before this one")
    return versions[1]


def release_wheel(version: str, workdir: Path, timeout: float = 600.0) -> Path:
    """The wheel of an earlier release, built by `pip wheel` from its commit's files (`git archive`), as a
    site that keeps its releases' wheels would have it."""
    ahead = built_ahead("release", version)
    if ahead is not None:
        return ahead
    commit = release_commit(version)
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        raise FleetError(f"release {version}'s commit {commit} is not in this clone (a shallow clone?): "
                         "clone the repository with its history")
    src, dist = workdir / f"release-{version}", workdir / "dist"
    src.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True,
                             check=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True, timeout=120)
    return _pip_wheel(src, dist, version, timeout)


def wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def install_chronos(wheel: Path, opt_dir: Path, workdir: Path, *, timeout: float = 600.0) -> Path:
    """Install the package on the fleet's shared /opt/chronos as the install page says (its blocks
    marked `once`, after its `release`), from the directory that holds `wheel`, with the machine's network
    (the package registry). Returns the environment the page links as /opt/chronos/venv (here under `opt_dir`).

    A wheel of another release than the page's is installed by the upgrade page's `install beside`, with
    RELEASE its version, in an environment of its own beside the others, and the link is left as it was.

    pip also finds the wheels `make test` built into this venv's `wheelhouse` (psycopg-c, compiled against
    the same libpq): the page's command runs as written, as on a site with a wheelhouse, without a
    minute of compiling psycopg-c again."""
    from chronos import __version__ as page_version
    version = wheel_version(wheel)
    opt_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(opt_dir, 0o755)
    home = workdir / "install-home"
    home.mkdir(parents=True, exist_ok=True)
    binds = {SHARED_DIR: opt_dir, "/var/lib/chronos": home}
    mount_points(list(binds))
    script = mount_script(workdir / "install-mounts", binds)
    wheelhouse = _with_wheelhouse(Path(sys.prefix) / "wheelhouse")
    if version == page_version:
        (release,) = page_blocks(INSTALL_PAGE, "release")
        blocks, variables = [f"{release}\n{code}" for code in page_blocks(INSTALL_PAGE, "once")], {}
    else:  # the reader's one place for the release: the variable the upgrade page's blocks use
        blocks, variables = page_blocks(UPGRADE_PAGE, "install beside"), {"RELEASE": version}
    for code in blocks:
        if "useradd" in code and _user_exists("chronos"):
            continue  # one system user serves every host of this machine
        done = subprocess.run(["unshare", "--mount", "--propagation", "slave", str(script), "bash", "-euo",
                               "pipefail", "-c", code], cwd=wheel.parent, capture_output=True, text=True,
                              timeout=timeout, env=plain_env(**wheelhouse, **variables))
        if done.returncode != 0:
            raise FleetError(f"the install page's block failed ({done.returncode}):\n{code}\n{done.stdout}\n{done.stderr}")
    if version != page_version:
        return opt_dir / f"venv-{version}"
    link = opt_dir / "venv"
    if not link.is_symlink():
        raise FleetError(f"the install page's blocks made no {SHARED_DIR}/venv")
    return opt_dir / os.readlink(link).removeprefix(SHARED_DIR + "/")


def _user_exists(name: str) -> bool:
    import pwd
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _with_wheelhouse(built: Path) -> dict[str, str]:
    """PIP_FIND_LINKS with `built` first, then the links this machine's pip has already (its environment's
    and its configuration's, which the variable would otherwise replace); {} without `built`."""
    if not built.is_dir():
        return {}
    configured = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                                capture_output=True, text=True, timeout=60).stdout.split()
    links = dict.fromkeys([str(built), *os.environ.get("PIP_FIND_LINKS", "").split(), *configured])
    return {"PIP_FIND_LINKS": " ".join(links)}


def build_ahead(folder: Path) -> None:
    """This checkout's wheel and the previous release's, built at once into `folder` (`WHEELS_ENV`)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        checkout = pool.submit(build_wheel, folder / "checkout")
        release = pool.submit(release_wheel, previous_release(), folder / "release")
        print(f"built {checkout.result().name} and {release.result().name} in {folder}", flush=True)


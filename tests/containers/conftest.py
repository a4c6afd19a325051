"""The container tests: Chronos's image, built by `make image` as the containers page says (once a session,
and only where its inputs changed), run by podman against the tests' PostgreSQL and broker on the host's
network (kits/podman.py). They need root and `make test`'s podman, buildah, runc and mmdebstrap;
without them they fail saying what to install."""

from __future__ import annotations

import shutil
from typing import Iterator

import pytest

from kits.fleet import page_blocks
from kits.podman import Container, Made, make_image, run
from chronos.embedded.procs import free_port
from containerkit import PAGE, TAG


@pytest.fixture(scope="session")
def images() -> dict[str, Made]:
    """What the page's build command made (or found up to date), by tag."""
    missing = [tool for tool in ("podman", "buildah", "mmdebstrap", "runc") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"the container tests need {', '.join(missing)}: make test installs them (make containers)")
    (build,) = page_blocks(PAGE, "image build")
    made, _ = make_image(build)
    return made


@pytest.fixture(scope="session")
def image(images: dict[str, Made]) -> str:
    """The id of this checkout's image."""
    return images[TAG].id


class Containers:
    """Containers of one test, removed at its end."""

    def __init__(self, image: str, env: dict[str, str]):
        self.image, self.env = image, env
        self.started: list[Container] = []

    def start(self, *command: str, image: str | None = None, options: tuple[str, ...] = (), **env: str) -> Container:
        container = run(image or self.image, *command, env={**self.env, **env}, options=options)
        self.started.append(container)
        return container

    def role(self, role: str, **env: str) -> tuple[Container, int]:
        """A container of `role` serving /metrics, /healthz and /livez on a port of its own, once it does."""
        port = free_port()
        container = self.start(role, CHRONOS_METRICS_PORT=str(port), **env)
        container.wait_for_log(f"serving /metrics and /healthz on port {port}")
        return container, port

    def remove_all(self) -> None:
        for container in self.started:
            container.remove()


@pytest.fixture
def containers(image: str, chronos_env: dict[str, str]) -> Iterator[Containers]:
    made = Containers(image, chronos_env)
    yield made
    made.remove_all()

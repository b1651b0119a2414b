"""A class-data-sharing (CDS) archive for the driver's JVM: Spark's classes mapped ready-parsed at start.

A JVM start loads and verifies every class it uses one by one, most of a restarted job's JVM and
session time on a small machine. With ``-XX:SharedArchiveFile`` it maps them from an archive
instead. The archive is made from this installation's own run: a start without one has the JVM
record the classes it loads (``-XX:DumpLoadedClassList``), and once the job has run its first batches
(:data:`BUILD_AFTER_S`) a background ``java -Xshare:dump`` at the lowest priority writes the archive
for the next start. An archive belongs to one JVM and one set of Spark jars (its name is a hash of
them, :meth:`ClassArchive.find`); a JVM that finds it does not match runs without it, as with none.
Only a JVM the job starts itself gets one (not one spark-submit started). The figures:
bench/STREAMING_RESULTS.md, "back to deciding after a crash".
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import procfs

log = logging.getLogger(__name__)

#: where the archives live, beside the jars ``make setup`` resolved
CDS_DIR = Path(__file__).resolve().parents[1] / "build" / "jvm" / "cds"
#: seconds after the session's start when the archive is built: the first batches have loaded their classes
BUILD_AFTER_S = 120.0
#: a JVM option of these already chooses what the JVM shares: the job adds none of its own
_OPERATOR_CHOICES = ("-Xshare", "SharedArchiveFile", "DumpLoadedClassList", "ArchiveClassesAtExit")


def _java() -> Path | None:
    """The JVM binary Spark's launcher runs: ``$JAVA_HOME/bin/java``, else ``java`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home, "bin", "java")) if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and os.path.isfile(found) else None


def _spark_jars() -> list[Path]:
    from pyspark.find_spark_home import _find_spark_home

    return sorted(Path(_find_spark_home(), "jars").glob("*.jar"))


def fingerprint(files: Sequence[Path]) -> str:
    """A hash of ``files``' paths, sizes and modification times: changes when any is replaced."""
    digest = hashlib.sha1()
    for f in files:
        st = f.stat()
        digest.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def dump_command(jvm_cmdline: Sequence[str], class_list: Path, archive: Path) -> list[str]:
    """``java -Xshare:dump`` writing ``archive`` from ``class_list`` with the class path and modules of the
    running driver JVM whose command line is ``jvm_cmdline``: the archive must match how it starts."""
    java, args = jvm_cmdline[0], list(jvm_cmdline[1:])
    class_path = args[args.index("-cp") + 1] if "-cp" in args else ""
    modules = [a for a in args if a.startswith("--add-modules")]
    return [java, "-Xshare:dump", f"-XX:SharedClassListFile={class_list}", f"-XX:SharedArchiveFile={archive}",
            "-cp", class_path, *modules]  # fmt: skip


def _being_written(partial: Path) -> bool:
    """True for a partial archive (``.<name>.<pid>``) whose job still runs: another build under way."""
    pid = partial.suffix[1:]
    return partial.name.startswith(".") and pid.isdigit() and procfs.stat(int(pid)) is not None


def _left_by_a_dead_job(class_list: Path) -> bool:
    """True for a class list (``<archive>.<pid>.classes``) whose job is gone before it built the archive."""
    pid = class_list.suffixes[-2][1:] if len(class_list.suffixes) >= 2 else ""
    return pid.isdigit() and procfs.stat(int(pid)) is None


@dataclass(frozen=True)
class ClassArchive:
    """The archive for one JVM and one set of Spark jars, and the class list a start without it records."""

    path: Path

    @classmethod
    def find(cls, folder: Path = CDS_DIR) -> ClassArchive | None:
        """This installation's archive (it may not exist yet); None without a JVM, a folder to keep it in, or
        once building it failed."""
        java = _java()
        if java is None:
            return None
        libjvm = java.parents[1] / "lib" / "server" / "libjvm.so"  # a JDK update replaces it
        jvm = [java, libjvm] if libjvm.is_file() else [java]
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:  # a read-only installation: the JVM starts as it would without
            return None
        archive = cls(folder / f"spark-{fingerprint([*jvm, *_spark_jars()])}.jsa")
        # a job killed before it built the archive leaves its list: one a start, were it crash-looping
        for stale in folder.glob("spark-*.classes"):
            if _left_by_a_dead_job(stale):
                stale.unlink(missing_ok=True)
        return None if archive.failed.exists() else archive

    @property
    def class_list(self) -> Path:
        return self.path.with_name(f"{self.path.stem}.{os.getpid()}.classes")

    @property
    def failed(self) -> Path:
        """Written when the JVM refuses to build the archive, with why: no later start tries again (delete it to
        retry)."""
        return self.path.with_suffix(".failed")

    def java_options(self, given: str) -> str:
        """``given`` JVM options plus the archive's: use it, or record the classes for it (none if ``given``
        already says what to share)."""
        if any(choice in given for choice in _OPERATOR_CHOICES):
            return given
        if self.path.is_file():
            return f"{given} -XX:SharedArchiveFile={self.path}".strip()
        return f"{given} -XX:DumpLoadedClassList={self.class_list}".strip()

    def build_later(self, jvm_pid: int, after_s: float = BUILD_AFTER_S) -> None:
        """In ``after_s`` seconds, unless it exists by then, build the archive from the class list the driver
        JVM ``jvm_pid`` records; in a daemon thread, the dump itself in a process at the lowest priority."""
        if self.path.is_file():
            return
        timer = threading.Timer(after_s, lambda: self.build(procfs.cmdline(jvm_pid) or []))
        timer.daemon = True
        timer.start()

    def build(self, jvm_cmdline: Sequence[str]) -> bool:
        """Write the archive now from the class list, for a JVM started as ``jvm_cmdline``; True if written."""
        if self.path.is_file() or "-cp" not in jvm_cmdline or not self.class_list.is_file():
            return False  # built by another job meanwhile, or the JVM is gone, or it recorded nothing
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            dump = subprocess.Popen(dump_command(jvm_cmdline, self.class_list, partial), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
            os.setpriority(os.PRIO_PROCESS, dump.pid, 19)  # only what the job and its neighbours leave idle
            try:
                _, err = dump.communicate(timeout=1800)
            except subprocess.TimeoutExpired:
                dump.kill()
                raise
            if dump.returncode != 0 or not partial.is_file():
                why = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {dump.returncode}"]
                if dump.returncode > 0:  # the JVM refused: so will it next time (a killed dump is tried again)
                    self.failed.write_text(why[0] + "\n")
                log.warning("class-data sharing: no archive for the driver's JVM (%s)", why[0])
                return False
            partial.replace(self.path)
            # archives of earlier JVMs or Spark jars, what killed jobs recorded or half wrote: of no more use
            folder = self.path.parent
            for stale in [*folder.glob("spark-*.jsa"), *folder.glob("spark-*.classes"), *folder.glob(".spark-*")]:
                if stale != self.path and not _being_written(stale):
                    stale.unlink(missing_ok=True)
            log.info("class-data sharing: %s built; the driver's JVM starts with it from the next start", self.path)
            return True
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("class-data sharing: no archive for the driver's JVM (%r)", exc)
            return False
        finally:
            partial.unlink(missing_ok=True)
            self.class_list.unlink(missing_ok=True)

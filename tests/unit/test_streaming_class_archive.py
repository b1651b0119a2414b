"""The driver JVM's class-data-sharing archive (streaming.class_archive) without a JVM: a stand-in ``java``."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from streaming.class_archive import ClassArchive, dump_command, fingerprint

#: how the driver's JVM is started (spark-class), shortened
JVM_CMDLINE = [
    "/usr/lib/jvm/java-17/bin/java", "-cp", "/spark/conf:/spark/jars/slf4j-api.jar:/spark/jars/*", "-Xmx1g",
    "--add-modules=jdk.incubator.vector", "--add-opens=java.base/java.lang=ALL-UNNAMED", "-XX:TieredStopAtLevel=1",
    "-XX:DumpLoadedClassList=/cds/spark-x.1.classes", "org.apache.spark.deploy.SparkSubmit", "pyspark-shell",
]  # fmt: skip


def test_the_archive_is_named_after_the_jvm_and_the_jars_so_replacing_one_names_another(tmp_path):
    files = [tmp_path / "java", tmp_path / "spark-core.jar"]
    for f in files:
        f.write_text("x")
    before = fingerprint(files)
    assert fingerprint(files) == before
    os.utime(files[1], ns=(1, 1))  # an upgraded jar
    assert fingerprint(files) != before


def test_the_dump_takes_the_running_jvm_s_class_path_and_modules_and_nothing_else():
    command = dump_command(JVM_CMDLINE, Path("/cds/list"), Path("/cds/out.jsa"))
    assert command == [
        "/usr/lib/jvm/java-17/bin/java", "-Xshare:dump", "-XX:SharedClassListFile=/cds/list",
        "-XX:SharedArchiveFile=/cds/out.jsa", "-cp", "/spark/conf:/spark/jars/slf4j-api.jar:/spark/jars/*",
        "--add-modules=jdk.incubator.vector",
    ]  # fmt: skip


def test_a_start_records_its_classes_until_the_archive_exists_then_uses_it_unless_told_otherwise(tmp_path):
    archive = ClassArchive(tmp_path / "spark-abc.jsa")
    assert archive.java_options("-XX:TieredStopAtLevel=1") == (
        f"-XX:TieredStopAtLevel=1 -XX:DumpLoadedClassList={archive.class_list}"
    )
    archive.path.write_bytes(b"archive")
    assert archive.java_options("") == f"-XX:SharedArchiveFile={archive.path}"
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/mine.jsa"):  # the operator's choice stands
        assert archive.java_options(own) == own


def stand_in_java(tmp_path: Path, body: str) -> str:
    java = tmp_path / "java"
    java.write_text("#!/bin/sh\n" + body)
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return str(java)


def test_the_archive_is_written_whole_from_the_class_list_and_what_it_replaces_goes(tmp_path):
    archive = ClassArchive(tmp_path / "spark-new.jsa")
    archive.class_list.write_text("java/lang/Object\n")
    (tmp_path / "spark-old.jsa").write_bytes(b"an earlier JDK's")
    (tmp_path / "spark-new.999999999.classes").write_text("a killed job's list\n")
    (tmp_path / ".spark-new.jsa.999999999").write_text("a killed job's half-written archive\n")
    (tmp_path / f".spark-new.jsa.{os.getppid()}").write_text("another job's build under way\n")
    # writes the archive named by -XX:SharedArchiveFile=, as java -Xshare:dump does
    java = stand_in_java(
        tmp_path, 'for a; do case "$a" in -XX:SharedArchiveFile=*) echo cds > "${a#*=}";; esac; done\n'
    )
    assert archive.build([java, *JVM_CMDLINE[1:]])
    assert archive.path.read_text() == "cds\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".spark-new.jsa.{os.getppid()}", "java", "spark-new.jsa"]
    assert not archive.build([java, *JVM_CMDLINE[1:]])  # there already


def test_a_failed_build_says_why_and_no_later_start_tries_again(tmp_path, caplog, monkeypatch):
    java = stand_in_java(tmp_path, 'echo "Error: cannot dump" >&2; exit 1\n')
    monkeypatch.setattr("streaming.class_archive._java", lambda: Path(java))
    monkeypatch.setattr("streaming.class_archive._spark_jars", lambda: [])
    archive = ClassArchive.find(tmp_path / "cds")
    assert archive is not None and archive.path.parent.is_dir()
    archive.class_list.write_text("java/lang/Object\n")
    with caplog.at_level(logging.WARNING, logger="streaming.class_archive"):
        assert not archive.build([java, *JVM_CMDLINE[1:]])
    assert "Error: cannot dump" in caplog.text and "Error: cannot dump" in archive.failed.read_text()
    assert not archive.path.exists() and not archive.class_list.exists()
    assert ClassArchive.find(tmp_path / "cds") is None  # the JVM starts as it would without one


def test_class_lists_of_jobs_gone_before_building_the_archive_are_deleted_at_the_next_start(tmp_path, monkeypatch):
    monkeypatch.setattr("streaming.class_archive._java", lambda: Path(stand_in_java(tmp_path, "exit 0\n")))
    monkeypatch.setattr("streaming.class_archive._spark_jars", lambda: [])
    folder = tmp_path / "cds"
    folder.mkdir()
    (folder / "spark-abc.999999999.classes").write_text("a killed job's list\n")  # no such process
    running = folder / f"spark-abc.{os.getppid()}.classes"
    running.write_text("a running job's list\n")
    archive = ClassArchive.find(folder)
    assert archive is not None
    assert sorted(p.name for p in folder.iterdir()) == [running.name]

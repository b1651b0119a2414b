"""common.procfs: /proc read and parsed in one place, with gone processes as None."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from common import procfs
from tests.support.wait import wait_until


def test_own_stat_is_parsed_into_typed_fields() -> None:
    st = procfs.stat(os.getpid())
    assert st is not None and st.pid == os.getpid()
    assert st.ppid == os.getppid() and st.session == os.getsid(0)
    assert st.state in "RS" and not st.exited
    assert st.start_time > 0 and st.cpu_seconds > 0
    assert procfs.exe(os.getpid()) == os.path.realpath(sys.executable)
    assert (procfs.rss_bytes(os.getpid()) or 0) > 1024 * 1024
    assert (procfs.thread_count(os.getpid()) or 0) >= 1


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields(tmp_path: Path) -> None:
    odd = tmp_path / "a b) (c d"  # the kernel's command name is the file name: "a b) (c d"
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import sys; sys.stdin.read()", "x y"], stdin=subprocess.PIPE)
    try:
        args = wait_until(lambda: procfs.cmdline(child.pid), 10, "the child's command line")
        assert args == [str(odd), "-c", "import sys; sys.stdin.read()", "x y"]
        st = procfs.stat(child.pid)
        assert st is not None and st.ppid == os.getpid() and st.session == os.getsid(0)
        assert child.pid in [d.pid for d in procfs.descendants(os.getpid())]
        assert child.pid in procfs.all_stats()
    finally:
        child.communicate(b"")


def test_a_zombie_reads_as_exited_and_a_reaped_process_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # not reaped yet: a zombie, with no memory of its own
    zombie = wait_until(
        lambda: (st := procfs.stat(child.pid)) is not None and st.exited and st,
        10,
        "the child to exit",
        state=lambda: procfs.stat(child.pid),
    )
    assert zombie.ppid == os.getpid()
    assert procfs.rss_bytes(child.pid) is None
    child.wait()
    assert procfs.stat(child.pid) is None
    assert procfs.cmdline(child.pid) is None and procfs.exe(child.pid) is None
    assert procfs.thread_count(child.pid) is None and procfs.rss_bytes(child.pid) is None

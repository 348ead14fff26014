"""The cell sandbox on a real Docker engine: exec, files, wipe, snapshot/restore, isolation, cleanup."""

from __future__ import annotations

import tarfile
import time
from pathlib import Path

import docker.errors
import pytest

from sandboxes.docker_sandbox import DockerSandbox, Limits, SandboxSpec, prune, slug
from tests.docker_fixtures import base_image, client, run_id, _prune_at_end  # noqa: F401

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def sandbox(base_image, client, run_id):
    box = DockerSandbox(SandboxSpec(base_image, run_id, "cell-main",
                                    limits=Limits(cpus=0.5, memory="256m", pids=128)), client).start()
    yield box
    box.teardown()


def test_exec_passes_stdin_and_returns_stdout_stderr_and_exit_code(sandbox):
    result = sandbox.exec(["sh", "-c", "cat; echo oops >&2; exit 3"], input="hello")
    assert (result.returncode, result.stdout, result.stderr) == (3, b"hello", b"oops\n")
    assert not result.ok and not result.timed_out


def test_exec_uses_cwd_and_env(sandbox):
    result = sandbox.exec(["sh", "-c", 'pwd; echo "$GREETING"'], cwd="/tmp", env={"GREETING": "hi"})
    assert result.text() == "/tmp\nhi\n"


def test_timeout_kills_the_process_and_its_children_inside_the_container(sandbox):
    start = time.monotonic()
    result = sandbox.exec(["sh", "-c", "sleep 60 & sleep 60"], timeout=1)
    assert result.timed_out and time.monotonic() - start < 10
    left = sandbox.exec(["ps", "-eo", "args"]).text()
    assert "sleep 60" not in left


def test_a_process_stopped_by_the_harness_cannot_hold_a_read_or_an_exec_past_its_timeout(sandbox, monkeypatch):
    """docker-py polls an exec socket with no timeout: a driver the harness stopped (`kill -STOP
    -1` stops the in-container `timeout` too) once held the cell forever. (The host's backstop
    is cut to 3 s here: the test is whether it cuts, not its 30 s margin.)"""
    import sandboxes.docker_sandbox as docker_sandbox
    monkeypatch.setattr(docker_sandbox, "EXEC_BACKSTOP_S", 3.0)
    driver = sandbox.open_process(["sh", "-c", "read line; kill -STOP $$"])
    driver.send_line("go")
    with pytest.raises(TimeoutError):  # once: no return at all
        driver.read_line(2)
    driver.close(timeout=0)
    # The in-container timeout is stopped too; the host's backstop (timeout + EXEC_BACKSTOP_S)
    # cuts the exec while `sleep` still runs (once: it returned after 60 s as a clean exit).
    result = sandbox.exec(["sh", "-c", "kill -STOP -1; sleep 60"], timeout=1)
    assert result.timed_out and b"no answer from the docker exec stream" in result.stderr
    sandbox.exec(["sh", "-c", "kill -9 -1 2>/dev/null; true"])


def test_file_written_is_read_back_and_missing_file_raises(sandbox):
    sandbox.write_file("/state/notes/a b.txt", b"\x00bytes\xff")
    assert sandbox.read_file("/state/notes/a b.txt") == b"\x00bytes\xff"
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("/state/does-not-exist")


def test_wipe_stops_every_harness_process_and_empties_the_volume_but_the_container_lives(sandbox):
    sandbox.write_file("/state/memory/MEMORY.md", "task abc123 is a mirror")
    sandbox.write_file("/tmp/scratch", "x")
    sandbox.exec(["sh", "-c", "nohup sleep 300 >/dev/null 2>&1 &"])
    assert "sleep 300" in sandbox.exec(["ps", "-eo", "args"]).text()
    sandbox.wipe()
    assert sandbox.exec(["ls", "-A", "/state"]).text() == ""
    assert sandbox.exec(["ls", "-A", "/tmp"]).text().split() in ([], ["carc"])
    assert "sleep 300" not in sandbox.exec(["ps", "-eo", "args"]).text()
    sandbox.container.reload()
    assert sandbox.container.status == "running"


def test_snapshot_then_restore_gives_back_the_same_files(sandbox, tmp_path):
    sandbox.wipe()
    sandbox.write_file("/state/skills/mirror/SKILL.md", "flip rows")
    sandbox.write_file("/state/db.bin", bytes(range(256)) * 100)
    snap = tmp_path / "00007.tar.gz"
    sandbox.snapshot(snap)
    with tarfile.open(snap) as tar:
        names = set(tar.getnames())
    assert {"./skills/mirror/SKILL.md", "./db.bin"} <= names
    sandbox.write_file("/state/later.txt", "written after the snapshot")
    sandbox.restore(snap)
    assert sandbox.read_file("/state/db.bin") == bytes(range(256)) * 100
    assert sandbox.read_file("/state/skills/mirror/SKILL.md") == b"flip rows"
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("/state/later.txt")
    sandbox.restore(None)
    assert sandbox.exec(["ls", "-A", "/state"]).text() == ""


def test_root_filesystem_is_read_only_while_state_and_tmp_are_writable(sandbox):
    for path in ("/etc/passwd-x", "/usr/bin/x", "/opt/carc/x", "/root/x", "/x"):
        result = sandbox.exec(["sh", "-c", f"echo x > {path}"])
        assert result.returncode != 0, path
    assert sandbox.exec(["sh", "-c", "echo x > /state/ok && echo x > /tmp/ok"]).ok


def test_sandbox_user_is_not_root_and_holds_no_capabilities(sandbox):
    assert sandbox.exec(["id", "-u"]).text().strip() == "1000"
    status = sandbox.exec(["cat", "/proc/self/status"]).text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert int(fields["CapEff"].strip(), 16) == 0
    assert int(fields["CapBnd"].strip(), 16) == 0
    assert fields["NoNewPrivs"].strip() == "1"


def test_cpu_memory_and_pids_limits_are_set(sandbox):
    sandbox.container.reload()
    host = sandbox.container.attrs["HostConfig"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == 256 * 1024 * 1024
    assert host["PidsLimit"] == 128
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]


def test_nothing_of_the_host_is_mounted_and_there_is_no_docker_socket(sandbox):
    mounts = sandbox.container.attrs["Mounts"]
    assert [(m["Type"], m["Destination"]) for m in mounts] == [("volume", "/state")]
    assert not sandbox.exec(["test", "-e", "/var/run/docker.sock"]).ok
    assert not sandbox.exec(["test", "-e", "/run/docker.sock"]).ok


def test_a_sandbox_without_proxy_has_no_network_at_all(sandbox):
    code = ("import socket\ntry:\n socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
            " print('connected')\nexcept OSError as e:\n print(e.errno)")
    assert sandbox.exec(["python3", "-c", code]).text().strip() == "101"  # ENETUNREACH


def test_another_cells_volume_is_not_visible(sandbox, base_image, client, run_id):
    sandbox.write_file("/state/secret-of-main", "mine")
    with DockerSandbox(SandboxSpec(base_image, run_id, "cell-other"), client).start() as other:
        assert other.exec(["ls", "-A", "/state"]).text() == ""
        assert not other.exec(["sh", "-c", "find / -xdev -name secret-of-main 2>/dev/null | grep ."]).ok
        assert other.volume.name != sandbox.volume.name


def test_teardown_removes_container_and_volume_and_can_run_twice(base_image, client, run_id):
    box = DockerSandbox(SandboxSpec(base_image, run_id, "cell-teardown"), client).start()
    names = (box.container.name, box.volume.name)
    box.teardown()
    box.teardown()
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(names[0])
    with pytest.raises(docker.errors.NotFound):
        client.volumes.get(names[1])


def test_prune_removes_what_a_crashed_run_left_by_label(base_image, client):
    crashed = "pytest-crashed-run"
    box = DockerSandbox(SandboxSpec(base_image, crashed, "cell-x"), client).start()
    name = box.container.name  # no teardown: the "crash"
    pruned = prune(client, run=crashed)
    assert name in pruned.containers and pruned.volumes == [f"{slug(crashed, 'cell-x')}-state"]
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(name)


def test_starting_a_cell_again_replaces_a_leftover_of_the_same_cell(base_image, client, run_id):
    first = DockerSandbox(SandboxSpec(base_image, run_id, "cell-again"), client).start()
    second = DockerSandbox(SandboxSpec(base_image, run_id, "cell-again"), client).start()
    try:
        assert second.exec(["true"]).ok
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(first.container.id)
    finally:
        second.teardown()


def _counter(sandbox) -> int:
    """The writer's counter; `echo > file` truncates before it writes, so a read can land on the
    empty file in between: read again until it holds a number."""
    for _ in range(50):
        text = sandbox.read_file("/state/busy/counter").strip()
        if text:
            return int(text)
        time.sleep(0.01)
    raise AssertionError("the writer's counter stayed empty for 50 reads")


def test_a_snapshot_while_a_process_keeps_writing_succeeds_and_the_process_goes_on(sandbox, tmp_path):
    """A harness's gateway may write its database at any moment, also during a snapshot."""
    writer = ("i=0; while true; do i=$((i+1)); echo $i > /state/busy/counter; "
              "head -c 65536 /dev/urandom >> /state/busy/log; [ $((i % 50)) = 0 ] && : > /state/busy/log; done")
    sandbox.exec(["sh", "-c", f"mkdir -p /state/busy; setsid sh -c '{writer}' > /dev/null 2>&1 &"])
    try:
        for round_ in range(5):
            sandbox.snapshot(tmp_path / f"busy-{round_}.tar.gz")
        with tarfile.open(tmp_path / "busy-4.tar.gz") as tar:
            assert "./busy/counter" in tar.getnames()
        before = _counter(sandbox)
        time.sleep(0.5)
        assert _counter(sandbox) > before  # not left stopped
    finally:
        sandbox.exec(["sh", "-c", "pkill -f busy 2>/dev/null; kill -9 -1 2>/dev/null; rm -rf /state/busy"])


# --- hostile state: whatever a harness writes into its volume --------------------------------

HOSTILE_STATE = r"""
cd /state
mkdir -p u ro deep
printf secret > u/locked && chmod 000 u/locked          # snapshot once failed: Permission denied
printf f > ro/f && chmod 555 ro                          # wipe once failed: cannot delete ro/f
ln -s / rootlink && ln -s /etc/passwd pw && ln -s ../../etc escape
mkfifo fifo
printf x > "$(printf 'bad-\377\376.txt')"                # a name that is not UTF-8
truncate -s 1G sparse                                    # 1 GiB that takes no disk
head -c 2000000 /dev/urandom > random
"""


@pytest.fixture
def hostile(base_image, client, run_id):
    box = DockerSandbox(SandboxSpec(base_image, run_id, "cell-hostile",
                                    limits=Limits(cpus=0.5, memory="256m", pids=64,
                                                  snapshot_bytes=64 << 20)), client).start()
    result = box.exec(["sh", "-c", HOSTILE_STATE])
    assert result.ok, result.stderr
    yield box
    box.teardown()


def test_hostile_state_is_snapshotted_capped_wiped_and_restored_without_following_anything(hostile, tmp_path):
    dest = tmp_path / "cells" / "snapshots" / "00000.tar.gz"
    dest.parent.mkdir(parents=True)
    left_out = hostile.snapshot(dest)
    with tarfile.open(dest) as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert archive.extractfile("./u/locked").read() == b"secret"  # read whatever its mode
    assert members["./u/locked"].mode & 0o777 == 0
    assert members["./rootlink"].issym() and members["./rootlink"].linkname == "/"
    assert members["./pw"].issym() and members["./escape"].issym()  # kept as links, never followed
    assert members["./fifo"].isfifo()
    assert "./bad-\udcff\udcfe.txt" in members  # tarfile's surrogateescape of the raw bytes
    # 1 GiB that holds no data: kept as a hole (the cap counts stored data, not apparent size)
    assert members["./sparse"].size == 1 << 30 and members["./sparse"].sparse == [(1 << 30, 0)]
    assert left_out == []
    assert members["./random"].size == 2_000_000
    assert dest.stat().st_size < 8 << 20
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["00000.tar.gz", "cells", "snapshots"]
    hostile.wipe()  # chmod 555 ro/ does not stop it
    assert hostile.exec(["ls", "-A", "/state"]).text() == ""
    hostile.restore(dest)
    listing = hostile.exec(["sh", "-c", "cd /state && stat -c '%n %a %F' u/locked ro rootlink fifo"]).text()
    assert "u/locked 0 regular" in listing and "ro 555 directory" in listing
    assert "rootlink 777 symbolic link" in listing and "fifo 644 fifo" in listing
    assert hostile.exec(["stat", "-c", "%s %b", "/state/sparse"]).text().split() == [str(1 << 30), "0"]


def test_a_sparse_file_stays_sparse_and_the_snapshot_cap_binds_the_data_it_stores(base_image, client, run_id,
                                                                                  tmp_path):
    """`truncate -s 1G` in a state came back as 1 GiB of real blocks (snapshot 20 s, restore 22 s
    per instance). Its holes are kept through snapshot and restore; `limits.snapshot_bytes`
    (here 1 MiB) counts the data a file stores: the 1 GiB file holding 4 KiB is kept, 2 MB of
    random data is not, and the left-out line says which size it meant."""
    box = DockerSandbox(SandboxSpec(base_image, run_id, "cell-sparse",
                                    limits=Limits(cpus=0.5, memory="256m", pids=64, snapshot_bytes=1 << 20)),
                        client).start()
    try:
        made = box.exec(["sh", "-c", "cd /state && truncate -s 1G sparse && printf data | dd of=sparse bs=1 "
                                     "seek=5242880 conv=notrunc 2>/dev/null && head -c 2000000 /dev/urandom > random"])
        assert made.ok, made.stderr
        dest = tmp_path / "00000.tar.gz"
        left_out = box.snapshot(dest)
        assert [(e.path, e.size) for e in left_out] == [("./random", 2_000_000)]
        assert "its data (2000000 bytes; apparent size 2000000)" in left_out[0].why
        assert "1048576 bytes of file data (grid limits.snapshot_mb)" in left_out[0].why
        assert dest.stat().st_size < 64 << 10
        with tarfile.open(dest) as archive:
            member = archive.getmember("./sparse")
            assert member.size == 1 << 30 and member.sparse == [(5 << 20, 4096), (1 << 30, 0)]
            data = archive.extractfile(member)
            data.seek((5 << 20) - 2)
            assert data.read(8) == b"\0\0data\0\0"
        box.restore(dest)
        size, blocks = box.exec(["stat", "-c", "%s %b", "/state/sparse"]).text().split()
        assert int(size) == 1 << 30 and int(blocks) * 512 <= 64 << 10  # not 1 GiB of real blocks
        read = box.exec(["sh", "-c", "dd if=/state/sparse bs=1 skip=5242878 count=8 2>/dev/null | od -An -c"])
        assert read.text().split() == ["\\0", "\\0", "d", "a", "t", "a", "\\0", "\\0"]
        assert box.exec(["ls", "-A", "/state"]).text().split() == ["sparse"]
    finally:
        box.teardown()


def test_a_tree_deeper_than_path_max_is_named_as_left_out_and_the_rest_kept_and_restored(hostile, tmp_path):
    """The engine's archive drops a path whose host name passes PATH_MAX without a word; the
    snapshot finds such paths itself, names each one as left out, keeps everything else, and the
    restore of what it kept works."""
    made = hostile.exec(["python3", "-c", (
        "import os\nos.chdir('/state/deep')\n"
        "for _ in range(50):\n    os.mkdir('d' * 100); os.chdir('d' * 100)\n"
        "open('leaf', 'w').write('deep')\nprint(len(os.getcwd()))")])
    assert made.ok and int(made.text()) > 4096, made.stderr
    dest = tmp_path / "deep.tar.gz"
    left_out = hostile.snapshot(dest)
    with tarfile.open(dest) as archive:
        names = set(archive.getnames())
    missing = [e.path for e in left_out if "PATH_MAX" in e.why]
    assert any(p.endswith("/leaf") for p in missing) and not set(missing) & names
    assert {"./u/locked", "./random", "./deep/" + "d" * 100} <= names
    hostile.restore(dest)
    assert hostile.exec(["cat", "/state/u/locked"]).ok is False  # mode 000 kept (uid 1000 cannot read)
    assert hostile.exec(["sh", "-c", "test -d /state/deep/" + "d" * 100 + " && test -f /state/random"]).ok


def test_the_state_volume_has_a_quota_and_leaves_nothing_when_removed(base_image, client, run_id, tmp_path):
    """A harness that writes past `limits.state_bytes` meets ENOSPC in its sandbox (not the
    engine's disk); the sandbox and its snapshots go on; teardown releases the loop device and
    deletes the file behind the volume."""
    import subprocess

    from sandboxes import state_volumes
    if state_volumes.quota_unavailable():
        pytest.skip(f"no state quota on this machine: {state_volumes.quota_unavailable()}")
    box = DockerSandbox(SandboxSpec(base_image, run_id, "cell-quota",
                                    limits=Limits(cpus=0.5, memory="256m", pids=64, state_bytes=64 << 20)),
                        client).start()
    try:
        label = box.volume.attrs["Labels"][state_volumes.LABEL_LOOP]
        device, _, image = label.partition("\t")
        assert box.exec(["sh", "-c", "ls -A /state; stat -c %u /state"]).text().split() == ["1000"]
        filled = box.exec(["sh", "-c", "head -c 100000000 /dev/zero > /state/big"])
        assert not filled.ok and b"No space left on device" in filled.stderr
        assert box.exec(["sh", "-c", "rm /state/big && echo kept > /state/note"]).ok  # room again
        box.snapshot(tmp_path / "quota.tar.gz")
        with tarfile.open(tmp_path / "quota.tar.gz") as archive:
            assert archive.getnames() == ["./note"]
        box.wipe()
        assert box.exec(["ls", "-A", "/state"]).text() == ""
    finally:
        box.teardown()
    assert not Path(image).exists()
    attached = subprocess.run(["losetup", "--noheadings", "--output", "BACK-FILE", device],
                              capture_output=True, text=True).stdout
    assert image not in attached


def test_a_snapshot_works_while_detached_children_fill_the_pids_limit(hostile, tmp_path):
    hostile.exec(["sh", "-c", "i=0; while [ $i -lt 80 ]; do (sleep 600 &) 2>/dev/null; i=$((i+1)); done; true"])
    dest = tmp_path / "full.tar.gz"
    hostile.snapshot(dest)  # through the engine: no process has to start in the container
    with tarfile.open(dest) as archive:
        assert "./u/locked" in archive.getnames()


FILL_PIDS = ("import subprocess, time\n"
             "while True:\n"
             "    try:\n"
             "        subprocess.Popen(['sleep', '600'])\n"
             "    except OSError:\n"
             "        time.sleep(0.005)\n")


def test_a_wipe_works_while_a_respawner_keeps_the_pids_limit_full(hostile):
    """Nothing can start in the container (not even the wipe's shell): the container is restarted,
    which ends every process, and the wipe runs on it as started; the sandbox serves again."""
    # a respawner that takes every pid that comes free, so the limit stays full
    hostile.exec(["sh", "-c", 'python3 -c "$0" >/dev/null 2>&1 </dev/null & sleep 3', FILL_PIDS])
    hostile.container.reload()
    assert len(hostile.container.top()["Processes"]) >= 60  # at the limit (64)
    hostile.wipe()
    assert hostile.exec(["ls", "-A", "/state"]).text() == ""
    assert int(hostile.exec(["sh", "-c", "ls /proc | grep -c '^[0-9]'"]).text()) < 10
    assert hostile.fault() is None


def test_exec_output_is_collected_in_linear_time(sandbox):
    result = sandbox.exec(["sh", "-c", "head -c 67108864 /dev/zero"], timeout=120)
    assert result.ok and len(result.stdout) == 64 << 20

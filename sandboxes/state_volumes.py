"""A cell's state volume with a size quota.

A named Docker volume lives on the engine's own disk and sees all of its free space: a harness
that writes without end fills the host. Here the volume is an ext4 filesystem of `state_mb` in a
sparse file (`CARC_STATE_IMAGES`, default /var/lib/carc/state), attached to a loop device and
mounted by Docker's local driver (with `discard`), so a harness that fills its state meets ENOSPC
at its quota and nothing else notices. The file takes only the blocks the harness holds (freed
blocks are punched out of it); it is made with its root
owned by the sandbox user and without `lost+found` (a root-owned folder the wipe could not
delete), and is released (loop device detached, file deleted) when the volume is removed, by the
cell's teardown or by `prune`.

Attaching a loop device needs root (as starting the engine here does). Without it, or without
e2fsprogs, the volume is a plain one and `quota_unavailable()` says why; `carc doctor` reports it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import docker
import structlog

from sandboxes.environment import SandboxError

log = structlog.get_logger("carc.sandbox")

STATE_IMAGES = Path(os.environ.get("CARC_STATE_IMAGES", "/var/lib/carc/state"))
LABEL_LOOP = "org.carc.loop"  # "<loop device>\t<image file>" of a quota'd volume
SANDBOX_OWNER = "1000:1000"  # the sandbox user owns the volume's root


@functools.cache
def quota_unavailable() -> str | None:
    """Why state volumes cannot have a quota on this machine, or None."""
    missing = [tool for tool in ("losetup", "mkfs.ext4", "debugfs") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (install util-linux and e2fsprogs)"
    if os.geteuid() != 0:
        return "attaching a loop device needs root; carc runs as uid %d" % os.geteuid()
    if not Path("/dev/loop-control").exists():
        return "no /dev/loop-control: this kernel or container has no loop devices"
    return None


def create(client: docker.DockerClient, name: str, labels: dict[str, str], size_bytes: int | None):
    """The state volume `name`: quota'd at `size_bytes` when the machine allows, else plain."""
    reason = "no quota asked" if size_bytes is None else quota_unavailable()
    if reason is not None:
        if size_bytes is not None:
            log.warning("state_quota_unavailable", volume=name, reason=reason)
        return client.volumes.create(name, labels=labels)
    STATE_IMAGES.mkdir(parents=True, exist_ok=True)
    image = STATE_IMAGES / f"{name}.ext4"
    image.unlink(missing_ok=True)
    device = None
    try:
        with open(image, "wb") as out:
            out.truncate(size_bytes)
        # No journal: the volume lives as long as its cell (a resumed cell restores its
        # snapshot), and a journal would take 64 MiB of real disk per cell from the start.
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", f"root_owner={SANDBOX_OWNER}",
              str(image)])
        _run(["debugfs", "-w", "-R", "rmdir lost+found", str(image)])
        device = _run(["losetup", "--find", "--show", str(image)]).strip()
        return client.volumes.create(name, driver="local", driver_opts={"type": "ext4", "device": device, "o": "discard"},
                                     labels={**labels, LABEL_LOOP: f"{device}\t{image}"})
    except BaseException:
        _release(device, image)
        raise


def remove(volume) -> None:
    """Remove the volume and release its loop device and file (NotFound when already gone)."""
    labels = (volume.attrs or {}).get("Labels") or {}
    volume.remove(force=True)
    if LABEL_LOOP in labels:
        device, _, image = labels[LABEL_LOOP].partition("\t")
        _release(device, Path(image))


def _release(device: str | None, image: Path) -> None:
    if device:
        # Only the device still backed by our file: another cell may have it by now.
        backing = subprocess.run(["losetup", "--noheadings", "--output", "BACK-FILE", device],
                                 capture_output=True, text=True).stdout.strip()
        if backing == str(image):
            subprocess.run(["losetup", "--detach", device], capture_output=True)
    image.unlink(missing_ok=True)


def _run(cmd: list[str]) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SandboxError(f"{' '.join(cmd[:2])} failed: {result.stderr.strip()[-300:]}")
    return result.stdout

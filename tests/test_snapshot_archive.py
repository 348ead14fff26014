"""Snapshot archives keep holes: every file comes back with the same bytes, through Python's tarfile
and through GNU tar (the restore in a sandbox), and its runs of zero blocks as holes."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxes.snapshot_archive import HOLE_BLOCK, SnapshotArchive

# a file as pieces: a zero block, a data block, or a short tail of either
piece = st.sampled_from(["zero", "data", "zero-tail", "data-tail"])


def content(pieces: list[str]) -> bytes:
    out = b""
    for n, kind in enumerate(pieces):
        size = HOLE_BLOCK if not kind.endswith("tail") else 100
        out += bytes(size) if kind.startswith("zero") else bytes([n % 255 + 1]) * size
    return out


def archive_of(files: dict[str, bytes], room: int | None = None) -> tuple[bytes, dict]:
    buffer = io.BytesIO()
    stored = {}
    with tarfile.open(fileobj=buffer, mode="w:gz") as out:
        archive = SnapshotArchive(out)
        for name, data in files.items():
            stored[name] = archive.add(_info(name, len(data)), io.BytesIO(data), room)
    return buffer.getvalue(), stored


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o640, 1_700_000_000
    return info


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(piece, max_size=12), min_size=1, max_size=4))
def test_any_file_reads_back_byte_for_byte_with_its_zero_blocks_as_holes(shapes):
    files = {f"./f{n}": content(p) for n, p in enumerate(shapes)}
    packed, stored = archive_of(files)
    with tarfile.open(fileobj=io.BytesIO(packed)) as tar:
        for name, data in files.items():
            member = tar.getmember(name)
            assert member.size == len(data) and member.mode == 0o640
            assert tar.extractfile(member).read() == data
            zero_blocks = sum(data[at:at + HOLE_BLOCK] == bytes(HOLE_BLOCK)
                              for at in range(0, len(data) - HOLE_BLOCK + 1, HOLE_BLOCK))
            assert len(data) - stored[name].data >= zero_blocks * HOLE_BLOCK  # every zero block a hole
            assert stored[name].data >= len(data) - data.count(0)  # and no data left out


def test_gnu_tar_unpacks_the_holes_as_holes_and_the_bytes_as_they_were(tmp_path):
    data = bytes(8 << 20) + b"middle" + bytes(3 << 20) + b"end"  # data blocks amid 11 MiB of zeros
    files = {"./sparse": data, "./dense": os.urandom(10_000), "./empty": b"", "./hole": bytes(1 << 20)}
    packed, _ = archive_of(files)
    (tmp_path / "s.tar.gz").write_bytes(packed)
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["tar", "-C", str(out), "-xzf", str(tmp_path / "s.tar.gz")], check=True)
    for name, expected in files.items():
        assert (out / name).read_bytes() == expected, name
    blocks = os.stat(out / "sparse").st_blocks * 512
    if blocks >= len(data):
        pytest.skip(f"{tmp_path}'s filesystem does not keep files sparse")
    assert blocks <= 4 * HOLE_BLOCK and os.stat(out / "hole").st_blocks == 0


def test_a_file_whose_data_passes_the_room_left_is_not_written_and_says_how_much_it_had():
    files = {"./big": os.urandom(3 * HOLE_BLOCK) + bytes(1 << 20), "./small": b"x"}
    packed, stored = archive_of(files, room=2 * HOLE_BLOCK)
    assert (stored["./big"].data, stored["./big"].apparent, stored["./big"].written) == \
        (3 * HOLE_BLOCK, 3 * HOLE_BLOCK + (1 << 20), False)
    assert stored["./small"].written
    with tarfile.open(fileobj=io.BytesIO(packed)) as tar:
        assert tar.getnames() == ["./small"]

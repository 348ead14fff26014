"""The files of a state snapshot (a tar.gz of `./...`), written so that sparse files stay sparse.

A harness can make a file of any apparent size that holds no blocks (`truncate -s 1G`). Archived
byte for byte it costs its whole apparent size to compress, and unpacked it takes that many real
blocks of the state volume (a 900 MiB sparse file: 19 s to snapshot, 5.6 s to restore, 900 MiB
of disk after). Here every whole block of zeros of a file is a hole: a file with holes is
written in GNU tar's sparse format 1.0 (PAX keywords GNU.sparse.*, the map of its data regions
at the head of its data), which GNU tar (the restore in a sandbox) unpacks with holes, and
Python's tarfile (a host state, the stores inspector) reads and unpacks alike. A file of real
zero blocks also comes back with holes in their place: the same bytes, fewer blocks.

What a file costs a snapshot is its data, the bytes stored; its apparent size (holes included)
costs only the time to read it (bounded by the snapshot's deadline, not by its cap).
"""

from __future__ import annotations

import copy
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

HOLE_BLOCK = 4096  # a run of zeros is a hole where it covers whole blocks of this size (ext4's)
READ_CHUNK = 1 << 20
_ZERO_BLOCK = bytes(HOLE_BLOCK)
_ZERO_CHUNK = bytes(READ_CHUNK)
_SPOOL_IN_MEMORY = 8 << 20  # a file's data up to this is held in memory, past it in a temporary file


@dataclass(frozen=True)
class Stored:
    """What adding a regular file came to: its data (bytes outside holes) and whether it was
    written (False: its data was more than the room left, and nothing of it is in the archive)."""

    data: int
    apparent: int
    written: bool


class SnapshotArchive:
    """Members added to an open tarfile (PAX format), regular files with their holes kept."""

    def __init__(self, out: tarfile.TarFile, spool_dir: Path | None = None):
        self.out = out
        self.spool_dir = spool_dir

    def add(self, member: tarfile.TarInfo, data: BinaryIO | None = None, room: int | None = None) -> Stored | None:
        """Add `member`; a regular file's content is read from `data` to its end and written only
        when its data (holes not counted) fits in `room` bytes (None: any). Returns what a regular
        file stored, None for any other member (written as it is)."""
        if not member.isfile():
            self.out.addfile(member)
            return None
        with tempfile.SpooledTemporaryFile(_SPOOL_IN_MEMORY, dir=self.spool_dir) as spool:
            regions, stored = _scan(data, spool, room)
            written = room is None or stored <= room
            if written:
                spool.seek(0)
                if regions == [(0, member.size)] or member.size == 0:
                    self.out.addfile(member, spool)
                else:
                    self._add_sparse(member, regions, stored, spool)
        return Stored(stored, member.size, written)

    def _add_sparse(self, member: tarfile.TarInfo, regions: list[tuple[int, int]], stored: int,
                    spool: BinaryIO) -> None:
        if not regions or sum(regions[-1]) < member.size:
            regions = regions + [(member.size, 0)]  # as GNU tar: the map reaches the end of the file
        head = f"{len(regions)}\n".encode() + b"".join(f"{o}\n{n}\n".encode() for o, n in regions)
        head += bytes(-len(head) % tarfile.BLOCKSIZE)
        info = copy.copy(member)
        # A short ASCII name, so tarfile adds no "path" keyword that would outrank GNU.sparse.name.
        info.name = "./GNUSparseFile.0/data"
        info.type = tarfile.REGTYPE
        info.size = len(head) + stored
        info.pax_headers = {**{k: v for k, v in member.pax_headers.items()
                               if k not in ("path", "size") and not k.startswith("GNU.sparse.")},
                            "GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                            "GNU.sparse.name": member.name, "GNU.sparse.realsize": str(member.size)}
        self.out.addfile(info, _Joined(head, spool))


def _scan(data: BinaryIO, spool: BinaryIO, room: int | None) -> tuple[list[tuple[int, int]], int]:
    """Read `data` to its end: (offset, length) of each data region (runs of blocks that are not
    all zero) and their total; the regions' bytes go to `spool` while they fit in `room`."""
    regions: list[tuple[int, int]] = []
    stored = offset = 0

    def keep(start: int, piece: bytes) -> None:
        nonlocal stored
        if regions and sum(regions[-1]) == start:
            regions[-1] = (regions[-1][0], regions[-1][1] + len(piece))
        else:
            regions.append((start, len(piece)))
        stored += len(piece)
        if room is None or stored <= room:
            spool.write(piece)

    while chunk := data.read(READ_CHUNK):
        if chunk == _ZERO_CHUNK[:len(chunk)]:
            pass
        elif _ZERO_BLOCK not in chunk:  # no whole block of zeros anywhere: all of it is data
            keep(offset, chunk)
        else:
            # Blocks are aligned on the file, so a chunk (a multiple of the block) is cut at
            # block boundaries; only the file's last block may be shorter.
            start = None
            for at in range(0, len(chunk), HOLE_BLOCK):
                zero = chunk[at:at + HOLE_BLOCK] == _ZERO_BLOCK[:min(HOLE_BLOCK, len(chunk) - at)]
                if zero and start is not None:
                    keep(offset + start, chunk[start:at])
                    start = None
                elif not zero and start is None:
                    start = at
            if start is not None:
                keep(offset + start, chunk[start:])
        offset += len(chunk)
    return regions, stored


class _Joined:
    """Two readable sources as one, read in full-sized pieces (tarfile's copy needs that)."""

    def __init__(self, head: bytes, rest: BinaryIO):
        self.head, self.rest = head, rest

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            out, self.head = self.head + self.rest.read(), b""
            return out
        out = self.head[:size]
        self.head = self.head[size:]
        while len(out) < size:
            more = self.rest.read(size - len(out))
            if not more:
                break
            out += more
        return out

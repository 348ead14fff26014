"""A state-volume snapshot (`snapshots/NNNNN.tar.gz`): its files, their hashes and small texts.

Snapshots are read one at a time and diffed with the one before, so a long cell never holds
more than two in memory. Databases are not kept as text: `extract` unpacks them (with their
-wal and -shm) for `reading.open_sqlite`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import shutil
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.records import CellPaths
from stores_inspector.reading import Problems

TEXT_LIMIT = 2_000_000  # bytes; larger files are hashed, not kept
MAX_MEMBERS = 500_000  # entries read per snapshot (~2.7 KB of memory each while inspecting)
CHUNK = 1 << 20


def display_name(name: str) -> str:
    """A member name as text any writer can take: bytes that were not UTF-8 (tarfile hands them
    over as lone surrogates) shown as backslash escapes, e.g. `bad-\\xff.txt`."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass
class FileInfo:
    path: str  # relative to the volume root, without "./"
    size: int
    sha: str  # sha1 of the content; "link:<target>" for a symlink
    mtime: float


@dataclass
class Volume:
    """The state volume after one instance slot."""

    slot: int
    source: Path | None
    files: dict[str, FileInfo] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    complete: bool = True  # False: reading stopped early, so a file not listed may still be there

    @classmethod
    def read(cls, slot: int, path: Path, problems: Problems) -> "Volume":
        """Every member of a snapshot; a truncated archive keeps the members before the damage,
        and a snapshot of more than MAX_MEMBERS entries is read that far."""
        volume = cls(slot, path)
        try:
            with tarfile.open(path, "r:*") as tar:
                for n, member in enumerate(tar):
                    if n == MAX_MEMBERS:
                        volume.complete = False
                        problems.add(path, f"more than {MAX_MEMBERS:,} entries: the inspector read the first "
                                           f"{MAX_MEMBERS:,} and infers no deletion after this instance")
                        break
                    name = display_name(member.name).removeprefix("./").rstrip("/")
                    if not name or member.isdir():
                        continue
                    if member.issym() or member.islnk():
                        volume.files[name] = FileInfo(name, 0, f"link:{display_name(member.linkname)}",
                                                      member.mtime)
                        continue
                    if not member.isfile():
                        continue
                    # Hashed in chunks: memory stays flat whatever size a harness wrote.
                    digest, head, source = hashlib.sha1(), bytearray(), tar.extractfile(member)
                    while chunk := source.read(CHUNK):
                        digest.update(chunk)
                        if len(head) <= TEXT_LIMIT:
                            head += chunk
                    volume.files[name] = FileInfo(name, member.size, digest.hexdigest(), member.mtime)
                    data = bytes(head)
                    if member.size <= TEXT_LIMIT and not data.startswith(SQLITE_MAGIC) and b"\x00" not in data[:8192]:
                        volume.texts[name] = data.decode("utf-8", errors="replace")
        except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:
            volume.complete = False
            problems.add(path, f"snapshot unreadable after {len(volume.files)} file(s) ({type(exc).__name__}: {exc})")
        return volume

    def text(self, path: str) -> str | None:
        return self.texts.get(path)

    def glob(self, pattern: str) -> list[str]:
        return sorted(p for p in self.files if fnmatch.fnmatchcase(p, pattern))

    def extract(self, paths: list[str], dest: Path, problems: Problems) -> None:
        """Unpack these files (and any -wal / -shm beside them) under `dest`."""
        wanted = {p + s for p in paths for s in ("", "-wal", "-shm")}
        if self.source is None:
            return
        try:
            root = dest.resolve()
            with tarfile.open(self.source, "r:*") as tar:
                for member in tar:
                    name = display_name(member.name).removeprefix("./")
                    if name not in wanted or not member.isfile():
                        continue
                    target = (dest / name).resolve()
                    if ".." in Path(name).parts or Path(name).is_absolute() or not target.is_relative_to(root):
                        problems.add(self.source, f"member {name!r} climbs out of its folder; not unpacked")
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "wb") as out:
                        shutil.copyfileobj(tar.extractfile(member), out, CHUNK)
        except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:
            problems.add(self.source, f"could not unpack {', '.join(paths)} ({type(exc).__name__}: {exc})")


def snapshot_paths(cell_dir: Path) -> list[tuple[int, Path]]:
    """(slot, path) of every snapshot, in slot order."""
    found = []
    for path in CellPaths(cell_dir).snapshots.glob("*.tar.gz"):
        stem = path.name.removesuffix(".tar.gz")
        if stem.isdigit():
            found.append((int(stem), path))
    return sorted(found)

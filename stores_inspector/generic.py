"""The fallback for any adapter: a file-level diff of the state volume after each instance.

Every harness cell also gets this table (`files`), so a store no parser knows still shows up:
which files were created, changed or deleted after which instance, and what sort of file.
"""

from __future__ import annotations

from typing import Any

from stores_inspector.parser import HarnessParser, matches
from stores_inspector.volume import FileInfo, Volume

SORTS = (("database", ("*.sqlite", "*.sqlite-*", "*.db", "*.db-*", "*.dill")),
         ("log", ("*.log", "*.log.*", "*/logs/*")),
         ("lock or temp", ("*.lock", "*.pid", "tmp/*", "*/tmp/*", "*/.cache/*", "*/cache/*", "home/*")),
         ("config", ("*.json5", "*config.yaml", "*/openclaw.json", "*/settings.json", "*/models.json")))


def sort_of(path: str, volume: Volume) -> str:
    """database | log | lock or temp | config | link | text | binary."""
    for name, patterns in SORTS:
        if matches(path, patterns):
            return name
    info = volume.files.get(path)
    if info is not None and info.sha.startswith("link:"):
        return "link"
    return "text" if path in volume.texts else "binary"


def file_diff(before: dict[str, FileInfo], after: Volume) -> list[dict[str, Any]]:
    """created / changed / deleted files between two snapshots, with size and mtime (no
    deletion from a snapshot that could not be read whole: the file may be in its unread part)."""
    rows = []
    for path, info in after.files.items():
        old = before.get(path)
        if old is None or old.sha != info.sha:
            rows.append({"path": path, "change": "created" if old is None else "changed",
                         "size": info.size, "size_before": None if old is None else old.size,
                         "mtime": info.mtime, "sort": sort_of(path, after)})
    for path, old in before.items() if after.complete else ():
        if path not in after.files:
            rows.append({"path": path, "change": "deleted", "size": None, "size_before": old.size,
                         "mtime": None, "sort": "deleted"})
    return rows


class Parser(HarnessParser):
    """One artifact per text file that is not bookkeeping (logs, databases, locks, caches)."""

    name = "generic"

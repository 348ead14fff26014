"""Per-harness parsers of stores and session logs, plus the journal -> what was kept.

`inspect_run(run_dir, cell=None)` reads a run's cells (state snapshots, harness stores, proxy
journal, events) and returns an `InspectResult`: tables, counts per cell and a markdown account.
"""

from stores_inspector.run import InspectResult, inspect_run

__all__ = ["InspectResult", "inspect_run"]

"""Per-harness parsers of stores and session logs, plus the journal -> what was kept."""

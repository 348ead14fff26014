"""Running grids: config, schedule, cells and their services (sandboxes, proxies, harnesses).

The only layer that uses `harness_adapters`, `sandboxes` and `proxy`; the pure environment
(`orchestrator/*.py`, `tasks/`) and the analysis never import it.
"""

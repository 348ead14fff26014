"""One module per learner: the reference ladder and the harness adapters."""

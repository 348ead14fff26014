"""Scores and reports of a run, from its records only (never from the code that ran it)."""

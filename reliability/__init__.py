"""Reliability runs of icemaint against real processes: `make soak MINUTES=30` (reliability/RESULTS.md)."""

"""The benchmark harness: measures what icemaint's maintenance costs and buys (`python -m benchmarks.run`)."""

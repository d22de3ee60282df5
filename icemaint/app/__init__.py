"""App: operators' entry points: the CLI, the in-process runner, the tick runner, the demo, the
workload simulator and the Dagster instance home.
"""

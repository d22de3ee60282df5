"""Domain: pure decisions and the types they speak in (no Spark, pyiceberg, Dagster, database or network).

Names, units, date scopes, policy, health, verdicts and reason kinds, compaction and retention
decisions, rewrite planning, and the compaction and retention ticks. Everything here is a function of
its arguments; callers pass every read in.
"""

"""Engine: every Spark, JVM and file-system call (session, staging and publish, digest and proof,
retention procedures, file moves). Nothing here decides; it does what operations ask.
"""

"""Observe: catalog reads with pyiceberg, no Spark (table listing, metadata location, health inputs).

What sensors use: cheap, Spark-free observation of table metadata.
"""

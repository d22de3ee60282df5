"""Operations: the operating contract, once (policy -> claim -> act -> record -> release), and the
operations that plug into it: compaction (stage -> prove -> publish) and housekeeping (expiry,
orphans, manifests, quarantine purge).
"""

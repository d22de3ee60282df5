"""`icemaint.engine.files.Files` on the local disk through Hadoop's FileSystem (the object-store side runs in
tests/test_production_profile.py against SeaweedFS): lengths looked up many at once agree with the disk."""

from __future__ import annotations

import os

from icemaint.engine.files import Files


def test_sizes_many_at_once_agree_with_the_disk(spark, tmp_path):
    paths = []
    for i in range(40):
        p = tmp_path / f"f{i:02d}.bin"
        p.write_bytes(b"x" * (i * 37))
        paths.append(str(p))
    missing = [str(tmp_path / f"gone{i}.bin") for i in range(3)]
    asked = paths + missing + paths[:5]  # repeats are looked up once
    files = Files(spark)

    sizes = files.sizes(asked)
    assert list(sizes) == paths + missing
    assert sizes == {**{p: os.path.getsize(p) for p in paths}, **{m: None for m in missing}}
    assert sizes == {p: files.size(p) for p in paths + missing}
    assert files.sizes(asked, workers=1) == sizes
    assert files.sizes([]) == {} and files.sizes(paths[:1]) == {paths[0]: 0}


def test_a_move_by_copy_leaves_only_the_target_or_says_it_left_both(spark, tmp_path):
    """The copy path (source and target on different stores: the object-store quarantine) copies, compares the
    lengths and deletes the source; a source the store did not delete makes the move fail saying so."""
    import pytest

    from icemaint.domain.retention import QuarantineMoveFailed

    source, target = tmp_path / "a" / "f.parquet", tmp_path / "q" / "f.parquet"
    source.parent.mkdir()
    source.write_bytes(b"orphan" * 100)
    files = Files(spark)
    files._same_hadoop_fs = lambda s, t: False  # as between a table's bucket and another store
    files.move(str(source), str(target))
    assert not source.exists() and target.read_bytes() == b"orphan" * 100

    source.write_bytes(b"again" * 10)
    files.delete = lambda location: False  # a store that answers but keeps the object
    with pytest.raises(QuarantineMoveFailed, match="could not delete it; it is in both places"):
        files.move(str(source), str(tmp_path / "q" / "g.parquet"))
    assert source.exists() and (tmp_path / "q" / "g.parquet").read_bytes() == b"again" * 10

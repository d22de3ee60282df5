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

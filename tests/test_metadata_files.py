"""Which metadata.json files the expiry step removes (pure, no Spark): only versions below the table's metadata log,
never the log, a newer version (a commit in flight), a file naming no version, or a young one."""

from __future__ import annotations

import pytest

from icemaint.domain.metadata_files import ListedFile, metadata_version, stale_metadata_files
from icemaint.domain.policy import TablePolicy, cleans_metadata

NOW_MS = 1_800_000_000_000
UUID = "0123abcd-4567-89ab-cdef-0123456789ab"
DIR = "file:/wh/db/t/metadata"
OLD = NOW_MS - 3_600_000


@pytest.mark.parametrize("name, version", [
    ("v12.metadata.json", 12),
    ("v12.gz.metadata.json", 12),
    (f"00012-{UUID}.metadata.json", 12),
    (f"00012-{UUID}.gz.metadata.json", 12),
    (f"00012-{UUID}.metadata.json.gz", 12),
    (f"{UUID}.metadata.json", None),          # a Hadoop commit's temporary file, before its rename
    ("00000123-abcd-ef01-2345-6789abcdef01.metadata.json", None),  # a temporary name that starts with digits
    ("version-hint.text", None),
    ("snap-1-1-0123.avro", None),
    ("v12.metadata.json.tmp", None),
    ("12.metadata.json", None),
])
def test_metadata_version_reads_only_icebergs_names(name, version):
    assert metadata_version(name) == version


def listed(name: str, modified_ms: int = OLD, size: int = 100, directory: str = DIR) -> ListedFile:
    return ListedFile(f"{directory}/{name}", size, modified_ms)


def test_only_versions_below_the_log_and_old_enough_are_removed():
    files = [listed(f"v{i}.metadata.json") for i in range(1, 11)] + [
        listed("v11.metadata.json", modified_ms=NOW_MS - 1000),  # the current one, young
        listed("v3.metadata.json", directory="file:/wh/db/t/metadata/sub"),  # another directory
        listed(f"{UUID}.metadata.json"),                   # a commit in flight (Hadoop's temporary file)
        listed("v14.metadata.json"),                       # a newer version: a commit landing now
        listed("snap-1-1-0123.avro"), listed("version-hint.text"),
    ]
    files[6] = listed("v7.metadata.json", modified_ms=NOW_MS - 30_000)  # dropped out of the log 30 s ago
    # the log lists v8..v10 (previous-versions-max 3); the catalog names locations without the scheme
    plan = stale_metadata_files(files, "/wh/db/t/metadata/v11.metadata.json",
                                [f"/wh/db/t/metadata/v{i}.metadata.json" for i in (8, 9, 10)], NOW_MS)
    assert [f.location.rsplit("/", 1)[1] for f in plan.remove] == [f"v{i}.metadata.json" for i in range(1, 7)]
    assert (plan.kept_listed, plan.kept_young, plan.kept_unversioned, plan.oldest_listed_version) == (4, 1, 2, 8)
    assert plan.remove_bytes == 600


def test_a_table_without_a_log_or_with_unversioned_names_keeps_everything_it_cannot_place():
    files = [listed(f"00001-{UUID}.metadata.json"), listed("custom.metadata.json")]
    plan = stale_metadata_files(files, f"{DIR}/custom-current.metadata.json", [], NOW_MS)
    assert plan.remove == () and plan.oldest_listed_version is None
    uuid_named = stale_metadata_files(files + [listed(f"00002-{UUID[:-1]}f.metadata.json")],
                                      f"s3://b/db/t/metadata/00002-{UUID[:-1]}f.metadata.json", [], NOW_MS)
    assert uuid_named.remove == ()  # another bucket's path is another directory
    same = stale_metadata_files([listed(f"00001-{UUID}.metadata.json", directory="s3://b/db/t/metadata")],
                                f"s3://b/db/t/metadata/00002-{UUID[:-1]}f.metadata.json", [], NOW_MS)
    assert [f.location for f in same.remove] == [f"s3://b/db/t/metadata/00001-{UUID}.metadata.json"]


@pytest.mark.parametrize("policy, cleans", [
    (TablePolicy(), True),
    (TablePolicy(metadata_delete_after_commit=True), True),
    (TablePolicy(metadata_delete_after_commit=False), False),  # an owner who keeps them keeps them from us too
    (TablePolicy(metadata_delete_after_commit=False, metadata_cleanup=True), True),
    (TablePolicy(metadata_cleanup=False), False),
])
def test_the_policy_says_whether_expiry_cleans_metadata_files(policy, cleans):
    assert cleans_metadata(policy) is cleans

"""zamboni's own console entry, with its local catalog on the SQL database ZAMBONI_CATALOG_URI names.

Runs in the peer's virtualenv (benchmarks/.work/peer-venv), never in ours. zamboni's
`CatalogSession.for_local` takes a catalog URI, but its CLI passes none, so `--local-warehouse` always
opens `<warehouse>/catalog.db` (SQLite). This passes the benchmark's shared catalog (PostgreSQL) instead;
nothing else of zamboni is changed.

    ZAMBONI_CATALOG_URI=postgresql+psycopg2://... python zamboni_on_sql.py <zamboni arguments>
"""

import os
import sys

from zamboni import entry, session

_for_local = session.CatalogSession.for_local.__func__


def _for_shared_catalog(cls, *, warehouse_path, uri=None, **options):
    return _for_local(cls, warehouse_path=warehouse_path, uri=uri or os.environ["ZAMBONI_CATALOG_URI"], **options)


session.CatalogSession.for_local = classmethod(_for_shared_catalog)

if __name__ == "__main__":
    sys.argv[0] = "zamboni"
    sys.exit(entry.main())

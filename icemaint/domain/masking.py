"""Credentials masked in any text that names a URI or a DSN before it is printed, logged or recorded.

A catalog URI may carry a password (`jdbc:postgresql://db/lake?user=u&password=...`,
`http://alice:...@rest:8181`); the product names the catalog in errors, doctor lines, JSON and audit
records, never the secret.
"""

from __future__ import annotations

import re

MASK = "***"
# The user info of a URI: `scheme://user:password@` keeps the user.
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^/@\s:?#]*:)[^/@\s?#]*@")
# A query (or JDBC `;key=value`) parameter whose name says it is secret.
_SECRET_PARAM = re.compile(
    r"([?&;](?:sig|[^=&;\s]*?(?:password|passwd|pwd|secret|token|credential|key|signature|auth)[^=&;\s]*)=)"
    r"[^&;\s]*", re.IGNORECASE)
# A libpq key/value DSN's password (`host=db password=...`).
_DSN_PASSWORD = re.compile(r"((?<!\S)password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def mask_credentials(text: str) -> str:
    """`text` with every password in a URI's user info, every secret-named query parameter and a DSN's
    password replaced by `***`; the rest (scheme, user, host, database) kept so the operator can tell
    which catalog is meant."""
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    text = _SECRET_PARAM.sub(rf"\1{MASK}", text)
    return _DSN_PASSWORD.sub(rf"\1{MASK}", text)

"""Claims and audit as Dagster resources: the table maintenance claim and the append-only audit log."""


from dagster import ConfigurableResource
from pydantic import PrivateAttr

from resources.settings import MaintenanceSettings


class TableClaimResource(ConfigurableResource):
    """The lock that maintenance and cooperating writers both take on a table (file or PostgreSQL backend)."""

    settings: MaintenanceSettings
    _claims = PrivateAttr(default=None)

    @property
    def claims(self):
        if self._claims is None:
            from icemaint.safety.claims import open_claims

            self._claims = open_claims(self.settings.config)
        return self._claims

    def acquire(self, table: str, holder: str):
        return self.claims.acquire(table, holder)

    def holder_of(self, table: str):
        return self.claims.holder_of(table)


class AuditResource(ConfigurableResource):
    """Appends and reads the audit trail: one record per maintenance decision."""

    settings: MaintenanceSettings
    _log = PrivateAttr(default=None)

    @property
    def log(self):
        if self._log is None:
            from icemaint.safety.audit import open_audit

            self._log = open_audit(self.settings.config)
        return self._log

    def append(self, record) -> None:
        self.log.append(record)

    def records(self, **filters):
        return self.log.records(**filters)

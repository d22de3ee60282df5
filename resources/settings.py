"""The configuration file as a Dagster resource: every other resource reads the estate's settings here."""


from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from icemaint.config import MaintenanceConfig, load_config


class MaintenanceSettings(ConfigurableResource):
    """Loads `maintenance.yaml` (or `$ICEMAINT_CONFIG`) once per process, when first used."""

    config_path: str = Field(
        default="",
        description="Path of the maintenance YAML file; empty means $ICEMAINT_CONFIG, else ./maintenance.yaml.",
    )
    _config: MaintenanceConfig | None = PrivateAttr(default=None)

    @property
    def config(self) -> MaintenanceConfig:
        if self._config is None:
            self._config = load_config(self.config_path or None)
        return self._config

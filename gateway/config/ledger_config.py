"""The `ledger:` section of the gateway's configuration."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SQLITE_SCHEME = "sqlite:///"


class LedgerConfig(BaseModel):
    """Where usage records go, and how they wait on the way.

    `url` is `postgresql://user@host/db` (PostgreSQL, for several gateways) or
    `sqlite:///relative/path.db` / `sqlite:////absolute/path.db` (the embedded default,
    for the demo and one node). Records wait in memory for up to `flush_interval_ms` or
    `batch_max` records, then go to the database in one batch; while the database does not
    answer they go to `spool_dir` on disk, up to `spool_max_bytes`, and are replayed in
    order when it answers again. `buffer_max` bounds the records held in memory while a
    batch is on its way (a safety bound: the flusher spools long before it is reached).
    """

    model_config = ConfigDict(extra="forbid")

    url: str = "sqlite:///gateway-usage.db"
    spool_dir: str = "gateway-usage-spool"
    spool_max_bytes: int = Field(default=256 * 1024 * 1024, ge=4096)
    batch_max: int = Field(default=500, ge=1, le=100_000)
    flush_interval_ms: int = Field(default=1000, ge=1, le=600_000)
    buffer_max: int = Field(default=200_000, ge=1)
    # How long one batch may take before the database counts as down (its batch spooled).
    write_timeout_ms: int = Field(default=5000, ge=1)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if url.startswith(POSTGRES_SCHEMES):
            return url
        if url.startswith(SQLITE_SCHEME) and len(url) > len(SQLITE_SCHEME):
            return url
        raise ValueError("ledger.url must be postgresql://... or sqlite:///path")

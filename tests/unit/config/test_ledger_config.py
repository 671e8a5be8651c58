from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.config.ledger_config import LedgerConfig


def test_the_default_is_an_embedded_sqlite_file() -> None:
    config = LedgerConfig()
    assert config.url.startswith("sqlite:///")
    assert config.batch_max == 500
    assert config.flush_interval_ms == 1000


@pytest.mark.parametrize(
    "url",
    ["postgresql://gw@db:5432/usage", "postgres://db/usage", "sqlite:////var/lib/usage.db"],
)
def test_postgres_and_sqlite_urls_are_taken(url: str) -> None:
    assert LedgerConfig(url=url).url == url


@pytest.mark.parametrize("url", ["mysql://db/usage", "sqlite:///", "usage.db"])
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(ValidationError, match=r"ledger\.url"):
        LedgerConfig(url=url)


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        LedgerConfig.model_validate({"url": "sqlite:///u.db", "batch_size": 10})


@pytest.mark.parametrize(
    "field", [{"batch_max": 0}, {"flush_interval_ms": 0}, {"spool_max_bytes": 10}]
)
def test_bounds_are_checked(field: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        LedgerConfig.model_validate(field)

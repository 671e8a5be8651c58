import logging

import pytest

from logsafe.filter import RedactingFilter, install
from logsafe.patterns import redact


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def captured() -> tuple[logging.Logger, ListHandler]:
    logger = logging.getLogger("hidden-test-redaction")
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = ListHandler()
    logger.addHandler(handler)
    install(logger)
    return logger, handler


@pytest.mark.parametrize(
    "key",
    ["sk-proj-AbCd1234efGh", "sk-test-0000abcd", "sk-live_9f8e7d6c5b", "sk-abcdefgh1234"],
)
def test_redact_masks_whole_key(key: str) -> None:
    assert redact(f"auth failed for {key}, retrying") == "auth failed for sk-***, retrying"


def test_redact_keeps_short_and_unrelated_text() -> None:
    assert redact("task-1234 used sk-abc and risk-assessment") == (
        "task-1234 used sk-abc and risk-assessment"
    )
    assert redact("Authorization: Bearer abc.def-ghi, next") == "Authorization: Bearer ***, next"


def test_key_in_logging_args_is_redacted(captured: tuple[logging.Logger, ListHandler]) -> None:
    logger, handler = captured
    logger.warning("rejected key %s for tenant %s", "sk-proj-AbCd1234efGh", "acme")
    assert handler.lines == ["rejected key sk-*** for tenant acme"]


def test_key_in_mapping_args_is_redacted(captured: tuple[logging.Logger, ListHandler]) -> None:
    logger, handler = captured
    logger.info("header=%(h)s n=%(n)d", {"h": "Bearer sk-test-0000abcd", "n": 3})
    assert handler.lines == ["header=Bearer *** n=3"]


def test_non_secret_messages_format_as_before(
    captured: tuple[logging.Logger, ListHandler],
) -> None:
    logger, handler = captured
    logger.info("%d tokens in %.1f s", 42, 1.5)
    logger.info("%s%% of %s", 50, ["a", "b"])
    logger.info("plain 100% done")
    assert handler.lines == ["42 tokens in 1.5 s", "50% of ['a', 'b']", "plain 100% done"]


def test_filter_never_drops_and_record_formats_redacted() -> None:
    record = logging.LogRecord(
        "x", logging.ERROR, __file__, 1, "upstream said %r", ("bad key sk-live_9f8e7d6c5b",), None
    )
    assert RedactingFilter().filter(record) is True
    assert record.getMessage() == "upstream said 'bad key sk-***'"

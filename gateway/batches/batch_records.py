"""What the batch store keeps: files, batches and their lines, as the rest of the gateway
reads them. Wire-free: the OpenAI and Anthropic shapes are made of these in `gateway.api`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class BatchStatus(StrEnum):
    """A batch's status, OpenAI's words (Anthropic's `processing_status` is made of it)."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        """No line of it will run again."""
        return self in _ENDED


_ENDED = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)


class LineState(StrEnum):
    """Where one line of a batch is."""

    PENDING = "pending"  # waits for idle capacity
    LEASED = "leased"  # a gateway runs it, until its lease's end
    DONE = "done"  # answered 2xx: a line of the output file
    FAILED = "failed"  # answered with an error, or could not run: the error file
    CANCELLED = "cancelled"  # its batch was cancelled before it ran
    EXPIRED = "expired"  # its batch's window ended before it ran

    @property
    def ended(self) -> bool:
        """It will not run (again)."""
        return self not in (LineState.PENDING, LineState.LEASED)


class BatchApi(StrEnum):
    """Which API made the batch: its shapes, its results."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A file: an upload (purpose `batch`) or a batch's output or error file."""

    id: str
    tenant: str
    # The API key that uploaded it (or whose batch wrote it): its key id.
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: float
    expires_at: float | None
    # Where its bytes are in the object store.
    object_key: str


@dataclass(frozen=True, slots=True)
class LineCounts:
    """A batch's lines by what became of them (`total` counts every line)."""

    total: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.cancelled + self.expired


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """What a batch's answered lines used."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0


# How long a batch's output files are kept unless it asks otherwise: 30 days, as OpenAI.
OUTPUT_TTL_S = 30 * 86400


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A batch, as stored. Times are unix seconds; None: not reached."""

    id: str
    api: BatchApi
    tenant: str
    # The API key that made it: every line is charged to it.
    key_id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: float
    expires_at: float
    counts: LineCounts = field(default_factory=LineCounts)
    tokens: TokenCounts = field(default_factory=TokenCounts)
    # The route names its lines run on.
    models: tuple[str, ...] = ()
    metadata: dict[str, str] | None = None
    # What refused the batch as a whole (status `failed`): OpenAI's `errors.data`.
    errors: list[dict[str, object]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None
    # The status it ends in once its last line is done: completed, cancelled, expired.
    final_status: BatchStatus = BatchStatus.COMPLETED
    # Why its lines stopped before they all ran (a budget spent), if they did.
    stopped_by: str | None = None
    # How long its output files are kept (OpenAI's `output_expires_after`).
    output_ttl_s: float = OUTPUT_TTL_S


@dataclass(frozen=True, slots=True)
class NewLine:
    """A line of a batch being made: a request to run, or one already failed (`result`
    its error's JSON body)."""

    line_no: int
    custom_id: str
    model: str
    body: str
    failed: str | None = None
    status_code: int | None = None


@dataclass(frozen=True, slots=True)
class ClaimedLine:
    """A line a worker holds under its lease (`lease`: the claim's own token)."""

    batch_id: str
    line_no: int
    custom_id: str
    model: str
    body: str
    attempts: int
    lease: str


@dataclass(frozen=True, slots=True)
class LineResult:
    """A finished line, as the output is written from it."""

    line_no: int
    custom_id: str
    state: LineState
    status_code: int | None
    request_id: str | None
    # The answer's JSON body (2xx), the error's (4xx/5xx), or for a line that never ran
    # (cancelled, expired) the error's JSON `{"code", "message"}`.
    result: str | None


@dataclass(frozen=True, slots=True)
class LineUsage:
    """What one answered line used, added to its batch's `TokenCounts`."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

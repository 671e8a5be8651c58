"""The cache-routing benchmark's workload: multi-turn chats that share prefixes, and one-offs.

Pure Python, no I/O: `loadtest/cache_routing.py` sends what this module generates.

- Each tenant has its own long system prompt (pseudo-random words).
- A conversation belongs to a tenant and has 3-8 turns; turn k sends
  [system, user 1, assistant 1, ..., user k], so each turn extends the one before. The
  assistant messages are synthetic (fixed here, not the model's reply): the simulated
  replicas cache prompt blocks only, so this is the same for their caches.
- A share of one-off requests: one long user message, no system prompt (no shared prefix).
- Arrivals are open-loop Poisson: `schedule(seed, rate, seconds)` puts the requests of
  `request_stream(seed)` at exponentially spaced times. The content and the unit-rate
  gaps come from their own random streams, so the same seed gives the same requests in
  the same order at any rate, and the rate only rescales the times.

Conversation requests carry their session key (`prompt_cache_key`, as Codex CLI sends);
one-offs carry none.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

# Syllables for the pseudo-random words: 20 x 20 x (1 + 20) combinations, ASCII only, so
# that a text's length in characters is its length in bytes (the simulator's unit).
_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "z", "br", "st", "tr")  # fmt: skip
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "ar", "er", "or", "an", "en",
           "in", "on", "al", "el", "il", "ol")  # fmt: skip


@dataclass(frozen=True)
class WorkloadConfig:
    """The shape of the workload; sizes are in bytes (ASCII text)."""

    tenants: int = 6
    system_bytes: int = 4096
    turns: tuple[int, int] = (3, 8)  # per conversation, inclusive
    # Means of 300 and 850 bytes: LMSYS-Chat-1M's 69.5 prompt and 214.5 response tokens
    # a turn (Zheng et al. 2023, table 1), at 4 bytes a token.
    user_bytes: tuple[int, int] = (100, 500)
    assistant_bytes: tuple[int, int] = (500, 1200)
    one_off_share: float = 0.2
    one_off_bytes: tuple[int, int] = (2048, 6144)
    # Conversations in progress; each conversation request picks one of them uniformly.
    active: int = 40

    def tenant_names(self) -> list[str]:
        return [f"tenant{i}" for i in range(self.tenants)]


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of the sequence, without its arrival time."""

    index: int  # position in the sequence
    tenant: str
    messages: tuple[Message, ...]
    # The conversation's id (its session key), None for a one-off.
    conversation: str | None = None
    turn: int = 0  # 1-based turn of the conversation; 0 for a one-off

    @property
    def one_off(self) -> bool:
        return self.conversation is None

    @property
    def prompt_bytes(self) -> int:
        """Bytes of message content (the rendered prompt adds the template's markers)."""
        return sum(len(m.content) for m in self.messages)


@dataclass(frozen=True)
class ScheduledRequest:
    """A request and when it is sent, in seconds after the start of the run."""

    at: float
    request: WorkloadRequest


def words(rng: random.Random, size: int) -> str:
    """`size` bytes of pseudo-random lowercase words separated by spaces."""
    parts: list[str] = []
    length = -1  # of the words joined by spaces
    while length < size:
        word = rng.choice(_ONSETS) + rng.choice(_NUCLEI)
        if rng.random() < 0.6:
            word += rng.choice(_ONSETS) + rng.choice(_NUCLEI)
        parts.append(word)
        length += len(word) + 1
    return " ".join(parts)[:size]


def system_prompts(seed: int, config: WorkloadConfig = WorkloadConfig()) -> dict[str, str]:
    """Each tenant's system prompt, from a random stream of its own."""
    prompts = {}
    for tenant in config.tenant_names():
        rng = random.Random(f"{seed}:system:{tenant}")
        prompts[tenant] = f"You are the assistant of {tenant}. " + words(rng, config.system_bytes)
    return prompts


@dataclass
class _Conversation:
    id: str
    tenant: str
    users: list[str]
    assistants: list[str]
    sent: int = 0  # turns sent so far

    @property
    def done(self) -> bool:
        return self.sent == len(self.users)


@dataclass
class _Generator:
    seed: int
    config: WorkloadConfig
    rng: random.Random = field(init=False)
    systems: dict[str, str] = field(init=False)
    created: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}:content")
        self.systems = system_prompts(self.seed, self.config)

    def size(self, bounds: tuple[int, int]) -> int:
        return self.rng.randint(*bounds)

    def conversation(self) -> _Conversation:
        turns = self.rng.randint(*self.config.turns)
        tenant = self.rng.choice(self.config.tenant_names())
        users = [words(self.rng, self.size(self.config.user_bytes)) for _ in range(turns)]
        assistants = [
            words(self.rng, self.size(self.config.assistant_bytes)) for _ in range(turns - 1)
        ]
        self.created += 1
        return _Conversation(f"conv-{self.seed}-{self.created}", tenant, users, assistants)

    def next_turn(self, index: int, conversation: _Conversation) -> WorkloadRequest:
        conversation.sent += 1
        k = conversation.sent
        messages = [Message("system", self.systems[conversation.tenant])]
        for i in range(k):
            messages.append(Message("user", conversation.users[i]))
            if i < k - 1:
                messages.append(Message("assistant", conversation.assistants[i]))
        return WorkloadRequest(index, conversation.tenant, tuple(messages), conversation.id, turn=k)

    def one_off(self, index: int) -> WorkloadRequest:
        tenant = self.rng.choice(self.config.tenant_names())
        text = words(self.rng, self.size(self.config.one_off_bytes))
        return WorkloadRequest(index, tenant, (Message("user", text),))


def request_stream(
    seed: int, config: WorkloadConfig = WorkloadConfig()
) -> Iterator[WorkloadRequest]:
    """The endless, deterministic sequence of requests for `seed`.

    Each request is a one-off with probability `one_off_share`, else the next turn of a
    conversation picked uniformly among `active` ones; a conversation that has sent all
    its turns is replaced by a new one (of a random tenant).
    """
    generator = _Generator(seed, config)
    pool = [generator.conversation() for _ in range(config.active)]
    for index in itertools.count():
        if generator.rng.random() < config.one_off_share:
            yield generator.one_off(index)
            continue
        slot = generator.rng.randrange(len(pool))
        yield generator.next_turn(index, pool[slot])
        if pool[slot].done:
            pool[slot] = generator.conversation()


def arrival_times(seed: int, rate: float, seconds: float) -> list[float]:
    """Poisson arrival times in [0, seconds) at `rate` per second: unit-rate exponential
    gaps from their own random stream, divided by `rate`."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = random.Random(f"{seed}:arrivals")
    times: list[float] = []
    unit_time = rng.expovariate(1.0)
    while unit_time / rate < seconds:
        times.append(unit_time / rate)
        unit_time += rng.expovariate(1.0)
    return times


def schedule(
    seed: int, rate: float, seconds: float, config: WorkloadConfig = WorkloadConfig()
) -> list[ScheduledRequest]:
    """The requests of `request_stream(seed)` at the arrival times of `arrival_times`."""
    times = arrival_times(seed, rate, seconds)
    requests = request_stream(seed, config)
    return [ScheduledRequest(at, next(requests)) for at in times]

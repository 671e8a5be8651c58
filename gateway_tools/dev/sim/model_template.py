"""A Triton Python-backend model that imitates an LLM on the CPU.

`gateway_tools.dev.sim.repository` copies this file to `<repo>/<model>/1/model.py`. The model is
decoupled: `execute` turns every request into an asyncio task and returns at once, so
hundreds of streams overlap in one stub process.

Text is deterministic: the words come from a hash of the prompt (and the `seed` request
parameter), so tests can compute the expected answer with `generate_pieces`, which is
importable without Triton. Offered tools in the Hermes format (the chatml template
renders them so) and not answering a tool's result, it calls one: a `<tool_call>` block
whose arguments follow the function's JSON Schema.

Inputs:  text_input BYTES [1], max_tokens INT32 [1] (optional, default 16),
         stream BOOL [1] (optional, default false).
Outputs: text_output BYTES [1], num_input_tokens INT32 [1], num_output_tokens INT32 [1],
         output_log_probs FP32 [-1] (one per token of the response; only when asked).
Request parameters (JSON): seed (changes the text), stop (JSON list of strings, or one
plain string), return_log_probs (TensorRT-LLM's name: the tokens' log probabilities);
temperature, top_p and anything else are accepted and ignored.
The `interface` model config parameter makes it take another backend's inputs instead:
`vllm` (Triton's vLLM backend: `sampling_parameters` JSON text, or the request
parameters; the prompt put before a whole answer unless `exclude_input_in_output`;
token counts only when `return_num_input_tokens` / `return_num_output_tokens` ask) or
`tensorrtllm` (TensorRT-LLM's ensemble: `max_tokens`, `seed` and `stop_words` inputs,
`exclude_input_in_output`, counts when asked).
Model config parameters (string values, seconds): token_delay, prefill_per_char;
replay_file (a path): the model replays recorded answers instead (`replay_pieces`);
prefix_cache_blocks (0: no cache) and block_tokens: the prefix cache (`PrefixCache`).

A prefix cache, as vLLM's automatic prefix caching keeps one: the prompt's full blocks of
`block_tokens` tokens (four bytes a token), each named by a hash chained from the start of
the prompt, kept in an LRU of `prefix_cache_blocks` blocks. Prefill is charged only for
the bytes after the cached prefix; each response reports `num_cached_tokens`, and the
model exports Triton custom metrics: sim_prefix_cache_queries_total and
sim_prefix_cache_hits_total (prompt tokens looked up, and found), sim_prefix_cache_usage
(the share of the cache's blocks in use); and sim_generated_tokens_total, the completion
tokens generated, which stops growing when a cancelled request stops (streamed or not).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (tests) only for the pure text functions
    pb_utils = None

VOCABULARY = (
    "lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit",
    "sed", "do", "eiusmod", "tempor", "incididunt", "ut", "labore", "et",
    "dolore", "magna", "aliqua", "enim", "ad", "minim", "veniam", "quis",
    "nostrud", "exercitation", "ullamco", "laboris", "nisi", "aliquip", "ex", "ea",
)  # fmt: skip
MIN_TOKENS = 8
LENGTH_SPREAD = 57  # natural length is MIN_TOKENS + hash % LENGTH_SPREAD, so 8..64
DEFAULT_MAX_TOKENS = 16
_EXECUTE_GRACE = 0.01  # seconds; see TritonPythonModel.execute


def count_input_tokens(prompt: bytes) -> int:
    """Prompt tokens as the simulator counts them: one per 4 bytes, rounded up."""
    return math.ceil(len(prompt) / 4)


def _digest(prompt: bytes, seed: Any) -> bytes:
    # hashlib, not hash(): the text must not change between processes (PYTHONHASHSEED).
    prefix = b"" if seed is None else str(seed).encode() + b"\x00"
    return hashlib.sha256(prefix + prompt).digest()


def natural_length(prompt: bytes, seed: Any = None) -> int:
    """Tokens the model generates for this prompt when max_tokens does not cut it."""
    return MIN_TOKENS + int.from_bytes(_digest(prompt, seed)[:8], "big") % LENGTH_SPREAD


def _word(digest: bytes, index: int) -> str:
    h = hashlib.blake2b(digest + index.to_bytes(4, "big"), digest_size=4).digest()
    return VOCABULARY[int.from_bytes(h, "big") % len(VOCABULARY)] + " "


def generate_pieces(
    prompt: bytes,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: Any = None,
    stop: Sequence[str] = (),
    guided: Any = None,
) -> list[str]:
    """The output tokens (one word plus a space each) for a request.

    With stop strings, the text is cut before the first occurrence of any of them and
    the pieces are the words of what is left (the last one may be a partial word).
    Streaming and non-streaming answers are both built from this list, so the
    concatenation of the streamed tokens always equals the non-streamed text.
    """
    digest = _digest(prompt, seed)
    structured = guided_text(guided, digest) if guided is not None else None
    call = structured if structured is not None else tool_call_text(prompt, digest)
    if call is not None:
        # About four characters a token, as the input is counted.
        return [call[i : i + 4] for i in range(0, len(call), 4)][:max_tokens]
    count = max(0, min(natural_length(prompt, seed), max_tokens))
    words = [_word(digest, i) for i in range(count)]
    text = "".join(words)
    cuts = [text.find(s) for s in stop if s]
    cut = min((c for c in cuts if c >= 0), default=len(text))
    pieces: list[str] = []
    remaining = text[:cut]
    for word in words:
        if not remaining:
            break
        pieces.append(remaining[: len(word)])
        remaining = remaining[len(word) :]
    return pieces


# The Hermes tool format of the chatml template (gateway/inference/prompt.py): the
# tools, one JSON object a line, between <tools> tags in the system turn.
_TOOLS = re.compile(rb"<tools>\n(.*?)\n</tools>", re.S)
_MUST_CALL = re.compile(rb"You must call ([A-Za-z0-9_-]+)\.")
_TURN = b"<|im_start|>"


def guided_text(guided: Any, digest: bytes) -> str | None:
    """JSON as guided decoding would make it: valid for `{"json": schema}`, or an object
    for `{"json_object": true}` (vLLM's `guided_decoding` parameter, as JSON text)."""
    try:
        spec = json.loads(guided) if isinstance(guided, str) else guided
    except ValueError:
        return None
    if not isinstance(spec, dict):
        return None
    if isinstance(spec.get("json"), dict):
        return json.dumps(_value(spec["json"], digest, 0))
    if spec.get("json_object"):
        return json.dumps({"answer": _value({"type": "string"}, digest, 0)})
    return None


def tool_call_text(prompt: bytes, digest: bytes) -> str | None:
    """The Hermes tool call the model answers with, or None when it answers in text:
    tools are offered and the last turn is not a tool's result. It calls the function
    the prompt says it must call, else the first; its arguments follow the function's
    JSON Schema, with values drawn from the digest of the prompt."""
    tools = _TOOLS.search(prompt)
    turns = prompt.split(_TURN)
    if tools is None or (len(turns) >= 2 and b"<tool_response>" in turns[-2]):
        return None
    functions = []
    for line in tools.group(1).splitlines():
        try:
            functions.append(json.loads(line)["function"])
        except (ValueError, KeyError, TypeError):
            continue
    if not functions:
        return None
    must = _MUST_CALL.search(prompt)
    named = [f for f in functions if must and f.get("name") == must.group(1).decode()]
    function = (named or functions)[0]
    arguments = _value(function.get("parameters") or {}, digest, 0)
    call = {"name": function.get("name"), "arguments": arguments}
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


def _value(schema: Any, digest: bytes, depth: int) -> Any:
    """A value valid for `schema` (the common JSON Schema keywords), from `digest`."""
    h = int.from_bytes(hashlib.blake2b(digest + bytes([depth]), digest_size=4).digest(), "big")
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][h % len(schema["enum"])]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties") or {}
        return {
            name: _value(sub, digest + name.encode(), depth + 1) for name, sub in properties.items()
        }
    if kind == "array":
        return [_value(schema.get("items") or {}, digest, depth + 1)]
    if kind == "integer":
        return h % 100
    if kind == "number":
        # Whole: a JSON Schema number, which clients that read it as a count (Codex CLI's
        # `max_output_tokens`) also take.
        return h % 100
    if kind == "boolean":
        return bool(h & 1)
    if kind == "null":
        return None
    return VOCABULARY[h % len(VOCABULARY)]


def token_logprob(prompt: bytes, seed: Any, index: int) -> float:
    """The log probability the model gives its token `index` for this prompt: between
    -3 and 0, deterministic like the text."""
    h = hashlib.blake2b(_digest(prompt, seed) + b"lp" + index.to_bytes(4, "big"), digest_size=4)
    return -(int.from_bytes(h.digest(), "big") % 3000) / 1000


# A replayed answer streams in pieces of four tokens (as TensorRT-LLM may send several
# tokens a response), each counted as four bytes a token, as the input is.
REPLAY_PIECE_TOKENS = 4


@dataclass(frozen=True)
class Replay:
    """A recorded answer: its pieces, and how long the first and each next piece take."""

    pieces: list[str]
    first_token_delay: float = 0.0
    token_delay: float | None = None  # between pieces; None: the model's own

    @property
    def tokens(self) -> list[int]:
        return [math.ceil(len(piece.encode()) / 4) for piece in self.pieces]


def _matches(recording: Any, text: str) -> bool:
    """Whether a recording answers this prompt: it holds `match` and every one of
    `match_all`, and none of `unless`."""
    wanted = [recording["match"], *recording.get("match_all", ())]
    return all(w in text for w in wanted) and not any(
        u in text for u in recording.get("unless", ())
    )


def _filled(answer: str, recording: Any, text: str) -> str:
    """The answer with `{capture}` replaced by the first group of the recording's
    `capture` pattern in the prompt (a path the client named, say)."""
    pattern = recording.get("capture")
    if pattern is None:
        return answer
    found = re.search(pattern, text)
    return answer.replace("{capture}", found.group(1) if found else "")


def replay_pieces(prompt: bytes, recordings: Any, max_tokens: int) -> Replay:
    """The recorded answer for a prompt: that of the first recording that matches it
    (`_matches`), else the file's `unmatched` text. A scripted model for the demo, which
    `gateway eval` judges like any other (gateway_tools/dev/replay.py writes its files), and the
    scripted agent the coding tools run against in the tests (evals/replay/agent.json):
    its recordings tell a first turn (a tool call) from the one after the tool's result."""
    text = prompt.decode(errors="replace")
    for recording in recordings.get("recordings", ()):
        if _matches(recording, text):
            answer = _filled(recording["answer"], recording, text)
            first = float(recording.get("first_token_delay_s", 0.0))
            delay = recording.get("token_delay_s")
            break
    else:
        answer, first, delay = recordings.get("unmatched", "I have no answer for this."), 0.0, None
    size = 4 * REPLAY_PIECE_TOKENS
    pieces = [answer[i : i + size] for i in range(0, len(answer), size)]
    kept, budget = [], max_tokens  # max_tokens cuts the answer, as it would a model's
    for piece in pieces:
        piece = piece[: 4 * budget]
        if not piece:
            break
        kept.append(piece)
        budget -= math.ceil(len(piece.encode()) / 4)
    return Replay(kept, first, None if delay is None else float(delay))


class PrefixCache:
    """The KV blocks of the prompts a replica served, by chained block hash, in LRU order."""

    def __init__(self, capacity_blocks: int, block_tokens: int = 16) -> None:
        self.capacity = capacity_blocks
        self.block_bytes = 4 * block_tokens
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    @property
    def usage(self) -> float:
        return len(self._blocks) / self.capacity if self.capacity else 0.0

    def block_hashes(self, prompt: bytes) -> list[bytes]:
        """One hash per full block, each chained to the one before: a block is the same
        only after the same prefix."""
        hashes, previous = [], b""
        for start in range(0, len(prompt) - self.block_bytes + 1, self.block_bytes):
            previous = hashlib.sha256(previous + prompt[start : start + self.block_bytes]).digest()
            hashes.append(previous)
        return hashes

    def lookup_and_store(self, prompt: bytes) -> int:
        """Bytes of `prompt` whose KV blocks are cached (its longest cached prefix of full
        blocks); then every full block of it is cached, most recent last."""
        if not self.capacity:
            return 0
        hashes = self.block_hashes(prompt)
        hits = 0
        for block in hashes:
            if block not in self._blocks:
                break
            hits += 1
        for block in hashes:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        return hits * self.block_bytes


def parse_stop(value: Any) -> list[str]:
    """Stop strings from a request parameter: a JSON list, a plain string, or a list."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [value]  # not JSON: one literal stop string
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [str(s) for s in value]
    raise ValueError(f"stop must be a string or a JSON list of strings, got {value!r}")


@dataclass(frozen=True)
class _GenerateRequest:
    prompt: bytes
    max_tokens: int
    stream: bool
    seed: Any
    stop: list[str]
    guided: Any
    logprobs: bool
    # What the answer carries beyond its text: the prompt before it (vLLM's and
    # TensorRT-LLM's default for a whole answer), and the token counts (always, in the
    # generic convention; when asked, in the others).
    prepend_prompt: bool = False
    input_count: bool = True
    output_count: bool = True
    cache_count: bool = True


def _first(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    values = tensor.as_numpy().reshape(-1)
    if values.size == 0:
        raise ValueError(f"{name} is empty")
    return values[0]


def _flag(request: Any, name: str) -> bool | None:
    value = _first(request, name)
    return None if value is None else bool(value)


def _parse_vllm_request(request: Any) -> _GenerateRequest:
    """As Triton's vLLM backend reads a request (its utils/request.py)."""
    prompt = _prompt(request)
    stream = bool(_flag(request, "stream"))
    exclude = _flag(request, "exclude_input_in_output")
    if stream and exclude is False:
        raise ValueError("When streaming, `exclude_input_in_output` = False is not allowed.")
    sampling = _first(request, "sampling_parameters")
    params = json.loads(sampling if sampling is not None else request.parameters() or "{}")
    max_tokens = int(params.get("max_tokens", DEFAULT_MAX_TOKENS))
    return _GenerateRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        stream=stream,
        seed=params.get("seed"),
        stop=parse_stop(params.get("stop")),
        guided=params.get("guided_decoding"),
        logprobs=False,
        prepend_prompt=not stream and not exclude,
        input_count=bool(_flag(request, "return_num_input_tokens")),
        output_count=bool(_flag(request, "return_num_output_tokens")),
        cache_count=False,
    )


def _parse_tensorrtllm_request(request: Any) -> _GenerateRequest:
    """As TensorRT-LLM's ensemble takes a request: every setting an input."""
    prompt = _prompt(request)
    max_tokens = _first(request, "max_tokens")
    if max_tokens is None:
        raise ValueError("max_tokens is required")
    stop_words = pb_utils.get_input_tensor_by_name(request, "stop_words")
    stop = [] if stop_words is None else [_text(w) for w in stop_words.as_numpy().reshape(-1)]
    guide_type = _first(request, "guided_decoding_guide_type")
    guided = None
    if guide_type is not None:
        guide = _text(_first(request, "guided_decoding_guide") or b"")
        guided = {"json": json.loads(guide)} if guide else {"json_object": True}
    seed = _first(request, "seed")
    return _GenerateRequest(
        prompt=prompt,
        max_tokens=int(max_tokens),
        stream=bool(_flag(request, "stream")),
        seed=None if seed is None else int(seed),
        stop=stop,
        guided=guided,
        logprobs=bool(_flag(request, "return_log_probs")),
        prepend_prompt=not _flag(request, "exclude_input_in_output"),
        input_count=bool(_flag(request, "return_num_input_tokens")),
        output_count=bool(_flag(request, "return_num_output_tokens")),
        cache_count=False,
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _prompt(request: Any) -> bytes:
    prompt = _first(request, "text_input")
    if isinstance(prompt, str):
        prompt = prompt.encode()
    if not prompt:
        raise ValueError("text_input is required and must not be empty")
    return bytes(prompt)


def _parse_request(request: Any) -> _GenerateRequest:
    prompt = _prompt(request)
    max_tokens = _first(request, "max_tokens")
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens)
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    params = json.loads(request.parameters() or "{}")
    return _GenerateRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        stream=bool(_flag(request, "stream")),
        seed=params.get("seed"),
        stop=parse_stop(params.get("stop")),
        guided=params.get("guided_decoding"),
        logprobs=bool(params.get("return_log_probs")),
    )


def _response(
    parsed: _GenerateRequest,
    text: str,
    input_tokens: int,
    output_tokens: int,
    logprobs: list[float] | None = None,
    cached_tokens: int = 0,
) -> Any:
    counts = (
        ("num_input_tokens", input_tokens, parsed.input_count),
        ("num_output_tokens", output_tokens, parsed.output_count),
        ("num_cached_tokens", cached_tokens, parsed.cache_count),
    )
    tensors = [pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]
    tensors += [
        pb_utils.Tensor(name, np.array([count], dtype=np.int32))
        for name, count, asked in counts
        if asked
    ]
    if logprobs is not None:
        values = np.array(logprobs, dtype=np.float32)
        tensors.append(pb_utils.Tensor("output_log_probs", values))
    return pb_utils.InferenceResponse(output_tensors=tensors)


# How a request is read, by the `interface` the model imitates.
_PARSERS = {
    "generic": _parse_request,
    "vllm": _parse_vllm_request,
    "tensorrtllm": _parse_tensorrtllm_request,
}


def _whole_text(parsed: _GenerateRequest, pieces: list[str]) -> str:
    answer = "".join(pieces)
    return parsed.prompt.decode(errors="replace") + answer if parsed.prepend_prompt else answer


def _logprobs(parsed: _GenerateRequest, start: int, count: int) -> list[float] | None:
    if not parsed.logprobs:
        return None
    return [token_logprob(parsed.prompt, parsed.seed, i) for i in range(start, start + count)]


def _error(message: str) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class TritonPythonModel:
    """The Python-backend entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        params = json.loads(args["model_config"]).get("parameters", {})

        def seconds(key: str, default: float) -> float:
            return float(params.get(key, {}).get("string_value", default))

        interface = params.get("interface", {}).get("string_value", "generic")
        self.parse = _PARSERS[interface]
        self.token_delay = seconds("token_delay", 0.01)
        self.prefill_per_char = seconds("prefill_per_char", 0.0001)
        self.cache = PrefixCache(
            int(seconds("prefix_cache_blocks", 0)), int(seconds("block_tokens", 16))
        )
        # Prompts computed at once: 0, any number; 1, one at a time, as a GPU whose
        # prefill is compute-bound (decoding is batched and not limited here).
        slots = int(seconds("prefill_slots", 0))
        self.prefill_gate = asyncio.Semaphore(slots) if slots else None
        self._cache_metrics(args["model_name"])
        replay_file = params.get("replay_file", {}).get("string_value")
        self.recordings = None
        if replay_file:
            with open(replay_file, encoding="utf-8") as recorded:
                self.recordings = json.load(recorded)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(
            json.loads(args["model_config"])
        )
        # create_task keeps only a weak reference: hold the tasks until they finish.
        self.tasks: set[asyncio.Task[None]] = set()

    def _cache_metrics(self, model: str) -> None:
        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        labels = {"model": model}
        # The families must outlive their metrics: Triton refuses to update a metric
        # whose family was collected, so both are kept on the model.
        self.families = [
            pb_utils.MetricFamily(
                name="sim_prefix_cache_queries_total",
                description="Prompt tokens in full blocks looked up in the prefix cache",
                kind=counter,
            ),
            pb_utils.MetricFamily(
                name="sim_prefix_cache_hits_total",
                description="Prompt tokens found in the prefix cache (not computed again)",
                kind=counter,
            ),
            pb_utils.MetricFamily(
                name="sim_prefix_cache_usage",
                description="Share of the prefix cache's blocks in use (0 to 1)",
                kind=gauge,
            ),
            pb_utils.MetricFamily(
                name="sim_generated_tokens_total",
                description="Completion tokens generated (a cancelled request's until it stopped)",
                kind=counter,
            ),
        ]
        self.queries, self.hits, self.usage, self.generated = (
            f.Metric(labels=labels) for f in self.families
        )

    async def _prefill(self, prompt: bytes) -> int:
        """Compute `prompt` (wait for the part not cached, in turn with other prompts when
        prefill slots are limited); its tokens the prefix cache held."""
        if self.prefill_gate is None:
            return await self._compute(prompt)
        async with self.prefill_gate:
            return await self._compute(prompt)

    async def _compute(self, prompt: bytes) -> int:
        # Looked up when its turn comes, as a server does: blocks that another prompt
        # computed while this one waited count as cached.
        cached = self.cache.lookup_and_store(prompt)
        if self.cache.capacity:
            looked_up = len(prompt) - len(prompt) % self.cache.block_bytes
            self.queries.increment(looked_up // 4)
            self.hits.increment(cached // 4)
            self.usage.set(self.cache.usage)
        await asyncio.sleep(self.prefill_per_char * (len(prompt) - cached))
        return cached // 4

    async def execute(self, requests: list[Any]) -> Any:
        """Start one task per request; responses go through each request's sender.

        A non-decoupled model instead answers each request whole, one after another.
        """
        if not self.decoupled:
            return [await self._whole(request) for request in requests]
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            sender = request.get_response_sender()
            try:
                # Read the inputs now: the task outlives this call.
                parsed = self.parse(request)
            except Exception as exc:
                sender.send(_error(str(exc)), flags=final)
                continue
            task = asyncio.get_running_loop().create_task(self._generate(parsed, sender))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        # Return only after the stub has registered this coroutine: returning at once
        # races with the registration (triton-inference-server/server#8537), which then
        # logs "Cannot remove future from background" and leaks the finished future.
        await asyncio.sleep(_EXECUTE_GRACE)
        return None

    async def _whole(self, request: Any) -> Any:
        try:
            parsed = self.parse(request)
        except Exception as exc:
            return _error(str(exc))
        cached = await self._prefill(parsed.prompt)
        pieces, tokens, first_delay, token_delay = self._plan(parsed)
        await asyncio.sleep(first_delay + token_delay * len(pieces))
        return _response(
            parsed,
            _whole_text(parsed, pieces),
            count_input_tokens(parsed.prompt),
            sum(tokens),
            _logprobs(parsed, 0, len(pieces)),
            cached,
        )

    def _plan(self, parsed: _GenerateRequest) -> tuple[list[str], list[int], float, float]:
        """The pieces of the answer, the tokens of each, the delay before the first piece
        after prefill, and the delay of each next."""
        if self.recordings is not None:
            replay = replay_pieces(parsed.prompt, self.recordings, parsed.max_tokens)
            delay = self.token_delay if replay.token_delay is None else replay.token_delay
            return replay.pieces, replay.tokens, replay.first_token_delay, delay
        pieces = generate_pieces(
            parsed.prompt, parsed.max_tokens, parsed.seed, parsed.stop, parsed.guided
        )
        return pieces, [1] * len(pieces), 0.0, self.token_delay

    async def _generate(self, parsed: _GenerateRequest, sender: Any) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            cached = await self._prefill(parsed.prompt)
            pieces, tokens, first_delay, token_delay = self._plan(parsed)
            n_in = count_input_tokens(parsed.prompt)
            await asyncio.sleep(first_delay)
            if not parsed.stream:
                # Token by token, as a real engine decodes: a cancel (the gateway's client
                # left and it closed the connection) stops the work here too.
                for count in tokens:
                    await asyncio.sleep(token_delay)
                    if sender.is_cancelled():
                        sender.send(flags=final)
                        return
                    self.generated.increment(count)
                text = _whole_text(parsed, pieces)
                logprobs = _logprobs(parsed, 0, len(pieces))
                answer = _response(parsed, text, n_in, sum(tokens), logprobs, cached)
                sender.send(answer, flags=final)
                return
            if not pieces:
                # Still one data response, so every stream carries its usage counts.
                empty = _response(parsed, "", n_in, 0, _logprobs(parsed, 0, 0), cached)
                sender.send(empty, flags=final)
                return
            for i, piece in enumerate(pieces):
                await asyncio.sleep(token_delay)
                if sender.is_cancelled():  # client went away: stop generating
                    sender.send(flags=final)
                    return
                self.generated.increment(tokens[i])
                # The last token carries FINAL itself: no extra empty response is needed.
                last = i == len(pieces) - 1
                logprobs = _logprobs(parsed, i, 1)
                sender.send(
                    _response(parsed, piece, n_in, tokens[i], logprobs, cached),
                    flags=final if last else 0,
                )
        except Exception as exc:
            # If the sender is already closed, nothing more can reach the client.
            with contextlib.suppress(Exception):
                sender.send(_error(f"{type(exc).__name__}: {exc}"), flags=final)

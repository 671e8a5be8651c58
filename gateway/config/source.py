"""Reading one YAML config file into plain data, with the line of every node.

PyYAML's composed node tree carries a mark for each node, so the loader can
point each problem at a line. Scalar strings get `${VAR}` / `${VAR:-default}`
substitution here, and the path of every scalar that was exactly one
environment reference is kept, because an API key may only be plain text when
it comes from the environment.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

# A location in the data: mapping keys and sequence indices from the root.
Loc = tuple[str | int, ...]

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# `$${` is an escaped literal `${`; a `${` that is not a well-formed reference is an error.
_ENV_TOKEN = re.compile(rf"\$\$\{{|\$\{{({_NAME})(?::-([^}}]*))?\}}|\$\{{")
_ENV_WHOLE = re.compile(rf"\$\{{({_NAME})(?::-([^}}]*))?\}}")


class EnvText(str):
    """A scalar that `${VAR}` substitution produced.

    YAML types a plain scalar before substitution, so `${PORT:-8080}` is text; the
    schema's numeric types accept such a text when it spells a number (and refuse
    other strings, and booleans, which they never coerce).
    """

    __slots__ = ()


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config file; `str()` gives `file:line: message`."""

    file: str
    # None when the problem is not about a line (e.g. the file cannot be read).
    line: int | None
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.message}"


class ConfigError(Exception):
    """The config files are invalid; `problems` lists everything found."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


@dataclass
class Source:
    """One file's data and where each part of it came from."""

    file: str
    data: Any = None
    # Line of each mapping key, and line where each value starts (1-based).
    key_lines: dict[Loc, int] = field(default_factory=dict)
    value_lines: dict[Loc, int] = field(default_factory=dict)
    # Scalars that were exactly one `${VAR}` set in the environment: loc -> VAR.
    env_vars: dict[Loc, str] = field(default_factory=dict)
    # Scalars whose substitution failed; later checks skip them to avoid noise.
    unresolved: set[Loc] = field(default_factory=set)
    problems: list[Problem] = field(default_factory=list)
    # False when the file could not be read or is not YAML: there is no data to check.
    parsed: bool = False

    def problem(self, loc: Loc, message: str, *, at_key: bool = False) -> Problem:
        """A problem at `loc`, or at its deepest ancestor present in the file."""
        return Problem(self.file, self.line(loc, at_key=at_key), message)

    def line(self, loc: Loc, *, at_key: bool = False) -> int:
        """Line of the value at `loc` (of its key if `at_key`).

        When `loc` is not in the file (a missing key), the line of the deepest
        ancestor that is, preferring its key so the user lands on `name:`.
        """
        if loc in self.value_lines and not at_key:
            return self.value_lines[loc]
        for end in range(len(loc), 0, -1):
            prefix = loc[:end]
            if prefix in self.key_lines:
                return self.key_lines[prefix]
            if prefix in self.value_lines:
                return self.value_lines[prefix]
        return self.value_lines.get((), 1)


# A config file is a few KB; a path that names something else (a device, a FIFO, a
# huge file) is refused before it is read whole, and YAML aliases may not expand a small
# file into a huge one (a "billion laughs" took 3 GB before it failed).
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_ALIAS_EXPANSIONS = 100_000


def read_source(path: str, environ: Mapping[str, str] | None = None) -> Source:
    """Read and parse `path`; problems are collected in `Source.problems`."""
    source = Source(path)
    try:
        text = _read_text(path)
    except (OSError, UnicodeDecodeError, _NotAConfig) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        source.problems.append(Problem(path, None, f"cannot read file: {reason}"))
        return source
    _Walker(source, os.environ if environ is None else environ).parse(text)
    return source


class _NotAConfig(Exception):
    """The path names no file a config can be (a device, a FIFO, one too large)."""


def _read_text(path: str) -> str:
    # Checked before opening: opening a FIFO waits for a writer.
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise _NotAConfig("not a regular file")
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise _NotAConfig(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    return data.decode("utf-8")


def _syntax_problem(file: str, text: str, e: yaml.YAMLError) -> Problem:
    """`file:line: invalid YAML: why` for any error PyYAML raises while parsing `text`."""
    if isinstance(e, yaml.reader.ReaderError):
        # A character YAML does not allow (e.g. a control character): no mark, a position.
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        code = e.character if isinstance(e.character, int) else ord(e.character)
        return Problem(
            file, line, f"invalid YAML: character #x{code:02x} at column {column}: {e.reason}"
        )
    if not isinstance(e, yaml.MarkedYAMLError):
        return Problem(file, None, f"invalid YAML: {e}")
    mark = e.problem_mark or e.context_mark
    message = f"invalid YAML: {e.problem or e.context}"
    if e.context and e.problem and e.context_mark is not None:
        message += f" ({e.context} at line {e.context_mark.line + 1})"
    # `[${KEY}]` is the likely slip: `{` cannot start inside a plain scalar in a flow list.
    if mark is not None and text[mark.index - 1 : mark.index + 1] == "${":
        message += '; quote "${...}" values inside [ ] or { }'
    return Problem(file, mark.line + 1 if mark else None, message)


class _TooManyExpansions(Exception):
    """Aliases expand past `MAX_ALIAS_EXPANSIONS` values."""


class _Walker:
    """Builds plain data from the node tree, recording lines on the way."""

    def __init__(self, source: Source, environ: Mapping[str, str]) -> None:
        self.source = source
        self.environ = environ
        self.loader: yaml.SafeLoader | None = None
        # Nodes being built, to refuse recursive aliases instead of looping.
        self.active: set[int] = set()
        # Nodes built once, and how many were built again (through aliases) since.
        self.built: set[int] = set()
        self.expansions = 0

    def parse(self, text: str) -> None:
        try:
            # Inside the try: the loader checks the text for unprintable characters at once.
            self.loader = yaml.SafeLoader(text)
            root = self.loader.get_single_node()
            if root is not None:
                self.source.data = self.node(root, ())
            self.source.parsed = True
        except yaml.YAMLError as e:
            self.source.data = None
            self.source.problems.append(_syntax_problem(self.source.file, text, e))
        except RecursionError:
            self.source.data = None
            self.source.problems.append(
                Problem(self.source.file, None, "invalid YAML: nested too deeply")
            )
        except _TooManyExpansions:
            self.source.data = None
            message = f"invalid YAML: aliases expand to more than {MAX_ALIAS_EXPANSIONS:,} values"
            self.source.problems.append(Problem(self.source.file, None, message))
        finally:
            if self.loader is not None:
                self.loader.dispose()

    def node(self, node: yaml.Node, loc: Loc) -> Any:
        self.source.value_lines[loc] = node.start_mark.line + 1
        if id(node) in self.active:
            self.source.problems.append(self.source.problem(loc, "recursive alias"))
            return None
        if id(node) in self.built:
            self.expansions += 1
            if self.expansions > MAX_ALIAS_EXPANSIONS:
                raise _TooManyExpansions
        else:
            self.built.add(id(node))
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, loc)
            if isinstance(node, yaml.SequenceNode):
                return [self.node(item, (*loc, i)) for i, item in enumerate(node.value)]
            return self.scalar(node, loc)
        finally:
            self.active.discard(id(node))

    def mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[str, Any]:
        assert self.loader is not None
        # Keys merged in with `<<:` may be overridden; only explicit keys may not repeat.
        explicit = {id(k) for k, _ in node.value if k.tag != _MERGE_TAG}
        self.loader.flatten_mapping(node)
        result: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                line = key_node.start_mark.line + 1
                problem = Problem(self.source.file, line, "mapping keys must be plain names")
                self.source.problems.append(problem)
                continue
            # Config keys are names: keep their text rather than YAML's `yes`/`1.5` typing.
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if id(key_node) in explicit:
                if key in first_line:
                    message = f"duplicate key '{key}' (first at line {first_line[key]})"
                    self.source.problems.append(Problem(self.source.file, line, message))
                    continue
                first_line[key] = line
            self.source.key_lines[(*loc, key)] = line
            result[key] = self.node(value_node, (*loc, key))
        return result

    def scalar(self, node: yaml.Node, loc: Loc) -> Any:
        assert self.loader is not None
        if node.tag != _STR_TAG or "$" not in node.value:
            return self.loader.construct_object(node, deep=True)
        text: str = node.value
        whole = _ENV_WHOLE.fullmatch(text)
        if whole and self.lookup(whole.group(1), whole.group(2)) is not None:
            self.source.env_vars[loc] = whole.group(1)
        result = _ENV_TOKEN.sub(lambda m: self.substitute(m, loc), text)
        # `port: ${PORT:-8080}`: numeric settings may read a substituted text as a number.
        return EnvText(result) if _ENV_WHOLE.search(text) else result

    def lookup(self, name: str, default: str | None) -> str | None:
        """The variable's value, or None when the default (if any) applies.

        As in the shell, `${VAR:-default}` also takes the default when VAR is empty.
        """
        value = self.environ.get(name)
        if value is None or (value == "" and default is not None):
            return None
        return value

    def substitute(self, match: re.Match[str], loc: Loc) -> str:
        token = match.group(0)
        if token == "$${":
            return "${"
        name, default = match.group(1), match.group(2)
        if name is None:
            message = "invalid environment reference; write ${NAME} or ${NAME:-default}"
        elif (value := self.lookup(name, default)) is not None:
            return value
        elif default is not None:
            return default
        else:
            message = f"environment variable {name} is not set"
        self.source.unresolved.add(loc)
        self.source.problems.append(self.source.problem(loc, message))
        return token

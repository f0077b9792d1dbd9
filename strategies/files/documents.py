"""Bounded reading of the YAML and JSON files a user hands to layerwise.

A file from a user may be hostile or broken in ways a parser survives only at great cost: an
861-byte YAML "billion laughs" (anchors whose aliases nest aliases) expands to billions of
values the moment anything walks it, and a 100,000-deep list overflows Python's stack. Every
cluster, platform, benchmark config, params.yaml, strategy, profile, summary and run-settings
file therefore goes through here, which refuses, with one line naming the file:

- a file larger than MAX_YAML_BYTES (hand-written configuration) or MAX_JSON_BYTES (profiles
  and run results, machine-written, grow with the model and the run), read no further;
- values nested deeper than MAX_DEPTH, aliases included (no contract nests a tenth of that);
- a YAML document whose aliases expand to more than MAX_YAML_VALUES values, counted while the
  document is composed (before anything is built), and an alias inside its own anchor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from layerwise.strategies.errors import LayerwiseError

MAX_YAML_BYTES = 1 << 20  # 1 MiB
MAX_JSON_BYTES = 64 << 20  # 64 MiB
MAX_DEPTH = 64
MAX_YAML_VALUES = 1_000_000
YAML_SUFFIXES = (".yaml", ".yml")


class _Refused(Exception):
    """A bound the composer hit; the caller turns it into its own one-line error."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts, while composing, the values the document stands for
    (an alias counts as every value of its anchor) and how deep they nest."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._values = 0  # values composed so far, aliases expanded
        self._depth = 0  # nesting of the node being composed
        self._deepest = 0  # deepest nesting reached, aliases expanded
        self._anchored: dict[int, tuple[int, int]] = {}  # id(node) -> (values, height)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if id(node) not in self._anchored:
                raise _Refused(f"an alias at line {mark.line + 1} refers to the value that "
                               "contains it")
            values, height = self._anchored[id(node)]
            self._count(values, self._depth + height, mark)
            return node
        event = self.peek_event()
        self._depth += 1
        self._count(1, self._depth, event.start_mark)
        before, outer_deepest = self._values, self._deepest
        self._deepest = self._depth
        node = super().compose_node(parent, index)
        if event.anchor is not None:
            self._anchored[id(node)] = (self._values - before + 1,
                                        self._deepest - self._depth + 1)
        self._deepest = max(outer_deepest, self._deepest)
        self._depth -= 1
        return node

    def construct_yaml_int(self, node: Any) -> int:
        """An integer within Python's 4,300-digit limit for text, else refused in one line."""
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise _Refused(f"the number at line {node.start_mark.line + 1} has more digits "
                           "than layerwise reads (4,300)") from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """A mapping whose keys are each given once: YAML keeps the last of two silently, so
        `nodes: 4` then `nodes: 1` further down would price a cluster nobody meant (a `<<`
        merge may still be overridden, as YAML intends)."""
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, str | int | float | bool) and key in seen:
                    raise _Refused(f"key '{key}' is given twice (lines {seen[key]} and "
                                   f"{line}); keep one")
                if isinstance(key, str | int | float | bool):
                    seen[key] = line
        return super().construct_mapping(node, deep)

    def _count(self, values: int, depth: int, mark: yaml.Mark) -> None:
        self._values += values
        self._deepest = max(self._deepest, depth)
        if depth > MAX_DEPTH:
            raise _Refused(f"values nest more than {MAX_DEPTH} levels deep (line "
                           f"{mark.line + 1}), more than layerwise reads")
        if self._values > MAX_YAML_VALUES:
            raise _Refused(f"its aliases expand to more than {MAX_YAML_VALUES:,} values (line "
                           f"{mark.line + 1}); write the values out instead of repeating "
                           "anchors")


# Dates stay text: no field layerwise reads is a date, and PyYAML's safe loader turns a
# date-shaped value such as 2001-13-45 into a ValueError inside the loader.
_BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers
            if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _line(what: str, problem: str, fix: str) -> str:
    return f"{what} {problem}" + (f"; {fix}" if fix else "")


def read_text(path: str | Path, what: str, max_bytes: int,
              error: type[LayerwiseError] = LayerwiseError, fix: str = "") -> str:
    """The UTF-8 text of `path`, read no further than `max_bytes`; `what` names the file in
    the one-line `error` (e.g. "cluster file x.yaml")."""
    source = Path(path)
    if source.is_dir():
        raise error(_line(what, "is a directory, not a file", fix))
    if not source.exists():
        raise error(_line(what, "does not exist", fix))
    if not source.is_file():  # a FIFO without a writer would wait for one for good
        raise error(_line(what, "is not a regular file (a pipe, a device or a socket)", fix))
    try:
        with open(source, "rb") as stream:
            data = stream.read(max_bytes + 1)
    except OSError as problem:
        raise error(_line(what, f"cannot be read: {problem.strerror or problem}", fix)) from None
    if len(data) > max_bytes:
        raise error(_line(what, f"is larger than {max_bytes >> 20} MiB, the most layerwise "
                                "reads of such a file", fix))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as problem:
        raise error(_line(what, f"is not UTF-8 text ({problem.reason} at byte {problem.start})",
                          fix)) from None


def parse_yaml(text: str, what: str, error: type[LayerwiseError] = LayerwiseError,
               fix: str = "") -> Any:
    """One YAML document (safe tags only) within the bounds above, or a one-line `error`."""
    if len(text.encode("utf-8")) > MAX_YAML_BYTES:
        raise error(_line(what, f"is larger than {MAX_YAML_BYTES >> 20} MiB, the most "
                                "layerwise reads of YAML", fix))
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except _Refused as refused:
        raise error(_line(what, f"is refused: {refused}", fix)) from None
    except yaml.YAMLError as problem:
        mark = getattr(problem, "problem_mark", None) or getattr(problem, "context_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        reason = getattr(problem, "problem", None) or "not a YAML document"
        raise error(_line(what, f"is not valid YAML{where}: {' '.join(reason.split())}",
                          fix)) from None
    finally:
        loader.dispose()


def parse_json(text: str, what: str, error: type[LayerwiseError] = LayerwiseError,
               fix: str = "") -> Any:
    """A JSON document nested no deeper than MAX_DEPTH, or a one-line `error`."""
    deep = _line(what, f"is refused: values nest more than {MAX_DEPTH} levels deep, more than "
                       "layerwise reads", fix)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as problem:
        raise error(_line(what, f"is not valid JSON (line {problem.lineno}, column "
                                f"{problem.colno}: {problem.msg})", fix)) from None
    except RecursionError:
        raise error(deep) from None
    except ValueError:  # an integer of more than 4,300 digits
        raise error(_line(what, "is refused: a number has more digits than layerwise reads "
                                "(4,300)", fix)) from None
    if _depth(document) > MAX_DEPTH:
        raise error(deep)
    return document


def _depth(document: Any) -> int:
    """How deep lists and mappings nest in a parsed JSON document (a walk, not a recursion)."""
    deepest, pending = 0, [(document, 1)]
    while pending:
        value, depth = pending.pop()
        deepest = max(deepest, depth)
        if isinstance(value, dict):
            pending.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            pending.extend((child, depth + 1) for child in value)
    return deepest


def read_yaml(path: str | Path, what: str, error: type[LayerwiseError] = LayerwiseError,
              fix: str = "") -> Any:
    """The parsed YAML file at `path`, within the bounds above."""
    return parse_yaml(read_text(path, what, MAX_YAML_BYTES, error, fix), what, error, fix)


def read_json(path: str | Path, what: str, error: type[LayerwiseError] = LayerwiseError,
              fix: str = "") -> Any:
    """The parsed JSON file at `path`, within the bounds above."""
    return parse_json(read_text(path, what, MAX_JSON_BYTES, error, fix), what, error, fix)


def read_document(path: str | Path, what: str, error: type[LayerwiseError] = LayerwiseError,
                  fix: str = "") -> Any:
    """A .yaml/.yml file as YAML, any other as JSON."""
    if Path(path).suffix.lower() in YAML_SUFFIXES:
        return read_yaml(path, what, error, fix)
    return read_json(path, what, error, fix)

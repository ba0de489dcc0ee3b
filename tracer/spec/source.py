"""Safe YAML loading that remembers where every key and item came from.

We compose the YAML node graph with PyYAML's safe composer (never its constructor for anything
but plain scalars), then walk it ourselves. That walk is where the file format's safety lives:
only the standard YAML tags are accepted (``!!python/...`` is refused), duplicate keys are
errors, and the number of nodes produced is capped so alias bombs cannot expand.

Most files take a faster road to the same values: one pass over libyaml's events, which gives
up at anything the careful walk would refuse or that it alone handles (an alias, a tag, a
duplicate key, a control character, too deep, too many values), leaving the text to it. That
pass records no positions: they are found when first asked for, by a second walk over the same
events that records positions only; a file that checks clean never needs them.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import Diagnostic, Position, TracerError

MAX_BYTES = 4 * 1024 * 1024
MAX_NODES = 100_000  # values (scalars and collections) after alias expansion; composing costs ~10 us each
MAX_DEPTH = 64

_SCALAR_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}
_NUMBER_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
MAX_NUMBER_TEXT = 400  # far longer than any int up to 2**62 or any float torch can hold
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_LIBYAML = hasattr(yaml, "CSafeLoader")
_BaseLoader = yaml.CSafeLoader if _LIBYAML else yaml.SafeLoader
_RESOLVER = yaml.resolver.Resolver()
MAX_CACHED_SCALAR = 64
# Text reaches terminals, diagnostics, tables and SVG: refuse control characters (YAML escapes such
# as "\e" or "\x01" make them), bidi overrides, and line breaks other than newline. Tabs and
# newlines stay allowed in values (notes and descriptions span lines), not in keys or one-line fields.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ufeff]")
_ONE_LINE = re.compile(r"[\t\n]")
_ONE_LINE_FIELDS = frozenset({"name", "group", "id", "use", "op", "input"})
# PyYAML counts these as line breaks, editors and `grep -n` do not: they would shift every
# reported line number after them, so they are refused where they stand.
_ODD_BREAKS = re.compile(r"\r(?!\n)|[\x85\u2028\u2029]")
_ODD_BREAK_CHARS = "\r\x85\u2028\u2029"  # every character the pattern starts at
_SURROGATE = re.compile("[\ud800-\udfff]")


def control_problem(text: str, one_line: bool = False) -> str | None:
    """What makes ``text`` unfit to reach a terminal, a table or a diagram (None: nothing): the one
    rule for every text read from a file, a pipeline's or a checkpoint's ``config.json``."""
    bad = _CONTROL.search(text) or (_ONE_LINE.search(text) if one_line else None)
    if not bad:
        return None
    char = bad.group()
    fix = "write it on one line without tabs" if char in "\t\n" else "remove it (names, ids, notes and groups are plain text)"
    return f"the text holds the control character U+{ord(char):04X} ({char!r}); {fix}"


def one_line_field(name: str) -> bool:
    """Whether a field's text must be one line (names, ids, groups, ops)."""
    return name in _ONE_LINE_FIELDS


class _Loader(_BaseLoader):  # type: ignore[misc,valid-type]
    """The safe loader with scalar tag resolution memoized: resolving runs several regexes in
    Python per scalar, and a pipeline repeats the same short scalars (B, T, -1) hundreds of times."""

    def resolve(self, kind, value, implicit):
        if kind is yaml.ScalarNode and len(value) <= MAX_CACHED_SCALAR:
            return _resolve_scalar(value, implicit)
        return super().resolve(kind, value, implicit)


@lru_cache(maxsize=4096)
def _resolve_scalar(value: str, implicit: tuple) -> str:
    return _RESOLVER.resolve(yaml.ScalarNode, value, implicit)


_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def _construct(tag: str, text: str) -> Any:
    """The Python value of one scalar (str, int, float, bool or None: only those tags get here)."""
    return _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, yaml.ScalarNode(tag, text))


_construct_cached = lru_cache(maxsize=4096)(_construct)


def _scalar(tag: str, text: str) -> Any:
    """Short scalars (names, dims, ids) repeat all over a file: construct each once (the values are immutable)."""
    return _construct_cached(tag, text) if len(text) <= MAX_CACHED_SCALAR else _construct(tag, text)


class SourceMap:
    """Positions of the keys and values of one loaded document, addressed by path; given ``text``,
    they are found when first asked for (``values``, ``keys``, ``locate``)."""

    def __init__(self, file: str, values: dict | None = None, keys: dict | None = None, text: str | None = None):
        self.file = file
        self._text = text
        self._values = values if values is not None or text is not None else {}
        self._keys = keys if keys is not None or text is not None else {}

    @property
    def values(self) -> dict[tuple, Position]:
        if self._values is None:
            self._find_positions()
        return self._values

    @property
    def keys(self) -> dict[tuple, Position]:
        if self._keys is None:
            self._find_positions()
        return self._keys

    def _find_positions(self) -> None:
        """The text was read in one pass already (``_plain_values``): walk its events again, recording."""
        self._values, self._keys = {}, {}
        _record_positions(self._text, self)

    def locate(self, path: tuple, prefer_key: bool = False) -> Position | None:
        """The position of ``path``, or of its nearest ancestor that has one."""
        path = tuple(path)
        while True:
            first, second = (self.keys, self.values) if prefer_key else (self.values, self.keys)
            if path in first:
                return first[path]
            if path in second:
                return second[path]
            if not path:
                return None
            path = path[:-1]

    def error(
        self, path: tuple, code: str, message: str, step: str | None = None, prefer_key: bool = False, severity: str = "error"
    ) -> Diagnostic:
        return Diagnostic(self.file, self.locate(path, prefer_key), code, message, step, severity)


def read_document(path: str | Path) -> tuple[Any, SourceMap]:
    """Read and safely parse one pipeline file; every failure is a located ``TracerError``."""
    name = str(path)
    text = _read_text(Path(path), name)
    return parse_document(text, name)


def parse_document(text: str, name: str = "<string>") -> tuple[Any, SourceMap]:
    source = SourceMap(name)
    if len(text) > MAX_BYTES:
        raise TracerError(
            Diagnostic(name, None, "file-too-large", f"the text is {len(text)} characters; pipeline files are limited to {MAX_BYTES} bytes")
        )
    if not text.strip():
        raise TracerError(Diagnostic(name, Position(1, 1), "empty-file", "the file is empty; a pipeline needs at least 'name' and 'steps'"))
    _check_line_breaks(text, name)
    _check_surrogates(text, name)
    data = _plain_values(text)
    if data is not _CAREFUL:
        return data, SourceMap(name, text=text)
    return _Walker(source).convert(_composed(text, name), (), 0), source


def _composed(text: str, name: str) -> yaml.Node:
    """The one document of ``text`` as a node graph; every problem a located ``TracerError``."""
    _check_depth(text, name)
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = Position(mark.line + 1, mark.column + 1) if mark else None
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise TracerError(Diagnostic(name, pos, "yaml-syntax", f"invalid YAML: {problem}")) from None
    except yaml.reader.ReaderError as exc:  # a control character: str(exc) spans lines, so say it ourselves
        raise TracerError(
            Diagnostic(
                name,
                _reader_position(text, exc.position),
                "yaml-syntax",
                f"invalid YAML: unacceptable character #x{exc.character:04x}: {exc.reason}",
            )
        ) from None
    except yaml.YAMLError as exc:
        message = " ".join(str(exc).split())
        raise TracerError(Diagnostic(name, Position(1, 1), "yaml-syntax", f"invalid YAML: {message}")) from None
    except RecursionError:
        raise TracerError(Diagnostic(name, Position(1, 1), "yaml-too-deep", "the document is nested too deeply")) from None
    nodes = [n for n in nodes if n is not None]
    if not nodes:
        raise TracerError(Diagnostic(name, Position(1, 1), "empty-file", "the file holds no YAML document"))
    if len(nodes) > 1:
        raise TracerError(
            Diagnostic(name, _pos(nodes[1]), "yaml-multi-doc", "expected one YAML document, found several (remove the '---' separators)")
        )
    return nodes[0]


_CAREFUL = object()  # what _plain_values returns for a text that the careful walk must read
_MAP_TAGS = (None, "!", _MAP_TAG)  # an implicit tag ("!": non-specific) resolves to the standard one
_SEQ_TAGS = (None, "!", _SEQ_TAG)


class _Careful(Exception):
    """Raised inside the fast reading: leave this text to the careful walk."""


def _plain_values(text: str) -> Any:
    """The values of a document that holds plain data only, read in one pass over libyaml's events
    (about half the careful walk's time); ``_CAREFUL`` for anything else: an alias, a tag, a
    duplicate or odd key, a control character or too long a number, too deep or too many values,
    several documents or none, invalid YAML. The careful walk reads those and says what is wrong
    where, so that both readings agree on every text they both accept (values and positions:
    ``_record_positions``)."""
    loader = _Loader(text)
    try:
        events = loader.get_event
        if not isinstance(events(), yaml.StreamStartEvent) or not isinstance(events(), yaml.DocumentStartEvent):
            return _CAREFUL
        data = _EventReader(loader).value(events(), 0, one_line=False)
        if data is None or not isinstance(events(), yaml.DocumentEndEvent) or not isinstance(events(), yaml.StreamEndEvent):
            return _CAREFUL
        return data
    except (_Careful, yaml.YAMLError, RecursionError):
        return _CAREFUL
    finally:
        loader.dispose()


class _EventReader:
    """Values from an event stream: what ``_Walker`` makes of the same document, refusing the same
    things (by giving up, see ``_plain_values``)."""

    def __init__(self, loader: Any):
        self.loader, self.next_event, self.count = loader, loader.get_event, 0

    def value(self, event: yaml.Event, depth: int, one_line: bool) -> Any:
        self.count += 1
        if self.count > MAX_NODES or depth > MAX_DEPTH:
            raise _Careful
        kind = type(event)
        if kind is yaml.ScalarEvent:
            return _plain_scalar(self.loader, event, one_line)
        if kind is yaml.MappingStartEvent and event.tag in _MAP_TAGS:
            return self.mapping(depth)
        if kind is yaml.SequenceStartEvent and event.tag in _SEQ_TAGS:
            items, event, next_event = [], self.next_event(), self.next_event
            while type(event) is not yaml.SequenceEndEvent:
                items.append(self.value(event, depth + 1, one_line=False))
                event = next_event()
            return items
        raise _Careful  # an alias, or a collection with a tag of its own

    def mapping(self, depth: int) -> dict:
        result: dict = {}
        next_event, loader = self.next_event, self.loader
        event = next_event()
        while type(event) is not yaml.MappingEndEvent:
            if type(event) is not yaml.ScalarEvent:
                raise _Careful
            key = _plain_scalar(loader, event, True)
            if not isinstance(key, (str, int)) or isinstance(key, bool) or key in result:
                raise _Careful
            result[key] = self.value(next_event(), depth + 1, one_line=key in _ONE_LINE_FIELDS)
            event = next_event()
        return result


_REFUSED = object()  # a scalar the fast reading leaves to the careful walk
_SCALARS: dict[tuple, Any] = {}  # (text, tag, implicit, one line) -> its value or _REFUSED
MAX_SCALARS = 8192


def _plain_scalar(loader: Any, event: yaml.ScalarEvent, one_line: bool) -> Any:
    """One scalar's value as the careful walk makes it; raises ``_Careful`` where it would refuse
    it. Kept per (text, tag, implicit, one line), which is all it depends on: a file repeats the
    same short scalars (B, T, -1, ids) hundreds of times."""
    key = (event.value, event.tag, event.implicit, one_line)
    value = _SCALARS.get(key, _SCALARS)
    if value is _SCALARS:
        value = _read_scalar(loader, event, one_line)
        if len(event.value) <= MAX_CACHED_SCALAR:
            if len(_SCALARS) >= MAX_SCALARS:
                _SCALARS.clear()
            _SCALARS[key] = value
    if value is _REFUSED:
        raise _Careful
    return value


def _read_scalar(loader: Any, event: yaml.ScalarEvent, one_line: bool) -> Any:
    tag = event.tag
    if tag is None or tag == "!":
        tag = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
    if tag not in _SCALAR_TAGS or (tag in _NUMBER_TAGS and len(event.value) > MAX_NUMBER_TEXT):
        return _REFUSED
    try:
        value = _scalar(tag, event.value)
    except (yaml.YAMLError, ValueError, OverflowError, LookupError, TypeError):
        return _REFUSED
    if isinstance(value, str) and control_problem(value, one_line):
        return _REFUSED
    return value


def _record_positions(text: str, source: SourceMap) -> None:
    """The positions of every value and key of a text ``_plain_values`` read, into ``source``:
    the same ones the careful walk records (the first event of each value, each key's scalar)."""
    loader = _Loader(text)
    try:
        next_event = loader.get_event
        next_event(), next_event()  # the stream's and the document's start
        _record(loader, next_event(), (), source._values, source._keys)
    finally:
        loader.dispose()


def _record(loader: Any, event: yaml.Event, path: tuple, values: dict, keys: dict) -> None:
    values.setdefault(path, _mark(event))
    next_event = loader.get_event
    if type(event) is yaml.MappingStartEvent:
        event = next_event()
        while type(event) is not yaml.MappingEndEvent:
            key = path + (_plain_scalar(loader, event, True),)
            keys[key] = _mark(event)
            _record(loader, next_event(), key, values, keys)
            event = next_event()
    elif type(event) is yaml.SequenceStartEvent:
        event, i = next_event(), 0
        while type(event) is not yaml.SequenceEndEvent:
            _record(loader, event, path + (i,), values, keys)
            event, i = next_event(), i + 1


def _mark(event: yaml.Event) -> Position:
    return Position(event.start_mark.line + 1, event.start_mark.column + 1)


def _check_line_breaks(text: str, name: str) -> None:
    if not any(char in text for char in _ODD_BREAK_CHARS):  # a search per character is far quicker than the pattern's
        return
    odd = _ODD_BREAKS.search(text)
    if odd:
        where = _position_at(text, odd.start())
        what = "a lone carriage return" if odd.group() == "\r" else f"the line separator U+{ord(odd.group()):04X}"
        raise TracerError(
            Diagnostic(name, where, "yaml-syntax", f"{what} is not allowed (it would shift line numbers); end lines with a newline")
        )


def _check_surrogates(text: str, name: str) -> None:
    """A lone surrogate (U+D800..U+DFFF) is no character: UTF-8 cannot hold it, so no file can
    bring one, but a ``str`` given to ``tracer.loads`` can (a byte Python failed to decode)."""
    try:
        text.encode("utf-8")  # UTF-8 holds every character but a lone surrogate: ~20x quicker than the pattern
        return
    except UnicodeEncodeError:
        pass
    lone = _SURROGATE.search(text)
    if lone:
        raise TracerError(
            Diagnostic(
                name,
                _position_at(text, lone.start()),
                "file-binary",
                f"the text holds the lone surrogate U+{ord(lone.group()):04X}, which is not a character (nor UTF-8); remove it",
            )
        )


def _reader_position(text: str, offset: int) -> Position:
    """Line and column of a reader error's offset (libyaml counts UTF-8 bytes, pure PyYAML characters)."""
    before = text.encode("utf-8", "surrogatepass")[:offset].decode("utf-8", "ignore") if _LIBYAML else text[:offset]
    return _position_at(before, len(before))


def _position_at(text: str, offset: int) -> Position:
    """Line and column (from 1, in characters) of ``text[offset]``."""
    before = text[:offset]
    return Position(before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1)


def _check_depth(text: str, name: str) -> None:
    """Refuse deep nesting from the event stream, before composing: the C composer recurses once
    per level and overflows the C stack (a segfault, not a RecursionError) near 10**5 levels, and
    libyaml is quadratic on deep flow nesting. Streaming events stops at the first level too many,
    and at the first value too many (composing a 4 MB list of numbers takes seconds)."""
    depth = count = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            count += 1
            if count > MAX_NODES:
                mark = event.start_mark
                raise TracerError(
                    Diagnostic(
                        name, Position(mark.line + 1, mark.column + 1), "yaml-too-large", f"the document holds more than {MAX_NODES} values"
                    )
                )
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH + 1:
                    mark = event.start_mark
                    raise TracerError(
                        Diagnostic(
                            name,
                            Position(mark.line + 1, mark.column + 1),
                            "yaml-too-deep",
                            f"the document is nested more than {MAX_DEPTH} levels deep",
                        )
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):  # libyaml >= 0.2.5 refuses 1,000 levels itself: deeper than ours
            mark = getattr(exc, "problem_mark", None)
            where = Position(mark.line + 1, mark.column + 1) if mark else Position(1, 1)
            raise TracerError(
                Diagnostic(name, where, "yaml-too-deep", f"the document is nested more than {MAX_DEPTH} levels deep")
            ) from None
        return  # composing stops at the same place and reports it with its position


_READS: ContextVar[list[tuple[str, bytes]] | None] = ContextVar("reads", default=None)


@contextlib.contextmanager
def recording_reads() -> Iterator[list[tuple[str, bytes]]]:
    """Every pipeline file read inside the block, as (the path it was opened by, its bytes): the
    file and its blocks, what a result made from them depends on (``tracer check``'s cache)."""
    reads: list[tuple[str, bytes]] = []
    token = _READS.set(reads)
    try:
        yield reads
    finally:
        _READS.reset(token)


def _read_text(path: Path, name: str) -> str:
    data = _read_bounded(path, name)
    reads = _READS.get()
    if reads is not None:
        reads.append((str(path), data))
    if b"\x00" in data:
        raise TracerError(Diagnostic(name, Position(1, 1), "file-binary", "the file is binary, not YAML text"))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TracerError(Diagnostic(name, Position(line, 1), "file-binary", "the file is not UTF-8 text")) from None


def _read_bounded(path: Path, name: str) -> bytes:
    """The file's bytes, checking its type and size on the open descriptor before reading: a
    symlink to /dev/zero, a FIFO or a 10 GB file is refused without reading it, and at most
    MAX_BYTES + 1 bytes are ever read (a /proc file reports size 0)."""

    def fail(code: str, message: str):
        raise TracerError(Diagnostic(name, None, code, message))

    fd, info = open_regular(path, name, "a pipeline is a YAML text file")
    if info.st_size > MAX_BYTES:
        os.close(fd)
        fail("file-too-large", f"the file is {info.st_size} bytes; pipeline files are limited to {MAX_BYTES} bytes")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(MAX_BYTES + 1)
        except OSError as exc:
            fail("file-unreadable", f"cannot read the file: {exc.strerror or exc}")
    if len(data) > MAX_BYTES:
        fail("file-too-large", f"the file holds more than {MAX_BYTES} bytes; pipeline files are limited to {MAX_BYTES} bytes")
    return data


def open_regular(
    path: Path, name: str, expected: str, codes: tuple[str, str] = ("file-missing", "file-unreadable")
) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its stat, checked on the descriptor to be a regular
    file (O_NONBLOCK keeps opening a FIFO from waiting for a writer); ``expected`` says what the
    file should be, ``codes`` are the error codes for a missing and for an unusable file."""
    missing, unusable = codes

    def fail(code: str, message: str):
        raise TracerError(Diagnostic(name, None, code, message))

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        fail(missing, "no such file")
    except OSError as exc:
        fail(unusable, f"cannot read the file: {exc.strerror or exc}")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else _file_kind(info.st_mode)
        fail(unusable, f"is {kind}, not a regular file; {expected}")
    return fd, info


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def _pos(node: yaml.Node) -> Position:
    return Position(node.start_mark.line + 1, node.start_mark.column + 1)


class _Walker:
    """Turns a composed node graph into plain dicts, lists and scalars, recording positions."""

    def __init__(self, source: SourceMap):
        self.source = source
        self.count = 0

    def convert(self, node: yaml.Node, path: tuple, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            self._fail(node, "yaml-too-large", f"the document expands to more than {MAX_NODES} values (an alias bomb?)")
        if depth > MAX_DEPTH:
            self._fail(node, "yaml-too-deep", f"the document is nested more than {MAX_DEPTH} levels deep")
        self.source.values.setdefault(path, _pos(node))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            self._check_tag(node, _SEQ_TAG)
            return [self.convert(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
        self._check_tag(node, *_SCALAR_TAGS)
        self._check_number(node)
        try:
            value = _scalar(node.tag, node.value)
        except (yaml.YAMLError, ValueError, OverflowError, LookupError, TypeError) as exc:
            self._fail(node, "yaml-value", f"cannot read the value '{node.value[:40]}': {exc}")
        if isinstance(value, str):
            self._check_text(node, value, one_line=bool(path) and path[-1] in _ONE_LINE_FIELDS)
        return value

    def _check_text(self, node: yaml.Node, text: str, one_line: bool) -> None:
        problem = control_problem(text, one_line)
        if problem:
            self._fail(node, "control-character", problem)

    def _mapping(self, node: yaml.MappingNode, path: tuple, depth: int) -> dict:
        self._check_tag(node, _MAP_TAG)
        result: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                self._fail(key_node, "yaml-merge-key", "YAML merge keys ('<<') are not supported; write the keys out")
            if not isinstance(key_node, yaml.ScalarNode):
                self._fail(key_node, "yaml-key", "mapping keys must be plain names")
            self._check_number(key_node)
            try:
                key = _scalar(key_node.tag, key_node.value) if key_node.tag in _SCALAR_TAGS else None
            except (yaml.YAMLError, ValueError, OverflowError, LookupError, TypeError) as exc:  # e.g. a key tagged '!!int name'
                self._fail(key_node, "yaml-key", f"cannot read the key '{key_node.value[:40]}': {exc}")
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                self._fail(key_node, "yaml-key", f"mapping keys must be names, found {key!r}")
            if isinstance(key, str):
                self._check_text(key_node, key, one_line=True)
            if key in result:
                first = self.source.keys[path + (key,)]
                self._fail(key_node, "duplicate-key", f"duplicate key '{key}' (first defined at line {first.line})")
            self.source.keys[path + (key,)] = _pos(key_node)
            result[key] = self.convert(value_node, path + (key,), depth + 1)
        return result

    def _check_number(self, node: yaml.Node) -> None:
        """Refuse absurdly long numbers before converting them: YAML 1.1 base-60 ints ('59:59:...') cost quadratic time."""
        if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_TEXT:
            self._fail(
                node,
                "yaml-value",
                f"the number '{node.value[:20]}...' is {len(node.value)} characters long (the limit is {MAX_NUMBER_TEXT})",
            )

    def _check_tag(self, node: yaml.Node, *allowed: str) -> None:
        if node.tag not in allowed:
            self._fail(node, "yaml-tag", f"the tag '{node.tag}' is not allowed: pipeline files hold plain data only")

    def _fail(self, node: yaml.Node, code: str, message: str) -> None:
        raise TracerError(Diagnostic(self.source.file, _pos(node), code, message))

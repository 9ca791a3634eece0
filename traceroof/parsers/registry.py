"""The format registry: the one door every input goes through.

Each input format is one module that declares, as data, an :class:`InputFormat`: its name,
how its files are recognised from their content (:attr:`InputFormat.sniff`), its reader,
how a directory of it is read (one unit, or a folder whose files are each an input), and the
per-format facts analysis needs (:class:`FormatFacts`). ``traceroof.io`` dispatches through
:func:`detect` and :func:`unit_format`; analysis asks :func:`facts_for` (``meta.format``)
instead of testing format names.

Built-in formats (in this order: it breaks ties and orders messages): the columnar cache
directory (:mod:`.cache_dir`), jax's trace-viewer JSON exports (:mod:`.jax_trace_json`:
``perfetto_trace.json.gz``, recognised to name the ``.xplane.pb`` to pass instead), Kineto
JSON (:mod:`.kineto_format`), XPlane (:mod:`.xplane`), Perfetto protobuf (:mod:`.perfetto`,
recognised to be rejected clearly) and tar archives of Kineto traces (:mod:`.tar`). Their
modules are imported on first use of the registry; a format's heavy decoder is imported only
when one of its files is read.

A new format is one module that builds an :class:`InputFormat` plus one entry: a name in
:data:`BUILTIN` (for formats shipped with traceroof) or a :func:`register` call (anywhere
else, e.g. a test). See docs/extending.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ..errors import TraceFormatError
from .gzip_stream import GZIP_MAGIC, GzipInflater
from .text_head import (
    encoding_problem,
    only_ws_problem,
    other_encoding,
    skip_to_text,
)

if TYPE_CHECKING:
    from ..progress import Progress
    from ..trace import Trace

#: how sure a sniff is (higher wins; a tie goes to the format registered first): a magic
#: number at a fixed offset, checked (a tar header's ``ustar`` and checksum: whatever the bytes
#: before it hold, e.g. a member name starting with ``{``, they are not another format's), the
#: file's own structure, a file-name suffix, a weak content signature
MAGIC, CONTENT, SUFFIX, HINT = 4, 3, 2, 1
#: bytes read from the start of a file (and of its gzip stream) to sniff it
HEAD_BYTES = 4096

#: the modules (in :mod:`traceroof.parsers`) of the built-in formats, each with a ``FORMAT``
#: (``jax_trace_json`` before ``kineto_format``: both are JSON objects, and a sniff tie goes
#: to the format registered first)
BUILTIN = ("cache_dir", "jax_trace_json", "kineto_format", "xplane", "perfetto", "tar")


@dataclass(frozen=True)
class FormatFacts:
    """What analysis needs to know of a format.

    Attributes:
        chip_from_properties: the device planes carry capability stats but no name (XPlane
            GPU planes), so the chip may be identified by its properties.
        default_group_by: the ranking's default grouping: ``op`` (framework op, else kernel
            name) or ``kernel`` (e.g. the HLO instruction, when ``op`` is only an opcode).
        shapes_hint: the advice printed when no shapes were recorded and none of the device
            time was costed from shapes; None when the format has no such switch.
    """

    chip_from_properties: bool = False
    default_group_by: str = "op"
    shapes_hint: str | None = None


@dataclass(frozen=True)
class Head:
    """What a sniff sees of a file: its name, its first bytes and, for a gzip file, the first
    bytes of what it decompresses to.

    Attributes:
        path: the file.
        raw: its first :data:`HEAD_BYTES` bytes.
        gzip: ``raw`` starts with the gzip magic (``1f 8b``).
        data: the first :data:`HEAD_BYTES` decompressed bytes of a gzip file (``b""`` when
            none decompress; fewer when the stream is cut or corrupt), else ``raw``.
        size: the file's size in bytes, or None for a gzip file (the decompressed size is
            unknown) or a stream.
        text: :data:`HEAD_BYTES` of the content from its first byte that is neither a UTF-8
            byte-order mark nor white space (:func:`.text_head.skip_to_text`, up to
            :data:`.text_head.MAX_LEADING_WS_BYTES` of white space): what a sniff of a
            text format looks at. None (when a Head is made by hand): taken from ``data``.
        text_at: the offset of ``text`` in the (decompressed) content, bytes.
        ws_over: the content holds more leading white space than that (``text`` is empty).
    """

    path: Path
    raw: bytes
    gzip: bool
    data: bytes
    size: int | None
    text: bytes | None = None
    text_at: int = 0
    ws_over: bool = False

    def __post_init__(self) -> None:
        if self.text is None:
            text, at, over = skip_to_text(self.data, lambda n: b"", HEAD_BYTES)
            object.__setattr__(self, "text", text)
            object.__setattr__(self, "text_at", at)
            object.__setattr__(self, "ws_over", over)

    @property
    def name(self) -> str:
        """The file name (no folder)."""
        return self.path.name


def read_head(path: str | os.PathLike[str], head: bytes | None = None) -> Head:
    """The :class:`Head` of ``path``. Without ``head``: reads :data:`HEAD_BYTES` (and of a
    gzip file, inflates as many), more only past a BOM and leading white space
    (:attr:`Head.text`). With ``head`` (the file's first bytes, already read, as a caller
    that holds them or a member of an archive passes them): the head alone is sniffed, and
    ``path`` (then only a name, which need not exist) is opened only when the head holds
    nothing but white space (or, gzip, inflates to nothing but white space) and the file is
    readable; its size is then the file's, else None.

    Raises:
        OSError: without ``head``, the file cannot be opened or read.
    """
    p = Path(path)
    if head is None:
        with open(p, "rb") as fh:
            return head_of(p, fh.read(HEAD_BYTES), fh.read, _size(fh))
    h = head_of(p, head, _nothing, None)
    if h.text or h.ws_over:
        return h  # the head says what the file is: nothing more is read
    try:
        with open(p, "rb") as fh:
            fh.seek(len(head))
            return head_of(p, head, fh.read, _size(fh))
    except OSError:  # (a name only, or unreadable: the head is all there is)
        return h


def _nothing(n: int) -> bytes:
    return b""


def _size(fh: BinaryIO) -> int | None:
    """The size in bytes of the open file ``fh``, None when unknown."""
    try:
        return os.fstat(fh.fileno()).st_size
    except OSError:
        return None


def head_of(path: Path, raw: bytes, more: Callable[[int], bytes], size: int | None) -> Head:
    """The :class:`Head` of a file or stream named ``path`` whose first bytes are ``raw``
    (up to :data:`HEAD_BYTES`); ``more(n)`` reads up to ``n`` of the bytes after them
    (``b""`` at the end), called only past a BOM and white space or to inflate a gzip
    stream; ``size``: the file's size in bytes (None: unknown). Never raises on the bytes
    (a corrupt gzip stream sniffs as what inflated before the fault)."""
    if raw[:2] == GZIP_MAGIC:
        inflate = GzipInflater(more, raw).read_full
        data = inflate(HEAD_BYTES)
        text, at, over = skip_to_text(data, inflate, HEAD_BYTES)
        return Head(path, raw, True, data, None, text, at, over)
    text, at, over = skip_to_text(raw, more, HEAD_BYTES)
    return Head(path, raw, False, raw, size, text, at, over)


def _no_file(head: Head) -> int:
    return 0


@dataclass(frozen=True)
class InputFormat:
    """One input format, declared as data.

    Attributes:
        name: the format's name: what :func:`detect` returns and what its traces carry in
            ``meta.format`` (the key of :func:`facts_for`).
        read: ``read(path, progress) -> Trace`` for one of its files or unit directories;
            ``progress`` is a :class:`~traceroof.progress.Progress` or None. Raises
            :class:`~traceroof.errors.TraceFormatError` for input it cannot read.
        sniff: ``sniff(head) -> int``: how sure it is that the file of :class:`Head` ``head`` is
            of this format: :data:`CONTENT`, :data:`SUFFIX`, :data:`HINT`, or 0 (it is not).
            Cheap: no heavy import, no read beyond the head.
        unit_dir: ``unit_dir(path) -> bool``: the directory is one input of this format (a
            cache, a jax profile directory); None when no directory is.
        folder_suffixes: file-name suffixes of the files of a plain folder of traces that are
            inputs of this format (each file one rank), e.g. ``(".json", ".json.gz")``.
        dir_names: what a directory of this format holds, for messages (``"*.xplane.pb"``).
        describe: the format as named in "not a trace" messages (``"an XSpace (.xplane.pb)"``);
            None leaves it out (a directory format, a recognised but unsupported format).
        gzip_describe: the same for a gzip stream's content (``"a Kineto JSON trace"``); None
            when the format is not read from gzip files or is named by its suffix.
        facts: what analysis needs to know of its traces.
    """

    name: str
    read: Callable[[Path, Progress | None], Trace]
    sniff: Callable[[Head], int] = _no_file
    unit_dir: Callable[[Path], bool] | None = None
    folder_suffixes: tuple[str, ...] = ()
    dir_names: tuple[str, ...] = ()
    describe: str | None = None
    gzip_describe: str | None = None
    facts: FormatFacts = field(default_factory=FormatFacts)


_formats: dict[str, InputFormat] = {}
_loaded = False


def _load() -> dict[str, InputFormat]:
    """The registry, with the built-in formats loaded (once) ahead of registered ones."""
    global _loaded, _formats
    if not _loaded:
        builtin: dict[str, InputFormat] = {}
        for mod in BUILTIN:
            fmt = import_module(f"{__package__}.{mod}").FORMAT
            builtin[fmt.name] = fmt
        _formats = {**builtin, **{k: v for k, v in _formats.items() if k not in builtin}}
        _loaded = True
    return _formats


def register(fmt: InputFormat, *, replace: bool = False) -> InputFormat:
    """Add ``fmt`` to the registry (after the formats already there); returns it.

    It is this process's registry: worker processes (``read_trace(..., jobs=N)`` of several
    files) load only the built-in formats (:data:`BUILTIN`).

    Raises:
        ValueError: a format of that name is registered and ``replace`` is False.
    """
    formats = _load()
    if fmt.name in formats and not replace:
        raise ValueError(f"input format {fmt.name!r} is already registered")
    formats[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    """Remove format ``name`` from the registry (nothing happens when it is not there)."""
    _load().pop(name, None)


def formats() -> list[InputFormat]:
    """Every registered format, in registry order (built-ins first)."""
    return list(_load().values())


def get(name: str) -> InputFormat:
    """The format named ``name``.

    Raises:
        KeyError: no such format.
    """
    return _load()[name]


def facts_for(fmt: str) -> FormatFacts:
    """The facts of format ``fmt`` (``meta.format``); a format without an entry gets the defaults."""
    got = _load().get(fmt)
    return got.facts if got is not None else FormatFacts()


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def detect(path: str | os.PathLike[str], head: bytes | None = None) -> InputFormat:
    """The format of the file ``path``, sniffed from its content (and its name): the format
    whose sniff is surest; a tie goes to the one registered first.

    ``head``: the file's first bytes, when already read: then nothing more is read unless
    they are all white space and ``path`` is readable (:func:`read_head`).

    Raises:
        TraceFormatError: no format claims the file (an empty file, a gzip of something
            else, UTF-16/32 text, bytes of no known format); the message lists what was
            expected.
        OSError: without ``head``, the file cannot be opened or read.
    """
    return detect_head(read_head(path, head))


def detect_head(h: Head) -> InputFormat:
    """:func:`detect` of a :class:`Head` already read (a file's, or a stream's:
    :mod:`.piped`).

    Raises:
        TraceFormatError: as :func:`detect`; text in UTF-16/32 (:func:`.text_head.other_encoding`,
            whose word goes before any sniff's but a :data:`MAGIC` one), and more leading white space than
            :data:`~.text_head.MAX_LEADING_WS_BYTES`, are said as such.
    """
    where = "gzip stream, byte 0" if h.gzip else "byte 0"
    best, score = None, 0
    for fmt in _load().values():
        s = fmt.sniff(h)
        if s > score:
            best, score = fmt, s
    if best is not None and score >= MAGIC:
        return best  # (a checked magic number: not a text, in whatever encoding)
    encoding = other_encoding(h.data)  # before any other sniff's word: a UTF-16 text's head may look like another format's
    if encoding is not None:
        raise TraceFormatError(h.path, where, encoding_problem(encoding))
    if best is not None:
        return best
    if h.ws_over:
        raise TraceFormatError(h.path, f"byte {h.text_at}", only_ws_problem())
    if h.gzip:
        kinds = [f.gzip_describe for f in _formats.values() if f.gzip_describe]
        raise TraceFormatError(h.path, "byte 0", "not a trace: expected gzip of " + " or of ".join(kinds))
    if not h.raw:
        raise TraceFormatError(h.path, "byte 0", "a trace, found an empty file")
    if not h.text:
        raise TraceFormatError(h.path, "byte 0", "a trace, found only white space")
    raise TraceFormatError(h.path, "byte 0",
                           "not a trace: expected " + _either([f.describe for f in _formats.values() if f.describe]))


def unit_format(path: Path) -> InputFormat | None:
    """The format of which the directory ``path`` is one input (a cache, a jax profile
    directory), or None (a plain folder: its files are the inputs)."""
    for fmt in _load().values():
        if fmt.unit_dir is not None and fmt.unit_dir(path):
            return fmt
    return None


def folder_suffixes() -> tuple[str, ...]:
    """The file-name suffixes of the files a plain folder of traces is expanded to."""
    return tuple(s for f in _load().values() for s in f.folder_suffixes)


def no_trace_in_dir() -> str:
    """What a directory holding no input was expected to hold (``"*.json, … or *.xplane.pb"``)."""
    return _either([n for f in _load().values() for n in f.dir_names])


__all__ = ["InputFormat", "FormatFacts", "Head", "MAGIC", "CONTENT", "SUFFIX", "HINT", "BUILTIN", "register",
           "unregister", "formats", "get", "facts_for", "detect", "unit_format", "folder_suffixes",
           "no_trace_in_dir", "read_head", "head_of", "detect_head"]

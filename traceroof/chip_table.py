"""The chip table: :class:`ChipSpec`, reading ``chips.toml`` and user chip files, and finding a
chip by name (:func:`get_chip`). Detection from a trace's devices is in
:mod:`traceroof.chip_detect`; :mod:`traceroof.chips` is the public door to both.

Units: FLOP/s (int8: OP/s) for peaks, bytes for capacity, B/s (decimal) for bandwidths, ns for
the launch floor. Unknown names raise :class:`~traceroof.errors.UnknownChipError`.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .dtypes import PEAK_DTYPES, canonical_dtype
from .errors import UnknownChipError

#: Fields that hold a number and therefore need a source.
NUMERIC_FIELDS: tuple[str, ...] = (
    "peak_flops_per_s",
    "hbm_bytes",
    "hbm_bytes_per_s",
    "intra_node_bytes_per_s",
    "inter_node_bytes_per_s",
    "host_link_bytes_per_s",
    "scale_up_domain",
    "launch_overhead_ns",
)

# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True, kw_only=True)
class ChipMatch:
    """What detection compares with a trace's device description.

    Attributes:
        names: token patterns tried on the device name ("h100 pcie"; "!tok" = must be absent).
        compute_capability: (major, minor); AMD: the gfx major/minor (gfx942 -> (9, 4)).
        num_sms: SMs (NVIDIA) or CUs (AMD) of the full device.
        mem_gib: runtime-visible memory (totalGlobalMem) in GiB, compared within 6%.
        clock_mhz: max SM clock; when set, a property-only identification needs a matching clock.
        identify_by_properties: False when another part (not in the table) shares cc, SMs
            and memory, so the properties alone must not name this chip.
        board_names: exact device names of custom boards of this chip whose reported memory
            differs from the retail part (checked on cc and SM count only).
    """

    names: tuple[str, ...] = ()
    compute_capability: tuple[int, int] | None = None
    num_sms: int | None = None
    mem_gib: float | None = None
    clock_mhz: float | None = None
    identify_by_properties: bool = True
    board_names: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ChipSpec:
    """One chip (per framework device).

    Attributes:
        key: table key (``h100_sxm``).
        name: display name (``NVIDIA H100 SXM5 80GB``).
        vendor: ``nvidia`` / ``amd`` / ``google`` / ...
        aliases: other names accepted by :func:`get_chip` (CUDA/HIP/JAX device names included).
        peak_flops_per_s: dense peak per dtype key (:data:`~traceroof.dtypes.PEAK_DTYPES`), FLOP/s (int8: OP/s).
            A missing key means the chip has no such path (or none is published).
        hbm_bytes: memory capacity in bytes (vendor label, taken literally).
        hbm_bytes_per_s: memory bandwidth, B/s (decimal).
        intra_node_bytes_per_s: scale-up link (NVLink / Infinity Fabric / ICI), one direction,
            aggregate per device, B/s; ``None`` if there is none.
        inter_node_bytes_per_s: scale-out network per device, one direction, B/s; ``None`` when
            platform-dependent. The source says which NIC is assumed.
        host_link_bytes_per_s: the link between the device and its host's memory, one
            direction, B/s: PCIe Gen3/4/5/6 x16 (16e9 / 32e9 / 64e9 / 128e9, the PCI-SIG
            per-direction rates) or NVLink-C2C on Grace parts; ``None`` when not published.
            Host<->device copies are judged at it.
        scale_up_domain: devices one scale-up link (``intra_node_bytes_per_s``) joins: 8 on
            an HGX board, 72 in an NVL72 rack, the largest ICI slice on TPU; ``None`` when
            unknown (collectives then assume :data:`traceroof.roofline.GPUS_PER_NODE`).
        launch_overhead_ns: device-side floor of one kernel/op, ns (a convention, see sources).
        sources: field -> source text; ``"[id]"`` refers to :func:`references`. A per-dtype
            source may be given as ``"peak_flops_per_s.fp8"``.
        match: detection data (:class:`ChipMatch`).
        notes: caveats (scope, missing dtypes, confidence).
        origin: ``"builtin"`` or the path of the user TOML it came from.
    """

    key: str
    name: str
    vendor: str
    aliases: tuple[str, ...] = ()
    peak_flops_per_s: Mapping[str, float]
    hbm_bytes: float
    hbm_bytes_per_s: float
    intra_node_bytes_per_s: float | None = None
    inter_node_bytes_per_s: float | None = None
    host_link_bytes_per_s: float | None = None
    scale_up_domain: int | None = None
    launch_overhead_ns: float = 2000.0
    sources: Mapping[str, str] = field(default_factory=dict)
    match: ChipMatch = field(default_factory=ChipMatch)
    notes: tuple[str, ...] = ()
    origin: str = "builtin"

    def __post_init__(self) -> None:
        object.__setattr__(self, "aliases", tuple(self.aliases))
        object.__setattr__(self, "notes", tuple(self.notes))
        peaks = {}
        for k, v in dict(self.peak_flops_per_s).items():
            canon = canonical_dtype(k)
            if canon is None:
                raise ValueError(f"chip {self.key!r}: unknown dtype key {k!r} (known: {', '.join(PEAK_DTYPES)})")
            peaks[canon] = float(v)
        object.__setattr__(self, "peak_flops_per_s", MappingProxyType(peaks))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    def __hash__(self) -> int:
        return hash((self.key, self.origin))

    # ------------------------------------------------------------------ queries

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtype keys this chip has a peak for, in :data:`~traceroof.dtypes.PEAK_DTYPES` order."""
        return tuple(d for d in PEAK_DTYPES if d in self.peak_flops_per_s)

    def peak(self, dtype: str) -> float | None:
        """Dense peak for ``dtype`` in FLOP/s (int8: OP/s), or ``None`` if the chip has none.

        ``dtype`` may be any spelling :func:`canonical_dtype` knows (``"bfloat16"``,
        ``"torch.float16"``, ...). Raises ``ValueError`` for a string that is not a dtype.
        """
        canon = canonical_dtype(dtype)
        if canon is None:
            raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(PEAK_DTYPES)} (and common spellings)")
        return self.peak_flops_per_s.get(canon)

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline bends: ``peak(dtype) / hbm_bytes_per_s``.

        Raises ``ValueError`` when the chip has no peak for ``dtype`` (e.g. bf16 on V100).
        """
        p = self.peak(dtype)
        if p is None:
            raise ValueError(f"{self.name} has no {dtype} peak (it has: {', '.join(self.dtypes)})")
        return p / self.hbm_bytes_per_s

    def source(self, field_name: str, *, expand: bool = False) -> str | None:
        """The source of a field (``"hbm_bytes_per_s"``, ``"peak_flops_per_s"``,
        ``"peak_flops_per_s.bf16"``...). With ``expand``, ``[id]`` tags get their citation."""
        text = self.sources.get(field_name)
        if text is None and field_name.startswith("peak_flops_per_s."):
            text = self.sources.get("peak_flops_per_s")
        if text is None or not expand:
            return text
        refs = references()
        return re.sub(r"\[([A-Za-z0-9_.-]+)\]", lambda m: f"[{m.group(1)}: {refs.get(m.group(1), '?')}]", text)

    def missing_sources(self) -> list[str]:
        """Numeric fields (including each dtype peak) that have no source; empty when complete."""
        missing = [f for f in NUMERIC_FIELDS if f != "peak_flops_per_s" and not self.sources.get(f)]
        missing += [f"peak_flops_per_s.{d}" for d in self.dtypes if not self.source(f"peak_flops_per_s.{d}")]
        return missing

    def peak_label(self, dtype: str) -> str:
        """One line for reports: ``"peak=989.4 TFLOP/s bf16 dense (NVIDIA H100 SXM5 80GB, source: ...)"``."""
        p = self.peak(dtype)
        canon = canonical_dtype(dtype) or dtype
        if p is None:
            return f"peak=unknown ({self.name} has no {canon} peak)"
        unit = "TOP/s" if canon == "int8" else "TFLOP/s"
        return f"peak={p / 1e12:.1f} {unit} {canon} dense ({self.name}; source: {self.source('peak_flops_per_s.' + canon)})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for reports)."""
        return {
            "key": self.key,
            "name": self.name,
            "vendor": self.vendor,
            "aliases": list(self.aliases),
            "peak_flops_per_s": dict(self.peak_flops_per_s),
            "hbm_bytes": self.hbm_bytes,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "intra_node_bytes_per_s": self.intra_node_bytes_per_s,
            "inter_node_bytes_per_s": self.inter_node_bytes_per_s,
            "host_link_bytes_per_s": self.host_link_bytes_per_s,
            "scale_up_domain": self.scale_up_domain,
            "launch_overhead_ns": self.launch_overhead_ns,
            "sources": dict(self.sources),
            "notes": list(self.notes),
            "origin": self.origin,
        }


# --------------------------------------------------------------------------- loading

_CHIP_KEYS = {
    "name", "vendor", "aliases", "peak_flops_per_s", "hbm_bytes", "hbm_bytes_per_s",
    "intra_node_bytes_per_s", "inter_node_bytes_per_s", "host_link_bytes_per_s", "scale_up_domain",
    "launch_overhead_ns", "sources",
    "match", "notes",
}
_MATCH_KEYS = {"names", "compute_capability", "num_sms", "mem_gib", "clock_mhz", "identify_by_properties", "board_names"}
_REF_RE = re.compile(r"\[([A-Za-z0-9_.-]+)\]")


def _fail(origin: str, where: str, what: str) -> UnknownChipError:
    return UnknownChipError(f"chip table {origin}: {where}: {what}")


def _number(origin: str, where: str, v: Any, *, allow_zero: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _fail(origin, where, f"expected a number, got {v!r}")
    if v < 0 or (v == 0 and not allow_zero):
        raise _fail(origin, where, f"expected a positive number, got {v!r}")
    return float(v)


def _domain(origin: str, key: str, v: Any) -> int | None:
    """``scale_up_domain``: a positive whole number of devices, or absent."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _fail(origin, f"{key}.scale_up_domain", f"expected a positive whole number of devices, got {v!r}")
    return v


def _parse_match(origin: str, key: str, raw: Any) -> ChipMatch:
    if raw is None:
        return ChipMatch()
    if not isinstance(raw, dict):
        raise _fail(origin, f"{key}.match", "expected a table")
    extra = set(raw) - _MATCH_KEYS
    if extra:
        raise _fail(origin, f"{key}.match", f"unknown keys {sorted(extra)} (allowed: {sorted(_MATCH_KEYS)})")
    cc = raw.get("compute_capability")
    if cc is not None:
        if not (isinstance(cc, list) and len(cc) == 2 and all(isinstance(x, int) for x in cc)):
            raise _fail(origin, f"{key}.match.compute_capability", "expected [major, minor]")
        cc = (cc[0], cc[1])
    names = raw.get("names", [])
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise _fail(origin, f"{key}.match.names", "expected a list of token patterns")
    sms = raw.get("num_sms")
    if sms is not None and (not isinstance(sms, int) or sms <= 0):
        raise _fail(origin, f"{key}.match.num_sms", f"expected a positive integer, got {sms!r}")
    mem = raw.get("mem_gib")
    clock = raw.get("clock_mhz")
    boards = raw.get("board_names", [])
    if not isinstance(boards, list) or not all(isinstance(n, str) and n.strip() for n in boards):
        raise _fail(origin, f"{key}.match.board_names", "expected a list of device names")
    return ChipMatch(
        board_names=tuple(boards),
        names=tuple(n.strip().lower() for n in names),
        compute_capability=cc,
        num_sms=sms,
        mem_gib=None if mem is None else _number(origin, f"{key}.match.mem_gib", mem),
        clock_mhz=None if clock is None else _number(origin, f"{key}.match.clock_mhz", clock),
        identify_by_properties=bool(raw.get("identify_by_properties", True)),
    )


def _parse_chip(key: str, raw: Any, origin: str, *, builtin: bool) -> ChipSpec:
    if not isinstance(raw, dict):
        raise _fail(origin, key, "expected a table")
    extra = set(raw) - _CHIP_KEYS
    if extra:
        raise _fail(origin, key, f"unknown keys {sorted(extra)} (allowed: {sorted(_CHIP_KEYS)})")
    for req in ("name", "vendor", "peak_flops_per_s", "hbm_bytes", "hbm_bytes_per_s"):
        if req not in raw:
            raise _fail(origin, key, f"missing required field {req!r}")
    if builtin and "launch_overhead_ns" not in raw:
        raise _fail(origin, key, "missing required field 'launch_overhead_ns'")
    peaks_raw = raw["peak_flops_per_s"]
    if not isinstance(peaks_raw, dict) or not peaks_raw:
        raise _fail(origin, f"{key}.peak_flops_per_s", "expected a non-empty table of dtype = FLOP/s")
    peaks: dict[str, float] = {}
    for d, v in peaks_raw.items():
        if d not in PEAK_DTYPES:
            raise _fail(origin, f"{key}.peak_flops_per_s.{d}", f"unknown dtype key (allowed: {', '.join(PEAK_DTYPES)})")
        peaks[d] = _number(origin, f"{key}.peak_flops_per_s.{d}", v)
    vendor = str(raw["vendor"]).strip().lower()
    if not vendor:
        raise _fail(origin, f"{key}.vendor", "empty")

    def opt(name: str) -> float | None:
        v = raw.get(name)
        return None if v is None else _number(origin, f"{key}.{name}", v)

    default_floor = 500.0 if vendor == "google" else 2000.0
    launch = raw.get("launch_overhead_ns", default_floor)
    sources = raw.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise _fail(origin, f"{key}.sources", "expected a table of field = \"source text\"")
    sources = dict(sources)
    if not builtin:
        user = f"user chip file {origin}"
        for f in NUMERIC_FIELDS:
            sources.setdefault(f, user)
        if "launch_overhead_ns" not in raw:
            sources["launch_overhead_ns"] = "default convention (see [launch-floor]); not in the user file"
    aliases = raw.get("aliases", [])
    notes = raw.get("notes", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise _fail(origin, f"{key}.aliases", "expected a list of strings")
    if not isinstance(notes, list) or not all(isinstance(a, str) for a in notes):
        raise _fail(origin, f"{key}.notes", "expected a list of strings")
    spec = ChipSpec(
        key=key,
        name=str(raw["name"]),
        vendor=vendor,
        aliases=tuple(aliases),
        peak_flops_per_s=peaks,
        hbm_bytes=_number(origin, f"{key}.hbm_bytes", raw["hbm_bytes"]),
        hbm_bytes_per_s=_number(origin, f"{key}.hbm_bytes_per_s", raw["hbm_bytes_per_s"]),
        intra_node_bytes_per_s=opt("intra_node_bytes_per_s"),
        inter_node_bytes_per_s=opt("inter_node_bytes_per_s"),
        host_link_bytes_per_s=opt("host_link_bytes_per_s"),
        scale_up_domain=_domain(origin, key, raw.get("scale_up_domain")),
        launch_overhead_ns=_number(origin, f"{key}.launch_overhead_ns", launch, allow_zero=True),
        sources=sources,
        match=_parse_match(origin, key, raw.get("match")),
        notes=tuple(notes),
        origin="builtin" if builtin else origin,
    )
    if builtin:
        missing = spec.missing_sources()
        if missing:
            raise _fail(origin, key, f"numbers without a source: {missing}")
    return spec


@dataclass(frozen=True)
class ChipTable:
    """The parsed ``chips.toml``: chips in table order, by key, by normalised name/alias, and
    the ``[refs]`` table."""

    chips: tuple[ChipSpec, ...]
    by_key: Mapping[str, ChipSpec]
    by_norm: Mapping[str, ChipSpec]  # normalised key / name / alias -> chip
    refs: Mapping[str, str]


def norm_name(s: str) -> str:
    """Lower-case and drop every non-alphanumeric: 'H100 SXM' == 'h100-sxm' == 'h100_sxm'."""
    return re.sub(r"[^a-z0-9]+", "", str(s).lower())


def name_tokens(s: str) -> list[str]:
    """The lower-case alphanumeric runs of ``s`` ("NVIDIA H100 80GB" -> nvidia, h100, 80gb)."""
    return re.findall(r"[a-z0-9]+", str(s).lower())


#: ``chips.toml`` parsed, as JSON (:func:`parsed_table_text`), shipped beside it: reading it
#: (~0.5 ms) replaces ``tomllib`` (~6 ms to import, ~8 ms to parse the table) on every run.
#: ``tests/test_chips.py`` checks it is in sync; it is used only while the CRC-32 and length
#: of ``chips.toml`` it records match the file's bytes (an edited table is parsed from TOML).
PARSED_TABLE = "chips.parsed.json"
logger = logging.getLogger(__name__)


def _toml_key(raw: bytes) -> str:
    """``crc32-length`` of ``chips.toml``'s bytes: a change detector, not a security check."""
    import zlib

    return f"{zlib.crc32(raw):08x}-{len(raw)}"


def parsed_table_text(raw: bytes) -> str:
    """The text of :data:`PARSED_TABLE` for ``chips.toml`` bytes ``raw``: ``{"toml": key,
    "data": tomllib's parse}``. Regenerate after editing the table::

        python -c "from traceroof.chip_table import write_parsed_table; write_parsed_table()"
    """
    import tomllib

    return json.dumps({"toml": _toml_key(raw), "data": tomllib.loads(raw.decode("utf-8"))}, indent=1) + "\n"


def write_parsed_table() -> Path:
    """Write :data:`PARSED_TABLE` beside ``traceroof/chips.toml`` (a source checkout); returns its path."""
    here = Path(__file__).with_name("chips.toml")
    out = here.with_name(PARSED_TABLE)
    out.write_text(parsed_table_text(here.read_bytes()), encoding="utf-8")
    return out


def _table_data() -> dict[str, Any]:
    """``chips.toml`` as ``tomllib`` parses it: from :data:`PARSED_TABLE` when it matches."""
    pkg = resources.files("traceroof")
    raw = pkg.joinpath("chips.toml").read_bytes()
    try:
        cached = json.loads(pkg.joinpath(PARSED_TABLE).read_bytes())
        if isinstance(cached, dict) and cached.get("toml") == _toml_key(raw) and isinstance(cached.get("data"), dict):
            return cached["data"]
        logger.debug("%s is not that of chips.toml: parsing the TOML", PARSED_TABLE)
    except (OSError, ValueError):
        logger.debug("%s unreadable: parsing the TOML", PARSED_TABLE)
    import tomllib

    return tomllib.loads(raw.decode("utf-8"))


@functools.lru_cache(maxsize=1)
def chip_table() -> ChipTable:
    """The built-in chip table (read once). Raises UnknownChipError when ``chips.toml`` is
    invalid: an unknown key, a number without a source, a name used by two chips."""
    origin = "traceroof/chips.toml"
    data = _table_data()
    refs = data.get("refs", {})
    chips_raw = data.get("chips")
    if not isinstance(chips_raw, dict) or not chips_raw:
        raise _fail(origin, "chips", "no [chips.*] tables")
    chips = tuple(_parse_chip(k, v, origin, builtin=True) for k, v in chips_raw.items())
    by_norm: dict[str, ChipSpec] = {}
    for c in chips:
        for label in (c.key, c.name, *c.aliases):
            n = norm_name(label)
            other = by_norm.get(n)
            if other is not None and other.key != c.key:
                raise _fail(origin, c.key, f"name/alias {label!r} is also used by {other.key!r}")
            by_norm[n] = c
        for f, text_ in c.sources.items():
            for ref in _REF_RE.findall(text_):
                if ref not in refs:
                    raise _fail(origin, f"{c.key}.sources.{f}", f"unknown reference [{ref}]")
    return ChipTable(
        chips=chips,
        by_key=MappingProxyType({c.key: c for c in chips}),
        by_norm=MappingProxyType(by_norm),
        refs=MappingProxyType(dict(refs)),
    )


def references() -> Mapping[str, str]:
    """The ``[refs]`` table of ``chips.toml``: reference id -> citation (URL or repo path)."""
    return chip_table().refs


def list_chips() -> list[ChipSpec]:
    """Every built-in chip, in table order."""
    return list(chip_table().chips)


def load_chip_file(path: str | os.PathLike[str]) -> ChipSpec:
    """Load one chip from a user TOML file.

    Same format as ``chips.toml``: one ``[chips.<key>]`` table (with its
    ``peak_flops_per_s`` / ``match`` / ``sources`` sub-tables), or the chip's fields at the
    top level (key = file stem). Required: ``name``, ``vendor``, ``peak_flops_per_s``
    (FLOP/s per dtype key), ``hbm_bytes``, ``hbm_bytes_per_s``. Fields without a source are
    attributed to the file.
    """
    p = Path(path)
    if not p.is_file():
        raise UnknownChipError(f"chip file {p} not found; pass a chip name or an existing TOML file")
    import tomllib  # here: the built-in table is read from its parsed form (PARSED_TABLE)

    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UnknownChipError(f"chip file {p}: not valid TOML: {e}") from e
    if "chips" in data:
        chips = data["chips"]
        if not isinstance(chips, dict) or len(chips) != 1:
            n = len(chips) if isinstance(chips, dict) else 0
            raise UnknownChipError(f"chip file {p}: expected exactly one [chips.<key>] table, found {n}")
        ((key, raw),) = chips.items()
    else:
        key, raw = p.stem, {k: v for k, v in data.items() if k not in ("schema_version", "refs")}
    return _parse_chip(str(key), raw, str(p), builtin=False)


# --------------------------------------------------------------------------- get_chip


def close_matches(query: str, n: int = 5) -> list[str]:
    """Up to ``n`` chip keys whose key, name or alias is close to ``query`` (for messages)."""
    import difflib  # only for a name not found (~1 ms to import)

    db = chip_table()
    q = norm_name(query)
    labels = {}
    for c in db.chips:
        for label in (c.key, c.name, *c.aliases):
            labels.setdefault(norm_name(label), c.key)
    out: list[str] = []
    for m in difflib.get_close_matches(q, list(labels), n=n * 3, cutoff=0.6):
        if labels[m] not in out:
            out.append(labels[m])
    if q:
        for label, key in labels.items():
            if key not in out and (q in label or (len(label) >= 3 and label in q)):
                out.append(key)
    return out[:n]


def known_chips_text() -> str:
    """Every built-in chip key, comma-separated (for messages)."""
    return ", ".join(c.key for c in chip_table().chips)


def get_chip(name_or_path: str | os.PathLike[str] | ChipSpec) -> ChipSpec:
    """Return a chip by key, name or alias, or load it from a TOML file path.

    Matching ignores case and ``-``/``_``/space: ``h100``, ``h100-sxm``, ``H100 SXM``,
    ``tpu-v5e``, ``v6e``, ``mi300x`` all work. Bare family names pick the common part:
    ``h100`` -> H100 SXM, ``a100`` -> A100 SXM4 80GB, ``v100`` -> V100 SXM2 32GB,
    ``h200`` -> H200 SXM. A string naming several variants (``"MI250X/MI250"``) is ambiguous.

    Raises:
        UnknownChipError: unknown or ambiguous name (the message lists close matches and
            every known key), or an unreadable/invalid chip file.
    """
    if isinstance(name_or_path, ChipSpec):
        return name_or_path
    s = os.fspath(name_or_path).strip() if isinstance(name_or_path, os.PathLike) else str(name_or_path).strip()
    if s.lower().endswith(".toml") or (("/" in s or os.sep in s) and Path(s).is_file()):
        return load_chip_file(s)
    db = chip_table()
    hit = db.by_norm.get(norm_name(s))
    if hit is not None:
        return hit
    cands = token_candidates(s)
    if len(cands) == 1:
        return cands[0]
    if len(cands) > 1:
        keys = [c.key for c in cands]
        raise UnknownChipError(
            f"chip name {s!r} is ambiguous: it matches {', '.join(keys)}. Pass one of them to --chip.",
            keys,
        )
    close = close_matches(s)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise UnknownChipError(
        f"unknown chip {s!r}.{hint} Known chips: {known_chips_text()}. "
        "Or pass --chip path/to/chip.toml (same format as traceroof/chips.toml).",
        close or [c.key for c in db.chips],
    )


# --------------------------------------------------------------------------- name tokens


def _pattern_score(pattern: str, tokens: set[str]) -> int:
    """Number of positive tokens when ``pattern`` matches ``tokens``, else 0."""
    pos = 0
    for t in pattern.split():
        if t.startswith("!"):
            if t[1:] in tokens:
                return 0
        elif t in tokens:
            pos += 1
        else:
            return 0
    return pos


def token_candidates(name: str) -> list[ChipSpec]:
    """Chips whose best name pattern has the most matched tokens (most specific first)."""
    toks = set(name_tokens(name))
    if not toks:
        return []
    best, out = 0, []
    for c in chip_table().chips:
        score = max((_pattern_score(p, toks) for p in c.match.names), default=0)
        if score == 0:
            continue
        if score > best:
            best, out = score, [c]
        elif score == best:
            out.append(c)
    return out

"""The tickets and action bodies roles send each other, typed: one frozen dataclass per message with
``to_wire()`` (the JSON object a stock client sees) and ``from_wire(raw)`` (checked, ValueError naming
the field that is wrong). Both ends use them, so a ticket is built and read in one place.

- ``MetadataTicket`` Planner -> loader: buffer one row group, stream its samples' metadata;
- ``SamplesTicket`` constructor -> loader: pop these samples of one or more hosted actors;
- ``BufferTicket`` inspection -> loader: the buffered samples' metadata;
- ``CatalogTicket`` Planner -> loader: a source's catalog (by digest), which the Planner has not got;
- ``BatchTicket`` trainer -> constructor: one rank's batch or encoder table of a step, or its rank
  stream from a step on (signed);
- ``RankStream`` trainer -> Planner: the descriptor ``('rank', RANK[, FIRST[, END]])``;
- ``Registration`` loader or constructor -> Planner (action ``register``);
- ``Reshard`` Planner -> loader (action ``reshard``): a scaled source's new ownership segments.
"""
from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field

from . import field, optional_field


def _actor_of(raw: dict, what: str) -> tuple[str | None, int | None]:
    """(source, actor) a ticket names, or (None, None) when it names none (a process hosting one actor)."""
    if "source" not in raw:
        return None, None
    return field(raw, "source", str, what), field(raw, "actor", int, what)


def _segments(raw: dict, what: str = "metadata ticket") -> tuple[tuple[int, int], ...] | None:
    """A ticket's optional ``segments`` (a live reshard): [[first position, actors], ...]."""
    segments = raw.get("segments")
    if segments is None:
        return None
    if not (isinstance(segments, list) and segments and all(
            isinstance(s, list) and len(s) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                        for v in s) and s[1] >= 1 for s in segments)):
        raise ValueError(f"malformed {what}: segments {segments!r} is not [[first position, actors], ...]")
    return tuple((first, actors) for first, actors in segments)


@dataclass(frozen=True)
class MetadataTicket:
    source: str | None
    actor: int | None
    epoch: int
    file: str
    row_group: int
    segments: tuple[tuple[int, int], ...] | None = None  # a resharded source's ownership (core/scaling.py)

    kind = "metadata"

    def to_wire(self) -> dict:
        return {"kind": self.kind, "source": self.source, "actor": self.actor, "epoch": self.epoch,
                "file": self.file, "row_group": self.row_group,
                **({"segments": [list(s) for s in self.segments]} if self.segments else {})}

    @classmethod
    def from_wire(cls, raw: dict) -> "MetadataTicket":
        what = "metadata ticket"
        return cls(*_actor_of(raw, "ticket"), field(raw, "epoch", int, what), field(raw, "file", str, what),
                   field(raw, "row_group", int, what), _segments(raw))

    def segment_lists(self) -> list[list[int]] | None:
        return [list(s) for s in self.segments] if self.segments else None


@dataclass(frozen=True)
class SamplesPart:
    """One hosted actor's share of a samples call: [epoch, file, row_group, row(, consumers)] per sample."""
    source: str | None
    actor: int | None
    samples: tuple[tuple, ...]

    def to_wire(self) -> dict:
        return {"source": self.source, "actor": self.actor, "samples": [list(s) for s in self.samples]}

    @classmethod
    def from_wire(cls, raw: dict) -> "SamplesPart":
        wanted = field(raw, "samples", list, "samples ticket")
        for item in wanted:
            if not (isinstance(item, list) and len(item) in (4, 5) and isinstance(item[1], str)
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in item[:1] + item[2:])):
                raise ValueError(f"malformed samples ticket: sample {item!r} is not "
                                 f"[epoch, file, row_group, row] or [epoch, file, row_group, row, consumers]")
        return cls(*_actor_of(raw, "ticket"), tuple(tuple(item) for item in wanted))


@dataclass(frozen=True)
class SamplesTicket:
    """Samples of one step for one constructor; several parts (hosted actors of one loader process)
    come back as their tables back to back, in order."""
    step: int
    constructor: int
    parts: tuple[SamplesPart, ...]

    kind = "samples"

    def to_wire(self) -> dict:
        head = {"kind": self.kind, "step": self.step, "constructor": self.constructor}
        if len(self.parts) == 1:
            return {**head, **self.parts[0].to_wire()}
        return {**head, "parts": [p.to_wire() for p in self.parts]}

    @classmethod
    def from_wire(cls, raw: dict) -> "SamplesTicket":
        step = field(raw, "step", int, "samples ticket")
        constructor = field(raw, "constructor", int, "samples ticket")
        if "parts" not in raw:
            return cls(step, constructor, (SamplesPart.from_wire(raw),))
        parts = field(raw, "parts", list, "samples ticket")
        if not parts or not all(isinstance(part, dict) for part in parts):
            raise ValueError(f"malformed samples ticket: parts {parts!r} is not a non-empty list of "
                             f"{{'source', 'actor', 'samples'}}")
        return cls(step, constructor, tuple(SamplesPart.from_wire(p) for p in parts))


@dataclass(frozen=True)
class BufferTicket:
    """One hosted actor's buffer (the Planner's source endpoints name it), or every hosted actor's."""
    source: str | None = None
    actor: int | None = None

    kind = "buffer"

    def to_wire(self) -> dict:
        return {"kind": self.kind, **({"source": self.source, "actor": self.actor} if self.source is not None else {})}

    @classmethod
    def from_wire(cls, raw: dict) -> "BufferTicket":
        return cls(*_actor_of(raw, "ticket"))


DIGEST_CHARS = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class CatalogTicket:
    """The catalog of ``source`` a loader registered with (``digest``), as an Arrow table: what a Planner
    that has it neither in its catalog cache nor on its disks asks the registering loader for."""
    source: str
    digest: str

    kind = "catalog"

    def to_wire(self) -> dict:
        return {"kind": self.kind, "source": self.source, "digest": self.digest}

    @classmethod
    def from_wire(cls, raw: dict) -> "CatalogTicket":
        what = "catalog ticket"
        digest = field(raw, "digest", str, what)
        if not digest or not set(digest) <= DIGEST_CHARS:  # it names a file of the catalog cache
            raise ValueError(f"malformed {what}: digest {digest!r} is not a lowercase hexadecimal digest")
        return cls(field(raw, "source", str, what), digest)


STREAM_KINDS = {"rank": "batch", "encoder-rank": "encoder"}  # a stream ticket's kind -> what it streams


@dataclass(frozen=True)
class BatchTicket:
    """A rank's ``batch`` or ``encoder`` table of one step (its stream's one-step slice), or (``rank``,
    ``encoder-rank``) its stream from ``step`` on, up to ``end`` (exclusive; None: no end); ``raw``
    keeps the signed fields (``exp``, ``sig``) the constructor verifies (``wire.security``)."""
    kind: str
    step: int
    rank: int
    raw: dict = dataclass_field(default_factory=dict, compare=False, repr=False)
    end: int | None = None

    KINDS = ("batch", "encoder", "rank", "encoder-rank")

    @property
    def streams(self) -> str:
        """What the ticket's stream carries: "batch" (the rank's microbatches) or "encoder" (its images)."""
        return STREAM_KINDS.get(self.kind, self.kind)

    @property
    def end_step(self) -> int | None:
        """Where its stream ends (exclusive; None: no end): a one-step ticket is the one-step slice."""
        return self.end if self.kind in STREAM_KINDS else self.step + 1

    def to_wire(self) -> dict:
        return {**self.raw, "kind": self.kind, "step": self.step, "rank": self.rank,
                **({"end": self.end} if self.end is not None else {})}

    @classmethod
    def checked_kind(cls, raw: dict) -> str:
        """The ticket's kind, checked before anything else (even before who is asking)."""
        kind = raw.get("kind")
        if kind not in cls.KINDS:
            raise ValueError(f"malformed ticket: kind {kind!r}, a constructor serves 'batch', 'encoder', "
                             f"'rank' and 'encoder-rank' tickets")
        return kind

    @classmethod
    def from_wire(cls, raw: dict) -> "BatchTicket":
        kind = cls.checked_kind(raw)
        step, rank = field(raw, "step", int, "batch ticket"), field(raw, "rank", int, "batch ticket")
        end = optional_field(raw, "end", int, "batch ticket") if kind in STREAM_KINDS else None
        if end is not None and end <= step:
            raise ValueError(f"malformed ticket: 'end' must be an integer after step {step}, got {end!r}")
        return cls(kind, step, rank, raw, end)


@dataclass(frozen=True)
class RankStream:
    """The descriptor of a rank's stream: ``('rank', RANK[, FIRST[, END]])`` (its batches) or
    ``('encoder-rank', RANK[, FIRST[, END]])`` (the images its vision encoder processes, under an image
    graph); FIRST default: where the rank is (the Planner knows), END default: no end. ``kind`` is the
    descriptor's first part, which is also the kind of the ticket it gets."""
    rank: int
    first: int | None = None
    end: int | None = None
    kind: str = "rank"

    def descriptor_path(self) -> list[str]:
        return [self.kind, str(self.rank), *([] if self.first is None else [str(self.first)]),
                *([] if self.end is None else [str(self.end)])]

    @classmethod
    def from_path(cls, parts: list, mesh) -> "RankStream":
        """The descriptor's parts, checked (``mesh.coord`` names a rank outside the mesh)."""
        if len(parts) not in (2, 3, 4) or parts[0] not in STREAM_KINDS:
            raise ValueError(f"malformed descriptor {parts!r}: a rank stream is ('rank', RANK[, FIRST_STEP[, "
                             f"END_STEP]]) or ('encoder-rank', RANK[, FIRST_STEP[, END_STEP]])")
        try:
            rank, first, end = [int(p) for p in parts[1:]] + [None] * (4 - len(parts))
        except ValueError:
            raise ValueError(f"malformed descriptor {parts!r}: rank, first and end step must be integers") from None
        if first is not None and (first < 0 or (end is not None and end <= first)):
            raise ValueError(f"malformed descriptor {parts!r}: first step must be >= 0 and before the end step")
        mesh.coord(rank)
        return cls(rank, first, end, parts[0])


@dataclass(frozen=True)
class Registration:
    """A role announcing itself to the Planner: a loader actor (``source``, ``actor``, ``replica``, and
    the digest of its source's ``catalog``, from which its row groups follow; or, without one, its
    ``row_groups`` as [file, row_group, rows]) or a constructor (``index``)."""
    role: str
    location: str
    source: str | None = None
    actor: int | None = None
    replica: int = 0
    row_groups: tuple[tuple[str, int, int], ...] = ()
    index: int | None = None
    catalog: str | None = None

    ROLES = ("loader", "constructor")

    def to_wire(self) -> dict:
        if self.role == "loader":
            shares = {"catalog": self.catalog} if self.catalog is not None else \
                {"row_groups": [list(rg) for rg in self.row_groups]}
            return {"role": self.role, "source": self.source, "actor": self.actor, "replica": self.replica,
                    "location": self.location, **shares}
        return {"role": self.role, "index": self.index, "location": self.location}

    @classmethod
    def from_wire(cls, raw: dict) -> "Registration":
        role = field(raw, "role", str, "register")
        location = field(raw, "location", str, "register")
        if role == "loader":
            catalog = optional_field(raw, "catalog", str, "register", None)
            row_groups = (() if catalog is not None
                          else tuple(tuple(rg) for rg in field(raw, "row_groups", list, "register")))
            return cls(role, location, field(raw, "source", str, "register"), field(raw, "actor", int, "register"),
                       optional_field(raw, "replica", int, "register", 0), row_groups, catalog=catalog)
        if role == "constructor":
            return cls(role, location, index=field(raw, "index", int, "register"))
        raise ValueError(f"register: unknown role {role!r} (roles: {', '.join(cls.ROLES)})")



@dataclass(frozen=True)
class Reshard:
    """A scaled source's ownership segments, [[first position, actors], ...] (core/scaling.py)."""
    source: str
    segments: tuple[tuple[int, int], ...]

    def to_wire(self) -> dict:
        return {"source": self.source, "segments": [list(s) for s in self.segments]}

    @classmethod
    def from_wire(cls, raw: dict) -> "Reshard":
        source = field(raw, "source", str, "reshard")
        field(raw, "segments", list, "reshard")
        return cls(source, _segments(raw, "reshard"))

    def segment_lists(self) -> list[list[int]]:
        return [list(s) for s in self.segments]

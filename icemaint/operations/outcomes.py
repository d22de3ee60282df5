"""What a rewrite run found and did, typed: each staged group, the run's proof and the read evidence.

Inside the product these are dataclasses with enum verdicts; dicts appear only at the boundary (`to_dict`: the
audit log, `--json`, Dagster metadata), in the shape those have always had.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from icemaint.domain.verdicts import Word
from icemaint.engine.validation import ValidationResult


class GroupVerdict(Word):
    """What became of one staged file group."""

    STAGED = "staged"                # written to its staging branch; not yet proven
    NO_GAIN = "no_gain"              # as many files as it replaced, nothing applied: not published
    NOT_PUBLISHED = "not_published"  # its proof failed: discarded, `main` unchanged
    PUBLISHED = "published"


@dataclass
class StagedGroup:
    """One file group of a run, from its staging to its publish (or not)."""

    target: str                # "data", or "position_deletes" alone
    branch: str
    base_snapshot_id: int      # S: the snapshot the group was planned and proven on
    staged_snapshot_id: int
    replaced_files: int
    new_files: int
    dangling_deletes: int
    codec: Mapping[str, Any] = field(default_factory=dict)  # the write codec and where it came from
    verdict: GroupVerdict = GroupVerdict.STAGED
    published_snapshot_id: int | None = None
    publish_attempts: int = 0  # commit attempts of its publish (a lost race is made again at once)
    publish_attempt_seconds: list[float] = field(default_factory=list)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        codec = out.pop("codec")
        out["verdict"] = str(self.verdict)
        if out["note"] is None:
            del out["note"]
        return {**out, **codec}


@dataclass(frozen=True)
class ReadEvidence:
    """One side of a proof's read of the rewritten rows: what the layout costs a reader (`engine.digest`)."""

    planning_ms: float = 0.0
    scan_ms: float = 0.0
    rows: int = 0
    fed_by_rewrite: bool = False     # digested by the rewrite's own read: its cost is in `rewrite_ms`
    rewrite_ms: float | None = None

    @classmethod
    def of(cls, read: Mapping[str, Any] | None) -> ReadEvidence | None:
        if not read:
            return None
        return cls(planning_ms=float(read.get("planning_ms", 0.0)), scan_ms=float(read.get("scan_ms", 0.0)),
                   rows=int(read.get("rows", 0)), fed_by_rewrite=bool(read.get("fed_by_rewrite", False)),
                   rewrite_ms=read.get("rewrite_ms"))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.fed_by_rewrite:
            del out["fed_by_rewrite"], out["rewrite_ms"]
        return out


@dataclass
class RunProof:
    """The run's proof: one validation per group it proved; passed when every one passed (None: none ran)."""

    scope: str | None = None
    proofs: list[ValidationResult] = field(default_factory=list)

    @property
    def passed(self) -> bool | None:
        return all(p.passed for p in self.proofs) if self.proofs else None

    def add(self, proof: ValidationResult) -> None:
        self.proofs.append(proof)

    @property
    def read_before(self) -> ReadEvidence | None:
        return ReadEvidence.of(self.proofs[0].reads.get("before")) if self.proofs else None

    @property
    def read_after(self) -> ReadEvidence | None:
        return ReadEvidence.of(self.proofs[-1].reads.get("after")) if self.proofs else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"passed": self.passed, "commits": [p.to_dict() for p in self.proofs]}
        if self.scope is not None:
            out["scope"] = self.scope
        return out

"""One rank of a ``parallel:`` pipeline, shown: its local shapes, the collectives of a forward
with their bytes, its memory and FLOPs, and a line of communication per layer (the table's
section under ``tracer run``/``check --rank R``, and the ``rank`` object of ``--json``)."""

from __future__ import annotations

from dataclasses import asdict

from ..analysis import parallel
from ..core.formatting import human_bytes, human_count


def check_rank(analysis, rank: int) -> str | None:
    """Why ``rank`` cannot be shown for this analysis, else None."""
    view = analysis.rank
    if not analysis.degrees:
        return "the pipeline has no parallel: section, so it has no ranks (--rank shows one rank of a parallel plan)"
    world = parallel.world_size(analysis.degrees)
    if not 0 <= rank < world:
        return f"--rank {rank}: the mesh ({_mesh(analysis.degrees)}) has ranks 0 .. {world - 1}"
    if view is None or view.analysis is None:
        return "the ranks cannot be analysed at these degrees (the warnings above say why)"
    return None


def rank_dict(analysis, rank: int = 0) -> dict | None:
    """The rank as JSON: mesh, coordinates, local tensors, collectives, totals (None without ``parallel:``)."""
    view = analysis.rank
    if view is None or view.analysis is None:
        return None
    local = view.analysis
    found = parallel.collectives(analysis)
    return {
        "rank": rank,
        "mesh": dict(view.degrees),
        "coordinates": parallel.mesh_coordinates(view.degrees, rank),
        "plan": {step: asdict(entry) for step, entry in view.plan.items()},
        "totals": {
            "flops": local.total_flops,
            "peak_bytes": local.peak_bytes,
            "communication_bytes": sum(c.bytes_per_rank for c in found),
        },
        "tensors": [
            {
                "id": record,
                "shape": list(t.concrete),
                "shape_symbolic": t.symbolic,
                "placements": list(t.placements),
                "positions": list(t.positions),
            }
            for record, t in parallel.rank_view(analysis, rank).items()
        ],
        "collectives": [{**asdict(c), "shape": list(c.shape)} for c in found],
        "communication": communication_line(analysis),
    }


def rank_table(analysis, rank: int = 0) -> str:
    """The rank as text: one row per tensor (its local shape and placements), then each
    collective, then the totals and the communication per layer."""
    view = analysis.rank
    local = view.analysis
    coords = ", ".join(f"{name}={c}" for name, c in parallel.mesh_coordinates(view.degrees, rank).items())
    world = parallel.world_size(view.degrees)
    rows = [("tensor", "local shape", "", "placements", "positions")]
    for record, t in parallel.rank_view(analysis, rank).items():
        positions = ", ".join(p for p in t.positions if p)
        rows.append((record, t.symbolic, str(list(t.concrete)), " ".join(t.placements), positions))
    lines = [f"rank {rank} of {world} (mesh {_mesh(view.degrees)}; coordinates {coords}):", *_columns(rows)]
    found = parallel.collectives(analysis)
    if found:
        lines.append("collectives (each rank, one forward):")
        lines += _columns(
            [("op", "step", "over", "shape", "bytes per rank")]
            + [(c.op, c.step, c.mesh_dim, str(list(c.shape)), human_bytes(c.bytes_per_rank)) for c in found]
        )
    lines.append(f"rank {rank}: {human_count(local.total_flops)} FLOPs, estimated peak {human_bytes(local.peak_bytes)}")
    lines.append(communication_line(analysis))
    return "\n".join(lines)


def communication_line(analysis) -> str:
    """``communication per layer: 2 all_reduce (tp), 1.0 KiB per rank``: a repeated block's copy is
    a layer; a file without blocks is one."""
    found = parallel.collectives(analysis)
    if not found:
        return "communication: none (every step runs on its rank's data alone)"
    layers: dict[str | None, list] = {}
    for c in found:
        layers.setdefault(analysis.nodes[c.step].copy if c.step in analysis.nodes else None, []).append(c)
    first = next(iter(layers.values()))
    kinds: dict[tuple[str, str], int] = {}
    for c in first:
        kinds[(c.op, c.mesh_dim)] = kinds.get((c.op, c.mesh_dim), 0) + 1
    what = ", ".join(f"{n} {op} ({mesh_dim})" for (op, mesh_dim), n in kinds.items())
    per = human_bytes(sum(c.bytes_per_rank for c in first))
    total = human_bytes(sum(c.bytes_per_rank for c in found))
    if len(layers) == 1:
        return f"communication per layer: {what}, {per} per rank"
    return f"communication per layer: {what}, {per} per rank ({len(layers)} layers: {total} per rank per forward)"


def _mesh(degrees) -> str:
    return ", ".join(f"{name}={degree}" for name, degree in degrees.items())


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]

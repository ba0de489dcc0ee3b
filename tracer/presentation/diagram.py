"""Graphviz dataflow diagrams: both shapes on every edge, memory-layout marks, groups, a legend.

``diagram(trace)`` builds a ``graphviz.Digraph`` from a finished trace; ``tracer.presentation.outputs`` writes it
as DOT or, through the system ``dot``, as SVG, PNG or PDF. The DOT text is a pure
function of the trace's records and the pipeline spec (no paths, devices or times), so it can
be snapshot-tested.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..analysis import parallel
from ..analysis.graph import CHAIN, ONE, OUTPUTS
from ..core.errors import Diagnostic, TracerError
from ..core.formatting import human_bytes
from ..runtime.records import TensorRecord
from ..steps.contract import STEP_KINDS
from .folding import Fold, collapse_keys, repeat_folds, within
from .graphviz import render_bytes
from .heatmap import node_rows

if TYPE_CHECKING:
    from .trace import Trace

# The graph's DOT id is never user text (the graphviz library passes a name written as '<...>'
# through unquoted, which let a pipeline name close the graph and open its own); the title is
# the escaped label.
GRAPH_ID = "pipeline"
FONT = "Helvetica"

INK = "#333333"
MUTED = "#666666"
STRIDED = "#c0392b"  # non-contiguous edges: the second colour
STYLES = {  # node kind -> Graphviz attributes
    "input": {"shape": "box", "style": "rounded,filled,bold", "fillcolor": "#d5ecd4", "color": "#3b7d3a"},
    "param": {"shape": "box", "style": "filled", "fillcolor": "#eeeeee", "color": "#999999", "fontsize": "10"},
    "output": {"shape": "box", "style": "rounded,filled,bold", "fillcolor": "#e6dcf2", "color": "#6a4c93", "peripheries": "2"},
    "step": {"shape": "box", "style": "rounded,filled", "fillcolor": "#ffffff", "color": INK},
    "view": {"shape": "box", "style": "rounded,filled", "fillcolor": "#dde9f7", "color": "#3f6fb5"},
    "copy": {"shape": "box", "style": "rounded,filled,bold", "fillcolor": "#fbd9a6", "color": "#c77700"},
    "collapsed": {"shape": "box3d", "style": "filled", "fillcolor": "#f4f1e0", "color": INK},
    "repeat": {"shape": "box3d", "style": "filled,bold", "fillcolor": "#efe6fa", "color": "#6a4c93"},
    "collective": {"shape": "octagon", "style": "filled", "fillcolor": "#fdeef4", "color": "#b03a74", "fontsize": "10"},
}
RANK = "#b03a74"  # a rank's local shapes and its collectives: the third colour
CLUSTER_GROUP = {"style": "rounded,filled", "fillcolor": "#f7f7f7", "color": "#bbbbbb", "fontcolor": MUTED}
CLUSTER_COMPOSITE = {"style": "rounded,dashed", "color": "#c77700", "fillcolor": "#fff6e8", "fontcolor": "#c77700"}
LEGEND = (  # mark -> (sample shown in the legend, explanation); only used marks are listed
    ("input", "x", "input tensor"),
    ("param", "W", "parameter (shape, init)"),
    ("step", "id", "step: id, op and key arguments, new tensor's size"),
    ("view", "id", "view: shares storage with its source, no new memory"),
    ("copy", "id", "copy: layout op that allocates and copies data"),
    ("composite", "merge", "composite step: its inner ops"),
    ("collapsed", "group", "collapsed group: input → output shapes"),
    ("collective", "all_reduce", "collective before or after a step (parallel:): bytes each rank sends"),
    ("rank", "rank 0: (B, T // tp)", "the chosen rank's local shape, where it differs"),
    ("repeat", "×N", "more copies of the block above, folded (--expand draws each)"),
    ("output", "out", "pipeline output"),
    ("group", "group", "group of steps"),
    ("contiguous", "(B, T)  [2, 6]", "contiguous tensor: symbolic and concrete shape"),
    ("strided", "(B, T)  [2, 6]", "non-contiguous tensor (strided view)"),
    ("dtype", "int64", "dtype, when not float32"),
)
RANKDIRS = ("TB", "LR", "BT", "RL")  # Graphviz's: inputs at the top, at the left, ...


def diagram(
    trace: Trace,
    collapse: Iterable[str] = (),
    links: bool = False,
    expand: bool = False,
    rankdir: str = "TB",
    legend: bool = True,
    rank: int | None = None,
):
    """The trace's dataflow as a ``graphviz.Digraph`` (displays inline in Jupyter). A repeated
    block is drawn as its first copy plus one "×N" node for the others, unless ``expand``.
    ``links`` makes every node and edge a link to ``#ID`` of the tensor it shows (``#group=NAME``
    for a collapsed group): the HTML report selects what was clicked through these. ``rankdir``
    'LR' flows left to right (a slide's shape); ``legend=False`` leaves the legend out. ``rank``
    (a pipeline with ``parallel:``) adds that rank's local shapes to the edges and draws the
    collectives of a forward as nodes with their bytes per rank."""
    if rankdir not in RANKDIRS:
        message = f"rankdir {rankdir!r} is not a direction Graphviz knows: use one of {', '.join(RANKDIRS)}"
        raise TracerError(Diagnostic(trace.analysis.source.file, None, "rankdir", message))
    return _Builder(trace, tuple(collapse), links, expand, rank).build(rankdir, legend)


def dot_source(
    trace: Trace, collapse: Iterable[str] = (), expand: bool = False, rankdir: str = "TB", legend: bool = True, rank: int | None = None
) -> str:
    return diagram(trace, collapse, expand=expand, rankdir=rankdir, legend=legend, rank=rank).source


# ---------------------------------------------------------------- building the graph


@dataclass
class _Edge:
    tail: str
    head: str
    record: TensorRecord
    extra: dict = field(default_factory=dict)


class _Builder:
    def __init__(self, trace: Trace, collapse: tuple[str, ...], links: bool = False, expand: bool = False, rank: int | None = None):
        self.trace, self.analysis, self.links = trace, trace.analysis, links
        self.rank = rank if rank is not None and trace.analysis.rank is not None and trace.analysis.rank.analysis is not None else None
        self.local = {} if self.rank is None else parallel.rank_view(trace.analysis, self.rank)
        self.records = {r.id: r for r in trace.records}
        self.nodes = self.analysis.nodes
        self.group_of = {s: node.step.group for s, node in self.nodes.items() if node.step.group}
        self.groups = list(dict.fromkeys(self.group_of.values()))
        self.collapsed = collapse_keys(self.groups, collapse, self.analysis.source.file)
        folds = repeat_folds(self.analysis)
        self.repeated = {f.key: f for f in folds.values()}  # every repeated block: marker key -> its fold
        self.repeats = {} if expand else folds
        self.repeat_nodes = {} if expand else self.repeated  # the markers drawn
        keys = self.groups + [k for k in [*self.collapsed, *self.repeat_nodes] if k not in self.groups]
        # node names: group names are free text (DOT reads ':' as a port), so number them
        self.group_nodes = {key: f"group@{i}" for i, key in enumerate(keys)}
        self.fold = self._folds()
        self.folded_params = Counter(key for t, key in self.fold.items() if t in self.analysis.pipeline.params)
        self.marks: set[str] = set()

    def _folds(self) -> dict[str, str]:
        """Tensor id -> the collapse key whose node draws it: steps by their group (the outermost
        key wins), params when every step that reads them folds into the same node."""
        fold = {}
        for step_id, group in self.group_of.items():
            keys = [k for k in self.collapsed if within(group, k)]
            if keys:
                fold[step_id] = min(keys, key=len)
        covered = {f.key for f in self.repeat_nodes.values() if self._collapsed_whole(f, fold)}
        for step_id in self.nodes:  # a repeat marker, unless a collapsed group holds the whole block
            repeat = self.repeats.get(step_id)
            if repeat is not None and repeat.key not in covered:
                fold[step_id] = repeat.key
        for record in self.trace.records:
            if record.op == "param" and record.id not in self.analysis.outputs:
                homes = {fold.get(node.id) for node in self.analysis.users(record.id)}
                if len(homes) == 1 and None not in homes:
                    fold[record.id] = homes.pop()
        return fold

    def _collapsed_whole(self, repeat: Fold, fold: dict[str, str]) -> bool:
        """Whether one collapsed group holds both the copy shown and the folded ones."""
        ends = [self._first_step(repeat.shown), self._first_step(repeat.hidden[-1])]
        return None not in ends and fold.get(ends[0]) is not None and fold.get(ends[0]) == fold.get(ends[1])

    def _first_step(self, prefix: str) -> str | None:
        return next((s for s in self.nodes if s.startswith(prefix + "/")), None)

    def build(self, rankdir: str = "TB", legend: bool = True):
        import graphviz

        graph = graphviz.Digraph(
            GRAPH_ID,
            graph_attr={**_graph_attrs(self.trace, self._rank_title()), "rankdir": rankdir},
            node_attr={"fontname": FONT, "fontsize": "11", "margin": "0.12,0.06"},
            edge_attr={"fontname": FONT, "fontsize": "9", "color": INK, "arrowsize": "0.7"},
        )
        edges = self._edges()
        self._declared_nodes(graph)
        self._step_nodes(graph)
        self._output_nodes(graph)
        for edge in edges:
            self._draw_edge(graph, edge)
        self._collective_nodes(graph)
        self._sibling_order(graph)
        if legend:
            self._legend(graph)
        pipeline_file = self.analysis.source.file
        # notebooks (trace._repr_html_, a displayed diagram) draw through render_bytes: its time limit and messages
        graph._repr_image_svg_xml = lambda: render_bytes(graph.source, "svg", pipeline_file).decode("utf-8")
        return graph

    def _rank_title(self) -> str:
        if self.rank is None:
            return ""
        degrees = self.analysis.degrees
        mesh = ", ".join(f"{k}={v}" for k, v in degrees.items())
        return f"rank {self.rank} of {parallel.world_size(degrees)} (mesh {mesh})"

    def _collective_nodes(self, graph) -> None:
        """One node per collective, beside the step that needs it: into it when it redistributes
        the step's input, out of it otherwise (a repeated block's copies drawn as one node share
        theirs: ×N)."""
        if self.rank is None:
            return
        drawn: dict[tuple, list] = {}
        for c in parallel.collectives(self.analysis):
            drawn.setdefault((self._tail(c.step), c.op, c.mesh_dim, c.shape, c.dtype, c.at), []).append(c)
        for n, ((step_node, op, mesh_dim, shape, dtype, at), found) in enumerate(drawn.items()):
            self.marks.add("collective")
            times = f" ×{len(found)}" if len(found) > 1 else ""
            lines = [
                f"<B>{_esc(op)}</B>{times}",
                f'<FONT POINT-SIZE="9">over {_esc(mesh_dim)} · [{", ".join(map(str, shape))}] {_esc(dtype)}</FONT>',
                f'<FONT POINT-SIZE="9">{human_bytes(found[0].bytes_per_rank)} per rank</FONT>',
            ]
            name = f"collective@{n}"
            where = {"input": "before", "output": "after"}.get(at, "inside")
            graph.node(name, _rows(lines), tooltip=f"{op} {where} {found[0].step}", **STYLES["collective"])
            ends = (name, step_node) if at == "input" else (step_node, name)  # a gathered input feeds its step
            graph.edge(*ends, style="dotted", color=RANK, arrowhead="dot")

    def _about(self, record: TensorRecord) -> dict[str, str]:
        return {"tooltip": _tooltip(record), **self._link(record.id)}

    def _link(self, target: str) -> dict[str, str]:
        return {"href": "#" + quote(target, safe="/=")} if self.links else {}

    # where a tensor's arrows start and end, given composites and collapsed groups

    def _tail(self, tensor_id: str) -> str:
        producer = self.analysis.graph.producer(tensor_id) or tensor_id  # one of several outputs leaves its step's node
        group = self.fold.get(producer)
        return self.group_nodes[group] if group else self.analysis.record_of(producer)

    def _head(self, step_id: str, rid: str) -> str | None:
        """The node an arrow carrying record ``rid`` into the step ends at: the step's own, its
        collapsed group's, or a composite's first inner op that reads it (None if none does)."""
        group = self.fold.get(step_id)
        if group:
            return self.group_nodes[group]
        node = self.nodes[step_id]
        if node.form != CHAIN:
            return step_id
        return next((out.id for out in node.outs if rid in out.reads), None)

    def _edges(self) -> list[_Edge]:
        edges, seen = [], set()
        for node in self.nodes.values():
            for edge in self._edges_into(node):
                key = (edge.tail, edge.head, edge.record.id)
                if edge.tail == edge.head:
                    continue  # both ends inside one collapsed group
                if key in seen and "group@" in edge.tail + edge.head:
                    continue  # a collapsed group reads each outside tensor once
                seen.add(key)
                edges.append(edge)
        for name in self.analysis.outputs:
            edges.append(_Edge(self._tail(name), _output_node(name), self.records[self.analysis.record_of(name)]))
        return edges

    def _edges_into(self, node) -> list[_Edge]:
        """One arrow per tensor the step reads; into a composite's cluster, one per tensor each
        inner op is computed from (rope's tables read no input, its rotation reads x, cos and sin)."""
        ref_of = dict(zip(node.reads, node.refs))
        if node.id in self.fold or node.form != CHAIN:
            return [_Edge(self._tail(ref), self._head(node.id, rid), self.records[rid]) for ref, rid in zip(node.refs, node.reads)]
        edges = []
        for out in node.outs:
            for rid in out.reads:
                tail = self._tail(ref_of[rid]) if rid in ref_of else rid  # else an earlier inner record of the step
                edges.append(_Edge(tail, out.id, self.records[rid]))
        return edges

    # nodes

    def _declared_nodes(self, graph) -> None:
        """Inputs at the top; a param used by one group only sits inside that group's cluster."""
        pipeline = self.analysis.pipeline
        for record in self.trace.records:
            if record.op == "input":
                self.marks.add("input")
                graph.node(
                    record.id, _declared_label(record, pipeline.inputs[record.id], "input"), **self._about(record), **STYLES["input"]
                )

    def _param_home(self, name: str) -> str | None:
        groups = {self.group_of.get(node.id) for node in self.analysis.users(name)}
        return groups.pop() if len(groups) == 1 else None

    def _param_node(self, graph, name: str) -> None:
        self.marks.add("param")
        record = self.records[name]
        graph.node(name, _declared_label(record, self.analysis.pipeline.params[name], "param"), **self._about(record), **STYLES["param"])

    def _step_nodes(self, graph) -> None:
        params = [r.id for r in self.trace.records if r.op == "param" and r.id not in self.fold]
        homes = {p: self._param_home(p) for p in params}
        for p in params:
            if homes[p] is None:
                self._param_node(graph, p)
        clusters: dict[tuple, list[str]] = {}  # (folded?, group) -> steps, in order of first appearance
        for step_id in self.nodes:
            key = self.fold.get(step_id)
            clusters.setdefault((True, key) if key else (False, self.group_of.get(step_id)), []).append(step_id)
        for n, ((folded, group), step_ids) in enumerate(clusters.items()):
            if folded:
                self._collapsed_node(graph, group, step_ids)
            elif group is None:
                for step_id in step_ids:
                    self._step_node(graph, step_id)
            else:
                self.marks.add("group")
                with graph.subgraph(name=f"cluster_group_{n}") as sub:
                    sub.attr(label=_html(f"<B>{_esc(group)}</B>"), fontname=FONT, fontsize="12", labeljust="l", **CLUSTER_GROUP)
                    for p in params:
                        if homes[p] == group:
                            self._param_node(sub, p)
                    for step_id in step_ids:
                        self._step_node(sub, step_id)

    def _step_node(self, graph, step_id: str) -> None:
        node = self.nodes[step_id]
        step = node.step
        if node.form == OUTPUTS:
            self._multi_output_node(graph, step, [self.records[out.id] for out in node.outs])
            return
        if node.form == ONE:
            record = self.records[step_id]
            kind = _storage_kind(record)
            self.marks.add(kind)
            label = _step_label(step_id, step.op, step.args(), record, kind, step.note, extra=node_rows(step, record))
            graph.node(step_id, label, **self._about(record), **STYLES[kind])
            return
        self.marks.add("composite")
        with graph.subgraph(name=f"cluster_step_{node.index}") as sub:
            title = f"<B>{_esc(step_id)}</B> · {_esc(_op_text(step.op, step.args()))}"
            if step.note:
                title += f'<BR/><FONT POINT-SIZE="9"><I>{_esc(step.note)}</I></FONT>'
            sub.attr(label=_html(title), fontname=FONT, fontsize="11", labeljust="l", **CLUSTER_COMPOSITE)
            for out in node.outs:
                record = self.records[out.id]
                kind = _storage_kind(record)
                self.marks.add(kind)
                label = _step_label(out.id.split("/", 1)[1], out.op, [], record, kind, None, small=True)
                sub.node(out.id, label, **self._about(record), **STYLES[kind])

    def _multi_output_node(self, graph, step, records: list[TensorRecord]) -> None:
        """A step with several outputs (split) is one node; each output leaves it on its own edge, named."""
        kinds = {_storage_kind(r) for r in records}
        kind = kinds.pop() if len(kinds) == 1 else "step"
        self.marks.add(kind)
        made = "views of " + _esc(records[0].view_of) if kind == "view" else human_bytes(sum(r.nbytes for r in records))
        lines = [
            f'<FONT POINT-SIZE="12"><B>{_esc(step.id)}</B></FONT>',
            f'<FONT COLOR="{MUTED}">{_esc(_op_text(step.op, step.args()))}</FONT>',
            f'<FONT POINT-SIZE="9" COLOR="{MUTED}">→ {_esc(", ".join(r.id for r in records))} · {made}</FONT>',
        ]
        if step.note:
            lines.append(f'<FONT POINT-SIZE="9" COLOR="#555555"><I>{_esc(step.note)}</I></FONT>')
        graph.node(step.id, _rows(lines), tooltip="; ".join(_tooltip(r) for r in records), **STYLES[kind])

    def _collapsed_node(self, graph, group: str, step_ids: list[str]) -> None:
        inside = set(step_ids)
        nodes = [self.nodes[s] for s in step_ids]
        ins = [self.records[rid] for node in nodes for ref, rid in zip(node.inputs, node.reads) if ref not in inside]
        outs = [self.records[self.analysis.record_of(s)] for s in step_ids if self._used_outside(s, inside)]
        params = self.folded_params[group]
        folded = _count(len(step_ids), "step") + (" and " + _count(params, "param") if params else "")
        shapes = [
            _esc(_shapes(_unique(ins), "symbolic") + " → " + _shapes(_unique(outs), "symbolic")),
            f'<FONT POINT-SIZE="9" COLOR="{MUTED}">{_esc(_shapes(_unique(ins), "concrete") + " → " + _shapes(_unique(outs), "concrete"))}</FONT>',
        ]
        repeat = self.repeat_nodes.get(group)
        if repeat is not None:
            self.marks.add("repeat")
            lines = [
                f'<FONT POINT-SIZE="16"><B>×{len(repeat.hidden)}</B></FONT>',
                f"<B>{_esc(repeat.title)}</B>",
                f'<FONT POINT-SIZE="9" COLOR="{MUTED}">{_esc(repeat.about)}</FONT>',
                f'<FONT COLOR="{MUTED}">{folded} folded</FONT>',
            ]
            # the report selects the block's output, the last copy's: its panel visits any copy
            link = self._link(self.analysis.record_of(repeat.block))
            graph.node(self.group_nodes[group], _rows(lines + shapes), **link, **STYLES["repeat"])
            return
        self.marks.add("collapsed")
        blocks = sorted({f"{f.block} ×{f.copies}" for f in self.repeated.values() if f.key in self._covered_by(group)})
        lines = [f"<B>{_esc(group)}</B>", f'<FONT COLOR="{MUTED}">{folded} collapsed</FONT>']
        lines += [f'<FONT COLOR="{MUTED}">{_esc(b)}</FONT>' for b in blocks]
        graph.node(self.group_nodes[group], _rows(lines + shapes), **self._link("group=" + group), **STYLES["collapsed"])

    def _covered_by(self, group: str) -> set[str]:
        """The repeat markers whose every copy this collapsed group holds (a group of one copy,
        ``layers/0``, holds none: it is not ``layers ×4``)."""
        return {
            f.key
            for f in self.repeated.values()
            if self._collapsed_whole(f, self.fold) and self.fold.get(self._first_step(f.shown) or "") == group
        }

    def _used_outside(self, step_id: str, inside: set[str]) -> bool:
        users = {node.id for node in self.analysis.users(step_id)}
        return bool(users - inside) or step_id in self.analysis.outputs

    def _output_nodes(self, graph) -> None:
        for name in self.analysis.outputs:
            self.marks.add("output")
            graph.node(
                _output_node(name),
                _rows([f"<B>{_esc(name)}</B>", f'<FONT POINT-SIZE="9" COLOR="{MUTED}">output</FONT>']),
                **self._link(self.analysis.record_of(name)),
                **STYLES["output"],
            )

    # edges

    def _draw_edge(self, graph, edge: _Edge) -> None:
        record = edge.record
        local = self.local.get(record.id)
        shown = None if local is None or local.concrete == tuple(record.shape) else (self.rank, local)
        if shown is not None:
            self.marks.add("rank")
        attrs = {"label": _shape_label(record, named=record.id in self.analysis.graph.parts, local=shown), **self._about(record)}
        if not record.contiguous:
            self.marks.add("strided")
            attrs.update(style="dashed", color=STRIDED, fontcolor=STRIDED, penwidth="1.4")
        else:
            self.marks.add("contiguous")
            if record.op == "param":  # the param's node shows this shape already: recede
                attrs.update(color="#999999", fontcolor="#777777")
        if record.dtype != "float32":
            self.marks.add("dtype")
        graph.edge(edge.tail, edge.head, **attrs)

    def _sibling_order(self, graph) -> None:
        """Steps of one op that read the same tensor first (q, k and v projections of x; gate and
        up) side by side in the file's order: Graphviz alone may draw v, k, q."""
        for tensor_id in self.records:
            if tensor_id in self.fold:
                continue  # drawn inside a folded or collapsed node
            siblings: dict[str, list[str]] = {}
            for node in self.analysis.users(tensor_id):
                if node.refs[0] != tensor_id or node.id in self.fold:
                    continue
                head = self._head(node.id, node.reads[0])
                if head is not None and head not in sum(siblings.values(), []):
                    siblings.setdefault(node.step.op, []).append(head)
            for heads in siblings.values():
                if len(heads) > 1:
                    with graph.subgraph() as row:
                        row.attr(rank="same")
                        for left, right in zip(heads, heads[1:]):
                            row.edge(left, right, style="invis")

    def _legend(self, graph) -> None:
        rows = [_legend_row(mark, sample, text) for mark, sample, text in LEGEND if mark in self.marks]
        table = (
            '<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2" CELLPADDING="3">'
            '<TR><TD COLSPAN="2" ALIGN="LEFT"><B>legend</B></TD></TR>' + "".join(rows) + "</TABLE>"
        )
        with graph.subgraph(name="legend_rank") as sub:
            sub.attr(rank="sink")
            sub.node("legend", _html(table), shape="box", style="rounded", color="#bbbbbb", fontsize="9", margin="0.05")


def _graph_attrs(trace: Trace, rank: str = "") -> dict[str, str]:
    dims = ", ".join(f"{k}={v}" for k, v in trace.dims.items())
    title = f'<FONT POINT-SIZE="15"><B>{_esc(trace.name)}</B></FONT>' + (
        f'<BR/><FONT POINT-SIZE="10" COLOR="{MUTED}">{_esc(dims)}</FONT>' if dims else ""
    )
    if rank:
        title += f'<BR/><FONT POINT-SIZE="10" COLOR="{RANK}">{_esc(rank)}</FONT>'
    return {
        "label": _html(title),
        "labelloc": "t",
        "fontname": FONT,
        "nodesep": "0.35",
        "ranksep": "0.45",
        "newrank": "true",
        "bgcolor": "white",
        "pad": "0.2",
    }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


# '@' cannot occur in a tensor id, and unlike ':' DOT does not read it as a port separator.
def _output_node(name: str) -> str:
    return f"output@{name}"


def _storage_kind(record: TensorRecord) -> str:
    if record.view_of is not None:
        return "view"
    # a layout op's new storage is a copy of its input's data (the memory cost users look for);
    # a compute op's output is new data anyway
    kind = STEP_KINDS.get(record.op)
    return "copy" if kind is not None and kind.copies_data else "step"


# ---------------------------------------------------------------- labels


def _esc(text: Any) -> str:
    # HTML labels: escape markup, and keep newlines of notes as line breaks
    return html.escape(str(text), quote=True).replace("\n", "<BR/>")


def _html(body: str) -> str:
    return f"<{body}>"


def _rows(lines: list[str], padding: int = 1) -> str:
    # One table row per line: <BR/> spacing lets an underscore ('d_model') touch the line below,
    # and the padding keeps edge lines off a label's first character.
    cells = "".join(f"<TR><TD>{line}</TD></TR>" for line in lines)
    return _html(f'<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="{padding}">{cells}</TABLE>')


def _op_text(op: str, args: list[str]) -> str:
    return op + (" " + ", ".join(args) if args else "")


def _step_label(
    name: str, op: str, args: list[str], record: TensorRecord, kind: str, note: str | None, small: bool = False, extra: list[str] = ()
) -> str:
    size = "10" if small else "12"
    lines = [f'<FONT POINT-SIZE="{size}"><B>{_esc(name)}</B></FONT>']
    if _op_text(op, args) != name:  # a composite's inner tensors are named after their op
        lines.append(f'<FONT COLOR="{MUTED}">{_esc(_op_text(op, args))}</FONT>')
    if kind == "view":
        lines.append(f'<FONT POINT-SIZE="9" COLOR="#3f6fb5">view of {_esc(record.view_of)}</FONT>')
    elif kind == "copy":
        lines.append(f'<FONT POINT-SIZE="9" COLOR="#a05f00"><B>copy</B> · {human_bytes(record.nbytes)}</FONT>')
    else:
        lines.append(f'<FONT POINT-SIZE="9" COLOR="{MUTED}">{human_bytes(record.nbytes)}</FONT>')
    if note:
        lines.append(f'<FONT POINT-SIZE="9" COLOR="#555555"><I>{_esc(note)}</I></FONT>')
    return _rows(lines + list(extra))


def _declared_label(record: TensorRecord, decl, kind: str) -> str:
    source = f"init: {decl.init}" if decl.init else ("tokens" if decl.tokens is not None else "values")
    lines = [f"<B>{_esc(record.id)}</B>"]
    if kind == "param":
        lines.append(f"{_esc(record.symbolic)}  {_concrete(record)}")
    lines.append(f'<FONT POINT-SIZE="9" COLOR="{MUTED}">{_esc(kind + " · " + source)} · {human_bytes(record.nbytes)}</FONT>')
    if decl.note:
        lines.append(f'<FONT POINT-SIZE="9" COLOR="#555555"><I>{_esc(decl.note)}</I></FONT>')
    return _rows(lines)


def _concrete(record: TensorRecord) -> str:
    return "[" + ", ".join(map(str, record.shape)) + "]"


def _shape_label(record: TensorRecord, named: bool = False, local: tuple | None = None) -> str:
    lines = [_esc(record.symbolic), f'<FONT POINT-SIZE="8">{_concrete(record)}</FONT>']
    if named:  # one of a step's several outputs: say which
        lines.insert(0, f"<B>{_esc(record.id)}</B>")
    if record.dtype != "float32":
        lines.append(f'<FONT POINT-SIZE="8"><B>{_esc(record.dtype)}</B></FONT>')
    if local is not None:  # (rank, LocalTensor): what that rank holds
        rank, tensor = local
        shape = "[" + ", ".join(map(str, tensor.concrete)) + "]"
        lines.append(f'<FONT POINT-SIZE="8" COLOR="{RANK}">rank {rank}: {_esc(tensor.symbolic)} {shape}</FONT>')
    return _rows(lines, padding=2)


def _tooltip(record: TensorRecord) -> str:
    layout = "contiguous" if record.contiguous else "non-contiguous"
    parts = [
        f"{record.id}: {record.symbolic} {_concrete(record)} {record.dtype}",
        f"stride {tuple(record.stride)}, offset {record.storage_offset}, {layout}",
    ]
    if record.view_of:
        parts.append(f"view of {record.view_of}")
    return "; ".join(parts)


def _unique(records: list[TensorRecord]) -> list[TensorRecord]:
    return list({r.id: r for r in records}.values())


def _shapes(records: list[TensorRecord], which: str) -> str:
    texts = [r.symbolic if which == "symbolic" else _concrete(r) for r in records]
    return ", ".join(texts) or "∅"


def _legend_row(mark: str, sample: str, text: str) -> str:
    if mark in STYLES:
        style = STYLES[mark]
        cell = f'<TD BGCOLOR="{style["fillcolor"]}" BORDER="1" COLOR="{style["color"]}" STYLE="rounded">{_esc(sample)}</TD>'
    elif mark == "group":
        cell = f'<TD BGCOLOR="{CLUSTER_GROUP["fillcolor"]}" BORDER="1" COLOR="{CLUSTER_GROUP["color"]}" STYLE="rounded">{_esc(sample)}</TD>'
    elif mark == "composite":
        cell = f'<TD BGCOLOR="{CLUSTER_COMPOSITE["fillcolor"]}" BORDER="1" COLOR="{CLUSTER_COMPOSITE["color"]}" STYLE="rounded">{_esc(sample)}</TD>'
    elif mark == "rank":
        cell = f'<TD><FONT COLOR="{RANK}">───▶ {_esc(sample)}</FONT></TD>'
    elif mark == "strided":
        cell = f'<TD><FONT COLOR="{STRIDED}">- - -▶ {_esc(sample)}</FONT></TD>'
    elif mark == "contiguous":
        cell = f"<TD>───▶ {_esc(sample)}</TD>"
    else:
        cell = f"<TD><B>{_esc(sample)}</B></TD>"
    return f'<TR>{cell}<TD ALIGN="LEFT">{_esc(text)}</TD></TR>'

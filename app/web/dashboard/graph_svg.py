"""The geometry of a workflow's graph, drawn on the server as SVG
(``templates/_workflow_graph.html``): no layout library and nothing from
outside, so the page works offline and a hostile step name is only ever
text that Jinja escapes.

A small layered layout, left to right: each job goes in the column after
its deepest dependency (longest-path layering), so every edge points
rightwards; within a column the jobs are ordered by the mean row of their
dependencies (the barycenter heuristic, a few sweeps), which keeps most
edges short and uncrossed for the graphs people write by hand."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobdeck.store import JobRecord

MAX_SVG_NODES = 200
"""Above this many jobs the page shows the table only: a drawing of 1,000
boxes is unreadable and slow to re-render at every poll."""
NODE_W, NODE_H = 150, 34
GAP_X, GAP_Y = 60, 14
PAD = 12
LABEL_CHARS = 18
SWEEPS = 4


@dataclass(frozen=True)
class Node:
    job_id: int
    label: str
    """The step name, shortened to fit its box (``name`` is the whole one)."""
    name: str
    state: str
    """The state's slug (``Tab.slug``), which picks its colour."""
    x: float
    y: float


@dataclass(frozen=True)
class Edge:
    path: str
    """SVG path data, from the dependency's right side to the dependent's left."""
    state: str
    """The dependency's state slug: a finished dependency's edge is drawn as done."""


@dataclass(frozen=True)
class Drawing:
    width: float
    height: float
    nodes: list[Node]
    edges: list[Edge]
    node_w: int = NODE_W
    node_h: int = NODE_H


def layers(ids: Sequence[int], edges: Sequence[tuple[int, int]]) -> dict[int, int]:
    """Each job's column: 0 without dependencies, else one more than its
    deepest dependency's. ``edges`` are (job, the job it depends on); the
    graph is acyclic (``jobdeck.jobs.workflows`` refuses cycles), and an edge to a
    job outside ``ids`` is ignored."""
    known = set(ids)
    deps: dict[int, list[int]] = {i: [] for i in ids}
    for job, dep in edges:
        if job in known and dep in known:
            deps[job].append(dep)
    depth: dict[int, int] = {}
    for start in ids:
        stack = [start]
        while stack:
            node = stack[-1]
            if node in depth:
                stack.pop()
                continue
            todo = [d for d in deps[node] if d not in depth]
            if todo:
                stack.extend(todo)
                continue
            depth[node] = 1 + max((depth[d] for d in deps[node]), default=-1)
            stack.pop()
    return depth


def order_columns(depth: dict[int, int], edges: Sequence[tuple[int, int]]) -> list[list[int]]:
    """The jobs of each column, top to bottom: first by id, then each job
    moved towards the mean row of its neighbours in the previous column
    (down sweeps) and the next one (up sweeps)."""
    columns: list[list[int]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for job in sorted(depth):
        columns[depth[job]].append(job)
    parents: dict[int, list[int]] = {}
    children: dict[int, list[int]] = {}
    for job, dep in edges:
        if job in depth and dep in depth:
            parents.setdefault(job, []).append(dep)
            children.setdefault(dep, []).append(job)
    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        indices = range(1, len(columns)) if down else range(len(columns) - 2, -1, -1)
        for i in indices:
            neighbours = parents if down else children
            ref = columns[i - 1] if down else columns[i + 1]
            row = {job: r for r, job in enumerate(ref)}
            place = {job: (_centre(neighbours.get(job, []), row, r), r) for r, job in enumerate(columns[i])}
            columns[i].sort(key=place.__getitem__)
    return columns


def _centre(near: list[int], row: dict[int, int], own: int) -> float:
    """The mean row of a job's neighbours in the reference column; its own
    row when it has none there."""
    rows = [row[n] for n in near if n in row]
    return sum(rows) / len(rows) if rows else float(own)


def shorten(name: str, width: int = LABEL_CHARS) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def draw(jobs: Sequence[JobRecord], edges: Sequence[tuple[int, int]], slugs: dict[int, str]) -> Drawing:
    """The drawing of a workflow: ``slugs`` gives each job's state slug
    (the dashboard's tab for it, so a scheduled job looks scheduled)."""
    by_id = {j.id: j for j in jobs}
    depth = layers(list(by_id), edges)
    columns = order_columns(depth, edges)
    tallest = max((len(c) for c in columns), default=0)
    height = 2 * PAD + tallest * NODE_H + max(0, tallest - 1) * GAP_Y
    where: dict[int, tuple[float, float]] = {}
    nodes: list[Node] = []
    for c, column in enumerate(columns):
        x = PAD + c * (NODE_W + GAP_X)
        used = len(column) * NODE_H + max(0, len(column) - 1) * GAP_Y
        top = (height - used) / 2
        for r, job_id in enumerate(column):
            y = top + r * (NODE_H + GAP_Y)
            where[job_id] = (x, y)
            job = by_id[job_id]
            name = job.step or f"#{job.id}"
            nodes.append(Node(job_id, shorten(name), name, slugs[job_id], x, y))
    lines = [Edge(_curve(where[dep], where[job]), slugs[dep]) for job, dep in edges if job in where and dep in where]
    width = 2 * PAD + len(columns) * NODE_W + max(0, len(columns) - 1) * GAP_X
    return Drawing(float(width), float(height), nodes, lines)


def _curve(start: tuple[float, float], end: tuple[float, float]) -> str:
    """A cubic curve from the right middle of one box to just before the
    left middle of the other (the arrowhead's marker fills the gap)."""
    x1, y1 = start[0] + NODE_W, start[1] + NODE_H / 2
    x2, y2 = end[0] - 6, end[1] + NODE_H / 2
    bend = (x2 - x1) / 2
    return f"M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 - bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"

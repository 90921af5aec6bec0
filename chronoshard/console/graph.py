"""Where a workflow's tasks go in its picture: a layered layout of the DAG, pure.

A workflow is small enough (tens to a few thousand tasks) to lay out on every page view.
Each task goes in the layer of its longest path from a root (so every edge points down
at least one layer); within a layer, tasks are ordered by the mean position of their
parents (one barycenter pass, which untangles the common fan-out/fan-in shapes) and
then by ref, so the same workflow always draws the same. The result is coordinates
only; :mod:`chronoshard.console.views` draws it as SVG.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NODE_WIDTH = 168
NODE_HEIGHT = 44
GAP_X = 28
GAP_Y = 56
MARGIN = 16


@dataclass(frozen=True)
class Placed:
    ref: str
    layer: int
    x: float
    y: float

    @property
    def centre_x(self) -> float:
        return self.x + NODE_WIDTH / 2


@dataclass(frozen=True)
class Layout:
    nodes: dict[str, Placed]
    edges: tuple[tuple[str, str], ...]
    width: float
    height: float


def layers(refs: Sequence[str], edges: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Each ref's layer: 0 for a root, else one more than its deepest parent's. Raises
    ValueError on a cycle or an edge naming an unknown ref (the server refuses both, so
    this is a broken answer)."""
    known = set(refs)
    children: dict[str, list[str]] = {ref: [] for ref in refs}
    waiting = dict.fromkeys(refs, 0)
    for parent, child in edges:
        if parent not in known or child not in known:
            raise ValueError(f"edge {parent!r} -> {child!r} names an unknown task")
        children[parent].append(child)
        waiting[child] += 1
    layer = dict.fromkeys(refs, 0)
    ready = [ref for ref in refs if waiting[ref] == 0]
    done = 0
    while ready:
        ref = ready.pop()
        done += 1
        for child in children[ref]:
            layer[child] = max(layer[child], layer[ref] + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if done != len(refs):
        raise ValueError("the workflow's edges have a cycle")
    return layer


def layout(refs: Sequence[str], edges: Sequence[tuple[str, str]]) -> Layout:
    """Coordinates for every ref (top-left corner of its box) and the picture's size."""
    layer_of = layers(refs, edges)
    parents: dict[str, list[str]] = {ref: [] for ref in refs}
    for parent, child in edges:
        parents[child].append(parent)
    by_layer: dict[int, list[str]] = {}
    for ref in refs:
        by_layer.setdefault(layer_of[ref], []).append(ref)
    position: dict[str, float] = {}
    nodes: dict[str, Placed] = {}
    widest = max((len(members) for members in by_layer.values()), default=0)
    for depth in sorted(by_layer):

        def barycentre(ref: str) -> tuple[float, str]:
            seen = [position[p] for p in parents[ref] if p in position]
            return (sum(seen) / len(seen) if seen else 0.0, ref)

        members = sorted(by_layer[depth], key=barycentre)
        # Centred: a narrow layer sits under the middle of the widest one.
        offset = (widest - len(members)) * (NODE_WIDTH + GAP_X) / 2
        for index, ref in enumerate(members):
            position[ref] = float(index)
            nodes[ref] = Placed(
                ref,
                depth,
                MARGIN + offset + index * (NODE_WIDTH + GAP_X),
                MARGIN + depth * (NODE_HEIGHT + GAP_Y),
            )
    depth_count = len(by_layer)
    width = 2 * MARGIN + max(widest * (NODE_WIDTH + GAP_X) - GAP_X, 0)
    height = 2 * MARGIN + max(depth_count * (NODE_HEIGHT + GAP_Y) - GAP_Y, 0)
    return Layout(nodes, tuple(edges), width, height)

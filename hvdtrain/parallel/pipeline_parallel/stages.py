"""A Keras model cut into pipeline stages.

A cut goes after a layer, in the model's order (its graph's, inputs to
outputs): every tensor made before the cut and used after it crosses, so a
stage takes the tensors that cross the cut before it and gives those that
cross the cut after it. Most often that is one tensor (the output of a
Sequential model's layer, of a residual block's final add); a residual
connection or a mask that the model computes from its inputs (a
transformer's padding mask) adds its own, and a tensor needed several
stages on passes through the stages between. Each stage is a functional
model over the whole model's layers, sharing their weights.

    cut(model, at=["block_1", "block_3"])   # 3 stages, ending after those layers
    cut(sequential, at=[4, 8])              # layers [0, 4), [4, 8), [8, ...)
    cut(model, stages=4)                    # 4 stages of about equal parameters

A layer that runs on both sides of a cut (a tied embedding and output head)
is held by every stage that calls it; the Pipeline sums its gradients over
them each step, so that their copies stay the same (Megatron-LM's way). Its
state of its own (a batch normalization's moving statistics) would not stay
the same: such a cut is refused.
"""

import dataclasses
import math

import keras

from hvdtrain.errors import UsageError

__all__ = ["Stages", "boundaries", "cut"]

# Balanced cuts: within this share of the parameters, the fewest tensors cross.
_BALANCE = 0.1


def cut(model, at=None, stages=None):
    """`model` cut into stages.

    Args:
        model: A built Sequential or functional `keras.Model`.
        at: Where stages end: names of the layers after which each stage but
            the last ends, or, for a Sequential model, indices of the first
            layer of each stage but the first. None: choose `stages` stages
            of about equal parameters.
        stages: The number of stages, when `at` is None.

    Returns:
        `Stages`: a list of functional `keras.Model`s, one per stage, in
        order, that also holds `model`.

    Raises:
        UsageError: If `model` has no graph to cut (a subclassed model), a
            cut point is not a layer of it, leaves a stage empty, or cut
            points are out of order; a layer with state of its own (moving
            statistics) runs on both sides of a cut, or a sparse or ragged
            tensor crosses one; or `stages` exceeds the layers it can be
            cut after.
    """
    graph = _graph_of(model)
    points = _cut_points(graph)
    if at is None:
        if stages is None:
            raise UsageError("cut: give the cut points (at=...) or the number of stages")
        chosen = _balanced(graph, points, stages)
    else:
        chosen = [_point_at(graph, model, points, point) for point in at]
        if [p.position for p in chosen] != sorted({p.position for p in chosen}):
            raise UsageError(f"pipeline cut points {list(at)} are not in the model's order or "
                             "repeat one: list each once, from the inputs to the outputs")
    models = Stages(model)
    inputs = graph.input   # as structured as the model's own (a tensor, a list, a dict)
    given = keras.tree.flatten(inputs)
    for point in [*chosen, None]:
        outputs = graph.output if point is None else _one_or_list(point.crossing)
        # A tensor passing through (it crosses the cut before and after this
        # stage) leaves by an identity: Keras's model cannot give an input back.
        outputs = keras.tree.map_structure(
            lambda t, given=given: keras.layers.Identity()(t) if any(t is g for g in given)
            else t, outputs)
        models.append(keras.Model(inputs, outputs, name=f"stage_{len(models)}"))
        if point is not None:
            inputs = _one_or_list(point.crossing)
            given = list(point.crossing)
    return models


class Stages(list):
    """The stage models `cut` returns, in order, and the `model` they were
    cut from (what the Pipeline exports)."""

    def __init__(self, model):
        super().__init__()
        self.model = model


def boundaries(model):
    """[(the layer a stage can end after, the tensors that cross there)],
    from the inputs on."""
    return [(p.layer, list(p.crossing)) for p in _cut_points(_graph_of(model)) if p.usable()]


@dataclasses.dataclass(frozen=True)
class _Point:
    position: int         # of the layer's call in the model's order
    layer: object
    crossing: tuple       # the tensors made before the cut and used after it
    parameters: int       # of the layers called before it
    named: bool           # after the layer's first call: the cut its name asks for
    splits: object        # a layer with state of its own called on both sides, or None

    def usable(self):
        return self.splits is None and not any(_not_dense(t) for t in self.crossing)


def _cut_points(graph):
    """[_Point] after each layer's call but the last, in the model's order."""
    nodes = _ordered_nodes(graph)
    outputs = {id(t) for t in keras.tree.flatten(graph.output)}
    calls = {}
    for position, node in enumerate(nodes):
        calls.setdefault(id(node.operation), []).append(position)
    # A layer called on both sides of a cut is held by both stages: its
    # trainable weights are kept the same (their gradients summed), its own
    # state (non-trainable weights) would not be.
    stateful = [(node.operation, calls[id(node.operation)]) for node in nodes
                if getattr(node.operation, "non_trainable_weights", None)
                and len(calls[id(node.operation)]) > 1]
    points, layers = [], {}
    for position, node in enumerate(nodes[:-1]):
        layers.setdefault(id(node.operation), node.operation)
        if isinstance(node.operation, keras.layers.InputLayer):
            continue
        before, after = nodes[:position + 1], nodes[position + 1:]
        used = {id(t) for n in after for t in n.input_tensors} | outputs
        crossing = tuple(t for n in before for t in n.outputs if id(t) in used)
        if all(id(t) in outputs for t in crossing) and len(crossing) == len(outputs):
            continue   # every output made: nothing left for a stage after it
        splits = next((layer for layer, at in stateful if at[0] <= position < at[-1]), None)
        points.append(_Point(position, node.operation, crossing,
                             sum(math.prod(w.shape) for layer in layers.values()
                                 for w in getattr(layer, "weights", ())),
                             calls[id(node.operation)][0] == position, splits))
    return points


def _ordered_nodes(graph):
    return [node for _, level in sorted(graph._nodes_by_depth.items(), reverse=True)
            for node in level]


def _graph_of(model):
    if isinstance(model, keras.Sequential):
        if not model.built or getattr(model, "_functional", None) is None:
            raise UsageError("cut: build the Sequential model first (start it with a "
                             "keras.Input) so that its stages know their input shapes")
        return model._functional
    if not hasattr(model, "_nodes_by_depth") or not model.inputs:
        raise UsageError(f"cut: {type(model).__name__} is not a Sequential or functional "
                         "model, whose layers' graph can be cut; give the stages as a list "
                         "of models instead")
    return model


def _point_at(graph, model, points, point):
    """The cut after the layer `point` names (its first call)."""
    if isinstance(point, int) and not isinstance(point, bool):
        if not isinstance(model, keras.Sequential):
            raise UsageError(f"pipeline cut point {point}: cut a functional model at layer "
                             "names (indices cut Sequential models)")
        if not 0 < point < len(model.layers):
            raise UsageError(f"pipeline cut point {point} leaves a stage empty: the "
                             f"Sequential model's indices run from 1 to "
                             f"{len(model.layers) - 1}")
        name = model.layers[point - 1].name
    else:
        name = point
    try:
        layer = graph.get_layer(name)
    except ValueError:
        raise UsageError(f"pipeline cut point {name!r} is not a layer of model "
                         f"{model.name}; its layers: {_names(graph.layers)}") from None
    found = next((p for p in points if p.layer is layer and p.named), None)
    if found is None:
        raise UsageError(f"pipeline cut point {name!r} leaves the last stage empty: cut "
                         f"after one of {_usable_names(points)}")
    for tensor in found.crossing:
        if _not_dense(tensor):
            raise UsageError(
                f"the model cannot be cut after layer {name!r}: the output of layer "
                f"{tensor._keras_history.operation.name!r}, a "
                f"{'sparse' if tensor.sparse else 'ragged'} tensor, would cross it, and only "
                f"dense tensors pass between stages; cut after one of {_usable_names(points)}")
    if found.splits is not None:
        layer = found.splits
        raise UsageError(
            f"the model cannot be cut after layer {name!r}: layer {layer.name!r} runs on both "
            f"sides of it and keeps state of its own "
            f"({_names(layer.non_trainable_weights, attribute='path')}) that each stage would "
            f"update alone; cut where its calls stay in one stage: after one of "
            f"{_usable_names(points)}")
    return found


def _not_dense(tensor):
    return getattr(tensor, "sparse", False) or getattr(tensor, "ragged", False)


def _usable_names(points):
    return _names(p.layer for p in points if p.named and p.usable()) or "no layer (by name)"


def _balanced(graph, points, stages):
    """`stages` - 1 cut points that split the parameters most evenly (to
    _BALANCE of them, then with the fewest tensors crossing)."""
    if not (isinstance(stages, int) and stages >= 1):
        raise UsageError(f"cut: stages must be a positive integer, got {stages!r}")
    usable = [p for p in points if p.usable()]
    if stages - 1 > len(usable):
        raise UsageError(f"the model can be cut into at most {len(usable) + 1} pipeline "
                         f"stages, not {stages} (it can be cut after: "
                         f"{_names(p.layer for p in usable) or 'no layer'})")
    total = sum(math.prod(w.shape) for w in graph.weights) or 1
    chosen = []
    for k in range(1, stages):
        free = [i for i in range(len(usable)) if (not chosen or i > chosen[-1])
                and len(usable) - i >= stages - k]
        off = {i: abs(usable[i].parameters - k * total / stages) / total for i in free}
        best = min(off.values())
        chosen.append(min((i for i in free if off[i] <= best + _BALANCE),
                          key=lambda i: (len(usable[i].crossing), off[i])))
    return [usable[i] for i in chosen]


def _one_or_list(tensors):
    return tensors[0] if len(tensors) == 1 else list(tensors)


def _names(items, attribute="name"):
    return ", ".join(dict.fromkeys(getattr(item, attribute) for item in items))

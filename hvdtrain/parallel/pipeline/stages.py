"""A Keras model cut into pipeline stages.

A stage boundary is a single tensor that every path from the model's inputs
to its outputs crosses: the output of a layer of a Sequential model, or of a
functional model's layer such as a residual block's final add. Each stage is
a functional model over the whole model's layers (sharing their weights),
from one boundary to the next.

    cut(model, at=["block_1", "block_3"])   # 3 stages, ending at those layers
    cut(sequential, at=[4, 8])              # layers [0, 4), [4, 8), [8, ...)
    cut(model, stages=4)                    # 4 stages of about equal parameters

A layer that runs on both sides of a cut (a tied embedding and output head)
is held by every stage that calls it; the Pipeline sums its gradients over
them each step, so that their copies stay the same (Megatron-LM's way).
"""

import math

import keras

from hvdtrain.errors import UsageError

__all__ = ["Stages", "boundaries", "cut"]


def cut(model, at=None, stages=None):
    """`model` cut into stages.

    Args:
        model: A built Sequential or functional `keras.Model`.
        at: Where stages end: names of the layers whose output ends each
            stage but the last, or, for a Sequential model, indices of the
            first layer of each stage but the first. None: choose `stages`
            stages of about equal parameters.
        stages: The number of stages, when `at` is None.

    Returns:
        `Stages`: a list of functional `keras.Model`s, one per stage, in
        order, that also holds `model`.

    Raises:
        UsageError: If `model` has no graph to cut (a subclassed model), a
            cut point is not a layer of it, does not cut it in two (a
            skip connection crosses it), leaves a stage empty, or cut
            points are out of order; or `stages` exceeds the points where
            it can be cut.
    """
    graph = _graph_of(model)
    counted = _cut_points(graph)
    points = [tensor for tensor, _ in counted]
    if at is None:
        if stages is None:
            raise UsageError("cut: give the cut points (at=...) or the number of stages")
        ends = _balanced(graph, counted, stages)
    else:
        ends = [_boundary(graph, model, points, point) for point in at]
    positions = [[id(p) for p in points].index(id(end)) for end in ends]
    if positions != sorted(set(positions)):
        raise UsageError(f"pipeline cut points {list(at)} are not in the model's order or "
                         "repeat one: list each once, from the inputs to the outputs")
    inputs = graph.input   # as structured as the model's own (a tensor, a list, a dict)
    models = Stages(model)
    for end in [*ends, None]:
        outputs = graph.output if end is None else end
        models.append(keras.Model(inputs, outputs, name=f"stage_{len(models)}"))
        inputs = outputs
    return models


class Stages(list):
    """The stage models `cut` returns, in order, and the `model` they were
    cut from (what the Pipeline exports)."""

    def __init__(self, model):
        super().__init__()
        self.model = model


def boundaries(model):
    """The tensors at which `model` can be cut, from the inputs on: each the
    output of a layer, crossed by every path to the outputs."""
    return [tensor for tensor, _ in _cut_points(_graph_of(model))]


def _cut_points(graph):
    """[(boundary tensor, parameters before it)], in the model's order."""
    nodes = [node for _, level in sorted(graph._nodes_by_depth.items(), reverse=True)
             for node in level]
    outputs = {id(t) for t in graph.outputs}
    found = []
    for position, node in enumerate(nodes[:-1]):
        if (len(node.outputs) != 1 or id(node.outputs[0]) in outputs
                or isinstance(node.operation, keras.layers.InputLayer)):
            continue
        before, after = nodes[:position + 1], nodes[position + 1:]
        produced = {id(t) for n in before for t in n.outputs}
        crossing = {id(t) for n in after for t in n.input_tensors if id(t) in produced}
        crossing |= produced & outputs
        if crossing != {id(node.outputs[0])}:
            continue
        layers = {id(n.operation): n.operation for n in before}.values()
        found.append((node.outputs[0],
                      sum(math.prod(w.shape) for layer in layers
                          for w in getattr(layer, "weights", ()))))
    return found


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


def _boundary(graph, model, points, point):
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
                         f"{model.name}; its layers: {_names(graph)}") from None
    for tensor in points:
        if tensor._keras_history.operation is layer:
            return tensor
    raise UsageError(f"the model cannot be cut at layer {name!r}: a skip connection "
                     f"crosses it; layers it can be cut at: {_names(graph, points) or 'none'}")


def _balanced(graph, counted, stages):
    """`stages` - 1 cut points that split the parameters most evenly."""
    points = [tensor for tensor, _ in counted]
    before = [parameters for _, parameters in counted]
    if not (isinstance(stages, int) and stages >= 1):
        raise UsageError(f"cut: stages must be a positive integer, got {stages!r}")
    if stages - 1 > len(points):
        raise UsageError(f"the model can be cut into at most {len(points) + 1} pipeline "
                         f"stages, not {stages} (it can be cut at: "
                         f"{_names(graph, points) or 'nowhere'})")
    total = sum(math.prod(w.shape) for w in graph.weights) or 1
    chosen = []
    for k in range(1, stages):
        free = [i for i in range(len(points)) if i not in chosen
                and (not chosen or i > chosen[-1]) and len(points) - i >= stages - k]
        chosen.append(min(free, key=lambda i: abs(before[i] - k * total / stages)))
    return [points[i] for i in chosen]


def _names(graph, tensors=None):
    if tensors is None:
        return ", ".join(layer.name for layer in graph.layers)
    return ", ".join(t._keras_history.operation.name for t in tensors)

"""Tensor parallelism (Megatron-LM's): layers whose weights are split over
the T ranks of a replica (hvdtrain.layout), each rank computing its part of
every step.

`operators.py` holds the conjugate collectives the layers are made of;
`weights.py` each rank's part of a whole weight; `dense.py`, `attention.py`
and `embedding.py` the layers, each a split Keras layer that exports to it;
`loss.py` the cross-entropy on logits split by vocabulary. Their gradients
are reduced over the data-parallel group with the rest (parallel/data_parallel).
Depends on layout, errors and parallel; used by the public layers facade.
"""

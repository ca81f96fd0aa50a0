"""The README's example script, run as written on every rank of a launch."""

import re

import numpy as np

from launch import REPO
from ranked.support import gathered


def test_the_readmes_script_trains_alike_on_every_rank_and_rank_0_saves(shared_tmp_path,
                                                                       monkeypatch):
    (script,) = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(),
                           re.MULTILINE | re.DOTALL)
    monkeypatch.chdir(shared_tmp_path)
    namespace = {"__name__": "__main__"}
    exec(compile(script, "README.md", "exec"), namespace)

    model, x, y = namespace["model"], namespace["x"], namespace["y"]
    rank0, rank1 = gathered([w.tolist() for w in model.get_weights()])
    for a, b in zip(rank0, rank1, strict=True):
        np.testing.assert_array_equal(a, b)
    accuracy = np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y)
    assert accuracy > 0.9, accuracy
    assert (shared_tmp_path / "example.keras").is_file()

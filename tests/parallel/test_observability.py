"""hvdtrain's --timeline_steps refused under horovodrun's own timeline (what a
run shows is checked in tests/ranked/test_observability.py).

Own launches: horovodrun's --timeline-filename, set before Horovod starts."""

import re

from launch import horovodrun, rank_lines


def test_timeline_steps_and_horovodruns_timeline_are_refused_together(tmp_path):
    result = horovodrun(["--timeline-filename", tmp_path / "t.json", "hvdtrain", "train",
                         "--timeline_steps=1:2", f"--model_dir={tmp_path}"])
    assert result.returncode != 0
    errors = [text for _, text in rank_lines(result.stderr) if "hvdtrain: error:" in text]
    assert len(errors) == 2 and re.search(
        r"horovodrun already records a timeline to \S+t.json for the whole run", errors[0])

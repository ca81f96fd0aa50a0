"""How the dispatcher reads what rank 0 of a ranked launch writes (tests/harness/dispatch.py)."""

from harness.dispatch import CompleteLines


def test_a_line_is_read_once_it_is_whole(tmp_path):
    path = tmp_path / "results.jsonl"
    lines = CompleteLines(path)
    with open(path, "a") as writer:
        writer.write('{"event": "start"}\n{"event": "rep')
        writer.flush()
        assert lines.new() == ['{"event": "start"}']
        assert lines.new() == []
        writer.write('ort", "report": "é"}\n')
        writer.flush()
        assert lines.new() == ['{"event": "report", "report": "é"}']
        assert lines.new() == []
    lines.close()

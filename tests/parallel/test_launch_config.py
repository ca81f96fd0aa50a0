"""A worker checks the --config-file its horovodrun was given: horovodrun
ignores unknown keys and passes wrong-typed values on, so the job starts
regardless; one process says so in one line.
Own launches: what horovodrun reads from its --config-file."""

from launch import horovodrun, rank_lines


def test_a_misspelt_key_in_horovodruns_config_is_named_once_by_a_worker(tmp_path):
    (tmp_path / "horovodrun.cfg").write_text("params:\n  fusion_treshold_mb: 32\n")
    # A relative path, as horovodrun was given it: read from horovodrun's directory.
    result = horovodrun(["--config-file", "horovodrun.cfg", "hvdtrain", "train", "--dry_run"],
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [(rank, text) for rank, text in rank_lines(result.stdout + result.stderr)
                if text.startswith("hvdtrain: warning")]
    assert warnings == [(0, f"hvdtrain: warning: {tmp_path / 'horovodrun.cfg'}: unknown key "
                            "'params.fusion_treshold_mb', which horovodrun ignores; did you mean "
                            "'params.fusion_threshold_mb'? (this run goes on as horovodrun read "
                            "the file; fix it for the next launch)")]
    assert len([text for _, text in rank_lines(result.stdout) if "dry run" in text]) == 2

"""Bad data found while training at np=2: the rank that reads it names it
(the data sources' other tests are in tests/ranked/test_data_sources.py).

Own launches: one rank exits mid-training while the other learns of it as a lost peer."""

from launch import REPO, horovodrun, rank_lines
from sample_files import write_images


def _train(recipe, data_dir, tmp_path):
    return horovodrun(["hvdtrain", "train", f"--recipe={REPO / 'tests' / 'recipes' / recipe}",
                       f"--data_dir={data_dir}", f"--model_dir={tmp_path / 'model'}"], timeout=120)


def test_an_image_damaged_inside_is_named_by_the_rank_that_reads_it(tmp_path):
    root = write_images(tmp_path / "images", per_class=4)
    bad = tmp_path / "images" / "class1" / "3.png"  # rank 1's; its header and end are whole
    content = bytearray(bad.read_bytes())
    content[content.find(b"IDAT") + 6] ^= 0xFF
    bad.write_bytes(bytes(content))
    result = _train("images.py", root, tmp_path)
    output = result.stdout + result.stderr
    errors = {rank: text for rank, text in rank_lines(output) if "hvdtrain: error:" in text}
    # Found while training: the other rank stops, saying why, if it can before the launcher ends it.
    line = f"corrupt image {bad} (Invalid PNG data, size 77); replace or remove it"
    assert errors[1] == f"hvdtrain: error: {line}", output[-3000:]
    # ... with that rank's own words.
    assert errors.get(0) in (None, f"hvdtrain: error: stopped because rank 1 failed: {line}"), \
        output[-3000:]
    # The launcher names the first rank to fail, and ends with its status.
    assert "horovodrun: rank 1 exited with status 2" in output, output[-3000:]
    assert result.returncode == 2 and "Traceback" not in output, output[-3000:]

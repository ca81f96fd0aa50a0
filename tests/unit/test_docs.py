"""The documentation: docs/ builds as a site with mkdocs --strict (a broken
link or anchor, or a page missing from the navigation, fails), and the
README's links into it lead to pages."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from launch import REPO


def _build(root, site):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=root, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))


def test_the_docs_build_strictly(tmp_path):
    result = _build(REPO, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "architecture" / "index.html").exists()


@pytest.mark.parametrize("fault, message", [
    ("[the data](nowhere.md)", "nowhere.md"),
    ("[the data](data.md#no-such-heading)", "no-such-heading"),
    (None, "not included in the \"nav\""),
], ids=["broken link", "broken anchor", "page left out of the navigation"])
def test_a_broken_link_or_a_lost_page_fails_the_build(tmp_path, fault, message):
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "mkdocs.yml", copy)
    shutil.copytree(REPO / "docs", copy / "docs")
    if fault:
        with open(copy / "docs" / "running.md", "a") as page:
            page.write(f"\nSee {fault}.\n")
    else:
        (copy / "docs" / "extra.md").write_text("# A page nobody links\n")
    result = _build(copy, tmp_path / "site")
    assert result.returncode != 0 and message in result.stderr, result.stderr[-3000:]


def test_the_readmes_links_lead_to_pages():
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 10
    for link in links:
        assert (REPO / link).is_file(), link
    assert len(readme.splitlines()) <= 150   # a landing page; the rest lives in docs/

"""Every picture the README, RESULTS.md and the published reports show is committed beside them."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "benchmarks" / "results").rglob("*.md"))]
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_linked_image_exists(doc):
    missing = [link for link in IMAGE.findall(doc.read_text())
               if "://" not in link and not (doc.parent / link).is_file()]
    assert not missing, f"{doc.relative_to(ROOT)} links images that are not in the tree: {missing}"


def test_the_check_sees_the_published_reports():
    assert len(DOCS) >= 4 and any(d.name == "report.md" for d in DOCS)

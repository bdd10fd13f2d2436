"""The docs site builds with `mkdocs build --strict`, and the README's links lead somewhere.

--strict turns every warning into an error, and mkdocs.yml makes a broken link, a link to a
missing anchor and a page missing from the nav warnings: so any of them fails this test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# [text](target) and [text](<target>), outside code; the target up to a space or `)`.
_LINK = re.compile(r"\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
_CODE = re.compile(r"`[^`\n]*`")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    # Material prints a notice about MkDocs 2.0 at every build unless told not to.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    assert (site / "index.html").is_file()


def readme_links(text: str) -> list[str]:
    """The targets of the Markdown links in `text`, leaving out code blocks and code spans."""
    prose = _CODE.sub("", _FENCE.sub("", text))
    return _LINK.findall(prose)


def test_readme_links_are_found() -> None:
    targets = readme_links("See [a](docs/a.md#x), [b](<docs/b.md>) and `[c](d.md)`.")
    assert targets == ["docs/a.md#x", "docs/b.md"]


def test_every_relative_link_in_the_readme_points_at_a_file() -> None:
    links = readme_links(README.read_text(encoding="utf-8"))
    relative = [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:|#", link)]
    assert relative, "the README links to no page of the docs"
    missing = [link for link in relative if not (ROOT / link.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"

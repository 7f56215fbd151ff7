"""Every relative link of the repository's markdown (README, docs/, results/, research/,
keras-logq/, CHANGELOG) reaches a file that exists, and every ``#anchor`` into a markdown
file names one of its headings (GitHub's anchors: lower case, punctuation dropped, spaces
as hyphens, a repeated heading numbered). Links inside code blocks are not links."""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _markdown_files() -> list:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True,
                            text=True)
    if listed.returncode != 0:  # not a checkout: every markdown file below the root
        return sorted(os.path.relpath(os.path.join(d, f), ROOT)
                      for d, _, files in os.walk(ROOT) for f in files if f.endswith(".md")
                      and "/." not in d)
    return listed.stdout.split()


def _prose(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return re.sub(r"```.*?```", "", f.read(), flags=re.S)


def anchors(path: str) -> set:
    """The ``#anchor`` of each heading of a markdown file, as GitHub makes them."""
    out: set = set()
    for heading in re.findall(r"(?m)^#{1,6} (.+?)\s*#*$", _prose(path)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        base, k = slug, 1
        while slug in out:
            slug, k = f"{base}-{k}", k + 1
        out.add(slug)
    return out


def test_anchors_follow_github():
    assert anchors("docs/layout.md") == {"the-layout-of-the-tree"}


@pytest.mark.parametrize("path", _markdown_files())
def test_every_relative_link_reaches_its_file_and_heading(path):
    broken = []
    for link in LINK.findall(_prose(path)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # https:, mailto:, ...
            continue
        target, _, fragment = link.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), target)) \
            if target else path
        if not os.path.exists(os.path.join(ROOT, resolved)):
            broken.append(f"{link} (no {resolved})")
        elif fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
            broken.append(f"{link} (no heading #{fragment} in {resolved})")
    assert not broken, f"{path}: " + "; ".join(broken)

"""README.md and docs/*.md render as intended: code fences pair up and stand alone, every local image
and every local link exists."""
import glob
import os

import pytest

from markdown_it import MarkdownIt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))


def tokens(page):
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    text = f.read()
  return text, MarkdownIt("commonmark").enable("table").parse(text)


def inline(toks, kind):
  return [c for t in toks if t.type == "inline" for c in (t.children or []) if c.type == kind]


@pytest.mark.parametrize("page", PAGES)
def test_code_fences_pair_up_and_close_on_their_own_line(page):
  text, toks = tokens(page)
  fence_lines = [i for i, line in enumerate(text.splitlines()) if line.lstrip().startswith("```")]
  assert len(fence_lines) % 2 == 0, "an unclosed code fence"
  lines = text.splitlines()
  for i in fence_lines[1::2]:
    assert lines[i].strip() == "```", f"{page} line {i + 1}: a closing fence must stand alone: {lines[i]!r}"
  fences = [t for t in toks if t.type == "fence"]
  assert len(fences) == len(fence_lines) // 2          # the parser sees exactly the fences we wrote
  for t in fences:                                       # and none swallows a heading or an image
    assert "\n## " not in t.content and "![" not in t.content


def test_readme_shows_figures():
  _, toks = tokens("README.md")
  assert inline(toks, "image"), "the README shows figures"


@pytest.mark.parametrize("page", PAGES)
def test_local_images_and_links_resolve(page):
  _, toks = tokens(page)
  here = os.path.dirname(os.path.join(ROOT, page))
  targets = [c.attrs["src"] for c in inline(toks, "image")] + [c.attrs["href"] for c in inline(toks, "link_open")]
  for target in targets:
    path = target.split("#")[0]
    if path and not path.startswith(("http:", "https:", "mailto:")):
      assert os.path.exists(os.path.join(here, path)), f"{page}: {target} does not exist"

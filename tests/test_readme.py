"""README.md and docs/*.md render as intended: code fences pair up and stand alone, every local image
and every local link exists, and a link to a heading names one."""
import glob
import os
import re

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


def slug(heading_text: str) -> str:
  """GitHub's anchor for a heading's rendered text: lower case, every character but letters, digits, '_', '-' and
  spaces dropped, spaces as '-'."""
  return re.sub(r"[^\w\- ]", "", heading_text.lower()).replace(" ", "-")


def anchors(page):
  """The anchors a page's headings get on GitHub (a repeated slug takes -1, -2, … in order)."""
  _, toks = tokens(page)
  seen, out = {}, set()
  for t, nxt in zip(toks, toks[1:]):
    if t.type == "heading_open":
      text = "".join(c.content for c in nxt.children if c.type in ("text", "code_inline"))
      base = slug(text)
      n = seen.get(base, 0)
      seen[base] = n + 1
      out.add(base if n == 0 else f"{base}-{n}")
  return out


def test_slug_is_githubs():
  assert slug("Where issue 29's CPU targets stand") == "where-issue-29s-cpu-targets-stand"
  assert slug("ATAP on pairs of tiles (kernels.split_paired)") == "atap-on-pairs-of-tiles-kernelssplit_paired"
  assert slug("Γ₂ and × ≤ 1.25") == "γ₂-and---125"


@pytest.mark.parametrize("page", PAGES)
def test_links_to_a_heading_name_one(page):
  _, toks = tokens(page)
  here = os.path.dirname(os.path.join(ROOT, page))
  for c in inline(toks, "link_open"):
    target = c.attrs["href"]
    if "#" not in target or target.startswith(("http:", "https:", "mailto:")):
      continue
    path, fragment = target.split("#", 1)
    other = page if not path else os.path.relpath(os.path.normpath(os.path.join(here, path)), ROOT)
    if other.endswith(".md"):
      assert fragment in anchors(other), f"{page}: {target} names no heading of {other}"

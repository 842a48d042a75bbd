"""README.md renders as intended: code fences pair up and stand alone, every local image exists."""
import os

from markdown_it import MarkdownIt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tokens():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  return text, MarkdownIt("commonmark").enable("table").parse(text)


def test_code_fences_pair_up_and_close_on_their_own_line():
  text, toks = tokens()
  fence_lines = [i for i, line in enumerate(text.splitlines()) if line.lstrip().startswith("```")]
  assert len(fence_lines) % 2 == 0, "an unclosed code fence"
  lines = text.splitlines()
  for i in fence_lines[1::2]:
    assert lines[i].strip() == "```", f"README line {i + 1}: a closing fence must stand alone: {lines[i]!r}"
  fences = [t for t in toks if t.type == "fence"]
  assert len(fences) == len(fence_lines) // 2          # the parser sees exactly the fences we wrote
  for t in fences:                                       # and none swallows a heading or an image
    assert "\n## " not in t.content and "![" not in t.content


def test_images_resolve():
  _, toks = tokens()
  images = [c.attrs["src"] for t in toks if t.type == "inline" for c in (t.children or []) if c.type == "image"]
  assert images, "the README shows figures"
  for src in images:
    if not src.startswith("http"):
      assert os.path.exists(os.path.join(ROOT, src)), f"README image {src} does not exist"

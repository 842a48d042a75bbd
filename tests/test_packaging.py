"""Packaging: every package folder is installed, experiments only as attngeo.experiments."""
import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_package_folder_is_listed_and_experiments_is_namespaced():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    tool = tomllib.load(f)["tool"]["setuptools"]
  listed = set(tool["packages"])
  found = {os.path.relpath(d, ROOT).replace(os.sep, ".") for d, _, files in os.walk(os.path.join(ROOT, "attngeo"))
           if "__init__.py" in files}
  assert found <= listed, f"package folders missing from pyproject's packages: {sorted(found - listed)}"
  assert tool["package-dir"] == {"attngeo.experiments": "experiments"}
  assert "experiments" not in listed
  assert os.path.exists(os.path.join(ROOT, "experiments", "__init__.py"))

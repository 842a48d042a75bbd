"""attngeo.files: a run's config.json is read as a JSON object of configs, or refused in one line naming it."""
import pytest

from attngeo import files


@pytest.mark.parametrize("content, kind", [("null", "NoneType"), ("[1, 2]", "list"), ('"text"', "str")])
def test_a_config_json_that_is_not_an_object_is_one_line_naming_it(tmp_path, content, kind):
  """Every command indexes the record by config name: null or a list crashed four sit commands with a traceback."""
  (tmp_path / "config.json").write_text(content)
  with pytest.raises(ValueError, match=rf"config\.json is not a run's config \(a JSON object of configs; it holds "
                                       rf"{kind}\)"):
    files.read_config(str(tmp_path))


def test_a_written_config_reads_back_and_a_missing_one_is_not_a_run(tmp_path):
  files.write_config(str(tmp_path / "run"), sit={"seeds": [0]}, sit_command="train")
  assert files.read_config(str(tmp_path / "run")) == {"sit": {"seeds": [0]}, "sit_command": "train"}
  with pytest.raises(FileNotFoundError, match="is not a run folder: no config.json"):
    files.read_config(str(tmp_path / "none"))

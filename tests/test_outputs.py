"""Commands say what they found and where they wrote: `heat`'s equilibrium on the terminal, one `wrote` line."""
import json
import os

from attngeo.experiments import diffmap, heat_swissroll


def written(out: str) -> list[str]:
  """The paths of the last `wrote DIR/a, b, …[; note]` line of a command's output."""
  line = [l for l in out.splitlines() if l.startswith("wrote ")][-1]
  first, *rest = line.removeprefix("wrote ").split("; ")[0].split(", ")
  return [first] + [os.path.join(os.path.dirname(first), name) for name in rest]


def test_heat_prints_the_equilibrium_convergence_it_saves(tmp_path, capsys):
  heat_swissroll.main(["--n", "80", "--times", "1", "--out", str(tmp_path)])
  out = capsys.readouterr().out
  saved = json.loads((tmp_path / "heat_swissroll.json").read_text())
  assert (f"equilibrium π: {'converged' if saved['pi_converged'] else 'NOT converged'}, ℓ¹ error ≤ "
          f"{saved['pi_error_bound_l1']:.2g}; max π / min π = {saved['pi_max_over_min']:.3g}") in out
  assert written(out) == [str(tmp_path / "heat_swissroll.png"), str(tmp_path / "heat_swissroll.json")]


def test_diffmap_names_every_file_it_writes(tmp_path, capsys):
  diffmap.main(["swiss_roll", "--n", "100", "--k", "2", "--eps", "0.3", "--out", str(tmp_path)])
  paths = written(capsys.readouterr().out)
  assert sorted(paths) == sorted(str(tmp_path / name) for name in os.listdir(tmp_path))

"""Smoke tests: every benchmark/experiment command runs end to end on a tiny configuration and writes
its tables (their figures are measured by the commands themselves, not asserted here)."""
import contextlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from attngeo.experiments import bench_geometry, bench_operators, bench_train, curvature, heat_swissroll


def test_bench_operators_smoke(tmp_path):
  bench_operators.main(["--seqs", "64", "--batch", "1", "--heads", "2", "--head-dim", "8", "--repeats", "1",
                        "--long", "128", "--out", str(tmp_path)])
  rows = json.loads((tmp_path / "bench_operators.json").read_text())
  assert len(rows) == 4 * 3 + 3 + 1 and all(r["seconds"] > 0 for r in rows)     # CMAP: einsum, blockwise, paired
  assert min(r["ratio_to_best_attn"] for r in rows if r["operator"] == "ATTN") == 1.0
  assert {r["interleaved_with"] for r in rows if r["seq"] == 64} == {1, 4, 5}  # xla: 4 corners; einsum, blockwise: + CMAP
  kernel = {(r["operator"], r["implementation"]): r["kernel"] for r in rows if r["seq"] == 64}
  assert kernel["ATAP", "einsum"] == "split" and kernel["ATAP", "blockwise"] == "split_kept"   # 64 keys: two tiles
  assert kernel["DMAP", "einsum"] == "gram" and kernel["DMAP", "blockwise"] == "blockwise"
  assert all(k == impl for (name, impl), k in kernel.items() if name not in ("ATAP", "DMAP"))
  assert "| runs on |" in (tmp_path / "bench_operators.md").read_text()
  seconds = {(r["operator"], r["implementation"]): r["seconds"] for r in rows if r["seq"] == 64}
  for r in (r for r in rows if r["seq"] == 64):                   # one run: the paired ratio is its ratio, no interval
    assert ("paired" in r) == (r["operator"] != "ATTN" and ("ATTN", r["implementation"]) in seconds)  # not CMAP's
    if "paired" in r:
      assert r["paired"][0] == pytest.approx(r["seconds"] / seconds["ATTN", r["implementation"]])
      assert r["paired"][1:] == [None, None]                     # no interval below 6 repeats: JSON null
    assert (r["dtype"], r["repeats"]) == ("float32", 1)


def test_bench_rows_name_the_split_kernel_atap_dmtn_and_dmap_run_on():
  """ATAP's, DMTN's and DMAP's rows name the split kernel `transport` takes instead of the augmented heads
  (`operators.split_kernel`): pairs of tiles from 4 (ATAP, DMAP) or 16 (DMTN) tiles of 512, blockwise, not causal;
  the augmented heads under causal order or bf16."""
  assert bench_operators.runs_on("ATAP", "blockwise", 4096) == "split_paired"
  assert bench_operators.runs_on("ATAP", "blockwise", 1024) == "split_kept"               # 2 tiles, P kept
  assert bench_operators.runs_on("ATAP", "blockwise", 512) == "split_kept"
  assert bench_operators.runs_on("ATAP", "blockwise", 4096, causal=True) == "blockwise"
  assert bench_operators.runs_on("ATAP", "einsum", 256) == "split"
  assert bench_operators.runs_on("ATAP", "einsum", 256, dtype="bfloat16") == "einsum"
  assert bench_operators.runs_on("DMTN", "blockwise", 4096) == "blockwise"                # 8 tiles
  assert bench_operators.runs_on("DMTN", "blockwise", 8192) == "split_paired"
  assert bench_operators.runs_on("DMTN", "blockwise", 16384, batch_heads=8) == "blockwise"  # heads on 1024-key blocks
  assert bench_operators.runs_on("DMAP", "blockwise", 2048) == "split_paired"            # its Gram alone, 4 tiles
  assert bench_operators.runs_on("DMAP", "blockwise", 1024) == "blockwise"
  assert bench_operators.runs_on("DMAP", "blockwise", 8192, causal=True) == "blockwise"
  assert bench_operators.runs_on("DMAP", "einsum", 256) == "gram"
  assert bench_operators.runs_on("DMAP", "einsum", 448) == "einsum"                      # past 384² entries a head
  assert bench_operators.runs_on("CMAP", "paired", 4096) == "paired"


def test_bench_operators_kernel_choice_and_programs_too_big_for_the_machine(tmp_path, monkeypatch, capsys):
  """`--implementations` keeps the chosen kernels; a program over the memory limit is reported, not run."""
  monkeypatch.setattr(bench_operators, "memory_limit", lambda: 200_000)   # bytes: CMAP at 64 keys (~300 kB) is over
  monkeypatch.setattr(bench_operators, "process_bound", contextlib.nullcontext)   # a 200 kB cap would starve the worker
  monkeypatch.setattr(bench_operators, "resident_bytes", lambda: 0)     # the process bound: its own test below
  bench_operators.main(["--seqs", "16,64", "--batch", "1", "--heads", "2", "--head-dim", "8", "--repeats", "1",
                        "--operators", "ATTN,CMAP", "--implementations", "blockwise", "--long", "0",
                        "--out", str(tmp_path)])
  rows = json.loads((tmp_path / "bench_operators.json").read_text())
  assert {r["implementation"] for r in rows} == {"blockwise"} and len(rows) == 4
  big = [r for r in rows if r["peak_bytes"] > 200_000]
  assert big and all("skipped" in r and r["seconds"] != r["seconds"] for r in big)
  assert all(r["seconds"] > 0 for r in rows if r not in big)
  assert "not run: needs" in capsys.readouterr().out
  import jax
  cases = [("xla", "CMAP")] + ([("cudnn", "ATTN")] if jax.default_backend() == "cpu" else [])  # cuDNN: GPU only
  for chosen, name in cases:
    with pytest.raises(SystemExit) as e:
      bench_operators.main(["--seqs", "16", "--operators", "ATTN,CMAP", "--implementations", chosen])
    assert e.value.code == 2 and f"leaves no kernel for {name}" in capsys.readouterr().err


def test_bench_default_operators_are_those_with_a_kernel_among_the_chosen(tmp_path, capsys):
  """`--implementations xla` alone was refused because CMAP, a default operator, has no xla kernel; by default the
  bench now leaves CMAP out and says so (named with --operators, it is still refused: the test above). Options whose
  help states its default do not get argparse's "(default: None)" as well."""
  rows = bench_operators.main(["--seqs", "16", "--batch", "1", "--heads", "1", "--head-dim", "8", "--repeats", "1",
                               "--long", "0", "--implementations", "xla", "--out", str(tmp_path)])
  assert [r["operator"] for r in rows] == ["ATTN", "DMAP", "DMTN", "ATAP"]
  assert "left out: CMAP (no kernel among --implementations xla)" in capsys.readouterr().out
  options = bench_operators.parser().format_help().split("options:")[1].split("\n  -")[1:]
  assert not [o for o in options if "(default: None)" in o or " ".join(o.split()).count("(default") > 1]


def test_bench_bounds_the_process_not_only_each_program(tmp_path, monkeypatch, capsys):
  """Every cell of a length times one set of inputs (15 copies held 2.8 GiB at 4096 keys), and a program that
  would take the process's resident memory past the limit is reported, not run."""
  made = []
  real = bench_operators.compiled_call
  monkeypatch.setattr(bench_operators, "compiled_call", lambda *a, **kw: made.append(kw["qkv"]) or real(*a, **kw))
  rss = bench_operators.resident_bytes()
  assert rss is None or 2**20 < rss < bench_operators.machine_bytes()
  room = 300_000                                  # bytes: ATTN's einsum program (~200 kB) fits, CMAP's (~390 kB) not
  monkeypatch.setattr(bench_operators, "memory_limit", lambda: 2**30 + room)
  monkeypatch.setattr(bench_operators, "resident_bytes", lambda: 2**30)
  monkeypatch.setattr(bench_operators, "process_bound", contextlib.nullcontext)   # its cap is tested below
  bench_operators.main(["--seqs", "64", "--batch", "1", "--heads", "2", "--head-dim", "8", "--repeats", "1",
                        "--operators", "ATTN,CMAP", "--implementations", "einsum", "--long", "0",
                        "--out", str(tmp_path)])
  assert len(made) == 2 and made[0] is made[1]
  rows = {r["operator"]: r for r in json.loads((tmp_path / "bench_operators.json").read_text())}
  assert rows["ATTN"]["seconds"] > 0 and "skipped" not in rows["ATTN"] and rows["ATTN"]["peak_bytes"] < room
  assert rows["CMAP"]["peak_bytes"] > room and rows["CMAP"]["seconds"] != rows["CMAP"]["seconds"]
  assert "over the" in rows["CMAP"]["skipped"] and "not run, process at" in capsys.readouterr().out
  assert bench_operators.over_limit(None) is None


# `python -c CAPPED`: a 512 MiB program under a cap of 64 MiB above the resident size fails alone, the process
# lives on, and the limit it had before is back after the block.
CAPPED = """
import resource, sys
import jax, jax.numpy as jnp
from attngeo.experiments import timing
big = jax.jit(lambda x: jnp.sum(jnp.exp(jnp.outer(x, x)) @ x)).lower(jnp.ones(8192)).compile()   # 256 MiB × 2
before = resource.getrlimit(resource.RLIMIT_DATA)
with timing.bounded_data((timing.status_bytes("VmRSS") or 0) + 64 * 2**20) as cap:
  assert cap is not None and resource.getrlimit(resource.RLIMIT_DATA)[0] == cap
  try:
    big(jnp.ones(8192)).block_until_ready()
    print("ran")
  except Exception as e:
    print("failed", type(e).__name__)
  small = float(jnp.sum(jnp.ones(1000) * 2))
assert resource.getrlimit(resource.RLIMIT_DATA) == before
print(small, float(big(jnp.ones(8192) * 0)))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="the cap reads Linux's /proc")
def test_the_data_cap_fails_the_program_that_passes_it_and_nothing_else():
  """XLA's memory analysis is a floor, not a bound, so the bench caps the data segment (RLIMIT_DATA): a program
  past the cap fails with a runtime error, the process runs on, and the cap is lifted after the timing."""
  out = subprocess.run([sys.executable, "-c", CAPPED], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split() == ["failed", "JaxRuntimeError", "2000.0", "0.0"], out.stdout


def test_bench_causal_times_the_causal_operators(tmp_path, monkeypatch):
  """`--causal` passes the lower-triangular order to every kernel (a GPT's rows) and leaves out CMAP's pairing,
  which needs the symmetric order."""
  seen = []
  real = bench_operators.compiled_call
  monkeypatch.setattr(bench_operators, "compiled_call",
                      lambda name, impl, *a, **kw: seen.append((name, impl, kw["causal"])) or real(name, impl, *a, **kw))
  bench_operators.main(["--seqs", "32", "--batch", "1", "--heads", "2", "--head-dim", "8", "--repeats", "1",
                        "--operators", "ATTN,CMAP", "--implementations", "blockwise,paired", "--causal", "--long", "48",
                        "--out", str(tmp_path)])
  assert seen == [("ATTN", "blockwise", True), ("CMAP", "blockwise", True), ("DMTN", "blockwise", True)]  # + --long
  rows = json.loads((tmp_path / "bench_operators.json").read_text())
  assert len(rows) == 3 and all(r["causal"] and r["seconds"] > 0 for r in rows)
  assert bench_operators.available_impls("CMAP", causal=True) == ["einsum", "blockwise"]
  with pytest.raises(SystemExit) as e:
    bench_operators.main(["--numerics", "--causal", "--seqs", "16"])
  assert e.value.code == 2


def test_the_median_interval_is_the_sign_test_s_order_statistics():
  """[x_(k), x_(n+1−k)] with k the largest rank whose binomial tail P(K < k), K ~ Binomial(n, ½), is at most
  2.5 %: n = 6…8 take the extremes (2^−6 = 1.6 % ≤ 2.5 % < 7/64), n = 9…11 the second (10/512 = 2.0 %), n = 12 the
  third (79/4096 = 1.9 %); below 6 values no interval holds 95 %."""
  from attngeo.experiments import timing
  rng = np.random.default_rng(0)
  for n, k in ((5, 0), (6, 1), (8, 1), (9, 2), (11, 2), (12, 3), (20, 6)):
    x = rng.permutation(np.arange(1.0, n + 1))
    got = timing.median_interval(x)
    assert got.median == (n + 1) / 2
    assert (got.low, got.high) == ((k, n + 1 - k) if k else (got.low, got.high))
    assert k or (np.isnan(got.low) and np.isnan(got.high))
  assert timing.median_interval([0.5, 2.0], level=0.5) == (1.25, 0.5, 2.0)     # 50 %: P(K < 1) = ¼ ≤ ¼
  big = timing.median_interval(np.arange(2000.0))        # tails past 2^1023, exact: ranks 956 and 1045 (scipy's binom)
  assert (big.low, big.high) == (955.0, 1044.0)
  with pytest.raises(ValueError, match="got NaN among 3"):
    timing.median_interval([1.0, float("nan"), 2.0])


def test_the_median_interval_covers_as_the_binomial_says():
  """Over 4000 samples of 10 lognormal values the interval [x_(2), x_(9)] covers the true median (1) with
  probability 1 − 2·11/1024 = 97.85 %; the one-rank-narrower [x_(3), x_(8)] would cover 89 %."""
  from attngeo.experiments import timing
  rng = np.random.default_rng(1)
  hits = [(lambda i: i.low <= 1.0 <= i.high)(timing.median_interval(np.exp(rng.normal(size=10))))
          for _ in range(4000)]
  assert abs(np.mean(hits) - (1 - 2 * 11 / 1024)) < 0.008


def test_a_paired_ratio_cancels_a_slow_spell_that_falls_on_both_runs():
  """Run r of two interleaved calls shares its moment: a load that slows round r by any factor leaves their ratio,
  which the ratio of the fastest runs does not (its two minima come from different rounds)."""
  from attngeo.experiments import timing
  slow = np.array([1.0, 1.3, 1.1, 2.0, 1.05, 1.2, 1.0, 1.6])
  cell = 1.02 * slow * np.array([1.1, 1, 1, 1, 1, 1, 1.3, 1])           # its fastest run in round 2 (1.02·1.1 > …)
  got = timing.paired_ratio(cell, slow)
  assert got.median == pytest.approx(1.02) and got.low == pytest.approx(1.02)
  assert min(cell) / min(slow) != pytest.approx(1.02)
  with pytest.raises(ValueError, match="paired runs: 2 times against 3"):
    timing.paired_ratio([1, 2], [1, 2, 3])
  with pytest.raises(ValueError, match="reference times must be > 0 seconds; got 0"):
    timing.paired_ratio([1, 2], [1, 0])


def test_interleaved_rounds_alternate_their_order():
  """Round r runs the calls in order, round r + 1 in reverse: no call always runs right after the same one."""
  from attngeo.experiments import timing
  seen = []
  timing.interleaved_seconds({c: (lambda c=c: seen.append(c)) for c in "abc"}, repeats=3, warmup=0)
  assert "".join(seen) == "abccbaabc"


def test_bench_groups_hold_at_most_the_memory_budget():
  """Interleaved programs stay alive together: their summed peaks must fit (the default bench ran a 24 GiB
  machine out of memory at 4096 keys before groups were bounded)."""
  cells = [dict(peak_bytes=b) for b in (5, 5, 5, 20, 3, None, 3)]
  got = [[c["peak_bytes"] for c in g] for g in bench_operators.groups(cells, 10)]
  assert got == [[5, 5], [5], [20], [3, None, 3]]
  assert bench_operators.groups([], 10) == []


def test_bench_geometry_smoke(tmp_path):
  bench_geometry.main(["--sizes", "128", "--repeats", "1", "--block-size", "64", "--out", str(tmp_path)])
  rows = json.loads((tmp_path / "bench_geometry.json").read_text())
  assert {r["method"] for r in rows} == {"dense", "matrix-free"}
  assert next(r for r in rows if r["method"] == "dense")["time_vs_dense"] == 1.0


def test_bench_train_presets_are_the_recipes_shapes():
  """`--preset lm` and `--preset induction` time the models `attngeo lm train` builds (its default and its
  induction preset): the byte vocabulary is the byte tokenizer's, the BPE one the preset's."""
  from attngeo.lm import tokenizer
  assert bench_train.PRESETS["lm"] == dict(depth=4, width=256, head_dim=64, seq=256,
                                           vocab=tokenizer.ByteTokenizer().vocab_size, batch=16)
  assert bench_train.PRESETS["induction"] == dict(depth=2, width=128, head_dim=64, seq=256, vocab=512, batch=16)


def test_bench_train_smoke(tmp_path, monkeypatch):
  """The four operators' steps are timed in one interleaved call (a slow spell lands on all of them), and
  each row's time is the median of its own runs."""
  from attngeo.experiments import timing
  seen, real = [], timing.interleaved_seconds

  def spy(calls, repeats, warmup=1):
    seen.append((list(calls), repeats))
    return real(calls, repeats, warmup)

  monkeypatch.setattr(timing, "interleaved_seconds", spy)
  bench_train.main(["--seq", "32", "--batch", "2", "--depth", "1", "--width", "32", "--head-dim", "16", "--repeats", "3",
                    "--out", str(tmp_path)])
  rows = json.loads((tmp_path / "bench_train.json").read_text())["rows"]
  assert [r["operator"] for r in rows] == ["ATTN", "DMAP", "DMTN", "ATAP"] and rows[0]["ratio_to_attn"] == 1.0
  assert seen == [(["ATTN", "DMAP", "DMTN", "ATAP"], 3)]


@pytest.mark.slow
def test_curvature_table_smoke(tmp_path):
  curvature.main(["--sizes", "400", "--manifolds", "sphere r=1", "--large", "600:0.1", "--out", str(tmp_path)])
  row = json.loads((tmp_path / "curvature.json").read_text())[0]
  assert row["n"] == 400 and row["ricci_true"] == 1.0


def test_heat_figure_smoke(tmp_path):
  heat_swissroll.main(["--n", "300", "--times", "1,4", "--out", str(tmp_path)])
  assert os.path.getsize(tmp_path / "heat_swissroll.png") > 0
  assert json.loads((tmp_path / "heat_swissroll.json").read_text())["pi_max_over_min"] >= 1.0


def test_bench_geometry_refuses_sizes_below_two_in_one_line(capsys):
  """`--sizes 0` was a traceback from inside the benchmark."""
  with pytest.raises(SystemExit) as e:
    bench_geometry.main(["--sizes", "0"])
  assert e.value.code == 2 and "--sizes and --estimators must be at least 2 points each; got [0]" in capsys.readouterr().err


@pytest.mark.parametrize("operator", ["DMTN", "ATAP", "DMAP"])
def test_bench_pairs_times_the_routes_of_one_operator(monkeypatch, capsys, operator):
  """experiments/bench_pairs: a member's augmented heads, its two tiles with P kept and its pairs of tiles are the
  same operator (gradients agree, and differ from ATTN's), and its table prints one row per length, "—" where a
  route does not run (the pairs need two tiles of 512)."""
  from attngeo import hugepages
  from attngeo.experiments import bench_pairs
  grads = {name: call() for name, call in bench_pairs.routes(1024, 1, heads=2, head_dim=8, operator=operator).items()}
  assert set(grads) == {"ATTN", "augmented", "kept", "pairs"}
  for route in ("kept", "pairs"):
    for a, b, c in zip(grads["augmented"], grads[route], grads["ATTN"]):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()))
      assert float(np.abs(b - c).max()) > 1e-3 * float(np.abs(c).max())
  monkeypatch.setattr(hugepages, "reexec", lambda: None)
  bench_pairs.main(["--operator", operator, "--seqs", "512", "--batches", "1", "--repeats", "1"])
  rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 512 | 1 |")]
  assert len(rows) == 1 and rows[0].endswith(" | — |") and rows[0].count("—") == 1
  with pytest.raises(SystemExit):
    bench_pairs.main(["--seqs", "1024,2048", "--batches", "1"])


def test_bench_blocks_times_one_kernel_at_each_block(monkeypatch, capsys):
  """experiments/bench_blocks: the blocks compute one attention (gradients agree), its table prints one row per length
  with the default block named, and bad input is one line, exit 2, before any work."""
  from attngeo import hugepages
  from attngeo.experiments import bench_blocks
  for kernel in ("softmax", "phase"):
    grads = {bs: call() for bs, (call, _) in bench_blocks.calls(96, 1, 2, (16, 32, 96), head_dim=8,
                                                                 kernel=kernel).items()}
    for a, b in zip(grads[16], grads[96]):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()))
  monkeypatch.setattr(hugepages, "reexec", lambda: None)
  assert bench_blocks.main(["--seqs", "64", "--batches", "1", "--heads", "1", "--blocks", "16,32,16",
                            "--repeats", "1"]) == 0
  out = capsys.readouterr().out
  assert "| 16 (ms) | 32 (ms) | 32 ÷ 16, paired |" in out
  assert len([line for line in out.splitlines() if line.startswith("| 64 | 1 × 1 | 64 |")]) == 1     # the block: n
  assert bench_blocks.main(["--seqs", "2048", "--batches", "1", "--heads", "3", "--blocks", "1024", "--kernel", "phase",
                            "--repeats", "1"]) == 0
  assert "| 2048 | 1 × 3 | 1024 |" in capsys.readouterr().out              # the phase rule's block (softmax: 2048)
  for argv in (["--seqs", "64,128", "--batches", "1"], ["--blocks", "0,16"]):
    with pytest.raises(SystemExit) as e:
      bench_blocks.main(argv)
    assert e.value.code == 2


def test_pallas_blocks_sweep_checks_every_configuration(tmp_path, capsys):
  """`attngeo bench-pallas` in interpret mode: one row per width × block × warps × stages, each checked against the
  blockwise kernel (bf16: within 2e-2), the fastest correct one named per width, the table marked complete; bad
  input is one line, exit 2, before any work; a second run into a folder another process holds is refused."""
  import json

  from attngeo import cli
  argv = ["bench-pallas", "--seq", "40", "--batch", "1", "--heads", "2", "--widths", "16", "--value-dim", "8",
          "--blocks", "16,32", "--warps", "4", "--stages", "2", "--repeats", "1", "--interpret", "--out", str(tmp_path)]
  assert cli.main(argv) == 0
  table = json.loads((tmp_path / "pallas_blocks.json").read_text())
  assert [(r["block"], r["status"]) for r in table["rows"]] == [(16, "ok"), (32, "ok")] and table["complete"]
  assert all(1e-4 < r["err"] < 2e-2 and r["seconds"] > 0 for r in table["rows"])
  assert "incomplete" not in (tmp_path / "pallas_blocks.md").read_text() and not (tmp_path / ".lock").exists()
  out = capsys.readouterr().out
  assert "D=16: fastest correct block" in out and out.count("| 16 |") == 2
  cases = ((["--blocks", "0"], "--blocks"), (["--blocks", "48"], "--blocks: blocks must be powers of two"),
           (["--warps", "3"], "--warps: num_warps must be a power of two"), (["--stages", "9"], "--stages"),
           (["--seq", "0"], "--seq"), (["--out", str(tmp_path / "pallas_blocks.json")], "--out"),
           (["--out", ""], "--out"), (["--widths", "2048"], "--widths must be at most 512"))
  for extra, word in cases + (([], "--interpret"),):
    code = exit_code(cli.main, ["bench-pallas"] + extra + (["--interpret"] if word != "--interpret" else []))
    err = capsys.readouterr().err.strip()
    assert code == 2 and word in err and len(err.splitlines()) == 1, (extra, err)
  import subprocess
  import sys
  holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    assert exit_code(cli.main, argv) == 2
    out = capsys.readouterr()
    assert "is in use by pid" in out.err and "backend=" not in out.out          # refused before any work
  finally:
    holder.communicate("", timeout=30)


def exit_code(main, argv) -> int:
  """A command's exit status, whether it returns it or argparse exits with it."""
  try:
    return main(argv)
  except SystemExit as e:
    return e.code


# Holds the run folder argv[1] until its standard input closes (another process's `runlock.hold`).
HOLD = "import sys\nfrom attngeo import runlock\nwith runlock.hold(sys.argv[1]):\n  print('held', flush=True)\n  sys.stdin.read()"


def test_triton_resources_reads_the_triton_ir_of_each_kernel():
  """experiments/triton_resources' jax side: the gradient program lowered for CUDA holds the three Triton kernels
  at the asked warps and stages, their IR read back as MLIR text (tt.func, tt.dot); the MLIR string escapes
  decode; the default layout is the one `pallas.layout` and `pallas.TRITON` give."""
  from attngeo.experiments import triton_resources as tr
  from attngeo.kernels import pallas
  assert tr.decode(r'ML\EFR\00a\\b\"c\n\22\0A') == b'ML\xefR\x00a\\b"c\n"\n'
  before = pallas.backend()
  for kernel, names in (("softmax", ("flash_fwd", "flash_dkv", "flash_dq")),
                        ("phase", ("phase_fwd", "phase_dkv", "phase_dq"))):
    progs = tr.lowered(kernel, 64, 64, 32, 4, 3, n=256)
    assert [p["name"] for p in progs] == ["attngeo_" + n for n in names]
    assert all(p["warps"] == 4 and p["stages"] == 3 for p in progs)
    for p in progs:
      assert f"tt.func public @{p['name']}" in p["text"] and "tt.dot" in p["text"]
  assert pallas.backend() == before                                   # restored
  assert tr.default_layout("softmax", 256, 64) == (32, pallas.TRITON["num_warps"], pallas.TRITON["num_stages"])


def test_triton_resources_names_a_missing_triton_in_one_line(tmp_path, capsys):
  """`attngeo bench-triton`: a mistake is one line naming the option, exit 2, before any work (nothing written)."""
  import shutil

  from attngeo import cli
  for argv, word in ((["--triton-python", shutil.which("false")], "has no triton package"),
                     (["--triton-python", str(tmp_path / "none")], "cannot run"),
                     (["--blocks", "48"], "powers of two"), (["--arch", "70"], "--arch"),
                     (["--warps", "4,,8"], "--warps"), (["--warps", "64"], "--warps"), (["--stages", "0"], "--stages"),
                     (["--widths", "100000"], "--widths must be at most 1024"),
                     (["--value-dim", "100000"], "--value-dim must be at most 1024"),
                     (["--triton-python", "/bin/true"], "has no triton package")):
    assert exit_code(cli.main, ["bench-triton"] + argv + ["--out", str(tmp_path / "out")]) == 2
    message = capsys.readouterr().err.strip()
    assert word in message and "\n" not in message, message
  assert not (tmp_path / "out").exists()


def test_triton_resources_compiles_for_sm90_where_triton_is_installed(tmp_path):
  """With pip's triton (it bundles ptxas; no GPU): the default layout of a 256-wide head fits sm_90's shared
  memory and spills nothing, and 128-blocks there do not fit (the dq kernel asks for 240 KiB)."""
  pytest.importorskip("triton")
  import json

  from attngeo.experiments import triton_resources as tr
  tr.main(["--widths", "256", "--blocks", "32,128", "--warps", "8", "--stages", "2", "--out", str(tmp_path)])
  table = json.loads((tmp_path / "triton_resources.json").read_text())
  rows = table["rows"]
  assert table["complete"] and "sm_90" in (tmp_path / "triton_resources.md").read_text()
  default = [r for r in rows if r["kernel"].endswith("*")]
  assert len(default) == 3 and all(r["verdict"] == "ok" for r in default)
  assert any(r["verdict"] == "too big: cannot launch" for r in rows if r["block"] == 128)


def test_time_parts_names_each_thunk_and_counts_the_products(monkeypatch, capsys):
  """experiments/time_parts: XLA:CPU's thunk names sorted into products, elementwise passes and moves (loops and
  the executor's own events left out); the units column is each kernel's product count (ATTN 6 on einsum and 7
  blockwise, ATAP 6 on its split kernel and 11 on the augmented heads, DMAP 5 on its Gram kernel, CMAP 15 on einsum,
  as docs/benchmarks.md and docs/magnetic.md count them; WIDE, ATTN's kernel on 2·d-wide q and k, DMTN's 9); a profile of a real program has time in every kind; bad
  input is one line."""
  from attngeo import hugepages
  from attngeo.experiments import time_parts as tp
  names = {"ynn_fusion.7": "products", "dot.4": "products", "subtract_exponential_fusion.2": "elementwise",
           "broadcast_add_fusion": "elementwise", "dynamic-slice_bitcast_fusion.4": "moves",
           "bitcast_dynamic-update-slice_fusion.2": "moves", "wrapped_dynamic-slice.11": "moves",
           "bitcast_transpose_fusion.5": "moves", "wrapped_copy.4": "moves", "while.16": None, "cond.38": None, "cond.1.clone": None, "ynn_fusion.3.clone": "products", "end: copy.2": None,
           "ThunkExecutor::Execute": None, "SlinkyThreadPool::Await": None, "$api.py:2479 block_until_ready": None}
  assert {name: tp.kind(name) for name in names} == names
  rows = tp.measure(64, 1, ("ATTN", "ATAP", "CMAP"), calls=1, heads=2, head_dim=8)
  assert [(r.operator, r.kernel, r.units) for r in rows] == [("ATTN", "einsum", 6), ("ATAP", "split", 6),
                                                               ("CMAP", "einsum", 15)]
  assert all(r.wall > 0 and r.parts["products"] > 0 and r.parts["elementwise"] > 0 for r in rows)
  rows = tp.measure(1024, 1, ("ATTN", "ATAP", "DMTN"), implementation="blockwise", calls=1, heads=2, head_dim=8)
  # ATAP on two tiles with P kept (no recomputation); DMTN on its augmented heads (no key bias at α = 1)
  assert [(r.kernel, r.units) for r in rows] == [("blockwise", 7), ("split_kept", 6.5), ("blockwise, augmented", 11)]
  assert all(r.parts["moves"] > 0 for r in rows)
  assert 1 < rows[1].traffic / rows[0].traffic < 2           # ATAP's P written whole and read again by the backward
  assert "| 1024 | 1 | DMTN | blockwise, augmented |" in tp.table(rows)
  dots = {}                                # the three programs: on einsum only "grad" drops y's product P·v
  for program in tp.PROGRAMS:
    grad, args, _ = tp._program("ATTN", 64, 1, 2, 8, None, False, program)
    text, out = grad.lower(*args).compile().as_text(), grad(*args)
    dots[program] = len(re.findall(r"= \S+ dot\(", text))
    assert ("tanh" in text) == (program == "tanh") and len(out) == (2 if program == "value" else 3), program
    if program == "value":
      assert out[0].shape == () and len(out[1]) == 3
    rows = tp.measure(64, 1, ("ATTN", "DMTN", "WIDE"), calls=1, heads=2, head_dim=8, program=program)
    assert [(r.kernel, r.units) for r in rows] == [("einsum", 6), ("einsum, augmented", 9),
                                                   ("einsum, 2·d heads", 9)], program
  assert dots == {"grad": 5, "value": 6, "tanh": 6}, dots
  with pytest.raises(ValueError, match="program must be one of grad, value, tanh; got 'loss'"):
    tp.measure(64, 1, ("ATTN",), calls=1, heads=2, head_dim=8, program="loss")
  rows = tp.measure(64, 1, ("ATTN",), causal=True, calls=1, heads=2, head_dim=8)
  assert rows[0].units is None and "| 64 | 1 | ATTN | einsum | " in tp.table(rows) and "| — |" in tp.table(rows)
  monkeypatch.setattr(hugepages, "reexec", lambda: None)
  tp.main(["--operators", "attn,dmap", "--seqs", "32", "--batches", "1", "--calls", "1"])
  out = capsys.readouterr().out
  assert "| 32 | 1 | ATTN | einsum |" in out and "| 32 | 1 | DMAP | gram | " in out and "| 5.00 |" in out
  for argv, word in ((["--operators", "ATTN,FOO"], "--operators"), (["--seqs", "32,64", "--batches", "1"], "--batches"),
                     (["--calls", "0"], "--calls"), (["--implementation", "xla"], "--implementation"),
                     (["--implementation", "pallas"], "--implementation"), (["--program", "loss"], "--program")):
    assert exit_code(tp.main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and len(err.splitlines()) == 1, (argv, err)


def test_time_parts_shares_the_time_of_ops_that_ran_side_by_side():
  """`shared_seconds` against a hand count: a product alone for 2 s, then beside an elementwise pass for 2 s (1 s
  each), the pass alone for 1 s, a gap, a move for 3 s: the kinds add up to the 8 s some op ran."""
  from attngeo.experiments import time_parts as tp
  got = tp.shared_seconds([(0, 4, "products"), (2, 5, "elementwise"), (7, 10, "moves")])
  assert got == {"products": 3.0, "elementwise": 2.0, "moves": 3.0}
  assert tp.shared_seconds([]) == {"products": 0.0, "elementwise": 0.0, "moves": 0.0}


def test_time_parts_and_the_bench_tables_stop_on_ctrl_c_with_one_line(monkeypatch, capsys):
  """Ctrl-C during a later length: the rows of the lengths before stay printed, one line on stderr, status 130."""
  from attngeo import hugepages
  from attngeo.experiments import bench_pairs, time_parts as tp
  monkeypatch.setattr(hugepages, "reexec", lambda: None)
  measure = tp.measure

  def measure_then_stop(n, *args, **kwargs):
    if n == 64:
      raise KeyboardInterrupt
    return measure(n, *args, **kwargs)
  monkeypatch.setattr(tp, "measure", measure_then_stop)
  assert tp.main(["--operators", "ATTN", "--seqs", "32,64", "--batches", "1,1", "--calls", "1"]) == 130
  out, err = capsys.readouterr()
  assert "| 32 | 1 | ATTN |" in out and "| 64 |" not in out
  assert err.strip() == "python -m attngeo.experiments.time_parts: interrupted; the rows printed above are complete"
  monkeypatch.setattr(bench_pairs, "routes", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
  assert bench_pairs.main(["--seqs", "1024", "--batches", "1"]) == 130
  assert capsys.readouterr().err.strip().endswith("bench_pairs: interrupted; no row was finished")
  from attngeo import interrupts
  monkeypatch.setattr(bench_pairs, "routes", lambda *a, **k: (_ for _ in ()).throw(interrupts.Terminated))
  assert bench_pairs.main(["--seqs", "1024", "--batches", "1"]) == 143
  assert capsys.readouterr().err.strip().endswith("bench_pairs: terminated (SIGTERM); no row was finished")
  from attngeo.experiments import bench_blocks
  real = bench_blocks.calls
  monkeypatch.setattr(bench_blocks, "calls", lambda n, *a, **k: (_ for _ in ()).throw(KeyboardInterrupt) if n == 64
                      else real(n, *a, **k))
  assert bench_blocks.main(["--seqs", "32,64", "--batches", "1,1", "--heads", "1", "--blocks", "16,32",
                            "--repeats", "1"]) == 130
  out, err = capsys.readouterr()
  assert "| 32 | 1 × 1 |" in out and "| 64 |" not in out
  assert err.strip().endswith("bench_blocks: interrupted; the rows printed above are complete")


def test_time_parts_gives_a_cond_s_time_to_the_ops_inside_it():
  """A `lax.cond` whose taken branch is two matrix products: its event spans theirs, and counted as an op of its
  own it took half their time (the causal kernels' live blocks run inside such conds). The products keep it."""
  import jax
  import jax.numpy as jnp

  from attngeo.experiments import time_parts as tp
  x = jax.random.normal(jax.random.PRNGKey(0), (384, 384))
  f = jax.jit(lambda x: jax.lax.cond(jnp.sum(x) < 1e30, lambda x: (x @ x) @ x, lambda x: x, x))
  call = lambda c=f.lower(x).compile(): c(x)
  call()
  parts = tp.profile(call, 3).seconds
  assert parts["products"] > 4 * (parts["elementwise"] + parts["moves"]), parts


def test_time_parts_counts_the_bytes_each_elementwise_pass_reads_and_writes():
  """`pass_bytes` against a hand count on an HLO text (a tuple-shaped result, an operand named twice, an index
  comment), and `elementwise_bytes` of a real program: exp(x)·y + 1 on two 256 × 384 float32 arrays is one
  fused pass reading both and writing one (3 × 393 216 bytes), run 4 times in the loop around it, beside the loop
  counter's int32 i + 1 (3 × 4 bytes)."""
  import jax
  import jax.numpy as jnp

  from attngeo.experiments import time_parts as tp
  hlo = """
  %p.1 = f32[8,4]{1,0} parameter(0)
  %p.2 = bf16[8]{0} parameter(1)
  %multiply_fusion = f32[8,4]{1,0} fusion(%p.1, %p.2, %p.1), kind=kLoop, calls=%fused_computation
  ROOT %tuple.3 = (f32[8,4]{1,0}, /*index=1*/s32[]) tuple(%multiply_fusion, /*index=1*/%c.7)
"""
  assert tp.pass_bytes(hlo) == {"p.1": 128, "p.2": 16, "multiply_fusion": 128 + 128 + 16, "tuple.3": 132 + 128}
  x, y = (jax.random.normal(key, (256, 384)) for key in jax.random.split(jax.random.PRNGKey(0), 2))
  f = jax.jit(lambda x, y: jax.lax.fori_loop(0, 4, lambda i, x: jnp.exp(x) * y + 1, x))
  compiled = f.lower(x, y).compile()
  runs = tp.profile(lambda: compiled(x, y), 2).runs
  passes = {name: times for name, times in runs.items() if tp.kind(name) == "elementwise"}
  assert sorted(passes.values()) == [4.0, 4.0], runs                  # the pass, and the loop counter's i + 1
  assert tp.elementwise_bytes(runs, compiled.as_text()) == 4 * (3 * 256 * 384 * 4 + 3 * 4)


def test_time_parts_and_bench_pairs_refuse_what_cannot_run_in_one_line(monkeypatch, capsys):
  """Before any work: a length whose inputs and gradients alone exceed this machine's memory, and for bench_pairs a
  length that is not whole blocks of 512 for every route; a backend JAX cannot start (in a subprocess); a full TMPDIR
  under the profile after the rows before it (exit 2, one line, those rows kept)."""
  import subprocess

  from attngeo import hugepages
  from attngeo.experiments import bench_pairs, time_parts as tp
  for main, argv, word in ((tp.main, ["--seqs", "100000000", "--batches", "1"], "needs"),
                           (bench_pairs.main, ["--seqs", "100000000", "--batches", "1"], "needs"),
                           (bench_pairs.main, ["--seqs", "1024,256", "--batches", "1,1"], "multiple of 512"),
                           (bench_pairs.main, ["--seqs", "1000", "--batches", "1"], "multiple of 512")):
    assert exit_code(main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and len(err.splitlines()) == 1, (argv, err)
  env = dict(os.environ, JAX_PLATFORMS="tpu")
  for module in ("time_parts", "bench_pairs"):
    run = subprocess.run([sys.executable, "-m", f"attngeo.experiments.{module}", "--seqs", "1024", "--batches", "1"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "JAX could not start a backend (JAX_PLATFORMS='tpu')" in run.stderr
  monkeypatch.setattr(hugepages, "reexec", lambda: None)
  profile = tp.profile

  def full_after_first(call, calls):
    if full_after_first.done:
      raise RuntimeError("RESOURCE_EXHAUSTED: /tmp/x/vm.xplane.pb; No space left on device")
    full_after_first.done = True
    return profile(call, calls)
  full_after_first.done = False
  monkeypatch.setattr(tp, "profile", full_after_first)
  assert exit_code(tp.main, ["--operators", "ATTN", "--seqs", "32,64", "--batches", "1,1", "--calls", "1"]) == 2
  out, err = capsys.readouterr()
  assert "| 32 | 1 | ATTN |" in out and len(err.strip().splitlines()) == 1 and "no space left for the profile" in err

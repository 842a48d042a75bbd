"""CORE (DCLM's in-context-learning score) with nanochat's harness, on an eval bundle placed locally.

A bundle directory holds `core.yaml` (`icl_tasks`: label, dataset_uri, num_fewshot [n],
icl_task_type, continuation_delimiter — default " "), `eval_data/<dataset_uri>` (JSON lines) and
`eval_meta_data.csv` (columns `Eval Task`, `Random baseline` in percent). Per task:

* the examples are shuffled by `random.Random(1337)` (then cut to `max_per_task` if given); example
  `idx` draws its `num_fewshot` demonstrations from the other examples with `random.Random(1234 + idx).sample`;
* prompts (demonstrations joined by blank lines, `<delimiter>` between context and continuation):
  - `multiple_choice` — one prompt per choice `query<d>choice`; the continuation is what follows
    the choices' common token prefix; correct when the gold choice has the lowest **mean**
    continuation loss;
  - `schema` — one prompt per context option `option<d>continuation`; the continuation is the
    common token suffix; scored like multiple choice;
  - `language_modeling` — `strip(context)<d>continuation`; correct when greedy decoding
    reproduces every continuation token exactly (the prompt without the continuation, stripped,
    must tokenise to a prefix of the prompt with it);
* every prompt starts with BOS; prompts longer than the context keep their last `seq_len` tokens;
* accuracy `acc` → centred accuracy `(acc − 0.01·b) / (1 − 0.01·b)` with b the random baseline;
  CORE = the mean centred accuracy over the tasks.

Loss at position t is the cross-entropy of token t + 1; the continuation spanning tokens [s, e)
is scored on positions [s − 1, e − 1).
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import optax

from attngeo.lm import bpb

TASK_TYPES = ("multiple_choice", "schema", "language_modeling")
REQUIRED = {"multiple_choice": ("query", "choices", "gold"), "schema": ("context_options", "continuation", "gold"),
            "language_modeling": ("context", "continuation")}
OPTIONS = {"multiple_choice": "choices", "schema": "context_options"}     # the list `gold` indexes


@dataclasses.dataclass
class Task:
  label: str
  task_type: str
  num_fewshot: int
  delimiter: str
  baseline: float          # random baseline, percent
  data: list               # examples (dicts), in file order
  path: str


# ----------------------------------------------------------------------------- bundle

def _read_jsonl(path: str, task_type: str) -> list[dict]:
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: eval data file named in core.yaml is missing")
  out = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        item = json.loads(line.strip())
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
      missing = [k for k in REQUIRED[task_type] if not isinstance(item, dict) or k not in item]
      if missing:
        raise ValueError(f"{path}:{n}: a {task_type} example needs {list(REQUIRED[task_type])}; missing {missing}")
      problem = _bad_field(task_type, item)
      if problem:
        raise ValueError(f"{path}:{n}: {problem}")
      out.append(item)
  if not out:
    raise ValueError(f"{path}: no examples")
  return out


def _bad_field(task_type: str, item: dict) -> str | None:
  """What is wrong with an example's fields (None: nothing): text fields are strings, the options a
  non-empty list of strings, `gold` an integer index into them."""
  options = OPTIONS.get(task_type)
  for key in REQUIRED[task_type]:
    if key not in ("gold", options) and not isinstance(item[key], str):
      return f"field {key!r} must be a string; got {item[key]!r}"
  if options is None:
    return None
  values = item[options]
  if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
    return f"field {options!r} must be a non-empty list of strings; got {values!r}"
  gold = item["gold"]
  if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(values):
    return f"field 'gold' must be an integer index into {options!r} (0 to {len(values) - 1}); got {gold!r}"
  return None


def check_max_per_task(max_per_task: int) -> None:
  """One-line ValueError unless `max_per_task` is −1 (every example) or ≥ 1."""
  if isinstance(max_per_task, bool) or not isinstance(max_per_task, int) or not (max_per_task == -1 or max_per_task >= 1):
    raise ValueError(f"max_per_task must be -1 (every example) or an integer ≥ 1; got {max_per_task!r}")


def bundle_key(directory: str) -> str:
  """Content key of an eval bundle: `files.fingerprint` of every file's path (relative) and bytes, so
  results stored under it are recomputed when any file changes, never reused by the folder's name."""
  import hashlib

  from attngeo import files
  found = sorted(os.path.relpath(os.path.join(d, f), directory) for d, _, fs in os.walk(directory) for f in fs)
  digests = []
  for rel in found:
    with open(os.path.join(directory, rel), "rb") as f:
      digests.append(hashlib.file_digest(f, "sha256").digest())
  return files.fingerprint(found, *digests)


def load_bundle(directory: str) -> list[Task]:
  """The tasks of a DCLM/nanochat eval bundle directory (see the module docstring)."""
  import yaml
  config_path = os.path.join(directory, "core.yaml")
  meta_path = os.path.join(directory, "eval_meta_data.csv")
  for path in (config_path, meta_path):
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path}: missing (an eval bundle holds core.yaml, eval_data/*.jsonl, eval_meta_data.csv)")
  with open(config_path, encoding="utf-8") as f:
    try:
      config = yaml.safe_load(f)
    except yaml.YAMLError as e:
      raise ValueError(f"{config_path}: not valid YAML ({e})") from None
  if not isinstance(config, dict) or not isinstance(config.get("icl_tasks"), list):
    raise ValueError(f"{config_path}: needs a list `icl_tasks`")
  baselines = _baselines(meta_path)
  tasks = []
  for n, t in enumerate(config["icl_tasks"]):
    try:
      label, task_type, uri = t["label"], t["icl_task_type"], t["dataset_uri"]
      shots = t["num_fewshot"]
      shots = int(shots[0] if isinstance(shots, list) else shots)
    except (KeyError, TypeError, IndexError, ValueError):
      raise ValueError(f"{config_path}: icl_tasks[{n}] needs label, icl_task_type, dataset_uri, num_fewshot") from None
    if shots < 0:
      raise ValueError(f"{config_path}: icl_tasks[{n}] ({label!r}) num_fewshot must be ≥ 0; got {shots}")
    delimiter = t.get("continuation_delimiter", " ")
    if not isinstance(delimiter, str):
      raise ValueError(f"{config_path}: icl_tasks[{n}] ({label!r}) continuation_delimiter must be a string; "
                       f"got {delimiter!r}")
    if task_type not in TASK_TYPES:
      raise ValueError(f"{config_path}: task {label!r} has icl_task_type {task_type!r}; expected one of {TASK_TYPES}")
    if label not in baselines:
      raise ValueError(f"{meta_path}: no random baseline for task {label!r}")
    path = os.path.join(directory, "eval_data", uri)
    data = _read_jsonl(path, task_type)
    if len(data) <= shots:
      raise ValueError(f"{path}: {len(data)} examples; {shots}-shot prompts need at least {shots + 1} "
                       f"(num_fewshot of task {label!r} in core.yaml)")
    tasks.append(Task(label, task_type, shots, delimiter, baselines[label], data, path))
  return tasks


def _baselines(meta_path: str) -> dict[str, float]:
  """{task: random baseline in percent, in [0, 100)} from eval_meta_data.csv (line numbers in errors)."""
  with open(meta_path, encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  if rows and not {"Eval Task", "Random baseline"} <= set(rows[0]):
    raise ValueError(f"{meta_path}: needs columns 'Eval Task' and 'Random baseline'; got {sorted(rows[0])}")
  out = {}
  for line, r in enumerate(rows, 2):
    try:
      base = float(r["Random baseline"])
    except (TypeError, ValueError):
      base = math.nan
    if not 0 <= base < 100:
      raise ValueError(f"{meta_path}:{line}: field 'Random baseline' of task {r['Eval Task']!r} must be a "
                       f"percentage in [0, 100); got {r['Random baseline']!r}")
    out[r["Eval Task"]] = base
  return out


# ----------------------------------------------------------------------------- prompts

def render(task_type: str, item: dict, delimiter: str, fewshot: list[dict]) -> list[str]:
  """The prompts of one example (see the module docstring): one per choice / context option, or
  [without, with] the continuation for language modelling."""
  if task_type == "multiple_choice":
    head = "".join(f"{e['query']}{delimiter}{e['choices'][e['gold']]}\n\n" for e in fewshot)
    return [f"{head}{item['query']}{delimiter}{choice}" for choice in item["choices"]]
  if task_type == "schema":
    head = "".join(f"{e['context_options'][e['gold']]}{delimiter}{e['continuation']}\n\n" for e in fewshot)
    return [f"{head}{option}{delimiter}{item['continuation']}" for option in item["context_options"]]
  head = "".join(f"{str(e['context']).strip()}{delimiter}{e['continuation']}\n\n" for e in fewshot)
  without = f"{head}{str(item['context']).strip()}{delimiter}"
  return [without.strip(), f"{without}{item['continuation']}"]


def common_length(seqs: list[list[int]], direction: str = "left") -> int:
  """Length of the common prefix (`left`) or suffix (`right`) of token sequences."""
  n = min(len(s) for s in seqs)
  for i in range(n):
    idx = i if direction == "left" else -1 - i
    if any(s[idx] != seqs[0][idx] for s in seqs):
      return i
  return n


def spans(task_type: str, tokenizer, prompts: list[str]):
  """(token lists, continuation starts, ends) of an example's prompts, BOS first."""
  tokens = tokenizer.encode(prompts, prepend=tokenizer.bos_id)
  if task_type == "multiple_choice":
    start = common_length(tokens, "left")
    return tokens, [start] * len(tokens), [len(t) for t in tokens]
  if task_type == "schema":
    suffix = common_length(tokens, "right")
    return tokens, [len(t) - suffix for t in tokens], [len(t) for t in tokens]
  without, with_ = tokens
  if len(without) >= len(with_) or with_[:len(without)] != without:
    raise ValueError("the prompt without its continuation does not tokenise to a prefix of the prompt with it")
  return [with_], [len(without)], [len(with_)]


# ----------------------------------------------------------------------------- scoring

def _forward(model, ids):
  logits = model(ids)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1].astype(jnp.float32), ids[:, 1:])
  return losses, jnp.argmax(logits, -1)


_forward_jit = bpb.jitted(_forward)


def _bucket(n: int, step: int = 32) -> int:
  return -(-n // step) * step


def score(model, tokens, starts, ends, seq_len: int, pad_id: int):
  """Per prompt: (mean continuation loss, all continuation tokens predicted greedily)."""
  cropped = []
  for t, s, e in zip(tokens, starts, ends):
    crop = max(len(t) - seq_len, 0)
    if s - crop < 1:
      raise ValueError(f"a continuation of {e - s} tokens does not fit the context of {seq_len} tokens")
    cropped.append((t[crop:], s - crop, e - crop))
  width = min(_bucket(max(len(t) for t, _, _ in cropped)), seq_len)
  rows = _bucket(len(cropped), 4)
  ids = np.full((rows, width), pad_id, np.int32)
  for r, (t, _, _) in enumerate(cropped):
    ids[r, :len(t)] = t
  losses, preds = jax.device_get(_forward_jit(model, jnp.asarray(ids)))
  out = []
  for r, (t, s, e) in enumerate(cropped):
    out.append((float(losses[r, s - 1:e - 1].mean()), bool(np.all(preds[r, s - 1:e - 1] == ids[r, s:e]))))
  return out


def example_correct(model, tokenizer, task: Task, data: list, idx: int, seq_len: int) -> bool:
  """Whether the model gets example `idx` of `data` (the task's shuffled examples) right."""
  fewshot = []
  if task.num_fewshot > 0:
    rng = random.Random(1234 + idx)
    fewshot = [data[i] for i in rng.sample([i for i in range(len(data)) if i != idx], task.num_fewshot)]
  item = data[idx]
  try:
    tokens, starts, ends = spans(task.task_type, tokenizer, render(task.task_type, item, task.delimiter, fewshot))
    scored = score(model, tokens, starts, ends, seq_len, tokenizer.bos_id)
  except ValueError as e:
    raise ValueError(f"{task.path}: task {task.label!r}, example {idx} (after shuffling): {e}") from None
  if task.task_type == "language_modeling":
    return scored[0][1]
  mean_losses = [m for m, _ in scored]
  return mean_losses.index(min(mean_losses)) == item["gold"]


def centered(accuracy: float, baseline: float) -> float:
  """(acc − 0.01·b) / (1 − 0.01·b): 0 at the random baseline b (percent), 1 at perfect accuracy."""
  return (accuracy - 0.01 * baseline) / (1.0 - 0.01 * baseline)


def evaluate_task(model, tokenizer, task: Task, seq_len: int, max_per_task: int = -1) -> float:
  """Accuracy of one task (examples shuffled by Random(1337), the first `max_per_task` if > 0)."""
  check_max_per_task(max_per_task)
  data = list(task.data)
  random.Random(1337).shuffle(data)
  if max_per_task > 0:
    data = data[:max_per_task]
  if len(data) <= task.num_fewshot:
    raise ValueError(f"max_per_task {max_per_task} keeps {len(data)} examples of task {task.label!r}; its "
                     f"{task.num_fewshot}-shot prompts need at least {task.num_fewshot + 1}")
  return float(np.mean([example_correct(model, tokenizer, task, data, i, seq_len) for i in range(len(data))]))


def evaluate_core(model, tokenizer, bundle: str, seq_len: int, max_per_task: int = -1, progress: bool = False) -> dict:
  """{"results": {label: acc}, "centered": {label: centred acc}, "core": mean centred acc}."""
  check_max_per_task(max_per_task)
  tasks = load_bundle(bundle)
  if max_per_task > 0:
    short = [t.label for t in tasks if max_per_task <= t.num_fewshot]
    if short:
      raise ValueError(f"max_per_task {max_per_task} is too few for the few-shot prompts of {short} (each needs "
                       f"num_fewshot + 1 examples)")
  results, centred = {}, {}
  for task in tasks:
    results[task.label] = evaluate_task(model, tokenizer, task, seq_len, max_per_task)
    centred[task.label] = centered(results[task.label], task.baseline)
    if progress:
      print(f"  {task.label}: accuracy {results[task.label]:.4f}, centred {centred[task.label]:.4f}", flush=True)
  return {"results": results, "centered": centred, "core": float(np.mean(list(centred.values())))}

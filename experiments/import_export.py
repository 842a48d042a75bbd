"""Public checkpoints in and out: `attngeo import` writes an attngeo run folder, `attngeo export`
writes a run's model back in a public layout (attngeo.interop).

    attngeo import nanochat model_000650.pt|CHECKPOINT_DIR [--meta meta_000650.json] [--arch auto|2025-10|2026-07]
                   [--fill-missing] [--set FIELD=VALUE ...] --out RUN_DIR
    attngeo import gpt2 MODEL_DIR_OR_model.safetensors [--config config.json] [--set FIELD=VALUE ...] --out RUN_DIR
    attngeo import bert|albert HF_MODEL_DIR [--config config.json] [--set FIELD=VALUE ...] --out RUN_DIR
    attngeo export RUN_DIR --format gpt2|nanochat|bert|albert --out FILE.safetensors [--step N]

The run folder is the one `attngeo.train` writes: `config.json` (`model`: the GPTConfig through
`attngeo.nn.registry.config_dict`, `train`: a default TrainConfig, `imported`: kind, file, sha256,
architecture and commit matched, the source's own config) and `ckpt/0` (an orbax train state at
step 0 with a fresh optimizer state), so `attngeo.runs.load_run`, `attngeo probe` and anything that
resumes from a run read it unchanged. A BERT/ALBERT import is a weights-only run folder instead
(`attngeo.interop.bert.write_imported_run`: config.json, weights.npz, the vocab.txt, and `hf/` holding the
checkpoint as safetensors, converted once from a pytorch_model.bin; `--out` held by `attngeo.runlock` from
before the load). A BERT/ALBERT export copies the run's vocab.txt beside the safetensors. Export overwrites
no file that holds something else than what it writes (`safetensors_io.refuse_overwrite`). Nothing is downloaded: the files must be local. The import
summary names the rotary-table dtype of a nanochat import (nanochat's on this machine:
`attngeo.interop.nanochat.rope_tables`). Export is lossless or refuses in one line naming the
settings the layout cannot carry (`attngeo.interop.layout.unexpressed`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

from attngeo import config, errors, files, interop, nn, runlock, runs
from attngeo.interop import bert


def parse_set(items) -> dict:
  """['rope_base=10000', 'operator="DMTN"', 'norm_eps=1e-5'] -> {field: JSON value, else the string}."""
  out = {}
  for item in items or ():
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise ValueError(f"--set expects FIELD=VALUE; got {item!r}")
    try:
      out[key.strip()] = json.loads(value)
    except json.JSONDecodeError:
      out[key.strip()] = value
  return out


def import_main(argv=None):
  ap = config.parser("attngeo import", __doc__)
  ap.add_argument("kind", choices=("nanochat", "gpt2", "bert", "albert"),
                  help="checkpoint family: nanochat | gpt2 | bert | albert")
  ap.add_argument("path", help="nanochat: model_NNNNNN.pt, a .safetensors of its state dict, or its checkpoint folder "
                               "(latest step); gpt2, bert, albert: a Hugging Face model folder or its weights file")
  ap.add_argument("--out", required=True, help="run folder to write (required; must not hold a checkpoint yet)")
  ap.add_argument("--meta", default=None, help="nanochat meta_NNNNNN.json (default: the one beside PATH)")
  ap.add_argument("--arch", default="auto", choices=("auto", "2025-10", "2026-07"),
                  help="nanochat architecture: 2025-10 = the d32 release (ccfe791), 2026-07 = 92d63d4; "
                       "default auto (from the keys)")
  ap.add_argument("--fill-missing", action="store_true",
                  help="nanochat --arch 2026-07: give 2026 parameters absent from the file their neutral values "
                       "(the seed fork's import of the d32 release); default off")
  ap.add_argument("--config", default=None, help="gpt2/bert/albert config.json (default: the one beside the weights)")
  ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                  help="override a GPTConfig/BlockConfig field, JSON value (e.g. norm_eps=0.0078125, "
                       "rope_dtype=null, operator='\"DMTN\"'); repeatable; default none")
  a = ap.parse_args(argv)
  if not os.path.exists(a.path):
    ap.error(f"PATH {a.path} does not exist (files must be local; nothing is downloaded)")
  if runlock.has_checkpoint(a.out):
    ap.error(f"--out {a.out} already holds checkpoints; choose an empty run folder")
  try:
    overrides = parse_set(a.set)
  except ValueError as e:
    ap.error(str(e))
  if a.kind != "nanochat" and (a.meta or a.arch != "auto" or a.fill_missing):
    ap.error("--meta, --arch and --fill-missing are nanochat options")
  if a.kind == "nanochat" and a.config:
    ap.error("--config is a gpt2/bert/albert option (nanochat reads --meta)")
  if a.kind in ("bert", "albert"):
    return _import_encoder(ap, a, overrides)

  try:
    # held before the load (a busy or unusable --out is refused at once); a failed write removes what it added
    with runlock.hold(a.out, started=runlock.has_checkpoint):
      if runlock.has_checkpoint(a.out):                    # another import finished there since the check above
        raise ValueError(f"--out {a.out} already holds checkpoints; choose an empty run folder")
      if a.kind == "nanochat":
        model, info = interop.load("nanochat", a.path, meta=a.meta, arch=a.arch, fill_missing=a.fill_missing,
                                   **overrides)
        source = {"arch": info["arch"], "commit": info["commit"], "repository": "karpathy/nanochat",
                  "meta": info["meta"], "fill_missing": a.fill_missing, "rope_tables": info["rope_tables"]}
      else:
        model, info = interop.load("gpt2", a.path, hf_config_path=a.config, **overrides)
        source = {"matched": info["source"], "config": info["config"]}
      weights = info["file"]
      imported = {"kind": a.kind, "file": os.path.abspath(weights), "sha256": files.file_sha256(weights),
                  "overrides": overrides, **source}
      runs.write_checkpoint_run(a.out, model, imported=imported)
  except (ValueError, errors.InputTypeError, FileNotFoundError, ImportError) as e:
    ap.error(str(e))
  cfg = model.cfg
  n_params = nn.param_count(model)
  print(f"imported {a.kind} {weights}: depth {cfg.depth}, width {cfg.width}, heads {cfg.block.num_heads} "
        f"(kv {cfg.block.num_kv_heads or cfg.block.num_heads}), vocab {cfg.vocab_size}, context {cfg.seq_len}, "
        f"{n_params / 1e6:.2f}M parameters" + (f", nanochat {source['arch']} ({source['commit'][:7]}), "
                                                f"{source['rope_tables']}" if a.kind == "nanochat" else ""))
  print(f"wrote run folder {a.out} (config.json, ckpt/0): attngeo.runs.load_run or `attngeo probe {a.out}` read it")
  return model


def _import_encoder(ap, a, overrides):
  """`attngeo import bert|albert`: the checkpoint as a weights-only run folder (`attngeo.interop.bert.write_imported_run`)."""
  try:
    bert.check_out(a.out)
    with runlock.hold(a.out):             # before the load: a busy or unwritable --out is refused at once
      model, info = interop.load(a.kind, a.path, hf_config_path=a.config, **overrides)
      weights = info["file"]
      imported = {"kind": a.kind, "file": os.path.abspath(weights), "sha256": files.file_sha256(weights), "overrides": overrides,
                  "matched": info["source"], "config": info["config"]}
      bert.write_imported_run(a.out, model, info, imported)
  except (ValueError, errors.InputTypeError, FileNotFoundError, ImportError) as e:
    ap.error(str(e))
  cfg = model.cfg
  heads = [name for name, on in (("MLM", cfg.mlm_head), ("pooler", cfg.pooler), (cfg.classifier, cfg.classifier)) if on]
  print(f"imported {a.kind} {weights}: depth {cfg.depth}{' (one shared layer)' if cfg.shared_layers else ''}, "
        f"width {cfg.width}, heads {cfg.block.num_heads}, vocab {cfg.vocab_size}, positions {cfg.seq_len}, "
        f"{nn.param_count(model) / 1e6:.2f}M parameters, heads on top: {heads or 'none'}")
  print(f"wrote run folder {a.out} (config.json, weights.npz, {bert.HF_DIR}/model.safetensors): "
        f"attngeo.runs.load_run reads it")
  return model


def export_main(argv=None):
  ap = config.parser("attngeo export", __doc__)
  ap.add_argument("run_dir", help="an attngeo run folder holding a nanochat- or GPT-2-family GPT or a BERT/ALBERT")
  ap.add_argument("--format", required=True, choices=("gpt2", "nanochat", "bert", "albert"),
                  help="layout to write: gpt2 | nanochat | bert | albert (required)")
  ap.add_argument("--out", required=True, help="the .safetensors file, required (gpt2: config.json beside it; nanochat: "
                                               "meta_NNNNNN.json beside model_NNNNNN.safetensors)")
  ap.add_argument("--step", type=int, default=None,
                  help="checkpoint step (default: the newest intact one; printed, and in nanochat meta as attngeo_step)")
  a = ap.parse_args(argv)
  if not a.out.endswith(".safetensors"):
    ap.error(f"--out must end in .safetensors; got {a.out}")
  if os.path.isdir(a.out):
    ap.error(f"--out {a.out} is a folder; give the path of the .safetensors file to write")
  if files.blocking_file(os.path.dirname(a.out) or "."):
    ap.error(f"--out {a.out}: {files.blocking_file(os.path.dirname(a.out))} is a file, where the export's folder "
             f"goes; choose another path")
  try:
    model, _, mcfg, step = runs.load_run(a.run_dir, a.step, with_step=True)
  except (FileNotFoundError, ValueError) as e:
    ap.error(str(e))
  want = "EncoderConfig" if a.format in ("bert", "albert") else "GPTConfig"
  if type(mcfg).__name__ != want:
    ap.error(f"{a.run_dir} holds {nn.model_name(type(mcfg).__name__)}; only {nn.model_name(want)}s export to "
             f"{a.format}")
  meta = {}
  if a.format == "nanochat":
    imported = files.read_config(a.run_dir).get("imported") or {}
    meta = dict(imported.get("meta") or {})   # its model_config is rewritten from the model (window_pattern kept)
    meta["attngeo_run"] = os.path.abspath(a.run_dir)
    meta["attngeo_step"] = step
  options = {"meta": meta} if a.format == "nanochat" else {}
  vocab = os.path.join(a.run_dir, "vocab.txt")
  if a.format in ("bert", "albert") and os.path.isfile(vocab):
    options["vocab"] = vocab                   # beside the safetensors, as in HF folders: import reads it back
  elif a.format in ("bert", "albert"):
    print(f"attngeo export: warning: {vocab} is absent: the export holds the weights and config.json, no "
          f"vocab.txt (a tokenizer must come from elsewhere)", file=sys.stderr)
  try:
    written = interop.save(model, a.format, a.out, **options)
  except ValueError as e:
    hint = (f"; attngeo lm train --compat {a.format} builds a GPT this layout takes"
            if a.format in ("gpt2", "nanochat") and ("cannot carry" in str(e) or "-family GPT" in str(e)) else "")
    ap.error(f"{e}{hint}")
  block = dataclasses.asdict(mcfg.block)
  source = "weights.npz" if step is None else f"checkpoint step {step}"
  print(f"wrote {a.out} ({a.format}; operator {block['operator']}; from {source}) and its "
        f"{'meta json' if a.format == 'nanochat' else 'config.json'}, whole:\n{json.dumps(written)}")
  return written


main = import_main


if __name__ == "__main__":
  import_main()

"""Checkpoint-compatibility presets: the `BlockConfig` options each public checkpoint family fixes.

An attention layer is configured one way — by a `BlockConfig` (`attngeo.nn.layers.Attention(cfg)`).
Real checkpoints differ from attngeo's own blocks in a handful of its options (which projections carry
biases, the norm, the rotary convention, QK-norm's scale, the MLP's activation); each family's choice
is written here once. Importers build their configs on `PRESETS[name]` (plus what the checkpoint's own
config.json says: sizes, ε, rotary base), exporters refuse a model whose block differs (`mismatches`).

| preset   | biases (qkv / out / MLP) | norm                  | rotary | QK-norm          | MLP act |
|----------|--------------------------|-----------------------|--------|------------------|---------|
| gpt2     | yes / yes / yes          | LayerNorm, scale+bias | none   | none             | gelu (tanh) |
| bert     | yes / yes / yes          | LayerNorm, scale+bias | none   | none             | from config.json |
| nanochat | no / no / no             | RMSNorm, no scale     | yes    | parameter-free   | relu² |
| dit      | yes / yes / yes          | adaLN (the model's)   | none   | none             | gelu (tanh) |

Rotary sign, base and table dtype, `qk_gain` and ε vary within nanochat's versions, so its importer sets
them from the checkpoint; they are not part of the preset. JAX-free (a dict and two functions).
"""
from __future__ import annotations

PRESETS: dict[str, dict] = {
    "gpt2": dict(mlp_act="gelu", mlp_bias=True, qkv_bias=True, out_bias=True, use_rope=False, qk_norm=False,
                 norm="layer", norm_scale=True, norm_bias=True, order="attn_first", num_kv_heads=None),
    "bert": dict(mlp_bias=True, qkv_bias=True, out_bias=True, qk_norm=False, norm="layer", norm_scale=True,
                 norm_bias=True, num_kv_heads=None, qk_gain=1.0),
    "nanochat": dict(mlp_act="relu2", mlp_bias=False, qkv_bias=False, out_bias=False, use_rope=True,
                     rope_style="half", qk_norm=True, qk_norm_scale=False, norm="rms", norm_scale=False,
                     order="attn_first"),
    "dit": dict(mlp_act="gelu", mlp_bias=True, qkv_bias=True, out_bias=True, use_rope=False, qk_norm=False),
}


def fields(name: str) -> dict:
  """A copy of preset `name`'s `BlockConfig` fields; one ValueError line for an unknown name."""
  if name not in PRESETS:
    raise ValueError(f"compatibility preset must be one of {sorted(PRESETS)}; got {name!r}")
  return dict(PRESETS[name])


def mismatches(block, name: str, label: str | None = None) -> list[str]:
  """`"field=value (label: wanted)"` for every field of `block` (a `BlockConfig`) that preset `name` fixes
  to another value; `label` (default `name`) is the family the message names."""
  label = label or name
  return [f"{k}={getattr(block, k)!r} ({label}: {v!r})" for k, v in fields(name).items() if getattr(block, k) != v]

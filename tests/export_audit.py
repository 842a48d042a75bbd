"""Shared by the exporters' tests: every GPTConfig field is either refused by an export or comes back
from export → import with the same settings and the same logits (lossless or refuses)."""
import dataclasses
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attngeo import nn
from attngeo.interop import layout

FIELDS = ({f.name for f in dataclasses.fields(nn.GPTConfig)} - {"block"}) | {f.name for f in dataclasses.fields(nn.BlockConfig)}
SHAPES = {"depth", "vocab_size", "seq_len", "width", "num_heads"}   # the layouts' own config; the fixtures vary them

forward = nnx.jit(lambda model, ids: model(ids))


def variant(cfg, **changes):
  """`cfg` with GPTConfig and BlockConfig fields changed (validated)."""
  top = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
  block = dataclasses.replace(top.pop("block"), **{k: v for k, v in changes.items() if k not in top})
  return nn.GPTConfig.create(**{**top, **{k: v for k, v in changes.items() if k in top}}, block=block)


def randomized(cfg, seed=0):
  """An nn.GPT for `cfg` whose every parameter is random (no zero-initialised gate hides a setting)."""
  model = nn.GPT(cfg, rngs=nnx.Rngs(seed))
  rng = np.random.default_rng(seed)
  for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    v.set_value(jnp.asarray(0.3 * rng.standard_normal(v.get_value().shape), jnp.float32))
  return model


def check_covered(refused, carried):
  """Every field is classified: refused (a field name) or carried (a key of a change), or a shape
  field of the layout's own config (a field may be both: refused for some values, carried for others)."""
  covered = set(refused) | {k for changes in carried for k in changes} | SHAPES
  assert covered == FIELDS, sorted(FIELDS ^ covered)


def check_refused(base, changes: dict, match: str, save, out_dir):
  """`save(model, folder)` of `base` changed by `changes` raises one line matching `match`, writing nothing."""
  model = nnx.eval_shape(lambda: nn.GPT(variant(base, **changes), rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match=match) as e:
    save(model, str(out_dir))
  assert "\n" not in str(e.value)
  assert not os.path.exists(out_dir)


def check_carried(base, changes: dict, save, load, out_dir, ids):
  """export (`save(model, folder)`) → import (`load(folder)` → model) gives back every setting
  (`layout.settings`) and the logits, to float32 round-off.

  The compute-only fields (`layout.COMPUTE_ONLY`: kernel, precision) are not part of the function:
  the import runs float32 with the default kernel, so its logits are compared with the same
  weights computed that way."""
  model = randomized(variant(base, **changes))
  save(model, str(out_dir))
  back = load(str(out_dir))
  assert layout.settings(back.cfg) == layout.settings(model.cfg)
  plain = randomized(variant(model.cfg, **{k: getattr(nn.BlockConfig(), k) for k in layout.COMPUTE_ONLY}))
  np.testing.assert_allclose(forward(back, jnp.asarray(ids)), forward(plain, jnp.asarray(ids)), atol=2e-5, rtol=0)

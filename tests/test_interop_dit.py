"""attngeo.interop.dit: official SiT/DiT checkpoints (random weights in their key layout) against a numpy forward.

The reference below is written from the public `models.py` of willisma/SiT and facebookresearch/DiT
(timm PatchEmbed / Attention / Mlp, adaLN-Zero, NCHW tensors, torch's [out, in] weights), in float64,
independently of attngeo's code.
"""
import math

import numpy as np
import pytest
from flax import nnx

from attngeo import nn
from attngeo.interop import dit as dit_import, safetensors_io

D, HEADS, DEPTH, P, C, IMG, K = 32, 4, 2, 2, 3, 8, 5
raw = nnx.jit(lambda m, x, t, y: m.raw(x, t, y))
call = nnx.jit(lambda m, x, t, y: m(x, t, y))


def official_state_dict(rng, learn_sigma=True, null_row=True, depth=DEPTH, channels=C):
  cout = 2 * channels if learn_sigma else channels
  f = 4 * D
  w = lambda *shape: rng.normal(0, 1 / math.sqrt(shape[-1]), shape).astype(np.float32)
  b = lambda n: rng.normal(0, 0.1, (n,)).astype(np.float32)
  sd = {"x_embedder.proj.weight": rng.normal(0, 0.3, (D, channels, P, P)).astype(np.float32),
        "x_embedder.proj.bias": b(D),
        "pos_embed": rng.normal(0, 0.5, (1, (IMG // P) ** 2, D)).astype(np.float32),
        "t_embedder.mlp.0.weight": w(D, 256), "t_embedder.mlp.0.bias": b(D),
        "t_embedder.mlp.2.weight": w(D, D), "t_embedder.mlp.2.bias": b(D),
        "y_embedder.embedding_table.weight": rng.normal(0, 0.5, (K + null_row, D)).astype(np.float32),
        "final_layer.adaLN_modulation.1.weight": w(2 * D, D), "final_layer.adaLN_modulation.1.bias": b(2 * D),
        "final_layer.linear.weight": w(P * P * cout, D), "final_layer.linear.bias": b(P * P * cout)}
  for i in range(depth):
    pre = f"blocks.{i}."
    sd.update({pre + "attn.qkv.weight": w(3 * D, D), pre + "attn.qkv.bias": b(3 * D),
               pre + "attn.proj.weight": w(D, D), pre + "attn.proj.bias": b(D),
               pre + "mlp.fc1.weight": w(f, D), pre + "mlp.fc1.bias": b(f),
               pre + "mlp.fc2.weight": w(D, f), pre + "mlp.fc2.bias": b(D),
               pre + "adaLN_modulation.1.weight": w(6 * D, D), pre + "adaLN_modulation.1.bias": b(6 * D)})
  return sd


def layer_norm(x, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)


def silu(x):
  return x / (1 + np.exp(-x))


def gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def linear(x, sd, name):
  return x @ sd[name + ".weight"].astype(np.float64).T + sd[name + ".bias"]


def reference_forward(sd, x, t, y, heads, depth=DEPTH):
  """x [N, C, H, W] (NCHW) -> all output channels [N, C', H, W]."""
  sd = {k: v.astype(np.float64) for k, v in sd.items()}
  n, c, hgt, wid = x.shape
  w = sd["x_embedder.proj.weight"]
  d, p = w.shape[0], w.shape[2]
  gh, gw = hgt // p, wid // p
  patches = x.reshape(n, c, gh, p, gw, p)                                 # Conv2d with stride = kernel = p
  h = np.einsum("ncyaxb,dcab->nyxd", patches, w).reshape(n, gh * gw, d) + sd["x_embedder.proj.bias"]
  h = h + sd["pos_embed"]
  half = 128
  freqs = np.exp(-math.log(10000) * np.arange(half) / half)
  args = t[:, None] * freqs[None]
  temb = linear(silu(linear(np.concatenate([np.cos(args), np.sin(args)], -1), sd, "t_embedder.mlp.0")),
                sd, "t_embedder.mlp.2")
  cond = temb + sd["y_embedder.embedding_table.weight"][y]
  dh = d // heads
  for i in range(depth):
    pre = f"blocks.{i}."
    mods = np.split(linear(silu(cond), sd, pre + "adaLN_modulation.1"), 6, 1)
    shift1, scale1, gate1, shift2, scale2, gate2 = (m[:, None, :] for m in mods)
    a = layer_norm(h) * (1 + scale1) + shift1
    qkv = linear(a, sd, pre + "attn.qkv").reshape(n, -1, 3, heads, dh).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]                                     # [N, heads, T, dh]
    logits = q @ k.transpose(0, 1, 3, 2) * dh ** -0.5
    att = np.exp(logits - logits.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    o = (att @ v).transpose(0, 2, 1, 3).reshape(n, -1, d)
    h = h + gate1 * linear(o, sd, pre + "attn.proj")
    a = layer_norm(h) * (1 + scale2) + shift2
    h = h + gate2 * linear(gelu_tanh(linear(a, sd, pre + "mlp.fc1")), sd, pre + "mlp.fc2")
  shift, scale = np.split(linear(silu(cond), sd, "final_layer.adaLN_modulation.1"), 2, 1)
  out = linear(layer_norm(h) * (1 + scale[:, None]) + shift[:, None], sd, "final_layer.linear")
  cout = out.shape[-1] // (p * p)
  out = out.reshape(n, gh, gw, p, p, cout)
  return np.einsum("nhwpqc->nchpwq", out).reshape(n, cout, gh * p, gw * p)


@pytest.mark.parametrize("learn_sigma", [True, False])
def test_imported_forward_matches_the_numpy_reference(tmp_path, learn_sigma):
  rng = np.random.default_rng(0)
  sd = official_state_dict(rng, learn_sigma=learn_sigma)
  path = str(tmp_path / "sit.safetensors")
  safetensors_io.write(path, sd)
  model = dit_import.import_checkpoint(path, num_heads=HEADS)
  cfg = model.cfg
  assert (cfg.block.width, cfg.depth, cfg.patch, cfg.channels, cfg.image_size) == (D, DEPTH, P, C, IMG)
  assert cfg.learn_sigma == learn_sigma and cfg.num_classes == K and cfg.null_label == K
  x = rng.normal(size=(3, C, IMG, IMG))
  t = np.array([0.0, 0.37, 1.0])                      # SiT's t ∈ [0, 1]; DiT passes steps, same formula
  y = np.array([0, 4, K])                             # the last is the null label
  want = reference_forward(sd, x, t, y, HEADS)
  got = np.asarray(raw(model, np.transpose(x, (0, 2, 3, 1)).astype(np.float32), t.astype(np.float32), y))
  np.testing.assert_allclose(np.transpose(got, (0, 3, 1, 2)), want, atol=1e-4, rtol=1e-4)
  vel = np.asarray(call(model, np.transpose(x, (0, 2, 3, 1)).astype(np.float32), t.astype(np.float32), y))
  np.testing.assert_allclose(np.transpose(vel, (0, 3, 1, 2)), want[:, :C], atol=1e-4, rtol=1e-4)   # SiT's chunk(2)
  steps = np.array([3.0, 500.0, 999.0])               # DiT's integer DDPM steps go through the same sinusoid
  got = np.asarray(raw(model, np.transpose(x, (0, 2, 3, 1)).astype(np.float32), steps.astype(np.float32), y))
  np.testing.assert_allclose(np.transpose(got, (0, 3, 1, 2)), reference_forward(sd, x, steps, y, HEADS),
                             atol=1e-4, rtol=1e-4)


def test_native_positions_are_the_mae_layout():
  """MAE/DiT: np.meshgrid(grid_w, grid_h) puts the column index in the first half of each vector."""
  grid, dim = 3, 8
  def one_d(d, pos):
    omega = 1.0 / 10000 ** (np.arange(d // 2) / (d / 2))
    out = pos[:, None] * omega[None]
    return np.concatenate([np.sin(out), np.cos(out)], 1)
  col = np.tile(np.arange(grid), grid).astype(float)        # token r·grid + c has column c
  row = np.repeat(np.arange(grid), grid).astype(float)
  want = np.concatenate([one_d(dim // 2, col), one_d(dim // 2, row)], 1)
  np.testing.assert_allclose(nn.sincos_2d(grid, dim), want, atol=1e-6)


def test_config_inference_and_null_row():
  rng = np.random.default_rng(2)
  cfg = dit_import.config_from_state_dict(official_state_dict(rng, null_row=False), num_heads=HEADS, num_classes=K)
  assert cfg.null_label is None and cfg.num_classes == K
  with pytest.raises(ValueError, match="has 6 rows; num_classes=3 needs 3 .* or 4"):
    dit_import.config_from_state_dict(official_state_dict(rng), num_heads=HEADS, num_classes=3)
  with pytest.raises(ValueError, match="not a SiT/DiT preset width .* pass num_heads"):
    dit_import.config_from_state_dict(official_state_dict(rng))


def error_of(tmp_path, sd, name="bad.safetensors", **kw):
  path = str(tmp_path / name)
  safetensors_io.write(path, sd)
  with pytest.raises(ValueError) as e:
    dit_import.import_checkpoint(path, num_heads=HEADS, **kw)
  msg = str(e.value)
  assert "\n" not in msg
  return msg


def test_bad_checkpoints_name_the_keys(tmp_path):
  rng = np.random.default_rng(3)
  sd = official_state_dict(rng)
  del sd["blocks.1.mlp.fc2.bias"]
  sd["blocks.0.attn.q_norm.weight"] = np.ones(8, np.float32)
  sd["blocks.0.adaLN_modulation.1.bias"] = np.zeros(5, np.float32)
  msg = error_of(tmp_path, sd)
  assert "missing keys: blocks.1.mlp.fc2.bias" in msg
  assert "unexpected keys: blocks.0.attn.q_norm.weight" in msg
  assert "wrong shapes: blocks.0.adaLN_modulation.1.bias (5,) (expected (192,))" in msg
  foreign = {"wte.weight": np.zeros((10, 4), np.float32), "h.0.attn.c_attn.weight": np.zeros((4, 12), np.float32)}
  msg = error_of(tmp_path, foreign, "gpt2.safetensors")
  assert msg.startswith("not a SiT/DiT checkpoint: missing final_layer.linear.weight, pos_embed, x_embedder")
  assert "wte.weight" in msg


def test_pickles_need_torch(tmp_path):
  pt = tmp_path / "SiT-XL-2-256x256.pt"
  pt.write_bytes(b"not really a pickle")
  try:
    import torch  # noqa: F401
    pytest.skip("torch is installed: .pt files are read through torch.load(weights_only=True)")
  except ImportError:
    pass
  with pytest.raises(ImportError, match=r"torch is not installed: pip install 'attngeo\[torch\]'.*save_file"):
    dit_import.import_checkpoint(str(pt))


def test_bfloat16_checkpoints_import_in_float32(tmp_path):
  import ml_dtypes
  rng = np.random.default_rng(5)
  sd = official_state_dict(rng)
  path = str(tmp_path / "bf16.safetensors")
  safetensors_io.write(path, {k: v.astype(ml_dtypes.bfloat16) for k, v in sd.items()})
  model = dit_import.import_checkpoint(path, num_heads=HEADS)
  np.testing.assert_array_equal(np.asarray(model.y_embed[...]),
                                sd["y_embedder.embedding_table.weight"].astype(ml_dtypes.bfloat16).astype(np.float32))


def test_imported_model_grafts_and_folds(tmp_path):
  rng = np.random.default_rng(4)
  path = str(tmp_path / "sit.safetensors")
  safetensors_io.write(path, official_state_dict(rng))
  model = dit_import.import_checkpoint(path, num_heads=HEADS)
  x = rng.normal(size=(2, IMG, IMG, C)).astype(np.float32)
  t, y = np.array([0.2, 0.9], np.float32), np.array([1, 3])
  nn.graft(model, "DMAP")
  grafted = np.asarray(call(model, x, t, y))
  nn.fold_distance(model)
  np.testing.assert_allclose(np.asarray(call(model, x, t, y)), grafted, atol=2e-5, rtol=1e-5)
  assert model.cfg.block.distance_form and not hasattr(model.blocks[0].attn, "wq")
  assert nnx.state(model, nnx.Param)["blocks"][0]["attn"]["wp"][...].shape == (D, HEADS, D // HEADS)


@pytest.mark.parametrize("options,message", [
    ({"num_heads": 0}, r"a SiT/DiT import needs positive integers; got num_heads=0"),
    ({"num_heads": -4}, r"got num_heads=-4"),
    ({"num_heads": 3}, r"num_heads=3 must divide the checkpoint's width 32"),
    ({"num_classes": 0}, r"got num_classes=0"),
])
def test_impossible_heads_and_classes_are_one_line(options, message):
  with pytest.raises(ValueError, match=message) as e:
    dit_import.config_from_state_dict(official_state_dict(np.random.default_rng(0)), **options)
  assert "\n" not in str(e.value)


def test_damaged_checkpoint_is_one_line(tmp_path):
  path = str(tmp_path / "sit.safetensors")
  safetensors_io.write(path, official_state_dict(np.random.default_rng(0)))
  with open(path, "r+b") as f:
    f.truncate(50)
  with pytest.raises(ValueError, match=rf"{path} is not a readable checkpoint") as e:
    dit_import.import_checkpoint(path)
  assert "\n" not in str(e.value)

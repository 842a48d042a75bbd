"""attngeo.nn: every model trains under every corner; grafting swaps only the operator; adaLN-Zero."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from attngeo import nn, operators
from attngeo.nn import layers

CORNERS = ["ATTN", "DMTN", "ATAP", "DMAP"]


def overfit(model, loss, steps=40, lr=1e-2):
  opt = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt):
    l, g = nnx.value_and_grad(loss)(model)
    opt.update(model, g)
    return l

  first = float(loss(model))
  for _ in range(steps):
    last = float(step(model, opt))
  return first, last


@pytest.mark.parametrize("op", CORNERS)
def test_tiny_gpt_overfits(op):
  tok = jax.random.randint(jax.random.PRNGKey(0), (4, 17), 0, 32)
  model = nn.GPT(nn.GPTConfig.from_depth(1, vocab_size=32, head_dim=8, width=32, operator=op), rngs=nnx.Rngs(0))
  loss = lambda m: optax.softmax_cross_entropy_with_integer_labels(m(tok[:, :-1]), tok[:, 1:]).mean()
  first, last = overfit(model, loss)
  assert last < 0.3 * first, (first, last)


@pytest.mark.parametrize("op", CORNERS)
def test_tiny_dit_overfits(op):
  ks = jax.random.split(jax.random.PRNGKey(1), 3)
  x1 = jax.random.normal(ks[0], (4, 8, 8, 3))
  x0 = jax.random.normal(ks[1], x1.shape)
  t = jax.random.uniform(ks[2], (4,))
  y = jnp.array([0, 1, 2, 3])
  cfg = nn.DiTConfig.create(image_size=8, patch=2, channels=3, width=32, depth=2, num_heads=2, num_classes=4, operator=op)
  model = nn.DiT(cfg, rngs=nnx.Rngs(0))
  xt = (1 - t)[:, None, None, None] * x0 + t[:, None, None, None] * x1
  loss = lambda m: jnp.mean((m(xt, t, y) - (x1 - x0)) ** 2)    # fixed noise and times: pure regression
  first, last = overfit(model, loss, steps=60)
  assert last < 0.5 * first, (first, last)


def test_adaln_zero_block_is_identity_at_init():
  blk = nn.Block(nn.BlockConfig(width=16, num_heads=2, operator="DMTN"), cond_dim=8, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 16))
  c = jax.random.normal(jax.random.PRNGKey(1), (2, 8))
  np.testing.assert_array_equal(blk(x, c), x)


def test_dit_blocks_are_identity_on_the_residual_stream_at_init():
  cfg = nn.DiTConfig.create(image_size=8, patch=2, channels=3, width=32, depth=3, num_heads=2, num_classes=4, operator="ATAP")
  model = nn.DiT(cfg, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 8, 3))
  t, y = jnp.array([0.2, 0.7]), jnp.array([1, 4])
  h0 = model.patchify(x) @ model.patch_w[...] + model.patch_b[...] + model.pos[...][None]
  cond = model.t_embed(t) + model.y_embed[...][y]
  h = h0
  for blk in model.blocks:
    h = blk(h, cond)
  np.testing.assert_array_equal(h, h0)
  np.testing.assert_array_equal(model(x, t, y), jnp.zeros_like(x))   # zero-initialised read-out


def test_bf16_compute_keeps_float32_master_weights():
  tok = jax.random.randint(jax.random.PRNGKey(0), (4, 17), 0, 32)
  model = nn.GPT(nn.GPTConfig.from_depth(1, vocab_size=32, head_dim=8, width=32, operator="DMTN", dtype="bfloat16"),
                 rngs=nnx.Rngs(0))
  loss = lambda m: optax.softmax_cross_entropy_with_integer_labels(m(tok[:, :-1]), tok[:, 1:]).mean()
  first, last = overfit(model, loss)
  assert last < 0.5 * first
  assert model.blocks[0].attn.wq[...].dtype == jnp.float32
  q, _, _ = model.blocks[0].attn.qkv(jnp.zeros((1, 3, 32)))
  assert q.dtype == jnp.bfloat16


def test_dit_xl2_shape_is_expressible():
  cfg = nn.DiTConfig.preset("XL/2")
  assert (cfg.depth, cfg.block.width, cfg.block.num_heads, cfg.patch) == (28, 1152, 16, 2)
  shapes = nnx.eval_shape(lambda: nn.DiT(cfg, rngs=nnx.Rngs(0)))
  n_params = sum(int(np.prod(v.get_value().shape)) for _, v in nnx.to_flat_state(nnx.state(shapes, nnx.Param)))
  assert 640e6 < n_params < 700e6   # DiT-XL/2 has 675M parameters


def _open_gates(model):
  """Open the zero-initialised adaLN gates and read-out so the attention operator shows in the output."""
  for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    if "ada_b" in path or path[-1] == "w":
      v[...] = jax.random.normal(jax.random.PRNGKey(len(path)), v[...].shape) * 0.5
  return model


@pytest.mark.parametrize("src", CORNERS)
def test_graft_equals_a_model_built_under_the_target_operator(src):
  """Grafting dst onto a src model = the same weights built under dst; parameters untouched."""
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 24, 3))
  t = jnp.array([0.3, 0.9])
  build = lambda op: _open_gates(nn.PointFlow(nn.PointFlowConfig.create(width=16, num_heads=2, depth=2, operator=op),
                                              rngs=nnx.Rngs(0)))
  model = build(src)
  params = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
  outs = {}
  for dst in CORNERS:
    nn.graft(model, dst)
    outs[dst] = model(x, t)
    np.testing.assert_allclose(outs[dst], build(dst)(x, t), atol=1e-6)
    jax.tree.map(np.testing.assert_array_equal, params, jax.tree.map(np.asarray, nnx.state(model, nnx.Param)))
  for a in CORNERS:                       # and the operators really differ on these weights
    for b in CORNERS:
      if a < b:
        assert float(jnp.abs(outs[a] - outs[b]).max()) > 1e-3, (a, b)


def test_attention_matches_operator_transport_per_head():
  """Attention = Σ_h W_O^h transport(q^h, k^h, v^h) with its own projections (learnable β, α per head)."""
  att = nn.Attention(nn.BlockConfig(width=16, num_heads=2, head_dim=8, operator="DMTN", learnable_operator=True,
                                    use_rope=True, qk_norm=True), rngs=nnx.Rngs(0))
  att.beta[...] = jnp.array([0.2, 0.9])
  x = jax.random.normal(jax.random.PRNGKey(3), (1, 10, 16))
  q, k, v = att.qkv(x)
  p = operators.markov_matrix(q, k, beta=jnp.array([0.2, 0.9]), alpha=jnp.array([1.0, 1.0]))
  ref = jnp.einsum("bhij,bjhe,hed->bid", p, v, att.wo[...])
  np.testing.assert_allclose(att(x), ref, atol=1e-5)


def test_capture_returns_qk_per_layer():
  model = nn.GPT(nn.GPTConfig.from_depth(3, vocab_size=16, head_dim=8, width=16), rngs=nnx.Rngs(0))
  tok = jnp.zeros((2, 7), jnp.int32)
  out, qks = nn.capture_qk(model, lambda: model(tok))
  assert out.shape == (2, 7, 16) and len(qks) == 3 and qks[0][0].shape == (2, 7, 2, 8)
  assert not any(m.capture for m in nn.attention_modules(model))


@pytest.mark.parametrize("make,match", [
    (lambda: nn.GPT(nn.GPTConfig.from_depth(1, head_dim=24, width=32), rngs=nnx.Rngs(0)), "does not divide width"),
    (lambda: nn.Block(nn.BlockConfig(width=30, num_heads=4), rngs=nnx.Rngs(0)), "does not divide width"),
    (lambda: nn.PointFlow(nn.PointFlowConfig.create(operator="SOFTMAX"), rngs=nnx.Rngs(0)), "operator must be one of"),
    (lambda: nn.PointFlow(nn.PointFlowConfig.create(operator=(2.0, 0.0)), rngs=nnx.Rngs(0)), "beta must lie in"),
    (lambda: nn.PointFlow(nn.PointFlowConfig.create(order="sideways"), rngs=nnx.Rngs(0)), "order must be one of"),
    (lambda: nn.DiT(nn.DiTConfig.create(image_size=9, patch=2), rngs=nnx.Rngs(0)), "does not divide image_size"),
    (lambda: nn.DiTConfig.preset("XXL/1"), "preset must be one of"),
])
def test_bad_configs_fail_fast(make, match):
  with pytest.raises(ValueError, match=match):
    make()


@pytest.mark.parametrize("fields, message", [
    (dict(mlp_ratio=0), "mlp_ratio must be a finite number > 0; got 0"),
    (dict(mlp_ratio=-1), "mlp_ratio must be a finite number > 0"),
    (dict(mlp_ratio=float("nan")), "mlp_ratio must be a finite number > 0"),
    (dict(mlp_ratio=0.001), "without a hidden unit"),
    (dict(norm_eps=-1.0), "norm_eps must be a finite number > 0; got -1.0"),
    (dict(norm_eps=0.0), "norm_eps must be a finite number > 0"),
    (dict(rope_base=0.5), "rope_base must be a finite number > 1"),
    (dict(qk_gain=float("inf")), "qk_gain must be a finite number"),
    (dict(dtype="foo"), "dtype must be one of"),
    (dict(rope_dtype="int8"), "rope_dtype must be one of .* or None"),
    (dict(mlp_act="tanh"), "mlp_act must be one of"),
    (dict(num_heads=0), "num_heads must be an integer ≥ 1; got 0"),
])
def test_impossible_block_fields_are_one_line_before_any_array(fields, message):
  """The second fault-injection pass: mlp_ratio 0 or −1 crashed inside XLA (ZeroDivisionError, MLIRError) and
  norm_eps −1 was accepted and trained to NaN; every field is now checked by `BlockConfig.validate`."""
  with pytest.raises(ValueError, match=message):
    nn.BlockConfig(**dict(dict(width=16, num_heads=2), **fields)).validate()


def test_gpt_rejects_tokens_outside_the_vocabulary():
  model = nn.GPT(nn.GPTConfig.from_depth(1, vocab_size=16, head_dim=8, width=16), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"tokens must lie in \[0, 16\)"):
    model(jnp.array([[1, 16]]))
  with pytest.raises(ValueError, match="integer array"):
    model(jnp.ones((1, 2)))


@pytest.mark.parametrize("table_dtype", [None, "bfloat16"])
def test_rope_tables_are_the_host_float32_tables_of_nanochat_and_hugging_face(table_dtype):
  """Under jit, at 512 positions and head dim 64: the rotation uses exactly numpy's float32 tables of
  `1 / base ** (arange(0, k, 2) / k)` (rounded to bf16 where asked). XLA's own cos/sin of its own θ
  differ by an ulp at large angles, and bf16 rounding turns a few of those into 4e-3 errors."""
  import ml_dtypes
  n, k, base = 512, 64, 100_000.0
  x = np.random.default_rng(0).standard_normal((1, n, 2, k)).astype(np.float32)
  dtype = None if table_dtype is None else jnp.dtype(table_dtype)
  got = jax.jit(lambda x: layers.rope(x, None, base, sign=-1, table_dtype=dtype))(x)
  inv = 1.0 / base ** (np.arange(0, k, 2, dtype=np.float32) / k)
  ang = np.outer(np.arange(n, dtype=np.float32), inv.astype(np.float32))
  keep = np.float32 if table_dtype is None else ml_dtypes.bfloat16
  cos = np.cos(ang).astype(keep).astype(np.float64)[None, :, None]
  sin = -np.sin(ang).astype(keep).astype(np.float64)[None, :, None]
  x1, x2 = x[..., :k // 2].astype(np.float64), x[..., k // 2:].astype(np.float64)
  want = np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-6, rtol=0)
  traced = jax.jit(lambda x, p: layers.rope(x, p, base, sign=-1, table_dtype=dtype))(x, jnp.arange(n))
  assert np.abs(np.asarray(traced) - want).max() < (2e-6 if table_dtype is None else 2e-2)   # decode path: XLA's cos


@pytest.mark.parametrize("kwargs, message", [
    (dict(width=0), "width must be an integer ≥ 1 or None; got 0"),
    (dict(depth=0), "depth must be an integer ≥ 1; got 0"),
    (dict(head_dim=-4), "head_dim must be an integer ≥ 1"),
    (dict(vocab_size=0), "GPTConfig.vocab_size must be an integer ≥ 1; got 0"),
    (dict(seq_len=0), "GPTConfig.seq_len must be an integer ≥ 1; got 0"),
])
def test_gpt_sizes_below_one_are_refused_in_one_line(kwargs, message):
  """`width=0` was read as 'not given' (width 64); a zero context or vocabulary was accepted."""
  args = dict(depth=1, head_dim=8, vocab_size=16, seq_len=8)
  args.update(kwargs)
  depth = args.pop("depth")
  with pytest.raises(ValueError, match=message):
    nn.GPT(nn.GPTConfig.from_depth(depth, **args), rngs=nnx.Rngs(0))


def test_every_model_config_has_its_name_in_messages():
  """One-line refusals name a run folder's model by its config class: "holds an encoder (BERT/ALBERT) model" (a
  newcomer read "a Encoder run" and "holds a GPTConfig")."""
  from attngeo.nn import config as C
  assert set(C.MODEL_NAMES) == set(C.CONFIGS)
  assert C.model_name("EncoderConfig") == "an encoder (BERT/ALBERT) model" and C.model_name("GPTConfig") == "a GPT model"
  assert C.model_name(None) == "no model config" and C.model_name("FooConfig") == "a Foo model"

"""KV-cached decoding of augmented keys equals the full forward pass under every operator."""
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attngeo import nn
from attngeo.lm.generate import Sampler

OPERATORS = [("ATTN", False), ("DMAP", False), ("DMTN", False), ("ATAP", False), ((0.3, 0.7), False), ("ATAP", True)]


def forward(model, tokens):
  """The full (uncached) forward pass, compiled once."""
  return np.asarray(nnx.jit(lambda m, t: m(t))(model, jnp.asarray(tokens)))


def gpt(operator="ATTN", learnable=False, seq_len=16):
  cfg = nn.GPTConfig.from_depth(2, vocab_size=30, seq_len=seq_len, head_dim=8, width=16, operator=operator,
                                learnable_operator=learnable)
  model = nn.GPT(cfg, rngs=nnx.Rngs(0))
  if learnable:   # distinct per-head (β, α) away from the corner
    for m in nn.attention_modules(model):
      m.beta[...] = jnp.array([0.2, 0.9])
      m.alpha[...] = jnp.array([0.6, 0.1])
  return model


@pytest.mark.parametrize("operator,learnable", OPERATORS)
def test_cached_logits_equal_the_full_forward(operator, learnable):
  model = gpt(operator, learnable)
  tokens = np.random.default_rng(0).integers(0, 30, (2, 14)).astype(np.int32)
  full = forward(model, tokens)
  cached = Sampler(model).logits(tokens[:, :5], tokens[:, 5:])        # prefill 5, then one token at a time
  np.testing.assert_allclose(cached, full, atol=2e-5, rtol=1e-5)


def test_greedy_generation_matches_an_uncached_loop():
  model = gpt("DMTN")
  prompt = [1, 2, 3]
  out = Sampler(model).generate(prompt, 6, temperature=0.0)[0]
  ids = np.zeros((1, 16), np.int32)          # causal: padding after position t leaves its logits unchanged
  ids[0, :3] = prompt
  step = nnx.jit(lambda m, t: m(t))
  for t in range(3, 9):
    ids[0, t] = int(np.argmax(np.asarray(step(model, jnp.asarray(ids)))[0, t - 1]))
  assert out == ids[0, 3:9].tolist()
  assert Sampler(model).generate(prompt, 6, temperature=1.0, top_k=1)[0] == out      # top-1 sampling is greedy


def test_generation_stops_at_the_context_and_rejects_long_prompts():
  s = Sampler(gpt(seq_len=8))
  samples = s.generate([1, 2, 3], 50, temperature=1.0, num_samples=3, seed=1)
  assert len(samples) == 3 and all(len(x) == 5 for x in samples)
  with pytest.raises(ValueError, match="prompt is 9 tokens; the model's context is 8 tokens"):
    s.generate(list(range(9)), 4)
  with pytest.raises(ValueError, match="temperature must be"):
    s.generate([1], 4, temperature=-1.0)
  with pytest.raises(ValueError, match="prompt is 8 tokens; the model's context is 8 tokens, so no new token fits"):
    s.generate(list(range(8)), 4)
  for kwargs, message in (({"max_new_tokens": -5}, "max_new_tokens must be an integer ≥ 1; got -5"),
                          ({"max_new_tokens": 0}, "max_new_tokens must be an integer ≥ 1; got 0"),
                          ({"num_samples": 0}, "num_samples must be an integer ≥ 1; got 0"),
                          ({"top_k": 0}, "top_k must be an integer ≥ 1 .or none"),
                          ({"temperature": float("nan")}, "temperature must be ≥ 0")):
    with pytest.raises(ValueError, match=message):       # these returned nothing (or crashed) without a word
      s.generate([1], **{"max_new_tokens": 4, **kwargs})
  assert s.room([1, 2, 3]) == 5

"""Sampling from a GPT with a KV cache of the augmented keys: O(T) work per new token under any operator.

Every operator (β, α) is one scaled-dot-product attention on augmented heads plus a per-key bias
(`attngeo.operators.augment`); the augmented key, the value and the bias of token j depend on token j
alone, so they are cached once (`GPT.init_cache` / `GPT.decode`). The prompt is run through the
cache in one call (prefill), then each new token costs one cached step. Sampling: logits / T
restricted to the `top_k` largest (when given), then a categorical draw; `temperature=0` is greedy.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def _sample(logits, key, temperature: float, top_k: int | None):
  """logits [b, V] → ids [b]."""
  if temperature == 0:
    return jnp.argmax(logits, -1)
  if top_k:
    kth = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  return jax.random.categorical(key, logits / temperature, axis=-1)


ARG_NAMES = ("max_new_tokens", "temperature", "top_k", "num_samples")


def check_args(max_new_tokens: int, temperature: float, top_k: int | None, num_samples: int,
               names: tuple[str, str, str, str] = ARG_NAMES) -> None:
  """One-line ValueError naming (by `names`: a command passes its flags) the first sampling argument
  no sample can use."""
  from attngeo.optim import is_integer
  rules = ((max_new_tokens, is_integer(max_new_tokens) and max_new_tokens >= 1, "an integer ≥ 1"),
           (temperature, temperature >= 0, "≥ 0 (0: greedy)"),
           (top_k, top_k is None or (is_integer(top_k) and top_k >= 1), "an integer ≥ 1 (or none: all tokens)"),
           (num_samples, is_integer(num_samples) and num_samples >= 1, "an integer ≥ 1"))
  for name, (value, ok, expected) in zip(names, rules):
    if not ok:
      raise ValueError(f"{name} must be {expected}; got {value!r}")


class Sampler:
  """Cached autoregressive decoding of one model (compiled once per prompt length and once per step)."""

  def __init__(self, model):
    self.model = model
    self.graphdef, self.state = nnx.split(model)
    self.seq_len = model.cfg.seq_len

    def step(state, tokens, caches, pos):
      return nnx.merge(self.graphdef, state).decode(tokens, caches, pos)
    self._step = jax.jit(step)

  def room(self, prompt: list[int]) -> int:
    """New tokens that fit after `prompt` in the context: `seq_len − len(prompt)`."""
    return self.seq_len - len(prompt)

  def logits(self, prompt: np.ndarray, continuation: np.ndarray | None = None) -> np.ndarray:
    """Cached logits [b, n, V] of `prompt` [b, p] followed by `continuation` [b, c] fed one token at a
    time (n = p + c): equal to the model's full forward on the concatenation."""
    prompt = np.asarray(prompt, np.int32)
    caches = self.model.init_cache(prompt.shape[0])
    out, caches = self._step(self.state, jnp.asarray(prompt), caches, jnp.int32(0))
    outs = [np.asarray(out)]
    for c in range(0 if continuation is None else continuation.shape[1]):
      out, caches = self._step(self.state, jnp.asarray(continuation[:, c:c + 1], jnp.int32), caches,
                               jnp.int32(prompt.shape[1] + c))
      outs.append(np.asarray(out))
    return np.concatenate(outs, 1)

  def generate(self, prompt: list[int], max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
               num_samples: int = 1, seed: int = 0, stop: int | None = None) -> list[list[int]]:
    """`num_samples` continuations of `prompt` (ids), each at most `max_new_tokens` long and never past
    the context (at most `seq_len − len(prompt)` tokens: `room`); a sample ends early at token `stop`
    (not included)."""
    check_args(max_new_tokens, temperature, top_k, num_samples)
    if not prompt:
      raise ValueError("prompt must hold at least one token (start with BOS for an unconditioned sample)")
    if len(prompt) >= self.seq_len:
      raise ValueError(f"prompt is {len(prompt)} tokens; the model's context is {self.seq_len} tokens, "
                       f"so no new token fits")
    steps = min(max_new_tokens, self.room(prompt))
    caches = self.model.init_cache(num_samples)
    tokens = jnp.asarray(np.tile(np.asarray(prompt, np.int32), (num_samples, 1)))
    logits, caches = self._step(self.state, tokens, caches, jnp.int32(0))
    key = jax.random.PRNGKey(seed)
    out, alive = [], np.ones(num_samples, bool)
    for t in range(steps):
      nxt = np.asarray(_sample(logits[:, -1], jax.random.fold_in(key, t), temperature, top_k))
      out.append(nxt)
      if stop is not None:
        alive &= nxt != stop
        if not alive.any():
          break
      if t + 1 < steps:
        logits, caches = self._step(self.state, jnp.asarray(nxt[:, None], jnp.int32), caches,
                                    jnp.int32(len(prompt) + t))
    samples = np.stack(out, 1) if out else np.zeros((num_samples, 0), np.int32)
    result = []
    for row in samples.tolist():
      result.append(row[:row.index(stop)] if stop is not None and stop in row else row)
    return result

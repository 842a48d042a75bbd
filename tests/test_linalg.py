"""attngeo.linalg: the same decompositions as jnp.linalg, one matrix per LAPACK call.

jaxlib 0.10's batched CPU LAPACK kernels deadlock when as many run at once as XLA's intra-op pool
has threads (2 on a 2-core machine): the probe of a trained SiT and the d12 probe hung. A hang is
a race, so the tests check the structure that rules it out: no LAPACK primitive in the probe's
layer program, or in `markov.stationary`/`spectrum` of a batch, sees more than one matrix.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attngeo import linalg, markov, nn, probe

LAPACK = ("lu", "eigh", "svd", "eig", "qr", "geqrf", "householder_product", "triangular_solve", "cholesky", "schur")


def lapack_operand_shapes(jaxpr):
  """Operand shapes of every LAPACK-backed equation in a jaxpr, sub-jaxprs (loops, conds, jit) included."""
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in LAPACK:
      out.append((eqn.primitive.name, eqn.invars[0].aval.shape))
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          out.extend(lapack_operand_shapes(sub))
  return out


def test_decompositions_match_jnp_linalg_on_batches():
  a = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 5, 5))
  s = a @ jnp.swapaxes(a, -1, -2) + 5 * jnp.eye(5)
  np.testing.assert_allclose(linalg.eigvalsh(s), jnp.linalg.eigvalsh(s), rtol=1e-5)
  w, u = linalg.eigh(s)
  np.testing.assert_allclose(u @ (w[..., None] * jnp.swapaxes(u, -1, -2)), s, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(linalg.svdvals(a[..., :4]), jnp.linalg.svd(a[..., :4], compute_uv=False), rtol=1e-5)
  b = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 5, 2))
  for trans in (0, 1):
    x = linalg.lu_solve(linalg.lu_factor(s), b, trans=trans)
    np.testing.assert_allclose((jnp.swapaxes(s, -1, -2) if trans else s) @ x, b, rtol=1e-4, atol=1e-5)
  assert linalg.eigvalsh(s[0, 0]).shape == (5,)                      # no leading axes: a plain call


def test_no_lapack_call_sees_more_than_one_matrix():
  p = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(5), (3, 2, 7, 7)), -1)
  for fn in (lambda a: markov.stationary(a).pi, lambda a: markov.spectrum(a, 3).values):
    shapes = lapack_operand_shapes(jax.make_jaxpr(fn)(p).jaxpr)
    assert shapes and all(len(s) == 2 for _, s in shapes), shapes
  single = jnp.stack([markov.stationary(p[i, j]).pi for i in range(3) for j in range(2)]).reshape(3, 2, 7)
  np.testing.assert_allclose(markov.stationary(p).pi, single, rtol=1e-6, atol=1e-7)
  model = nn.GPT(nn.GPTConfig.from_depth(1, vocab_size=32, head_dim=8, width=16, operator="DMTN"), rngs=nnx.Rngs(0))
  x = jnp.arange(12)[None] % 32
  _, qks = nn.capture_qk(model, lambda: model(x))
  inputs = probe._layer_inputs(*qks[0], nn.attention_modules(model)[0], None)
  layer = functools.partial(probe._layer_impl, causal=False, samples=8, num_moduli=4)
  shapes = lapack_operand_shapes(jax.make_jaxpr(layer)(*inputs, jax.random.PRNGKey(0)).jaxpr)
  assert {name for name, _ in shapes} >= {"lu", "eigh"} and all(len(s) == 2 for _, s in shapes), shapes


def test_the_damped_law_and_every_walk_term_gradient_see_one_matrix_per_lapack_call():
  """The reversibility term's damped law π_τ was a batched `jnp.linalg.solve` (1409e54): `attngeo study
  curvature --reversibility 0.1` hung at its first steps on 2 cores (two layers' batched getrf/trsm at
  once, both pool threads blocked in ParallelBatchMap). Its value and gradient now map one matrix at a
  time, as do the other walk terms' (the mixing term's Lanczos route hung the same way on a batched
  solve and eigh before it was written with `attngeo.linalg`)."""
  from attngeo import regularisers as reg
  q, k = (jax.random.normal(jax.random.PRNGKey(i), (2, 6, 2, 4)) for i in (1, 2))
  p = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(3), (2, 3, 6, 6)), -1)
  shapes = lapack_operand_shapes(jax.make_jaxpr(lambda a: markov.damped_law(a, 0.01))(p).jaxpr)
  assert shapes and all(len(s) == 2 for _, s in shapes), shapes
  for term in (lambda a, b: reg.reversibility(a, b), lambda a, b: reg.reversibility(a, b, kind="entropy"),
               lambda a, b: reg.mixing(a, b, target=2.0), lambda a, b: reg.mixing(a, b, target=2.0, steps=0)):
    shapes = lapack_operand_shapes(jax.make_jaxpr(jax.grad(term, argnums=(0, 1)))(q, k).jaxpr)
    assert shapes and all(len(s) == 2 for _, s in shapes), shapes
  single = jnp.stack([markov.damped_law(p[i, j], 0.01) for i in range(2) for j in range(3)]).reshape(2, 3, 6)
  np.testing.assert_allclose(markov.damped_law(p, 0.01), single, rtol=1e-6, atol=1e-7)
  # π_τ solves π_τ (I − (1 − τ)P) = τu, checked in float64 against numpy's dense solve
  p64 = np.asarray(p, np.float64)
  ref = np.stack([np.linalg.solve((np.eye(6) - 0.99 * m).T, np.full(6, 0.01 / 6)) for m in p64.reshape(-1, 6, 6)])
  np.testing.assert_allclose(np.asarray(markov.damped_law(p, 0.01)).reshape(-1, 6), ref / ref.sum(-1, keepdims=True),
                             rtol=1e-5, atol=1e-7)

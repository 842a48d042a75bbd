"""Dense decompositions one matrix per LAPACK call, over any leading axes.

Why: jaxlib 0.10's CPU LAPACK kernels (`getrf`, `trsm`, `syevd`, `gesdd`, `geev`, …) split a batch
of matrices over XLA's intra-op thread pool and block until the pieces are done. When as many
batched kernels run at once as the pool has threads — independent branches of one program, 2 on a
2-core machine — every thread waits on work that no thread is left to run, and the program hangs
(seen in the probe of a trained SiT and at nanochat's d12 shape; jaxlib 0.11 compiles that path
out). Mapping a decomposition over the leading axes with `lax.map` gives every kernel a single
matrix, which runs inline. Use these instead of `jnp.linalg` on batched operands in jitted code;
`jax.vmap` of them batches the kernels again, so batch with `map_matrices`, not `vmap`.

The decompositions are jitted: called outside a trace (a read-out run eagerly, a test), `lax.map`'s
body is a new closure each call, so its `scan` was traced and lowered anew every time (289 of the
suite's lowerings repeated an identical program, 7.7 s); jitted, a shape is lowered once per process.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def map_matrices(fn, *args, core: int = 2):
  """`fn` applied to one item at a time: the leading axes of `args[0]` beyond its last `core` axes
  (every arg shares them) are flattened and mapped with `lax.map`; outputs regain those axes."""
  lead = args[0].shape[:args[0].ndim - core]
  if not lead:
    return fn(*args)
  flat = tuple(a.reshape((-1,) + a.shape[len(lead):]) for a in args)
  out = jax.lax.map(lambda xs: fn(*xs), flat)
  return jax.tree.map(lambda o: o.reshape(lead + o.shape[1:]), out)


@jax.jit
def eigh(a):
  """(eigenvalues [..., n] ascending, eigenvectors [..., n, n]) of symmetric/Hermitian a [..., n, n]."""
  return map_matrices(jnp.linalg.eigh, a)


@jax.jit
def eigvalsh(a):
  """Eigenvalues [..., n], ascending, of symmetric/Hermitian a [..., n, n]."""
  return map_matrices(jnp.linalg.eigvalsh, a)


@jax.jit
def svdvals(a):
  """Singular values [..., min(m, n)], descending, of a [..., m, n]."""
  return map_matrices(lambda x: jnp.linalg.svd(x, compute_uv=False), a)


@jax.jit
def lu_factor(a):
  """`jax.scipy.linalg.lu_factor` of a [..., n, n]: (lu [..., n, n], pivots [..., n])."""
  return map_matrices(jax.scipy.linalg.lu_factor, a)


@functools.partial(jax.jit, static_argnames="trans")
def lu_solve(lu_and_piv, b, trans: int = 0):
  """Solve with `lu_factor`'s output for b [..., n, m] (the same leading axes as lu)."""
  lu, piv = lu_and_piv
  return map_matrices(lambda l, p, x: jax.scipy.linalg.lu_solve((l, p), x, trans=trans), lu, piv, b)

"""Multi-head attention as one connection walk (seed "From Self-Attention to Connection Laplacian").

Column convention: tokens x_j ∈ R^d, head h has attention `P^h` `[n, n]` and transport
`T^h = W_O^h W_V^h = O_h V_h` `[d, d]` (`O_h` `[d, k]`, `V_h` `[k, d]`, rank ≤ k). The layer output is

    y_i = Σ_h Σ_j P^h_ij T^h x_j = H Σ_j W_ij T_ij x_j,
    W_ij = (1/H) Σ_h P^h_ij                       (the walk: row-stochastic),
    T_ij = Σ_h g^h_ij T^h,  g^h_ij = P^h_ij / Σ_h' P^h'_ij   (attention-gated mixture of transports).

A single head has the constant transport T_ij = T^1. The random-walk connection Laplacian is
`(Δ F)_i = F_i − Σ_j W_ij T_ij F_j` for vector fields F `[n, d]` — `I − (W ⊗ T)` — applied here
as `F − (1/H) Σ_h P^h F T^hᵀ` without forming any per-edge T_ij.

**Scaled-isometry defect — the one definition** (every route here reads this number). For T
`[d, d]` with singular values σ₁ ≥ σ₂ ≥ …, `M = TᵀT`, eigenvalues λ_i = σ_i²:

    δ(T) = min_c ‖M − c P_r‖_F / ‖M‖_F = sqrt( Σ_{i≤r} (λ_i − λ̄)² / Σ_{i≤r} λ_i² ),   λ̄ = c = tr M / r,

with P_r the projector onto T's row space (T has rank ≤ k, so isometry is judged where it acts)
and the **rank rule** `r = #{i : σ_i > 10⁻⁶ σ₁}` (`σ_i² > RANK_RTOL·σ₁²`, `RANK_RTOL = 1e-12`): the
exact-arithmetic rank, the cut only separating structural zeros from float32 round-off (float32
SVD leaves them below ~3·10⁻⁷·σ₁ at d = 768); a small but real singular value (a head with gate
10⁻⁴) counts. Two routes compute it:

* dense (`isometry_defect`, `head_isometry_defect`, `effective_isometry_defect_dense`): singular
  values of T (never eigenvalues of TᵀT, which square the conditioning), then the sum of squared
  deviations above — well conditioned: an exact isometry reads δ at float32 round-off (< 10⁻⁶);
* trace tables (`effective_isometry_defect`): only `tr M`, `‖M‖_F²` and r are known per edge, so
  `δ² = 1 − (tr M)² / (r ‖M‖_F²)`. That difference cancels in float32: its **resolution floor**
  is `|δ²_tables − δ²| ≤ TABLE_FLOOR2 = 2·10⁻⁶` (≈ 17 ε₃₂; measured 2.4·10⁻⁷ on exact isometries,
  δ = 3–5·10⁻⁴ where the truth is 0), i.e. δ below ~1.4·10⁻³ is not resolved, while at δ ≥ 0.1 the
  two routes agree to a relative 10⁻⁴ (tested 2·10⁻⁵ against float64). The rank is the same rule
  (`mixture_rank`), so the routes differ only by that floor and where a real singular value falls
  under the cut.

**Trace tables: the effective defect without per-edge d×d work.** `M_ij = Σ_ab g^a g^b T^aᵀT^b`,
so `tr M_ij = gᵀ G g` and `‖M_ij‖_F² = Σ_abcd g^a g^b g^c g^d K_abcd` with, once per layer,

    G_ab = tr(T^aᵀT^b) = tr(A_ab B_ba),   K_abcd = tr(T^aᵀT^b T^cᵀT^d) = tr(A_ab B_bc A_cd B_da),
    A_ab = O_aᵀO_b,  B_ab = V_a V_bᵀ   ([k, k] blocks: H³k³ work, never d×d per edge).

The rank of a gated mixture `T(g) = Σ_h g^h T^h` is *not* the sum of the heads' ranks (the row
space of a mixture can be smaller than the sum of the row spaces), but it is a polynomial
condition on g: on each gate support S = {h : g^h > 0} it equals the mixture's generic rank r(S)
(its value at a random g supported on S) except on a proper algebraic subset of gates (measure
zero). So δ(T_ij) is exact from (G, K, r(S_ij)). Softmax gates are positive on every unmasked
edge, so one support — all heads — carries the walk; edges where some head's weight is exactly 0
(underflow, head-specific masks) have other supports, whose share of W is estimated by sampling
edges from W (importance sampling) with a reported standard error. This is the definition's
exact-arithmetic row space (the rank rule above), the one the dense route counts too.

**Layer stability** of walks: relative Frobenius change (also in units of the walks' distance from
the uniform walk, `uniform_relative_change`), mean row Jensen–Shannon divergence, and
the ℓ² distance between the k largest eigenvalue moduli (`walk_moduli`). Layouts follow
`attngeo.nn`: `wv` `[d, h, k]` (v = x·wv), `wo` `[h, k, d]`.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import _checks, linalg, markov

_HI = jax.lax.Precision.HIGHEST
_TINY = 1e-30
RANK_RTOL = 1e-12          # the rank rule: σ_i² > RANK_RTOL·σ₁² (module docstring), every route
TABLE_FLOOR2 = 2e-6        # resolution of the trace-table route in δ² (module docstring)


def _check_heads(p, transports):
  _checks.check_stochastic("P", p)
  if p.ndim != 3:
    raise ValueError(f"P must be [heads, n, n]; got shape {p.shape}")
  if transports.ndim != 3 or transports.shape[-1] != transports.shape[-2]:
    raise ValueError(f"transports must be [heads, d, d]; got shape {transports.shape}")
  if transports.shape[0] != p.shape[0]:
    raise ValueError(f"P has {p.shape[0]} heads but transports has {transports.shape[0]}")


def _check_factors(wv, wo):
  if wv.ndim != 3 or wo.ndim != 3 or wv.shape[1:] != wo.shape[:2] or wv.shape[0] != wo.shape[2]:
    raise ValueError(f"wv must be [d, h, k] and wo [h, k, d] with matching h, k, d; got {wv.shape}, {wo.shape}")


def head_transports(wv, wo) -> jax.Array:
  """`T^h = W_O^h W_V^h` `[h, d, d]` (column convention) from `wv` `[d, h, k]`, `wo` `[h, k, d]`."""
  _check_factors(wv, wo)
  return jnp.einsum("dhk,hke->hed", wv, wo, precision=_HI)


def walk(p) -> jax.Array:
  """`W = (1/H) Σ_h P^h` `[..., n, n]` from per-head P `[..., h, n, n]`."""
  _checks.check_stochastic("P", p)
  return p.mean(-3)


def gates(p, eps: float = _TINY) -> jax.Array:
  """`g^h_ij = P^h_ij / Σ_h' P^h'_ij` `[h, n, n]` (0 where no head attends)."""
  return p / jnp.maximum(p.sum(0, keepdims=True), eps)


def edge_transports(p, transports, rows=None) -> jax.Array:
  """Per-edge `T_ij` `[len(rows), n, d, d]` for the given query rows (all rows: n²·d² memory)."""
  _check_heads(p, transports)
  g = gates(p)
  if rows is not None:
    g = g[:, rows]
  return jnp.einsum("hij,hde->ijde", g, transports, precision=_HI)


# ----------------------------------------------------------------------------- isometry defect

def _row_space(lam, rtol):
  """The rank rule: mask of the squared singular values λ = σ² `[..., m]` counted as nonzero, λ > rtol·max λ."""
  return lam > rtol * jnp.max(lam, -1, keepdims=True)


def _defect(trace, frob2, rank):
  """The trace-table form `δ = sqrt(1 − tr² / (r ‖M‖_F²))` and `c = tr / r` (δ = 0 for M = 0); resolution
  `TABLE_FLOOR2` in δ² (module docstring)."""
  rank = jnp.maximum(rank, 1)
  ratio = trace**2 / (rank * jnp.maximum(frob2, _TINY))
  return jnp.sqrt(jnp.clip(1.0 - ratio, 0.0, 1.0)), trace / rank


def defect_from_singular_values(sigma, rtol: float = RANK_RTOL) -> tuple[jax.Array, jax.Array]:
  """The definition (module docstring) from T's singular values σ `[..., m]` (any order): with the r
  values kept by the rank rule `σ_i² > rtol·σ₁²` and λ = σ², `δ = sqrt(Σ (λ − λ̄)² / Σ λ²)`,
  `c = λ̄ = Σλ / r` — a sum of squared deviations, so an exact isometry reads δ at round-off.
  Returns (defect [...], scale c [...]); δ = 0, c = 0 for T = 0."""
  lam = jnp.square(sigma)
  keep = _row_space(lam, rtol)
  r = jnp.maximum(keep.sum(-1), 1)
  mean = jnp.sum(jnp.where(keep, lam, 0.0), -1) / r
  num = jnp.sum(jnp.where(keep, (lam - mean[..., None]) ** 2, 0.0), -1)
  den = jnp.maximum(jnp.sum(jnp.where(keep, lam**2, 0.0), -1), _TINY)
  return jnp.sqrt(num / den), mean


def isometry_defect(t, rtol: float = RANK_RTOL) -> tuple[jax.Array, jax.Array]:
  """δ(T) of T `[..., d, d]`, the module docstring's definition: `min_c ‖TᵀT − c P_r‖_F / ‖TᵀT‖_F` on T's
  row space (rank r by `σ_i² > rtol·σ₁²`), 0 iff T is a scaled isometry there.

  Dense (one SVD per matrix, `defect_from_singular_values`). Returns (defect [...], scale c [...]).
  """
  return defect_from_singular_values(linalg.svdvals(t), rtol)


def head_isometry_defect(wv, wo, rtol: float = RANK_RTOL) -> tuple[jax.Array, jax.Array]:
  """`isometry_defect(T^h)` of every head `[h]` from k×k blocks, without forming T^h.

  With the thin QR factorisations `O_h = Q_O R_O`, `V_hᵀ = Q_V R_V` (`R` `[k, k]`),
  `T^h = Q_O (R_O R_Vᵀ) Q_Vᵀ` has the singular values of the k×k matrix `R_O R_Vᵀ`. Returns
  (defect [h], scale c [h]).
  """
  _check_factors(wv, wo)
  wv, wo = wv.astype(jnp.float32), wo.astype(jnp.float32)
  qr_r = lambda x: linalg.map_matrices(lambda m: jnp.linalg.qr(m, mode="r"), x)
  r_o = qr_r(jnp.swapaxes(wo, -1, -2))                                      # O_h = wo[h]ᵀ  [h, d, k] -> R_O
  r_v = qr_r(jnp.transpose(wv, (1, 0, 2)))                                  # V_hᵀ = wv[:, h] [h, d, k] -> R_V
  core = jnp.matmul(r_o, jnp.swapaxes(r_v, -1, -2), precision=_HI)
  return defect_from_singular_values(linalg.svdvals(core), rtol)


class TransportTables(NamedTuple):
  """What the effective defect needs of a layer's head transports, computed once per layer:
  `gram[a, b] = tr(T^aᵀT^b)` `[h, h]`, `quartic[a, b, c, d] = tr(T^aᵀT^b T^cᵀT^d)` `[h, h, h, h]`,
  the ranks of the stacked factors `rank_o = rank O`, `rank_v = rank V` and `rank`, the rank of
  the mixture with every head gating (`mixture_rank`)."""
  gram: jax.Array
  quartic: jax.Array
  rank_o: jax.Array
  rank_v: jax.Array
  rank: jax.Array


def transport_tables(wv, wo, *, key=None, rtol: float = RANK_RTOL) -> TransportTables:
  """`TransportTables` from `wv` `[d, h, k]`, `wo` `[h, k, d]` through the k×k blocks
  `A_ab = O_aᵀO_b`, `B_ab = V_a V_bᵀ` (H³k³ work and H²k² memory per head a, never d×d per pair).
  `key`, `rtol`: the random draws and the cut of `mixture_rank` (draws only when the factor ranks
  do not pin the rank)."""
  _check_factors(wv, wo)
  key = jax.random.PRNGKey(0) if key is None else key
  wv, wo = wv.astype(jnp.float32), wo.astype(jnp.float32)
  a = jnp.einsum("ake,ble->abkl", wo, wo, precision=_HI)                   # A_ab [h, h, k, k]
  b = jnp.einsum("dak,dbl->abkl", wv, wv, precision=_HI)                   # B_ab [h, h, k, k]
  gram = jnp.einsum("abkl,balk->ab", a, b, precision=_HI)

  def row(i):                                                               # K[i, :, :, :]
    left = jnp.einsum("bkl,bclm->bckm", a[i], b, precision=_HI)             # A_ib B_bc
    right = jnp.einsum("cdkl,dlm->cdkm", a, b[:, i], precision=_HI)         # A_cd B_di
    return jnp.einsum("bckm,cdmk->bcd", left, right, precision=_HI)

  every = jnp.ones((wv.shape[1],), bool)
  r_o, r_v = _factor_ranks(wv, wo, every, rtol)
  rank = _pinned_or_generic(wv, wo, every, jax.random.exponential(key, (2, wv.shape[1])), r_o, r_v, rtol)
  return TransportTables(gram, jax.lax.map(row, jnp.arange(a.shape[0])), r_o, r_v, rank)


def gated_traces(g, tables: TransportTables) -> tuple[jax.Array, jax.Array]:
  """`(tr M, ‖M‖_F²)` `[...]` of `M = T(g)ᵀT(g)`, `T(g) = Σ_h g^h T^h`, for gates g `[..., h]`."""
  h = tables.gram.shape[0]
  t = jnp.einsum("...a,ab,...b->...", g, tables.gram, g, precision=_HI)
  u = (g[..., :, None] * g[..., None, :]).reshape(g.shape[:-1] + (h * h,))
  f2 = jnp.sum(jnp.matmul(u, tables.quartic.reshape(h * h, h * h), precision=_HI) * u, -1)
  return t, f2


def _rank(x, rtol):
  """Numerical rank of x `[..., m, n]`: singular values with `σ² > rtol·σ_max²`."""
  return _row_space(linalg.svdvals(x) ** 2, rtol).sum(-1)


def _factor_ranks(wv, wo, support, rtol):
  """(rank O_S, rank V_S) of the supported heads' stacked factors (unsupported heads zeroed)."""
  h, k = wv.shape[1], wv.shape[2]
  sel = support.astype(jnp.float32)[:, None]
  r_o = _rank((wo * sel[:, :, None]).reshape(h * k, -1), rtol)             # O_Sᵀ [m, d]
  r_v = _rank((wv * sel[None]).reshape(wv.shape[0], h * k), rtol)          # V_Sᵀ [d, m]
  return r_o, r_v


def _pinned_or_generic(wv, wo, support, expo, r_o, r_v, rtol):
  """Rank of the mixture on `support` from the factor ranks, else the max over random draws:
  `expo` `[draws, h]` standard exponentials (normalised on the support: Dirichlet(1, …, 1) gates)."""
  k = wv.shape[2]
  m = support.sum() * k

  def generic(_):
    def one(e):
      g = e * support
      g = g / jnp.maximum(g.sum(), _TINY)
      return _rank(jnp.einsum("dhk,h,hke->ed", wv, g, wo, precision=_HI), rtol)
    return jnp.max(linalg.map_matrices(one, expo, core=1))

  return jnp.where(jnp.any(support), _pinned_rank(r_o, r_v, m, generic), 0)


def _pinned_rank(r_o, r_v, m, generic):
  """rank of `O D V` for D invertible on the m supported head dimensions: rank V if O is injective
  (r_o = m), rank O if V is surjective (r_v = m), else `generic(None)` (`mixture_rank`)."""
  return jax.lax.cond((r_o == m) | (r_v == m), lambda _: jnp.where(r_o == m, r_v, r_o), generic, None)


def mixture_rank(wv, wo, support, key, *, draws: int = 2, rtol: float = RANK_RTOL) -> jax.Array:
  """Rank of `T(g) = Σ_h g^h T^h = O D_g V` for gates g > 0 on `support` `[h]` (bool).

  `O = [O_h]` `[d, m]`, `V = [V_h]` `[m, d]`, `D_g = diag(g^h I_k)` over the m = |S|·k supported head
  dimensions, invertible. If O is injective (rank m), `rank T(g) = rank V` for *every* such g; if
  V is surjective (rank m), `rank T(g) = rank O` — the usual case (H·k ≤ d, full-rank weights)
  needs two factor ranks and no draw. Otherwise (H·k > d, or degenerate weights) the rank is
  generic: its value at a random g (Dirichlet on the support) with probability 1; a draw can only
  under-count numerically, so the maximum over `draws` draws is taken. Ranks count singular
  values (not eigenvalues of TᵀT, which square the conditioning) with `σ² > rtol·σ_max²`; float32
  SVD leaves structural zeros below ~3·10⁻⁷·σ_max at d = 768, under the default cut σ = 10⁻⁶·σ_max.
  """
  _check_factors(wv, wo)
  wv, wo = wv.astype(jnp.float32), wo.astype(jnp.float32)
  r_o, r_v = _factor_ranks(wv, wo, support, rtol)
  return _pinned_or_generic(wv, wo, support, jax.random.exponential(key, (draws, wv.shape[1])), r_o, r_v, rtol)


class EffectiveDefect(NamedTuple):
  """The effective transport's defect, W-weighted over edges: `mean = Σ_ij W_ij δ(T_ij) / n`.

  `stderr`: standard error of the sampled part (0 when every edge has the all-heads support);
  `scale`: `Σ_ij W_ij c_ij / n`, the mean scale c; `rank`: generic rank r of the all-heads mixture;
  `sampled_mass`: the share of W on edges with another gate support (estimated by sampling);
  `participation`: `Σ_ij W_ij (tr M_ij)² / ‖M_ij‖_F² / n`, the mean participation ratio of the
  eigenvalues of `M = TᵀT` — the number of directions T_ij acts on with comparable gain
  (`δ² = 1 − participation / r` edge by edge, so it tells a non-isometric gain profile apart
  from a gated mixture that acts on few of its r directions).
  """
  mean: jax.Array
  stderr: jax.Array
  scale: jax.Array
  rank: jax.Array
  sampled_mass: jax.Array
  participation: jax.Array


def rotation_heads(wv, wo):
  """Virtual heads of a magnetic (CMAP) layer: `([wv, wv·J], [wo, wo])` `[d, 2h, k]`, `[2h, k, d]`.

  Its transport on edge ij is `T^h(θ) = W_V^h R(θ^h_ij) W_O^h` with the rotation `R(θ) = cos θ I + sin θ J`
  of the complex value pairs (2c, 2c+1) (row vectors: `(re, im)·J = (−im, re)`, multiplication by i),
  so `Σ_h g^h T^h(θ^h) = Σ_h (g^h cos θ^h) T^h + (g^h sin θ^h) T_J^h`: edge-independent transports of 2h
  virtual heads with signed gates, whose trace tables are exact (`phase_gates`).
  """
  rot = jnp.stack([-wv[..., 1::2], wv[..., 0::2]], -1).reshape(wv.shape)
  return jnp.concatenate([wv, rot], 1), jnp.concatenate([wo, wo], 0)


def phase_gates(g, theta):
  """Gates `[..., 2h]` of the virtual heads (`rotation_heads`) from true gates g and phases θ `[..., h]`."""
  return jnp.concatenate([g * jnp.cos(theta), g * jnp.sin(theta)], -1)


def effective_isometry_defect(p, wv, wo, *, key=None, samples: int = 32, rtol: float = RANK_RTOL,
                              chunk: int = 64, tables: TransportTables | None = None,
                              phases=None) -> EffectiveDefect:
  """W-weighted mean `Σ_ij W_ij δ(T_ij) / n` of the effective transport's defect, from trace tables.

  p: per-head attention `[h, n, n]`; wv `[d, h, k]`, wo `[h, k, d]`. `phases` θ `[h, n, n]` (a CMAP
  layer): the head transports are `W_V^h R(θ^h_ij) W_O^h` (`rotation_heads`; `tables`, if given, must be
  those of the virtual heads); the supports and ranks are the true heads', the rank that of a
  generic mixture of rotation-scaled heads. Edges whose gates are all
  positive (every unmasked softmax edge) get δ exactly from `(G, K, r)`, `chunk` query rows at a
  time (chunk·n·h² memory). Edges with a partial support (some head exactly 0) carry mass
  `sampled_mass`; `samples` of them are drawn from W (key `key`), each gets its own support's
  generic rank, and their mean enters with its standard error (`samples` ≥ 2). `rtol`: the rank
  cut of `mixture_rank`. Jit-compatible (validation only on concrete inputs). Returns `EffectiveDefect`.
  """
  _check_factors(wv, wo)
  _checks.check_stochastic("P", p)
  if p.ndim != 3 or p.shape[0] != wv.shape[1]:
    raise ValueError(f"P must be [heads, n, n] with heads = {wv.shape[1]} (wv's); got shape {p.shape}")
  if samples < 2:
    raise ValueError(f"samples must be at least 2 (a standard error needs two); got {samples}")
  key = jax.random.PRNGKey(0) if key is None else key
  if phases is not None:
    if phases.shape != p.shape:
      raise ValueError(f"phases must be [heads, n, n] like P {p.shape}; got {phases.shape}")
    if wv.shape[2] % 2:
      raise ValueError(f"a magnetic layer's value heads pair channels: k must be even; got {wv.shape[2]}")
    true_factors = (wv.astype(jnp.float32), wo.astype(jnp.float32))
    wv, wo = rotation_heads(*true_factors)
  else:
    true_factors = None
  tables = transport_tables(wv, wo, key=jax.random.fold_in(key, 1), rtol=rtol) if tables is None else tables
  if tables.gram.shape[0] != wv.shape[1]:
    raise ValueError(f"tables hold {tables.gram.shape[0]} heads where {wv.shape[1]} are needed"
                     + (" (a magnetic layer's: transport_tables(*rotation_heads(wv, wo)))" if phases is not None else ""))
  return _effective(p, wv, wo, key, tables, phases, true_factors, samples=samples, rtol=rtol, chunk=chunk)


def _phase_rank(true_factors, wv, wo, support, expo, rtol):
  """Rank of `Σ_{h∈S} g^h W_V^h R(θ^h) W_O^h` (g > 0): `V D O` with D = blockdiag(g R(θ)) invertible, so
  pinned by the TRUE heads' factor ranks as in `mixture_rank`; otherwise the generic rank of the
  virtual heads (`rotation_heads`) at random positive gates. support: true heads [h] (bool)."""
  both = jnp.concatenate([support, support])
  generic = lambda _: _pinned_or_generic(wv, wo, both, expo, *_factor_ranks(wv, wo, both, rtol), rtol)
  rank = _pinned_rank(*_factor_ranks(*true_factors, support, rtol), support.sum() * wv.shape[2], generic)
  return jnp.where(jnp.any(support), rank, 0)


@functools.partial(jax.jit, static_argnames=("samples", "rtol", "chunk"))
def _effective(p, wv, wo, key, tables, phases=None, true_factors=None, *, samples, rtol, chunk):
  h, n, k = p.shape[0], p.shape[-1], wv.shape[2]
  hv = wv.shape[1]                                                          # heads of the tables (2h if phases)
  draws = 2
  wv, wo = wv.astype(jnp.float32), wo.astype(jnp.float32)
  tt = None if phases is None else jnp.transpose(phases.astype(jnp.float32), (1, 2, 0))     # [n, n, h]
  virtual = (lambda g, th: g) if phases is None else phase_gates
  # one draw of uniforms for everything random (one RNG program to compile): Gumbel noise for the
  # two categorical draws, exponentials for the Dirichlet gates of the rank draws
  u = jax.random.uniform(key, (2 * samples * n + samples * draws * hv,), minval=_TINY, maxval=1.0)
  gumbel = -jnp.log(-jnp.log(u[:2 * samples * n])).reshape(2, samples, n)
  expo = -jnp.log(u[2 * samples * n:]).reshape(samples, draws, hv)
  r_o, r_v, r_full = tables.rank_o, tables.rank_v, tables.rank
  if true_factors is not None:               # ranks of the true heads (the virtual factors never pin)
    r_o, r_v = _factor_ranks(*true_factors, jnp.ones((h,), bool), rtol)
    r_full = _pinned_rank(r_o, r_v, h * k, lambda _: tables.rank)
  pt = jnp.transpose(p.astype(jnp.float32), (1, 2, 0))                      # [n, n, h]

  def row(args):                                                            # pi [n, h]: row i of every head
    pi, ti = args
    s = pi.sum(-1)
    g = pi / jnp.maximum(s, _TINY)[:, None]
    w = s / h
    full = jnp.all(pi > 0, -1)
    tr, f2 = gated_traces(virtual(g, ti), tables)
    d, c = _defect(tr, f2, r_full)
    rest = jnp.where(full, 0.0, w)
    part = tr**2 / jnp.maximum(f2, _TINY)
    return (jnp.sum(jnp.where(full, w * d, 0.0)), jnp.sum(jnp.where(full, w * c, 0.0)),
            jnp.sum(jnp.where(full, w * part, 0.0)), rest)

  d_sum, c_sum, p_sum, rest = jax.lax.map(row, (pt, tt), batch_size=min(chunk, n))  # rest [n, n]: W off full support
  rest_rows = rest.sum(-1)
  sampled_mass = rest_rows.sum() / n

  def sampled(_):
    i = jnp.argmax(jnp.log(rest_rows) + gumbel[0], -1)                     # rows ∝ their off-support mass
    j = jnp.argmax(jnp.log(rest[i]) + gumbel[1], -1)                       # then a column ∝ W_ij in the row
    pij = pt[i, j]                                                          # [samples, h]
    g = pij / jnp.maximum(pij.sum(-1, keepdims=True), _TINY)
    g = g if tt is None else phase_gates(g, tt[i, j])
    support = pij > 0                                                       # [samples, h]: the true heads
    if true_factors is None:
      rank_of = lambda a: _pinned_or_generic(wv, wo, a[0], a[1], *_factor_ranks(wv, wo, a[0], rtol), rtol)
    else:
      rank_of = lambda a: _phase_rank(true_factors, wv, wo, a[0], a[1], rtol)
    # full-rank factors (rank H·k each): every sub-support S is pinned at |S|·k; else rank each support
    ranks = jax.lax.cond((r_o == h * k) & (r_v == h * k), lambda _: support.sum(-1) * k,
                         lambda _: jax.lax.map(rank_of, (support, expo)), None)
    tr, f2 = gated_traces(g, tables)
    d, c = _defect(tr, f2, ranks)
    return d.mean(), d.std(ddof=1) / np.sqrt(samples), c.mean(), (tr**2 / jnp.maximum(f2, _TINY)).mean()

  zero = jnp.zeros((), jnp.float32)
  d_mean, d_se, c_mean, p_mean = jax.lax.cond(sampled_mass > 0, sampled, lambda _: (zero,) * 4, None)
  return EffectiveDefect(mean=d_sum.sum() / n + sampled_mass * d_mean, stderr=sampled_mass * d_se,
                         scale=c_sum.sum() / n + sampled_mass * c_mean, rank=r_full, sampled_mass=sampled_mass,
                         participation=p_sum.sum() / n + sampled_mass * p_mean)


def effective_isometry_defect_dense(p, transports, rtol: float = RANK_RTOL, chunk: int = 64) -> jax.Array:
  """Dense route: `Σ_ij W_ij isometry_defect(T_ij) / n` with every T_ij formed and its singular values taken.

  The same definition and rank rule as `effective_isometry_defect` (module docstring): the two agree
  to the trace tables' floor `TABLE_FLOOR2` in δ² wherever no real singular value lies under
  `rtol`. n²·d³ work (chunks of `chunk` query rows: chunk·n·d² memory); small models and tests only.
  """
  _check_heads(p, transports)
  n = p.shape[-1]
  w = p.mean(0)
  total = 0.0
  for start in range(0, n, chunk):
    rows = np.arange(start, min(start + chunk, n))
    d, _ = isometry_defect(edge_transports(p, transports, rows), rtol)
    total = total + jnp.sum(w[rows] * d)
  return total / n


# ----------------------------------------------------------------------------- Laplacian

def connection_laplacian_apply(p, transports, f) -> jax.Array:
  """`(ΔF)_i = F_i − Σ_j W_ij T_ij F_j = F − (1/H) Σ_h P^h F T^hᵀ` for F `[n, d]`; no T_ij formed."""
  _check_heads(p, transports)
  if f.shape != (p.shape[-1], transports.shape[-1]):
    raise ValueError(f"F must be [n, d] = {(p.shape[-1], transports.shape[-1])}; got {f.shape}")
  return f - jnp.einsum("hij,hde,je->id", p, transports, f) / p.shape[0]


def connection_laplacian_matrix(p, transports) -> jax.Array:
  """Dense block matrix `I − [W_ij T_ij]` `[n·d, n·d]` (block (i, j) is d×d): small n only."""
  _check_heads(p, transports)
  n, d = p.shape[-1], transports.shape[-1]
  blocks = jnp.einsum("hij,hde->idje", p, transports) / p.shape[0]
  return jnp.eye(n * d) - blocks.reshape(n * d, n * d)


# ----------------------------------------------------------------------------- layer stability

def relative_change(w1, w2) -> jax.Array:
  """`‖W₂ − W₁‖_F / ‖W₁‖_F` [...]."""
  return jnp.linalg.norm(w2 - w1, axis=(-2, -1)) / jnp.linalg.norm(w1, axis=(-2, -1))


def uniform_walk(n: int, causal: bool = False) -> jax.Array:
  """U `[n, n]`: each row uniform over the keys it may attend (all n; j ≤ i under a causal mask)."""
  allowed = jnp.tril(jnp.ones((n, n))) if causal else jnp.ones((n, n))
  return allowed / allowed.sum(-1, keepdims=True)


def uniform_relative_change(w1, w2, causal: bool = False) -> jax.Array:
  """`‖W₂ − W₁‖_F / ½(‖W₁ − U‖_F + ‖W₂ − U‖_F)` [...]: the change in units of the walks' distance from
  the uniform walk U (`uniform_walk`). Near-uniform walks (random initialisation) have a small raw
  `relative_change` for that reason alone; this ratio does not."""
  u = uniform_walk(w1.shape[-1], causal)
  scale = 0.5 * (jnp.linalg.norm(w1 - u, axis=(-2, -1)) + jnp.linalg.norm(w2 - u, axis=(-2, -1)))
  return jnp.linalg.norm(w2 - w1, axis=(-2, -1)) / jnp.maximum(scale, _TINY)


def row_js_divergence(w1, w2) -> jax.Array:
  """Mean over rows of the Jensen–Shannon divergence (nats, ≤ log 2) between the rows of two walks:
  `JS = ½ KL(w₁‖m) + ½ KL(w₂‖m)`, `m = (w₁ + w₂)/2` (`jax.scipy.special.rel_entr`)."""
  m = 0.5 * (w1 + w2)
  rel = jax.scipy.special.rel_entr
  return (0.5 * jnp.sum(rel(w1, m), -1) + 0.5 * jnp.sum(rel(w2, m), -1)).mean(-1)


def walk_spectrum(w, k: int = 16, *, triangular: bool = False) -> tuple[jax.Array, jax.Array]:
  """The k largest eigenvalue moduli `[..., k]` of a walk, descending (λ₀ = 1), and whether the
  solver met its tolerance (`[...]` bool; always True for a triangular walk).

  The one place the probe and the study take spectra: `markov.spectrum` (thick-restart Arnoldi
  with residuals), except for a triangular walk (causal attention), whose eigenvalues are exactly
  its diagonal. Fewer than k when the walk has fewer states (k is clipped to n).
  """
  k = min(k, w.shape[-1])
  if triangular:
    moduli = -jnp.sort(-jnp.abs(jnp.diagonal(w, axis1=-2, axis2=-1)), -1)[..., :k]
    return moduli, jnp.ones(moduli.shape[:-1], bool)
  eig = markov.spectrum(w, k)
  return jnp.abs(eig.values), eig.converged


def walk_moduli(w, k: int = 16, *, triangular: bool = False) -> jax.Array:
  """`walk_spectrum`'s moduli alone."""
  return walk_spectrum(w, k, triangular=triangular)[0]


def stability(walks: list, k: int = 16, *, triangular: bool = False) -> list[dict[str, float]]:
  """Per consecutive layer pair: relative Frobenius change, row JS divergence, spectral distance
  (ℓ² between the k largest eigenvalue moduli; each walk's spectrum computed once)."""
  moduli = [walk_moduli(w, k, triangular=triangular) for w in walks]
  out = []
  for (w1, w2), (m1, m2) in zip(zip(walks[:-1], walks[1:]), zip(moduli[:-1], moduli[1:])):
    out.append(dict(relative_change=float(jnp.mean(relative_change(w1, w2))),
                    js_divergence=float(jnp.mean(row_js_divergence(w1, w2))),
                    spectral_distance=float(jnp.mean(jnp.linalg.norm(m1 - m2, axis=-1)))))
  return out

"""The attention transport family: DMAP, DMTN, ATAP, ATTN and the continuous square between them.

Every operator is a row-stochastic Markov matrix built from attention's own queries and keys
(layout of `jax.nn.dot_product_attention`: `q, k` are `[b, n, h, d]` — batch, tokens, heads, head
dim). With `m = (q + k)/√2`, `n = (q − k)/√2`, `s = scale` (default `1/√d`) and `β, α ∈ [0, 1]`:

    L_ij = s·[ ½ m_i·m_j − β·½ n_i·n_j                (S: symmetric; PSD Gram minus β·NSD Gram)
             + α·½ (q_i·k_j − k_i·q_j)                (free antisymmetric part)
             + (1 − α)·½ (g_i − g_j) ],               (exact antisymmetric part, a potential)
    g_i = ½‖m_i‖² − β·½‖n_i‖²,
    P = rownorm(exp(L) ⊙ mask).

Corners `(β, α)`: ATTN = (1, 1) is standard attention `exp(s q_i·k_j)`; DMTN = (0, 1) keeps the
definite core and a free skew part; ATAP = (1, 0) is `exp(−½ s (q_i − q_j)·(k_i − k_j))`
(reversible); DMAP = (0, 0) is the Gaussian kernel `exp(−¼ s ‖m_i − m_j‖²)` on `m` (reversible,
depends on `W_+ = (W_Q + W_K)/√2` only).

A logit matters only up to row shifts `L_ij + c_i`, so every member is ONE scaled-dot-product
attention on augmented heads plus a per-key bias (`c = (1 − β)/4`, `c' = (1 + β)/4`):

    L_ij ≡ s·[q_i, k_i] · [c q_j + (c' + α/2) k_j, (c' − α/2) q_j + c k_j] − s·(1 − α)/2 · g_j.

DMAP needs only `m_i · ½ m_j − ¼ s‖m_j‖²` (head dim d), ATTN is plain attention, the general
member needs 2·d. `transport` runs that single attention through an interchangeable kernel of `attngeo.kernels`
(`"einsum"`, `"xla"`, `"cudnn"`, `"blockwise"`).
`logits` and `markov_matrix` are the dense reference, written from the formula above.

The magnetic (U(1)) lift, CMAP — a fifth operator beside the square (`magnetic_transport`; dense
`magnetic_matrix`, `phases`). It keeps the definite, exact part of the family as a magnitude,
`K = P(β, α = 0)` (DMAP's kernel at β = 0, the default), and moves the free antisymmetric logit out
of the softmax into a phase on the values, with a coupling γ (`coupling`: fixed or per head):

    θ_ij = γ · ½ s (q_i·k_j − k_i·q_j)                 (antisymmetric: θ_ji = −θ_ij),
    y_i  = Σ_j K_ij e^{iθ_ij} v_j,                      v_j ∈ C^{e/2}: channel pairs (2c, 2c+1) = (Re, Im).

Conventions: the transport from key j to query i multiplies by e^{+iθ_ij}; the output uses the same
channel pairing (e must be even). γ = 0 is exactly the magnitude operator. K is reversible
(π_i K_ij = π_j K_ji) and θ antisymmetric, so Π^{1/2} (K ⊙ e^{iθ}) Π^{−1/2} is Hermitian (unmasked, or
any symmetric mask): the magnetic walk has a real spectrum in [−1, 1] (read-outs in `attngeo.magnetic`).
A gauge change θ_ij → θ_ij + φ_j − φ_i is a unitary similarity (spectrum unchanged); the triangle
circulations θ_ij + θ_jk + θ_ki, the curvature of the connection, are gauge invariant. θ is bilinear,
`θ_ij = c·[q_i, k_i]·[k_j, −q_j]` with `c = γ s/2`, so CMAP is ONE fused phase attention
(`kernels.phase_attention`): the magnitude's augmented heads and key bias exactly as `transport`
builds them, plus the phase heads `[q, k]`, `[k, −q]`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import _checks, errors, kernels
# Named corners (β, α) of the operator square and the magnetic operator's name: one table, JAX-free, in
# `attngeo.operator_names` (the CLI checks names with it before importing JAX).
from attngeo.operator_names import ATAP, ATTN, CORNERS, DMAP, DMTN, MAGNETIC, corner, is_magnetic  # noqa: F401

# ----------------------------------------------------------------------------- validation

def _check_qk(q, k):
  _checks.check_rank("q", q, 4, "[batch, seq, heads, head_dim]")
  _checks.check_rank("k", k, 4, "[batch, seq, heads, head_dim]")
  _checks.check_floating("q", q)
  _checks.check_floating("k", k)
  if q.shape != k.shape:
    raise ValueError(f"q and k must have the same shape [b, n, h, d]; got q {q.shape}, k {k.shape}")
  _checks.check_finite("q", q)
  _checks.check_finite("k", k)


def _coefficient(name: str, x, heads: int):
  """β or α as a Python float (static corner) or an array broadcastable to [h]."""
  if isinstance(x, str):
    raise errors.InputTypeError(f"{name} must be a number or a per-head array in [0, 1]; got the string {x!r} "
                    f"(for a named operator use operators.corner({x!r}))")
  if isinstance(x, (bool, np.bool_)):
    raise errors.InputTypeError(f"{name} must be a number or a per-head array in [0, 1], not a bool; got {x!r}")
  if isinstance(x, (int, float, np.floating, np.integer)):
    x = float(x)
    _checks.check_unit_interval(name, x)
    return x
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:
    raise errors.InputTypeError(f"{name} must be a number or a per-head array in [0, 1], not a bool array")
  if x.ndim > 1 or (x.ndim == 1 and x.shape[0] not in (1, heads)):
    raise ValueError(f"{name} must be a scalar or a per-head array of shape [{heads}]; got shape {x.shape}")
  _checks.check_unit_interval(name, x)
  return x


def _check_values(k, v, *, pairs: bool):
  """v [b, n, h, e] beside k [b, n, h, d]: floating, finite; e even when its channels pair into complex values."""
  _checks.check_rank("v", v, 4, "[batch, seq, heads, value_dim]")
  _checks.check_floating("v", v)
  if v.shape[:3] != k.shape[:3]:
    raise ValueError(f"v must be [b, n, h, e] matching k's {k.shape[:3]}; got {v.shape}")
  if pairs and v.shape[-1] % 2:
    raise ValueError(f"v's last axis must be even (channel pairs (2c, 2c+1) are complex values); got {v.shape[-1]}")
  _checks.check_finite("v", v)


def _arguments(q, k, v, *, beta, mask, scale, pairs: bool = False):
  """The checks every transport shares (`transport`, `magnetic_transport`, `magnetic_arguments`), in one
  place: q, k [b, n, h, d] (and v, unless None), at least one token and one channel, the mask, β and the
  scale. Returns the validated `(mask, beta, scale)`; one line naming the argument otherwise."""
  _check_qk(q, k)
  if v is not None:
    _check_values(k, v, pairs=pairs)
  b, n, h, d = q.shape
  if n == 0 or d == 0:
    raise ValueError(f"q, k, v need at least one token and one channel; got [b, n, h, d] = {q.shape}")
  return _check_mask(mask, b, h, n, n), _coefficient("beta", beta, h), _scale(scale, d)


def _check_mask(mask, b, h, t, s):
  if mask is None:
    return None
  mask = jnp.asarray(mask)
  if mask.dtype != jnp.bool_:
    raise errors.InputTypeError(f"mask must be boolean (True = attend); got dtype {mask.dtype}")
  if mask.ndim != 4:
    raise ValueError(f"mask must be 4-D, broadcastable to [batch, heads, q_len, k_len]; got {mask.shape}")
  try:
    jnp.broadcast_shapes(mask.shape, (b, h, t, s))
  except ValueError:
    raise ValueError(f"mask shape {mask.shape} does not broadcast to [b, h, t, s] = {(b, h, t, s)}") from None
  return mask


# ----------------------------------------------------------------------------- augmentation

class Augmented(NamedTuple):
  """One SDPA that realises operator (β, α): `L_ij = scale·q_i·k_j + bias_j`.

  q: [b, n, h, D]; k: [b, n, h, D]; bias: [b, n, h] per-key logit bias or None.
  D is d (ATTN, DMAP) or 2·d (any other member; 4·d for 16-bit inputs, see `augment`).
  """
  q: jax.Array
  k: jax.Array
  bias: jax.Array | None


def augment(q, k, *, beta, alpha, scale: float) -> Augmented:
  """Rewrite operator (β, α) on (q, k) as augmented heads plus a key bias (see module doc).

  Static Python-float corners take the narrowest form; traced or per-head (β, α) the general
  2·d form. Exactly equal to `logits(...)` up to a per-row constant.

  16-bit inputs: the augmented keys `K = [c q + (c' + α/2) k, (c' − α/2) q + c k]` are linear
  combinations that bf16 cannot hold exactly, and their rounding error `δ_j` enters the logit as
  `s·q_i·δ_j`, which no key bias can cancel. They are computed in float32 and kept as a pair of
  16-bit words, `K = K_hi + K_lo` (`K_lo` = the rounding residual), with the queries repeated:
  `[Q, Q]·[K_hi, K_lo] = Q·K` to ~2⁻¹⁶ relative — 4·d wide, still one 16-bit SDPA.
  """
  if isinstance(beta, float) and isinstance(alpha, float):
    if beta == 1.0 and alpha == 1.0:
      return Augmented(q, k, None)
    if beta == 0.0 and alpha == 0.0:
      m = (q + k) * (1 / math.sqrt(2))
      g = 0.5 * jnp.sum(jnp.square(m.astype(jnp.float32)), -1)
      return Augmented(m, 0.5 * m, -scale * 0.5 * g)
  b_ = jnp.asarray(beta, jnp.float32)[..., None]   # [] or [h] -> broadcast over [b, n, h, 1]
  a_ = jnp.asarray(alpha, jnp.float32)[..., None]
  c, cp = (1 - b_) / 4, (1 + b_) / 4
  dt = q.dtype
  qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
  qa = jnp.concatenate([q, k], -1)
  ka = jnp.concatenate([c * qf + (cp + a_ / 2) * kf, (cp - a_ / 2) * qf + c * kf], -1)
  if jnp.finfo(dt).bits < 32:
    hi = ka.astype(dt)
    qa, ka = jnp.concatenate([qa, qa], -1), jnp.concatenate([hi, (ka - hi.astype(jnp.float32)).astype(dt)], -1)
  else:
    ka = ka.astype(dt)
  return Augmented(qa, ka, key_bias(q, k, beta=beta, alpha=alpha, scale=scale))


def key_bias(q, k, *, beta, alpha, scale: float):
  """The per-key bias `−s·(1 − α)/2·g_j` [b, n, h] float32 of member (β, α), or None at α = 1 (a float).

  g = ¼‖q + k‖² − ¼β‖q − k‖² = ¼(1 − β)‖q + k‖² + β q·k: the second form has no difference of squares
  (at |q| ≈ 1e20 the first was inf − inf: NaN keys for ATAP, whose logits are only ~|q|·|k|). Where
  ‖q + k‖² overflows, the first term is +inf, or 0 at β = 1 (ATAP's keys stay finite); its β-gradient is
  −¼‖q + k‖² everywhere else, β = 1 included (a learnable β clipped to 1 trains on; a factor √(1 − β)
  gave −∞·0 = NaN there, and a learnable run died at step 157).
  """
  if isinstance(alpha, float) and alpha == 1.0:
    return None
  b_, a_ = jnp.asarray(beta, jnp.float32)[..., None], jnp.asarray(alpha, jnp.float32)
  qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
  sym = (1 - b_[..., 0]) * 0.25
  sq = jnp.sum(jnp.square(qf + kf), -1)
  finite = jnp.isfinite(sq)
  spread = jnp.where(finite, sym * jnp.where(finite, sq, 0.0), jnp.where(sym == 0, 0.0, jnp.inf))
  g = spread + b_[..., 0] * jnp.sum(qf * kf, -1)
  return -scale * 0.5 * (1 - a_) * g


# Far tokens of the distance form (DMAP, and CMAP's magnitude at β = 0). `L_ij = −¼ s‖m_i − m_j‖²` is formed
# as `s·m_i·½m_j − ¼ s‖m_j‖²` (+ a row constant), whose terms overflow float32 once ¼ s‖m‖² nears 1e38:
# inf − inf made whole rows NaN at |q| ≈ 1e20, where ATTN is finite. A token with ¼ s‖m‖² ≥ _FAR (2^110)
# is isolated instead: its key gets weight 0 in every other row and its own row is the point mass on
# itself (its own key). That is the float64 answer whenever no other key lies within ~10/√s of it:
# at that norm float32's logits carry a rounding of ~u·_FAR ≈ 1e26, so no nearer pair is resolved by
# the SDPA form anyway. So is a token with ‖m‖² ≥ 2^125, where the unscaled product m_i·½m_j itself
# would overflow (only a scale s < 2^-13 makes that criterion the first to hold). Below both, every
# term stays under 2^125.
_FAR = 2.0 ** 110


def _far_tokens(q, k, scale: float):
  """[b, n, h] bool: tokens with ¼ s‖m‖² ≥ `_FAR` or ‖m‖² ≥ 2^125 (an overflow to inf included)."""
  m = (q.astype(jnp.float32) + k.astype(jnp.float32)) * (1 / math.sqrt(2))
  sq = jnp.sum(m * m, -1)
  return (0.25 * scale * sq >= _FAR) | (sq >= 2.0 ** 125)


def _isolate(aug: Augmented, far) -> Augmented:
  """Distance-form heads with the far tokens cut out: zero heads and the kernels' `_NEG` key bias."""
  cut = far[..., None]
  return Augmented(jnp.where(cut, 0, aug.q), jnp.where(cut, 0, aug.k), jnp.where(far, kernels.NEG, aug.bias))


def _own_values(y, v, far, mask):
  """y with each far token's row replaced by its own value v_i (NaN where the mask hides its own key)."""
  own = v
  if mask is not None:
    n = v.shape[1]
    idx = lambda axis: jnp.arange(n) if mask.shape[axis] > 1 else jnp.zeros(n, int)
    seen = jnp.transpose(mask[:, :, idx(2), idx(3)], (0, 2, 1))[..., None]         # mask[b, h, i, i]: [b|1, n, h|1, 1]
    own = jnp.where(seen, v, jnp.nan)
  return jnp.where(far[..., None], own.astype(y.dtype), y)


def _is_distance_form(beta, alpha) -> bool:
  return isinstance(beta, float) and beta == 0.0 and isinstance(alpha, float) and alpha == 0.0


# Overflowing rows of the other augmented members (DMTN, ATAP, mixed (β, α); not the distance form, which
# isolates its far tokens above, nor plain ATTN). Their logits hold s·¼(1 − β) q_i·q_j, s·q_i·k_j and the
# like, which pass float32's 2^128 at |q| ≈ 2e19 (ATTN's s·q_i·k_j stays ~1e20 with plain keys): inf − inf
# made those rows NaN, and a key bias past 2^128 made them, silently, pick the wrong key. Only the rows that
# could overflow (`_hot_rows`: a bound from the inputs' norms reaches 2^126, ‖q‖ ≳ 1e18 at d = 64) are
# checked (`_mend_overflow`), against the kernel rerun on q, k scaled by an exact power of two 2^−p
# (`_rescaled`): every term of the augmented logit is bilinear in (q, k), so the logits become 2^−2p·L —
# the same order of keys — bounded by `_LOGIT_BOUND`. Where the rerun's row is a point mass, the float64
# row is that point mass; where it is not, the unscaled row stands if its products stayed in range, and is
# NaN if not. (Scaled only to |q| ≲ 2^24, the logits ~1e15 came back NaN from the jitted einsum kernel on
# XLA:CPU; to ~2^20 they are exact.) Checked rows are a constant of the forward pass (their cotangent is
# dropped: the gradient through them is 0 where the kernel's residuals are finite, NaN where their logits
# overflowed); the other rows keep the unscaled result and its gradient. A call without hot rows costs
# O(n·d) on the inputs and one `lax.cond`.
_LOGIT_BOUND = 2.0 ** 20


def _rescaled(q, k, scale: float):
  """q, k times 2^−p, p ≥ 0 the least integer that brings the bound 8·s·d·max(|q|, |k|)² on every
  augmented logit to at most `_LOGIT_BOUND` (exact in any float format: a power of two). Behind an
  optimisation barrier, so XLA keeps the factor on the inputs."""
  top = jnp.maximum(jnp.max(jnp.abs(q.astype(jnp.float32))), jnp.max(jnp.abs(k.astype(jnp.float32))))
  f = jnp.exp2(-jnp.maximum(jnp.ceil(jnp.log2(top * math.sqrt(8 * scale * q.shape[-1] / _LOGIT_BOUND))), 0.0))
  return jax.lax.optimization_barrier((q * f.astype(q.dtype), k * f.astype(k.dtype)))


def _hot_rows(q, k, scale: float):
  """[b, n, h, 1] bool: the rows whose logits could pass float32's range. Every augmented logit and key
  bias (and every partial sum of their products, by Cauchy–Schwarz) is bounded by s·(‖z_i‖·Z + Z²),
  z = [q, k], Z = max_j ‖z_j‖ over the row's keys (|L_ij| ≤ s‖z_i‖‖z_j‖: the augmentation's coefficients
  have operator norm ≤ 1; |bias_j| ≤ ¼ s‖z_j‖²), and the norms themselves by (‖z_i‖·Z + Z²): a row with
  max(s, 1)·(‖z_i‖·Z + Z²) < 2^126 cannot overflow. Written as "not below" so that a NaN bound (0·inf: a
  zero token beside an infinite norm) reads hot. O(n·d) work on the inputs."""
  z = jnp.sqrt(jnp.sum(jnp.square(q.astype(jnp.float32)), -1) + jnp.sum(jnp.square(k.astype(jnp.float32)), -1))
  top = jnp.max(z, 1, keepdims=True)
  return ~(max(scale, 1.0) * (z * top + top * top) < 2.0 ** 126)[..., None]


def _unresolved_rows(q, k, beta, alpha, scale: float):
  """[b, n, h, 1] bool: the hot rows that float32 may have formed on the wrong keys, unless the rerun finds them
  a point mass (`_mend_overflow`). Every partial sum of row i's augmented products Q_i·K_j (`augment`:
  Q = [q, k], K = [c q + (c' + α/2) k, (c' − α/2) q + c k], c = (1 − β)/4, c' = (1 + β)/4) is bounded by
  P_i = s·(‖q_i‖·(|c|·Q + |c' + α/2|·K) + ‖k_i‖·(|c' − α/2|·Q + |c|·K)), Q and K the largest ‖q_j‖ and
  ‖k_j‖ in the head (ATAP's, c = 0, stays ~|q|·|k| where DMTN's holds ‖q‖²). With z_i = ‖q_i‖ + ‖k_i‖, a
  key bias of ~s·z_j² can only be met by the products of a row with z_i ≳ z_j: rows 2^20 smaller neither
  cancel it nor come near it. A row is unresolved where
  * P_i ≥ 2^127: a product may have overflowed;
  * a key bias in its head is ≥ 2^100 (or NaN) and z_i is 2^20 under that key's: the row picks among such
    keys by bias differences float32 does not resolve at that size (two tokens with k = −q of one norm:
    1e29 apart at 4e36), unless one key is all of it;
  * a key bias in its head is ≤ −2^100 (or −inf: its ‖q + k‖² overflowed where the bias itself need not
    have) and z_i is within 2^20 of that key's: the row's own products may cancel it (a repeated huge
    token's rows pick each other, where −inf took both keys out). Smaller rows exclude that key, rightly."""
  def norm(x):                                   # [b, n, h], scaled first: ‖q‖ ≈ 3e19 has a square past float32
    x = x.astype(jnp.float32)
    top = jnp.max(jnp.abs(x), -1)
    return top * jnp.sqrt(jnp.sum(jnp.square(x / jnp.where(top > 0, top, 1.0)[..., None]), -1))
  qn, kn = norm(q), norm(k)
  top_q, top_k = jnp.max(qn, 1, keepdims=True), jnp.max(kn, 1, keepdims=True)
  b_, a_ = jnp.asarray(beta, jnp.float32), jnp.asarray(alpha, jnp.float32)
  c, cp = jnp.abs(1 - b_) / 4, (1 + b_) / 4
  bound = max(scale, 1.0) * (qn * (c * top_q + jnp.abs(cp + a_ / 2) * top_k)
                             + kn * (jnp.abs(cp - a_ / 2) * top_q + c * top_k))
  unresolved = ~(bound < 2.0 ** 127)
  bias = key_bias(q, k, beta=beta, alpha=alpha, scale=scale)
  if bias is not None:
    z = qn + kn
    smallest = lambda keys: jnp.min(jnp.where(keys, z, jnp.inf), 1, keepdims=True)          # [b, 1, h]
    high, low = ~(bias < 2.0 ** 100), bias <= -(2.0 ** 100)                              # NaN reads high
    unresolved = (unresolved | (jnp.any(high, 1, keepdims=True) & (z < 2.0 ** -20 * smallest(high)))
                  | (z >= 2.0 ** -20 * smallest(low)))
  return unresolved[..., None]


def _key_digits(v):
  """v [b, n, h, e] with D more columns: key j's index in base 16, one digit a column (D = ⌈log₁₆ n⌉, at
  least 1; digits 0–15 are exact in every float format, bfloat16 too). Attention over these values returns
  Σ_j P_ij·digit_c(j): the digits of the key a row's point mass sits on."""
  n, width = v.shape[1], 1
  while 16 ** width < n:
    width += 1
  j = jnp.arange(n)
  digits = jnp.stack([(j // 16 ** c) % 16 for c in range(width)], -1).astype(v.dtype)          # [n, D]
  return jnp.concatenate([v, jnp.broadcast_to(digits[None, :, None], v.shape[:3] + (width,))], -1)


def _point_mass_rows(y, digits, v):
  """[b, n, h, 1] bool: the rows of y [b, n, h, e] that are a point mass — equal to v_j, j the key that the
  rows' digit columns (`_key_digits`) name, to 8 ulps of v's largest entry in the head. A spread row's
  digits average to some key's, but its value is not that key's."""
  j = sum(jnp.clip(jnp.round(digits[..., c].astype(jnp.float32)), 0, 15).astype(jnp.int32) * 16 ** c
          for c in range(digits.shape[-1]))
  j = jnp.clip(j, 0, v.shape[1] - 1)
  picked = jnp.take_along_axis(v, jnp.broadcast_to(j[..., None], y.shape), axis=1)
  tol = 8 * jnp.finfo(v.dtype).eps * jnp.max(jnp.abs(v.astype(jnp.float32)), (1, 3), keepdims=True)
  return jnp.all(jnp.abs(y.astype(jnp.float32) - picked.astype(jnp.float32)) <= tol, -1, keepdims=True)


def _mend_overflow(y, rerun, hot, v, unresolved):
  """y [b, n, h, e] with its `hot` rows (`_hot_rows`) checked against a rerun; run only when a row is hot.

  `rerun(values)` runs the same kernel in float32 (cuDNN's, which computes in bf16, as XLA's) on q, k scaled by
  an exact 2^−p (`_rescaled`: logits 2^−2p·L, none past `_LOGIT_BOUND`), over v with its keys' index digits
  beside it (`_key_digits`). A row every key of which is masked comes back 0, as from the kernel. A hot row takes:
  * the rerun's row where that row is a point mass (`_point_mass_rows`): its scaled gap to every other key
    is ≳ 17, far above the scaled logits' rounding (≲ 2^−4·8), so the unscaled gap, 2^2p times that, makes
    the float64 row the same point mass. These are the rows whose float32 logits overflowed: to NaN
    (inf − inf) or, silently, to a key bias of −inf on the key the row picks (a token of norm ≳ 1e19 in
    a mixed member, ATAP or DMTN: its own row came back finite, on the wrong key);
  * else y's row, if finite and not `unresolved()` (`_unresolved_rows`: no product past 2^127, no key bias
    that decides the row at a size float32 does not resolve): float32 formed it as it forms a cold row;
  * else NaN: float32 resolves the row at neither scale (a token of norm ≳ 2e19 with k ≈ −q, whose own
    logit is a difference of ~‖q‖² terms; a repeated huge token, or two with k = −q, whose rows split
    between them by differences under float32's resolution): no number rather than a wrong one. The
    mend before this one returned the rescaled rerun there: right for an exact tie, wrong otherwise.
  What no check here sees is float32's rounding of a row it formed as a cold one: its logits carry ~2^−24
  of their size, so a row decided by O(1) gaps between logits of ~1e19 (two huge keys at one angle to it)
  is noise, as in ATTN; and DMTN's own logit for a token with k = −q, exactly 0, is a difference of
  ~¼‖q‖² terms that can win its row from ‖q‖ ≈ 1e8 (`augment`'s 2·d-wide product).
  The check reads the inputs, not y: a reduction over y beside its use cost a quarter of the einsum
  kernel's forward + backward at 256 keys. `rerun` reads no differentiable input, so the `lax.cond` is a
  constant of the forward pass: a gradient program holds the rerun's forward kernels, not a second
  backward (nor its residuals). A hot row's cotangent is dropped: its gradient is 0 where the kernel's
  residuals are finite, and NaN where its logits overflowed (the kernel's backward meets 0·NaN). One token
  of norm ≳ 1e19 makes its whole head hot (the bound holds Z²), so a head holding one loses its gradient.
  Letting the finite hot rows keep theirs (a mask returned by the cond, or a cond over y) measured ATAP ÷
  ATTN 1.40–1.67 against 1.26–1.35 at 256 keys on einsum (docs/benchmarks.md), for inputs no float32
  model reaches short of divergence; not kept."""
  def mend():
    ys, vs = jax.lax.stop_gradient(y), jax.lax.stop_gradient(v).astype(jnp.float32)
    out = rerun(_key_digits(vs))                                   # float32 whatever y's dtype
    near, digits = out[..., :vs.shape[-1]], out[..., vs.shape[-1]:]
    empty = jnp.all(near == 0, -1, keepdims=True) & jnp.all(digits == 0, -1, keepdims=True)  # every key masked
    resolved = jnp.all(jnp.isfinite(ys), -1, keepdims=True) & ~unresolved()
    kept = jnp.where(resolved, ys, jnp.full_like(ys, jnp.nan))
    return jnp.where(_point_mass_rows(near, digits, vs) | empty, near.astype(ys.dtype), kept)
  if _checks.is_concrete(hot) and _checks.is_concrete(y):
    # called eagerly: a Python branch, not a `lax.cond` whose fresh closures were traced and lowered anew
    # every call (a whole forward kernel inside: 313 lowerings, 12 s of the suite's)
    return jnp.where(hot, mend(), y) if bool(jnp.any(hot)) else y
  # the select inside the cond: a call without hot rows returns y as it is (a select over y beside the kernel
  # cost DMTN and ATAP 0.13–0.16 of ATTN's time at 256 keys on einsum, each run; the cond alone, ~0.05)
  return jax.lax.cond(jnp.any(hot), lambda: jnp.where(hot, mend(), y), lambda: y)


# The kernel each route of `split_kernel` runs, by the name of its module in `attngeo.kernels` (the benchmarks' "runs on").
SPLIT_KERNELS = {"dense": "split", "kept": "split_kept", "paired": "split_paired", "gram": "gram"}


def split_kernel(beta, alpha, implementation: str | None, n_keys: int, *, dtype="float32", masked: bool = False,
                 causal: bool = False, block_size: int = 512, batch_heads: int | None = None,
                 heads: int | None = None) -> str | None:
  """The split kernel `transport` runs member (β, α) on instead of the augmented heads' einsum or blockwise
  kernel — "dense" (`kernels.split_attention`, one d-wide product and its transpose), "kept"
  (`kernels.split_kept_attention`), "paired" (`kernels.split_paired_attention`) or "gram" (`kernels.gram_attention`)
  — or None. Inputs of ≥ 32 bits, β a Python float, where the dispatcher says so (`kernels.runs_split`: einsum below
  `BLOCKWISE_FROM` keys; blockwise, unmasked, not causal, α static, two tiles up to `kernels.KEPT_UP_TO` keys or keys
  that cut into pairs of tiles), on two edges of the square:
  * β = 1 but ATTN (ATAP at α = 0): "dense", "kept" (up to 1024 keys, and `heads` = b·h, where given, up to
    `kernels.KEPT_ENTRIES` entries of P in all) or "paired", products of q and k;
  * β = 0: DMAP (α = 0.0) "gram" where "dense" runs up to `kernels.TRANSPOSED_COTANGENT_UP_TO` entries per head
    (384 keys; past them its symmetrised cotangent's pass costs more than the product it saves), its Gram
    m·mᵀ/2 with a one-product backward; and "paired" from `kernels.PAIRED_GRAM_FROM_TILES` tiles (2048 keys at
    the default block size), the same Gram alone on pairs of tiles (5 + 1/T product units a tile to ATTN's 7);
    the others (DMTN at α = 1; a static α > 0) "paired" only, from `kernels.PAIRED_BETA0_FROM_TILES` tiles (8192
    keys at the default block size), products of m and n (`beta0_paired`), and only where the augmented heads run
    on blocks of `kernels.TILE`. `batch_heads` (b·h) says that the augmented heads run on the default block,
    `kernels.block_size_for(b·h)`: where that is larger (16 or fewer heads a step), DMTN stays on them
    (`bench_pairs --operator DMTN`, batch 1 × 8 heads, ÷ ATTN on its 1024-key default block: heads 1.38, pairs 1.47 at
    8192 keys; 1.36 and 1.34, a tie, at 16 384; batch 4 × 8 heads, all on 512: heads 1.39 / 1.31, pairs 1.36 / 1.30
    at 8192 / 16 384). None: `block_size` is the heads' block too."""
  if not (isinstance(beta, float) and jnp.finfo(dtype).bits >= 32):
    return None
  static = isinstance(alpha, float)
  if beta == 0.0 and static and alpha == 0.0:
    route = kernels.runs_split(implementation, n_keys, masked=masked, causal=causal, static=True,
                               block_size=block_size, from_tiles=kernels.PAIRED_GRAM_FROM_TILES)
    if route == "dense":
      return "gram" if n_keys * n_keys <= kernels.TRANSPOSED_COTANGENT_UP_TO else None
    return route
  if beta == 1.0 and not (static and alpha == 1.0):
    return kernels.runs_split(implementation, n_keys, masked=masked, causal=causal, static=static,
                              block_size=block_size, kept=True, heads=heads)
  if beta == 0.0 and static and alpha != 0.0:
    if batch_heads is not None and kernels.block_size_for(batch_heads) > kernels.TILE:
      return None
    paired = kernels.runs_split(implementation, n_keys, masked=masked, causal=causal, static=True,
                                block_size=block_size, from_tiles=kernels.PAIRED_BETA0_FROM_TILES) == "paired"
    return "paired" if paired else None
  return None


def beta0_paired(q, k, v, alpha: float, bias, scale: float, block_size: int = 512):
  """Member (0, α), α a float, on pairs of tiles. With m = (q + k)/√2, n = (q − k)/√2 its logits are

      L_ij = s·[½ m_i·m_j + α·½(n_i·m_j − m_i·n_j)] + bias_j        (½(q_i·k_j − k_i·q_j) = ½(n_i·m_j − m_i·n_j)),

  the paired kernel's `s·(w X + w_t Xᵀ + c G)` on (q, k) := (m, n) with w = −α/2, w_t = α/2, c = ½: three
  units per pair of tiles (the Gram G_ab d wide, X_ab − X_baᵀ one product 2·d wide) where the augmented heads take
  two 2·d wide for each tile (kernels/split_paired.py: 9 product units per tile against their 11 and ATTN's 7).

  The kernel `transport` runs this member on from `kernels.PAIRED_BETA0_FROM_TILES` tiles; called directly it
  runs at any length that cuts into pairs of tiles (`experiments/bench_pairs.py` times it against the augmented
  heads), with no mask, no causal order and no overflow mend (`transport`'s `_mend_overflow`).

  Args:
    q, k: [b, n, h, d] (self-attention); v: [b, n, h, e].
    alpha: α of the member, a Python float (DMTN: 1.0).
    bias: its key bias [b, n, h] (`key_bias(q, k, beta=0.0, alpha=alpha, scale=scale)`), None at α = 1.
    scale: the logit scale s; block_size: the largest tile.
  Returns:
    [b, n, h, e] in v's dtype.
  """
  m, n = beta0_heads(q, k)
  return kernels.split_paired_attention(m, n, v, weights=(-alpha / 2, alpha / 2), gram=0.5, bias=bias, scale=scale,
                                        block_size=block_size)


def beta0_heads(q, k):
  """(m, n) = ((q + k)/√2, (q − k)/√2): the heads on which the β = 0 edge is the split form (`beta0_paired`)."""
  return (q + k) * (1 / math.sqrt(2)), (q - k) * (1 / math.sqrt(2))


# ----------------------------------------------------------------------------- public API

def transport(q, k, v, *, beta=1.0, alpha=1.0, causal: bool = False, mask=None, scale=None,
              implementation: str | None = None, block_size: int | None = None):
  """Attention output `y_i = Σ_j P_ij v_j` under operator (β, α), as one fused SDPA.

  Args:
    q, k: [b, n, h, d] queries and keys (rotary, QK-norm, biases already applied).
    v: [b, n, h, e] values.
    beta, alpha: scalars or per-head arrays [h] in [0, 1]; (1, 1) is standard attention.
    causal: lower-triangular mask (i attends to j ≤ i).
    mask: optional bool, broadcastable to [b, h, n, n]; True = attend.
    scale: logit scale s; default 1/√d.
    implementation: "einsum" | "xla" | "cudnn" | "blockwise" | None (the dispatcher's choice for the
      backend and length, `kernels.choose`); passed through to the kernel. Where "einsum" runs below
      `kernels.BLOCKWISE_FROM` keys, the β = 1 edge (ATAP) runs on `kernels.split_attention` instead, and
      DMAP up to 384 keys (`kernels.TRANSPOSED_COTANGENT_UP_TO`) on `kernels.gram_attention` (inputs of ≥ 32
      bits); and where "blockwise" runs unmasked, not causal, with a static α, the β = 1 edge (ATAP) up to
      `kernels.KEPT_UP_TO` keys and `kernels.KEPT_ENTRIES` entries of P (b·h·n²) on `kernels.split_kept_attention`
      (two tiles, P kept), and with keys that cut into
      `kernels.PAIRED_FROM_TILES` or more tiles the β = 1 edge, from `kernels.PAIRED_GRAM_FROM_TILES` DMAP
      (its Gram alone), and from `kernels.PAIRED_BETA0_FROM_TILES` the rest of the β = 0 edge (DMTN; on the default
      block only from 17 heads a step, b·h), run on `kernels.split_paired_attention` (`split_kernel`).
    block_size: the blockwise kernel's block and the pairs of tiles' tile bound; None (the default): the block
      `kernels.block_size_for(b·h)` (512 from 17 heads a step, up to 2048 below) and tiles of `kernels.TILE` (512).
      Naming the block changes the route where DMTN's pairs are concerned: at b·h ≤ 16 and 16 384 keys, None runs
      DMTN on its augmented heads in blocks of 1024, `block_size=1024` on pairs of tiles of 1024. Under `jax.vmap`
      the rule sees one mapped call's b·h: name a block there.
  Returns:
    [b, n, h, e], `P` never materialised on the fused/blockwise paths. At β = α = 0 (DMAP, Python
    floats) a token with ¼ s‖m‖² ≥ 2^110, whose logits float32 cannot form, is isolated: its row is
    its own value, its key weighs 0 in the other rows (`_FAR`; NaN if the mask hides its own key).
    The other augmented members check a row whose logits could overflow float32 (a head holding a token
    of ‖[q, k]‖ ≳ 1e19 at d = 64, `_hot_rows`) against a rerun on 2^−p-scaled q, k (`_mend_overflow`):
    it is the float64 point mass it is, the unscaled row where that was in range, or NaN where float32
    resolves it at neither scale (a token of norm ≳ 2e19 with k ≈ −q). Such rows are a constant of the
    forward pass: their gradient is 0, or NaN where their logits overflowed.
  """
  mask, beta, scale = _arguments(q, k, v, beta=beta, mask=mask, scale=scale)
  alpha = _coefficient("alpha", alpha, q.shape[2])

  block_size = None if block_size is None else kernels.check_block_size(block_size)
  tile = kernels.TILE if block_size is None else block_size          # the split kernels' tile bound
  split = split_kernel(beta, alpha, implementation, q.shape[1], dtype=q.dtype, masked=mask is not None, causal=causal,
                       block_size=tile, batch_heads=None if block_size is not None else q.shape[0] * q.shape[2],
                       heads=q.shape[0] * q.shape[2])

  def run(q, k, v, beta=beta, alpha=alpha, implementation=implementation):
    bias = lambda: key_bias(q, k, beta=beta, alpha=alpha, scale=scale)
    if split == "dense":
      return kernels.split_attention(q, k, v, weights=kernels.split_weights(alpha), mask=mask, causal=causal,
                                     bias=bias(), scale=scale), None
    if split == "kept":
      return kernels.split_kept_attention(q, k, v, weights=kernels.split_weights(alpha), bias=bias(), scale=scale), None
    if split == "paired" and beta == 0.0:
      return beta0_paired(q, k, v, alpha, bias(), scale, tile), None
    if split == "paired":
      return kernels.split_paired_attention(q, k, v, weights=kernels.split_weights(alpha), bias=bias(), scale=scale,
                                            block_size=tile), None
    aug = augment(q, k, beta=beta, alpha=alpha, scale=scale)
    return kernels.attention(aug.q, aug.k, v, bias=aug.bias, mask=mask, causal=causal, scale=scale,
                             implementation=implementation, block_size=block_size), aug
  if _is_distance_form(beta, alpha):
    far = _far_tokens(q, k, scale)
    aug = _isolate(augment(q, k, beta=beta, alpha=alpha, scale=scale), far)
    if split == "gram":                                          # heads (m, m/2): logits (s/2)·m·mᵀ
      y = kernels.gram_attention(aug.q, v, c=0.5 * scale, bias=aug.bias, mask=mask, causal=causal)
    elif split == "paired":                                      # the same Gram on pairs of tiles
      y = kernels.split_paired_attention(aug.q, aug.q, v, weights=(0.0, 0.0), gram=0.5, bias=aug.bias, scale=scale,
                                         block_size=tile)
    else:
      y = kernels.attention(aug.q, aug.k, v, bias=aug.bias, mask=mask, causal=causal, scale=scale,
                            implementation=implementation, block_size=block_size)
    return _own_values(y, v, far, mask)
  y, aug = run(q, k, v)
  if aug is not None and aug.k is k:                              # plain ATTN: its logits are q·k as given
    return y
  const = lambda x: x if isinstance(x, float) else jax.lax.stop_gradient(x)   # floats stay static
  f32 = lambda x: const(x).astype(jnp.float32)
  exact = "xla" if kernels.choose("softmax", implementation, q.shape[1]) == "cudnn" else implementation  # cuDNN: bf16
  rerun = lambda values: run(*_rescaled(f32(q), f32(k), scale), values, const(beta), const(alpha), exact)[0]
  return _mend_overflow(y, rerun, _hot_rows(q, k, scale), v,
                        lambda: _unresolved_rows(const(q), const(k), const(beta), const(alpha), scale))


def _is_number(x) -> bool:
  """A real scalar that is not a bool (`True` is an int: it read as 1.0): a Python/numpy int or float, or
  a 0-d integer or floating array."""
  if isinstance(x, (bool, np.bool_)):
    return False
  if isinstance(x, (int, float, np.integer, np.floating)):
    return True
  return (isinstance(x, (np.ndarray, jax.Array)) and x.ndim == 0
          and (jnp.issubdtype(x.dtype, jnp.integer) or jnp.issubdtype(x.dtype, jnp.floating)))


def _scale(scale, d: int) -> float:
  """The logit scale s: default 1/√d; a given one must be a finite positive number (not a bool)."""
  if scale is None:
    return 1.0 / math.sqrt(d)
  if not _is_number(scale):
    raise errors.InputTypeError(f"scale must be a finite positive number (default 1/sqrt(head_dim)); got {scale!r}")
  if not np.isfinite(float(scale)) or float(scale) <= 0:
    raise ValueError(f"scale must be a finite positive number (default 1/sqrt(head_dim)); got {scale!r}")
  return float(scale)


class Logits(NamedTuple):
  """Dense logits [b, h, n, n]: `full = sym + skew`, `sym = Sᵀ`, `skew = −Aᵀ` (exact + free parts)."""
  full: jax.Array
  sym: jax.Array
  skew: jax.Array


def logits(q, k, *, beta=1.0, alpha=1.0, scale=None) -> Logits:
  """Dense reference logits `L = S + A` (module docstring), written term by term from (m, n, g).

  q, k: [b, n, h, d]. Returns `Logits` of [b, h, n, n] float32 arrays (not row-shifted: this is
  the parametric logit itself, so `S` is symmetric and `A` antisymmetric exactly).
  """
  _check_qk(q, k)
  h, d = q.shape[2], q.shape[3]
  beta, alpha = _coefficient("beta", beta, h), _coefficient("alpha", alpha, h)
  scale = _scale(scale, d)
  qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
  m, nn = (qf + kf) / math.sqrt(2), (qf - kf) / math.sqrt(2)
  bvec, avec = jnp.asarray(beta, jnp.float32), jnp.asarray(alpha, jnp.float32)   # [] or [h]
  bb, aa = bvec[..., None, None], avec[..., None, None]                          # broadcast to [b,h,n,n]
  gram = lambda x, y: jnp.einsum("bihd,bjhd->bhij", x, y)
  sym = 0.5 * gram(m, m) - bb * 0.5 * gram(nn, nn)
  qk = gram(qf, kf)
  g = 0.5 * jnp.sum(m * m, -1) - bvec * 0.5 * jnp.sum(nn * nn, -1)               # [b, n, h]
  g = jnp.transpose(g, (0, 2, 1))                                    # [b, h, n]
  exact = 0.5 * (g[..., :, None] - g[..., None, :])
  skew = aa * 0.5 * (qk - jnp.swapaxes(qk, -1, -2)) + (1 - aa) * exact
  return Logits(scale * (sym + skew), scale * sym, scale * skew)


def markov_matrix(q, k, *, beta=1.0, alpha=1.0, causal: bool = False, mask=None, scale=None):
  """Dense reference `P = rownorm(exp(L) ⊙ mask)`: [b, h, n, n] float32, rows sum to 1.

  Materialises n² entries per head: for tests and small-n diagnostics only.
  """
  return rownorm(logits(q, k, beta=beta, alpha=alpha, scale=scale).full, causal=causal, mask=mask)


def rownorm(full, *, causal: bool = False, mask=None):
  """`P = rownorm(exp(L) ⊙ mask)` from dense logits L `[b, h, n, n]` (e.g. `logits(...).full`).

  A row whose entries are all masked (by the mask and the causal order together) has no distribution:
  it is returned as zeros (the kernels' convention), so such a P is not stochastic and the Markov read-outs refuse it.
  """
  b, h, n, _ = full.shape
  mask = _check_mask(mask, b, h, n, n)
  p = jax.nn.softmax(kernels.apply_masks(full, mask, causal), axis=-1)
  return p if mask is None else jnp.where(kernels.attended_rows(mask, causal, n, n)[..., None], p, 0.0)


# ----------------------------------------------------------------------------- the magnetic operator (CMAP)
#
# The magnetic operator CMAP (module docstring): magnitude P(β, α = 0), U(1) phase θ on complex value pairs.

# Kernels of the magnetic operator: the one-sided phase kernels, and at β = 0 (no mask, not causal) the
# Hermitian pairing `attngeo.kernels.paired`, which computes each unordered token pair once.
MAGNETIC_IMPLEMENTATIONS = kernels.KERNELS["magnetic"]


def _coupling(x, heads: int):
  """γ as a Python float (static) or a finite array broadcastable to [h]."""
  if isinstance(x, str):
    raise errors.InputTypeError(f"coupling must be a number or a per-head array; got the string {x!r}")
  if isinstance(x, (bool, np.bool_)):
    raise errors.InputTypeError(f"coupling must be a number or a per-head array, not a bool; got {x!r}")
  if isinstance(x, (int, float, np.floating, np.integer)):
    x = float(x)
    if not np.isfinite(x):
      raise ValueError(f"coupling must be finite; got {x}")
    return x
  x = jnp.asarray(x)
  _checks.check_floating("coupling", x)
  if x.ndim > 1 or (x.ndim == 1 and x.shape[0] not in (1, heads)):
    raise ValueError(f"coupling must be a scalar or a per-head array of shape [{heads}]; got shape {x.shape}")
  _checks.check_finite("coupling", x)
  return x


def phase_heads(q, k):
  """Phase heads `(qt, kt) = ([q, k], [k, −q])` [b, n, h, 2d]: `qt_i·kt_j = q_i·k_j − k_i·q_j`."""
  return jnp.concatenate([q, k], -1), jnp.concatenate([k, -q], -1)


def magnetic_arguments(q, k, *, beta=0.0, coupling=1.0, scale=None, mask=None):
  """Validated `(beta, coupling, scale, mask)` of the magnetic operator on q, k [b, n, h, d] (one-line errors)."""
  mask, beta, scale = _arguments(q, k, None, beta=beta, mask=mask, scale=scale)
  return beta, _coupling(coupling, q.shape[2]), scale, mask


def magnetic_transport(q, k, v, *, beta=0.0, coupling=1.0, causal: bool = False, mask=None, scale=None,
                       implementation: str | None = None, block_size: int | None = None):
  """The magnetic operator `y_i = Σ_j K_ij e^{iθ_ij} v_j` (see above), as one fused phase attention.

  Args:
    q, k: [b, n, h, d] queries and keys.
    v: [b, n, h, e] values, e even; channel pairs (2c, 2c+1) are one complex value (Re, Im).
    beta: β of the magnitude `K = P(β, α = 0)`: scalar or per-head [h] in [0, 1]; 0 is DMAP's kernel.
    coupling: γ, scalar or per-head [h], any finite real; 0 gives exactly `transport(..., alpha=0)`
      (on the paired kernel, to float32 rounding).
    causal, mask, scale: as in `transport`.
    implementation: "einsum" | "blockwise" | "pallas" | "paired" | None (`kernels.choose`: einsum below 512
      keys, else blockwise; "pallas", `kernels.pallas_phase`, only when named).
      "paired" (`attngeo.kernels.paired`) needs β = 0 as a Python float, no mask and causal=False;
      a call with far tokens (as in `transport`) runs on the one-sided blockwise kernel instead.
    block_size: the blockwise kernel's block, or the paired kernel's tile bound (`kernels.tiling`); None:
      `kernels.block_size_for(b·h, "phase")` blockwise (the softmax rule at coupling 0, which runs `transport`),
      `kernels.TILE` (512) for the tiles.
  Returns:
    [b, n, h, e] in v's dtype (float32 accumulation); the phase matrix never exists beyond a block
    on the blockwise path. A row whose keys are all masked is 0. At β = 0 far tokens are isolated
    as in `transport` (θ_ii = 0: their rows are their own values).
  """
  mask, beta, scale = _arguments(q, k, v, beta=beta, mask=mask, scale=scale, pairs=True)
  coupling = _coupling(coupling, q.shape[2])
  if kernels.choose("magnetic", implementation, q.shape[1]) == "paired":
    tile = kernels.TILE if block_size is None else block_size
    _check_paired(beta, mask, causal, tile)
    one_sided = lambda: _phase_transport(q, k, v, beta, coupling, causal, None, scale, "blockwise", block_size)
    paired = lambda: kernels.paired_magnetic(q, k, v, coupling, scale=scale, block_size=int(tile))
    return jax.lax.cond(jnp.any(_far_tokens(q, k, scale)), one_sided, paired)      # far tokens: the one-sided kernel
  if isinstance(coupling, float) and coupling == 0.0:
    return transport(q, k, v, beta=beta, alpha=0.0, causal=causal, mask=mask, scale=scale,
                     implementation=implementation, block_size=block_size)
  return _phase_transport(q, k, v, beta, coupling, causal, mask, scale, implementation, block_size)


def _phase_transport(q, k, v, beta, coupling, causal, mask, scale, implementation, block_size):
  """CMAP through `kernels.phase_attention` (validated arguments); at β = 0 far tokens are isolated as in
  `transport` (their phase heads zeroed too: their θ is irrelevant and may be huge)."""
  aug = augment(q, k, beta=beta, alpha=0.0, scale=scale)
  qt, kt = phase_heads(q, k)
  c = jnp.asarray(coupling, jnp.float32) * (0.5 * scale)
  far = _far_tokens(q, k, scale) if _is_distance_form(beta, 0.0) else None
  if far is not None:
    aug = _isolate(aug, far)
    qt, kt = jnp.where(far[..., None], 0, qt), jnp.where(far[..., None], 0, kt)
  y = kernels.phase_attention(aug.q, aug.k, v, qt, kt, c, bias=aug.bias, mask=mask, causal=causal, scale=scale,
                              implementation=implementation, block_size=block_size)
  return y if far is None else _own_values(y, v, far, mask)


def _check_paired(beta, mask, causal, block_size):
  """The paired kernel's scope, in one line: its magnitude is DMAP's symmetric kernel (β = 0), its
  pairs need a symmetric walk (no mask, not causal)."""
  kernels.check_block_size(block_size)
  if not (isinstance(beta, float) and beta == 0.0):
    raise ValueError(f"implementation='paired' needs beta=0.0 (a Python float: DMAP's symmetric magnitude); got {beta!r}")
  if mask is not None or causal:
    raise ValueError("implementation='paired' needs mask=None and causal=False (it pairs query i with key j and j "
                     "with i); use 'einsum' or 'blockwise'")


def phases(q, k, *, coupling=1.0, scale=None):
  """Dense phases `θ_ij = γ · ½ s (q_i·k_j − k_i·q_j)`: [b, h, n, n] float32, antisymmetric."""
  _check_qk(q, k)
  h, d = q.shape[2], q.shape[3]
  coupling, scale = _coupling(coupling, h), _scale(scale, d)
  qk = jnp.einsum("bihd,bjhd->bhij", q.astype(jnp.float32), k.astype(jnp.float32))
  g = jnp.asarray(coupling, jnp.float32)[..., None, None]
  return g * 0.5 * scale * (qk - jnp.swapaxes(qk, -1, -2))


def magnetic_matrix(q, k, *, beta=0.0, coupling=1.0, causal: bool = False, mask=None, scale=None):
  """Dense reference `K ⊙ e^{iθ}`: [b, h, n, n] complex64, `K = markov_matrix(β, α = 0)` (small n only)."""
  p = markov_matrix(q, k, beta=beta, alpha=0.0, causal=causal, mask=mask, scale=scale)
  return p * jnp.exp(1j * phases(q, k, coupling=coupling, scale=scale))

"""Geometry probe of a model: per-layer Markov, Bakry–Émery and connection-walk read-outs.

For each attention layer (q, k captured during one forward pass; dense P per head `[b, h, n, n]`):

* `eff_neighbours` `e^{H̄}`, `eps_rev` `ε_rev`, `rho_skew` `ρ_skew` (parametric logits, double
  centred) — per head `[h]`, averaged over the batch;
* `curvature` — median over tokens of the Bakry–Émery bound (`geometry.family_curvature`, n = ∞,
  τ = 1) of the head-averaged walk W over the family of the top-3 principal coordinates of
  `m = (q + k)/√2` (the coordinates in which DMAP is a Gaussian kernel), averaged over the batch;
* from the walk `W = (1/H) Σ_h P^h` and the layer's value/output weights (`attngeo.connection`),
  averaged over the batch: `spectral_gap` `1 − |λ₁(W)|`, `walk_eps_rev`; `head_isometry_defect`
  `[h]` (k×k cores); `effective_isometry_defect` of `T_ij = Σ_h g^h_ij T^h` (trace tables, exact
  on every edge with all heads gating; `_se` its standard error from the sampled partial-support
  edges, 0 when there are none), `effective_scale`, `effective_rank` r, `effective_participation`
  (mean participation ratio `(tr TᵀT)²/‖TᵀT‖_F²` of T_ij: δ² = 1 − participation/r edge by
  edge), `partial_support_mass`;
* `next_relative_change`, `next_uniform_relative_change` (the same change over the walks' mean
  distance from the uniform walk), `next_js_divergence`, `next_spectral_distance` — stability of W to
  the next probed layer (`next_layer`), spectra from `connection.walk_moduli`.

* CMAP (magnetic) layers: the walk read-outs above are those of the magnitude K (|K_θ| = K); the
  edge transports `W_V^h R(θ^h_ij) W_O^h` depend on the edge through the phase, and the `effective_*`
  keys are those of `T_ij = Σ_h g^h_ij W_V^h R(θ^h_ij) W_O^h` — exact from the trace tables of 2h
  edge-independent virtual heads `W_V^h W_O^h`, `W_V^h J W_O^h` with gates `g cos θ`, `g sin θ`
  (`connection.rotation_heads`); `head_isometry_defect` (one head's transport is no longer one matrix)
  is None there. Also per head `[h]`: `cmap_mean_abs_phase` (Σ_ij K_ij |θ_ij| / n) and, without a causal mask (`attngeo.magnetic`),
  `cmap_lambda_max` λ_max(H), `cmap_frustration_lower/upper` (the bracket on ν) with
  `cmap_frustration_stalled` (the fraction of inputs whose power method had not settled: the upper
  bound still holds), `cmap_wilson` ± `_se` (the 3-cycle Wilson loop, its standard error from the
  real and imaginary parts) and `cmap_mean_abs_circulation` ± `_se` from `cmap_triangles`
  sampled triangles per input (`magnetic.sampled_curvature`: O(samples), not n³). Under a causal mask
  K has no proper 3-cycles and π = δ₀, so only the phase's mean is read.

Nothing is d×d per edge: a layer costs the dense P (b·h·n²), H³k³ for the trace tables, n²·H⁴ for
their contraction and one spectrum of W. `model_report` takes any module tree containing
`attngeo.nn.Attention` layers (`wv` `[d, h, k]`, `wo` `[h, k, d]`); `hook` logs the layer means
during training. Causal note: under a causal mask the walk drains into token 0 (π = δ₀, ε_rev = 0
by definition) and W is triangular (its spectrum is its diagonal); read ρ_skew and the transports
there, not ε_rev. Causal layers add `eps_rev_unmasked` `[h]`: ε_rev of the same logits' walk without the
mask under its damped law π_τ (τ = 0.01, `markov.damped_law`; one n × n solve per head and input, also at
every `hook` step) — the reversibility regulariser's own quantity at its defaults (`--reg.damping 0.01`,
kind `eps_rev`). At the exact-A corners (DMAP, ATAP) the walk is reversible under
its π, so there it reads only the damping's offset, ε_rev(π_τ) ≤ ‖π_τ − π‖₁ (`markov.damped_law`'s bound).
"""
from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import connection, geometry, linalg, magnetic, markov, nn, operators
from attngeo.regularisers_config import DAMPING as UNMASKED_DAMPING

SUMMARY_KEYS = ("eff_neighbours", "eps_rev", "eps_rev_unmasked", "rho_skew", "curvature", "spectral_gap",
                "walk_eps_rev", "head_isometry_defect", "effective_isometry_defect", "next_relative_change",
                "next_js_divergence",
                "next_spectral_distance")


def _principal_coordinates(x, k: int = 3):
  """Top-k principal coordinates of x `[n, D]` (centred): `[n, k]` (`U_k Σ_k` of its SVD, up to signs).

  From the eigenvectors of the smaller Gram matrix (D×D covariance or n×n kernel), not an SVD
  of x: the top k are well separated from round-off and the eigensolver is several times faster.
  """
  x = x - x.mean(0)
  n, dim = x.shape
  if dim <= n:
    _, v = jnp.linalg.eigh(jnp.matmul(x.T, x, precision=jax.lax.Precision.HIGHEST))
    return jnp.matmul(x, v[:, ::-1][:, :k], precision=jax.lax.Precision.HIGHEST)
  lam, u = jnp.linalg.eigh(jnp.matmul(x, x.T, precision=jax.lax.Precision.HIGHEST))
  return u[:, ::-1][:, :k] * jnp.sqrt(jnp.maximum(lam[::-1][:k], 0.0))


@jax.jit
def _curvature(w, m):
  """Median Bakry–Émery bound of walks w `[b, n, n]` over the top-3 PCs of m `[b, n, D]`."""
  f = linalg.map_matrices(_principal_coordinates, m)
  return jnp.median(geometry.family_curvature(w, f, tau=1.0), -1)


def _coefficients(beta, alpha, h):
  as_heads = lambda x: jnp.broadcast_to(jnp.asarray(x, jnp.float32), (h,))
  return as_heads(beta), as_heads(alpha)


def _stats_impl(q, k, beta, alpha, causal):
  q, k = q.astype(jnp.float32), k.astype(jnp.float32)
  lg = operators.logits(q, k, beta=beta, alpha=alpha).full
  p = operators.rownorm(lg, causal=causal)
  m = ((q + k) / jnp.sqrt(2.0)).reshape(q.shape[0], q.shape[1], -1)
  out = {"eff_neighbours": markov.effective_neighbours(p).mean(0),
         "eps_rev": markov.reversibility(p).mean(0),
         "rho_skew": markov.skew_share(lg).mean(0),
         "curvature": _curvature(p.mean(1), m).mean()}
  if causal:
    out["eps_rev_unmasked"] = eps_rev_unmasked(lg).mean(0)
  return p, out


def eps_rev_unmasked(lg, damping: float = UNMASKED_DAMPING) -> jax.Array:
  """ε_rev [...] of the walk of logits `lg` [..., n, n] WITHOUT the causal mask, under its damped law π_τ
  (`markov.damped_law`, τ = `damping`): the quantity the reversibility regulariser trains at its defaults
  (`attngeo.regularisers`), read where the masked walk's ε_rev is 0 by construction."""
  p = operators.rownorm(lg, causal=False)
  return markov.reversibility(p, markov.damped_law(p, damping))


_stats = functools.partial(jax.jit, static_argnames="causal")(_stats_impl)


def layer_stats(q, k, beta, alpha, causal: bool = False) -> dict[str, np.ndarray]:
  """Per-head [h] `eff_neighbours`, `eps_rev`, `rho_skew` and the scalar `curvature` of one layer."""
  beta, alpha = _coefficients(beta, alpha, q.shape[2])
  return {key: np.asarray(v) for key, v in _stats(q, k, beta, alpha, causal)[1].items()}


def model_stats(model, run) -> list[dict[str, np.ndarray]]:
  """Per-layer `layer_stats` of every Attention in `model` while `run()` executes it."""
  _, qks = nn.capture_qk(model, run)
  mods = nn.attention_modules(model)
  return [layer_stats(q, k, *m.coefficients(), causal=m.causal) for (q, k), m in zip(qks, mods)]


def summarise(per_layer: list[dict]) -> dict[str, float]:
  """Mean over layers (and heads) of each numeric statistic present in the rows."""
  keys = [k for k, v in per_layer[0].items() if np.ndim(v) <= 1 and k != "layer"]
  out = {}
  for key in keys:
    vals = [np.mean(layer[key]) for layer in per_layer if layer.get(key) is not None]
    out[key] = float(np.mean(vals))
  return out


# ----------------------------------------------------------------------------- full per-layer read-outs

def _layer_impl(q, k, wv, wo, beta, alpha, key, coupling=None, *, causal, samples, num_moduli, triangles=4096,
                phase_readouts=True):
  """The read-outs of one layer: (dict of arrays, walks [b, n, n], moduli [b, num_moduli], the magnitude and
  phases (P, θ) [b, h, n, n] of a bidirectional CMAP layer, for `_frustration_readouts`, else None).

  `coupling` [h] marks a CMAP layer: its phase read-outs come from the same dense magnitude P, and its
  effective transport is `Σ_h g^h W_V^h R(θ^h_ij) W_O^h` (`connection.rotation_heads`); a head's own
  transport then depends on the edge, so the per-head defect is not read (absent from the dict).
  `phase_readouts=False` skips the CMAP-only read-outs (the training hook's `summary` does not use them).
  """
  p, stats = _stats_impl(q, k, beta, alpha, causal)
  w = p.mean(1)                                                       # head-averaged walks [b, n, n]
  moduli, converged = connection.walk_spectrum(w, num_moduli, triangular=causal)      # batched over b
  walk_rev = markov.reversibility(w)
  out = dict(stats, spectral_gap=jnp.mean(1.0 - moduli[:, 1]), spectrum_converged=jnp.all(converged),
             inputs_finite=jnp.isfinite(q).all() & jnp.isfinite(k).all(), walk_eps_rev=walk_rev.mean())
  if coupling is None:
    theta = None
    out["head_isometry_defect"], out["head_scale"] = connection.head_isometry_defect(wv, wo)
    tables = connection.transport_tables(wv, wo, key=jax.random.fold_in(key, 1))
  else:
    theta = operators.phases(q.astype(jnp.float32), k.astype(jnp.float32), coupling=coupling)
    if phase_readouts:
      out.update(_phase_readouts(p, theta, jax.random.fold_in(key, 2), causal=causal, triangles=triangles))
    tables = connection.transport_tables(*connection.rotation_heads(wv, wo), key=jax.random.fold_in(key, 1))
  frustration_inputs = (p, theta) if theta is not None and phase_readouts and not causal else None

  def per_sample(args):                     # the per-edge tables are large: one batch element at a time
    ph, th, kk = args
    return connection.effective_isometry_defect(ph, wv, wo, key=kk, samples=samples, tables=tables, phases=th)

  keys = jax.random.split(key, p.shape[0])
  eff = jax.lax.map(per_sample, (p, theta, keys))
  b = p.shape[0]
  out.update(effective_isometry_defect=eff.mean.mean(),
             effective_isometry_defect_se=jnp.sqrt(jnp.sum(eff.stderr**2)) / b,
             effective_scale=eff.scale.mean(), effective_rank=eff.rank[0],
             effective_participation=eff.participation.mean(),
             partial_support_mass=eff.sampled_mass.mean())
  return out, w, moduli, frustration_inputs


_layer = functools.partial(jax.jit, static_argnames=("causal", "samples", "num_moduli", "triangles",
                                                    "phase_readouts"))(_layer_impl)


def _phase_readouts(p, theta, key, *, causal, triangles):
  """CMAP read-outs of one layer (module docstring) from its magnitude p and phases θ [b, h, n, n], per head
  [h] averaged over the batch; the frustration bracket is `_frustration_readouts`'."""
  out = {"cmap_mean_abs_phase": (jnp.sum(p * jnp.abs(theta), (-2, -1)) / p.shape[-1]).mean(0)}
  if causal:
    return out
  cv = magnetic.sampled_curvature(p, theta, key, samples=triangles)
  b = p.shape[0]
  return dict(out, cmap_wilson=jnp.real(cv.wilson).mean(0),
              cmap_wilson_se=jnp.sqrt(jnp.sum(cv.wilson_se ** 2, 0)) / b,
              cmap_mean_abs_circulation=cv.mean_abs.mean(0),
              cmap_mean_abs_circulation_se=jnp.sqrt(jnp.sum(cv.mean_abs_se ** 2, 0)) / b)


@jax.jit
def _frustration_readouts(p, theta):
  """The frustration bracket of a bidirectional CMAP layer (`magnetic.frustration`), per head [h] averaged over
  the batch. A program of its own: the stationary law's float64 refinement runs on the host (a callback), and
  JAX's persistent cache keeps no program that holds one — inside `_layer` it made the whole layer's program
  (8 s to compile) compile again in every process."""
  fr = magnetic.frustration(p, theta)
  return dict(cmap_lambda_max=fr.lambda_max.mean(0), cmap_frustration_lower=fr.lower.mean(0),
              cmap_frustration_upper=fr.upper.mean(0), cmap_frustration_stalled=fr.stalled.astype(jnp.float32).mean(0))


def _coupling(m, heads):
  """γ [h] of a CMAP Attention (restricted to `heads`) on the default device; None for the family's layers."""
  if not m.magnetic:
    return None
  coupling = jnp.broadcast_to(jnp.asarray(m.coupling[...] if m.learnable_operator else m.coupling, jnp.float32),
                              (m.num_heads,))
  return jax.device_put(coupling if heads is None else coupling[np.asarray(heads)], jax.devices()[0])


def _pair_impl(w1, w2, m1, m2, causal=False):
  """Stability of walks w1 → w2 `[b, n, n]` with moduli m1, m2 `[b, k]`, averaged over the batch."""
  return {"next_relative_change": connection.relative_change(w1, w2).mean(),
          "next_uniform_relative_change": connection.uniform_relative_change(w1, w2, causal).mean(),
          "next_js_divergence": connection.row_js_divergence(w1, w2).mean(),
          "next_spectral_distance": jnp.linalg.norm(m1 - m2, axis=-1).mean()}


_pair = jax.jit(_pair_impl, static_argnames="causal")


def _selection(name: str, value, size: int) -> list[int]:
  if value is None:
    return list(range(size))
  idx = [int(i) for i in value]
  if not idx or any(not 0 <= i < size for i in idx) or len(set(idx)) != len(idx):
    raise ValueError(f"{name} must be distinct indices in [0, {size}); got {list(value)}")
  return idx


def _layer_inputs(q, k, m, heads):
  """(q, k, wv, wo, β [h], α [h]) of one Attention restricted to `heads` (None: all), on one device.

  The probe of a layer is a single-device program; placing its inputs on the default device also
  keeps one compiled program per shape whatever sharding the model's arrays carry (a trained
  model's mesh shardings would otherwise key a second compilation).
  """
  beta, alpha = _coefficients(*m.coefficients(), m.num_heads)
  wv, wo = m.wv[...], m.wo[...]
  if m.num_kv_heads != m.num_heads:          # grouped value heads (GQA): head h reads group h // (H/G)
    wv = jnp.repeat(wv, m.num_heads // m.num_kv_heads, axis=1)
  if heads is not None:
    hs = np.asarray(heads)
    q, k, wv, wo, beta, alpha = q[:, :, hs], k[:, :, hs], wv[:, hs], wo[hs], beta[hs], alpha[hs]
  return jax.device_put((q, k, wv, wo, beta, alpha), jax.devices()[0])


def _check_no_windows(model, n: int):
  """The probe builds P from q, k with the causal mask only: a sliding window shorter than the probed
  sequence (nanochat 2026's short layers) would give another operator than the model's, so refuse."""
  windows = getattr(getattr(model, "cfg", None), "attn_windows", ()) or ()
  short = [i for i, w in enumerate(windows) if w < n - 1]
  if short:
    raise ValueError(f"layers {short} attend through sliding windows shorter than the {n} probed tokens, which the "
                     f"probe does not apply; probe at most {min(windows[i] for i in short) + 1} tokens")


def _validate(model, layers, heads, samples, num_moduli, mods=None):
  mods = nn.attention_modules(model) if mods is None else mods
  if not mods:
    raise ValueError(f"model ({type(model).__name__}) contains no attngeo.nn.Attention layer to probe")
  layers = _selection("layers", layers, len(mods))
  if heads is not None:
    heads = _selection("heads", heads, min(mods[i].num_heads for i in layers))
  if samples < 2:
    raise ValueError(f"samples must be at least 2; got {samples}")
  if num_moduli < 2:
    raise ValueError(f"num_moduli must be at least 2 (the gap needs λ₁); got {num_moduli}")
  return mods, layers, heads


def model_report(model, run, *, layers=None, heads=None, samples: int = 32, seed: int = 0, num_moduli: int = 16,
                 triangles: int = 4096, progress: bool = True, desc: str = "probe") -> list[dict]:
  """Per-layer read-outs (see the module docstring) of `model` while `run()` executes it.

  Args:
    model: any NNX module tree containing `attngeo.nn.Attention` layers (GPT, DiT, PointFlow, encoders,
      imported checkpoints), indexed in `nn.attention_modules` order, one index per call of a layer
      shared across depth (ALBERT's one layer applied L times gives L rows).
    run: zero-argument callable running the model on the probe batch (q, k are captured).
    layers: indices of the layers to probe (default all); stability is to the next probed one.
    heads: head indices to keep in every probed layer (default all): the walk and the effective
      transport are then those of the kept heads.
    samples: edges drawn per batch element for the partial-support part of the effective defect.
    seed: key of that sampling. num_moduli: eigenvalue moduli kept for the spectral distance.
    triangles: triangles sampled per input for a CMAP layer's circulation read-outs.
    progress: a tqdm bar per layer.
  Returns:
    one dict per probed layer: `layer`, per-head lists, scalars, and `next_*` (None on the last).
  """
  from tqdm.auto import tqdm
  _validate(model, None, None, samples, num_moduli)
  if triangles < 2:
    raise ValueError(f"triangles must be at least 2; got {triangles}")
  _, qks, mods = nn.capture_qk(model, run, every_call=True)       # a shared layer (ALBERT): one row per call
  mods, layers, heads = _validate(model, layers, heads, samples, num_moduli, mods)
  _check_no_windows(model, qks[0][0].shape[1])
  key = jax.random.PRNGKey(seed)
  rows, prev = [], None
  for idx in tqdm(layers, desc=desc, disable=not progress, leave=False, dynamic_ncols=True):
    q, k, wv, wo, beta, alpha = _layer_inputs(*qks[idx], mods[idx], heads)
    out, w, moduli, frustration_inputs = _layer(q, k, wv, wo, beta, alpha, jax.random.fold_in(key, idx),
                                                _coupling(mods[idx], heads), causal=mods[idx].causal,
                                                samples=samples, num_moduli=num_moduli, triangles=triangles)
    if frustration_inputs is not None:
      out = dict(out, **_frustration_readouts(*frustration_inputs))
    if prev is not None:
      pair = _pair(prev[0], w, prev[1], moduli, causal=mods[idx].causal)
      rows[-1].update({kk: float(v) for kk, v in jax.device_get(pair).items()}, next_layer=idx)
    row = {"layer": idx}
    row.update({kk: (np.asarray(v).tolist() if np.ndim(v) else np.asarray(v).item())
                for kk, v in jax.device_get(out).items()})
    if not row.pop("inputs_finite"):
      raise ValueError(f"layer {idx}: the attention's queries/keys hold NaN or inf on this input "
                       "(the weights or the input are not finite); nothing to probe")
    if mods[idx].magnetic:                    # a head's transport depends on the edge: no per-head defect
      row.update(head_isometry_defect=None, head_scale=None)
    bad = [kk for kk, v in row.items() if isinstance(v, (float, list)) and not np.all(np.isfinite(v))]
    if bad:
      warnings.warn(f"layer {idx}: non-finite read-outs {bad} (finite queries/keys)", RuntimeWarning, stacklevel=2)
    rows.append(row)
    prev = (w, moduli)
  rows[-1].update(next_layer=None, next_relative_change=None, next_uniform_relative_change=None, next_js_divergence=None,
                  next_spectral_distance=None)
  unconverged = [r["layer"] for r in rows if not r["spectrum_converged"]]
  if unconverged:
    warnings.warn(f"the walk spectra of layers {unconverged} did not meet the eigensolver's tolerance: their "
                  "spectral gap and spectral distance are approximate (spectrum_converged is False in their rows)",
                  RuntimeWarning, stacklevel=2)
  return rows


def summary(model, run, *, samples: int = 32, seed: int = 0, num_moduli: int = 16) -> dict[str, jax.Array]:
  """Layer means of the `model_report` read-outs (`SUMMARY_KEYS`) as device scalars, without a host sync.

  The same compiled per-layer programs as `model_report` (a CMAP layer's without its phase read-outs,
  which the summary does not use), dispatched asynchronously: the caller decides when to wait
  (`jax.device_get`).
  """
  mods, _, _ = _validate(model, None, None, samples, num_moduli)
  _, qks = nn.capture_qk(model, run)
  _check_no_windows(model, qks[0][0].shape[1])
  key = jax.random.PRNGKey(seed)
  per_layer, prev = [], None
  for idx, ((q, k), m) in enumerate(zip(qks, mods)):
    out, w, moduli, _ = _layer(*_layer_inputs(q, k, m, None), jax.random.fold_in(key, idx), _coupling(m, None),
                               causal=m.causal, samples=samples, num_moduli=num_moduli,
                               phase_readouts=not m.magnetic)    # the family's programs are the report's
    if prev is not None:
      per_layer[-1].update(_pair(prev[0], w, prev[1], moduli, causal=m.causal))
    per_layer.append(out)
    prev = (w, moduli)
  return {key: jnp.mean(jnp.stack([jnp.mean(r[key]) for r in per_layer if key in r]))
          for key in SUMMARY_KEYS if any(key in r for r in per_layer)}


def hook(run, batch, every: int = 100, *, samples: int = 32, defer: bool = True):
  """A `train.train` hook: every `every` steps, the layer means of the probe (`summary`) on a fixed batch.

  `run(model, batch)` runs the model on `batch`. The probe's per-layer programs are compiled at
  the first probe step (and shared with `model_report`). With `defer` (default) the hook only
  dispatches them — JAX runs them asynchronously and the training loop goes on — and returns the
  values at its next call (the next log step), with `probe/step` naming the step they were
  measured at; `hook.flush()` returns a still pending result. With `defer=False` it waits and
  returns them at once. Keys are `probe/<name>` (`SUMMARY_KEYS`), TensorBoard-friendly.
  """
  if every < 1:
    raise ValueError(f"every must be a positive number of steps; got {every}")
  pending = []

  def collect():
    step, values = pending.pop()
    return {"probe/step": step, **{f"probe/{k}": float(v) for k, v in jax.device_get(values).items()}}

  def fn(step, model):
    out = collect() if pending else None
    if step % every == 0:
      pending.append((step, summary(model, lambda: run(model, batch), samples=samples)))
      if not defer:
        out = collect()
    return out

  fn.flush = lambda: collect() if pending else None
  return fn

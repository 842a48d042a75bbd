"""Shared test helpers (imported by name: pytest puts tests/ on sys.path)."""
import numpy as np


class Batches:
  """The same batch forever, with the iterator-state protocol `attngeo.train` expects."""

  def __init__(self, batch):
    self.batch = batch

  def __next__(self):
    return self.batch

  def get_state(self):
    return {}

  def set_state(self, state):
    pass


# ----------------------------------------------------------------------------- connection-walk references (float64)

def defect_from_lam(lam, rtol):
  """δ from eigenvalues λ [..., d] of TᵀT (float64): the definition, independently of the package."""
  keep = lam > rtol * lam[..., -1:]
  r = np.maximum(keep.sum(-1), 1)
  mean = (lam * keep).sum(-1) / r
  num = (((lam - mean[..., None]) ** 2) * keep).sum(-1)
  den = np.maximum((lam**2 * keep).sum(-1), 1e-300)
  return np.sqrt(num / den)


def rotations64(theta, k):
  """R(θ) `[..., k, k]` on complex pairs (2c, 2c+1), row vectors: (re, im)·R = (re cos − im sin, re sin + im cos)."""
  c, s = np.cos(theta)[..., None], np.sin(theta)[..., None]
  r = np.zeros(theta.shape + (k, k))
  idx = np.arange(0, k, 2)
  r[..., idx, idx], r[..., idx + 1, idx + 1] = c, c
  r[..., idx, idx + 1], r[..., idx + 1, idx] = s, -s
  return r


def dense_cmap_transports64(p, theta, wv, wo):
  """Per-edge `T_ij = Σ_h g^h_ij W_V^h R(θ^h_ij) W_O^h` `[n, n, d, d]` in float64, from the definition."""
  p, theta, wv, wo = (np.asarray(x, np.float64) for x in (p, theta, wv, wo))
  s = p.sum(0)
  g = p / np.where(s > 0, s, 1.0)
  r = rotations64(theta, wv.shape[2])                                           # [h, n, n, k, k]
  return np.einsum("hij,dhk,hijkl,hle->ijde", g, wv, r, wo)


# ----------------------------------------------------------------------------- stationary laws (float64)

def chain_pi(p):
  """π_true of the chain P/rowsum(P) (what `stationary` bounds against), by a float64 dense solve of Mᵀπ = 1/n."""
  p = np.asarray(p, np.float64)
  p = p / p.sum(-1, keepdims=True)
  n = p.shape[-1]
  m = np.eye(n) - p + 1.0 / n
  return np.linalg.solve(np.swapaxes(m, -1, -2), np.full(p.shape[:-1] + (1,), 1.0 / n))[..., 0]


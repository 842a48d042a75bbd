"""Import of public PyTorch checkpoints into attngeo's Flax models (no pickle without torch's safe loader).

* `safetensors_io` — read a checkpoint as `{name: numpy array}` (safetensors first; `.pt` only through
  `torch.load(weights_only=True)` when torch is installed).
* `dit` — the official SiT / DiT checkpoints into `attngeo.nn.DiT`.
"""

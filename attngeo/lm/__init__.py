"""Language models on the transport family: tokenizers, training recipe, evaluations, sampling.

* `config` — `LMConfig`/`LMTrain` (plain dataclasses); `recipe` — `train` a run folder, `load` one back
  (both import no JAX: the CLI validates with them first);
* `table2` — Table 2's protocol: conditions, run keys, one (condition, seed) run; `adapt` — Table 3's;
* `tokenizer` — byte-level and BPE (rustbpe + tiktoken) tokenizers with nanochat's specials and `token_bytes`;
* `bpb`, `induction`, `dac`, `core` — bits per byte, the induction score, the DAC probe, CORE;
* `evals.evaluate` — all of them in one call; `generate.Sampler` — KV-cached sampling.

Importing the package is light (no JAX); `attngeo.lm.evaluate` loads the evaluations on first use.
"""


def __getattr__(name):
  if name == "evaluate":
    from attngeo.lm.evals import evaluate
    return evaluate
  raise AttributeError(f"module 'attngeo.lm' has no attribute {name!r}")


__all__ = ["evaluate"]

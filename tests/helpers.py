"""Shared test helpers (imported by name: pytest puts tests/ on sys.path)."""


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

"""The one exception type that marks a wrong-typed input, so the CLI can tell it from a bug.

`InputTypeError` is a `TypeError` (library callers catch it as one) raised only where attngeo checks
an argument's type on purpose. `attngeo.cli` reports it, like a `ValueError`, in one line; a bare
`TypeError` — a call with wrong arguments somewhere inside — is a bug and keeps its traceback.
This module imports nothing, so the CLI can use it before JAX is loaded.
"""


class InputTypeError(TypeError):
  """An argument of the wrong type, named in the message (a user's mistake, not a bug)."""

import os
import signal
import threading

import pytest

from attngeo import interrupts


@pytest.fixture(autouse=True)
def interactive_ctrl_c():
  """These tests are about Ctrl-C in an interactive process. One started in the background (`cmd &` in a
  script, `setsid`, nohup) inherits SIGINT ignored and Python leaves it so; here it is Python's default."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous)


def test_a_signal_inside_the_section_lands_when_it_ends():
  seen = []
  previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
  try:
    with interrupts.deferred():
      os.kill(os.getpid(), signal.SIGTERM)
      os.kill(os.getpid(), signal.SIGINT)          # only the first is delivered afterwards
      with interrupts.deferred():                   # nested: still held
        pass
      assert seen == []
    assert seen == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is not interrupts._record
  finally:
    signal.signal(signal.SIGTERM, previous)


def test_ctrl_c_in_the_section_is_a_keyboard_interrupt_after_it():
  done = []
  with pytest.raises(KeyboardInterrupt):
    with interrupts.deferred():
      os.kill(os.getpid(), signal.SIGINT)
      done.append("the section finished")
  assert done == ["the section finished"]
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_other_threads_pass_through():
  """Handlers run in the main thread only: elsewhere the section changes nothing."""
  def body():
    with interrupts.deferred():
      out.append(signal.getsignal(signal.SIGINT))
  out = []
  t = threading.Thread(target=body)
  t.start()
  t.join()
  assert out == [signal.default_int_handler]

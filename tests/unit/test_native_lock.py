"""Building native code: a build lock left by a killed build must not hang the next start."""

from __future__ import annotations

import os
import threading
import time

from sgl import native


def test_an_old_lock_is_removed_and_a_live_one_waited_for(tmp_path):
    lock = tmp_path / "lock"
    lock.write_text("")
    old = time.time() - native.STALE_LOCK_SECONDS - 5
    os.utime(lock, (old, old))
    native.wait_for_lock(tmp_path)  # a killed build's: removed at once
    assert not lock.exists()

    lock.write_text("")  # a build in progress: waited for until it ends
    waiting = threading.Thread(target=native.wait_for_lock, args=(tmp_path,))
    waiting.start()
    assert waiting.is_alive()  # the lock is there: it cannot have returned
    lock.unlink()  # the other build finishes
    waiting.join(timeout=60)
    assert not waiting.is_alive()
    native.wait_for_lock(tmp_path)  # no lock: returns at once

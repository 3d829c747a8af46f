"""A scheduler process: `python -m sgl.runtime.scheduler_process ADDRESS RANK` (started by
`transport.ProcessTransport`, one per tensor-parallel rank, never by hand).

It connects back to the engine, tells its rank, receives its options, joins the ranks'
process group (tp_size > 1), builds its shard of the model and its scheduler (worker.py),
answers `SchedulerReady` (or `SchedulerStartFailed` with the error), then runs the scheduler
loop on its main thread. On rank 0 a reader thread moves the engine's messages into the
loop's inbox; the other ranks get them from rank 0 (rank_sync.py). It ends when told to
(`Shutdown`, shared by rank 0), when the engine's connection closes, or when its parent
process is gone: never an orphan. Ctrl-C in a terminal reaches the parent, which shuts the
ranks down; the child itself ignores SIGINT.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Client, Connection
from typing import Any

from sgl.runtime.messages import Reply, ReqEvent, Shutdown
from sgl.runtime.transport import AUTHKEY_ENV, SchedulerReady, SchedulerStartFailed, StartScheduler
from sgl.runtime.worker import build_scheduler, on_fresh_thread

logger = logging.getLogger("sgl.scheduler_process")
PARENT_CHECK_S = 1.0


def exit_with_parent() -> None:
    """Exit at once when the parent process dies (it was killed: nobody will shut us down)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="sgl-parent-watch", daemon=True).start()


def sender(conn: Connection) -> Any:
    """The scheduler's `emit`: one pickled list of outputs per loop turn. An error that does
    not pickle (a foreign exception type) is sent as a RuntimeError with its text."""

    def send(outputs: list) -> None:
        try:
            conn.send(outputs)
        except (pickle.PicklingError, TypeError, AttributeError):
            conn.send([_plain(out) for out in outputs])

    return send


def _plain(out: Any) -> Any:
    if isinstance(out, (ReqEvent, Reply)) and out.error is not None:
        try:
            pickle.dumps(out.error)
        except Exception:
            out.error = RuntimeError(f"{type(out.error).__name__}: {out.error}")
    return out


def forward_messages(conn: Connection, inbox: Any) -> None:
    """Engine messages into the loop's inbox; a closed connection is a shutdown."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            inbox.put(Shutdown())
            return
        inbox.put(msg)


def join_ranks(start: StartScheduler) -> tuple[Any, Any]:
    """(TPGroup, RankGroup) of this rank: the model's collectives (gloo on CPU, NCCL on CUDA)
    and a gloo group for rank 0's broadcasts; CPU threads split between the ranks."""
    from sgl.runtime.distributed import init_tp_group
    from sgl.runtime.rank_sync import RankGroup

    cfg = start.config
    cuda = cfg.resolve_device().type == "cuda"
    if cuda:
        import torch

        cfg.device = f"cuda:{start.rank}"
        torch.cuda.set_device(cfg.device)
    else:
        import torch

        from sgl.runtime.cpu_features import usable_cpus

        torch.set_num_threads(max(1, usable_cpus() // cfg.tp_size))
    tp = init_tp_group(start.rank, cfg.tp_size, start.dist_init, "nccl" if cuda else "gloo")
    import torch.distributed as dist

    return tp, RankGroup(start.rank, dist.new_group(backend="gloo") if cuda else tp.group)


def main(address: str, rank: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()
    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(os.environ.pop(AUTHKEY_ENV)))
    conn.send(rank)
    start: StartScheduler = conn.recv()
    logging.basicConfig(
        level=start.log_level,
        format=f"%(asctime)s %(levelname)s %(name)s[rank {start.rank}]: %(message)s",
    )
    emit = sender(conn) if start.rank == 0 else (lambda outputs: None)
    try:
        tp, ranks = join_ranks(start) if start.config.tp_size > 1 else (None, None)
        scheduler, info, _ = on_fresh_thread(lambda: build_scheduler(start.config, emit, tp, ranks))
    except BaseException as e:  # reported to the engine, raised there as the same error
        logger.debug("scheduler start-up failed", exc_info=e)
        try:
            conn.send(SchedulerStartFailed(e))
        except Exception:
            conn.send(SchedulerStartFailed(RuntimeError(f"{type(e).__name__}: {e}")))
        return 1
    conn.send(SchedulerReady(info))
    if start.rank == 0:
        threading.Thread(
            target=forward_messages, args=(conn, scheduler.inbox), name="sgl-inbox", daemon=True
        ).start()
    scheduler.run()
    conn.close()
    if tp is not None:
        tp.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))

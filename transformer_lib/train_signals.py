"""Ctrl-C and SIGTERM during `train_run`: the step under way finishes, a checkpoint is saved there,
and `TrainingStopped` says what was kept and how to resume.

Hand-written, not exported: a part of `train_run.py`, kept apart to keep each file short.
"""
import signal
import threading
from pathlib import Path

from transformer_lib import runs
from transformer_lib.settings import LOG_EVERY


class Signals:
    """SIGINT (Ctrl-C) and SIGTERM during `train_run`: while training (and saving), the step under way
    finishes and `received` is set, for the callback that then saves a checkpoint; at any other
    `phase` ("preparing", "finishing"), or a second time, they stop at once. Main thread only."""

    def __init__(self):
        self.phase, self.received, self._saved = "preparing", None, {}

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._saved[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        if self.phase == "training" and self.received is None:
            self.received = signum
            return
        raise TrainingStopped(signum, phase=self.phase)


class TrainingStopped(KeyboardInterrupt):
    """A signal stopped training in `phase`; `step` is set when a checkpoint was saved at that step."""

    def __init__(self, signum: int, step: int | None = None, phase: str = "training"):
        super().__init__(signum)
        self.signum, self.step, self.phase, self.run = signum, step, phase, None    # run: where it is now

    def message(self, run: Path, again: str) -> str:
        """The one line that says what was kept and how to go on."""
        checkpoint = run / runs.CHECKPOINT
        if self.step is not None:
            return f"interrupted at step {self.step}: saved {checkpoint}; resume with the same command: {again}"
        if self.phase == "preparing":
            return (f"interrupted before the first step, so no training was lost; start it with the same command: "
                    f"{again}")
        if self.phase == "finishing":
            return (f"interrupted after the last step, which {checkpoint} holds; {run / runs.HISTORY} may not be "
                    "written")
        return (f"interrupted twice, so stopped at once without saving: the steps since the last checkpoint are "
                f"lost; resume from it with the same command: {again}")


def stop_callback(signals: Signals, save, context):
    """An on_batch_end callback: when a signal came, save a checkpoint at this step and stop. Under
    torchrun the ranks agree at every logged step (an all-reduce), so they all stop at the same one."""
    def stop(trainer) -> None:
        received = signals.received
        if context is not None:
            if trainer.state.step % LOG_EVERY:
                return
            import torch
            import torch.distributed as dist
            flag = torch.tensor([received or 0], device=trainer.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            received = int(flag.item()) or None
        if received:
            save(trainer, final=trainer._done())
            raise TrainingStopped(received, trainer.state.step)
    return stop

"""The recorder actor: writes every live run's Parquet files as the run goes, on the driver's node.

One per sweep, pinned to the node of the process that started the sweep (its results directory
is there). It holds a ``loadgen.core.recording.RunRecorder`` per open run and replays onto it what
the fleets' ``RecorderProxy`` objects queued, in their order, and the controller's samples; so
the files, their parts and their crash safety are exactly those of an in-process run.
"""

from __future__ import annotations

from pathlib import Path

import ray

from loadgen.core.recording import RunRecorder

# what a RecorderProxy may ask for: never an arbitrary attribute of the recorder
_REPLAYABLE = frozenset({"session_arrived", "session_admitted", "session_parked", "gateway_held", "session_ended",
                         "session_crashed", "turn"})


def replay(recorder: RunRecorder, events: list[tuple[str, tuple]]) -> None:
    """Apply what a ``RecorderProxy`` queued, in its order."""
    for name, args in events:
        if name not in _REPLAYABLE:
            raise ValueError(f"not a recorder event: {name!r}")
        getattr(recorder, name)(*args)


@ray.remote(num_cpus=0)
class RecorderActor:
    def __init__(self) -> None:
        self.recorders: dict[str, RunRecorder] = {}

    def open(self, run_dir: str, run_id: str, arm: str, seed: int, flush_interval_s: float,
             replica_columns: bool = False) -> None:
        """``replica_columns``: a run on replicas, whose turns name their replica."""
        self.recorders[run_id] = RunRecorder(Path(run_dir), run_id, arm, seed, flush_interval_s,
                                             replica_columns=replica_columns)

    def record(self, run_id: str, events: list[tuple[str, tuple]]) -> None:
        replay(self.recorders[run_id], events)

    def sample(self, run_id: str, row: dict, now_s: float, replica_rows: tuple = ()) -> None:
        """A sample, and each replica's at the same instant (replica_samples.parquet)."""
        recorder = self.recorders[run_id]
        recorder.sample(row)
        for replica_row in replica_rows:
            recorder.replica_sample(replica_row)
        recorder.maybe_flush(now_s)

    def close(self, run_id: str) -> int:
        """Write what is buffered and merge the parts; returns the run's completed turns."""
        recorder = self.recorders.pop(run_id)
        recorder.close()
        return recorder.turns_completed

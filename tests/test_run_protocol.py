"""The run protocol of trainers.run_folder for any method: a method made of plain counters (no trainer) goes through
`train_run`, and what the protocol promises (the curve on disk before each checkpoint, the recorders' one
interface) holds without any of the pathwise trainer's code."""

import inspect
from dataclasses import dataclass

import pyarrow.parquet as pq

from envs.instance import paper_instance
from trainers.config import TrainerConfig
from trainers.run_folder import MethodRun, PeerRecorder, Recorder, RunRecorder, train_run


@dataclass(frozen=True)
class CountingConfig(TrainerConfig):
    method: str = "counting"


class CountingRun(MethodRun):
    """A method whose update k has cost10 = 100 / k; its save records which updates curve.parquet held when it
    was called, and its state is the update."""

    def __init__(self, out, checkpoint_every: int):
        self.out, self.checkpoint_every, self.update, self.curve_at_save = out, checkpoint_every, 0, []

    def build(self, out, checkpoint):
        self.update = 0 if checkpoint is None else int(checkpoint["trainer"]["update"])
        return self

    def step(self):
        self.update += 1
        return {"cost10": 100.0 / self.update}

    def diverged(self, metrics):
        return None

    def checkpoint_state(self):
        self.curve_at_save.append(pq.read_table(self.out / "curve.parquet").column("update").to_pylist())
        return {"update": self.update}


def test_every_save_finds_the_curve_of_its_update_already_written(tmp_path):
    """The curve is written before the method's save (which writes checkpoint.pt, and for Ray Train copies
    both): catches a checkpoint ordered before write_curve, whose checkpoint would name updates the curve lacks."""
    config = CountingConfig(updates=5)
    method = CountingRun(tmp_path / "run", checkpoint_every=2)
    summary = train_run(tmp_path / "run", "new", config, paper_instance(2, 0), method, progress=False)
    assert method.curve_at_save == [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5]]  # periodic saves at 2 and 4, the final one at 5
    assert summary["status"] == "completed" and summary["final_cost10"] == 20.0 and summary["attempts"] == [0]


def test_both_recorders_have_the_recorder_protocol_methods_and_signatures():
    """RunRecorder and PeerRecorder are interchangeable in a RunAttempt: catches a method added to or renamed in
    one recorder (or the protocol) but not the others, which would fail only on a data-parallel run's peers."""
    wanted = {name: inspect.signature(getattr(Recorder, name)) for name in ("record", "write_curve", "close", "summary")}
    for recorder in (RunRecorder, PeerRecorder):
        for name, signature in wanted.items():
            got = inspect.signature(getattr(recorder, name))
            assert list(got.parameters) == list(signature.parameters), (recorder.__name__, name)
    assert PeerRecorder().summary("completed", None, 3) is None  # the protocol says so: None where no run folder is written

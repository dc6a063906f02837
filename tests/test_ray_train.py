"""Ray Train data-parallel runs (trainers.ray_train): one worker gives the plain process's curve and run
folder; a worker killed mid-run is replaced and the run continues from its checkpoint with every update once;
a failed run resumed continues the curve; inside a Tune trial the metrics reach Tune. Each start of a run's
workers costs ~20 s here, so `make test` runs two: one worker, and two workers with a retry. And PPO's
scaling fields reach RLlib's config."""

import json
import os

import pyarrow.parquet as pq
import pytest
import ray.train

from envs.instance import paper_instance
from trainers import ray_train
from trainers.checkpoint import read_checkpoint
from trainers.config import ConfigError
from trainers.pathwise import PathwiseTrainer, train
from trainers.pathwise_config import TrainConfig

CONFIG = TrainConfig(
    batch=8,
    rollout=5,
    blocks=1,
    width=16,
    heads=2,
    feed_forward=32,
    hidden=32,
    warmup=2,
    updates=12,
    learning_rate=1e-3,
    checkpoint_every=5,
    validate_every=4,
    validation_episodes=8,
    validation_horizon=10,
)
INSTANCE = paper_instance(3, 0)


def plain_curve(config: TrainConfig) -> list[float]:
    trainer = PathwiseTrainer(config, INSTANCE.to_torch())
    return [trainer.step()["cost10"] for _ in range(config.updates)]


def curve_of(run) -> tuple[list[int], list[float]]:
    table = pq.read_table(run / "curve.parquet").to_pydict()
    return table["update"], table["cost10"]


def assert_same_curve(got, expected):
    assert len(got) == len(expected)
    for update, (a, b) in enumerate(zip(got, expected), 1):
        assert abs(a - b) <= 1e-3 * abs(b), f"update {update}: cost10 {a} vs {b}"


def assert_same_validation(got: dict, expected: dict):
    """The same updates scored, to float reduction the same scores, and the same best network's update."""
    assert [s["update"] for s in got["scores"]] == [s["update"] for s in expected["scores"]]
    for a, b in zip(got["scores"], expected["scores"]):
        assert a["cost"] == pytest.approx(b["cost"], rel=1e-3), a["update"]
    assert got["best"]["update"] == expected["best"]["update"]


def test_bad_arguments_are_refused_before_ray_starts(tmp_path):
    with pytest.raises(ValueError, match="workers: expected an integer >= 1, got 0"):
        ray_train.train_data_parallel(CONFIG, INSTANCE, tmp_path / "a", workers=0)
    with pytest.raises(ConfigError, match="'batch': 8 rollouts do not split evenly over 3 workers"):
        ray_train.train_data_parallel(CONFIG, INSTANCE, tmp_path / "a", workers=3)
    with pytest.raises(ConfigError, match="'device': 'cpu' with use_gpu=True"):
        ray_train.train_data_parallel(CONFIG, INSTANCE, tmp_path / "a", use_gpu=True)
    (tmp_path / "b" / "ray_train").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"already holds a run \(ray_train\)"):
        ray_train.train_data_parallel(CONFIG, INSTANCE, tmp_path / "b")
    assert not (tmp_path / "a").exists()


@pytest.mark.slow
def test_one_worker_gives_the_plain_process_curve_and_run_folder(ray_session, tmp_path):
    plain = train(CONFIG, INSTANCE, tmp_path / "plain", progress=False)
    summary = ray_train.train_data_parallel(CONFIG, INSTANCE, tmp_path / "ray", workers=1, progress=False)
    assert summary == json.loads((tmp_path / "ray" / "training.json").read_text())
    assert (summary["status"], summary["updates_done"]) == ("completed", CONFIG.updates)
    updates, cost10 = curve_of(tmp_path / "ray")
    assert updates == list(range(1, CONFIG.updates + 1))
    assert_same_curve(cost10, curve_of(tmp_path / "plain")[1])
    assert summary["final_cost10"] == pytest.approx(plain["final_cost10"], rel=1e-3)
    assert any((tmp_path / "ray" / "tensorboard").iterdir())
    ckpt = read_checkpoint(tmp_path / "ray" / "checkpoint.pt")
    assert (ckpt["status"], ckpt["trainer"]["update"]) == ("completed", CONFIG.updates)
    # the last Train checkpoint (in Ray's storage, inside the run folder) holds the final checkpoint and curve
    [ray_checkpoint] = [p for p in (tmp_path / "ray" / "ray_train" / "ray").glob("checkpoint_*") if p.is_dir()]  # num_to_keep=1
    assert read_checkpoint(ray_checkpoint / "checkpoint.pt")["trainer"]["update"] == CONFIG.updates
    assert curve_of(ray_checkpoint)[0] == updates


def dying_worker_loop(killed, rank: int, update: int):
    """trainers.ray_train.worker_loop whose rank `rank` ends its process in update `update`, in the first worker group
    that gets there (the file `killed` marks it). Rank 0 of every worker group appends its first update to `killed`.starts."""
    worker_loop = ray_train.worker_loop
    starts = killed.with_suffix(".starts")

    def loop(loop_config):
        import ray.train

        from trainers import pathwise

        step = pathwise.PathwiseTrainer.step
        me, started = ray.train.get_context().get_world_rank(), []

        def dying_step(self):
            metrics = step(self)
            if me == 0 and not started:
                started.append(metrics["update"])
                with open(starts, "a") as f:
                    f.write(f"{metrics['update']}\n")
            if me == rank and metrics["update"] == update and not killed.exists():
                killed.touch()
                os._exit(1)
            return metrics

        pathwise.PathwiseTrainer.step = dying_step
        worker_loop(loop_config)

    return loop


@pytest.mark.slow  # 20-40 s; a killed Tune trial is retried from its checkpoint in make test (tests/test_sweep.py)
def test_a_killed_worker_is_replaced_and_the_run_continues_from_its_checkpoint(ray_session, tmp_path, monkeypatch):
    monkeypatch.setattr(
        ray_train, "worker_loop", dying_worker_loop(tmp_path / "killed", rank=1, update=7)
    )  # after the checkpoint of update 5
    summary = ray_train.train_data_parallel(CONFIG, INSTANCE, tmp_path / "run", workers=2, progress=False, max_failures=1)
    assert (tmp_path / "killed").exists()
    assert (tmp_path / "killed.starts").read_text().split() == [
        "1",
        "6",
    ]  # the second worker group started after the checkpoint of update 5
    assert (summary["status"], summary["updates_done"], summary["attempts"]) == ("completed", CONFIG.updates, [0, 5])
    updates, cost10 = curve_of(tmp_path / "run")
    assert updates == list(range(1, CONFIG.updates + 1))
    assert_same_curve(cost10, plain_curve(CONFIG))
    # rank 0 validates, before and after the restart: the scores and the best network of one process
    plain = train(CONFIG, INSTANCE, tmp_path / "plain", progress=False)
    assert [s["update"] for s in plain["validation"]["scores"]] == [0, 4, 8, 12]
    assert_same_validation(summary["validation"], plain["validation"])
    assert read_checkpoint(tmp_path / "run" / "best.pt")["trainer"]["update"] == plain["validation"]["best"]["update"]


@pytest.mark.slow
def test_a_failed_two_worker_run_resumes_to_the_uninterrupted_curve(ray_session, tmp_path, monkeypatch):
    monkeypatch.setattr(ray_train, "worker_loop", dying_worker_loop(tmp_path / "killed", rank=0, update=8))
    with pytest.raises(ray.train.TrainingFailedError):
        ray_train.train_data_parallel(CONFIG, INSTANCE, tmp_path / "run", workers=2, progress=False)
    assert read_checkpoint(tmp_path / "run" / "checkpoint.pt")["trainer"]["update"] == 5
    with pytest.raises(ValueError, match="already holds a run"):
        ray_train.train_data_parallel(CONFIG, INSTANCE, tmp_path / "run", workers=2, progress=False)
    summary = ray_train.train_data_parallel(CONFIG, INSTANCE, tmp_path / "run", mode="resume", workers=2, progress=False)
    assert summary["updates_done"] == CONFIG.updates and summary["attempts"] == [0, 5]
    updates, cost10 = curve_of(tmp_path / "run")
    assert updates == list(range(1, CONFIG.updates + 1))
    assert_same_curve(cost10, plain_curve(CONFIG))


@pytest.mark.slow
def test_inside_a_tune_trial_the_metrics_reach_tune(ray_session, tmp_path):
    from ray import tune

    config, instance, out = CONFIG, INSTANCE, tmp_path / "trial"

    def trial(_):
        ray_train.train_data_parallel(config, instance, out, workers=1, progress=False)

    tuner = tune.Tuner(trial, run_config=tune.RunConfig(name="sweep", storage_path=str(tmp_path / "tune")))
    [result] = tuner.fit()
    assert result.error is None
    assert result.metrics["update"] == CONFIG.updates
    assert result.metrics["cost10"] == pytest.approx(curve_of(out)[1][-1])


def test_ppo_scaling_fields_reach_the_rllib_config():
    """RLlib scales PPO by its own env runners and learners: B rollouts and B x T_roll samples per update whatever the split."""
    from trainers.rllib_ppo import PPOTrainConfig, algorithm_config

    tiny = dict(batch=16, rollout=5, minibatches=2, hidden=16, blocks=1, width=16, heads=2, feed_forward=32)
    default = algorithm_config(PPOTrainConfig(**tiny), INSTANCE)
    assert (default.num_env_runners, default.num_envs_per_env_runner, default.num_learners, default.num_gpus_per_learner) == (0, 16, 0, 0)
    assert (default.train_batch_size_per_learner, default.minibatch_size) == (80, 40)
    assert algorithm_config(PPOTrainConfig(**tiny, device="cuda"), INSTANCE).num_gpus_per_learner == 1  # the driver's learner
    scaled = algorithm_config(PPOTrainConfig(**tiny, env_runners=2, learners=2, gpus_per_learner=0.5), INSTANCE)
    scaled.validate()
    assert (scaled.num_env_runners, scaled.num_envs_per_env_runner, scaled.num_learners, scaled.num_gpus_per_learner) == (2, 8, 2, 0.5)
    assert (scaled.train_batch_size_per_learner, scaled.minibatch_size, scaled.total_train_batch_size) == (40, 20, 80)
    with pytest.raises(ConfigError, match="'env_runners': must divide batch = 16, got 3"):
        PPOTrainConfig(**tiny, env_runners=3)
    with pytest.raises(ConfigError, match="'learners': must divide batch x rollout / minibatches = 40, got 3"):
        PPOTrainConfig(**tiny, learners=3)
    with pytest.raises(ConfigError, match="'gpus_per_learner': needs learners >= 1"):
        PPOTrainConfig(**tiny, gpus_per_learner=1)
    with pytest.raises(ConfigError, match="'learners': expected an integer >= 0, got -1"):
        PPOTrainConfig(**tiny, learners=-1)

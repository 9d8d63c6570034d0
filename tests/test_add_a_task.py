"""Adding a task is adding its record: one module with the record and one entry in tasks.REGISTRY, and the
config, the training loop and the results' checks take it, with no other change."""

import pytest
import torch

from boltzmann_attention.experiments import tasks
from boltzmann_attention.experiments.config import TrainConfig
from boltzmann_attention.experiments.results import problems
from boltzmann_attention.experiments.train import Task, train

NAME = "previous"  # the next token is the one before the current token: one key back, for every query
VOCAB = 7


class PreviousTokenData:
    """Random tokens; the target at position t is the token at t - 1 (unscored at t = 0)."""

    def __init__(self, cfg):
        self.T, self.vocab_size = cfg.data.T, VOCAB
        self.val = self._draw(64, torch.Generator().manual_seed(1))
        self.test = self._draw(64, torch.Generator().manual_seed(2))

    def _draw(self, n, generator):
        x = torch.randint(0, VOCAB, (n, self.T), generator=generator)
        y = torch.full_like(x, tasks.IGNORE)
        y[:, 1:] = x[:, :-1]
        return x, y

    def batch(self, batch_size, generator):
        return self._draw(batch_size, generator)


RECORD = tasks.TaskRecord(name=NAME, build=PreviousTokenData, evaluate=tasks.accuracy_metrics,
                          headline=("test", "accuracy"))


@pytest.fixture
def added(monkeypatch):
    monkeypatch.setitem(tasks.REGISTRY, NAME, RECORD)
    return NAME


def test_the_config_and_the_loop_take_it(added):
    cfg = TrainConfig.build(task=added, T=6, steps=30, batch_size=32, d_model=16, n_heads=2, eval_interval=30,
                            warmup_steps=0, lr=1e-2, mode="softmax")
    task = Task(cfg)
    assert task.vocab_size == VOCAB and task.record is RECORD
    result = train(cfg, progress=False)
    assert result["config"]["data"]["task"] == added and set(result["metrics"]) == {"val", "test"}
    assert problems(result) == []  # its headline (test accuracy) is there and valid
    chance = 1 / VOCAB
    assert result["metrics"]["test"]["accuracy"] > 2 * chance  # 30 steps learn to look one key back


def test_an_unknown_task_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'previous'; choose one of .*'shakespeare'"):
        TrainConfig.build(task="previous").validate()
    with pytest.raises(ValueError, match="unknown task 'previous'; known: shakespeare, brackets, blocks"):
        tasks.get("previous")


def test_a_task_option_is_refused_by_the_other_tasks(added):
    with pytest.raises(ValueError, match="num_blocks is an option of task 'blocks' only; task 'previous' must keep"):
        TrainConfig.build(task=added, T=6, num_blocks=3).validate()

"""A study records the reference NNs its trials were measured against, and a run whose NNs came out other weights
is told so (its configurations are re-checked with the NNs built from its own references before validation)."""

from __future__ import annotations

import optuna

from qaopt.search import ATTR_REFERENCES, open_storage, open_study


def test_a_study_records_its_references_and_warns_of_other_ones(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    warnings: list[str] = []
    study = open_study("tiny-abc-aware", storage, 0, 2, {"b": "f00", "a": "ba5"}, warnings.append)
    assert study.user_attrs[ATTR_REFERENCES] == {"a": "ba5", "b": "f00"} and not warnings
    study.enqueue_trial({"x": 1})
    # The same NNs (in any order) resume the study in silence.
    assert open_study("tiny-abc-aware", storage, 0, 2, {"a": "ba5", "b": "f00"}, warnings.append).trials
    assert not warnings
    resumed = open_study("tiny-abc-aware", storage, 0, 2, {"a": "ba5", "b": "c0ffee"}, warnings.append)
    [message] = warnings
    assert "'tiny-abc-aware'" in message and "NN 'b' is c0ffee now, was f00" in message and "'a'" not in message
    assert "re-checked" in message and "torch.set_num_threads" in message and "--out or --storage" in message
    # The study keeps the references it began with; its trials are still there.
    assert resumed.user_attrs[ATTR_REFERENCES] == {"a": "ba5", "b": "f00"} and len(resumed.trials) == 1
    # An NN the study never had is a change too.
    open_study("tiny-abc-aware", storage, 0, 2, {"a": "ba5", "b": "f00", "c": "123"}, warnings.append)
    assert "NN 'c' is 123 now, was absent" in warnings[-1]


def test_a_study_from_before_references_were_recorded_takes_this_runs(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    optuna.create_study(study_name="old", storage=storage, directions=["minimize"])
    warnings: list[str] = []
    assert open_study("old", storage, 0, 1, {"a": "ba5"}, warnings.append).user_attrs[ATTR_REFERENCES] == {"a": "ba5"}
    assert not warnings

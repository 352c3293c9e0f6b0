"""A study holds trials of one set of reference NNs: a run whose NNs came out other weights cannot add to it."""

from __future__ import annotations

import optuna
import pytest

from qaopt.search import ATTR_REFERENCES, OptimizeError, open_storage, open_study


def test_a_study_records_its_references_and_refuses_other_ones(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    study = open_study("tiny-abc-aware", storage, 0, 2, {"b": "f00", "a": "ba5"})
    assert study.user_attrs[ATTR_REFERENCES] == {"a": "ba5", "b": "f00"}
    study.enqueue_trial({"x": 1})
    # The same NNs (in any order) resume the study.
    assert open_study("tiny-abc-aware", storage, 0, 2, {"a": "ba5", "b": "f00"}).trials[0].state.name == "WAITING"
    with pytest.raises(OptimizeError) as err:
        open_study("tiny-abc-aware", storage, 0, 2, {"a": "ba5", "b": "c0ffee"})
    message = str(err.value)
    assert "'tiny-abc-aware'" in message and "NN 'b' is c0ffee now, was f00" in message and "'a'" not in message
    assert "torch.set_num_threads" in message and "--out or --storage" in message
    # An NN the study never had is a change too; the refused run recorded nothing.
    with pytest.raises(OptimizeError, match="NN 'c' is 123 now, was absent"):
        open_study("tiny-abc-aware", storage, 0, 2, {"a": "ba5", "b": "f00", "c": "123"})
    assert open_study("tiny-abc-aware", storage, 0, 2, {"a": "ba5", "b": "f00"}).user_attrs[ATTR_REFERENCES] == {
        "a": "ba5", "b": "f00"}


def test_a_study_from_before_references_were_recorded_takes_this_runs(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    optuna.create_study(study_name="old", storage=storage, directions=["minimize"])
    assert open_study("old", storage, 0, 1, {"a": "ba5"}).user_attrs[ATTR_REFERENCES] == {"a": "ba5"}

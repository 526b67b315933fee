"""The SR stream in Megatron's checkpoints (probe.py sr_state): the UFP4 linears fill the
`_extra_state` slot Megatron's linears already have, which Megatron saves as a ShardedObject.

- every UFP4 linear's extra state is a main-replica ShardedObject holding the stream's state
  at save time, plain enough for torch.load(weights_only=True);
- loading it (model.load_state_dict, what Megatron-LM's load_checkpoint ends with) into a
  fresh model resumes the stream: the next draws are those of the unbroken run;
- a BF16 checkpoint (extra state None) loads into a UFP4 model strictly, leaving the stream
  fresh, and a UFP4 checkpoint loads into Megatron's own linears.
(dist_checkpointing's file writer needs psutil, not installed here: the files themselves are
written and read by gpu/megatron_lm.sh's resume run.)
"""

import pytest
from conftest import run_probe


@pytest.fixture(scope="module")
def sr(tmp_path_factory):
    return run_probe("sr_state", tmp=tmp_path_factory.mktemp("sr"))


def test_every_ufp4_linear_saves_the_stream_as_a_main_replica_object(sr):
    assert set(sr["ufp4_objects"]) == set(sr["objects"]) and len(sr["objects"]) == 8
    for obj in sr["ufp4_objects"].values():
        assert obj["main_replica"] and obj["draws"] == sr["draws_at_save"] > 0
        assert obj["key"].endswith("._extra_state")
    assert sr["reloaded_draws"] == [sr["draws_at_save"]]


def test_loading_the_checkpoint_resumes_the_stream(sr):
    assert sr["fresh_draws"] == sr["draws_at_save"]
    assert sr["resumed"] == sr["after_save"]


def test_bf16_checkpoints_load_strictly_and_leave_the_stream_fresh(sr):
    assert sr["bf16_into_ufp4_missing"] == [[], []]
    assert sr["bf16_into_ufp4_draws"] == 0

import copy

import pytest

from gpuworker.batch import BatchError, parse_batch

PTX = ".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry k() { ret; }\n"


def good_batch():
    return {
        "format": 1,
        "batch_id": "b-1",
        "manifest": 'name = "softmax"\n',
        "baseline_source": None,
        "shapes": [{"M": 16384, "N": 4096}],
        "heldout_shapes": [{"M": 1, "N": 4095}],
        "candidates": [
            {
                "id": "c-1",
                "ptx": PTX,
                "entry": "k",
                "params": [
                    {"kind": "tensor", "ptx_type": "u64", "name": "x"},
                    {"kind": "dim", "ptx_type": "u32", "name": "N"},
                    {"kind": "scalar", "ptx_type": "f32", "value": 1e-5},
                ],
                "launch": {
                    "grid": ["M", 1, 1],
                    "block": [256, 1, 1],
                    "smem_bytes": 0,
                    "cluster": None,
                },
            },
            {"id": "c-2", "ptx": PTX, "entry": "k"},
        ],
        "baselines": ["customer", "torch_eager"],
        "options": {"time_budget_s_per_candidate": 1.0, "timeout_s_per_candidate": 5, "seed": 7},
    }


def errors_of(batch):
    with pytest.raises(BatchError) as e:
        parse_batch(batch)
    return dict(e.value.errors)


def test_it_parses_a_valid_batch_into_typed_objects():
    b = parse_batch(good_batch())
    assert b.batch_id == "b-1"
    assert b.shapes == ({"M": 16384, "N": 4096},)
    assert b.heldout_shapes == ({"M": 1, "N": 4095},)
    c1, c2 = b.candidates
    assert [p.kind for p in c1.params] == ["tensor", "dim", "scalar"]
    assert c1.params[2].value == pytest.approx(1e-5)
    assert c1.launch.grid == ("M", 1, 1) and c1.launch.block == (256, 1, 1)
    assert c2.params is None and c2.launch is None  # borrows the workload's binding
    assert b.options.timeout_s_per_candidate == 5.0 and b.options.seed == 7
    assert b.baselines == ("customer", "torch_eager")


def test_it_names_every_bad_field_at_once():
    batch = good_batch()
    batch["format"] = 2
    batch["shapes"] = [{"M": 0, "N": "4096"}]
    batch["candidates"][0]["launch"]["block"] = [2048, 1, 1]
    batch["candidates"][0]["params"][1]["ptx_type"] = "f32"
    batch["baselines"] = ["torch_magic"]
    errs = errors_of(batch)
    assert "format" in errs
    assert "shapes[0].M" in errs and "shapes[0].N" in errs
    assert errs["candidates[0].launch.block"] == "at most 1024 threads per block"
    assert "candidates[0].params[1].ptx_type" in errs
    assert "baselines[0]" in errs


def test_it_refuses_duplicate_candidate_ids():
    batch = good_batch()
    batch["candidates"][1]["id"] = "c-1"
    assert "duplicate" in errors_of(batch)["candidates[1].id"]


def test_it_refuses_params_without_a_launch():
    batch = good_batch()
    del batch["candidates"][0]["launch"]
    assert "both params and launch" in errors_of(batch)["candidates[0]"]


def test_it_refuses_ptx_without_an_entry_and_bad_entry_names():
    batch = good_batch()
    batch["candidates"][0]["ptx"] = "hello"
    batch["candidates"][0]["entry"] = "k; rm -rf /"
    errs = errors_of(batch)
    assert "candidates[0].ptx" in errs and "candidates[0].entry" in errs


def test_it_refuses_unknown_and_out_of_range_options():
    batch = good_batch()
    batch["options"] = {"timeout_s_per_candidate": 0, "colour": "red", "seed": -1}
    errs = errors_of(batch)
    assert "options.timeout_s_per_candidate" in errs
    assert "options.colour" in errs
    assert "options.seed" in errs


def test_timed_outputs_default_to_shared_and_take_only_the_known_modes():
    batch = copy.deepcopy(good_batch())
    batch.pop("options", None)
    assert parse_batch(batch).options.timed_outputs == "shared"
    batch["options"] = {"timed_outputs": "guarded"}
    assert parse_batch(batch).options.timed_outputs == "guarded"
    for bad in ("elsewhere", 1, None):
        batch["options"] = {"timed_outputs": bad}
        assert "options.timed_outputs" in errors_of(batch)


def test_it_refuses_a_batch_that_is_not_an_object_or_has_no_shapes():
    assert "batch" in errors_of([1, 2])
    batch = good_batch()
    batch["shapes"] = []
    assert "shapes" in errors_of(batch)


def test_options_default_when_omitted_and_seed_is_then_unset():
    batch = copy.deepcopy(good_batch())
    del batch["options"]
    b = parse_batch(batch)
    assert b.options.seed is None
    assert b.options.check_timed_outputs is True


def test_liger_is_a_known_baseline():
    batch = good_batch()
    batch["baselines"] = ["liger", "triton"]
    assert parse_batch(batch).baselines == ("liger", "triton")

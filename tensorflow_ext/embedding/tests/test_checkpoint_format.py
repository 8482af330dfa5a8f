"""The checkpoint format of dynamic embeddings (tensor names, layout record, delta record), without a graph."""

import json
import os
import re
import types

import pytest

from tensorflow_ext.embedding.checkpoint import format as ckpt_format


class _SlotGroup(object):
    """A slot group as a shard's layout has it: `dim` columns per slot from `offset`, in slot order."""

    def __init__(self, optimizer_name, optimizer_class, slot_names, offset, initial_values, dim):
        self.optimizer_name = optimizer_name
        self.optimizer_class = optimizer_class
        self.slot_names = tuple(slot_names)
        self.offset = offset
        self.initial_values = tuple(initial_values)
        self.dim = dim

    def column(self, name):
        return self.offset + self.slot_names.index(name) * self.dim

    def slot_width(self, name):
        del name
        return self.dim


def _shard(dim=4, groups=(), embedding="user_emb", storage="float32"):
    width = dim + sum(len(g.slot_names) * g.dim for g in groups)
    return types.SimpleNamespace(
        dim=dim,
        width=width,
        slot_groups=list(groups),
        embedding=types.SimpleNamespace(name=embedding),
        storage=storage,
    )


def _adagrad(name="Adagrad", offset=4, initial=0.1):
    return _SlotGroup(name, "AdagradOptimizer", ["accumulator"], offset, [initial], 4)


def _adam(offset=4):
    return _SlotGroup("Adam", "AdamOptimizer", ["m", "v"], offset, [0.0, 0.0], 4)


def test_suffixes_name_the_rows_then_the_shard_count_and_lean_is_a_subset():
    assert ckpt_format.SUFFIXES[: len(ckpt_format.ROW_SUFFIXES)] == ckpt_format.ROW_SUFFIXES
    assert ckpt_format.SUFFIXES[-1] == "-num_shards"
    assert set(ckpt_format.LEAN_SUFFIXES) < set(ckpt_format.SUFFIXES)
    others = (ckpt_format.LAYOUT_SUFFIX, ckpt_format.REMOVED_SUFFIX, ckpt_format.DELTA_SUFFIX)
    assert len(set(ckpt_format.SUFFIXES + others)) == len(ckpt_format.SUFFIXES) + 3


def test_layout_record_round_trips_with_every_field():
    shard = _shard(groups=[_adagrad()])
    record = ckpt_format.parse_layout_record(ckpt_format.layout_record(shard))
    assert record["format"] == ckpt_format.LAYOUT_FORMAT
    assert record["embedding"] == "user_emb"
    assert (record["dim"], record["width"]) == (4, 8)
    assert record["signature"] == "dim=4;AdagradOptimizer(accumulator)"
    assert record["description"] == "dim=4, width=8, slot columns: Adagrad (AdagradOptimizer): accumulator [4:8]"
    assert record["slot_groups"] == [
        {"optimizer": "Adagrad", "class": "AdagradOptimizer", "slots": ["accumulator"], "offset": 4,
         "initial_values": [0.1]}
    ]  # fmt: skip
    assert ckpt_format.parse_layout_record(ckpt_format.layout_record(shard).encode()) == record


def test_signature_ignores_optimizer_names_and_initial_values_but_not_classes_or_slot_order():
    base = ckpt_format.slot_signature(_shard(groups=[_adagrad()]))
    assert ckpt_format.slot_signature(_shard(groups=[_adagrad(name="Adagrad_1", initial=0.5)])) == base
    assert ckpt_format.slot_signature(_shard(groups=[_adam()])) == "dim=4;AdamOptimizer(m,v)"
    assert ckpt_format.slot_signature(_shard()) == "dim=4;no slots"
    assert ckpt_format.describe_layout(_shard()) == "dim=4, width=4, slot columns: none"


def test_a_compact_shard_writes_its_storage_and_a_float32_one_writes_none():
    compact = _shard(groups=[_adagrad()], storage="bfloat16")
    assert ckpt_format.storage_record(compact) == "bfloat16"
    assert ckpt_format.parse_layout_record(ckpt_format.layout_record(compact))["description"] == (
        "dim=4, width=8, storage=bfloat16, slot columns: Adagrad (AdagradOptimizer): accumulator [4:8]"
    )
    assert ckpt_format.storage_record(_shard()) is None  # float32 checkpoints are written as before
    assert ckpt_format.UNRECORDED_STORAGE == "float32"


@pytest.mark.parametrize(
    "text, match",
    [
        ("not json", "not a dynamic embedding layout record"),
        (json.dumps({"format": 2}), "format 2"),
        (json.dumps(["a list"]), "format None"),
        (json.dumps({"format": 1, "dim": 4}), "without embedding, width, signature, description, slot_groups"),
    ],
)
def test_parse_layout_record_refuses_what_is_not_a_record_of_this_format(text, match):
    with pytest.raises(ValueError, match=match):
        ckpt_format.parse_layout_record(text)


def test_the_in_graph_patterns_find_the_signature_and_description_in_a_record():
    shard = _shard(groups=[_adagrad()])
    text = ckpt_format.layout_record(shard)
    assert ckpt_format.signature_field(shard) in text
    assert ckpt_format.signature_field(_shard(groups=[_adam()])) not in text
    # RE2 patterns that Python's re reads the same way.
    literal = ckpt_format.re2_literal(ckpt_format.signature_field(shard))
    assert re.fullmatch("(?s).*" + literal + ".*", text)
    description = re.sub("(?s)^.*" + ckpt_format.record_field_pattern("description") + ".*$", r"\1", text)
    assert description == ckpt_format.describe_layout(shard)


def test_re2_literal_escapes_every_pattern_character():
    text = r"a.b*c+d?e(f)[g]{h}|i^j$k\l"
    assert re.fullmatch(ckpt_format.re2_literal(text), text)
    assert not re.fullmatch(ckpt_format.re2_literal("a.b"), "axb")


def test_delta_record_lists_its_chain_and_owned_files_by_base_name():
    links = [("id0", "/ckpt/model.ckpt-10"), ("id1", "/ckpt/model.ckpt-20")]
    record = ckpt_format.delta_record("delta", "id2", 30, 25, links, owned=["/ckpt/model.ckpt-10"])
    assert record.splitlines() == [
        "tf_ext delta checkpoint 1",
        "kind=delta",
        "id=id2",
        "step=30",
        "since_step=25",
        "link=id0 model.ckpt-10",
        "link=id1 model.ckpt-20",
        "owned=model.ckpt-10",
    ]
    elsewhere = os.path.join("gs://bucket", "run")
    assert ckpt_format.delta_record_links(record, elsewhere) == [
        ("id0", os.path.join(elsewhere, "model.ckpt-10")),
        ("id1", os.path.join(elsewhere, "model.ckpt-20")),
    ]
    assert ckpt_format.delta_record_owned(record, elsewhere) == [os.path.join(elsewhere, "model.ckpt-10")]


def test_a_full_record_has_no_links_and_a_kind_is_full_or_delta():
    record = ckpt_format.delta_record("full", "id0", 10, -1, [])
    assert ckpt_format.delta_record_links(record, "/d") == []
    assert ckpt_format.delta_record_owned(record, "/d") == []
    assert "since_step=-1" in record.splitlines()
    with pytest.raises(ValueError, match="'full' or 'delta'"):
        ckpt_format.delta_record("partial", "id0", 10, -1, [])

"""Hugging Face transformers through flight_overlord.integrations.hf, with its real code on CPU (a
random-init tiny Llama, nothing downloaded), against a real cluster: packed logits equal the
per-document ones, the loss of our already shifted labels is the reference loss (and labels=
alone would shift them twice), and OverlordTrainer trains from the stream and checkpoints its position."""
from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flight_overlord.client import TrainerClient  # noqa: E402
from flight_overlord.deploy.launch import LocalCluster  # noqa: E402
from flight_overlord.integrations.hf import HFMicrobatches, OverlordTrainer  # noqa: E402

from ..helpers import ONE_RANK_BATCH, write_config  # noqa: E402

MICROBATCHES = 2  # one_rank_config's


def tiny_llama(attention: str = "sdpa"):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    config._attn_implementation = attention
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def planner(corpus, tmp_path_factory):
    short = [{"name": n, "paths": f"{n}/*.parquet", "weight": 0.5} for n in ("captions", "qa")]  # packs several
    with LocalCluster(write_config(tmp_path_factory.mktemp("hf"), corpus, mesh={"dp": 1}, sources=short,
                                   global_batch=ONE_RANK_BATCH)) as cluster:
        yield cluster.planner


def loader(planner: str, start: int, steps: int) -> HFMicrobatches:
    return HFMicrobatches(TrainerClient(planner, 0, start_step=start, num_steps=steps, timeout=60))


@pytest.mark.parametrize("attention, step", [("sdpa", 0), ("eager", 1)])
def test_packed_logits_equal_per_document_logits(planner, attention, step):
    model = tiny_llama(attention)
    with loader(planner, step, 1) as microbatches:
        batches = list(microbatches)
    assert len(batches) == MICROBATCHES and "attention_mask" not in batches[0]
    compared = []
    for batch in batches:
        assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape[0] == 1
        with torch.no_grad():
            packed = model(**batch).logits[0]
        positions = batch["position_ids"][0]
        starts = (positions == 0).nonzero().flatten().tolist()  # a document starts at position 0
        documents = 0
        for start, end in zip(starts, starts[1:] + [len(positions)]):
            if end - start == 1:
                continue  # a padding token: a one-token document of its own
            ids = batch["input_ids"][:, start:end]
            with torch.no_grad():
                alone = model(input_ids=ids, position_ids=positions[None, start:end], use_cache=False).logits[0]
            assert torch.allclose(packed[start:end], alone, atol=1e-5), (start, end)
            documents += 1
        compared.append(documents)
    assert max(compared) > 1, compared  # packed: several documents in one sequence


def test_shifted_labels_give_the_reference_loss(planner):
    model = tiny_llama()
    with loader(planner, 2, 1) as microbatches:
        batch = next(microbatches)
    with torch.no_grad():
        out = model(**batch)
        reference = F.cross_entropy(out.logits[0].float(), batch["labels"][0], ignore_index=-100)
        shifted_twice = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                              labels=batch["labels"], use_cache=False).loss
    # the trap: labels= alone shifts them again, scoring each position against the token after its target
    twice = F.cross_entropy(out.logits[0, :-1].float(), batch["labels"][0, 1:], ignore_index=-100)
    assert torch.allclose(out.loss, reference, atol=1e-6) and torch.allclose(shifted_twice, twice, atol=1e-6)
    assert abs(float(shifted_twice - reference)) > 1e-4


def test_overlord_trainer_trains_one_step_per_optimizer_step_and_saves_its_position(planner, tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, max_steps=2, save_steps=1,
                                          gradient_accumulation_steps=MICROBATCHES, ignore_data_skip=True,
                                          report_to=[], logging_steps=1, learning_rate=1e-3)
    with loader(planner, 3, 2) as microbatches:
        trainer = OverlordTrainer(model=tiny_llama(), args=args, overlord=microbatches)
        trainer.train()
    for global_step, position in ((1, {"rank": 0, "step": 4, "microbatch": 0}),
                                  (2, {"rank": 0, "step": 5, "microbatch": 0})):
        assert json.loads((tmp_path / f"checkpoint-{global_step}" / "overlord_rank0.json").read_text()) == position
    with pytest.raises(ValueError, match="ignore_data_skip=True"):
        OverlordTrainer(model=tiny_llama(), args=transformers.TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, max_steps=1, report_to=[]), overlord=microbatches)

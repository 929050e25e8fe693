"""The demo recipe's training: the shared loop on the engine's Transformer, and a draft
that starts as a layer-pruned copy of the core."""

import json
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specdesk.app.demo.config import TrainConfig, llama_config  # noqa: E402
from specdesk.app.demo.train import (fit, init_weights, next_token_loss, pruned_state,  # noqa: E402
                                     token_logits)
from specdesk.engines.torch.model import Transformer  # noqa: E402
from specdesk.engines.types import SpecDeskError  # noqa: E402

CONFIG = llama_config(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                      intermediate_size=48, head_dim=16, max_position_embeddings=32)


def _model(seed: int = 0) -> Transformer:
    model = Transformer(CONFIG)
    init_weights(model, seed, CONFIG.num_hidden_layers)
    return model


def test_pruned_state_keeps_the_chosen_layers_renumbered():
    core = _model()
    state = pruned_state(core, (0, 3))
    draft = Transformer(replace(CONFIG, num_hidden_layers=2))
    draft.load_state_dict(state)  # strict: every tensor of the draft, nothing else
    assert torch.equal(draft.model.layers[1].mlp.down_proj.weight, core.model.layers[3].mlp.down_proj.weight)
    assert torch.equal(draft.lm_head.weight, core.lm_head.weight)
    tokens = torch.randint(0, 64, (1, 8))
    # With the middle layers gone the output differs, but it is a working model of the same vocabulary.
    assert token_logits(draft, tokens).shape == token_logits(core, tokens).shape


def test_training_pass_computes_what_the_engine_serves():
    model = _model()
    tokens = torch.randint(0, 64, (12,))
    with torch.no_grad():
        trained_on = token_logits(model, tokens[None])[0]
    model.setup_cache(16)
    served = model(tokens, 0).logits
    torch.testing.assert_close(served, trained_on, rtol=0, atol=1e-5)
    with pytest.raises(SpecDeskError, match="KV cache"):
        model.hidden_states(tokens[None])


class Interrupted(Exception):
    pass


def test_interrupted_training_resumes_to_the_same_weights(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 64, size=2000).astype(np.uint16)
    settings = TrainConfig(steps=6, batch_size=2, seq_len=16, peak_lr=1e-2, warmup_steps=2, eval_every=3, seed=7)

    def run(checkpoint=None, stop_after=None) -> Transformer:
        model = _model()

        def progress(done: int, total: int, loss: float) -> None:
            if done == stop_after:
                raise Interrupted
        fit(model, next_token_loss(model), settings, tokens, "test", checkpoint_path=checkpoint, progress=progress)
        return model

    straight = run()
    again = run()
    checkpoint = tmp_path / "model.ckpt"
    with pytest.raises(Interrupted):
        run(checkpoint, stop_after=4)  # after the checkpoint at step 3
    resumed = run(checkpoint)
    untrained = _model()
    for name, weight in straight.state_dict().items():
        assert torch.equal(weight, again.state_dict()[name]), name
        assert torch.equal(weight, resumed.state_dict()[name]), name
    assert not torch.equal(straight.lm_head.weight, untrained.lm_head.weight)


def test_the_whole_recipe_still_runs_end_to_end(tmp_path, monkeypatch):
    """The recipe that made the shipped families runs, at a few steps per stage, and its
    output installs like the shipped weights: a card vouching for every trained file, and
    GGUF and HF files that load. Nothing is asserted about the weights it trains, which
    differ between CPUs; the tests run on the shipped small family instead."""
    from specdesk.app.demo import install
    from specdesk.app.demo.recipe import SMALL, train_family

    few = dict(steps=3, warmup_steps=1, batch_size=2, seq_len=32)
    spec = replace(SMALL, corpus_bytes=60_000,
                   core_training=replace(SMALL.core_training, **few, eval_every=3),
                   draft_training=replace(SMALL.draft_training, **few, eval_every=3),
                   mtp_training=replace(SMALL.mtp_training, **few),
                   dflash_training=replace(SMALL.dflash_training, **few))
    trained = tmp_path / "trained"
    card = train_family(spec, trained)
    assert card["recipe_key"] == spec.key() != SMALL.key()
    assert install.verify_trained(trained) == json.loads(json.dumps(card))  # as card.json holds it
    assert set(install.trained_files(card)) == set(install.TRAINED_FILES)
    # the EAGLE-3 head and the DSpark drafter came from the product's trainer, run as a user runs it
    for method in ("eagle3", "dspark"):
        assert card[method]["trainer"] == f"specdesk train-drafter --method {method}" and card[method]["steps"] == 4
    assert card["dspark"]["markov_rank"] > 0 and card["dspark"]["spec"]["block_size"] >= 2

    out = tmp_path / "family"
    install._derive(trained, card, out, progress=lambda message: None)
    from specdesk.engines.llama.binding import llama_lib

    llama_cpp = llama_lib()  # with its backends loaded (binding.load_backend_modules)
    for role in ("target", "draft"):
        gguf = out / install.UNIT_PATHS[f"{role}_gguf"]
        llama_cpp.Llama(model_path=str(gguf), n_ctx=64, n_threads=1, verbose=False).close()
    from specdesk.engines.torch.engine import supported_methods

    assert supported_methods(out / install.UNIT_PATHS["target_hf"],
                             {"eagle3": out / install.UNIT_PATHS["eagle3_hf"]})["eagle3"] is None
    from specdesk.engines.torch.dflash import dflash_problem
    from specdesk.engines.torch.loader import open_checkpoint

    assert dflash_problem(out / install.UNIT_PATHS["dspark_hf"],
                          open_checkpoint(out / install.UNIT_PATHS["target_hf"])) is None

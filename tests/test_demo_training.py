"""A draft that starts as a layer-pruned copy of the core."""

import pytest

torch = pytest.importorskip("torch")

from specdesk.app.demo.config import ModelConfig  # noqa: E402
from specdesk.app.demo.train import init_weights, pruned_state, token_logits  # noqa: E402
from specdesk.engines.torch.model import Transformer  # noqa: E402


def test_pruned_state_keeps_the_chosen_layers_renumbered():
    config = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                         intermediate_size=48, head_dim=16, max_position_embeddings=32)
    core = Transformer(config.engine_config())
    init_weights(core, 0, config.num_hidden_layers)
    state = pruned_state(core, (0, 3))
    draft = Transformer(ModelConfig(**{**config.to_dict(), "num_hidden_layers": 2}).engine_config())
    draft.load_state_dict(state)  # strict: every tensor of the draft, nothing else
    assert torch.equal(draft.model.layers[1].mlp.down_proj.weight, core.model.layers[3].mlp.down_proj.weight)
    assert torch.equal(draft.lm_head.weight, core.lm_head.weight)
    tokens = torch.randint(0, 64, (1, 8))
    # With the middle layers gone the output differs, but it is a working model of the same vocabulary.
    assert token_logits(draft, tokens).shape == token_logits(core, tokens).shape
